//! An encrypted volume's LUKS2 header, through `cryptsetup` (the
//! maintained tool; we never write a header ourselves): formatting a
//! backing file with the key file in one keyslot, enrolling the recovery
//! key in another, and reading back which keyslots a header has. The keys
//! themselves never pass a command line: the key file is named by its
//! path, the recovery key goes through a pipe.
//!
//! A block volume's header sits at the start of its partition, inside the
//! backing file; cryptsetup reads and writes headers only at the start of
//! a file or device, so it works on a copy of that area (see
//! [`with_header_at`]).

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use anyhow::{bail, Context, Result};
use uuid::Uuid;

use crate::kernel::child_process::{finish, run, run_with_input, tool_command};
use crate::kernel::files::memory_file;
use crate::volume::id::VolumeId;

/// The keyslot that opens the volume unattended (the key file).
pub const KEY_FILE_SLOT: u32 = 0;
/// The keyslot of the recovery key, printed once by `create`.
pub const RECOVERY_SLOT: u32 = 1;

/// Where the encrypted data starts in the backing file: LUKS2's usual
/// 16 MiB of header and keyslots, set explicitly so that every volume has
/// the same layout whatever cryptsetup's defaults become.
pub const DATA_OFFSET: u64 = 16 << 20;

/// The device-mapper name of an encrypted volume's opened device, made
/// from the volume UUID so that it is found again after any crash.
pub fn mapping_name(id: &VolumeId) -> String {
    format!("sparse-volume-{id}")
}

/// LUKS2's two header copies (binary header and JSON metadata, 16 KiB
/// each as cryptsetup makes them by default), before the keyslot area.
const HEADERS_BYTES: usize = 32 << 10;

/// Bytes of random key in a generated key file.
const KEY_FILE_BYTES: usize = 64;
/// Random bytes behind a recovery key (256 bits, as systemd's).
const RECOVERY_KEY_BYTES: usize = 32;
/// The 16 letters a recovery key is written in ("modhex", which reads the
/// same on most keyboard layouts), four bits each.
const MODHEX: &[u8; 16] = b"cbdefghijklnrtuv";

/// Both secrets are 256 or more random bits: a slow key derivation adds
/// nothing against guessing them and would cost every boot (and every
/// emulated test machine) seconds. systemd-cryptenroll makes the same
/// choice for its TPM2 and FIDO2 keyslots.
const FAST_KDF: [&str; 4] = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// A new random key for a key file.
pub fn new_key() -> Result<Vec<u8>> {
    random_bytes(KEY_FILE_BYTES)
}

/// A new recovery key: 64 modhex letters in eight groups of eight.
pub fn new_recovery_key() -> Result<String> {
    let bytes = random_bytes(RECOVERY_KEY_BYTES)?;
    let letters: Vec<u8> = bytes
        .iter()
        .flat_map(|b| [MODHEX[usize::from(b >> 4)], MODHEX[usize::from(b & 0x0f)]])
        .collect();
    Ok(letters
        .chunks(8)
        .map(|group| String::from_utf8_lossy(group).into_owned())
        .collect::<Vec<_>>()
        .join("-"))
}

fn random_bytes(count: usize) -> Result<Vec<u8>> {
    let mut bytes = vec![0u8; count];
    File::open("/dev/urandom")
        .and_then(|mut source| source.read_exact(&mut bytes))
        .context("reading /dev/urandom")?;
    Ok(bytes)
}

/// Writes a LUKS2 header to `target` (a backing file) whose data segment
/// uses `sector_size`-byte encryption sectors (so the opened device has
/// the volume's sectors, never cryptsetup's guess), with the key file in
/// [`KEY_FILE_SLOT`].
pub fn format(target: &Path, luks_uuid: Uuid, sector_size: u32, key_file: &Path) -> Result<()> {
    tracing::info!(progress = true, "writing the LUKS2 header (cryptsetup)");
    let mut args: Vec<String> = [
        "luksFormat",
        "--batch-mode",
        "--type",
        "luks2",
        "--key-slot",
    ]
    .map(String::from)
    .into();
    args.push(KEY_FILE_SLOT.to_string());
    args.extend(["--uuid".into(), luks_uuid.hyphenated().to_string()]);
    args.extend(["--sector-size".into(), sector_size.to_string()]);
    args.extend([
        "--luks2-metadata-size".into(),
        (HEADERS_BYTES / 2).to_string(),
    ]);
    // cryptsetup counts the offset in 512-byte sectors, whatever the
    // encryption sector size.
    args.extend(["--offset".into(), (DATA_OFFSET / 512).to_string()]);
    args.extend(FAST_KDF.map(String::from));
    args.push("--key-file".into());
    args.push(path_text(key_file)?);
    args.push(path_text(target)?);
    run("cryptsetup", args)
}

/// Adds `recovery_key` to [`RECOVERY_SLOT`] of the header on `target`,
/// unlocking it with the key file.
pub fn enroll_recovery_key(target: &Path, key_file: &Path, recovery_key: &str) -> Result<()> {
    let slot = RECOVERY_SLOT.to_string();
    // `--key-slot` alone names the new keyslot in every cryptsetup 2.x
    // (`--new-key-slot` is a newer spelling, not in older releases).
    let mut args: Vec<String> = ["luksAddKey", "--batch-mode", "--key-slot", &slot]
        .map(String::from)
        .into();
    args.extend(FAST_KDF.map(String::from));
    args.push("--key-file".into());
    args.push(path_text(key_file)?);
    args.push(path_text(target)?);
    // The new passphrase comes on stdin: cryptsetup reads it to the end
    // (there is no newline to strip) when stdin is not a terminal.
    run_with_input("cryptsetup", args, recovery_key.as_bytes())
}

/// Replaces whatever is in [`RECOVERY_SLOT`] with a new `recovery_key`:
/// for a volume whose recovery key was never shown (a create that was
/// interrupted after it enrolled one).
pub fn replace_recovery_key(target: &Path, key_file: &Path, recovery_key: &str) -> Result<()> {
    if keyslots(target)?.contains(&RECOVERY_SLOT) {
        let slot = RECOVERY_SLOT.to_string();
        let key_file = path_text(key_file)?;
        let target = path_text(target)?;
        run(
            "cryptsetup",
            [
                "luksKillSlot",
                "--batch-mode",
                "--key-file",
                &key_file,
                &target,
                &slot,
            ],
        )?;
    }
    enroll_recovery_key(target, key_file, recovery_key)
}

/// The keyslots in use in the header on `target` (a backing file or a
/// device), read by cryptsetup.
pub fn keyslots(target: &Path) -> Result<Vec<u32>> {
    let mut command = tool_command("cryptsetup");
    command
        .args(["luksDump", "--dump-json-metadata"])
        .arg(target);
    let output = command
        .output()
        .with_context(|| format!("running cryptsetup luksDump on {}", target.display()))?;
    if !output.status.success() {
        // The same command again, for its reason in one line.
        let mut again = tool_command("cryptsetup");
        again.args(["luksDump"]).arg(target);
        return Err(finish("cryptsetup", again)?.failure());
    }
    keyslots_in(&output.stdout)
}

fn keyslots_in(metadata: &[u8]) -> Result<Vec<u32>> {
    let parsed: serde_json::Value =
        serde_json::from_slice(metadata).context("reading cryptsetup's LUKS2 metadata")?;
    let Some(slots) = parsed.get("keyslots").and_then(|k| k.as_object()) else {
        bail!("cryptsetup's LUKS2 metadata has no keyslots object");
    };
    let mut numbers: Vec<u32> = slots.keys().filter_map(|k| k.parse().ok()).collect();
    numbers.sort_unstable();
    Ok(numbers)
}

/// Runs `work` on a copy of the LUKS2 header area (the first
/// [`DATA_OFFSET`] bytes) found at `offset` in `file`, then, with
/// `write_back`, writes back what `work` changed in it. The copy lives in
/// memory only (keyslot material must not reach a disk that keeps freed
/// blocks), gone with this process whatever ends it, and is named to
/// cryptsetup through `/proc`. What changed is written back from the end
/// of the area to its start: keyslot material first, the primary header
/// last, so that a crash in between leaves the header as it was or a
/// secondary copy cryptsetup recovers from. Without `write_back` nothing
/// is written, even what cryptsetup repaired in the copy while reading it.
pub fn with_header_at<T>(
    file: &File,
    offset: u64,
    write_back: bool,
    work: impl FnOnce(&Path) -> Result<T>,
) -> Result<T> {
    let area = usize::try_from(DATA_OFFSET).context("the LUKS2 header area")?;
    let mut before = vec![0u8; area];
    file.read_exact_at(&mut before, offset)
        .context("reading the LUKS2 header area of the partition")?;
    let (mut copy, path) = memory_file("sparse-volume-luks2-header")?;
    copy.write_all(&before)
        .context("copying the LUKS2 header area")?;
    // cryptsetup refuses a device with no room for data after the header.
    copy.set_len(DATA_OFFSET + (1 << 20))
        .context("sizing the LUKS2 header copy")?;
    let result = work(&path)?;
    if !write_back {
        return Ok(result);
    }
    let mut after = vec![0u8; area];
    copy.read_exact_at(&mut after, 0)
        .context("reading back the LUKS2 header copy")?;
    write_changed_blocks(file, offset, &before, &after)?;
    Ok(result)
}

/// Writes the 4 KiB blocks of `after` that differ from `before`, last
/// block first; the keyslot area reaches the disk before either header
/// copy (the first [`HEADERS_BYTES`]) is touched, and each header block
/// before the next. Nothing is written when nothing changed.
fn write_changed_blocks(file: &File, offset: u64, before: &[u8], after: &[u8]) -> Result<()> {
    const BLOCK: usize = 4096;
    let mut unsynced = false;
    for (index, (old, new)) in before
        .chunks(BLOCK)
        .zip(after.chunks(BLOCK))
        .enumerate()
        .rev()
    {
        if old == new {
            continue;
        }
        let start = index * BLOCK;
        if start < HEADERS_BYTES && unsynced {
            file.sync_data()
                .context("syncing the LUKS2 header area in the partition")?;
        }
        let at = offset + u64::try_from(start).context("header offset")?;
        file.write_all_at(new, at)
            .context("writing the LUKS2 header into the partition")?;
        unsynced = true;
    }
    if unsynced {
        file.sync_data()
            .context("syncing the LUKS2 header in the partition")?;
    }
    Ok(())
}

fn path_text(path: &Path) -> Result<String> {
    path.to_str()
        .map(str::to_string)
        .with_context(|| format!("{} is not valid UTF-8", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_keys_are_eight_groups_of_modhex() {
        let key = new_recovery_key().unwrap();
        let groups: Vec<&str> = key.split('-').collect();
        assert_eq!(groups.len(), 8, "{key}");
        for group in groups {
            assert_eq!(group.len(), 8, "{key}");
            assert!(group.bytes().all(|b| MODHEX.contains(&b)), "{key}");
        }
        assert_ne!(key, new_recovery_key().unwrap());
    }

    #[test]
    fn reads_the_keyslot_numbers() {
        let metadata = br#"{"keyslots":{"1":{"type":"luks2"},"0":{"type":"luks2"}},"tokens":{}}"#;
        assert_eq!(keyslots_in(metadata).unwrap(), vec![0, 1]);
        assert!(keyslots_in(b"{}").is_err());
    }
}
