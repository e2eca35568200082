"""A simulated fleet: the collection's modules against the real CLI.

Each of SV_FLEET_HOSTS (default 50) inventory hosts is the local machine
(ansible_connection=local) with a registry root of its own
(SPARSE_VOLUME_ROOT, laid out like tests/common/mod.rs Fixture::new) and
no system bus, both passed through the play's `environment:`. The steps
run in order on that one fleet (conftest.py skips the rest after a failure):

converge (4 volumes a host) -> again, no change -> --check --diff of a
change, nothing on disk changes -> the change for real (the CLI's warning
passed on) -> removal keeps or deletes data -> refusals fail with the CLI's
message -> the info module, also with a registry file that does not read ->
a create whose start fails is a failed task that changed something.

Timings: the converge with 10 forks (and 1 fork with SV_FLEET_FORKS_ONE=1),
and the CLI alone applying the same 200 documents one by one.

Environment: SV_BINARY (the sparse-volume binary), SV_ANSIBLE_COLLECTIONS
(a collections path holding sparse_volume.sparse_volume, run.sh installs
the built tarball there). No loop device is attached: only partial.yml asks
for `now`, and its start fails before it binds one.
"""

import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid

import pytest

from conftest import TIMINGS

HERE = pathlib.Path(__file__).resolve().parent
BINARY = os.environ.get("SV_BINARY")
COLLECTIONS = os.environ.get("SV_ANSIBLE_COLLECTIONS")
HOSTS = int(os.environ.get("SV_FLEET_HOSTS", "50"))
FORKS_ONE = os.environ.get("SV_FLEET_FORKS_ONE") == "1"
# The hosts the removal and refusal steps run on (--limit): the whole
# fleet would only repeat the same check.
FEW = 5
NO_BUS = "unix:path=/nonexistent"
MIB = 1 << 20

# A mix per host: two ext4, one xfs (mkfs.xfs wants >= 300 MB), one block.
VOLUMES = [
    {"name": "data", "size": "64M", "mode": "filesystem", "fs_type": "ext4"},
    {"name": "logs", "size": "96M", "mode": "filesystem", "fs_type": "ext4"},
    {"name": "scratch", "size": "320M", "mode": "filesystem", "fs_type": "xfs"},
    {"name": "raw", "size": "128M", "mode": "block"},
]
SIZES = {"data": 64 * MIB, "logs": 96 * MIB, "scratch": 320 * MIB, "raw": 128 * MIB}
GROWN = 192 * MIB
# Deterministic UUIDs per host and volume, as a real inventory would pin them.
UUID_NAMESPACE = uuid.UUID("5b0f2a8e-3c1d-4e7f-9a6b-2d4c8e1f0a3b")

RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)"
                   r"\s+skipped=(\d+)\s+rescued=(\d+)\s+ignored=(\d+)", re.M)

pytestmark = pytest.mark.skipif(
    not (BINARY and COLLECTIONS),
    reason="SV_BINARY and SV_ANSIBLE_COLLECTIONS are not set (tests/ansible/run.sh sets them)")


def host_names():
    return ["h%02d" % i for i in range(1, HOSTS + 1)]


def volume_uuid(host, name):
    return str(uuid.uuid5(UUID_NAMESPACE, host + "/" + name))


def documents(host):
    """The desired state of a host's volumes: the playbook's loop items
    and the CLI-only run's stdin documents alike."""
    return [dict(v, uuid=volume_uuid(host, v["name"])) for v in VOLUMES]


def prepare_root(root):
    """An empty node, as tests/common/mod.rs Fixture::new makes one."""
    shutil.rmtree(root, ignore_errors=True)
    (root / "etc/sparse-volume/volumes.d").mkdir(parents=True)
    (root / "var/lib/sparse-volume").mkdir(parents=True)


class Fleet:
    def __init__(self, base):
        self.base = base
        self.results = base / "results"
        self.results.mkdir()
        self.hosts = host_names()
        self.inventory = base / "inventory.json"
        # The managed nodes' Python: Debian's, as on a real node.
        node_python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        hosts = {}
        for host in self.hosts:
            root = self.root(host)
            prepare_root(root)
            hosts[host] = {
                "sv_root": str(root),
                "sv_environment": {"SPARSE_VOLUME_ROOT": str(root), "DBUS_SYSTEM_BUS_ADDRESS": NO_BUS},
                "sv_volumes": documents(host),
                # partial.yml's volume, made only by that step.
                "sv_late_uuid": volume_uuid(host, "late"),
                # encrypt.yml's volume.
                "sv_vault_uuid": volume_uuid(host, "vault"),
            }
        self.inventory.write_text(json.dumps({"fleet": {
            "hosts": hosts,
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": node_python,
                     "sv_binary": BINARY, "sv_results": str(self.results)},
        }}, indent=1))
        config = base / "ansible.cfg"
        config.write_text("")
        bin_dir = pathlib.Path(sys.executable).parent
        self.playbook_command = [str(bin_dir / "ansible-playbook"), "-i", str(self.inventory)]
        self.env = dict(
            os.environ,
            ANSIBLE_CONFIG=str(config),  # no ansible.cfg of the machine or the user
            ANSIBLE_HOME=str(base / "ansible-home"),
            ANSIBLE_LOCAL_TEMP=str(base / "ansible-tmp"),
            ANSIBLE_REMOTE_TMP=str(base / "ansible-tmp"),
            ANSIBLE_COLLECTIONS_PATH=COLLECTIONS,
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_PIPELINING="1",  # as fleets usually run (one process less per task)
            ANSIBLE_STDOUT_CALLBACK="default",
        )

    def root(self, host):
        return self.base / "hosts" / host

    def reset(self):
        for host in self.hosts:
            prepare_root(self.root(host))

    def playbook(self, name, *args, expect_rc=0):
        """Run a playbook; return (seconds, recap by host, output)."""
        command = self.playbook_command + list(args) + [str(HERE / name)]
        started = time.monotonic()
        run = subprocess.run(command, env=self.env, cwd=self.base, capture_output=True, text=True)
        seconds = time.monotonic() - started
        output = run.stdout + run.stderr
        assert run.returncode == expect_rc, (
            "%s exited %d (expected %d):\n%s" % (" ".join(args + (name,)), run.returncode, expect_rc,
                                                 output[-20000:]))
        recap = {m[0]: dict(zip(("ok", "changed", "unreachable", "failed", "skipped", "rescued",
                                 "ignored"), map(int, m[1:])))
                 for m in RECAP.findall(output)}
        return seconds, recap, output

    def registry(self, host, name):
        """The registry entry (parsed TOML) of a host's volume, or None."""
        path = self.root(host) / "etc/sparse-volume/volumes.d" / (volume_uuid(host, name) + ".toml")
        if not path.exists():
            return None
        return tomllib.loads(path.read_text())

    def backing(self, host, name):
        return self.root(host) / "var/lib/sparse-volume" / volume_uuid(host, name)

    def cli(self, host, document, *args):
        """The CLI alone, as the module runs it."""
        env = dict(os.environ, SPARSE_VOLUME_ROOT=str(self.root(host)), DBUS_SYSTEM_BUS_ADDRESS=NO_BUS)
        return subprocess.run([BINARY, "apply", "--stdin", "--json", *args], input=json.dumps(document),
                              env=env, capture_output=True, text=True)


def assert_recap(recap, hosts, **expected):
    assert sorted(recap) == sorted(hosts), "PLAY RECAP lists %s" % sorted(recap)
    wrong = {h: r for h, r in recap.items()
             if any(r[key] != value for key, value in expected.items())}
    assert not wrong, "expected %s, got %s" % (expected, wrong)


CHUNK = MIB


def content_digest(path):
    """A sha256 that stands for a file's bytes without reading its holes.

    Every 1 MiB chunk that the file system reports as (partly) data is
    read; those holding anything but zeros go into the hash with their
    index. Holes read as zeros, so equal digests mean equal bytes however
    the file system lays out its extents (which writeback may change while
    the bytes stay the same)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        digest.update(b"size %d\n" % size)
        chunks = set()
        offset = 0
        while offset < size:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            chunks.update(range(start // CHUNK, (end - 1) // CHUNK + 1))
            offset = end
        for index in sorted(chunks):
            chunk = os.pread(fd, CHUNK, index * CHUNK)
            if chunk.strip(b"\0"):
                digest.update(b"chunk %d\n" % index)
                digest.update(chunk)
    return digest.hexdigest()


def snapshot(root):
    """Every registry file and backing file of a node: sha256 of the bytes,
    and the times a write would move. (run/ holds only lock files, which a
    dry run may create: it is not compared.)"""
    state = {}
    for top in ("etc", "var"):
        for path in sorted((root / top).rglob("*")):
            st = path.lstat()
            key = str(path.relative_to(root))
            if path.is_dir():
                state[key] = ("dir", st.st_mode)
            elif path.suffix == ".toml":
                state[key] = ("registry", st.st_mode, hashlib.sha256(path.read_bytes()).hexdigest())
            else:
                state[key] = ("backing", st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                              content_digest(path))
    return state


def attached_files():
    """Backing files of the loop devices, as losetup (not our code) sees them."""
    run = subprocess.run(["losetup", "--list", "--noheadings", "--output", "BACK-FILE"],
                         capture_output=True, text=True, check=True)
    return [line.strip() for line in run.stdout.splitlines() if line.strip()]


SECONDS = {}


def timing(label, seconds, volumes):
    SECONDS[label] = seconds
    TIMINGS.append("%-52s %7.1f s  %6.1f ms/volume" % (label, seconds, 1000 * seconds / volumes))


@pytest.fixture(scope="module")
def fleet():
    base = pathlib.Path(tempfile.mkdtemp(prefix="sv-ansible-fleet-"))
    try:
        yield Fleet(base)
        leftover = [f for f in attached_files() if f.startswith(str(base))]
        assert not leftover, "loop devices attached to fleet files: %s" % leftover
    finally:
        shutil.rmtree(base)


def test_converge_forks_one(fleet):
    if not FORKS_ONE:
        pytest.skip("set SV_FLEET_FORKS_ONE=1 to time the converge with 1 fork too")
    seconds, recap, _ = fleet.playbook("converge.yml", "--forks", "1")
    assert_recap(recap, fleet.hosts, changed=1, failed=0)
    timing("converge, ansible-playbook --forks 1", seconds, 4 * HOSTS)
    fleet.reset()  # the next step converges an empty fleet again


def test_converge(fleet):
    seconds, recap, _ = fleet.playbook("converge.yml", "--forks", "10")
    assert_recap(recap, fleet.hosts, changed=1, failed=0)
    timing("converge, ansible-playbook --forks 10", seconds, 4 * HOSTS)
    allocated = 0
    for host in fleet.hosts:
        for volume in VOLUMES:
            entry = fleet.registry(host, volume["name"])
            assert entry is not None, "%s: no registry entry for %s" % (host, volume["name"])
            assert entry["size"] == SIZES[volume["name"]]
            assert entry["mode"] == volume["mode"]
            assert entry.get("fs_type") == volume.get("fs_type")
            st = fleet.backing(host, volume["name"]).stat()
            assert st.st_size == SIZES[volume["name"]]
            # Sparse: mkfs writes metadata (mkfs.xfs its whole log), not the file.
            assert st.st_blocks * 512 < st.st_size, "%s/%s is not sparse" % (host, volume["name"])
            allocated += st.st_blocks * 512
    TIMINGS.append("allocated on disk by %d volumes: %d MiB of %d MiB"
                   % (4 * HOSTS, allocated // MIB, HOSTS * sum(SIZES.values()) // MIB))


def test_converge_again_changes_nothing(fleet):
    seconds, recap, _ = fleet.playbook("converge.yml", "--forks", "10")
    assert_recap(recap, fleet.hosts, changed=0, failed=0)
    timing("converge again (no change), --forks 10", seconds, 4 * HOSTS)


def test_check_diff_changes_nothing_on_disk(fleet):
    # A few hosts: the converge above is the fleet-wide measurement, and
    # each host here only repeats the same check (CI time is precious).
    few = fleet.hosts[:FEW]
    before = {host: snapshot(fleet.root(host)) for host in few}
    _, recap, output = fleet.playbook(
        "change.yml", "--check", "--diff", "--forks", "10", "--limit", ",".join(few))
    assert_recap(recap, few, changed=2, failed=0)
    # The diff callback prints each record as sorted JSON lines.
    assert len(re.findall(r'^\+\s+"size": %d,$' % GROWN, output, re.M)) == FEW, output[-5000:]
    assert len(re.findall(r'^\+\s+"enabled": false,$', output, re.M)) == FEW, output[-5000:]
    for host in few:
        assert snapshot(fleet.root(host)) == before[host], "%s changed in check mode" % host


def test_change_for_real(fleet):
    few = fleet.hosts[:FEW]
    _, recap, output = fleet.playbook("change.yml", "--forks", "10", "--limit", ",".join(few))
    assert_recap(recap, few, changed=2, failed=0)
    # No systemd here: the CLI wrote the flag and warned that nothing was
    # reloaded; the task passes that on (Ansible shows an identical warning
    # once, and wraps long lines).
    said = " ".join(output.split())
    assert "[WARNING]: systemd is not reachable, so nothing was reloaded: enabled = false" in said, \
        output[-5000:]
    for host in few:
        assert fleet.registry(host, "raw")["size"] == GROWN
        assert fleet.backing(host, "raw").stat().st_size == GROWN
        assert fleet.registry(host, "logs")["enabled"] is False
        assert fleet.registry(host, "data")["enabled"] is True
    # Converged: no change again.
    _, recap, _ = fleet.playbook("change.yml", "--limit", ",".join(few))
    assert_recap(recap, few, changed=0, failed=0)


def test_absent_keeps_data_unless_asked(fleet):
    few = fleet.hosts[:FEW]
    _, recap, _ = fleet.playbook("remove.yml", "--limit", ",".join(few))
    assert_recap(recap, few, changed=2, failed=0)
    for host in few:
        assert fleet.registry(host, "data") is None
        assert fleet.backing(host, "data").exists(), "%s: data deleted without delete_data" % host
        assert fleet.registry(host, "scratch") is None
        assert not fleet.backing(host, "scratch").exists(), "%s: delete_data kept the file" % host
    # Absent and unknown is no change.
    _, recap, _ = fleet.playbook("remove.yml", "--limit", ",".join(few))
    assert_recap(recap, few, changed=0, failed=0)


def without_free_space(message):
    """The free space in a message moves with everything else on the disk."""
    return re.sub(r"[\d.]+ [KMGTPE]?i?B free", "<n> free", message)


def test_refusal_is_the_cli_message(fleet):
    few = fleet.hosts[:FEW]
    before = {host: snapshot(fleet.root(host)) for host in few}
    _, recap, _ = fleet.playbook("refuse.yml", "--limit", ",".join(few))
    assert_recap(recap, few, failed=0, ignored=3, changed=1)  # changed: the results file
    for host in few:
        results = json.loads((fleet.results / ("refuse-%s.json" % host)).read_text())
        for key, document in (("shrink", {"name": "raw", "size": "64M"}),
                              ("too_big", {"name": "logs", "size": "100T"}),
                              ("encrypt", {"name": "logs", "encrypt": True})):
            result = results[key]
            cli = fleet.cli(host, document)
            assert cli.returncode == 1, cli
            expected = json.loads(cli.stdout)["error"]
            assert result["failed"] is True and result["rc"] == 1
            assert without_free_space(result["msg"]) == without_free_space(expected)
        assert "shrink" in results["shrink"]["msg"]
        assert "not encrypted (asked to encrypt)" in results["encrypt"]["msg"]
        assert snapshot(fleet.root(host)) == before[host], "%s: a refusal changed something" % host


def test_info_in_check_mode(fleet):
    # The hosts that lost two volumes and as many that kept all four.
    hosts = fleet.hosts[:2 * FEW]
    _, recap, _ = fleet.playbook("info.yml", "--check", "--limit", ",".join(hosts))
    assert_recap(recap, hosts, failed=0)
    few = set(fleet.hosts[:FEW])
    for host in hosts:
        result = json.loads((fleet.results / ("info-%s.json" % host)).read_text())
        assert result["changed"] is False
        names = sorted(v["name"] for v in result["volumes"])
        assert names == (["logs", "raw"] if host in few else ["data", "logs", "raw", "scratch"])
        for volume in result["volumes"]:
            assert volume["uuid"] == volume_uuid(host, volume["name"])
            assert volume["device"] is None, "nothing is attached without `now`"


def test_info_returns_a_registry_file_that_does_not_read(fleet):
    host = fleet.hosts[FEW]  # one that kept its four volumes
    bad = fleet.root(host) / "etc/sparse-volume/volumes.d" / (volume_uuid(host, "bad") + ".toml")
    bad.write_text("size = 64M\n")  # a size must be quoted
    try:
        _, recap, _ = fleet.playbook("info.yml", "--check", "--limit", host)
    finally:
        bad.unlink()
    # `list` exits 1 for it, and its listing is complete all the same.
    assert_recap(recap, [host], failed=0)
    result = json.loads((fleet.results / ("info-%s.json" % host)).read_text())
    assert sorted(v["name"] for v in result["volumes"]) == ["data", "logs", "raw", "scratch"]
    assert [(e["file"], e["line"]) for e in result["errors"]] == [(str(bad), 1)], result["errors"]
    # The CLI's warning (no systemd here) is the task's.
    assert [w.split(":")[0] for w in result.get("warnings", [])] == ["unit states are unknown"], result


def plant_unusable_lock(fleet, host):
    """A lock file of the host's "late" volume owned by nobody: the CLI
    refuses a lock file that another user could hold open, so the attach
    after the create (which takes no lock of the volume's) fails. A real
    partial failure without systemd, found on a real CLI binary."""
    lock = fleet.root(host) / "run/sparse-volume" / (volume_uuid(host, "late") + ".lock")
    lock.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    lock.write_text("")
    os.chown(lock, 65534, 65534)
    return lock


def test_failure_after_a_change_says_so(fleet):
    few = fleet.hosts[:FEW]
    locks = [plant_unusable_lock(fleet, host) for host in few]
    try:
        _, recap, _ = fleet.playbook("partial.yml", "--limit", ",".join(few))
    finally:
        for lock in locks:
            lock.unlink()
    assert_recap(recap, few, failed=0, ignored=1)
    for host in few:
        result = json.loads((fleet.results / ("partial-%s.json" % host)).read_text())
        uuid_late = volume_uuid(host, "late")
        assert result["failed"] is True and result["rc"] == 1, result
        # The volume was made: a change, named by its UUID, with what was done.
        assert result["changed"] is True, result
        assert result["uuid"] == uuid_late, result
        assert [a.split()[0] for a in result["actions"]] == ["create"], result
        assert "owned by uid 65534" in result["msg"], result
        assert fleet.registry(host, "late")["size"] == 64 * MIB
        assert fleet.backing(host, "late").stat().st_size == 64 * MIB
    attached = [f for f in attached_files() if f.startswith(str(fleet.base))]
    assert attached == [], "the failed start attached %s" % attached


def test_encrypted_create_keeps_its_key_out_of_the_output(fleet):
    """`encrypt` through the module, with the task's no_log: the plan says
    encrypted, the volume is made (block mode: its header needs no
    device-mapper), and its recovery key is in the registered result and
    nowhere in the output."""
    host = fleet.hosts[FEW]
    _, recap, output = fleet.playbook("encrypt.yml", "--limit", host)
    assert_recap(recap, [host], failed=0)
    result = json.loads((fleet.results / ("encrypt-%s.json" % host)).read_text())
    plan = result["plan"]
    assert plan["changed"] is True and plan["recovery_key"] is None, plan
    assert plan["actions"] == ["create an encrypted block volume of 64.0 MiB"], plan
    assert plan["after"]["encrypted"] is True, plan
    assert plan["after"]["key_file"] == "/etc/sparse-volume/keys/%s.key" % volume_uuid(host, "vault")
    made = result["made"]
    assert made["changed"] is True, made
    key = made["recovery_key"]
    assert isinstance(key, str) and len(key) == 71, made
    assert key not in output, "no_log let the recovery key into the output"
    assert fleet.registry(host, "vault")["key_file"] == plan["after"]["key_file"]
    assert fleet.backing(host, "vault").exists()


def test_cli_alone(fleet):
    """The same 200 documents through the CLI, one after the other: the
    difference to the playbook runs is Ansible's cost per task."""
    fleet.reset()
    started = time.monotonic()
    for host in fleet.hosts:
        for document in documents(host):
            run = fleet.cli(host, document)
            assert run.returncode == 0 and json.loads(run.stdout)["changed"] is True, run
    timing("converge, the CLI alone (serial apply calls)", time.monotonic() - started, 4 * HOSTS)
    started = time.monotonic()
    for host in fleet.hosts:
        for document in documents(host):
            run = fleet.cli(host, document)
            assert run.returncode == 0 and json.loads(run.stdout)["changed"] is False, run
    timing("converge again (no change), the CLI alone", time.monotonic() - started, 4 * HOSTS)
    cli = SECONDS["converge, the CLI alone (serial apply calls)"]
    for label in ("converge, ansible-playbook --forks 1", "converge, ansible-playbook --forks 10"):
        if label in SECONDS:
            TIMINGS.append("Ansible's cost per task over the CLI, %-13s %6.1f ms"
                           % (label.rsplit(" ", 2)[-2] + " " + label.rsplit(" ", 1)[-1] + ":",
                              1000 * (SECONDS[label] - cli) / (4 * HOSTS)))
