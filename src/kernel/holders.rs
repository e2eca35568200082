//! Who uses a loop device: mounts of it or its partitions, swap, and
//! stacked devices (device mapper, md) listed in sysfs `holders/`.
//! The kernel's `O_EXCL` refusal tells *that* a device is busy; this tells
//! the operator *why*.

use std::fs;
use std::path::{Path, PathBuf};

/// `maj:min` of `loopN` and of each of its partitions, with their names.
fn device_numbers(number: u32) -> Vec<(String, String)> {
    let name = format!("loop{number}");
    let sys = Path::new("/sys/block").join(&name);
    let mut found = Vec::new();
    if let Ok(dev) = fs::read_to_string(sys.join("dev")) {
        found.push((name.clone(), dev.trim().to_string()));
    }
    if let Ok(listing) = fs::read_dir(&sys) {
        for entry in listing.flatten() {
            let part = entry.file_name().to_string_lossy().into_owned();
            if part.starts_with(&name) {
                if let Ok(dev) = fs::read_to_string(entry.path().join("dev")) {
                    found.push((part, dev.trim().to_string()));
                }
            }
        }
    }
    found
}

/// Where `loopN` or one of its partitions is mounted: (device name,
/// mount point), as this process's mount namespace sees it.
pub fn mounts_of_loop(number: u32) -> Vec<(String, PathBuf)> {
    mounts_of(&device_numbers(number))
        .into_iter()
        .map(|(name, _, point)| (name, point))
        .collect()
}

/// Where a device without partitions (a dm-crypt mapping's `dm-3`) is
/// mounted, as this process's mount namespace sees it.
pub fn mounts_of_device(name: &str) -> Vec<PathBuf> {
    let Ok(dev) = fs::read_to_string(Path::new("/sys/class/block").join(name).join("dev")) else {
        return Vec::new();
    };
    mounts_of(&[(name.to_string(), dev.trim().to_string())])
        .into_iter()
        .map(|(_, _, point)| point)
        .collect()
}

/// [`mounts_of_loop`] with each mounted device's number (`st_rdev`, as
/// `stat` of a file on it reports `st_dev`) instead of its name.
pub fn mounted_device_numbers_of_loop(number: u32) -> Vec<(u64, PathBuf)> {
    mounts_of(&device_numbers(number))
        .into_iter()
        .filter_map(|(_, dev, point)| {
            let (major, minor) = dev.split_once(':')?;
            Some((
                libc::makedev(major.parse().ok()?, minor.parse().ok()?),
                point,
            ))
        })
        .collect()
}

/// (device name, `maj:min`, mount point) of each mount of `devices`.
fn mounts_of(devices: &[(String, String)]) -> Vec<(String, String, PathBuf)> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts = Vec::new();
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 5 {
            continue;
        }
        if let Some((name, dev)) = devices.iter().find(|(_, dev)| dev == fields[2]) {
            mounts.push((
                name.clone(),
                dev.clone(),
                PathBuf::from(unescape_mount_path(fields[4])),
            ));
        }
    }
    mounts
}

/// One sentence per use, e.g. `/dev/loop3p1 is mounted on /srv/data`.
pub fn users_of_loop(number: u32) -> Vec<String> {
    users_of(&device_numbers(number))
}

/// [`users_of_loop`] for a device without partitions, by its kernel name
/// (a dm-crypt mapping's `dm-3`).
pub fn users_of_device(name: &str) -> Vec<String> {
    let dev = fs::read_to_string(Path::new("/sys/class/block").join(name).join("dev"));
    match dev {
        Ok(dev) => users_of(&[(name.to_string(), dev.trim().to_string())]),
        Err(_) => Vec::new(),
    }
}

fn users_of(devices: &[(String, String)]) -> Vec<String> {
    let mut users: Vec<String> = mounts_of(devices)
        .into_iter()
        .map(|(name, _, point)| format!("/dev/{name} is mounted on {}", point.display()))
        .collect();
    let swaps = fs::read_to_string("/proc/swaps").unwrap_or_default();
    for line in swaps.lines().skip(1) {
        if let Some(path) = line.split_whitespace().next() {
            if devices
                .iter()
                .any(|(name, _)| path == format!("/dev/{name}"))
            {
                users.push(format!("{path} is in use as swap"));
            }
        }
    }
    for (name, _) in devices {
        let holders = Path::new("/sys/class/block").join(name).join("holders");
        for holder in fs::read_dir(holders).into_iter().flatten().flatten() {
            users.push(format!(
                "/dev/{name} is held by {}",
                holder.file_name().to_string_lossy()
            ));
        }
    }
    users
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
pub(crate) fn unescape_mount_path(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let value =
                (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The refusal of a detach while `users` (sentences from
/// [`users_of_loop`], which name the device) hold it.
pub fn in_use(users: &[String]) -> String {
    format!("{}; unmount it first", users.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(unescape_mount_path("/srv/my\\040data"), "/srv/my data");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
        assert_eq!(unescape_mount_path("/end\\04"), "/end\\04");
    }
}
