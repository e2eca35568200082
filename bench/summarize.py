#!/usr/bin/env python3
"""Turns bench/run's hyperfine exports into one table, results.json and a
plot (standard library and gnuplot only).

  summarize.py DIR KERNEL CPUS QUICK

DIR holds NAME.ROUND.json files, each a hyperfine export of two commands:
ours first, the peer second. Every round's times are pooled per command.
"""

import glob
import json
import os
import re
import statistics
import subprocess
import sys
import time

# The targets, as ratios ours / peer (None: reported only).
TARGETS = {
    "generator": 0.5,
    "attach-filesystem-alone": 1.0,
    "attach-block-alone": 2.0,
}


def pooled(directory):
    """{name: [(command, [seconds...]), ...]} over every round."""
    comparisons = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        match = re.fullmatch(r"(.+)\.(\d+)\.json", os.path.basename(path))
        if not match:
            continue
        with open(path) as export:
            results = json.load(export)["results"]
        entry = comparisons.setdefault(match.group(1), [])
        for index, result in enumerate(results):
            if len(entry) <= index:
                entry.append((result["command"], []))
            entry[index][1].extend(result["times"])
    return comparisons


def stats(times):
    return {
        "runs": len(times),
        "min": min(times),
        "median": statistics.median(times),
        "max": max(times),
    }


def volume_count(name):
    match = re.fullmatch(r"generator-(\d+)", name)
    return int(match.group(1)) if match else None


# Targets in seconds of our own time, met when every run is within.
ABSOLUTE_TARGETS = {
    "scrape-": 0.100,
}


def absolute_target_of(name):
    for prefix, seconds in ABSOLUTE_TARGETS.items():
        if name.startswith(prefix):
            return seconds
    return None


def target_of(name):
    if name.startswith("generator-"):
        return TARGETS["generator"]
    # At least 0.9x the peer's throughput: at most 1/0.9 of its time.
    if name.startswith(("export-", "import-")):
        return 1 / 0.9
    return TARGETS.get(name)


def summarize(directory, kernel, cpus, quick):
    rows = []
    for name, commands in pooled(directory).items():
        (ours_name, ours), (peer_name, peer) = commands
        row = {
            "comparison": name,
            "ours": {"command": ours_name, **stats(ours)},
            "peer": {"command": peer_name, **stats(peer)},
        }
        row["ratio"] = row["ours"]["median"] / row["peer"]["median"]
        count = volume_count(name)
        if count:
            row["volumes"] = count
            row["ours"]["per_volume_us"] = row["ours"]["median"] / count * 1e6
            row["peer"]["per_volume_us"] = row["peer"]["median"] / count * 1e6
        target = target_of(name)
        if target is not None:
            row["target"] = target
            row["met"] = row["ratio"] <= target
        limit = absolute_target_of(name)
        if limit is not None:
            row["absolute_target"] = limit
            row["absolute_met"] = row["ours"]["max"] <= limit
        rows.append(row)
    rows.sort(key=lambda r: (not r["comparison"].startswith("generator"),
                             r.get("volumes", 0), r["comparison"]))

    # The same attach on a crowded node against itself on a fresh one.
    fresh = {r["comparison"].removesuffix("-alone"): r["ours"]["median"]
             for r in rows if r["comparison"].endswith("-alone")}
    for row in rows:
        crowded = re.fullmatch(r"(attach-\w+)-\d+-(attached|unbound)", row["comparison"])
        if crowded and crowded.group(1) in fresh:
            row["vs_fresh_node"] = row["ours"]["median"] / fresh[crowded.group(1)]
    generator = [r for r in rows if "volumes" in r]
    flatness = None
    if len(generator) >= 2:
        small, large = generator[0], generator[-1]
        flatness = large["ours"]["per_volume_us"] / small["ours"]["per_volume_us"]

    report = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "kernel": kernel,
        "cpus": int(cpus),
        "quick": quick == "1",
        "comparisons": rows,
        "generator_per_volume_growth": flatness,
    }
    with open(os.path.join(directory, "results.json"), "w") as out:
        json.dump(report, out, indent=2)
    print_table(report)
    plot(directory, rows)


def millis(seconds):
    return f"{seconds * 1e3:.2f}"


def print_table(report):
    print(f"\nbench/run, {report['date']}, kernel {report['kernel']}, "
          f"{report['cpus']} CPUs{', --quick (sizes too small to judge)' if report['quick'] else ''}")
    print("times in ms: median (min..max) over every run; ratio = ours / peer (medians)")
    header = f"{'comparison':<30} {'ours':>24} {'peer':>24} {'ratio':>7} {'target':>8}"
    print(header)
    print("-" * len(header))
    for row in report["comparisons"]:
        ours, peer = row["ours"], row["peer"]
        cell = lambda s: f"{millis(s['median'])} ({millis(s['min'])}..{millis(s['max'])})"
        target = ""
        if "target" in row:
            target = f"<={row['target']:.1f} {'ok' if row['met'] else 'MISS'}"
        print(f"{row['comparison']:<30} {cell(ours):>24} {cell(peer):>24} "
              f"{row['ratio']:>6.2f}x {target:>8}")
        if "volumes" in row:
            print(f"{'':<30} {ours['per_volume_us']:>21.1f} us/volume"
                  f" {peer['per_volume_us']:>11.1f} us/volume")
        if "absolute_target" in row:
            verdict = "ok" if row["absolute_met"] else "MISS"
            print(f"{'':<30} ours in every run: at most {millis(ours['max'])} ms "
                  f"(target <={millis(row['absolute_target'])} {verdict})")
        if "vs_fresh_node" in row:
            verdict = "ok" if row["vs_fresh_node"] <= 1.2 else "MISS"
            print(f"{'':<30} ours against itself on a fresh node: "
                  f"{row['vs_fresh_node']:.2f}x (target <=1.2 {verdict})")
    if report["generator_per_volume_growth"] is not None:
        growth = report["generator_per_volume_growth"]
        verdict = "ok" if growth <= 1.2 else "MISS"
        print(f"generator cost per volume, largest against smallest size: "
              f"{growth:.2f}x (target <=1.2 {verdict})")


def plot(directory, rows):
    generator = [r for r in rows if "volumes" in r]
    attach = [r for r in rows if r["comparison"].startswith("attach-")]
    data = os.path.join(directory, "plot")
    with open(data + "-generator.dat", "w") as out:
        for row in generator:
            out.write(f"{row['volumes']} {row['ours']['per_volume_us']} "
                      f"{row['peer']['per_volume_us']}\n")
    with open(data + "-attach.dat", "w") as out:
        for row in attach:
            label = row["comparison"].removeprefix("attach-")
            out.write(f"\"{label}\" {row['ours']['median'] * 1e3} "
                      f"{row['peer']['median'] * 1e3}\n")
    script = f"""
set terminal pngcairo size 1200,500 noenhanced
set output '{os.path.join(directory, "cost-per-volume.png")}'
set multiplot layout 1,2
set title 'generator: time per volume'
set logscale x
set xlabel 'registered volumes (fstab lines)'
set ylabel 'microseconds per volume (median)'
set yrange [0:*]
set key top left
plot '{data}-generator.dat' using 1:2 with linespoints title 'sparse-volume-generator', \\
     '' using 1:3 with linespoints title 'systemd-fstab-generator'
unset logscale x
set title 'attach + detach of one volume'
set xlabel ''
set ylabel 'milliseconds (median)'
set style data histogram
set style histogram clustered
set style fill solid 0.6
set xtics rotate by -25
plot '{data}-attach.dat' using 2:xtic(1) title 'sparse-volume', '' using 3 title 'losetup'
unset multiplot
"""
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        print(f"no plot: gnuplot: {error}", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    summarize(*sys.argv[1:])
