"""Parses a Prometheus text exposition with prometheus_client's own parser
(an implementation independent of sparse-volume) and prints its samples as
JSON: [{"family", "type", "help", "name", "labels", "value"}, ...].
A file the parser rejects makes this exit non-zero with its error."""
import json
import sys

from prometheus_client.parser import text_string_to_metric_families

with open(sys.argv[1], encoding="utf-8") as f:
    text = f.read()
samples = []
for family in text_string_to_metric_families(text):
    for sample in family.samples:
        samples.append(
            {
                "family": family.name,
                "type": family.type,
                "help": family.documentation,
                "name": sample.name,
                "labels": sample.labels,
                "value": sample.value,
            }
        )
json.dump(samples, sys.stdout)
