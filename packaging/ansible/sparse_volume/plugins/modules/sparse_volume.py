#!/usr/bin/python
# Copyright: The sparse-volume project
# SPDX-License-Identifier: MIT

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparse_volume
short_description: Converge one persistent loop-device volume (sparse-volume apply)
version_added: 0.1.0
description:
  - Brings one volume of L(sparse-volume,https://github.com/sparse-volume/sparse-volume)
    on the managed node to the desired state. It creates it (sparse backing file, file system
    or GPT, registry entry), grows it, enables or disables it, sets it read-only, or
    unregisters it.
  - The module is a thin translation. It runs C(sparse-volume apply --stdin --json) with the
    options as one JSON document on standard input; every decision, check and refusal is the
    CLI's, so a task behaves exactly like the command on the node.
  - An existing volume is never re-formatted, shrunk or converted. Asking for that fails the
    task with the CLI's reason, and nothing changes.
  - The CLI runs every step's checks before the first step changes anything. A step that
    still fails after an earlier one changed the node (a volume created, then its start failed)
    fails the task with C(changed=true), the volume's RV(uuid) and the RV(actions) done, so the
    UUID the CLI chose is not lost.
  - The warnings the CLI prints on standard error (a O(read_only) change that waits for the
    next attach, a flag written while systemd is not reachable, an unknown key in its
    configuration) become the task's warnings.
  - Options left out mean "do not care" for an existing volume and the CLI's default for a new one.
  - With O(encrypt=true) a new volume is encrypted (LUKS2 inside its backing file, unlocked at
    boot by a key file) and the task returns its RV(recovery_key), the one time it is shown.
    Give such a task C(no_log=true) so that the key stays out of the output and the logs, and
    store it in a vault (for example with a following task that writes it there, also with
    C(no_log=true)).
author:
  - The sparse-volume project (@sparse-volume)
requirements:
  - The sparse-volume package (C(.deb) or C(.rpm)) on the managed node, in a version that has
    C(sparse-volume apply).
  - Root on the managed node (C(become=true)).
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
    details: Runs C(sparse-volume apply --dry-run), which makes every check of the real run.
  diff_mode:
    support: full
    details: The volume's record before and after, as the CLI reports them.
  platform:
    support: full
    platforms: posix
options:
  state:
    description:
      - V(present) creates the volume when it is missing and converges it otherwise.
      - V(absent) unregisters it (detaching it first; refused while it is mounted). Its backing
        file is kept unless O(delete_data=true).
    type: str
    choices: [present, absent]
    default: present
  uuid:
    description:
      - The volume UUID (for a file system volume its file system UUID, for a block volume its
        partition GUID).
      - When creating without it, the CLI picks one and the module returns it.
      - At least one of O(uuid) and O(name) is required.
    type: str
  name:
    description:
      - The volume's name, unique on a node. Identifies the volume when O(uuid) is not given.
    type: str
  size:
    description:
      - The size, as an integer number of bytes or a string with a unit such as V(10G) or V(512M).
        A computed size must be a whole number (Jinja's C(/) gives a float, which the CLI
        refuses; use C(//) or C(| int)).
      - Required to create a volume. A larger size than the current one grows the volume
        (checked against the free space); a smaller one is refused.
    type: raw
  mode:
    description:
      - V(filesystem) formats the backing file with O(fs_type). V(block) writes a GPT with one
        partition and no file system. Cannot be changed later; a different value for an existing
        volume is refused.
      - The CLI's default for a new volume is V(filesystem).
    type: str
    choices: [filesystem, block]
  fs_type:
    description:
      - File system of a O(mode=filesystem) volume. Cannot be changed later; a different value
        for an existing volume is refused.
      - The CLI's default for a new volume is V(ext4). V(xfs) needs at least 300 MB.
    type: str
    choices: [ext4, xfs]
  path:
    description:
      - Backing file on the node. The CLI's default is C(<storage root>/<uuid>). Cannot be
        changed later; a different value for an existing volume is refused.
    type: path
  enabled:
    description:
      - Whether the volume is attached at boot (its C(sparse-volume@<uuid>.service) pulled in).
      - The CLI's default for a new volume is V(true).
    type: bool
  read_only:
    description:
      - Whether the loop device is attached read-only. A change takes effect when the volume is
        next attached (the task warns when it is attached now).
    type: bool
  preallocate:
    description:
      - Allocate the whole backing file instead of keeping it sparse. Only when creating; a
        different value for an existing volume is refused.
    type: bool
  sector_size:
    description:
      - Logical sector size of the loop device, set when creating. The CLI's default for a new
        volume is the logical sector size of the device holding the backing file.
      - A different value for an existing volume is refused (the task fails, nothing changes);
        leave it out to accept the existing volume's.
    type: int
    choices: [512, 4096]
  mkfs_options:
    description:
      - Extra options for C(mkfs), one list item per argument, used when creating a
        O(mode=filesystem) volume.
      - For an existing volume, a list other than the options it was made with is refused (the
        task fails, nothing changes); an empty list is no difference.
    type: list
    elements: str
  encrypt:
    description:
      - V(true) encrypts a new volume (C(sparse-volume create --encrypt)) with LUKS2 inside its
        backing file, unlocked at boot by the key file O(key_file). The task returns the new
        volume's RV(recovery_key), once; give the task C(no_log=true).
      - For an existing volume, a value other than whether it is encrypted is refused (the task
        fails, nothing changes); a volume is never encrypted or decrypted in place.
      - The CLI's default for a new volume is V(false).
    type: bool
  key_file:
    description:
      - With O(encrypt=true), the key file on the node that unlocks the volume, as a path (its
        content never passes through the module). It must exist, belong to root and be readable by
        nobody else.
      - The CLI's default makes a new key file, C(/etc/sparse-volume/keys/<uuid>.key).
      - For an existing volume, another key file than its own is refused (the task fails, nothing
        changes).
    type: path
  clone_of:
    description:
      - Make the volume as a clone of this one (its UUID or name) when it does not exist, with
        its content at one instant, under an identity of its own (C(sparse-volume clone)). Needs
        O(name); O(mode), O(fs_type), O(path), O(preallocate), O(sector_size),
        O(mkfs_options), O(encrypt) and O(key_file) are the source's and must be left out.
      - An existing volume that is not a clone of it is refused (the task fails, nothing
        changes).
    type: str
  freeze_during_copy:
    description:
      - With O(clone_of), on storage that cannot share extents (no reflink), freeze a mounted
        source for the whole copy (its writers wait) instead of failing. The CLI's default is
        V(false).
    type: bool
  replaces_unit:
    description:
      - Take the volume over from the systemd unit that attached its file so far (a MetalK8s
        C(metalk8s-sparse-volume@<UUID>.service)), with its consumers mounted. The existing file
        at O(path) is registered, never made (needs O(uuid) and O(path)). The unit is masked at
        every boot, disabled and stopped without its C(ExecStop), and the loop device it made is
        adopted by the volume's own unit (C(sparse-volume register --replaces-unit)).
    type: str
  delete_data:
    description:
      - With O(state=absent), delete the backing file too. The CLI's default is V(false).
    type: bool
  now:
    description:
      - Also start (attach) an enabled volume or stop (detach) a disabled one now, through
        systemd when it runs. The CLI's default is V(false) (only at the next boot).
    type: bool
  binary:
    description:
      - The C(sparse-volume) executable on the node, a name looked up on E(PATH) or a path.
    type: str
    default: sparse-volume
notes:
  - Safe to run repeatedly; a second run with the same options reports no change.
  - Growing is capacity-checked by the CLI against the real free space of the storage root,
    including what other volumes may still grow into.
  - A failed task with C(changed=true) changed the node before it failed; its RV(uuid)
    names the volume. Fix the cause (the CLI's message says it) and run the task again.
seealso:
  - module: sparse_volume.sparse_volume.sparse_volume_info
"""

EXAMPLES = r"""
- name: A 10 GiB ext4 volume for a local PersistentVolume, attached at every boot
  sparse_volume.sparse_volume.sparse_volume:
    name: pv-postgres
    uuid: 0b6e3c52-4a8e-4f5f-9d8a-2f3c1f2b9e11
    size: 10G

- name: A raw block volume (GPT, one partition whose GUID is the UUID), attached right away
  sparse_volume.sparse_volume.sparse_volume:
    name: pv-raw
    mode: block
    size: 20G
    now: true

- name: Grow the postgres volume (a smaller size would fail the task)
  sparse_volume.sparse_volume.sparse_volume:
    name: pv-postgres
    size: 15G

- name: Keep a volume registered but do not attach it at boot
  sparse_volume.sparse_volume.sparse_volume:
    name: pv-raw
    enabled: false

- name: An encrypted volume; its recovery key is returned once, and kept out of the logs
  sparse_volume.sparse_volume.sparse_volume:
    name: pv-secrets
    size: 5G
    encrypt: true
  no_log: true
  register: secrets_volume
# Then hand secrets_volume.recovery_key (null unless this run created the
# volume) with secrets_volume.uuid and the node's name to your vault's
# module, in a task that has no_log: true as well.

- name: Unregister a volume and delete its data
  sparse_volume.sparse_volume.sparse_volume:
    name: pv-old
    state: absent
    delete_data: true
"""

RETURN = r"""
uuid:
  description: The volume UUID (the one the CLI chose when creating without O(uuid)).
    Null for an absent volume that was not known, and in check mode for a volume that
    would be created without O(uuid) (the CLI picks the UUID only when it creates it).
    A failed task returns the UUID the CLI's failure names (null when no volume was known);
    after a partial change (C(changed=true)) it is the volume that was made or changed.
  returned: always
  type: str
  sample: 0b6e3c52-4a8e-4f5f-9d8a-2f3c1f2b9e11
name:
  description: The volume's name, if it has one.
  returned: always
  type: str
  sample: pv-postgres
actions:
  description:
    - What was done (or, in check mode, would be done), in order. Each entry begins with one of
      V(create), V(resize), V(rename), V(enable), V(disable), V(read-only), V(read-write),
      V(start), V(stop), V(reload), V(remove), V(delete-data), possibly followed by details
      meant for people, such as V(rename to "pv-postgres"). V(reload) is a systemd reload for
      an O(enabled) flag that systemd had not seen yet.
    - A task that failed after a change returns what was done before the failure.
  returned: always
  type: list
  elements: str
  sample: ["resize 10 GiB to 15 GiB"]
before:
  description: The volume's record before the run; null when it did not exist.
  returned: always
  type: dict
  contains: &record
    uuid:
      description: Volume UUID.
      type: str
      returned: always
    name:
      description: Volume name, or null.
      type: str
      returned: always
    path:
      description: Backing file.
      type: str
      returned: always
    size:
      description: Size in bytes.
      type: int
      returned: always
    mode:
      description: V(filesystem) or V(block).
      type: str
      returned: always
    fs_type:
      description: File system, null in block mode.
      type: str
      returned: always
    enabled:
      description: Attached at boot.
      type: bool
      returned: always
    read_only:
      description: Attached read-only.
      type: bool
      returned: always
    preallocated:
      description: Backing file fully allocated.
      type: bool
      returned: always
    sector_size:
      description: Logical sector size.
      type: int
      returned: always
    encrypted:
      description: LUKS2 inside the backing file.
      type: bool
      returned: always
    key_file:
      description: The key file that unlocks an encrypted volume (its path), null when not
        encrypted.
      type: str
      returned: always
    device:
      description: Loop device it is attached to, or null.
      type: str
      returned: always
    active_state:
      description: The unit's systemd ActiveState, V(unknown) when systemd is not reachable.
      type: str
      returned: always
  sample:
    uuid: 0b6e3c52-4a8e-4f5f-9d8a-2f3c1f2b9e11
    name: pv-postgres
    path: /var/lib/sparse-volume/0b6e3c52-4a8e-4f5f-9d8a-2f3c1f2b9e11
    size: 10737418240
    mode: filesystem
    fs_type: ext4
    enabled: true
    read_only: false
    preallocated: false
    sector_size: 512
    encrypted: false
    key_file: null
    device: /dev/loop3
    active_state: active
after:
  description: The volume's record after the run (in check mode, as it would be); null once
    it is absent.
  returned: always
  type: dict
  contains: *record
recovery_key:
  description:
    - The recovery key of a volume this task created with O(encrypt=true), the one time it is
      shown (sparse-volume keeps no copy); null in every other result, check mode included.
      It opens the volume when its key file is lost.
    - Give the task C(no_log=true) and store the key in a vault. If a later step of the same
      task failed (a start with O(now=true)), the key is in the failure's message instead.
  returned: always
  type: str
  sample: null
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparse_volume.sparse_volume.plugins.module_utils.cli import run_json

# The keys of the CLI's desired-state document, named like the options.
DOCUMENT_KEYS = (
    "state", "uuid", "name", "size", "mode", "fs_type", "path", "enabled",
    "read_only", "preallocate", "sector_size", "mkfs_options", "encrypt", "key_file",
    "clone_of", "freeze_during_copy", "replaces_unit", "delete_data", "now",
)


def desired_state(params):
    """The JSON document for `apply --stdin`: only the options that were set."""
    document = {key: params[key] for key in DOCUMENT_KEYS if params[key] is not None}
    size = document.get("size")
    # Templating turns integers into strings ("{{ 2 * 1024 ** 3 }}"); the CLI
    # reads a string as a size with a unit, so bare digits go back to bytes.
    if isinstance(size, str) and size.strip().isdigit():
        document["size"] = int(size)
    return document


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["present", "absent"], default="present"),
            uuid=dict(type="str"),
            name=dict(type="str"),
            size=dict(type="raw"),
            mode=dict(type="str", choices=["filesystem", "block"]),
            fs_type=dict(type="str", choices=["ext4", "xfs"]),
            path=dict(type="path"),
            enabled=dict(type="bool"),
            read_only=dict(type="bool"),
            preallocate=dict(type="bool"),
            sector_size=dict(type="int", choices=[512, 4096]),
            mkfs_options=dict(type="list", elements="str"),
            encrypt=dict(type="bool"),
            # A path on the node: the key itself never passes through here.
            key_file=dict(type="path", no_log=False),
            clone_of=dict(type="str"),
            freeze_during_copy=dict(type="bool"),
            replaces_unit=dict(type="str"),
            delete_data=dict(type="bool"),
            now=dict(type="bool"),
            binary=dict(type="str", default="sparse-volume"),
        ),
        required_one_of=[("uuid", "name")],
        supports_check_mode=True,
    )

    args = ["apply", "--stdin", "--json"]
    if module.check_mode:
        args.append("--dry-run")
    report = run_json(module, args, data=json.dumps(desired_state(module.params)))

    result = dict(
        changed=bool(report.get("changed")),
        uuid=report.get("uuid"),
        name=report.get("name"),
        actions=report.get("actions") or [],
        before=report.get("before"),
        after=report.get("after"),
        # Shown once, by the run that enrolled it: the task's only chance
        # to keep it (the docs ask for no_log on such a task).
        recovery_key=report.get("recovery_key"),
    )
    if module._diff:
        # A missing volume is an empty text (callbacks render a dict as
        # lines), so creating and removing show every field added or dropped.
        result["diff"] = dict(before=report.get("before") or "",
                              after=report.get("after") or "")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
