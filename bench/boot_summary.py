#!/usr/bin/env python3
"""The table of bench/vm-boot.sh: one JSON line per boot in, medians
(min..max) per side and the ratios sparse-volume / losetup template out.

    boot_summary.py RECORDS.jsonl VOLUMES OUT.json
"""

import json
import statistics
import sys

SIDES = ("sparse-volume", "losetup")
# What is compared, and the target for the ratio (None: reported).
MEASURES = (
    ("first_to_last_active_s", "first volume unit started → last one active", 1.0),
    ("first_to_last_mounted_s", "first volume unit started → last consumer mounted", None),
    ("first_unit_started_s", "userspace start → first volume unit started", None),
    ("last_mounted_s", "userspace start → last consumer mounted", None),
    ("unit_median_s", "one volume unit, start → active (median)", None),
    ("unit_cpu_s", "CPU time of all volume units", None),
)


def complete(record, volumes):
    """Whether every volume and every consumer came up on this boot."""
    return (
        record["units_active"] == volumes
        and record["mounts_active"] == volumes
        and record["loop_mounts"] == volumes
    )


def spread(values):
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main(records_path, volumes, out_path):
    with open(records_path, encoding="utf-8") as stream:
        records = [json.loads(line) for line in stream if line.strip()]
    broken = [r for r in records if not complete(r, volumes)]
    for record in broken:
        print(f"incomplete boot, the comparison is void: {json.dumps(record)}", file=sys.stderr)
    by_side = {side: [r for r in records if r["variant"] == side] for side in SIDES}
    missing = [side for side in SIDES if not by_side[side]]
    if broken or missing:
        if missing:
            print(f"no boot measured for {', '.join(missing)}", file=sys.stderr)
        return 1

    rows = []
    for key, label, target in MEASURES:
        values = [[r[key] for r in by_side[side]] for side in SIDES]
        if any(v is None for side in values for v in side):
            continue  # not known on this guest (CPU accounting off)
        ours, peer = (spread(side) for side in values)
        rows.append(
            {
                "measure": key,
                "label": label,
                "sparse_volume": ours,
                "losetup_template": peer,
                "ratio": ours["median"] / peer["median"],
                "target": target,
            }
        )
    sample = by_side["sparse-volume"][0]
    print(
        f"\nboot of {volumes} volumes with fstab consumers by UUID=, "
        f"{len(by_side['sparse-volume'])} + {len(by_side['losetup'])} cold boots "
        f"({sample['kernel']}, {sample['systemd']}); seconds, median (min..max)\n"
    )
    print(f"{'':52} {'sparse-volume':>22} {'losetup template':>22} {'ratio':>7}  target")
    for row in rows:
        cells = [
            f"{s['median']:.2f} ({s['min']:.2f}..{s['max']:.2f})"
            for s in (row["sparse_volume"], row["losetup_template"])
        ]
        target = f"≤ {row['target']:.1f}×" if row["target"] else ""
        print(f"{row['label']:52} {cells[0]:>22} {cells[1]:>22} {row['ratio']:>6.2f}×  {target}")
    with open(out_path, "w", encoding="utf-8") as stream:
        json.dump({"volumes": volumes, "boots": records, "summary": rows}, stream, indent=1)
    print(f"\nevery boot: {out_path}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
