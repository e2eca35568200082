//! dm-crypt mappings over loop devices, opened and closed by `cryptsetup`
//! (which also waits for udev to finish with the new device), and found
//! again through sysfs: a mapping over `loopN` is one of its `holders/`,
//! with its name in `dm/name`.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::kernel::child_process::run;

/// How a mapping is opened.
#[derive(Debug, Clone, Copy)]
pub struct OpenOptions {
    pub read_only: bool,
    /// Pass the file system's discards down to the loop device (and so
    /// holes to the backing file); they show which blocks are unused.
    pub allow_discards: bool,
}

/// `/dev/mapper/<name>`, the node cryptsetup makes for a mapping.
pub fn mapper_path(name: &str) -> PathBuf {
    Path::new("/dev/mapper").join(name)
}

/// Opens the LUKS2 volume on `device` as `name` with the key in
/// `key_file`.
pub fn open(device: &Path, name: &str, key_file: &Path, options: OpenOptions) -> Result<()> {
    require_device_mapper()?;
    let mut args: Vec<std::ffi::OsString> = vec!["open".into(), "--type".into(), "luks2".into()];
    args.push("--key-file".into());
    args.push(key_file.into());
    if options.read_only {
        args.push("--readonly".into());
    }
    if options.allow_discards {
        args.push("--allow-discards".into());
    }
    args.push(device.into());
    args.push(name.into());
    // cryptsetup's own reason ("No key available with this passphrase")
    // names neither the device nor the key tried.
    run("cryptsetup", args).with_context(|| {
        format!(
            "opening {} as {name} with key file {}",
            device.display(),
            key_file.display()
        )
    })
}

/// Opening the control node loads `dm_mod` where it is a module; a kernel
/// without device-mapper fails here, which cryptsetup would only report as
/// a name "invalid or still in use".
fn require_device_mapper() -> Result<()> {
    const CONTROL: &str = "/dev/mapper/control";
    match fs::OpenOptions::new().read(true).write(true).open(CONTROL) {
        Ok(_) => Ok(()),
        Err(e) => anyhow::bail!(
            "this kernel offers no device-mapper ({CONTROL}: {e}); encrypted volumes need the dm_mod and dm_crypt modules"
        ),
    }
}

/// Closes the mapping `name`; cryptsetup refuses while it is in use
/// (mounted, held), and so does this.
pub fn close(name: &str) -> Result<()> {
    run("cryptsetup", ["close", name])
        .with_context(|| format!("closing {}", mapper_path(name).display()))
}

/// Grows the mapping `name` to the end of the device under it (after that
/// device grew). The key file is given in case the volume key is not in
/// the kernel keyring, where LUKS2 keeps it when it can.
pub fn resize(name: &str, key_file: &Path) -> Result<()> {
    let mut args: Vec<std::ffi::OsString> = vec!["resize".into(), name.into()];
    args.push("--key-file".into());
    args.push(key_file.into());
    run("cryptsetup", args).with_context(|| format!("growing {}", mapper_path(name).display()))
}

/// The kernel name (`dm-3`) of the mapping called `name` that sits on
/// `loopN` or, for a block volume, on its partition `loopNp1`, if one does.
pub fn mapping_on_loop(number: u32, name: &str) -> Option<String> {
    let sys_block = Path::new("/sys/class/block");
    [format!("loop{number}"), format!("loop{number}p1")]
        .iter()
        .filter_map(|device| fs::read_dir(sys_block.join(device).join("holders")).ok())
        .flat_map(|holders| holders.flatten())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .find(|holder| mapping_name(holder).as_deref() == Some(name))
}

/// The name a device-mapper device (`dm-3`) was given when it was made.
pub fn mapping_name(kernel_name: &str) -> Option<String> {
    let text = fs::read_to_string(
        Path::new("/sys/class/block")
            .join(kernel_name)
            .join("dm/name"),
    )
    .ok()?;
    Some(text.trim().to_string())
}

/// Whether a mapping called `name` exists at all (on any device).
pub fn exists(name: &str) -> bool {
    fs::read_dir("/sys/class/block")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("dm-"))
        .any(|e| mapping_name(&e.file_name().to_string_lossy()).as_deref() == Some(name))
}
