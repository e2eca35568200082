//! How much of a file is really allocated on disk, counting preallocated
//! (unwritten) extents. `st_blocks` also counts the file system's own
//! metadata blocks and `SEEK_HOLE` reports unwritten extents as holes, so
//! neither can tell whether a preallocated file still owns all its space;
//! the file system's extent map (`FS_IOC_FIEMAP`) can.

use std::fs::File;
use std::os::fd::AsRawFd;

use nix::errno::Errno;

const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
const FIEMAP_FLAG_SYNC: u32 = 0x1;
const FIEMAP_EXTENT_LAST: u32 = 0x1;
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
        let mut last = false;
        for extent in &map.extents[..mapped] {
            let from = extent.logical.max(start);
            let to = extent.logical.saturating_add(extent.length).min(size);
            allocated += to.saturating_sub(from);
            start = start.max(to);
            last |= extent.flags & FIEMAP_EXTENT_LAST != 0;
        }
        if last {
            break;
        }
    }
    Ok(allocated)
}

#[cfg(test)]
mod tests {
    use std::io::{Seek, SeekFrom, Write};

    use nix::fcntl::{fallocate, FallocateFlags};

    use super::allocated_bytes;

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

    use std::os::fd::AsRawFd;
}
