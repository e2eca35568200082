//! Safe handles on `/dev/loop-control` and `/dev/loopN`.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::held_elsewhere;
use super::ioctl::{self as sys, LoopInfo64};
use super::unwatched;
use crate::kernel::block_device;

pub const LOOP_CONTROL: &str = "/dev/loop-control";

/// `/dev/loop-control`, locked: systemd's tools take this lock around
/// allocating a device, so holding it keeps us from racing them.
pub struct LockedControl {
    control: Flock<File>,
}

impl LockedControl {
    pub fn acquire() -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(LOOP_CONTROL)
            .with_context(|| format!("opening {LOOP_CONTROL} (is the loop module available?)"))?;
        let control = Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| errno)
            .with_context(|| format!("locking {LOOP_CONTROL}"))?;
        Ok(Self { control })
    }

    /// Deletes the unbound device `number`, so the next device of that
    /// number starts from the kernel's defaults.
    pub fn remove(&self, number: u32) -> Result<(), Errno> {
        sys::ctl_remove(self.control.as_fd(), number)
    }

    /// The number of a free loop device (allocating one if needed).
    pub fn get_free(&self) -> Result<u32> {
        sys::ctl_get_free(self.control.as_fd()).context("asking the kernel for a free loop device")
    }
}

/// What a bound loop device reports about itself.
#[derive(Clone, Debug)]
pub struct LoopStatus {
    pub backing_dev: u64,
    pub backing_inode: u64,
    pub flags: u32,
    pub reference: String,
    /// Where in the file the device starts, and how much of it it shows
    /// (0: to the end); both 0 for every device sparse-volume binds.
    pub offset: u64,
    pub size_limit: u64,
}

impl From<LoopInfo64> for LoopStatus {
    fn from(info: LoopInfo64) -> Self {
        Self {
            backing_dev: info.lo_device,
            backing_inode: info.lo_inode,
            flags: info.lo_flags,
            reference: info.file_name(),
            offset: info.lo_offset,
            size_limit: info.lo_sizelimit,
        }
    }
}

impl LoopStatus {
    pub fn has(&self, flag: u32) -> bool {
        self.flags & flag != 0
    }

    /// The backing file's (device, inode).
    pub fn backing(&self) -> (u64, u64) {
        (self.backing_dev, self.backing_inode)
    }

    /// True when this device is backed by the file with this `stat`.
    pub fn is_backed_by(&self, dev: u64, inode: u64) -> bool {
        self.backing_dev == dev && self.backing_inode == inode
    }
}

/// An open `/dev/loopN`.
#[derive(Debug)]
pub struct LoopDevice {
    number: u32,
    file: File,
}

impl LoopDevice {
    pub fn path_of(number: u32) -> PathBuf {
        PathBuf::from(format!("/dev/loop{number}"))
    }

    /// Whether the kernel holds the device read-only now (sysfs, readable
    /// without root); None when it cannot be read.
    pub fn is_read_only(number: u32) -> Option<bool> {
        let flag: u8 =
            crate::kernel::sysfs::read_number(Path::new(&format!("/sys/block/loop{number}/ro")))?;
        Some(flag != 0)
    }

    pub fn open(number: u32, writable: bool) -> Result<Self> {
        Self::open_with(number, writable, 0)
    }

    /// Opens with `O_EXCL`: the kernel refuses (`EBUSY`) while a file
    /// system, device mapper or another exclusive opener holds the device
    /// or one of its partitions. Read-only: `LOOP_CLR_FD` needs no writer,
    /// and a writer's close would make udev re-read the partition table
    /// (see `unwatched`), possibly of the next volume bound to this number.
    pub fn open_exclusive(number: u32) -> Result<Self, Errno> {
        let path = Self::path_of(number);
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_EXCL)
            .open(&path)
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
        Ok(Self { number, file })
    }

    fn open_with(number: u32, writable: bool, flags: i32) -> Result<Self> {
        let path = Self::path_of(number);
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .custom_flags(libc::O_CLOEXEC | flags)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(Self { number, file })
    }

    pub fn number(&self) -> u32 {
        self.number
    }

    pub fn path(&self) -> PathBuf {
        Self::path_of(self.number)
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// `None` when nothing is attached.
    pub fn status(&self) -> Result<Option<LoopStatus>> {
        match sys::get_status(self.file.as_fd()) {
            Ok(info) => Ok(Some(info.into())),
            Err(Errno::ENXIO) => Ok(None),
            Err(e) => {
                Err(e).with_context(|| format!("reading the status of {}", self.path().display()))
            }
        }
    }

    /// Makes the kernel re-read the backing file's size after it grew.
    pub fn refresh_capacity(&self) -> Result<()> {
        sys::set_capacity(self.file.as_fd())
            .with_context(|| format!("refreshing the capacity of {}", self.path().display()))
    }

    /// Grows partition `number` to the given extent (bytes).
    pub fn resize_partition(&self, number: i32, start: u64, length: u64) -> Result<()> {
        block_device::resize_partition(self.file.as_fd(), number, start, length)
            .with_context(|| format!("growing partition {number} of {}", self.path().display()))
    }

    /// The logical sector size the device presents (`BLKSSZGET`).
    pub fn logical_block_size(&self) -> Result<u32> {
        block_device::logical_block_size(self.file.as_fd())
            .with_context(|| format!("reading the sector size of {}", self.path().display()))
    }

    /// Drops the device's page cache after its backing file was written
    /// directly, so readers of the device see the new bytes.
    pub fn flush_buffers(&self) -> Result<()> {
        block_device::flush_buffers(self.file.as_fd())
            .with_context(|| format!("flushing the buffers of {}", self.path().display()))
    }

    /// Takes a BSD lock on the device node. udev skips devices that are
    /// locked, so it does not probe one we are still configuring.
    pub fn lock(self) -> Result<LockedLoopDevice> {
        let number = self.number;
        let lock = Flock::lock(self.file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| errno)
            .with_context(|| format!("locking {}", Self::path_of(number).display()))?;
        Ok(LockedLoopDevice {
            number,
            writer: None,
            writer_warning: None,
            lock,
        })
    }
}

/// A loop device held under its BSD lock for as long as the value lives.
pub struct LockedLoopDevice {
    number: u32,
    /// The descriptor for the ioctls when binding a writable device (the
    /// kernel makes a device bound through a read-only descriptor
    /// read-only), opened through a private node: see `unwatched`.
    /// Declared before `lock`, so it is closed while the lock is held.
    writer: Option<File>,
    /// Why the writer is `/dev/loopN` itself rather than a private node.
    writer_warning: Option<String>,
    /// `/dev/loopN` itself, which is where udev takes its lock too (a BSD
    /// lock belongs to the inode that was opened).
    lock: Flock<File>,
}

impl LockedLoopDevice {
    /// Locks `/dev/loopN` through a read-only descriptor and, when
    /// `writable`, opens the device for writing without udev watching
    /// that descriptor's close. Binding through it makes the partition
    /// appear exactly once.
    pub fn claim(number: u32, writable: bool) -> Result<Self> {
        let mut device = LoopDevice::open(number, false)?.lock()?;
        if writable {
            let writer = match unwatched::open_read_write(&device.lock) {
                Ok(file) => file,
                // No private tmpfs or node (a container without
                // CAP_SYS_ADMIN or CAP_MKNOD, a kernel before 5.2): the
                // watched node still works, at the price of udev
                // re-reading the partition table once after we close it.
                Err(error) => {
                    device.writer_warning = Some(format!(
                        "{error:#}; bound through {} instead, whose partitions udev may then scan a second time, under a consumer that already started",
                        device.path().display()
                    ));
                    LoopDevice::open(number, true)?.file
                }
            };
            device.writer = Some(writer);
        }
        Ok(device)
    }

    /// Set when a writable bind could not avoid udev's watch (see `claim`).
    pub fn writer_warning(&self) -> Option<String> {
        self.writer_warning.clone()
    }

    /// The descriptor the ioctls go through.
    fn fd(&self) -> BorrowedFd<'_> {
        match &self.writer {
            Some(writer) => writer.as_fd(),
            None => self.lock.as_fd(),
        }
    }

    pub fn number(&self) -> u32 {
        self.number
    }

    pub fn path(&self) -> PathBuf {
        LoopDevice::path_of(self.number)
    }

    pub fn status(&self) -> Result<Option<LoopStatus>, Errno> {
        match sys::get_status(self.fd()) {
            Ok(info) => Ok(Some(info.into())),
            Err(Errno::ENXIO) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn configure(
        &self,
        backing: &File,
        info: LoopInfo64,
        block_size: u32,
    ) -> Result<(), Errno> {
        sys::configure(
            self.fd(),
            &sys::LoopConfig::new(backing.as_fd(), info, block_size),
        )
    }

    /// The pre-5.8 way: bind, then set the status and the sector size in
    /// further steps.
    pub fn set_fd_then_status(
        &self,
        backing: &File,
        info: &LoopInfo64,
        block_size: u32,
    ) -> Result<(), Errno> {
        let fd = self.fd();
        sys::set_fd(fd, backing.as_fd())?;
        sys::set_status(fd, info)
            .and_then(|()| match block_device::logical_block_size(fd) {
                // Kernels before 4.14 lack LOOP_SET_BLOCK_SIZE but bind
                // with 512-byte sectors, so only ask for a change.
                Ok(current) if current == block_size => Ok(()),
                _ => sys::set_block_size(fd, block_size),
            })
            .inspect_err(|_| {
                // Do not leave a half-configured device behind.
                let _ = sys::clear_fd(fd);
            })
    }

    pub fn logical_block_size(&self) -> Result<u32, Errno> {
        block_device::logical_block_size(self.fd())
    }

    pub fn set_direct_io(&self, on: bool) -> Result<(), Errno> {
        sys::set_direct_io(self.fd(), on)
    }

    pub fn set_status(&self, info: &LoopInfo64) -> Result<(), Errno> {
        sys::set_status(self.fd(), info)
    }

    pub fn raw_status(&self) -> Result<LoopInfo64, Errno> {
        sys::get_status(self.fd())
    }

    pub fn clear(&self) -> Result<(), Errno> {
        sys::clear_fd(self.fd())
    }
}

/// Numbers of the loop devices that currently have a backing file.
/// sysfs shows `loopN/loop/` only while a device is bound, which costs a
/// lookup per device node, bound or idle; a node that volumes came and
/// went on keeps hundreds of idle ones. `/proc/partitions` lists only the
/// devices with a capacity (a bound device has one unless its file is
/// empty or its offset lies past the end: no data to guard), in a few
/// reads.
pub fn bound_devices() -> Result<Vec<u32>> {
    match loops_listed_consistently() {
        Some(numbers) => Ok(numbers),
        None => bound_devices_in_sysfs(),
    }
}

/// The loop devices of `/proc/partitions`, from a listing known to be
/// whole. The kernel hands it out a page (about 100 disks) per `read`, and
/// resumes each read by counting entries from the start, so a disk removed
/// in between shifts the rest and a bound device would go unlisted. A
/// listing that one read returned whole is one pass over the disks; a
/// longer one counts only when a second listing reads the same. A listing
/// without its header (masked by an empty file) is no answer either.
fn loops_listed_consistently() -> Option<Vec<u32>> {
    let (first, reads) = read_partitions()?;
    if reads > 1 && read_partitions()?.0 != first {
        return None;
    }
    let text = std::str::from_utf8(&first).ok()?;
    text.starts_with("major minor")
        .then(|| loops_with_capacity(text))
}

/// `/proc/partitions` to its end, and how many reads returned data.
/// Bounded: a listing this long is no kernel's.
fn read_partitions() -> Option<(Vec<u8>, usize)> {
    const CHUNK: usize = 64 * 1024;
    const LIMIT: usize = 16 * 1024 * 1024;
    let mut file = File::open("/proc/partitions").ok()?;
    let mut listing = Vec::with_capacity(CHUNK);
    let mut reads = 0;
    loop {
        let start = listing.len();
        listing.resize(start + CHUNK, 0);
        let length = file.read(&mut listing[start..]).ok()?;
        listing.truncate(start + length);
        if length == 0 {
            return Some((listing, reads));
        }
        reads += 1;
        if listing.len() > LIMIT {
            return None;
        }
    }
}

/// The whole loop devices (`loopN`, not their partitions) in the text of
/// `/proc/partitions`, sorted.
fn loops_with_capacity(partitions: &str) -> Vec<u32> {
    let mut numbers: Vec<u32> = partitions
        .lines()
        .filter_map(|line| {
            line.split_whitespace()
                .nth(3)?
                .strip_prefix("loop")?
                .parse()
                .ok()
        })
        .collect();
    numbers.sort_unstable();
    numbers.dedup();
    numbers
}

fn bound_devices_in_sysfs() -> Result<Vec<u32>> {
    let mut numbers = Vec::new();
    let listing = std::fs::read_dir("/sys/block").context("listing /sys/block")?;
    for entry in listing {
        let entry = entry.context("listing /sys/block")?;
        let name = entry.file_name();
        let Some(number) = name
            .to_str()
            .and_then(|n| n.strip_prefix("loop"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if entry.path().join("loop").is_dir() {
            numbers.push(number);
        }
    }
    numbers.sort_unstable();
    Ok(numbers)
}

/// The status of every bound loop device. Devices that vanish or unbind
/// while we look are skipped: the answer is a snapshot either way.
pub fn bound_statuses() -> Result<Vec<(u32, LoopStatus)>> {
    Ok(BoundLoops::read()?.statuses)
}

/// The bound devices whose backing file is `backing` (device + inode), in
/// number order. When the kernel says nothing but `backing` itself holds
/// the file open, no device can: then none is asked.
pub fn devices_holding(backing: &File, meta: &std::fs::Metadata) -> Result<Vec<(u32, LoopStatus)>> {
    if held_elsewhere::held_by_us_alone(backing)? {
        return Ok(Vec::new());
    }
    statuses_backed_by(meta)
}

/// The bound devices, with their status, whose backing file has `meta`'s
/// device and inode.
fn statuses_backed_by(meta: &std::fs::Metadata) -> Result<Vec<(u32, LoopStatus)>> {
    Ok(bound_statuses()?
        .into_iter()
        .filter(|(_, status)| status.is_backed_by(meta.dev(), meta.ino()))
        .collect())
}

/// Loop devices backed by the file at `path` (matched by device + inode,
/// never by path, which can be renamed or re-created).
pub fn devices_backed_by(path: &Path) -> Result<Vec<u32>> {
    let meta = std::fs::metadata(path).with_context(|| format!("inspecting {}", path.display()))?;
    Ok(statuses_backed_by(&meta)?
        .into_iter()
        .map(|(number, _)| number)
        .collect())
}

/// The loop number of a `/dev/loopN` or `/dev/loopNpM` device, resolving a
/// partition to its parent through sysfs.
pub fn parent_loop_of(device: &Path) -> Option<u32> {
    let name = device.file_name()?.to_str()?;
    let sys = Path::new("/sys/class/block").join(name);
    let whole = if sys.join("partition").exists() {
        let resolved = std::fs::canonicalize(&sys).ok()?;
        resolved.parent()?.file_name()?.to_str()?.to_string()
    } else {
        name.to_string()
    };
    whole.strip_prefix("loop")?.parse().ok()
}

/// Loop devices backed by the file, matched by device + inode. Without
/// root, `/dev/loopN` cannot be opened to compare inodes (and the storage
/// directory may not even be searchable); for the devices we cannot open,
/// the kernel's record of the backing file's path in sysfs (readable by
/// anyone, and what `losetup` shows unprivileged users too) has to do.
pub fn devices_of_file(host_path: &Path) -> Result<Vec<u32>> {
    Ok(BoundLoops::read()?.devices_of_file(host_path))
}

/// Every bound loop device, read once: a caller that looks up many backing
/// files (a listing of a thousand volumes) asks each device once, not once
/// per file. A snapshot: devices bound or released later are not in it.
pub struct BoundLoops {
    /// The devices we could open, with their status.
    statuses: Vec<(u32, LoopStatus)>,
    /// The devices we could not open (without root), with the backing
    /// file's path as sysfs records it.
    unopened: Vec<(u32, PathBuf)>,
}

impl BoundLoops {
    pub fn read() -> Result<Self> {
        let mut statuses = Vec::new();
        let mut unopened = Vec::new();
        for number in bound_devices()? {
            match LoopDevice::open(number, false) {
                Ok(device) => {
                    if let Ok(Some(status)) = device.status() {
                        statuses.push((number, status));
                    }
                }
                Err(_) => {
                    let recorded = format!("/sys/block/loop{number}/loop/backing_file");
                    if let Ok(text) = std::fs::read_to_string(recorded) {
                        unopened.push((number, PathBuf::from(text.trim_end_matches('\n'))));
                    }
                }
            }
        }
        Ok(Self { statuses, unopened })
    }

    /// [`devices_of_file`] from this snapshot.
    pub fn devices_of_file(&self, host_path: &Path) -> Vec<u32> {
        if let Ok(meta) = std::fs::metadata(host_path) {
            let by_inode: Vec<u32> = self
                .statuses
                .iter()
                .filter(|(_, status)| status.is_backed_by(meta.dev(), meta.ino()))
                .map(|(number, _)| *number)
                .collect();
            if !by_inode.is_empty() {
                return by_inode;
            }
        }
        if self.unopened.is_empty() {
            return Vec::new();
        }
        let wanted = std::fs::canonicalize(host_path).unwrap_or_else(|_| host_path.to_path_buf());
        self.unopened
            .iter()
            .filter(|(_, recorded)| *recorded == wanted)
            .map(|(number, _)| *number)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_loop_devices_are_read_from_proc_partitions() {
        let text = "major minor  #blocks  name\n\n 259        0  104857600 nvme0n1\n 259        1     524288 nvme0n1p1\n   7       12      32768 loop12\n 259        3      31744 loop12p1\n   7        0     327680 loop0\n   7        8       1024 loop8\n";
        assert_eq!(loops_with_capacity(text), vec![0, 8, 12]);
    }

    #[test]
    fn no_loop_device_in_an_empty_listing() {
        assert_eq!(
            loops_with_capacity("major minor  #blocks  name\n\n"),
            Vec::<u32>::new()
        );
        assert_eq!(loops_with_capacity(""), Vec::<u32>::new());
    }
}
