"""
The real thing: `salt-call --local` applies tests/salt/volumes.sls with the
modules of packaging/salt and the binary in SV_BINARY, in a private registry
root (SPARSE_VOLUME_ROOT), the way an operator runs a masterless minion.
What happened on disk is checked with blkid, sfdisk, stat and sha256, not
with sparse-volume itself. The steps run in file order and build on each
other (pytest keeps the order of a module's tests).
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import EXECUTION_MODULE, STATE_MODULE

HERE = Path(__file__).resolve().parent
MIB = 1 << 20


def _binary():
    binary = os.environ.get("SV_BINARY")
    if not binary:
        pytest.fail("SV_BINARY is not set: run tests/salt/run.sh")
    return binary


class Node:
    """A masterless minion with its own config dir, file root and registry root."""

    def __init__(self, base):
        self.base = base
        self.binary = _binary()
        # Laid out like tests/common/mod.rs Fixture::new.
        self.root = base / "root"
        (self.root / "etc/sparse-volume/volumes.d").mkdir(parents=True)
        (self.root / "var/lib/sparse-volume").mkdir(parents=True)
        self.env = dict(
            os.environ,
            SPARSE_VOLUME_ROOT=str(self.root),
            # No systemd for the CLI: it takes its "no systemd" paths.
            DBUS_SYSTEM_BUS_ADDRESS="unix:path=/nonexistent",
        )
        # The files an operator copies into file_roots, and the SLS.
        srv = base / "srv"
        (srv / "_modules").mkdir(parents=True)
        (srv / "_states").mkdir()
        shutil.copy(EXECUTION_MODULE, srv / "_modules/sparse_volume.py")
        shutil.copy(STATE_MODULE, srv / "_states/sparse_volume.py")
        shutil.copy(HERE / "volumes.sls", srv / "volumes.sls")
        self.config_dir = self.minion_config("minion", srv)

    def minion_config(self, name, file_root):
        """A config dir for salt-call --local; everything Salt writes
        (cache, pki, logs) stays under its own root_dir."""
        config_dir = self.base / f"{name}-config"
        config_dir.mkdir()
        config = {
            "id": "sv-salt-test",
            "file_client": "local",
            "root_dir": str(self.base / f"{name}-state"),
            "file_roots": {"base": [str(file_root)]},
            "sparse_volume.binary": self.binary,
        }
        # JSON is YAML: no YAML writer needed.
        (config_dir / "minion").write_text(json.dumps(config))
        return config_dir

    def salt_call(self, *args, config_dir=None, env=None):
        """Run salt-call; return (exit status, the "local" part of its JSON)."""
        # Through the interpreter: run.sh's venv was built under another
        # name, which the script's #! line still holds.
        salt_call = Path(sys.executable).parent / "salt-call"
        cmd = [
            sys.executable,
            str(salt_call),
            "--local",
            "--config-dir",
            str(config_dir or self.config_dir),
            "--out=json",
            "--retcode-passthrough",
            "--log-level=warning",
            *args,
        ]
        run = subprocess.run(
            cmd, env=env or self.env, capture_output=True, text=True, check=False
        )
        try:
            local = json.loads(run.stdout)["local"]
        except (ValueError, KeyError) as exc:
            pytest.fail(
                f"{' '.join(args)}: no JSON from salt-call ({exc}), "
                f"status {run.returncode}\nstdout: {run.stdout}\nstderr: {run.stderr}"
            )
        return run.returncode, local

    def apply(self, *extra, ext4_size=None):
        args = ["state.apply", "volumes", *extra]
        if ext4_size:
            args.append("pillar=" + json.dumps({"sv_test": {"ext4_size": ext4_size}}))
        return self.salt_call(*args)

    def cli(self, *args, stdin=None):
        """The binary itself, for the messages the states must pass on."""
        return subprocess.run(
            [self.binary, *args],
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
        )

    def registry(self):
        return sorted((self.root / "etc/sparse-volume/volumes.d").glob("*.toml"))

    def wheel_site(self):
        """The saltext wheel (SV_SALT_WHEEL, built by run.sh) installed
        into a directory of its own, for PYTHONPATH; installed once."""
        site = self.base / "wheel-site"
        if site.exists():
            return site
        wheel = os.environ.get("SV_SALT_WHEEL")
        if not wheel:
            pytest.fail("SV_SALT_WHEEL is not set: run tests/salt/run.sh")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
             "--disable-pip-version-check", "--target", str(site), wheel],
            check=True,
        )
        return site

    def plant_unusable_lock(self, volume):
        """A lock file of the volume, owned by nobody, where its attach takes
        its lock: the CLI refuses a lock file that another user could hold
        open. `create` takes no lock of the volume's, so a create with `now`
        makes the volume, then its start fails: a real partial failure,
        without systemd."""
        lock = self.root / "run/sparse-volume" / f"{volume}.lock"
        lock.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        lock.write_text("")
        os.chown(lock, 65534, 65534)
        return lock

    def backing(self, uuid):
        return self.root / "var/lib/sparse-volume" / uuid

    def fingerprint(self):
        """sha256 of every registry and backing file: "nothing changed"
        means these bytes did not change."""
        files = self.registry() + sorted(
            (self.root / "var/lib/sparse-volume").iterdir()
        )
        digests = {}
        for path in files:
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            digests[str(path.relative_to(self.root))] = digest.hexdigest()
        return digests

    def loop_devices(self):
        """Loop devices whose backing file is under this test's tree,
        from losetup (the kernel's view)."""
        listing = subprocess.run(
            ["losetup", "--json", "--list"], capture_output=True, text=True, check=True
        ).stdout
        devices = json.loads(listing or '{"loopdevices": []}')["loopdevices"]
        return [
            d["name"]
            for d in devices
            if (d.get("back-file") or "").startswith(str(self.base))
        ]

    def cleanup(self):
        # Nothing here attaches a volume, but should the CLI have done so,
        # the temporary tree must not be removed under a loop device.
        for entry in self.registry():
            self.cli("detach", entry.stem)
        for device in self.loop_devices():
            subprocess.run(["losetup", "-d", device], check=False)


def by_id(local):
    """state.apply's result keyed by state ID (the second field of the
    tag "module_|-id_|-name_|-function")."""
    assert isinstance(local, dict), f"the states did not run: {local}"
    return {tag.split("_|-")[1]: ret for tag, ret in local.items()}


def blkid(path):
    out = subprocess.run(
        ["blkid", "-p", "-o", "export", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def gpt_partition_guids(path):
    """The unique GUIDs of the partitions in a GPT image, from sgdisk."""
    def sgdisk(*args):
        return subprocess.run(
            ["sgdisk", *args, str(path)], capture_output=True, text=True, check=True
        ).stdout

    # --print lists one line per partition, each starting with its number.
    numbers = [
        line.split()[0]
        for line in sgdisk("--print").splitlines()
        if line.strip()[:1].isdigit() and line.startswith(" ")
    ]
    guids = []
    for number in numbers:
        for line in sgdisk("--info", number).splitlines():
            if line.startswith("Partition unique GUID:"):
                guids.append(line.split(":", 1)[1].strip().lower())
    return guids


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    node = Node(tmp_path_factory.mktemp("salt-call"))
    node.uuids = {}
    yield node
    node.cleanup()


def test_sync_brings_the_modules(node):
    # What an operator runs once after copying the files (a highstate
    # syncs by itself; state.apply of one SLS does not).
    status, synced = node.salt_call("saltutil.sync_all")
    assert status == 0, synced
    assert synced["modules"] == ["modules.sparse_volume"], synced
    assert synced["states"] == ["states.sparse_volume"], synced


def test_apply_creates_three_volumes(node):
    status, local = node.apply()
    states = by_id(local)
    assert status == 0, states
    assert set(states) == {"ext4-data", "xfs-data", "raw-block"}
    for name, ret in states.items():
        assert ret["result"] is True, ret
        assert ret["changes"]["before"] is None, ret
        assert ret["changes"]["actions"][0].startswith("create"), ret
        after = ret["changes"]["after"]
        assert after["name"] == name
        node.uuids[name] = after["uuid"]

    expected = {"ext4-data": 64 * MIB, "xfs-data": 320 * MIB, "raw-block": 64 * MIB}
    for name, size in expected.items():
        uuid = node.uuids[name]
        assert (node.root / f"etc/sparse-volume/volumes.d/{uuid}.toml").is_file()
        assert node.backing(uuid).stat().st_size == size, name
        assert states[name]["changes"]["after"]["size"] == size, name

    # The content, as blkid and sfdisk read it: the volume UUID is the
    # file system UUID, or the GPT partition's unique GUID.
    for name, fs_type in (("ext4-data", "ext4"), ("xfs-data", "xfs")):
        probe = blkid(node.backing(node.uuids[name]))
        assert probe.get("TYPE") == fs_type, probe
        assert probe.get("UUID") == node.uuids[name], probe
    block = node.backing(node.uuids["raw-block"])
    assert blkid(block).get("PTTYPE") == "gpt"
    assert gpt_partition_guids(block) == [node.uuids["raw-block"]]


def test_reapply_changes_nothing(node):
    before = node.fingerprint()
    status, local = node.apply()
    states = by_id(local)
    assert status == 0
    for ret in states.values():
        assert ret["result"] is True, ret
        assert ret["changes"] == {}, ret
    assert node.fingerprint() == before


def test_dry_run_of_a_grow_changes_nothing(node):
    before = node.fingerprint()
    status, local = node.apply("test=True", ext4_size="96M")
    states = by_id(local)
    assert status == 0, states
    grow = states["ext4-data"]
    assert grow["result"] is None, grow
    assert [a.split()[0] for a in grow["changes"]["actions"]] == ["resize"], grow
    assert grow["changes"]["before"]["size"] == 64 * MIB
    assert grow["changes"]["after"]["size"] == 96 * MIB
    for name in ("xfs-data", "raw-block"):
        assert states[name]["result"] is True, states[name]
        assert states[name]["changes"] == {}, states[name]
    assert node.fingerprint() == before
    assert node.backing(node.uuids["ext4-data"]).stat().st_size == 64 * MIB


def test_grow_applied(node):
    status, local = node.apply(ext4_size="96M")
    grow = by_id(local)["ext4-data"]
    assert status == 0, grow
    assert grow["result"] is True, grow
    assert grow["changes"]["actions"][0].startswith("resize"), grow
    uuid = node.uuids["ext4-data"]
    assert node.backing(uuid).stat().st_size == 96 * MIB
    # The execution module's status and list read the registry back.
    status, volume = node.salt_call("sparse_volume.status", "ext4-data")
    assert status == 0, volume
    assert volume["uuid"] == uuid and volume["size"] == 96 * MIB, volume
    status, listing = node.salt_call("sparse_volume.list")
    assert status == 0, listing
    assert sorted(v["name"] for v in listing["volumes"]) == sorted(node.uuids)


def test_shrink_is_refused_with_the_cli_message(node):
    before = node.fingerprint()
    status, local = node.apply(ext4_size="64M")
    shrink = by_id(local)["ext4-data"]
    assert status != 0
    assert shrink["result"] is False, shrink
    assert shrink["changes"] == {}
    # The very sentence the CLI gives for the same request.
    refusal = node.cli(
        "apply", "--stdin", "--json", "--dry-run",
        stdin=json.dumps({"name": "ext4-data", "size": "64M"}),
    )
    assert refusal.returncode == 1, refusal
    assert shrink["comment"] == json.loads(refusal.stdout)["error"]
    assert node.fingerprint() == before


def test_more_than_the_free_space_is_refused(node):
    before = node.fingerprint()
    free = os.statvfs(node.root)
    too_big = free.f_bavail * free.f_frsize * 4
    status, local = node.salt_call(
        "state.single", "sparse_volume.present", "name=huge", f"size={too_big}"
    )
    (huge,) = local.values()
    assert status != 0
    assert huge["result"] is False, huge
    refusal = node.cli(
        "apply", "--stdin", "--json", "--dry-run",
        stdin=json.dumps({"name": "huge", "size": too_big}),
    )
    assert refusal.returncode == 1, refusal
    assert huge["comment"] == json.loads(refusal.stdout)["error"]
    # Refused before anything was made: no entry, no file.
    assert node.fingerprint() == before


def test_encrypting_an_existing_volume_is_refused_with_the_cli_message(node):
    before = node.fingerprint()
    status, local = node.salt_call(
        "state.single", "sparse_volume.present", "name=xfs-data", "encrypt=True"
    )
    (state,) = local.values()
    assert status != 0
    assert state["result"] is False, state
    refusal = node.cli(
        "apply", "--stdin", "--json", "--dry-run",
        stdin=json.dumps({"name": "xfs-data", "encrypt": True}),
    )
    assert refusal.returncode == 1, refusal
    assert state["comment"] == json.loads(refusal.stdout)["error"]
    assert "not encrypted (asked to encrypt)" in state["comment"]
    assert node.fingerprint() == before


def test_an_encrypted_volume_is_planned_under_test(node):
    before = node.fingerprint()
    status, local = node.salt_call(
        "state.single", "sparse_volume.present", "name=vault", "size=64M",
        "encrypt=True", "test=True",
    )
    (state,) = local.values()
    assert status == 0, state
    assert state["result"] is None, state
    assert state["changes"]["actions"] == [
        "create an encrypted filesystem (ext4) volume of 64.0 MiB"
    ]
    assert state["changes"]["after"]["encrypted"] is True
    # A plan enrolls no key.
    assert "recovery_key" not in state["changes"]
    assert node.fingerprint() == before


def test_absent_keeps_the_file(node):
    uuid = node.uuids["raw-block"]
    kept = node.fingerprint()[f"var/lib/sparse-volume/{uuid}"]
    status, local = node.salt_call(
        "state.single", "sparse_volume.absent", "name=raw-block"
    )
    (ret,) = local.values()
    assert status == 0 and ret["result"] is True, ret
    assert ret["changes"]["actions"][0].startswith("remove"), ret
    assert not (node.root / f"etc/sparse-volume/volumes.d/{uuid}.toml").exists()
    assert node.fingerprint()[f"var/lib/sparse-volume/{uuid}"] == kept

    # Absent again: nothing to do.
    status, local = node.salt_call(
        "state.single", "sparse_volume.absent", "name=raw-block"
    )
    (ret,) = local.values()
    assert status == 0 and ret["result"] is True and ret["changes"] == {}, ret


def test_absent_with_delete_data(node):
    uuid = node.uuids["xfs-data"]
    status, local = node.salt_call(
        "state.single", "sparse_volume.absent", "name=xfs-data", "delete_data=True"
    )
    (ret,) = local.values()
    assert status == 0 and ret["result"] is True, ret
    assert not node.backing(uuid).exists()
    assert not (node.root / f"etc/sparse-volume/volumes.d/{uuid}.toml").exists()


def test_the_wheel_loads_through_its_entry_point(node):
    """The saltext wheel (SV_SALT_WHEEL, built by run.sh), installed into a
    directory on PYTHONPATH, with a minion whose file root has no modules."""
    site = node.wheel_site()
    empty = node.base / "empty-srv"
    empty.mkdir()
    config_dir = node.minion_config("wheel", empty)
    env = dict(node.env, PYTHONPATH=str(site))

    status, listing = node.salt_call(
        "sparse_volume.list", config_dir=config_dir, env=env
    )
    assert status == 0, listing
    assert [v["name"] for v in listing["volumes"]] == ["ext4-data"]
    status, local = node.salt_call(
        "state.single", "sparse_volume.present", "name=ext4-data", "size=96M",
        config_dir=config_dir, env=env,
    )
    (ret,) = local.values()
    assert status == 0 and ret["result"] is True and ret["changes"] == {}, ret


def test_a_synced_module_wins_over_the_wheel(node):
    """What packaging/salt/README.md says about using both: since Salt
    3006.7 the loader takes a module synced from the file root before the
    same module from an extension's entry point (before 3006.7 the wheel's
    won). A synced copy with one more function shows which was loaded."""
    srv = node.base / "marked-srv"
    (srv / "_modules").mkdir(parents=True)
    marked = EXECUTION_MODULE.read_text() + '\n\ndef which_copy():\n    return "synced"\n'
    (srv / "_modules/sparse_volume.py").write_text(marked)
    config_dir = node.minion_config("marked", srv)
    env = dict(node.env, PYTHONPATH=str(node.wheel_site()))
    status, synced = node.salt_call("saltutil.sync_modules", config_dir=config_dir, env=env)
    assert status == 0 and synced == ["modules.sparse_volume"], synced
    status, which = node.salt_call("sparse_volume.which_copy", config_dir=config_dir, env=env)
    assert status == 0 and which == "synced", which


def test_a_failure_after_a_change_reports_the_change(node):
    late = str(uuid.uuid4())  # known ahead: the lock file is named by it
    lock = node.plant_unusable_lock(late)
    try:
        status, local = node.salt_call(
            "state.single", "sparse_volume.present", "name=late", f"uuid={late}",
            "size=64M", "now=True",
        )
    finally:
        lock.unlink()
    (ret,) = local.values()
    assert status != 0
    assert ret["result"] is False, ret
    assert "owned by uid 65534" in ret["comment"], ret
    # The volume was made before the start failed: Salt counts the change,
    # and says which volume it is.
    assert ret["changes"]["uuid"] == late, ret
    assert [a.split()[0] for a in ret["changes"]["actions"]] == ["create"], ret
    assert (node.root / f"etc/sparse-volume/volumes.d/{late}.toml").is_file()
    assert node.backing(late).stat().st_size == 64 * MIB
    assert node.loop_devices() == []
    node.uuids["late"] = late


def test_the_cli_warnings_are_the_states(node):
    # No systemd here: the CLI writes the flag and warns that nothing was
    # reloaded.
    status, local = node.salt_call(
        "state.single", "sparse_volume.present", "name=late", "enabled=False"
    )
    (ret,) = local.values()
    assert status == 0 and ret["result"] is True, ret
    assert ret["changes"]["actions"] == ["disable"], ret
    assert [w.split(":")[0] for w in ret.get("warnings", [])] == [
        "systemd is not reachable, so nothing was reloaded"
    ], ret


def test_list_returns_registry_files_that_do_not_read(node):
    bad = node.root / "etc/sparse-volume/volumes.d" / f"{uuid.uuid4()}.toml"
    bad.write_text("size = 64M\n")  # a size must be quoted
    try:
        status, listing = node.salt_call("sparse_volume.list")
    finally:
        bad.unlink()
    # `list` exits 1 for it, with its listing complete all the same.
    assert status == 0, listing
    assert sorted(v["name"] for v in listing["volumes"]) == ["ext4-data", "late"]
    assert [(e["file"], e["line"]) for e in listing["errors"]] == [(str(bad), 1)], listing
    assert [w.split(":")[0] for w in listing.get("warnings", [])] == [
        "unit states are unknown"
    ], listing


def test_the_partly_made_volume_goes(node):
    late = node.uuids["late"]
    status, local = node.salt_call(
        "state.single", "sparse_volume.absent", "name=late", "delete_data=True"
    )
    (ret,) = local.values()
    assert status == 0 and ret["result"] is True, ret
    assert ret["changes"]["actions"] == ["remove", "delete-data"], ret
    assert not node.backing(late).exists()


def test_no_loop_device_left(node):
    # Nothing in this run asked for an attach (no `now`).
    assert node.loop_devices() == []
