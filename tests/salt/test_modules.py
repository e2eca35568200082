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
