//! The file system under the sparse files runs out of space while a
//! consumer writes into a volume (an allowed overcommit that came due).
//!
//! A real 96 MiB ext4 is the storage root; a 256 MiB volume lives on it
//! (overcommit_ratio = 4). The consumer writes data A and syncs it, another
//! process fills the storage root, the consumer writes more. What the
//! consumer sees is printed (errno of write and fsync, kernel messages,
//! read-only remount); what must hold is asserted: data synced before is
//! intact afterwards, and `check`, `list` and `status` report the file
//! system as short.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{new_uuid, tool, Fixture};

const STORAGE_ROOT: &str = "/srv/small";
const STORAGE_BYTES: u64 = 96 << 20;
const VOLUME_SIZE: &str = "256M";
const DATA_A_BYTES: usize = 8 << 20;
/// More than the storage root can ever hold.
const DATA_B_BYTES: usize = 128 << 20;
const CHUNK: usize = 1 << 20;

/// The storage root on its own small ext4, the volume attached and
/// mounted; everything undone in reverse order on drop.
struct Setup {
    fx: Fixture,
    uuid: String,
    device: String,
    mount: PathBuf,
}

impl Setup {
    fn new() -> Self {
        let fx = Fixture::new();
        let image = fx.host("/storage.ext4");
        File::create(&image)
            .unwrap()
            .set_len(STORAGE_BYTES)
            .unwrap();
        // No blocks reserved for root: the loop driver writes with kernel
        // credentials and could use them, which would blur the numbers.
        tool(
            "mkfs.ext4",
            &["-q", "-F", "-m", "0", image.to_str().unwrap()],
        );
        let storage = fx.host(STORAGE_ROOT);
        fs::create_dir_all(&storage).unwrap();
        tool(
            "mount",
            &[
                "-o",
                "loop",
                image.to_str().unwrap(),
                storage.to_str().unwrap(),
            ],
        );
        fs::write(
            fx.host("/etc/sparse-volume/config.toml"),
            format!("storage_roots = [\"{STORAGE_ROOT}\"]\novercommit_ratio = 4.0\n"),
        )
        .unwrap();
        let mut setup = Self {
            fx,
            uuid: new_uuid(),
            device: String::new(),
            mount: PathBuf::new(),
        };
        let uuid = setup.uuid.clone();
        setup
            .fx
            .run_ok(&["create", "--size", VOLUME_SIZE, "--uuid", &uuid]);
        let attached = setup.fx.run_ok(&["attach", &uuid, "--json"]);
        setup.device = attached.json()["device"].as_str().unwrap().to_string();
        setup.mount = setup.fx.host("/mnt/volume");
        fs::create_dir_all(&setup.mount).unwrap();
        setup.mount_volume();
        setup
    }

    fn storage(&self) -> PathBuf {
        self.fx.host(STORAGE_ROOT)
    }

    fn backing(&self) -> PathBuf {
        self.storage().join(&self.uuid)
    }

    /// `noinit_itable`: no background inode-table zeroing, so every
    /// write to the backing file is the consumer's.
    fn mount_volume(&self) {
        tool(
            "mount",
            &[
                "-o",
                "noinit_itable",
                &self.device,
                self.mount.to_str().unwrap(),
            ],
        );
    }

    fn free(&self) -> u64 {
        let stats = nix::sys::statvfs::statvfs(&self.storage()).unwrap();
        stats.blocks_available() * stats.fragment_size()
    }

    fn allocated(&self) -> u64 {
        std::os::unix::fs::MetadataExt::blocks(&fs::metadata(self.backing()).unwrap()) * 512
    }

    /// The volume's mount options as the kernel shows them.
    fn mount_options(&self) -> Option<String> {
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
        let target = self.mount.to_str().unwrap();
        mounts.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            (fields.get(1) == Some(&target)).then(|| fields[3].to_string())
        })
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).output();
        let _ = self.fx.run(&["detach", &self.uuid]);
        let _ = Command::new("umount").arg(self.storage()).output();
    }
}

/// Kernel messages from now on (root can read `/dev/kmsg`; without it the
/// test still runs and says so).
struct KernelLog(Option<File>);

impl KernelLog {
    fn from_now() -> Self {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/kmsg")
            .ok()
            .and_then(|mut f| f.seek(SeekFrom::End(0)).ok().map(|_| f));
        Self(file)
    }

    /// New messages that mention `device` (other tests run at the same time).
    fn about(&mut self, device: &str) -> Option<Vec<String>> {
        let file = self.0.as_mut()?;
        let name = device.trim_start_matches("/dev/");
        let mut lines = Vec::new();
        let mut record = [0u8; 8192];
        loop {
            match file.read(&mut record) {
                Ok(0) => break,
                Ok(n) => {
                    let text = String::from_utf8_lossy(&record[..n]);
                    let message = text
                        .split_once(';')
                        .map_or(text.as_ref(), |(_, m)| m)
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    // `loop12` must not match `loop1`.
                    if message.match_indices(name).any(|(i, _)| {
                        !message[i + name.len()..].starts_with(|c: char| c.is_ascii_digit())
                    }) {
                        lines.push(message);
                    }
                }
                // EPIPE: records were overwritten meanwhile; read on.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(_) => break,
            }
        }
        Some(lines)
    }
}

/// Deterministic bytes, different per chunk.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 56) as u8
        })
        .collect()
}

/// Chunks of the consumer's second file that read back as written, as
/// zeros (lost), or as anything else.
fn compare_chunks(path: &Path) -> (usize, usize, usize) {
    let Ok(mut file) = File::open(path) else {
        return (0, 0, 0);
    };
    let (mut intact, mut zeros, mut other) = (0, 0, 0);
    let mut chunk = vec![0u8; CHUNK];
    for index in 0..DATA_B_BYTES / CHUNK {
        if file.read_exact(&mut chunk).is_err() {
            break;
        }
        if chunk == pattern(1000 + index as u64, CHUNK) {
            intact += 1;
        } else if chunk.iter().all(|&b| b == 0) {
            zeros += 1;
        } else {
            other += 1;
        }
    }
    (intact, zeros, other)
}

fn sha256(path: &Path) -> String {
    tool("sha256sum", &[path.to_str().unwrap()])
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

fn errno_name(error: &std::io::Error) -> String {
    match error.raw_os_error() {
        Some(code) => format!("{} ({error})", nix::errno::Errno::from_raw(code)),
        None => error.to_string(),
    }
}

/// Fills the storage root with one file until ENOSPC; returns its size.
fn fill(path: &Path) -> u64 {
    let mut filler = File::create(path).unwrap();
    let mut written = 0u64;
    for chunk in [CHUNK, 4096] {
        let block = vec![0x5au8; chunk];
        loop {
            match filler.write(&block) {
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
    }
    // Delayed allocation may only fail here; what was accepted counts.
    let _ = filler.sync_all();
    written
}

/// What a consumer inside the volume saw while the storage root was full.
#[derive(Debug, Default)]
struct ConsumerView {
    writes_ok: usize,
    bytes_accepted: usize,
    write_error: Option<String>,
    fsync_error: Option<String>,
    new_file_error: Option<String>,
}

fn consume(dir: &Path) -> ConsumerView {
    let mut view = ConsumerView::default();
    match File::create(dir.join("b.bin")) {
        Ok(mut file) => {
            for index in 0..DATA_B_BYTES / CHUNK {
                match file.write_all(&pattern(1000 + index as u64, CHUNK)) {
                    Ok(()) => {
                        view.writes_ok += 1;
                        view.bytes_accepted += CHUNK;
                    }
                    Err(e) => {
                        view.write_error = Some(errno_name(&e));
                        break;
                    }
                }
            }
            view.fsync_error = file.sync_all().err().map(|e| errno_name(&e));
        }
        Err(e) => view.write_error = Some(format!("creating b.bin: {}", errno_name(&e))),
    }
    // After the error: can the consumer still make a file at all?
    view.new_file_error = File::create(dir.join("c.bin"))
        .and_then(|mut f| {
            f.write_all(&pattern(7, 4096))?;
            f.sync_all()
        })
        .err()
        .map(|e| errno_name(&e));
    view
}

#[test]
fn a_full_backing_file_system_keeps_synced_data_and_is_reported() {
    needs_root!();
    let setup = Setup::new();
    let allocated_after_create = setup.allocated();
    println!(
        "storage root: {} bytes free before data; volume {VOLUME_SIZE}, backing file allocates {allocated_after_create} bytes after mkfs",
        setup.free()
    );

    // Data A: written, fsynced, and the whole file system synced.
    let data_a = setup.mount.join("a.bin");
    {
        let mut file = File::create(&data_a).unwrap();
        for index in 0..DATA_A_BYTES / CHUNK {
            file.write_all(&pattern(index as u64, CHUNK)).unwrap();
        }
        file.sync_all().unwrap();
    }
    tool("sync", &["-f", data_a.to_str().unwrap()]);
    let checksum_a = sha256(&data_a);

    let mut kernel = KernelLog::from_now();
    let filler = setup.storage().join(".filler");
    let filled = fill(&filler);
    let free_when_full = setup.free();
    println!("filler: {filled} bytes written until ENOSPC; storage root now has {free_when_full} bytes free");

    let allocated_before = setup.allocated();
    let view = consume(&setup.mount);
    let allocated_after = setup.allocated();
    let options = setup.mount_options();
    let messages = kernel.about(&setup.device);
    println!("consumer: {view:#?}");
    println!(
        "backing file allocation: {allocated_before} -> {allocated_after} bytes while the consumer wrote"
    );
    println!("volume mount options afterwards: {options:?}");
    match &messages {
        Some(lines) => {
            println!("kernel: {} messages about {}", lines.len(), setup.device);
            for kind in [
                "critical space allocation error",
                "Buffer I/O error",
                "EXT4-fs",
                "remount",
                "Journal",
            ] {
                let count = lines.iter().filter(|l| l.contains(kind)).count();
                println!("  {count} x {kind:?}");
            }
            for line in lines.iter().filter(|l| !l.starts_with("critical")).take(8) {
                println!("  {line}");
            }
        }
        None => println!("kernel: /dev/kmsg not readable"),
    }
    // The consumer must learn about the loss at the latest on fsync:
    // a full backing file system never looks like a successful write.
    assert!(
        view.write_error.is_some() || view.fsync_error.is_some(),
        "the consumer was told nothing: {view:?}"
    );

    // While it is full: the audit and the listings say so, with numbers.
    let check = setup.fx.run(&["check", "--json"]);
    println!("check while full: {}", check.stdout);
    let findings = check.json()["findings"].as_array().unwrap().to_vec();
    let overcommitted: Vec<_> = findings
        .iter()
        .filter(|f| f["kind"] == "overcommitted")
        .collect();
    assert_eq!(overcommitted.len(), 1, "{}", check.stdout);
    let finding = overcommitted[0];
    assert_eq!(finding["severity"], "error");
    assert!(finding["uuids"]
        .as_array()
        .unwrap()
        .iter()
        .any(|u| u == setup.uuid.as_str()));
    let numbers = &finding["backing_fs"];
    assert!(numbers["free"].as_u64().unwrap() < numbers["committed_growth"].as_u64().unwrap());
    assert_eq!(numbers["short"], true);
    assert_eq!(check.code, 1);

    let list = setup.fx.run(&["list", "--json"]);
    let listed = &list.json()["volumes"][0];
    assert_eq!(listed["backing_fs"]["short"], true, "{}", list.stdout);
    let human = setup.fx.run(&["list"]);
    assert!(
        human
            .stdout
            .lines()
            .any(|l| l.starts_with(&setup.uuid[..8]) && l.contains(" !")),
        "no marker: {}",
        human.stdout
    );
    let status = setup.fx.run(&["status", &setup.uuid]);
    assert!(
        status.stdout.contains("more than is free"),
        "{}",
        status.stdout
    );

    // Space back: the volume takes writes again without intervention.
    fs::remove_file(&filler).unwrap();
    let recovered = File::create(setup.mount.join("d.bin")).and_then(|mut f| {
        f.write_all(&pattern(9, 4 << 20))?;
        f.sync_all()
    });
    println!("write + fsync of 4 MiB once space is back: {recovered:?}");
    // The consumer's file system checked and remounted.
    let unmount = Command::new("umount").arg(&setup.mount).output().unwrap();
    println!(
        "umount: {} {}",
        unmount.status,
        String::from_utf8_lossy(&unmount.stderr).trim()
    );
    let fsck = Command::new("e2fsck")
        .args(["-fn", &setup.device])
        .output()
        .unwrap();
    let fsck_out = String::from_utf8_lossy(&fsck.stdout);
    println!(
        "e2fsck -fn: exit {:?}; {}",
        fsck.status.code(),
        fsck_out.lines().last().unwrap_or_default()
    );
    for line in fsck_out
        .lines()
        .filter(|l| !l.starts_with("Pass "))
        .take(12)
    {
        println!("  {line}");
    }
    setup.mount_volume();
    assert_eq!(
        sha256(&data_a),
        checksum_a,
        "data written and synced before the backing file system filled up changed"
    );
    let b = setup.mount.join("b.bin");
    let (intact, zeros, other) = compare_chunks(&b);
    println!(
        "after remount: b.bin has {} bytes (the consumer had {} accepted): {intact} MiB chunks intact, {zeros} read as zeros, {other} other",
        fs::metadata(&b).map(|m| m.len()).unwrap_or(0),
        view.bytes_accepted
    );
    assert!(
        recovered.is_ok(),
        "once space is back the volume must take writes again: {recovered:?}"
    );
    // With the space back the finding stays (the volume may still grow
    // past it), with the new numbers.
    let after = setup.fx.run(&["check", "--json"]);
    println!("check after freeing: {}", after.stdout);
}
