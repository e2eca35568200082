"""
Salt execution module for sparse-volume.

A thin translation layer: every decision (what to create, grow, refuse) is
made by the ``sparse-volume`` CLI, which this module runs with
``__salt__["cmd.run_all"]`` and whose JSON report it returns unchanged.

The binary is looked up with ``config.get`` under ``sparse_volume.binary``
(minion config, grains or pillar); the default is ``sparse-volume`` on PATH.

.. code-block:: bash

    salt-call sparse_volume.apply name=data size=10G
    salt-call sparse_volume.apply name=data size=20G test=True
    salt-call sparse_volume.list
    salt-call sparse_volume.status data
"""

import json

import salt.utils.args
import salt.utils.path
from salt.exceptions import CommandExecutionError

__virtualname__ = "sparse_volume"

# "list" is a Python builtin, so the function is named list_.
__func_alias__ = {"list_": "list"}

DEFAULT_BINARY = "sparse-volume"


def __virtual__():
    # Always load: a missing binary is reported when a function runs, with
    # the path that was tried, which says more than a module that vanished.
    return __virtualname__


def _binary():
    configured = __salt__["config.get"]("sparse_volume.binary", DEFAULT_BINARY)
    found = salt.utils.path.which(configured)
    if not found:
        raise CommandExecutionError(
            f"sparse-volume binary {configured!r} not found: install sparse-volume "
            "or set sparse_volume.binary in the minion config or pillar"
        )
    return found


def _message(result, report):
    # The CLI's own sentence: the "error" field of its JSON when there is
    # one, else stderr (usage errors print no JSON).
    if isinstance(report, dict) and report.get("error"):
        return report["error"]
    text = (result.get("stderr") or "").strip()
    if text:
        return text
    return f"sparse-volume exited with status {result.get('retcode')}"


def _run(args, stdin=None):
    """
    Run the CLI with ``args`` (``--json`` appended) and return its parsed
    JSON; raise CommandExecutionError with the CLI's message on failure.
    """
    cmd = [_binary()] + list(args) + ["--json"]
    result = __salt__["cmd.run_all"](
        cmd,
        stdin=stdin,
        python_shell=False,
        # A refusal is an expected answer, reported by the caller; Salt
        # need not log it as a failed command as well.
        ignore_retcode=True,
        output_loglevel="debug",
    )
    stdout = (result.get("stdout") or "").strip()
    try:
        report = json.loads(stdout) if stdout else None
    except ValueError:
        report = None
    if result.get("retcode") != 0:
        raise CommandExecutionError(_message(result, report))
    if report is None:
        raise CommandExecutionError(
            f"sparse-volume {args[0]} printed no JSON: {stdout[:200]!r}"
        )
    return report


def apply(test=None, **desired):
    """
    Converge one volume to the desired state with ``sparse-volume apply``.

    The keyword arguments are the CLI's document keys, passed as they are:
    ``state`` (present/absent), ``uuid``, ``name``, ``size`` (bytes or a
    string such as ``10G``), ``mode``, ``fs_type``, ``path``, ``enabled``,
    ``read_only``, ``preallocate``, ``sector_size``, ``mkfs_options``,
    ``delete_data``, ``now``. Unknown keys are refused by the CLI.

    test
        Run with ``--dry-run`` (same checks, same report, no change).
        Defaults to the minion's ``test`` option.

    Returns the CLI's JSON report (``changed``, ``uuid``, ``actions``,
    ``before``, ``after``, ``dry_run`` ...).

    .. code-block:: bash

        salt-call sparse_volume.apply name=data size=10G fs_type=xfs
    """
    # Drop Salt's own __pub_* keywords: they are not part of the desired state.
    desired = salt.utils.args.clean_kwargs(**desired)
    if test is None:
        test = __opts__.get("test", False)
    args = ["apply", "--stdin"]
    if test:
        args.append("--dry-run")
    return _run(args, stdin=json.dumps(desired))


def list_():
    """
    Every registered volume, as ``sparse-volume list --json`` reports it.

    .. code-block:: bash

        salt-call sparse_volume.list
    """
    return _run(["list"])


def status(volume):
    """
    One volume, by UUID, name, the beginning of its UUID, its loop device
    or its backing path, as ``sparse-volume status --json`` reports it.

    .. code-block:: bash

        salt-call sparse_volume.status data
    """
    return _run(["status", str(volume)])
