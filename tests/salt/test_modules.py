"""
Unit tests of the execution and state modules with cmd.run_all replaced by
a recorder: what they hand the CLI, and how they read its answers. The real
CLI under salt-call is test_salt_call.py.
"""

import json

import pytest
from salt.exceptions import CommandExecutionError

REPORT_CREATE = {
    "changed": True,
    "uuid": "0b7f3c38-6a43-4f5e-9d5c-0c3f1e3c9a10",
    "name": "data",
    "state": "present",
    "dry_run": False,
    "actions": ["create"],
    "before": None,
    "after": {"uuid": "0b7f3c38-6a43-4f5e-9d5c-0c3f1e3c9a10", "size": 1 << 30},
}
REPORT_UNCHANGED = dict(REPORT_CREATE, changed=False, actions=[])
SHRINK = "volume data: refusing to shrink from 2 GiB to 1 GiB"


class CLI:
    """Stands in for cmd.run_all: records each call, answers from a queue."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = []

    def __call__(self, cmd, **kwargs):
        self.calls.append((cmd, kwargs))
        return self.answers.pop(0)

    @property
    def document(self):
        return json.loads(self.calls[-1][1]["stdin"])


def ok(report):
    return {"retcode": 0, "stdout": json.dumps(report), "stderr": "", "pid": 1}


def refused(message):
    return {
        "retcode": 1,
        "stdout": json.dumps({"changed": False, "uuid": None, "error": message}),
        "stderr": f"sparse-volume: {message}",
        "pid": 1,
    }


def partly_applied(message, actions):
    """A step failed after another changed the volume: the CLI's report
    says changed, the UUID (chosen by the CLI when none was given) and
    what was done, besides the error."""
    return {
        "retcode": 1,
        "stdout": json.dumps({"changed": True, "uuid": REPORT_CREATE["uuid"],
                              "actions": actions, "dry_run": False, "error": message}),
        "stderr": f"sparse-volume: {message}\n",
        "pid": 1,
    }


CREATE = "create a filesystem (ext4) volume of 1.00 GiB"
LATE = (f"applying a volume named data: {REPORT_CREATE['uuid']} after: {CREATE}: "
        "attaching: no free loop device")
RELOAD = ("systemd is not reachable, so nothing was reloaded: enabled = false takes effect "
          "at the next boot")
TYPO = '/etc/sparse-volume/config.toml:3: unknown key "storage_root"; ignored'
UNKNOWN = "unit states are unknown: cannot reach systemd on the system bus"


def warned(answer, *warnings):
    """answer with the CLI's warning lines (and a log line) on stderr first."""
    lines = [f"sparse-volume: warning: {w}" for w in warnings] + ["INFO a log line"]
    return dict(answer, stderr="\n".join(lines) + "\n" + answer["stderr"])


def listing_with_errors():
    """`list` when a registry file does not read: exit 1, the listing complete."""
    listing = {"changed": False, "volumes": [{"uuid": REPORT_CREATE["uuid"], "name": "data"}],
               "errors": [{"file": "/etc/sparse-volume/volumes.d/x.toml", "line": 1,
                           "reason": "string values must be quoted"}],
               "systemd_error": None, "storage_roots": [], "dry_run": False}
    return listing, {"retcode": 1, "stdout": json.dumps(listing), "stderr": "", "pid": 1}


@pytest.fixture
def binary(tmp_path):
    path = tmp_path / "sparse-volume"
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def wire(execution_module, state_module, binary):
    """The two modules joined as Salt joins them, around a given CLI."""

    def wire(cli, test=False, configured=None):
        opts = {"test": test}
        seen = {}

        def config_get(key, default=None):
            seen[key] = default
            return configured if configured is not None else binary

        execution_module.__opts__ = opts
        execution_module.__salt__ = {"cmd.run_all": cli, "config.get": config_get}
        state_module.__opts__ = opts
        state_module.__salt__ = {"sparse_volume.apply": execution_module.apply}
        return seen

    return wire


def test_apply_sends_the_desired_state_on_stdin(execution_module, wire, binary):
    cli = CLI(ok(REPORT_CREATE))
    seen = wire(cli)
    report = execution_module.apply(
        name="data", size="1G", fs_type="xfs", __pub_fun="sparse_volume.apply"
    )
    assert report == REPORT_CREATE
    cmd, kwargs = cli.calls[0]
    assert cmd == [binary, "apply", "--stdin", "--json"]
    # Salt's __pub_* keywords are not part of the document.
    assert cli.document == {"name": "data", "size": "1G", "fs_type": "xfs"}
    assert kwargs["python_shell"] is False
    assert seen == {"sparse_volume.binary": "sparse-volume"}


RECOVERY_KEY = "cbdefghi-jklnrtuv-cbdefghi-jklnrtuv-cbdefghi-jklnrtuv-cbdefghi-jklnrtuv"
REPORT_ENCRYPTED = dict(
    REPORT_CREATE,
    actions=["create an encrypted filesystem (ext4) volume of 1.00 GiB"],
    after=dict(REPORT_CREATE["after"], encrypted=True,
               key_file="/etc/sparse-volume/keys/0b7f3c38-6a43-4f5e-9d5c-0c3f1e3c9a10.key"),
    recovery_key=RECOVERY_KEY,
)


def test_apply_encrypt_passes_a_key_file_path_and_keeps_the_output_out_of_the_log(
        execution_module, wire, binary):
    cli = CLI(ok(REPORT_ENCRYPTED))
    wire(cli)
    report = execution_module.apply(name="data", size="1G", encrypt=True,
                                    key_file="/root/data.key")
    assert report["recovery_key"] == RECOVERY_KEY
    cmd, kwargs = cli.calls[0]
    # The key file is a path in the document on stdin, never an argument.
    assert cmd == [binary, "apply", "--stdin", "--json"]
    assert cli.document == {"name": "data", "size": "1G", "encrypt": True,
                            "key_file": "/root/data.key"}
    # The report may hold a recovery key: cmd.run_all must not log it.
    assert kwargs["output_loglevel"] == "quiet"


def test_list_output_is_still_logged_at_debug(execution_module, wire):
    listing, _ = listing_with_errors()
    cli = CLI(ok(dict(listing, errors=[])))
    wire(cli)
    execution_module.list_()
    assert cli.calls[0][1]["output_loglevel"] == "debug"


def test_present_returns_the_recovery_key_of_the_volume_it_created(state_module, wire):
    wire(CLI(ok(REPORT_ENCRYPTED)))
    ret = state_module.present("data", size="1G", encrypt=True)
    assert ret["result"] is True
    assert ret["changes"]["recovery_key"] == RECOVERY_KEY
    assert ret["changes"]["after"]["encrypted"] is True
    # Only in changes, where the run that made the volume returns it.
    assert RECOVERY_KEY not in ret["comment"]


def test_present_without_a_recovery_key_has_none_in_changes(state_module, wire):
    wire(CLI(ok(dict(REPORT_CREATE, recovery_key=None))))
    ret = state_module.present("data", size="1G")
    assert "recovery_key" not in ret["changes"]


@pytest.mark.parametrize("how", ["argument", "opts"])
def test_apply_under_test_is_a_dry_run(execution_module, wire, binary, how):
    cli = CLI(ok(dict(REPORT_CREATE, dry_run=True)))
    wire(cli, test=(how == "opts"))
    kwargs = {"test": True} if how == "argument" else {}
    execution_module.apply(name="data", size="1G", **kwargs)
    assert cli.calls[0][0] == [binary, "apply", "--stdin", "--dry-run", "--json"]
    assert "test" not in cli.document


def test_a_refusal_raises_with_the_cli_message(execution_module, wire):
    wire(CLI(refused(SHRINK)))
    with pytest.raises(CommandExecutionError) as exc:
        execution_module.apply(name="data", size="1G")
    assert str(exc.value) == SHRINK


def test_a_usage_error_raises_with_stderr(execution_module, wire):
    usage = "error: unknown key `sise` in the desired state"
    wire(CLI({"retcode": 2, "stdout": "", "stderr": usage + "\n", "pid": 1}))
    with pytest.raises(CommandExecutionError) as exc:
        execution_module.apply(name="data", sise="1G")
    assert str(exc.value) == usage


def test_success_without_json_is_an_error(execution_module, wire):
    wire(CLI({"retcode": 0, "stdout": "Created.", "stderr": "", "pid": 1}))
    with pytest.raises(CommandExecutionError, match="printed no JSON"):
        execution_module.apply(name="data", size="1G")


def test_a_missing_binary_names_the_setting(execution_module, wire):
    cli = CLI()
    wire(cli, configured="/nonexistent/sparse-volume")
    with pytest.raises(CommandExecutionError, match="sparse_volume.binary"):
        execution_module.list_()
    assert cli.calls == []


def test_list_and_status(execution_module, wire, binary):
    volume = {"uuid": REPORT_CREATE["uuid"], "name": "data"}
    listing = {"changed": False, "volumes": [volume], "errors": []}
    cli = CLI(ok(listing), ok(volume))
    wire(cli)
    assert execution_module.__func_alias__ == {"list_": "list"}
    # The CLI's report, unchanged.
    assert execution_module.list_() == listing
    assert execution_module.status("data") == volume
    assert [call[0] for call in cli.calls] == [
        [binary, "list", "--json"],
        [binary, "status", "data", "--json"],
    ]


def test_apply_after_a_partial_change_raises_with_the_change(execution_module, wire):
    wire(CLI(partly_applied(LATE, [CREATE])))
    with pytest.raises(CommandExecutionError) as exc:
        execution_module.apply(name="data", size="1G", now=True)
    # The CLI's sentence, and what salt-call prints after it ("Additional
    # info follows"): the volume now exists, under this UUID.
    assert exc.value.error == LATE
    assert exc.value.info == {"changed": True, "uuid": REPORT_CREATE["uuid"], "actions": [CREATE]}
    assert REPORT_CREATE["uuid"] in str(exc.value).split("Additional info follows")[1]


def test_a_refusal_carries_no_info(execution_module, wire):
    wire(CLI(refused(SHRINK)))
    with pytest.raises(CommandExecutionError) as exc:
        execution_module.apply(name="data", size="1G")
    assert exc.value.info is None


def test_apply_returns_the_cli_warnings(execution_module, wire):
    wire(CLI(warned(ok(REPORT_CREATE), TYPO, RELOAD)))
    report = execution_module.apply(name="data", enabled=False)
    assert report == dict(REPORT_CREATE, warnings=[TYPO, RELOAD])


def test_no_warnings_no_warnings_key(execution_module, wire):
    wire(CLI(dict(ok(REPORT_CREATE), stderr="INFO a log line\n")))
    assert "warnings" not in execution_module.apply(name="data")


def test_a_failure_carries_the_warnings(execution_module, wire):
    wire(CLI(warned(refused(SHRINK), TYPO)))
    with pytest.raises(CommandExecutionError) as exc:
        execution_module.apply(name="data", size="1G")
    assert exc.value.error == SHRINK
    assert exc.value.info == {"warnings": [TYPO]}


def test_list_returns_registry_files_that_do_not_read(execution_module, wire):
    listing, answer = listing_with_errors()
    wire(CLI(warned(answer, UNKNOWN)))
    assert execution_module.list_() == dict(listing, warnings=[UNKNOWN])


def test_list_that_failed_raises(execution_module, wire):
    message = "cannot read /etc/sparse-volume/config.toml: Permission denied"
    wire(CLI(refused(message)))
    with pytest.raises(CommandExecutionError) as exc:
        execution_module.list_()
    assert exc.value.error == message


def test_list_usage_error_raises_whatever_stdout_holds(execution_module, wire):
    _, answer = listing_with_errors()
    wire(CLI(dict(answer, retcode=2, stderr="error: unexpected argument\n")))
    with pytest.raises(CommandExecutionError):
        execution_module.list_()


def test_present_after_a_partial_change_fails_with_the_change(state_module, wire):
    wire(CLI(partly_applied(LATE, [CREATE])))
    ret = state_module.present("data", size="1G", now=True)
    assert ret["result"] is False
    assert ret["comment"] == LATE
    # The volume exists now: Salt must show it as a change, with its UUID.
    assert ret["changes"] == {"uuid": REPORT_CREATE["uuid"], "actions": [CREATE]}


def test_present_passes_the_warnings_on(state_module, wire):
    disabled = dict(REPORT_CREATE, actions=["disable"])
    wire(CLI(warned(ok(disabled), RELOAD)))
    ret = state_module.present("data", enabled=False)
    assert ret["result"] is True
    assert ret["warnings"] == [RELOAD]
    assert "warnings" not in ret["changes"]


def test_present_unchanged_passes_the_warnings_on(state_module, wire):
    wire(CLI(warned(ok(REPORT_UNCHANGED), TYPO)))
    ret = state_module.present("data", size="1G")
    assert ret["changes"] == {} and ret["warnings"] == [TYPO]


def test_present_refused_passes_the_warnings_on(state_module, wire):
    wire(CLI(warned(refused(SHRINK), TYPO)))
    ret = state_module.present("data", size="1G")
    assert ret["result"] is False and ret["comment"] == SHRINK
    assert ret["warnings"] == [TYPO]


def test_present_creates(state_module, wire):
    cli = CLI(ok(REPORT_CREATE))
    wire(cli)
    ret = state_module.present("data", size="1G", mode="filesystem")
    assert cli.document == {
        "name": "data",
        "state": "present",
        "size": "1G",
        "mode": "filesystem",
    }
    assert ret["result"] is True
    assert ret["name"] == "data"
    assert ret["changes"] == {
        "actions": ["create"],
        "before": None,
        "after": REPORT_CREATE["after"],
    }
    assert "create" in ret["comment"]


def test_present_without_change(state_module, wire):
    wire(CLI(ok(REPORT_UNCHANGED)))
    ret = state_module.present("data", size="1G")
    assert ret["result"] is True
    assert ret["changes"] == {}


def test_present_under_test_would_change(state_module, wire, binary):
    planned = dict(REPORT_CREATE, dry_run=True, actions=["resize 1 GiB to 2 GiB"])
    cli = CLI(ok(planned))
    wire(cli, test=True)
    ret = state_module.present("data", size="2G")
    assert "--dry-run" in cli.calls[0][0]
    assert ret["result"] is None
    assert ret["changes"]["actions"] == ["resize 1 GiB to 2 GiB"]
    assert "would be changed" in ret["comment"]


def test_present_under_test_without_change(state_module, wire):
    wire(CLI(ok(dict(REPORT_UNCHANGED, dry_run=True))), test=True)
    ret = state_module.present("data", size="1G")
    assert ret["result"] is True
    assert ret["changes"] == {}


def test_present_refused(state_module, wire):
    wire(CLI(refused(SHRINK)))
    ret = state_module.present("data", size="1G")
    assert ret == {"name": "data", "changes": {}, "result": False, "comment": SHRINK}


def test_absent_keeps_data_unless_asked(state_module, wire):
    removed = dict(REPORT_CREATE, state="absent", actions=["remove"], after=None)
    cli = CLI(ok(removed), ok(removed))
    wire(cli)
    state_module.absent("data")
    assert cli.document == {"name": "data", "state": "absent", "delete_data": False}
    ret = state_module.absent("data", uuid=REPORT_CREATE["uuid"], delete_data=True)
    assert cli.document == {
        "name": "data",
        "state": "absent",
        "delete_data": True,
        "uuid": REPORT_CREATE["uuid"],
    }
    assert ret["result"] is True
    assert ret["changes"]["actions"] == ["remove"]


def test_state_loads_only_with_the_execution_module(state_module):
    state_module.__salt__ = {}
    assert state_module.__virtual__()[0] is False
    state_module.__salt__ = {"sparse_volume.apply": None}
    assert state_module.__virtual__() == "sparse_volume"
