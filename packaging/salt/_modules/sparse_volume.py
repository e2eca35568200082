"""
Salt execution module for sparse-volume.

A thin translation layer: every decision (what to create, grow, refuse) is
made by the ``sparse-volume`` CLI, which this module runs with
``__salt__["cmd.run_all"]`` and whose JSON report it returns unchanged,
but for ``warnings``: the CLI's warning lines (stderr), added when it gave
any.

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

# The CLI's warnings go to stderr as lines with this prefix, never into
# its JSON; they are returned under "warnings".
WARNING_PREFIX = "sparse-volume: warning: "

# What a failure after a change carries from the CLI's report: the volume
# exists now (under the UUID the CLI chose, when none was given), and
# these say which and what was done.
CHANGE_KEYS = ("changed", "uuid", "actions")


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


def _warnings(stderr):
    """The CLI's warnings, without their prefix, in the order it gave them."""
    lines = (line.strip() for line in (stderr or "").splitlines())
    return [
        line[len(WARNING_PREFIX) :] for line in lines if line.startswith(WARNING_PREFIX)
    ]


def _message(result, report):
    # The CLI's own sentence: the "error" field of its JSON when there is
    # one, else stderr (usage errors print no JSON) less its warnings,
    # which the failure carries on their own.
    if isinstance(report, dict) and report.get("error"):
        return report["error"]
    lines = (result.get("stderr") or "").strip().splitlines()
    text = "\n".join(line for line in lines if not line.startswith(WARNING_PREFIX))
    if text:
        return text
    return f"sparse-volume exited with status {result.get('retcode')}"


def _failure_info(report, warnings):
    """
    What a failure carries besides its sentence, as CommandExecutionError's
    ``info`` (salt-call prints it after the message; the state module reads
    it): after a change, the CLI's ``changed``, ``uuid`` and ``actions``;
    and the CLI's warnings. None when there is neither.
    """
    info = {}
    if isinstance(report, dict) and report.get("changed"):
        info.update({key: report.get(key) for key in CHANGE_KEYS})
    if warnings:
        info["warnings"] = warnings
    return info or None


def _exited_zero(retcode, report):
    return retcode == 0


def _run(args, stdin=None, answered=_exited_zero, secret_output=False):
    """
    Run the CLI with ``args`` (``--json`` appended) and return its parsed
    JSON, with the CLI's warnings under ``warnings`` when it gave any;
    raise CommandExecutionError with the CLI's message unless
    ``answered(retcode, report)`` says the run answered. With
    ``secret_output`` the command's output is kept out of the minion's log.
    """
    cmd = [_binary()] + list(args) + ["--json"]
    result = __salt__["cmd.run_all"](
        cmd,
        stdin=stdin,
        python_shell=False,
        # A refusal is an expected answer, reported by the caller; Salt
        # need not log it as a failed command as well.
        ignore_retcode=True,
        # apply's report may hold a new volume's recovery key: it goes to
        # the caller, never to the log.
        output_loglevel="quiet" if secret_output else "debug",
    )
    stdout = (result.get("stdout") or "").strip()
    try:
        report = json.loads(stdout) if stdout else None
    except ValueError:
        report = None
    warnings = _warnings(result.get("stderr"))
    if not answered(result.get("retcode"), report):
        raise CommandExecutionError(
            _message(result, report), info=_failure_info(report, warnings)
        )
    if not isinstance(report, dict):
        raise CommandExecutionError(
            f"sparse-volume {args[0]} printed no JSON: {stdout[:200]!r}"
        )
    if warnings:
        report["warnings"] = warnings
    return report


def _listed(retcode, report):
    """
    Whether ``list`` answered: exit 0, or exit 1 with a complete listing
    whose ``errors`` name the registry files that do not read (the CLI's
    exit status flags them; the listing returns them).
    """
    if retcode == 0:
        return True
    return (
        retcode == 1
        and isinstance(report, dict)
        and "volumes" in report
        and bool(report.get("errors"))
    )


def apply(test=None, **desired):
    """
    Converge one volume to the desired state with ``sparse-volume apply``.

    The keyword arguments are the CLI's document keys, passed as they are:
    ``state`` (present/absent), ``uuid``, ``name``, ``size`` (bytes or a
    string such as ``10G``), ``mode``, ``fs_type``, ``path``, ``enabled``,
    ``read_only``, ``preallocate``, ``sector_size``, ``mkfs_options``,
    ``encrypt``, ``key_file`` (a path on the minion, never the key itself),
    ``clone_of``, ``freeze_during_copy``, ``replaces_unit``, ``delete_data``,
    ``now``. Unknown
    keys are refused by the CLI.

    test
        Run with ``--dry-run`` (same checks, same report, no change).
        Defaults to the minion's ``test`` option.

    Returns the CLI's JSON report (``changed``, ``uuid``, ``actions``,
    ``before``, ``after``, ``dry_run``, ``recovery_key`` ...), and
    ``warnings`` (the CLI's warning lines) when it gave any.
    ``recovery_key`` is set only by the run that created an encrypted
    volume (``encrypt=True``), the one time it is shown: store it in a
    vault. The CLI's output is kept out of the minion's log for that reason.

    A refusal raises CommandExecutionError with the CLI's message; so does
    a step that failed after another changed the volume (a create whose
    start failed), whose ``info`` (printed after the message) then holds
    ``changed``, ``uuid`` (the volume made or changed) and ``actions``.

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
    return _run(args, stdin=json.dumps(desired), secret_output=True)


def list_():
    """
    Every registered volume, as ``sparse-volume list --json`` reports it,
    and ``warnings`` (the CLI's warning lines) when it gave any. Registry
    files that do not read are listed in ``errors`` (the CLI exits 1 for
    them; the listing is complete all the same).

    .. code-block:: bash

        salt-call sparse_volume.list
    """
    return _run(["list"], answered=_listed)


def status(volume):
    """
    One volume, by UUID, name, the beginning of its UUID, its loop device
    or its backing path, as ``sparse-volume status --json`` reports it,
    and ``warnings`` when the CLI gave any.

    .. code-block:: bash

        salt-call sparse_volume.status data
    """
    return _run(["status", str(volume)])
