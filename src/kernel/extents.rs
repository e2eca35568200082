//! How much of a file is really allocated on disk, counting preallocated
//! (unwritten) extents, and how much of it shares its blocks with another
//! file (a reflink clone and its source). `st_blocks` also counts the file
//! system's own metadata blocks and `SEEK_HOLE` reports unwritten extents
//! as holes, so neither can tell whether a preallocated file still owns
//! all its space, nor whether its blocks are its own; the file system's
//! extent map (`FS_IOC_FIEMAP`) can.

use std::fs::File;
use std::os::fd::AsRawFd;

use nix::errno::Errno;

use linux_raw_sys::ioctl as abi;

const FS_IOC_FIEMAP: libc::c_ulong = abi::FS_IOC_FIEMAP as libc::c_ulong;
const FIEMAP_FLAG_SYNC: u32 = abi::FIEMAP_FLAG_SYNC;
const FIEMAP_EXTENT_LAST: u32 = abi::FIEMAP_EXTENT_LAST;
/// The extent's blocks are shared with another file (0x2000).
const FIEMAP_EXTENT_SHARED: u32 = abi::FIEMAP_EXTENT_SHARED;
const BATCH: usize = 64;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct FiemapExtent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

#[repr(C)]
struct Fiemap {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
    extents: [FiemapExtent; BATCH],
}

/// Bytes of `[0, size)` that have disk blocks (written or preallocated).
pub fn allocated_bytes(file: &File, size: u64) -> Result<u64, Errno> {
    let mut allocated = 0u64;
    walk_extents(file, size, |_, _, bytes| allocated += bytes)?;
    Ok(allocated)
}

/// Bytes of `[0, size)` in extents whose blocks another file (or a
/// snapshot) also points at: after a reflink clone, what the clone and its
/// source still share. Zero on a file system that never shares blocks.
pub fn shared_bytes(file: &File, size: u64) -> Result<u64, Errno> {
    Ok(shared_ranges(file, size)?
        .iter()
        .map(|(_, length)| length)
        .sum())
}

/// The shared extents of `[0, size)` where they lie on the disk:
/// (physical byte offset, length). Two files that share an extent report
/// the same range, so a union over several files counts each shared
/// block once. (btrfs reports whole extents: a partly unshared one still
/// counts whole.)
pub fn shared_ranges(file: &File, size: u64) -> Result<Vec<(u64, u64)>, Errno> {
    let mut ranges = Vec::new();
    walk_extents(file, size, |flags, physical, bytes| {
        if flags & FIEMAP_EXTENT_SHARED != 0 {
            ranges.push((physical, bytes));
        }
    })?;
    Ok(ranges)
}

/// Bytes covered by the union of `ranges` ((start, length) each).
pub fn union_length(mut ranges: Vec<(u64, u64)>) -> u64 {
    ranges.sort_unstable();
    let mut total = 0u64;
    let mut covered_to = 0u64;
    for (start, length) in ranges {
        let end = start.saturating_add(length);
        let from = start.max(covered_to);
        total += end.saturating_sub(from);
        covered_to = covered_to.max(end);
    }
    total
}

/// Calls `visit` with the flags of each extent of `[0, size)`, where the
/// part in that range starts on the disk and its bytes, in file order, a
/// batch of extents per `FS_IOC_FIEMAP` call.
fn walk_extents(file: &File, size: u64, mut visit: impl FnMut(u32, u64, u64)) -> Result<(), Errno> {
    let mut start = 0u64;
    while start < size {
        let mut map = Fiemap {
            start,
            length: size - start,
            flags: FIEMAP_FLAG_SYNC,
            mapped_extents: 0,
            extent_count: BATCH as u32,
            reserved: 0,
            extents: [FiemapExtent::default(); BATCH],
        };
        // SAFETY: the kernel reads the header and writes at most
        // `extent_count` extents into `map`, which is that large and
        // lives across the call.
        Errno::result(unsafe {
            libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP, &mut map as *mut Fiemap)
        })?;
        let mapped = (map.mapped_extents as usize).min(BATCH);
        if mapped == 0 {
            break;
        }
        let batch_start = start;
        let mut last = false;
        for extent in &map.extents[..mapped] {
            let from = extent.logical.max(start);
            let to = extent.logical.saturating_add(extent.length).min(size);
            let physical = extent
                .physical
                .saturating_add(from.saturating_sub(extent.logical));
            visit(extent.flags, physical, to.saturating_sub(from));
            start = start.max(to);
            last |= extent.flags & FIEMAP_EXTENT_LAST != 0;
        }
        // A batch that does not move the start on would be asked for
        // again, for ever.
        if last || start == batch_start {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{Seek, SeekFrom, Write};

    use nix::fcntl::{fallocate, FallocateFlags};

    use super::{allocated_bytes, shared_bytes, union_length};

    #[test]
    fn a_union_counts_overlapping_ranges_once() {
        assert_eq!(union_length(vec![]), 0);
        assert_eq!(
            union_length(vec![(100, 50), (0, 10), (120, 50), (100, 50)]),
            10 + 70
        );
        assert_eq!(union_length(vec![(0, 100), (10, 10)]), 100);
    }

    #[test]
    fn counts_preallocated_and_written_extents_but_not_holes() {
        let mut file = tempfile::tempfile().expect("temporary file");
        let size = 8u64 << 20;
        file.set_len(size).expect("size");
        assert_eq!(allocated_bytes(&file, size), Ok(0));
        // A preallocated (unwritten) MiB and a written MiB.
        fallocate(file.as_raw_fd(), FallocateFlags::empty(), 0, 1 << 20).expect("fallocate");
        file.seek(SeekFrom::Start(4 << 20)).expect("seek");
        file.write_all(&vec![7u8; 1 << 20]).expect("write");
        let allocated = allocated_bytes(&file, size).expect("fiemap");
        assert_eq!(allocated, 2 << 20, "tmp's file system must support FIEMAP");
    }

    #[test]
    fn a_file_of_its_own_shares_nothing() {
        // Whether shared extents are counted needs a reflink, so root and
        // a mounted xfs or btrfs: tests/clone_primitives.rs.
        let mut file = tempfile::tempfile().expect("temporary file");
        file.write_all(&vec![7u8; 1 << 20]).expect("write");
        file.set_len(4 << 20).expect("size");
        assert_eq!(shared_bytes(&file, 4 << 20), Ok(0));
        assert_eq!(shared_bytes(&file, 0), Ok(0));
    }

    use std::os::fd::AsRawFd;
}
