#!/usr/bin/env python3
"""Set-up helpers for bench/run (standard library only).

  fixtures.py registry ROOT FSTAB N   N enabled ext4 volume files under
                                        ROOT and two fstabs with the same N
                                        UUIDs, for the generator comparison:
                                        FSTAB (`defaults 0 2`) and
                                        FSTAB.nofail (`defaults,nofail 0 2`)
  fixtures.py volumes ROOT N          N registered volumes under ROOT with
                                        sparse backing files of 1 GiB (no
                                        content: what a listing reads is
                                        the registry, the files' sizes and
                                        the loop devices); prints the
                                        backing files' host paths
  fixtures.py snapshot FILE           the loop device numbers that exist
  fixtures.py add-unbound N           loop device nodes until N unbound
                                        ones exist (LOOP_CTL_ADD)
  fixtures.py remove-new FILE         removes the unbound nodes that were
                                        not in the snapshot (LOOP_CTL_REMOVE)
"""

import fcntl
import os
import sys
import uuid

LOOP_CTL_ADD = 0x4C80
LOOP_CTL_REMOVE = 0x4C81


def write_entry(directory, volume):
    """An enabled ext4 volume of 1 GiB in the default storage root."""
    with open(os.path.join(directory, volume + ".toml"), "w") as entry:
        entry.write(
            f'uuid = "{volume}"\n'
            f'path = "/var/lib/sparse-volume/{volume}"\n'
            "size = 1073741824\n"
            'mode = "filesystem"\n'
            'fs_type = "ext4"\n'
            "enabled = true\n"
        )


def registry(root, fstab, count):
    volumes = os.path.join(root, "etc/sparse-volume/volumes.d")
    os.makedirs(volumes, exist_ok=True)
    with open(fstab, "w") as table, open(fstab + ".nofail", "w") as nofail:
        for index in range(count):
            volume = str(uuid.uuid4())
            write_entry(volumes, volume)
            table.write(f"UUID={volume} /srv/volume{index} ext4 defaults 0 2\n")
            nofail.write(f"UUID={volume} /srv/volume{index} ext4 defaults,nofail 0 2\n")


def volumes(root, count):
    entries = os.path.join(root, "etc/sparse-volume/volumes.d")
    storage = os.path.join(root, "var/lib/sparse-volume")
    os.makedirs(entries, exist_ok=True)
    os.makedirs(storage, exist_ok=True)
    for _ in range(count):
        volume = str(uuid.uuid4())
        backing = os.path.join(storage, volume)
        with open(backing, "w") as file:
            file.truncate(1 << 30)
        write_entry(entries, volume)
        print(backing)


def loop_numbers():
    """Every loop device the kernel has, bound or not."""
    numbers = set()
    for name in os.listdir("/sys/block"):
        if name.startswith("loop") and name[4:].isdigit():
            numbers.add(int(name[4:]))
    return numbers


def is_bound(number):
    return os.path.isdir(f"/sys/block/loop{number}/loop")


def snapshot(path):
    with open(path, "w") as out:
        out.write("\n".join(str(n) for n in sorted(loop_numbers())) + "\n")


def add_unbound(wanted):
    existing = loop_numbers()
    unbound = sum(1 for n in existing if not is_bound(n))
    control = os.open("/dev/loop-control", os.O_RDWR)
    try:
        number = 0
        while unbound < wanted:
            while number in existing:
                number += 1
            fcntl.ioctl(control, LOOP_CTL_ADD, number)
            existing.add(number)
            unbound += 1
    finally:
        os.close(control)


def remove_new(path):
    with open(path) as listing:
        before = {int(line) for line in listing if line.strip()}
    control = os.open("/dev/loop-control", os.O_RDWR)
    try:
        for number in sorted(loop_numbers() - before):
            if not is_bound(number):
                try:
                    fcntl.ioctl(control, LOOP_CTL_REMOVE, number)
                except OSError:
                    pass  # open by someone: left as it is
    finally:
        os.close(control)


def main(argv):
    command = argv[1] if len(argv) > 1 else ""
    if command == "registry" and len(argv) == 5:
        registry(argv[2], argv[3], int(argv[4]))
    elif command == "volumes" and len(argv) == 4:
        volumes(argv[2], int(argv[3]))
    elif command == "snapshot" and len(argv) == 3:
        snapshot(argv[2])
    elif command == "add-unbound" and len(argv) == 3:
        add_unbound(int(argv[2]))
    elif command == "remove-new" and len(argv) == 3:
        remove_new(argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
