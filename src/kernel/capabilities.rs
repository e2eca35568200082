//! The capabilities this process holds, as the kernel reports them: what
//! an operation needs is known before anything is changed (in a container
//! root often lacks CAP_SYS_RESOURCE or CAP_SYS_ADMIN).

use std::fs;

/// What `EXT4_IOC_RESIZE_FS` (resize2fs on a mounted ext4) asks for.
pub const CAP_SYS_RESOURCE: u32 = 24;
/// What mounting (xfs grows only while mounted) asks for.
pub const CAP_SYS_ADMIN: u32 = 21;

/// Whether `capability` is in this process's effective set; true when the
/// set cannot be read, so that a refusal is never made on a guess.
pub fn has_effective(capability: u32) -> bool {
    fs::read_to_string("/proc/self/status").map_or(true, |status| holds(&status, capability))
}

/// Reads the `CapEff:` line of a `/proc/PID/status` text.
fn holds(status: &str, capability: u32) -> bool {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_none_or(|set| set & (1 << capability) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_effective_set_is_read_bit_by_bit() {
        // Root in a container without CAP_SYS_RESOURCE (this project's
        // build machines are one).
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001fffeffffff\n";
        assert!(holds(status, CAP_SYS_ADMIN));
        assert!(!holds(status, CAP_SYS_RESOURCE));
        assert!(!holds("CapEff:\t0000000000000000\n", CAP_SYS_ADMIN));
        // Unreadable: no refusal made on a guess.
        assert!(holds("Name:\tx\n", CAP_SYS_RESOURCE));
    }
}
