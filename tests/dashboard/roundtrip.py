#!/usr/bin/env python3
"""Loads a Grafana dashboard into the Grafana Foundation SDK's dashboard
model (types generated from Grafana's own schema) and writes it back: a key
the schema does not know is dropped on the way, so every key of the file
that does not come back is printed, one path per line. Exit 1 when any
did not (or the file does not load at all).

  roundtrip.py DASHBOARD.json
"""

import json
import sys

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard


def lost(original, written, path=""):
    if isinstance(original, dict) and isinstance(written, dict):
        for key, value in original.items():
            if key not in written:
                yield f"{path}/{key}"
            else:
                yield from lost(value, written[key], f"{path}/{key}")
    elif isinstance(original, list) and isinstance(written, list):
        if len(original) != len(written):
            yield f"{path} (had {len(original)} items, {len(written)} came back)"
        for index, (a, b) in enumerate(zip(original, written)):
            yield from lost(a, b, f"{path}[{index}]")
    elif original != written:
        yield f"{path} ({original!r} came back as {written!r})"


def main(path):
    with open(path) as file:
        original = json.load(file)
    model = Dashboard.from_json(original)
    written = json.loads(json.dumps(model, cls=JSONEncoder))
    missing = list(lost(original, written))
    for line in missing:
        print(line)
    return 1 if missing else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
