//! Positioned writes of a new file that go around the page cache
//! (`O_DIRECT`) where the file system and the alignment allow it, on a
//! thread of their own.
//!
//! Why around the page cache: a buffered write of a gigabyte costs the
//! kernel a copy into the page cache whose price, on a virtual machine,
//! swings several times over from one run to the next (fresh page-cache
//! pages fault in the host), and the `fsync` that must follow writes it
//! all again at the end. A direct write costs the disk's own speed, every
//! time, and leaves the `fsync` little but the metadata.
//!
//! Why a thread: a direct write returns when the disk has the data, so
//! the caller, free to read its next chunk meanwhile (from a pipe, say),
//! hands each chunk over and goes on; two chunks in flight at most.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;

use crate::kernel::files::start_write_back;

/// What `O_DIRECT` asks of offsets, lengths and buffer addresses: the
/// logical sector size of the device under the file system, 512 or 4096
/// on every disk we meet (a bigger one answers `EINVAL`, and the writes
/// then go through the page cache).
const ALIGNMENT: usize = 4096;

/// Chunks handed over and not yet written, at most.
const IN_FLIGHT: usize = 2;

/// One chunk to write: `buffer[at..at + length]` at `offset` of the file,
/// placed in `buffer` so that its first block boundary is aligned in
/// memory as it is in the file.
struct Job {
    offset: u64,
    buffer: Vec<u8>,
    at: usize,
    length: usize,
}

pub struct DirectWriter {
    /// `None` once finished.
    jobs: Option<SyncSender<Job>>,
    /// Buffers the writer thread is done with.
    free: Receiver<Vec<u8>>,
    writer: Option<JoinHandle<io::Result<()>>>,
    /// The largest chunk one buffer holds.
    chunk: usize,
}

impl DirectWriter {
    /// Writes into `file` (open for writing); `chunk`: the caller's usual
    /// write (bigger ones are split).
    pub fn new(file: &File, chunk: usize) -> io::Result<Self> {
        let buffered = file.try_clone()?;
        // Through /proc: the same open file's inode, whatever its name does.
        let direct = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(format!("/proc/self/fd/{}", file.as_raw_fd()));
        if let Err(error) = &direct {
            tracing::debug!("writing through the page cache: no O_DIRECT here ({error})");
        }
        let chunk = chunk.max(ALIGNMENT);
        let (jobs, to_write) = mpsc::sync_channel::<Job>(IN_FLIGHT);
        let (give_back, free) = mpsc::channel::<Vec<u8>>();
        for _ in 0..IN_FLIGHT {
            // Room for an unaligned start before the first boundary and
            // for aligning the buffer itself.
            let _ = give_back.send(vec![0u8; chunk + 2 * ALIGNMENT]);
        }
        let writer = std::thread::spawn(move || {
            let mut target = Target {
                buffered,
                direct: direct.ok(),
            };
            for job in to_write {
                target.write(&job)?;
                // Gone only when the caller has stopped: nothing to give to.
                let _ = give_back.send(job.buffer);
            }
            Ok(())
        });
        Ok(Self {
            jobs: Some(jobs),
            free,
            writer: Some(writer),
            chunk,
        })
    }

    /// Hands `data` over to be written at `offset`; an error of an earlier
    /// write shows here or in [`DirectWriter::finish`].
    pub fn write_all_at(&mut self, data: &[u8], offset: u64) -> io::Result<()> {
        let mut done = 0;
        while done < data.len() {
            let length = (data.len() - done).min(self.chunk);
            let at_offset = offset + done as u64;
            let Ok(mut buffer) = self.free.recv() else {
                return Err(self.writer_error());
            };
            let at = buffer.as_ptr().align_offset(ALIGNMENT) + misalignment(at_offset);
            buffer[at..at + length].copy_from_slice(&data[done..done + length]);
            let job = Job {
                offset: at_offset,
                buffer,
                at,
                length,
            };
            let sent = self.jobs.as_ref().map(|jobs| jobs.send(job));
            if !matches!(sent, Some(Ok(()))) {
                return Err(self.writer_error());
            }
            done += length;
        }
        Ok(())
    }

    /// Waits for every write handed over; the first error if one failed.
    pub fn finish(mut self) -> io::Result<()> {
        self.jobs = None;
        match self.writer.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(io::Error::other("the writing thread panicked")),
            None => Ok(()),
        }
    }

    /// Why the writer thread stopped taking chunks.
    fn writer_error(&mut self) -> io::Error {
        self.jobs = None;
        match self.writer.take().map(JoinHandle::join) {
            Some(Ok(Err(error))) => error,
            Some(Err(_)) => io::Error::other("the writing thread panicked"),
            _ => io::Error::other("the writing thread stopped"),
        }
    }
}

impl Drop for DirectWriter {
    /// Never leaves a thread writing behind a caller that gave up.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

fn misalignment(offset: u64) -> usize {
    (offset % ALIGNMENT as u64) as usize
}

/// The writer thread's side: the file twice, buffered and direct.
struct Target {
    buffered: File,
    /// `None` where the file system refuses direct I/O.
    direct: Option<File>,
}

impl Target {
    /// The whole blocks of `job` directly, an unaligned start and end
    /// through the page cache.
    fn write(&mut self, job: &Job) -> io::Result<()> {
        let data = &job.buffer[job.at..job.at + job.length];
        let head = (ALIGNMENT - misalignment(job.offset)) % ALIGNMENT;
        let head = head.min(data.len());
        let middle = (data.len() - head) / ALIGNMENT * ALIGNMENT;
        let (start, rest) = data.split_at(head);
        let (aligned, end) = rest.split_at(middle);
        let aligned_offset = job.offset + head as u64;
        self.write_buffered(start, job.offset)?;
        self.write_direct(aligned, aligned_offset)?;
        self.write_buffered(end, aligned_offset + middle as u64)
    }

    fn write_direct(&mut self, data: &[u8], offset: u64) -> io::Result<()> {
        let Some(direct) = &self.direct else {
            return self.write_buffered(data, offset);
        };
        match direct.write_all_at(data, offset) {
            // Some file systems take direct I/O but buffer it: their
            // write-back starts here as for a buffered write.
            Ok(()) => {
                start_write_back(&self.buffered, offset, data.len());
                Ok(())
            }
            // The file system takes no direct I/O after all, or not at
            // this alignment: the page cache from here on, this chunk
            // again from its start (a short write may have gone before).
            Err(error) if matches!(error.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                tracing::debug!("writing through the page cache from byte {offset}: {error}");
                self.direct = None;
                self.write_buffered(data, offset)
            }
            Err(error) => Err(error),
        }
    }

    fn write_buffered(&self, data: &[u8], offset: u64) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.buffered.write_all_at(data, offset)?;
        // The disk writes while the stream is still read: the fsync at the
        // end finds little left.
        start_write_back(&self.buffered, offset, data.len());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Aligned, unaligned and oversized writes all land where asked, and
    /// the holes between them stay holes of zeros (an ext4 or xfs takes
    /// the direct path, a file system without O_DIRECT the buffered one;
    /// the imports of tests/export_import.rs take it on the test roots).
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
        let mut writer = DirectWriter::new(&file, 8192).expect("a writer");
        let pattern = |seed: u8, length: usize| -> Vec<u8> {
            (0..length)
                .map(|i| seed.wrapping_add((i % 251) as u8))
                .collect()
        };
        // (offset, length): aligned and whole, aligned with a tail,
        // unaligned at both ends across blocks, within one block, and
        // bigger than a buffer.
        let writes = [
            (0u64, 4096usize),
            (8192, 4096 + 100),
            (20_000, 9000),
            (40_000, 50),
            (65_536 + 512, 40_000),
        ];
        for (seed, &(offset, length)) in writes.iter().enumerate() {
            writer
                .write_all_at(&pattern(seed as u8, length), offset)
                .expect("written");
        }
        writer.finish().expect("every write done");
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
