//! A block device's I/O counters, as the kernel keeps them in
//! `/sys/block/<device>/stat` (the kernel's Documentation/block/stat.rst).
//! They count from the moment the device was made: a loop device keeps
//! counting across the attaches of different files, so what one volume
//! did is the difference from a reading taken at its attach.

use std::path::Path;

use serde::Serialize;

use crate::kernel::sysfs::{read_attribute, read_number};

/// The stat file counts sectors of 512 bytes, whatever the device's own
/// logical sector size.
const STAT_SECTOR: u64 = 512;

/// What went through a device since it was set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IoCounters {
    /// Read requests completed.
    pub reads: u64,
    pub read_bytes: u64,
    /// Milliseconds read requests spent, summed over the requests.
    pub read_time_ms: u64,
    pub writes: u64,
    pub written_bytes: u64,
    pub write_time_ms: u64,
    pub discards: u64,
    pub discarded_bytes: u64,
    pub discard_time_ms: u64,
    /// Requests issued to the driver and not yet completed.
    pub in_flight: u64,
    /// Milliseconds during which at least one request was in flight.
    pub io_time_ms: u64,
}

/// The stat file of `/dev/loopN` as the kernel writes it.
pub fn loop_stat_text(number: u32) -> Option<String> {
    read_attribute(Path::new(&format!("/sys/block/loop{number}/stat"))).ok()
}

/// The disk sequence number of `/dev/loopN`, which the kernel changes at
/// every attach and detach (5.15 and later): it tells one attach of a
/// device from the next.
pub fn loop_disk_sequence(number: u32) -> Option<u64> {
    read_number(Path::new(&format!("/sys/block/loop{number}/diskseq")))
}

impl IoCounters {
    /// The counters of `/dev/loopN` since the device was made (not since
    /// its attach: the kernel keeps counting across attaches); None when
    /// it has none to give (not set up, or a kernel too old to count
    /// discards, before 4.18).
    pub fn of_loop_device(number: u32) -> Option<Self> {
        Self::parse(&loop_stat_text(number)?)
    }

    /// What was counted since `base` was read from the same device; None
    /// when a request or sector count went down (then `base` is of another
    /// device). The kernel prints the millisecond fields as 32-bit numbers,
    /// which wrap after 2^32 ms of summed request time: those are
    /// subtracted modulo 2^32.
    pub fn since(&self, base: &IoCounters) -> Option<Self> {
        let ms = |now: u64, then: u64| u64::from((now as u32).wrapping_sub(then as u32));
        Some(Self {
            reads: self.reads.checked_sub(base.reads)?,
            read_bytes: self.read_bytes.checked_sub(base.read_bytes)?,
            read_time_ms: ms(self.read_time_ms, base.read_time_ms),
            writes: self.writes.checked_sub(base.writes)?,
            written_bytes: self.written_bytes.checked_sub(base.written_bytes)?,
            write_time_ms: ms(self.write_time_ms, base.write_time_ms),
            discards: self.discards.checked_sub(base.discards)?,
            discarded_bytes: self.discarded_bytes.checked_sub(base.discarded_bytes)?,
            discard_time_ms: ms(self.discard_time_ms, base.discard_time_ms),
            // Now, not a count.
            in_flight: self.in_flight,
            io_time_ms: ms(self.io_time_ms, base.io_time_ms),
        })
    }

    /// Fields in the kernel's order: reads, merged reads, sectors read,
    /// read ms, writes, merged, sectors, ms, in flight, io ms, weighted
    /// ms, discards, merged, sectors, ms, then flushes (5.5 and later).
    pub fn parse(text: &str) -> Option<Self> {
        let fields: Vec<u64> = text
            .split_ascii_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        if fields.len() < 15 {
            return None;
        }
        Some(Self {
            reads: fields[0],
            read_bytes: fields[2].saturating_mul(STAT_SECTOR),
            read_time_ms: fields[3],
            writes: fields[4],
            written_bytes: fields[6].saturating_mul(STAT_SECTOR),
            write_time_ms: fields[7],
            in_flight: fields[8],
            io_time_ms: fields[9],
            discards: fields[11],
            discarded_bytes: fields[13].saturating_mul(STAT_SECTOR),
            discard_time_ms: fields[14],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_in_the_kernels_order() {
        // A loop device after a few writes and an fstrim (kernel 6.1).
        let text = "     120        3     9536       41      812       17   196608     2210        1     2397     2251        4        0   131072        9        6        0\n";
        assert_eq!(
            IoCounters::parse(text),
            Some(IoCounters {
                reads: 120,
                read_bytes: 9536 * 512,
                read_time_ms: 41,
                writes: 812,
                written_bytes: 196_608 * 512,
                write_time_ms: 2210,
                in_flight: 1,
                io_time_ms: 2397,
                discards: 4,
                discarded_bytes: 131_072 * 512,
                discard_time_ms: 9,
            })
        );
    }

    #[test]
    fn counts_since_a_base_and_refuses_a_base_of_another_device() {
        let base = IoCounters::parse("10 0 80 5 20 0 160 7 0 9 0 1 0 8 1 0 0").unwrap();
        let now = IoCounters::parse("15 0 120 6 40 0 400 9 2 12 0 1 0 8 1 0 0").unwrap();
        let since = now.since(&base).unwrap();
        assert_eq!((since.reads, since.read_bytes), (5, 40 * 512));
        assert_eq!((since.writes, since.written_bytes), (20, 240 * 512));
        assert_eq!(
            (since.in_flight, since.io_time_ms, since.discards),
            (2, 3, 0)
        );
        assert_eq!(base.since(&now), None);
        // A millisecond field that wrapped at 2^32 still counts forward.
        let before_wrap =
            IoCounters::parse("10 0 80 4294967290 20 0 160 7 0 9 0 1 0 8 1 0 0").unwrap();
        let after_wrap = IoCounters::parse("11 0 88 4 20 0 160 7 0 9 0 1 0 8 1 0 0").unwrap();
        assert_eq!(
            after_wrap.since(&before_wrap).map(|c| c.read_time_ms),
            Some(10)
        );
    }

    #[test]
    fn a_kernel_without_discard_counters_gives_none() {
        let eleven = "1 0 8 0 2 0 16 0 0 0 0\n";
        assert_eq!(IoCounters::parse(eleven), None);
        assert_eq!(
            IoCounters::parse("1 2 x 4 5 6 7 8 9 10 11 12 13 14 15"),
            None
        );
        assert_eq!(IoCounters::parse(""), None);
    }

    #[test]
    fn reads_a_real_devices_counters() {
        // Any block device of this machine will do.
        let device = std::fs::read_dir("/sys/block")
            .unwrap()
            .next()
            .expect("a block device in /sys/block")
            .unwrap();
        let text = read_attribute(&device.path().join("stat")).unwrap();
        let counters = IoCounters::parse(&text);
        assert!(counters.is_some(), "{text:?}");
    }
}
