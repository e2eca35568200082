//! Encrypted volumes on the host: real LUKS2 headers made by `cryptsetup`,
//! real key files, real loop devices. This host's kernel has no
//! device-mapper, so nothing here opens a mapping: the VM suite
//! (tests/vm/guest.sh, "encrypted") creates, mounts and reboots them. What
//! is checked here is what must hold before and around an opening: the
//! registry, `list`, `check`, and that a failed attach or create leaves
//! nothing behind.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::{loops_of, new_uuid, tool, Fixture};

const SIZE: u64 = 64 << 20;
/// The recovery key of every test volume: known, so that a test can look
/// for it where it must not be.
const RECOVERY_KEY: &str =
    "cbdefghi-jklnrtuv-cbdefghi-jklnrtuv-cbdefghi-jklnrtuv-cbdefghi-jklnrtuv";

struct Encrypted {
    uuid: String,
    luks_uuid: String,
    file: PathBuf,
    key_file: PathBuf,
}

/// A registered encrypted volume, as `create --encrypt` leaves one: a
/// LUKS2 header with the key file in keyslot 0 and the recovery key in 1.
fn encrypted_volume(fx: &Fixture) -> Encrypted {
    let uuid = new_uuid();
    let luks_uuid = new_uuid();
    let file = fx.backing(&uuid);
    fx.sparse_file_of(&file, SIZE);
    let logical_key = format!("/etc/sparse-volume/keys/{uuid}.key");
    let key_file = fx.host(&logical_key);
    fs::create_dir_all(key_file.parent().unwrap()).unwrap();
    fs::write(&key_file, [0x5a; 64]).unwrap();
    fs::set_permissions(&key_file, fs::Permissions::from_mode(0o400)).unwrap();
    let (key, target) = (key_file.to_str().unwrap(), file.to_str().unwrap());
    let fast = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
    let mut format = vec!["luksFormat", "--batch-mode", "--type", "luks2"];
    format.extend(["--uuid", &luks_uuid, "--key-file", key, target]);
    format.extend(fast);
    tool("cryptsetup", &format);
    add_recovery_key(&file, &key_file);
    fx.register(
        &uuid,
        "filesystem",
        &format!("luks_uuid = \"{luks_uuid}\"\nkey_file = \"{logical_key}\"\n"),
    );
    Encrypted {
        uuid,
        luks_uuid,
        file,
        key_file,
    }
}

fn add_recovery_key(file: &Path, key_file: &Path) {
    use std::io::Write;
    let mut child = std::process::Command::new("cryptsetup")
        .args(["luksAddKey", "--batch-mode", "--key-slot", "1"])
        .args(["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"])
        .arg("--key-file")
        .arg(key_file)
        .arg(file)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("cryptsetup");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(RECOVERY_KEY.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "luksAddKey");
}

fn kinds(check: &serde_json::Value) -> Vec<String> {
    check["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| f["kind"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Whether this kernel can make device-mapper devices at all.
fn has_device_mapper() -> bool {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/mapper/control")
        .is_ok()
}

#[test]
fn an_encrypted_volume_is_listed_with_its_header_and_key_and_checks_clean() {
    needs_root!();
    let fx = Fixture::new();
    let volume = encrypted_volume(&fx);
    let listed = fx.run_ok(&["list", "--json"]).json();
    let row = &listed["volumes"][0];
    assert_eq!(row["uuid"], volume.uuid.as_str());
    assert_eq!(row["encryption"]["luks_uuid"], volume.luks_uuid.as_str());
    assert_eq!(row["encryption"]["unlock"], "key-file");
    assert_eq!(
        row["encryption"]["key_file"],
        format!("/etc/sparse-volume/keys/{}.key", volume.uuid).as_str()
    );
    assert!(row["encryption"]["opened"].is_null(), "{row}");
    // The header is the volume's content: no mismatch, no key finding.
    let check = fx.run(&["check", "--json"]).json();
    let found = kinds(&check);
    for kind in [
        "content-mismatch",
        "key-file-missing",
        "key-file-exposed",
        "keyslot-missing",
        "unreadable-luks-header",
    ] {
        assert!(!found.contains(&kind.to_string()), "{kind}: {check}");
    }
    assert!(found.contains(&"not-attached".to_string()), "{check}");
    let metrics = fx.run_ok(&["metrics"]).stdout;
    let sample = metrics
        .lines()
        .find(|l| l.starts_with("sparse_volume_encrypted{") && l.contains(&volume.uuid));
    assert!(sample.is_some_and(|l| l.ends_with(" 1")), "{metrics}");
    let status = fx.run_ok(&["status", &volume.uuid]).stdout;
    assert!(
        status.contains(&format!(
            "encrypted; header {}, unlocked by key file",
            volume.luks_uuid
        )),
        "{status}"
    );
    // A volume that is not encrypted says so with null.
    let plain = new_uuid();
    fx.make_ext4(&plain);
    fx.register(&plain, "filesystem", "");
    let listed = fx.run_ok(&["list", "--json"]).json();
    let rows = listed["volumes"].as_array().unwrap();
    let plain_row = rows.iter().find(|r| r["uuid"] == plain.as_str()).unwrap();
    assert!(plain_row["encryption"].is_null(), "{plain_row}");
}

#[test]
fn check_names_a_missing_or_exposed_key_file_and_a_missing_keyslot() {
    needs_root!();
    let fx = Fixture::new();
    let volume = encrypted_volume(&fx);
    fs::set_permissions(&volume.key_file, fs::Permissions::from_mode(0o644)).unwrap();
    let check = fx.run(&["check", "--json"]);
    assert_eq!(check.code, 1, "{}", check.stdout);
    assert!(kinds(&check.json()).contains(&"key-file-exposed".to_string()));

    let (key, file) = (
        volume.key_file.to_str().unwrap(),
        volume.file.to_str().unwrap(),
    );
    tool(
        "cryptsetup",
        &["luksKillSlot", "--batch-mode", "--key-file", key, file, "1"],
    );
    fs::remove_file(&volume.key_file).unwrap();
    let check = fx.run(&["check", "--json"]).json();
    let found = kinds(&check);
    assert!(found.contains(&"key-file-missing".to_string()), "{check}");
    assert!(found.contains(&"keyslot-missing".to_string()), "{check}");
    let text = check.to_string();
    assert!(text.contains("keyslot 1 (the recovery key's)"), "{text}");
    // Nothing is repaired: a key is never made up.
    let repaired = fx.run(&["check", "--repair", "--json"]).json();
    assert!(kinds(&repaired).contains(&"key-file-missing".to_string()));
    assert!(!volume.key_file.exists());
}

#[test]
fn attach_without_the_key_file_fails_in_one_line_and_binds_nothing() {
    needs_root!();
    let fx = Fixture::new();
    let volume = encrypted_volume(&fx);
    fs::remove_file(&volume.key_file).unwrap();
    let attach = fx.run(&["attach", &volume.uuid]);
    assert_ne!(attach.code, 0, "{}", attach.stdout);
    let said = attach.stderr.trim();
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(said.contains(&volume.uuid), "{said}");
    assert!(said.contains("is missing"), "{said}");
    assert!(said.contains("recovery key"), "{said}");
    assert!(loops_of(&volume.file).is_empty(), "{said}");
    assert!(!said.contains(RECOVERY_KEY));
}

#[test]
fn attach_refuses_a_header_that_is_not_the_volumes() {
    needs_root!();
    let fx = Fixture::new();
    let volume = encrypted_volume(&fx);
    let registry = fx.registry_file(&volume.uuid);
    let other = new_uuid();
    let text = fs::read_to_string(&registry)
        .unwrap()
        .replace(&volume.luks_uuid, &other);
    fs::write(&registry, text).unwrap();
    let attach = fx.run(&["attach", &volume.uuid]);
    assert_ne!(attach.code, 0);
    assert!(
        attach.stderr.contains(&format!(
            "holds a LUKS2 header with UUID {}, not a LUKS2 header with UUID {other}",
            volume.luks_uuid
        )),
        "{}",
        attach.stderr
    );
    assert!(loops_of(&volume.file).is_empty());
}

#[test]
fn the_registry_refuses_a_header_uuid_equal_to_the_volumes_and_half_an_encryption() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.make_ext4(&uuid);
    for (extra, said) in [
        (
            format!("luks_uuid = \"{uuid}\"\nkey_file = \"/etc/sparse-volume/keys/k\"\n"),
            "luks_uuid must differ from the volume's uuid",
        ),
        (
            "key_file = \"/etc/sparse-volume/keys/k\"\n".to_string(),
            "key_file needs luks_uuid",
        ),
        (
            format!("luks_uuid = \"{}\"\n", new_uuid()),
            "luks_uuid needs key_file",
        ),
        (
            format!("luks_uuid = \"{}\"\nkey_file = \"keys/k\"\n", new_uuid()),
            "must be a normalised absolute path",
        ),
    ] {
        fx.register(&uuid, "filesystem", &extra);
        let check = fx.run(&["check", "--json"]);
        assert!(
            check.stdout.contains("invalid-registry-file"),
            "{extra}: {}",
            check.stdout
        );
        assert!(check.stdout.contains(said), "{extra}: {}", check.stdout);
    }
}

#[test]
fn create_encrypt_makes_the_volume_or_leaves_nothing() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let create = fx.run(&[
        "create",
        "--size",
        "64M",
        "--encrypt",
        "--uuid",
        &uuid,
        "--json",
    ]);
    let key_file = fx.host(&format!("/etc/sparse-volume/keys/{uuid}.key"));
    if has_device_mapper() {
        assert_eq!(create.code, 0, "{}", create.stderr);
        let made = create.json();
        assert_eq!(
            made["key_file"],
            format!("/etc/sparse-volume/keys/{uuid}.key").as_str()
        );
        assert_ne!(made["luks_uuid"], uuid.as_str());
        assert_eq!(made["recovery_key"].as_str().map(str::len), Some(71));
        let mode = fs::metadata(&key_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o400);
    } else {
        assert_eq!(create.code, 1, "{}", create.stdout);
        assert!(
            create
                .stderr
                .contains("this kernel offers no device-mapper"),
            "{}",
            create.stderr
        );
        assert!(!fx.backing(&uuid).exists());
        assert!(!key_file.exists(), "the key it made is removed again");
        assert!(!fx.registry_file(&uuid).exists());
        let leftovers: Vec<_> = fs::read_dir(fx.host("/var/lib/sparse-volume"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}

#[test]
fn create_refuses_a_key_file_others_can_read_before_making_anything() {
    needs_root!();
    let fx = Fixture::new();
    let key = fx.host("/root/volume.key");
    fs::create_dir_all(key.parent().unwrap()).unwrap();
    fs::write(&key, [7u8; 64]).unwrap();
    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
    let uuid = new_uuid();
    for dry_run in [true, false] {
        let mut args = vec!["create", "--size", "64M", "--encrypt", "--uuid", &uuid];
        args.extend(["--key-file", "/root/volume.key"]);
        if dry_run {
            args.push("--dry-run");
        }
        let create = fx.run(&args);
        assert_eq!(create.code, 1, "{}", create.stdout);
        assert!(
            create
                .stderr
                .contains("must belong to root and be readable by nobody else"),
            "{}",
            create.stderr
        );
        assert!(!fx.backing(&uuid).exists());
    }
    let plain = fx.run(&["create", "--size", "64M", "--key-file", "/root/volume.key"]);
    assert_eq!(
        plain.code, 2,
        "--key-file needs --encrypt: {}",
        plain.stderr
    );
}

#[test]
fn attach_without_device_mapper_releases_the_loop_device_it_bound() {
    needs_root!();
    if has_device_mapper() {
        eprintln!("skipped: this kernel has device-mapper (the VM suite opens volumes)");
        return;
    }
    let fx = Fixture::new();
    let volume = encrypted_volume(&fx);
    let attach = fx.run(&["attach", &volume.uuid]);
    assert_ne!(attach.code, 0);
    assert!(
        attach
            .stderr
            .contains("this kernel offers no device-mapper"),
        "{}",
        attach.stderr
    );
    assert!(
        attach.stderr.contains("detached /dev/loop"),
        "{}",
        attach.stderr
    );
    assert!(loops_of(&volume.file).is_empty(), "{}", attach.stderr);
}

#[test]
fn remove_delete_data_takes_the_key_file_create_made_and_keeps_an_operators() {
    needs_root!();
    let fx = Fixture::new();
    let ours = encrypted_volume(&fx);
    let kept = fx.run_ok(&["remove", &ours.uuid]);
    assert!(!kept.stdout.is_empty());
    assert!(
        ours.file.exists() && ours.key_file.exists(),
        "remove keeps data and key"
    );

    let again = encrypted_volume(&fx);
    fx.run_ok(&["remove", &again.uuid, "--delete-data"]);
    assert!(!again.file.exists());
    assert!(
        !again.key_file.exists(),
        "the key of deleted data is deleted too"
    );

    // A key file of the operator's is never ours to delete.
    let theirs = encrypted_volume(&fx);
    let operators = fx.host("/root/operator.key");
    fs::create_dir_all(operators.parent().unwrap()).unwrap();
    fs::rename(&theirs.key_file, &operators).unwrap();
    let registry = fx.registry_file(&theirs.uuid);
    let text = fs::read_to_string(&registry).unwrap().replace(
        &format!("/etc/sparse-volume/keys/{}.key", theirs.uuid),
        "/root/operator.key",
    );
    fs::write(&registry, text).unwrap();
    fx.run_ok(&["remove", &theirs.uuid, "--delete-data"]);
    assert!(!theirs.file.exists());
    assert!(operators.exists());
}

#[test]
fn resize_of_a_detached_encrypted_volume_is_refused_before_anything_grows() {
    needs_root!();
    let fx = Fixture::new();
    let volume = encrypted_volume(&fx);
    for dry_run in [true, false] {
        let mut args = vec!["resize", volume.uuid.as_str(), "--size", "128M"];
        if dry_run {
            args.push("--dry-run");
        }
        let resize = fx.run(&args);
        assert_eq!(resize.code, 1, "{}", resize.stdout);
        assert!(
            resize.stderr.contains("grows only while attached"),
            "{}",
            resize.stderr
        );
        assert_eq!(fs::metadata(&volume.file).unwrap().len(), SIZE);
    }
    // Clones and exports of encrypted volumes are not built yet: refused.
    let clone = fx.run(&["clone", &volume.uuid, "--name", "copy"]);
    assert!(clone.stderr.contains("is encrypted"), "{}", clone.stderr);
    let export = fx.run(&["export", &volume.uuid, "--output", "/dev/null"]);
    assert!(export.stderr.contains("is encrypted"), "{}", export.stderr);
}

/// Where partition 1 starts in a GPT written for `sector_size`-byte
/// sectors, read here from the UEFI layout itself (not with the code under
/// test): the header at LBA 1 names the LBA of the entry array, whose
/// first entry's starting LBA is at byte 32.
fn partition_start(file: &Path, sector_size: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    let file = fs::File::open(file).unwrap();
    let mut header = [0u8; 92];
    file.read_exact_at(&mut header, sector_size).unwrap();
    assert_eq!(
        &header[..8],
        b"EFI PART",
        "no GPT for {sector_size}-byte sectors"
    );
    let entries_lba = u64::from_le_bytes(header[72..80].try_into().unwrap());
    let mut first_lba = [0u8; 8];
    file.read_exact_at(&mut first_lba, entries_lba * sector_size + 32)
        .unwrap();
    u64::from_le_bytes(first_lba) * sector_size
}

/// A loop device over partition 1 alone (this kernel makes no partition
/// devices), for cryptsetup to read the header there; the caller detaches.
fn partition_device(file: &Path, sector_size: u64) -> String {
    let offset = partition_start(file, sector_size).to_string();
    tool(
        "losetup",
        &[
            "--find",
            "--show",
            "--offset",
            &offset,
            file.to_str().unwrap(),
        ],
    )
    .trim()
    .to_string()
}

#[test]
fn an_encrypted_block_volume_has_its_header_inside_its_partition() {
    needs_root!();
    for sector_size in ["512", "4096"] {
        encrypted_block_volume_of_sectors(sector_size);
    }
}

fn encrypted_block_volume_of_sectors(sector_size: &str) {
    let fx = Fixture::new();
    let uuid = new_uuid();
    // Block mode makes its header without device-mapper: this runs here.
    let create = fx.run(&[
        "create",
        "--size",
        "64M",
        "--mode",
        "block",
        "--sector-size",
        sector_size,
        "--encrypt",
        "--uuid",
        &uuid,
        "--json",
    ]);
    assert_eq!(create.code, 0, "{}", create.stderr);
    let made = create.json();
    let luks_uuid = made["luks_uuid"].as_str().expect("luks_uuid").to_string();
    assert_ne!(luks_uuid, uuid);
    let recovery_key = made["recovery_key"]
        .as_str()
        .expect("recovery_key")
        .to_string();
    let file = fx.backing(&uuid);
    let key_file = fx.host(&format!("/etc/sparse-volume/keys/{uuid}.key"));

    let device = partition_device(&file, sector_size.parse().unwrap());
    let seen_uuid = tool("cryptsetup", &["luksUUID", &device]);
    let dump = tool("cryptsetup", &["luksDump", &device]);
    let opens_with_key_file = key_file_opens(&device, &key_file);
    let opens_with_recovery_key = opens_with(&device, &recovery_key);
    // The recovery keyslot goes: `check` must see it through its own copy.
    tool(
        "cryptsetup",
        &[
            "luksKillSlot",
            "--batch-mode",
            "--key-file",
            key_file.to_str().unwrap(),
            &device,
            "1",
        ],
    );
    tool("losetup", &["--detach", &device]);
    assert_eq!(seen_uuid.trim(), luks_uuid);
    assert!(
        dump.contains("Data segments:") && dump.contains("offset: 16777216 [bytes]"),
        "{dump}"
    );
    assert!(opens_with_key_file, "the key file opens it");
    assert!(opens_with_recovery_key, "the recovery key opens it");

    let check = fx.run(&["check", "--json"]);
    assert_eq!(
        kinds(&check.json()),
        vec!["keyslot-missing", "not-attached"],
        "{}",
        check.stdout
    );

    let pv = fx.run(&["pv", &uuid, "--json"]);
    assert_eq!(pv.code, 0, "{}", pv.stderr);
    let pv = pv.json();
    assert_eq!(pv["spec"]["volumeMode"], "Block");
    assert_eq!(
        pv["spec"]["local"]["path"],
        format!("/dev/mapper/sparse-volume-{uuid}").as_str()
    );

    // Detached, it grows like a plain block volume (its mapping takes the
    // partition's size when next opened); the header stays readable.
    let resize = fx.run(&["resize", &uuid, "--size", "96M"]);
    assert_eq!(resize.code, 0, "{}", resize.stderr);
    let check = fx.run(&["check", "--json"]);
    assert_eq!(
        kinds(&check.json()),
        vec!["keyslot-missing", "not-attached"],
        "{}",
        check.stdout
    );

    // This kernel makes no partitions: attach says so and binds nothing.
    let attach = fx.run(&["attach", &uuid]);
    assert_eq!(attach.code, 1, "{}", attach.stdout);
    assert!(
        attach.stderr.contains("made no partition device")
            || attach.stderr.contains("offers no device-mapper"),
        "{}",
        attach.stderr
    );
    assert_eq!(loops_of(&file), Vec::<String>::new());
    assert!(!fx.run(&["list", "--json"]).stdout.contains(&recovery_key));

    // Its registry file lost: adopted as a plain block volume, its
    // partition (ciphertext) would go to a consumer raw. Refused.
    assert_eq!(fx.run(&["remove", &uuid]).code, 0);
    let path = format!("/var/lib/sparse-volume/{uuid}");
    let register = fx.run(&["register", "--uuid", &uuid, "--path", &path]);
    assert_eq!(register.code, 1, "{}", register.stdout);
    assert!(
        register.stderr.contains("holds a LUKS2 header"),
        "{}",
        register.stderr
    );
    assert!(!fx.registry_file(&uuid).exists());
}

/// Whether the key in `key_file` opens the header on `device`.
fn key_file_opens(device: &str, key_file: &Path) -> bool {
    std::process::Command::new("cryptsetup")
        .args(["open", "--test-passphrase", "--key-file"])
        .arg(key_file)
        .arg(device)
        .status()
        .expect("cryptsetup")
        .success()
}

/// Whether `key` (on stdin) opens the header on `device`.
fn opens_with(device: &str, key: &str) -> bool {
    use std::io::Write;
    let mut child = std::process::Command::new("cryptsetup")
        .args(["open", "--test-passphrase", "--key-file", "-", device])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("cryptsetup");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(key.as_bytes()).unwrap();
    drop(stdin);
    child.wait().unwrap().success()
}

/// A create of an encrypted block volume killed after the file was made
/// whole, then repeated: the repeat completes it and shows a recovery key
/// that opens the header in the partition (rewritten there in place when
/// the volume was registered already), and `check` finds it whole.
#[test]
fn a_killed_encrypted_block_create_is_completed_with_a_recovery_key_that_opens_it() {
    use sparse_volume::hooks::CRASH_ENV;
    use std::os::unix::process::ExitStatusExt;
    needs_root!();
    for point in ["create:before-registry", "create:before-unmark"] {
        let fx = Fixture::new();
        let uuid = new_uuid();
        let args = [
            "create",
            "--size",
            "64M",
            "--mode",
            "block",
            "--sector-size",
            "512",
            "--encrypt",
            "--uuid",
            &uuid,
            "--json",
        ];
        let status = fx
            .command(&args)
            .env("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent")
            .env(CRASH_ENV, point)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("running sparse-volume");
        assert_eq!(status.signal(), Some(9), "{point}: not killed there");
        let again = fx.run(&args);
        assert_eq!(again.code, 0, "{point}: {}", again.stderr);
        let recovery_key = again.json()["recovery_key"]
            .as_str()
            .unwrap_or_else(|| panic!("{point}: no recovery key: {}", again.stdout))
            .to_string();
        let device = partition_device(&fx.backing(&uuid), 512);
        let opens = opens_with(&device, &recovery_key);
        let key_file = fx.host(&format!("/etc/sparse-volume/keys/{uuid}.key"));
        let key_file_opens = key_file_opens(&device, &key_file);
        let slots = tool("cryptsetup", &["luksDump", &device]);
        tool("losetup", &["--detach", &device]);
        assert!(opens, "{point}: the recovery key shown does not open it");
        assert!(key_file_opens, "{point}: the key file no longer opens it");
        assert!(
            slots.contains("  0: luks2") && slots.contains("  1: luks2"),
            "{point}: {slots}"
        );
        let check = fx.run(&["check", "--json"]);
        assert_eq!(
            kinds(&check.json()),
            vec!["not-attached"],
            "{point}: {}",
            check.stdout
        );
    }
}
