#!/usr/bin/env python3
"""I/O through a volume's loop device against its peers, side by side
(bench/run calls this after the attach comparisons; root, fio):

  io.py WORK CLI OUT SIZE_MIB SECONDS ROUNDS
  io.py --encrypted WORK CLI OUT SIZE_MIB SECONDS ROUNDS

With --encrypted (bench/vm-crypt-io.sh runs it in the test VM, where the
kernel has device-mapper), the volume is made with `create --encrypt`, and
the one peer is what an operator would build by hand from the same file:
`losetup --direct-io=on` and `cryptsetup open` with the same key file, so
both sides run the header's cipher with the same volume key. The two
mappings are open at once; fio runs on one at a time. Written to io-crypt.json.

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
ENCRYPTED_TARGETS = ["sparse-volume", "cryptsetup open on losetup --direct-io=on"]
PEER_MAPPING = "sparse-volume-bench-peer"
# What `create --encrypt` puts before the data: the LUKS2 header area.
LUKS_HEADER_MIB = 16
# The targets for ours / peer (None: reported only).
AT_LEAST = {
    ("losetup --direct-io=on", "4k random read"): 1.0,
    ("losetup --direct-io=on", "4k random write"): 1.0,
    ("losetup --direct-io=on", "1M sequential read"): 1.0,
    ("losetup --direct-io=on", "1M sequential write"): 1.0,
    ("raw file, O_DIRECT", "1M sequential read"): 0.97,
    ("raw file, O_DIRECT", "1M sequential write"): 0.97,
    **{(ENCRYPTED_TARGETS[1], name): 1.0 for name, *_ in WORKLOADS},
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
    args = sys.argv[1:]
    encrypted = args[:1] == ["--encrypted"]
    if encrypted:
        args = args[1:]
    work, cli, out, size_mib, seconds, rounds = args[:6]
    size_mib, seconds, rounds = int(size_mib), int(seconds), int(rounds)
    targets = ENCRYPTED_TARGETS if encrypted else TARGETS
    # fio's file size and the random fill: the data area.
    data_mib = size_mib - LUKS_HEADER_MIB if encrypted else size_mib
    env_root = os.path.join(work, "io-root")
    os.makedirs(env_root, exist_ok=True)
    os.environ["SPARSE_VOLUME_ROOT"] = env_root
    volume = str(uuidlib.uuid4())
    run(cli, "create", "--size", f"{size_mib}M", "--uuid", volume,
        *(["--encrypt", "--json"] if encrypted else []))
    backing = os.path.join(env_root, "var/lib/sparse-volume", volume)
    key_file = None
    if encrypted:
        listed = json.loads(run(cli, "list", "--json"))
        entry = next(v for v in listed["volumes"] if v["uuid"] == volume)
        key_file = os.path.join(env_root, entry["encryption"]["key_file"].lstrip("/"))
    devices = {}
    mappings = {}
    peers = []
    peer_mapping = False
    cache = {}
    try:
        attached = json.loads(run(cli, "attach", volume, "--json"))
        ours = attached["opened"] if encrypted else attached["device"]
        devices["sparse-volume"] = ours
        # Random data through our device: every block allocated, no holes
        # (encrypted: ciphertext over the whole data area).
        run("dd", "if=/dev/urandom", f"of={ours}", "bs=1M",
            f"count={data_mib}", "oflag=direct", "status=none")
        plain = run("losetup", "--find", "--show", "--direct-io=on", backing).strip()
        peers.append(plain)
        dio = {"sparse-volume": direct_io_in_effect(attached["device"]),
               "losetup --direct-io=on": direct_io_in_effect(plain)}
        if encrypted:
            run("cryptsetup", "open", "--type", "luks2", "--key-file", key_file,
                plain, PEER_MAPPING)
            peer_mapping = True
            devices[targets[1]] = f"/dev/mapper/{PEER_MAPPING}"
            # Same cipher, key size and sector size on both sides, shown
            # (cryptsetup status prints no key).
            for target in targets:
                status = run("cryptsetup", "status", devices[target])
                mappings[target] = {
                    key.strip(): value.strip()
                    for key, _, value in (line.partition(":") for line in status.splitlines()[1:])
                    if key.strip() in ("cipher", "keysize", "sector size", "flags")
                }
        else:
            devices["losetup --direct-io=on"] = plain
            devices["raw file, O_DIRECT"] = backing

        results = {name: {target: [] for target in targets} for name, *_ in WORKLOADS}
        for round_index in range(rounds):
            shift = round_index % len(targets)
            order = targets[shift:] + targets[:shift]
            for name, rw, block_size, unit in WORKLOADS:
                for target in order:
                    drop_caches()
                    measured = fio(devices[target], rw, block_size, seconds, data_mib)
                    results[name][target].append(measured[unit])

        if not encrypted:
            buffered = run("losetup", "--find", "--show", "--direct-io=off", backing).strip()
            peers.append(buffered)
            cache = {
                "sparse-volume": cached_by_a_read(devices["sparse-volume"], backing, size_mib),
                "losetup (buffered)": cached_by_a_read(buffered, backing, size_mib),
            }
    finally:
        if peer_mapping:
            subprocess.run(["cryptsetup", "close", PEER_MAPPING], check=False)
        for device in peers:
            subprocess.run(["losetup", "-d", device], check=False)
        subprocess.run([cli, "detach", volume], check=False, capture_output=True)
        # The random data is no longer the volume's file system, so
        # `remove --delete-data` would rightly refuse: unregister, then
        # delete the bench's own file (and the key file create made).
        subprocess.run([cli, "remove", volume], check=False, capture_output=True)
        for path in (backing, key_file):
            if path and os.path.exists(path):
                os.remove(path)

    name = "io-crypt.json" if encrypted else "io.json"
    with open(os.path.join(out, name), "w") as export:
        json.dump({"size_mib": size_mib, "seconds": seconds, "rounds": rounds,
                   "encrypted": encrypted, "mappings": mappings if encrypted else None,
                   "direct_io_in_effect": dio, "results": results,
                   "page_cache_bytes_after_reading_the_volume": cache}, export, indent=1)

    def summary(values):
        if len(values) == 1:
            return f"{values[0]:.0f}"
        return f"{statistics.median(values):.0f} ({min(values):.0f}..{max(values):.0f})"

    what = " encrypted (LUKS2, dm-crypt)" if encrypted else ""
    print(f"\nI/O{what}: fio libaio, queue depth 32, direct, {seconds} s per run, {rounds} rounds, "
          f"{size_mib} MiB of random data; direct I/O of the loop device in effect: "
          + ", ".join(f"{name} {'yes' if on else 'NO'}" for name, on in dio.items()))
    if encrypted:
        for target, mapping in mappings.items():
            print(f"{target}: " + ", ".join(f"{key} {value}" for key, value in mapping.items()))
    width = max(len(t) for t in targets) + 1
    headers = ["ours/peer"] if encrypted else ["ours/losetup", "ours/raw"]
    print(f"{'workload':<22} {'unit':<5} " + " ".join(f"{t:>{width}}" for t in targets)
          + "".join(f" {h:>13}" for h in headers))
    for name, _, _, unit in WORKLOADS:
        row = results[name]
        ours = statistics.median(row["sparse-volume"])
        ratios = []
        for peer in targets[1:]:
            ratio = ours / statistics.median(row[peer])
            goal = AT_LEAST.get((peer, name))
            mark = "" if goal is None else (" ok" if ratio >= goal else f" <{goal}")
            ratios.append(f"{ratio:.2f}x{mark}")
        print(f"{name:<22} {unit:<5} " + " ".join(f"{summary(row[t]):>{width}}" for t in targets)
              + "".join(f" {r:>13}" for r in ratios))
    moved = size_mib << 20
    for name, cached in cache.items():
        print(f"page cache of the backing file after reading {size_mib} MiB through {name}: "
              f"{cached / 2**20:.1f} MiB ({100 * cached / moved:.1f} % of the data moved)")


if __name__ == "__main__":
    main()
