"""
Salt state module for sparse-volume: volumes that persist across reboots.

The state's ``name`` is the volume's name, its identity on the node; a
``uuid`` may be given as well. Everything else is passed to
``sparse-volume apply``, which decides what to create, grow or refuse;
this module only turns its JSON report into a state return.

.. code-block:: yaml

    data:
      sparse_volume.present:
        - size: 10G
        - fs_type: xfs

    scratch:
      sparse_volume.present:
        - size: 2G
        - mode: block

    secrets:
      sparse_volume.present:
        - size: 5G
        - encrypt: True

    old-data:
      sparse_volume.absent:
        - delete_data: False

An encrypted volume's recovery key is returned once, by the run that
created it, under ``changes:recovery_key``. Salt has no per-state
``no_log``: apply such a state with ``--state-output=terse`` so that the
output leaves ``changes`` out, take the key from the job's return
(``salt-run jobs.lookup_jid <JID> --out=json``) into a vault, and keep the
master's job cache, which holds the return, short (``keep_jobs_seconds``).
"""

from salt.exceptions import CommandExecutionError

__virtualname__ = "sparse_volume"


def __virtual__():
    if "sparse_volume.apply" in __salt__:
        return __virtualname__
    return (False, "the sparse_volume execution module is not available")


def _pass_on_warnings(ret, warnings):
    # Salt's outputters show a state's "warnings"; an empty list would
    # still count the state as one with warnings.
    if warnings:
        ret["warnings"] = list(warnings)


def _failed(ret, exc):
    """The state return of a refusal, or of a failure after a change."""
    # The CLI's own sentence, without the "Additional info follows" that
    # Salt appends to the exception's text.
    ret["comment"] = exc.error
    info = exc.info if isinstance(exc.info, dict) else {}
    if info.get("changed"):
        # A step failed after another changed the node (a create whose
        # start failed): the volume exists, under this UUID, and Salt must
        # count the change.
        ret["changes"] = {
            "uuid": info.get("uuid"),
            "actions": info.get("actions") or [],
        }
    _pass_on_warnings(ret, info.get("warnings"))
    return ret


def _converge(name, desired):
    ret = {"name": name, "changes": {}, "result": False, "comment": ""}
    test = bool(__opts__.get("test", False))
    try:
        report = __salt__["sparse_volume.apply"](test=test, **desired)
    except CommandExecutionError as exc:
        # A refusal (shrink, capacity, a different mode ...), a usage
        # error, or a failure after a change: the CLI's sentence is the
        # comment.
        return _failed(ret, exc)
    _pass_on_warnings(ret, report.get("warnings"))

    if not report.get("changed"):
        ret["result"] = True
        ret["comment"] = f"sparse-volume {name} is already in the desired state"
        return ret

    ret["changes"] = {
        "actions": report.get("actions", []),
        "before": report.get("before"),
        "after": report.get("after"),
    }
    if report.get("recovery_key"):
        # The one time it is shown: the state's return is the only place
        # left to take it from (see the module's docstring).
        ret["changes"]["recovery_key"] = report["recovery_key"]
    actions = ", ".join(report.get("actions", [])) or "changes"
    if test:
        # None is Salt's "would change" in test mode.
        ret["result"] = None
        ret["comment"] = f"sparse-volume {name} would be changed: {actions}"
    else:
        ret["result"] = True
        ret["comment"] = f"sparse-volume {name}: {actions}"
    return ret


def present(name, **kwargs):
    """
    Make sure the volume ``name`` exists as described.

    name
        The volume's name (unique on the node).

    Any other argument is a key of ``sparse-volume apply``: ``uuid``,
    ``size`` (bytes or ``10G``), ``mode`` (filesystem/block), ``fs_type``
    (ext4/xfs), ``path``, ``enabled``, ``read_only``, ``preallocate``,
    ``sector_size``, ``mkfs_options``, ``now``, ``encrypt`` (LUKS2 inside
    a new volume's backing file, unlocked at boot by a key file; the run
    that creates it returns its recovery key under
    ``changes:recovery_key``, once) and ``key_file`` (the key file's path
    on the minion; by default a new one under
    ``/etc/sparse-volume/keys``), and ``clone_of`` (make
    it as a clone of that volume, its content at one instant; with
    ``freeze_during_copy`` on storage without reflink), and
    ``replaces_unit`` (register the existing file at ``path`` and take it
    over, consumers mounted, from the unit that attached it, such as
    ``metalk8s-sparse-volume@<UUID>.service``). Omitted keys mean the
    default for a new volume and "leave as it is" for an existing one.
    A smaller size, or a different mode, file system, path, sector size,
    preallocation, mkfs options, encryption or key file, is refused (result
    False) and never applied. A step that fails after another changed the volume (a create
    whose start failed) is result False with the change under ``changes``
    (``uuid``, ``actions``). The CLI's warnings are the state's
    ``warnings``.
    """
    desired = dict(kwargs, name=name, state="present")
    return _converge(name, desired)


def absent(name, uuid=None, delete_data=False):
    """
    Make sure the volume ``name`` is not registered (detached first).

    name
        The volume's name.

    uuid
        Its UUID, when known.

    delete_data
        Also delete the backing file. By default the file is kept.
    """
    desired = {"name": name, "state": "absent", "delete_data": bool(delete_data)}
    if uuid is not None:
        desired["uuid"] = uuid
    return _converge(name, desired)
