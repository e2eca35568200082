//! Positioned writes of a new file that go around the page cache
//! (`O_DIRECT`) where the file system and the alignment allow it.
//!
//! Why: a buffered write of a gigabyte costs the kernel a copy into the
//! page cache whose price, on a virtual machine, swings several times over
//! from one run to the next (fresh page-cache pages fault in the host),
//! and the `fsync` that must follow writes it all again at the end. A
//! direct write costs the disk's own speed, every time, and leaves nothing
//! for the `fsync` but the metadata.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

use crate::kernel::files::start_write_back;

/// What `O_DIRECT` asks of offsets, lengths and buffer addresses: the
/// file system's block size is at most this on every file system we
/// store volumes on.
const ALIGNMENT: usize = 4096;

pub struct DirectWriter<'a> {
    /// The file as opened by its maker: the buffered path, and what
    /// unaligned heads and tails go through.
    buffered: &'a File,
    /// The same open file again with `O_DIRECT`; `None` where the file
    /// system refuses it (then every write is buffered).
    direct: Option<File>,
    /// Whole aligned blocks are copied here first: a caller's buffer is
    /// not aligned in memory.
    bounce: Vec<u8>,
}

impl<'a> DirectWriter<'a> {
    /// `chunk`: the largest write the caller makes (bigger ones are split).
    pub fn new(buffered: &'a File, chunk: usize) -> Self {
        // Through /proc: the same inode, whatever its name does meanwhile.
        let direct = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(format!("/proc/self/fd/{}", buffered.as_raw_fd()))
            .ok();
        let bounce = if direct.is_some() {
            vec![0u8; chunk.max(ALIGNMENT) + ALIGNMENT]
        } else {
            Vec::new()
        };
        Self {
            buffered,
            direct,
            bounce,
        }
    }

    /// Writes all of `data` at `offset`: whole aligned blocks directly,
    /// the rest through the page cache (with its write-back started, so
    /// that the final `fsync` finds little left).
    pub fn write_all_at(&mut self, mut data: &[u8], mut offset: u64) -> io::Result<()> {
        while !data.is_empty() {
            let direct_length = self.direct_length(data.len(), offset);
            if direct_length == 0 {
                return self.write_buffered(data, offset);
            }
            match self.write_direct(&data[..direct_length], offset) {
                Ok(()) => {}
                // The file system takes no direct I/O after all (or not
                // at this alignment): buffered from here on.
                Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                    self.direct = None;
                    return self.write_buffered(data, offset);
                }
                Err(error) => return Err(error),
            }
            data = &data[direct_length..];
            offset += direct_length as u64;
        }
        Ok(())
    }

    /// How much of a write of `length` at `offset` can go directly.
    fn direct_length(&self, length: usize, offset: u64) -> usize {
        if self.direct.is_none() || !offset.is_multiple_of(ALIGNMENT as u64) {
            return 0;
        }
        let room = self.bounce.len() - ALIGNMENT;
        length.min(room) / ALIGNMENT * ALIGNMENT
    }

    fn write_direct(&mut self, data: &[u8], offset: u64) -> io::Result<()> {
        let Some(direct) = &self.direct else {
            return self.write_buffered(data, offset);
        };
        let start = self.bounce.as_ptr().align_offset(ALIGNMENT);
        let aligned = &mut self.bounce[start..start + data.len()];
        aligned.copy_from_slice(data);
        direct.write_all_at(aligned, offset)
    }

    fn write_buffered(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.buffered.write_all_at(data, offset)?;
        start_write_back(self.buffered, offset, data.len());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Aligned, unaligned and oversized writes all land where asked, and
    /// the holes between them stay holes of zeros.
    #[test]
    fn every_write_lands_where_it_was_asked() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let path = directory.path().join("image");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .expect("a new file");
        file.set_len(1 << 20).expect("sized");
        let mut writer = DirectWriter::new(&file, 8192);
        let pattern = |seed: u8, length: usize| -> Vec<u8> {
            (0..length)
                .map(|i| seed.wrapping_add((i % 251) as u8))
                .collect()
        };
        // (offset, length): aligned and whole, aligned with a tail,
        // unaligned, and bigger than the bounce buffer.
        let writes = [
            (0u64, 4096usize),
            (8192, 4096 + 100),
            (20_000, 3000),
            (65_536, 40_000),
        ];
        for (seed, &(offset, length)) in writes.iter().enumerate() {
            writer
                .write_all_at(&pattern(seed as u8, length), offset)
                .expect("written");
        }
        drop(writer);
        let mut content = vec![0u8; 1 << 20];
        file.read_exact_at(&mut content, 0).expect("read back");
        let mut expected = vec![0u8; 1 << 20];
        for (seed, &(offset, length)) in writes.iter().enumerate() {
            let offset = offset as usize;
            expected[offset..offset + length].copy_from_slice(&pattern(seed as u8, length));
        }
        assert!(
            content == expected,
            "the file differs from what was written"
        );
    }
}
