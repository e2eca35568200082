#!/usr/bin/env python3
"""I/O through a volume's loop device against its peers, side by side
(bench/run calls this after the attach comparisons; root, fio):

  io.py WORK CLI OUT SIZE_MIB SECONDS ROUNDS

One filesystem volume of SIZE_MIB is made and attached by CLI (direct I/O,
as every volume), then filled with random data through its device, so no
read lands in a hole. The same file is also bound by plain
`losetup --direct-io=on`, and read and written directly (O_DIRECT). Each
fio workload (libaio, queue depth 32, direct) runs SECONDS on each of the
three, in an order that rotates every round, after the page cache was
dropped. Then the page cache: the whole volume is read once through our
device and once through a buffered `losetup` device, and `fincore` says how
much of the backing file each left in the page cache (the double caching a
direct-I/O loop device avoids).

Prints a table of medians (min..max) and the ratios ours / plain losetup and
ours / raw file, and writes io.json (every run) to OUT.
"""

import json
import os
import statistics
import subprocess
import sys
import uuid as uuidlib

WORKLOADS = [
    # name, fio rw, block size, what is reported
    ("4k random read", "randread", "4k", "iops"),
    ("4k random write", "randwrite", "4k", "iops"),
    ("1M sequential read", "read", "1M", "MB/s"),
    ("1M sequential write", "write", "1M", "MB/s"),
]
TARGETS = ["sparse-volume", "losetup --direct-io=on", "raw file, O_DIRECT"]
# The targets for ours / peer (None: reported only).
AT_LEAST = {
    ("losetup --direct-io=on", "4k random read"): 1.0,
    ("losetup --direct-io=on", "4k random write"): 1.0,
    ("losetup --direct-io=on", "1M sequential read"): 1.0,
    ("losetup --direct-io=on", "1M sequential write"): 1.0,
    ("raw file, O_DIRECT", "1M sequential read"): 0.97,
    ("raw file, O_DIRECT", "1M sequential write"): 0.97,
}


def run(*command, capture=True):
    result = subprocess.run(command, check=True, text=True, capture_output=capture)
    return result.stdout if capture else ""


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as control:
        control.write("3\n")


def loop_number(device):
    return os.path.basename(device).removeprefix("loop")


def direct_io_in_effect(device):
    path = f"/sys/block/loop{loop_number(device)}/loop/dio"
    with open(path) as flag:
        return flag.read().strip() == "1"


def fio(target, rw, block_size, seconds, size_mib):
    output = run(
        "fio", "--name=bench", f"--filename={target}", "--direct=1",
        "--ioengine=libaio", "--iodepth=32", f"--rw={rw}", f"--bs={block_size}",
        f"--size={size_mib}M", f"--runtime={seconds}", "--time_based",
        "--randrepeat=0", "--norandommap", "--output-format=json",
    )
    job = json.loads(output)["jobs"][0]
    side = job["read"] if "read" in rw else job["write"]
    return {"iops": side["iops"], "MB/s": side["bw_bytes"] / 1e6}


def resident_bytes(path):
    """Bytes of the file in the page cache, by fincore."""
    out = run("fincore", "--bytes", "--noheadings", "--output", "RES", path)
    return int(out.split()[0])


def cached_by_a_read(device, backing, size_mib):
    drop_caches()
    run("dd", f"if={device}", "of=/dev/null", "bs=1M", f"count={size_mib}", "iflag=direct")
    return resident_bytes(backing)


def main():
    work, cli, out, size_mib, seconds, rounds = sys.argv[1:7]
    size_mib, seconds, rounds = int(size_mib), int(seconds), int(rounds)
    env_root = os.path.join(work, "io-root")
    os.makedirs(env_root, exist_ok=True)
    os.environ["SPARSE_VOLUME_ROOT"] = env_root
    volume = str(uuidlib.uuid4())
    run(cli, "create", "--size", f"{size_mib}M", "--uuid", volume)
    backing = os.path.join(env_root, "var/lib/sparse-volume", volume)
    devices = {}
    peers = []
    try:
        attached = json.loads(run(cli, "attach", volume, "--json"))
        devices["sparse-volume"] = attached["device"]
        # Random data through our device: every block allocated, no holes.
        run("dd", "if=/dev/urandom", f"of={devices['sparse-volume']}", "bs=1M",
            f"count={size_mib}", "oflag=direct", "status=none")
        plain = run("losetup", "--find", "--show", "--direct-io=on", backing).strip()
        peers.append(plain)
        devices["losetup --direct-io=on"] = plain
        devices["raw file, O_DIRECT"] = backing
        dio = {name: direct_io_in_effect(dev) for name, dev in devices.items() if dev.startswith("/dev/")}

        results = {name: {target: [] for target in TARGETS} for name, *_ in WORKLOADS}
        for round_index in range(rounds):
            order = TARGETS[round_index % 3:] + TARGETS[:round_index % 3]
            for name, rw, block_size, unit in WORKLOADS:
                for target in order:
                    drop_caches()
                    measured = fio(devices[target], rw, block_size, seconds, size_mib)
                    results[name][target].append(measured[unit])

        buffered = run("losetup", "--find", "--show", "--direct-io=off", backing).strip()
        peers.append(buffered)
        cache = {
            "sparse-volume": cached_by_a_read(devices["sparse-volume"], backing, size_mib),
            "losetup (buffered)": cached_by_a_read(buffered, backing, size_mib),
        }
    finally:
        for device in peers:
            subprocess.run(["losetup", "-d", device], check=False)
        subprocess.run([cli, "detach", volume], check=False, capture_output=True)
        # The random data is no longer the volume's file system, so
        # `remove --delete-data` would rightly refuse: unregister, then
        # delete the bench's own file.
        subprocess.run([cli, "remove", volume], check=False, capture_output=True)
        if os.path.exists(backing):
            os.remove(backing)

    with open(os.path.join(out, "io.json"), "w") as export:
        json.dump({"size_mib": size_mib, "seconds": seconds, "rounds": rounds,
                   "direct_io_in_effect": dio, "results": results,
                   "page_cache_bytes_after_reading_the_volume": cache}, export, indent=1)

    def summary(values):
        if len(values) == 1:
            return f"{values[0]:.0f}"
        return f"{statistics.median(values):.0f} ({min(values):.0f}..{max(values):.0f})"

    print(f"\nI/O: fio libaio, queue depth 32, direct, {seconds} s per run, {rounds} rounds, "
          f"{size_mib} MiB of random data; direct I/O in effect: "
          + ", ".join(f"{name} {'yes' if on else 'NO'}" for name, on in dio.items()))
    print(f"{'workload':<22} {'unit':<5} " + " ".join(f"{t:>22}" for t in TARGETS)
          + f" {'ours/losetup':>13} {'ours/raw':>9}")
    for name, _, _, unit in WORKLOADS:
        row = results[name]
        ours = statistics.median(row["sparse-volume"])
        ratios = []
        for peer in TARGETS[1:]:
            ratio = ours / statistics.median(row[peer])
            goal = AT_LEAST.get((peer, name))
            mark = "" if goal is None else (" ok" if ratio >= goal else f" <{goal}")
            ratios.append(f"{ratio:.2f}x{mark}")
        print(f"{name:<22} {unit:<5} " + " ".join(f"{summary(row[t]):>22}" for t in TARGETS)
              + f" {ratios[0]:>13} {ratios[1]:>9}")
    moved = size_mib << 20
    for name, cached in cache.items():
        print(f"page cache of the backing file after reading {size_mib} MiB through {name}: "
              f"{cached / 2**20:.1f} MiB ({100 * cached / moved:.1f} % of the data moved)")


if __name__ == "__main__":
    main()
