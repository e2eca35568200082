#!/usr/bin/python
# Copyright: The sparse-volume project
# SPDX-License-Identifier: MIT

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sparse_volume_info
short_description: List the persistent loop-device volumes of a node (sparse-volume list)
version_added: 0.1.0
description:
  - Runs C(sparse-volume list --json) on the managed node and returns what it reports, that is every
    registered volume with its backing file, size, loop device, udev link and unit state,
    registry files that failed to parse, and the free space of the storage roots.
  - A registry file that does not read is one of RV(errors), not a failed task.
  - The warnings the CLI prints on standard error (such as unit states that are unknown because
    systemd is not reachable) become the task's warnings.
  - Changes nothing.
author:
  - The sparse-volume project (@sparse-volume)
requirements:
  - The sparse-volume package on the managed node.
  - Root on the managed node (C(become=true)) to read the registry and the loop devices.
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
    details: Listing changes nothing, so it runs in check mode too.
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
options:
  binary:
    description:
      - The C(sparse-volume) executable on the node, a name looked up on E(PATH) or a path.
    type: str
    default: sparse-volume
seealso:
  - module: sparse_volume.sparse_volume.sparse_volume
"""

EXAMPLES = r"""
- name: Read the node's volumes
  sparse_volume.sparse_volume.sparse_volume_info:
  register: sv

- name: Every enabled volume must be attached
  ansible.builtin.assert:
    that: item.device is not none
    fail_msg: "{{ item.name | default(item.uuid) }} is enabled but not attached"
  loop: "{{ sv.volumes | selectattr('enabled') }}"
  loop_control:
    label: "{{ item.uuid }}"
"""

RETURN = r"""
volumes:
  description: One entry per registered volume, as C(sparse-volume list --json) prints it
    (the fields below and more; see the CLI's documentation).
  returned: always
  type: list
  elements: dict
  contains:
    uuid:
      description: Volume UUID.
      type: str
      returned: always
    name:
      description: Volume name, or null.
      type: str
      returned: always
    mode:
      description: V(filesystem) or V(block).
      type: str
      returned: always
    fs_type:
      description: File system, null in block mode.
      type: str
      returned: always
    size:
      description: Registered size in bytes.
      type: int
      returned: always
    allocated:
      description: Bytes the backing file occupies on disk, null when it cannot be inspected.
      type: int
      returned: always
    path:
      description: Backing file.
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
    device:
      description: Loop device the backing file is attached to, or null.
      type: str
      returned: always
    link:
      description: The udev link consumers use (C(/dev/disk/by-uuid/...) or C(/dev/disk/by-partuuid/...)).
      type: str
      returned: always
    unit:
      description: The volume's systemd unit.
      type: str
      returned: always
    active_state:
      description: The unit's ActiveState, V(unknown) when systemd is not reachable.
      type: str
      returned: always
  sample:
    - uuid: 0b6e3c52-4a8e-4f5f-9d8a-2f3c1f2b9e11
      name: pv-postgres
      mode: filesystem
      fs_type: ext4
      size: 10737418240
      allocated: 139264000
      path: /var/lib/sparse-volume/0b6e3c52-4a8e-4f5f-9d8a-2f3c1f2b9e11
      enabled: true
      read_only: false
      device: /dev/loop3
      link: /dev/disk/by-uuid/0b6e3c52-4a8e-4f5f-9d8a-2f3c1f2b9e11
      unit: sparse-volume@0b6e3c52-4a8e-4f5f-9d8a-2f3c1f2b9e11.service
      active_state: active
errors:
  description:
    - Registry files that failed to parse or validate. The CLI exits 1 when there are any,
      with the rest of its listing complete; the task succeeds and returns them here, so a
      play can check them (no C(ignore_errors) needed).
  returned: always
  type: list
  elements: dict
  contains:
    file:
      description: The registry file.
      type: str
      returned: always
    line:
      description: The line the reason is about, or null.
      type: int
      returned: always
    reason:
      description: Why the file does not read.
      type: str
      returned: always
  sample:
    - file: /etc/sparse-volume/volumes.d/0b6e3c52-4a8e-4f5f-9d8a-2f3c1f2b9e11.toml
      line: 3
      reason: "string values must be quoted, expected literal string"
storage_roots:
  description: Each storage root's file system, its free space against what its volumes may
    still grow into.
  returned: always
  type: list
  elements: dict
  sample: []
systemd_error:
  description: Why unit states are V(unknown), null when systemd answered.
  returned: always
  type: str
  sample: null
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparse_volume.sparse_volume.plugins.module_utils.cli import run_json


def listed(rc, report):
    """Whether `list` answered: exit 0, or exit 1 with a complete listing
    whose `errors` name the registry files that do not read (the CLI's
    exit status flags them; the task returns them)."""
    if rc == 0:
        return True
    return rc == 1 and report is not None and "volumes" in report and bool(report.get("errors"))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            binary=dict(type="str", default="sparse-volume"),
        ),
        supports_check_mode=True,
    )
    report = run_json(module, ["list", "--json"], succeeded=listed)
    module.exit_json(
        changed=False,
        volumes=report.get("volumes") or [],
        errors=report.get("errors") or [],
        storage_roots=report.get("storage_roots") or [],
        systemd_error=report.get("systemd_error"),
    )


if __name__ == "__main__":
    main()
