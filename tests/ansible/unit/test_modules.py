"""Unit tests of the modules' translation, with the CLI replaced by a fake.

They pin what the modules send (argv, the stdin document) and how they
read the CLI's answers and refusals. The fleet test (test_fleet.py) runs
the same modules against the real binary.
"""

import json

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.sparse_volume.sparse_volume.plugins.modules import (
    sparse_volume,
    sparse_volume_info,
)

UUID = "0b6e3c52-4a8e-4f5f-9d8a-2f3c1f2b9e11"
RECORD = {
    "uuid": UUID, "name": "data", "path": "/var/lib/sparse-volume/" + UUID,
    "size": 67108864, "mode": "filesystem", "fs_type": "ext4", "enabled": True,
    "read_only": False, "preallocated": False, "sector_size": 512,
    "encrypted": False, "key_file": None, "device": None, "active_state": "unknown",
}


class Exited(Exception):
    """exit_json was called: the task's result."""


class Failed(Exception):
    """fail_json was called: the task's result."""


class FakeCli:
    """Records each run_command call and answers with canned output."""

    def __init__(self, rc=0, stdout="", stderr=""):
        self.answer = (rc, stdout, stderr)
        self.calls = []

    def __call__(self, cmd, data=None, **kwargs):
        self.calls.append((cmd, data))
        return self.answer

    def document(self):
        return json.loads(self.calls[-1][1])


def run(monkeypatch, module, args, cli):
    """Run a module's main() with args; return ("ok"|"failed", result).

    What the module passed to module.warn is the result's "warnings", as
    Ansible returns it (only when there were any)."""
    warnings = []

    def with_warnings(result):
        if warnings:
            result["warnings"] = list(warnings)
        return result

    def exit_json(self, **result):
        raise Exited(with_warnings(result))

    def fail_json(self, **result):
        raise Failed(with_warnings(result))

    monkeypatch.setattr(basic.AnsibleModule, "run_command",
                        lambda self, cmd, **kwargs: cli(cmd, **kwargs))
    monkeypatch.setattr(basic.AnsibleModule, "warn",
                        lambda self, warning, **kwargs: warnings.append(warning))
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    # A bare binary name is looked up on the node; pretend it is installed.
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path",
                        lambda self, name, required=False, opt_dirs=None: "/usr/bin/" + name)
    with patch_module_args(args):
        try:
            module.main()
        except Exited as e:
            return "ok", e.args[0]
        except Failed as e:
            return "failed", e.args[0]
    raise AssertionError("the module neither exited nor failed")


def report(**fields):
    base = {"changed": False, "uuid": UUID, "name": "data", "state": "present",
            "dry_run": False, "actions": [], "before": RECORD, "after": RECORD}
    base.update(fields)
    return json.dumps(base)


def test_sends_only_the_options_that_were_set(monkeypatch):
    cli = FakeCli(stdout=report())
    outcome, _ = run(monkeypatch, sparse_volume, {"name": "data", "size": "64M"}, cli)
    assert outcome == "ok"
    cmd, _ = cli.calls[0]
    assert cmd == ["/usr/bin/sparse-volume", "apply", "--stdin", "--json"]
    # state has a default in the module, everything else unset stays out.
    assert cli.document() == {"state": "present", "name": "data", "size": "64M"}


def test_every_document_key_is_passed_through(monkeypatch):
    args = {
        "state": "present", "uuid": UUID, "name": "data", "size": 1 << 30,
        "mode": "filesystem", "fs_type": "xfs", "path": "/srv/volumes/data",
        "enabled": False, "read_only": True, "preallocate": True, "sector_size": 4096,
        "mkfs_options": ["-m", "reflink=1"], "encrypt": True, "key_file": "/root/data.key",
        "delete_data": False, "now": True,
    }
    cli = FakeCli(stdout=report())
    run(monkeypatch, sparse_volume, dict(args, binary="/opt/sv/bin/sparse-volume"), cli)
    cmd, _ = cli.calls[0]
    assert cmd[0] == "/opt/sv/bin/sparse-volume", "a path is used as given"
    assert cli.document() == args


RECOVERY_KEY = "cbdefghi-jklnrtuv-cbdefghi-jklnrtuv-cbdefghi-jklnrtuv-cbdefghi-jklnrtuv"


def test_an_encrypted_create_returns_its_recovery_key(monkeypatch):
    key_file = "/etc/sparse-volume/keys/" + UUID + ".key"
    after = dict(RECORD, encrypted=True, key_file=key_file)
    cli = FakeCli(stdout=report(changed=True, before=None, after=after,
                                actions=["create an encrypted filesystem (ext4) volume of 64.0 MiB"],
                                recovery_key=RECOVERY_KEY))
    outcome, result = run(monkeypatch, sparse_volume,
                          {"name": "data", "size": "64M", "encrypt": True}, cli)
    assert outcome == "ok"
    assert result["recovery_key"] == RECOVERY_KEY
    assert result["after"]["key_file"] == key_file
    # Only `encrypt` goes to the CLI, on stdin; a key is never an argument.
    cmd, data = cli.calls[0]
    assert cmd == ["/usr/bin/sparse-volume", "apply", "--stdin", "--json"]
    assert cli.document() == {"state": "present", "name": "data", "size": "64M", "encrypt": True}


def test_a_key_file_goes_to_the_cli_as_a_path(monkeypatch):
    cli = FakeCli(stdout=report())
    run(monkeypatch, sparse_volume,
        {"name": "data", "encrypt": True, "key_file": "/root/data.key"}, cli)
    cmd, _ = cli.calls[0]
    # The path in the document on stdin; the CLI on the node reads the file.
    assert cli.document()["key_file"] == "/root/data.key"
    assert not any("key" in arg for arg in cmd), cmd


def test_no_recovery_key_is_null(monkeypatch):
    # Older CLIs print no such field: the result has it all the same.
    _, result = run(monkeypatch, sparse_volume, {"name": "data"}, FakeCli(stdout=report()))
    assert result["recovery_key"] is None


def test_templated_integer_size_goes_back_to_bytes(monkeypatch):
    cli = FakeCli(stdout=report())
    run(monkeypatch, sparse_volume, {"name": "data", "size": "1073741824"}, cli)
    assert cli.document()["size"] == 1073741824


def test_check_mode_is_a_dry_run(monkeypatch):
    cli = FakeCli(stdout=report(changed=True, dry_run=True, actions=["resize 64 MiB to 128 MiB"]))
    outcome, result = run(monkeypatch, sparse_volume,
                          {"name": "data", "size": "128M", "_ansible_check_mode": True}, cli)
    assert outcome == "ok"
    assert cli.calls[0][0][-1] == "--dry-run"
    assert result["changed"] is True
    assert result["actions"] == ["resize 64 MiB to 128 MiB"]


def test_result_comes_from_the_cli(monkeypatch):
    after = dict(RECORD, enabled=False)
    cli = FakeCli(stdout=report(changed=True, actions=["disable"], after=after))
    outcome, result = run(monkeypatch, sparse_volume, {"uuid": UUID, "enabled": False}, cli)
    assert outcome == "ok"
    assert result["changed"] is True
    assert result["uuid"] == UUID
    assert result["before"] == RECORD and result["after"] == after
    assert "diff" not in result, "diff only when asked for (--diff)"


def test_unchanged_is_not_changed(monkeypatch):
    outcome, result = run(monkeypatch, sparse_volume, {"name": "data"}, FakeCli(stdout=report()))
    assert outcome == "ok" and result["changed"] is False


def test_diff_mode_returns_before_and_after(monkeypatch):
    cli = FakeCli(stdout=report(changed=True, actions=["create"], before=None))
    _, result = run(monkeypatch, sparse_volume,
                    {"name": "data", "size": "64M", "_ansible_diff": True}, cli)
    # A volume that did not exist is an empty text, not null.
    assert result["diff"] == {"before": "", "after": RECORD}
    assert result["before"] is None


def test_absent_and_unknown(monkeypatch):
    cli = FakeCli(stdout=json.dumps({"changed": False, "uuid": None, "name": "gone",
                                     "state": "absent", "dry_run": False, "actions": [],
                                     "before": None, "after": None}))
    outcome, result = run(monkeypatch, sparse_volume, {"name": "gone", "state": "absent"}, cli)
    assert outcome == "ok"
    assert result["changed"] is False and result["uuid"] is None
    assert cli.document() == {"name": "gone", "state": "absent"}


def test_refusal_message_is_the_json_error(monkeypatch):
    message = "volume data (" + UUID + "): cannot shrink from 128 MiB to 64 MiB"
    cli = FakeCli(rc=1,
                  stdout=json.dumps({"changed": False, "uuid": UUID, "error": message}),
                  stderr="sparse-volume: " + message + "\n")
    outcome, result = run(monkeypatch, sparse_volume, {"name": "data", "size": "64M"}, cli)
    assert outcome == "failed"
    assert result["msg"] == message
    assert result["rc"] == 1
    assert result["stderr"] == "sparse-volume: " + message + "\n"
    assert "cannot shrink" in result["stdout"]


def partly_applied(actions, reason):
    """What the CLI prints when a step failed after others changed the
    volume: changed, the UUID (chosen by the CLI when none was given) and
    what was done, besides the error."""
    message = "applying a volume named data: %s after: %s: %s" % (UUID, ", ".join(actions), reason)
    return FakeCli(rc=1,
                   stdout=json.dumps({"changed": True, "uuid": UUID, "actions": actions,
                                      "dry_run": False, "error": message}),
                   stderr="sparse-volume: " + message + "\n")


def test_failure_after_a_change_reports_the_change_and_the_uuid(monkeypatch):
    create = "create a filesystem (ext4) volume of 64.0 MiB"
    cli = partly_applied([create], "attaching: no free loop device")
    outcome, result = run(monkeypatch, sparse_volume, {"name": "data", "size": "64M", "now": True}, cli)
    assert outcome == "failed"
    # The volume exists now: the task changed the node, and the UUID the
    # CLI chose is the only way to find it by UUID.
    assert result["changed"] is True
    assert result["uuid"] == UUID
    assert result["actions"] == [create]
    assert result["msg"].endswith("attaching: no free loop device")


def test_a_refusal_changed_nothing(monkeypatch):
    message = "volume data (" + UUID + "): cannot shrink from 128 MiB to 64 MiB"
    cli = FakeCli(rc=1, stdout=json.dumps({"changed": False, "uuid": UUID, "dry_run": False,
                                           "error": message}))
    _, result = run(monkeypatch, sparse_volume, {"name": "data", "size": "64M"}, cli)
    assert result["changed"] is False
    assert result["uuid"] == UUID, "the volume the refusal is about"


def test_cli_warnings_are_passed_on(monkeypatch):
    after = dict(RECORD, enabled=False)
    reload = ("systemd is not reachable, so nothing was reloaded: enabled = false takes "
              "effect at the next boot")
    typo = '/etc/sparse-volume/config.toml:3: unknown key "storage_root"; ignored'
    cli = FakeCli(stdout=report(changed=True, actions=["disable"], after=after),
                  stderr="sparse-volume: warning: %s\nINFO a log line\nsparse-volume: warning: %s\n"
                         % (typo, reload))
    outcome, result = run(monkeypatch, sparse_volume, {"name": "data", "enabled": False}, cli)
    assert outcome == "ok"
    assert result["warnings"] == [typo, reload]


def test_cli_warnings_are_passed_on_with_a_failure(monkeypatch):
    typo = '/etc/sparse-volume/config.toml:3: unknown key "storage_root"; ignored'
    cli = FakeCli(rc=1, stdout=json.dumps({"changed": False, "uuid": None, "error": "no size"}),
                  stderr="sparse-volume: warning: %s\nsparse-volume: no size\n" % typo)
    outcome, result = run(monkeypatch, sparse_volume, {"name": "data"}, cli)
    assert outcome == "failed"
    assert result["msg"] == "no size"
    assert result["warnings"] == [typo]


def test_no_warnings_no_warnings_key(monkeypatch):
    _, result = run(monkeypatch, sparse_volume, {"name": "data"},
                    FakeCli(stdout=report(), stderr="INFO sparse-volume: nothing to do\n"))
    assert "warnings" not in result


def test_refusal_without_json_takes_the_prefixed_stderr_line(monkeypatch):
    cli = FakeCli(rc=1, stderr="WARN some log line\nsparse-volume: the registry is locked\n"
                               "sparse-volume: warning: unit states are unknown\n")
    _, result = run(monkeypatch, sparse_volume, {"name": "data"}, cli)
    assert result["msg"] == "the registry is locked"


def test_usage_error_takes_the_first_stderr_line(monkeypatch):
    stderr = ("error: unexpected argument '--frobnicate' found\n\n"
              "Usage: sparse-volume apply [OPTIONS]\n\nFor more information, try '--help'.\n")
    _, result = run(monkeypatch, sparse_volume, {"name": "data"}, FakeCli(rc=2, stderr=stderr))
    assert result["msg"] == "error: unexpected argument '--frobnicate' found"
    assert result["rc"] == 2


def test_silent_failure_still_says_something(monkeypatch):
    _, result = run(monkeypatch, sparse_volume, {"name": "data"}, FakeCli(rc=101))
    assert result["msg"] == "sparse-volume exited with status 101 and printed no message"


def test_output_that_is_not_json_fails(monkeypatch):
    outcome, result = run(monkeypatch, sparse_volume, {"name": "data"}, FakeCli(stdout="ok\n"))
    assert outcome == "failed"
    assert result["msg"].startswith("sparse-volume printed no JSON report")


def test_needs_uuid_or_name(monkeypatch):
    cli = FakeCli(stdout=report())
    outcome, result = run(monkeypatch, sparse_volume, {"size": "64M"}, cli)
    assert outcome == "failed"
    assert "uuid" in result["msg"] and "name" in result["msg"]
    assert cli.calls == [], "the CLI is not run"


@pytest.mark.parametrize("bad", [{"mode": "raid"}, {"fs_type": "btrfs"}, {"sector_size": 1024},
                                 {"colour": "blue"}])
def test_bad_options_fail_before_the_cli(monkeypatch, bad):
    cli = FakeCli(stdout=report())
    outcome, _ = run(monkeypatch, sparse_volume, dict(bad, name="data"), cli)
    assert outcome == "failed"
    assert cli.calls == []


def test_info_lists_volumes(monkeypatch):
    listing = {"changed": False, "volumes": [dict(RECORD, allocated=4096)], "errors": [],
               "systemd_error": "no bus", "storage_roots": [{"path": "/var/lib/sparse-volume"}]}
    cli = FakeCli(stdout=json.dumps(listing))
    outcome, result = run(monkeypatch, sparse_volume_info, {"_ansible_check_mode": True}, cli)
    assert outcome == "ok"
    assert cli.calls[0][0] == ["/usr/bin/sparse-volume", "list", "--json"]
    assert cli.calls[0][1] is None, "nothing on stdin"
    assert result["changed"] is False
    assert result["volumes"] == listing["volumes"]
    assert result["systemd_error"] == "no bus"
    assert result["storage_roots"] == listing["storage_roots"]


def test_info_lists_despite_an_unreadable_registry_file(monkeypatch):
    # `list` exits 1 when a registry file does not read, and its report is
    # complete all the same: the file is one of its errors.
    bad = {"file": "/etc/sparse-volume/volumes.d/" + UUID + ".toml", "line": 1,
           "reason": "string values must be quoted"}
    listing = {"changed": False, "volumes": [dict(RECORD, allocated=4096)], "errors": [bad],
               "systemd_error": None, "storage_roots": [], "dry_run": False}
    unknown = "unit states are unknown: cannot reach systemd on the system bus"
    cli = FakeCli(rc=1, stdout=json.dumps(listing), stderr="sparse-volume: warning: %s\n" % unknown)
    outcome, result = run(monkeypatch, sparse_volume_info, {}, cli)
    assert outcome == "ok", result
    assert result["errors"] == [bad]
    assert result["volumes"] == listing["volumes"]
    assert result["warnings"] == [unknown]


def test_info_failure_with_a_json_error_fails(monkeypatch):
    # Exit 1 with the failure's object (no listing) stays a failure.
    message = "cannot read /etc/sparse-volume/config.toml: Permission denied"
    cli = FakeCli(rc=1, stdout=json.dumps({"changed": False, "uuid": None, "dry_run": False,
                                           "error": message}),
                  stderr="sparse-volume: " + message + "\n")
    outcome, result = run(monkeypatch, sparse_volume_info, {}, cli)
    assert outcome == "failed"
    assert result["msg"] == message


def test_info_usage_error_with_a_listing_still_fails(monkeypatch):
    # Only exit 1 is "listed, with errors": anything else is a failure
    # whatever stdout holds.
    listing = {"changed": False, "volumes": [], "errors": [{"file": "x", "line": 1, "reason": "r"}]}
    outcome, _ = run(monkeypatch, sparse_volume_info, {},
                     FakeCli(rc=2, stdout=json.dumps(listing), stderr="error: bad\n"))
    assert outcome == "failed"


def test_info_failure(monkeypatch):
    cli = FakeCli(rc=1, stderr="sparse-volume: cannot read /etc/sparse-volume/volumes.d: Permission denied\n")
    outcome, result = run(monkeypatch, sparse_volume_info, {}, cli)
    assert outcome == "failed"
    assert result["msg"] == "cannot read /etc/sparse-volume/volumes.d: Permission denied"
