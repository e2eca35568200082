//! A point-in-time copy of a file: a reflink (`FICLONE`), which shares
//! the source's extents and costs nothing until either file is written,
//! where the file system can; otherwise a copy of the source's data ranges
//! only, so that a sparse file's holes stay holes in the copy.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use anyhow::{bail, Context, Result};
use nix::errno::Errno;
use nix::unistd::{lseek, Whence};

/// `_IOW(0x94, 9, int)`, from `<linux/fs.h>`.
const FICLONE: libc::c_ulong = linux_raw_sys::ioctl::FICLONE as libc::c_ulong;

/// What one `copy_file_range` or read/write round moves at most: large
/// enough that the calls cost nothing next to the I/O, small enough that
/// the fallback's buffer is no burden.
const CHUNK: usize = 8 << 20;

/// Makes `target` share all of `source`'s extents (`FICLONE`): afterwards
/// it has the source's length and content, and a write to either file
/// copies only the blocks it touches. `target` must be open for writing
/// (its previous content is replaced). Fails with `EOPNOTSUPP` or `EINVAL`
/// where the file system cannot share extents (ext4, tmpfs), and `EXDEV`
/// when the files are on different file systems (or mounts).
pub fn reflink(source: &File, target: &File) -> Result<(), Errno> {
    // SAFETY: FICLONE takes the source's file descriptor by value; both
    // descriptors are valid for the duration of the call.
    Errno::result(unsafe {
        libc::ioctl(
            target.as_raw_fd(),
            FICLONE,
            source.as_raw_fd() as libc::c_ulong,
        )
    })
    .map(drop)
}

/// Copies `source` into `target`, an empty file the caller made and
/// opened for writing, range by data range (`SEEK_DATA`/`SEEK_HOLE`):
/// holes are neither read nor written, and the target ends at the
/// source's length so that trailing holes stay holes too. Preallocated
/// (unwritten) extents read as zeros and `SEEK_DATA` skips them, so they
/// become holes. Returns the bytes of data copied. Nothing is synced (the
/// caller decides when the copy must be durable); the source's file
/// offset is moved.
///
/// Within one file system the kernel may share the data's extents instead
/// of copying them (`copy_file_range` on xfs and btrfs); across file
/// systems, or where `copy_file_range` cannot, each range is read and
/// written.
pub fn copy_keeping_holes(source: &File, target: &File) -> Result<u64> {
    copy_data_ranges(source, target, true)
}

fn copy_data_ranges(source: &File, target: &File, mut in_kernel: bool) -> Result<u64> {
    let target_length = target
        .metadata()
        .context("reading the copy's length")?
        .len();
    if target_length != 0 {
        bail!("the copy must start empty, and has {target_length} bytes");
    }
    let size = source
        .metadata()
        .context("reading the source's length")?
        .len();
    let mut copied = 0u64;
    for (start, length) in data_ranges(source, size)? {
        copy_range(source, target, start, length, &mut in_kernel)?;
        copied += length;
    }
    // After the last data range: a trailing hole is a length, not zeros.
    target
        .set_len(size)
        .with_context(|| format!("setting the copy's length to {size} bytes"))?;
    Ok(copied)
}

/// The data ranges of `[0, size)` of `file`, (start, length) in order
/// (`SEEK_DATA`/`SEEK_HOLE`): what a copy or a stream of it must carry;
/// the rest reads as zeros. Preallocated (unwritten) extents are holes
/// here. The file's offset is moved.
pub fn data_ranges(file: &File, size: u64) -> Result<Vec<(u64, u64)>> {
    let mut ranges = Vec::new();
    let mut offset = 0u64;
    while offset < size {
        let Some(data) = seek(file, offset, Whence::SeekData)? else {
            // ENXIO: no data from `offset` to the end.
            break;
        };
        if data >= size {
            break;
        }
        // Every file has an implicit hole at its end, so this finds one
        // unless the file shrank meanwhile; `size` bounds the ranges
        // either way.
        let hole = seek(file, data, Whence::SeekHole)?
            .unwrap_or(size)
            .min(size);
        if hole <= data {
            // The data at `data` was punched out meanwhile.
            offset = data.saturating_add(1);
            continue;
        }
        ranges.push((data, hole - data));
        offset = hole;
    }
    Ok(ranges)
}

/// `lseek` to the next data (`SeekData`) or hole (`SeekHole`) at or after
/// `offset`; `None` when there is none (`ENXIO`).
fn seek(file: &File, offset: u64, whence: Whence) -> Result<Option<u64>> {
    let what = match whence {
        Whence::SeekData => "data",
        _ => "a hole",
    };
    let offset = i64::try_from(offset).context("an offset beyond the largest file")?;
    match lseek(file.as_raw_fd(), offset, whence) {
        Ok(found) => Ok(Some(found as u64)),
        Err(Errno::ENXIO) => Ok(None),
        Err(errno) => Err(errno)
            .with_context(|| format!("looking for {what} in the source from byte {offset}")),
    }
}

/// Copies `[start, start + length)` of `source` to the same place in
/// `target`, in the kernel while `in_kernel` holds; a `copy_file_range`
/// that cannot (across file systems before Linux 5.19's rules allow it, on
/// a file system without it) clears it, for this range and the next.
fn copy_range(
    source: &File,
    target: &File,
    start: u64,
    length: u64,
    in_kernel: &mut bool,
) -> Result<()> {
    let end = start + length;
    let mut position = start;
    while *in_kernel && position < end {
        let mut from = i64::try_from(position).context("an offset beyond the largest file")?;
        let mut to = from;
        let chunk = usize::try_from(end - position).unwrap_or(CHUNK).min(CHUNK);
        match copy_file_range(source, &mut from, target, &mut to, chunk) {
            Ok(0) => bail!("the source ended at byte {position} while being copied"),
            // A short copy is progress; the rest follows in the next round.
            Ok(done) => position += done as u64,
            Err(Errno::EINTR) => {}
            Err(Errno::EXDEV | Errno::EOPNOTSUPP | Errno::ENOSYS | Errno::EINVAL) => {
                *in_kernel = false;
            }
            Err(errno) => {
                return Err(errno)
                    .with_context(|| format!("copying bytes {position}..{end} of the source"))
            }
        }
    }
    if position < end {
        read_and_write(source, target, position, end)?;
    }
    Ok(())
}

/// `copy_file_range(2)` from and to explicit offsets, which it moves on by
/// what it copied (the files' own offsets stay where they are).
fn copy_file_range(
    source: &File,
    from: &mut i64,
    target: &File,
    to: &mut i64,
    length: usize,
) -> Result<usize, Errno> {
    // SAFETY: both descriptors are valid for the duration of the call, and
    // the kernel reads and writes the two offsets, which outlive it.
    let copied = unsafe {
        libc::copy_file_range(source.as_raw_fd(), from, target.as_raw_fd(), to, length, 0)
    };
    Errno::result(copied).map(|copied| copied as usize)
}

/// The fallback: the range through a buffer of ours.
fn read_and_write(source: &File, target: &File, start: u64, end: u64) -> Result<()> {
    let size = usize::try_from(end - start).unwrap_or(CHUNK).min(CHUNK);
    let mut buffer = vec![0u8; size];
    let mut position = start;
    while position < end {
        let want = usize::try_from(end - position).unwrap_or(size).min(size);
        let read = match source.read_at(&mut buffer[..want], position) {
            Ok(0) => bail!("the source ended at byte {position} while being copied"),
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => {
                return Err(error).with_context(|| format!("reading byte {position} of the source"))
            }
        };
        target
            .write_all_at(&buffer[..read], position)
            .with_context(|| format!("writing byte {position} of the copy"))?;
        position += read as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs::{File, OpenOptions};
    use std::os::unix::fs::{FileExt, MetadataExt};
    use std::path::Path;

    use super::{copy_data_ranges, copy_keeping_holes};

    const LENGTH: u64 = 32 << 20;

    /// A 32 MiB file with 1 MiB of data at 0, 1 MiB at 10 MiB and 64 KiB
    /// at 20 MiB; the rest (and the last 12 MiB) holes.
    fn sparse_source(path: &Path) -> File {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .unwrap();
        for (at, length, byte) in [
            (0u64, 1usize << 20, 1u8),
            (10 << 20, 1 << 20, 2),
            (20 << 20, 64 << 10, 3),
        ] {
            let data: Vec<u8> = (0..length).map(|i| byte.wrapping_add(i as u8)).collect();
            file.write_all_at(&data, at).unwrap();
        }
        file.set_len(LENGTH).unwrap();
        file
    }

    fn empty_target(path: &Path) -> File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .unwrap()
    }

    fn assert_same_sparse_copy(source: &Path, copy: &Path) {
        assert!(
            std::fs::read(source).unwrap() == std::fs::read(copy).unwrap(),
            "the copy's bytes differ"
        );
        let (source, copy) = (
            std::fs::metadata(source).unwrap(),
            std::fs::metadata(copy).unwrap(),
        );
        assert_eq!(copy.len(), LENGTH);
        // A little slack for the file system's own blocks (an extent tree
        // block, a delayed allocation rounded up).
        let slack = 256 << 10;
        assert!(
            copy.blocks() * 512 <= source.blocks() * 512 + slack,
            "the copy has {} bytes of blocks, the source {}",
            copy.blocks() * 512,
            source.blocks() * 512
        );
        assert!(copy.blocks() * 512 < LENGTH / 4, "the holes were filled");
    }

    #[test]
    fn a_sparse_file_is_copied_with_its_holes() {
        let dir = tempfile::tempdir().unwrap();
        let source = sparse_source(&dir.path().join("source"));
        let target = empty_target(&dir.path().join("copy"));
        let copied = copy_keeping_holes(&source, &target).unwrap();
        assert_eq!(copied, (2 << 20) + (64 << 10));
        assert_same_sparse_copy(&dir.path().join("source"), &dir.path().join("copy"));
    }

    #[test]
    fn the_read_and_write_fallback_keeps_the_holes_too() {
        let dir = tempfile::tempdir().unwrap();
        let source = sparse_source(&dir.path().join("source"));
        let target = empty_target(&dir.path().join("copy"));
        let copied = copy_data_ranges(&source, &target, false).unwrap();
        assert_eq!(copied, (2 << 20) + (64 << 10));
        assert_same_sparse_copy(&dir.path().join("source"), &dir.path().join("copy"));
    }

    #[test]
    fn files_of_holes_only_and_empty_files_copy_no_data() {
        let dir = tempfile::tempdir().unwrap();
        for length in [0u64, 5 << 20] {
            let name = format!("source-{length}");
            let source = empty_target(&dir.path().join(&name));
            source.set_len(length).unwrap();
            let target = empty_target(&dir.path().join(format!("copy-{length}")));
            assert_eq!(copy_keeping_holes(&source, &target).unwrap(), 0);
            let copy = target.metadata().unwrap();
            assert_eq!((copy.len(), copy.blocks()), (length, 0));
        }
    }

    #[test]
    fn a_target_with_content_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let source = sparse_source(&dir.path().join("source"));
        let target = empty_target(&dir.path().join("copy"));
        target.write_all_at(b"old", 0).unwrap();
        let error = copy_keeping_holes(&source, &target).unwrap_err();
        assert!(
            format!("{error:#}").contains("must start empty"),
            "{error:#}"
        );
        assert_eq!(std::fs::read(dir.path().join("copy")).unwrap(), b"old");
    }
}
