//! Attribute files of sysfs (and small files of procfs): a value of a few
//! bytes read in one open, one read and one close. `fs::read_to_string`
//! asks for the file's size first and reads again to see the end, which
//! attach and detach would pay for every attribute they look at.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// sysfs attributes are at most a page.
const PAGE: usize = 4096;

/// The text of an attribute file, as the kernel gives it (with its newline).
pub fn read_attribute(path: &Path) -> io::Result<String> {
    let mut file = File::open(path)?;
    let mut buffer = [0u8; PAGE];
    let length = loop {
        match file.read(&mut buffer) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => break other?,
        }
    };
    String::from_utf8(buffer[..length].to_vec())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// An attribute that holds one number.
pub fn read_number<T: std::str::FromStr>(path: &Path) -> Option<T> {
    read_attribute(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_kernel_says() {
        let text = read_attribute(Path::new("/proc/sys/kernel/ostype")).unwrap();
        assert_eq!(text, "Linux\n");
        assert_eq!(
            read_number::<u64>(Path::new("/proc/sys/kernel/pid_max")),
            std::fs::read_to_string("/proc/sys/kernel/pid_max")
                .ok()
                .and_then(|t| t.trim().parse().ok())
        );
        assert!(read_number::<u64>(Path::new("/proc/sys/kernel/ostype")).is_none());
        assert!(read_attribute(Path::new("/nonexistent")).is_err());
    }
}
