#!/usr/bin/env python3
"""Writes a self-contained strict JSON schema of one Kubernetes kind.

Reads the schemas that the kubernetes-validate wheel ships (generated from
the Kubernetes OpenAPI specification) straight from the wheel file, keeps
the definitions the kind reaches, points every $ref at them and drops the
prose ("description"), so the fixture is small and needs nothing else.

Usage (see README.md):
    extract-schema.py WHEEL KUBERNETES_VERSION FILE_STEM > OUT.json
e.g.
    extract-schema.py kubernetes_validate-1.37.0-py3-none-any.whl v1.37.0 \
        persistentvolume-v1 > persistentvolume-v1.37.0-strict.json
"""

import hashlib
import json
import re
import sys
import zipfile

REF = re.compile(r"^(?:/api/_definitions\.json)?#/\$defs/(.+)$")
# Keywords whose value maps names to schemas: there a key named
# "description" is a field of the object, not prose.
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "dependentSchemas")


def strip(schema, reached):
    """The schema without prose, $refs made local; collects what they name."""
    if isinstance(schema, list):
        return [strip(item, reached) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "description":
            continue
        if key == "$ref":
            match = REF.match(value)
            if not match:
                sys.exit(f"unexpected $ref {value!r}")
            reached.add(match.group(1))
            out[key] = f"#/$defs/{match.group(1)}"
        elif key in SCHEMA_MAPS:
            out[key] = {name: strip(sub, reached) for name, sub in value.items()}
        else:
            out[key] = strip(value, reached)
    return out


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    wheel, version, stem = sys.argv[1:]
    with open(wheel, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    base = f"kubernetes_validate/kubernetes-json-schema/{version}-local-strict"
    with zipfile.ZipFile(wheel) as archive:
        package = re.search(
            r"^Version: (.+)$",
            archive.read(next(n for n in archive.namelist() if n.endswith("METADATA"))).decode(),
            re.M,
        ).group(1)
        kind = json.loads(archive.read(f"{base}/{stem}.json"))
        definitions = json.loads(archive.read(f"{base}/_definitions.json"))["$defs"]

    reached = set()
    schema = strip(kind, reached)
    defs, pending = {}, set(reached)
    while pending:
        name = pending.pop()
        found = set()
        defs[name] = strip(definitions[name], found)
        pending |= found - defs.keys()
    schema.pop("$id", None)
    schema["$defs"] = dict(sorted(defs.items()))
    schema["$comment"] = (
        f"{stem} of Kubernetes {version} (local-strict: unknown fields are errors), "
        f"from the PyPI package kubernetes-validate {package} "
        f"(wheel sha256 {digest}); $refs inlined and descriptions removed by "
        "tests/k8s/extract-schema.py"
    )
    json.dump(schema, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
