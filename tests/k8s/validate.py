#!/usr/bin/env python3
"""Validates PersistentVolume manifests read from stdin.

Usage: validate.py yaml|json < manifests

YAML: a stream of documents (none is fine). JSON: one object; a v1 List
stands for its items. Every PersistentVolume must pass both the
Kubernetes schema (persistentvolume-v1.37.0-strict.json, extracted from
kubernetes-validate, see README.md) and the API server's rules that the
schema lacks (persistentvolume-apiserver-rules.json). Prints the objects
it read as one JSON array and exits 0, or prints every violation (with
the schema it broke) to stderr and exits 1.
"""

import json
import pathlib
import sys

import jsonschema
import yaml

HERE = pathlib.Path(__file__).resolve().parent
SCHEMAS = {
    "kubernetes v1.37.0 schema": HERE / "persistentvolume-v1.37.0-strict.json",
    "api-server rules": HERE / "persistentvolume-apiserver-rules.json",
}


def objects(text, form):
    if form == "yaml":
        found = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    elif form == "json":
        document = json.loads(text)
        if isinstance(document, dict) and document.get("kind") == "List":
            if document.get("apiVersion") != "v1" or set(document) - {"apiVersion", "kind", "items", "metadata"}:
                sys.exit(f"not a v1 List: {sorted(document)}")
            found = document["items"]
        else:
            found = [document]
    else:
        sys.exit(__doc__)
    return found


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    found = objects(sys.stdin.read(), sys.argv[1])
    validators = {}
    for name, path in SCHEMAS.items():
        schema = json.loads(path.read_text())
        jsonschema.Draft202012Validator.check_schema(schema)
        validators[name] = jsonschema.Draft202012Validator(schema)
    failed = False
    for index, item in enumerate(found):
        for name, validator in validators.items():
            for error in sorted(validator.iter_errors(item), key=lambda e: list(e.absolute_path)):
                where = "/".join(str(p) for p in error.absolute_path) or "(top)"
                print(f"object {index}: {where}: {error.message} [{name}]", file=sys.stderr)
                failed = True
    if failed:
        sys.exit(1)
    json.dump(found, sys.stdout)


if __name__ == "__main__":
    main()
