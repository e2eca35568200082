//! Running the file system tools: mkfs at create, growing at resize.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use uuid::Uuid;

use crate::registry::FsType;

/// Runs a tool; on failure the error carries the line that says why.
pub fn run<I, S>(program: &str, args: I) -> Result<()>
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    run_accepting(program, args, &[0])
}

/// [`run`] for a tool with more than one exit status that means success.
fn run_accepting<I, S>(program: &str, args: I, success: &[i32]) -> Result<()>
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let mut command = Command::new(program);
    command.args(&args);
    dies_with_caller(&mut command);
    let output = command
        .output()
        .with_context(|| format!("running {program} (is it installed?)"))?;
    if !output
        .status
        .code()
        .is_some_and(|code| success.contains(&code))
    {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        bail!(
            "{program} failed ({}): {}",
            output.status,
            failure_reason(program, &stderr, &stdout)
        );
    }
    Ok(())
}

/// The tools work on a volume under the caller's volume lock, which they
/// do not inherit: if the caller is killed, they must not go on working
/// on it unlocked.
fn dies_with_caller(command: &mut Command) {
    let caller = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only
    // makes async-signal-safe system calls (prctl, getppid, _exit).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The caller may have died before the prctl took effect.
            if u32::try_from(libc::getppid()).ok() != Some(caller) {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// The e2fsprogs and xfsprogs tools put their reason on a line of its own
/// that starts with their name, before any usage text; failing that, the
/// last thing a tool printed is the best guess.
fn failure_reason(program: &str, stderr: &str, stdout: &str) -> String {
    let prefix = format!("{program}:");
    let last_line = |text: &str| {
        text.lines()
            .rfind(|l| !l.trim().is_empty())
            .map(|l| l.trim().to_string())
    };
    stderr
        .lines()
        .find(|l| l.trim_start().starts_with(&prefix))
        .map(|l| l.trim().to_string())
        .or_else(|| last_line(stderr))
        .or_else(|| last_line(stdout))
        .unwrap_or_else(|| "no output".to_string())
}

/// Makes a file system whose UUID is the volume UUID, for a device with
/// `sector_size`-byte logical sectors. Discards are off: on a file they
/// punch holes, which would undo a preallocation. ext4 gets 4 KiB blocks
/// even when small: volumes are made to grow, current kernels refuse to
/// grow 1 KiB-block ext4 online, and 4 KiB blocks mount on 512- and
/// 4096-byte sectors alike. xfs is told the sector size: on a file it
/// cannot see the device it will be mounted from.
pub fn make_filesystem(
    target: &Path,
    fs_type: FsType,
    uuid: Uuid,
    sector_size: u32,
    options: &[String],
) -> Result<()> {
    let uuid = uuid.hyphenated().to_string();
    let (program, mut args): (&str, Vec<OsString>) = match fs_type {
        FsType::Ext4 => (
            "mkfs.ext4",
            ["-q", "-F", "-b", "4096", "-E", "nodiscard", "-U", &uuid]
                .map(OsString::from)
                .into(),
        ),
        FsType::Xfs => (
            "mkfs.xfs",
            [
                "-q",
                "-K",
                "-m",
                &format!("uuid={uuid}"),
                "-s",
                &format!("size={sector_size}"),
            ]
            .map(OsString::from)
            .into(),
        ),
    };
    args.extend(options.iter().map(OsString::from));
    args.push(target.as_os_str().to_owned());
    run(program, args)
}

/// Grows an ext4 file system to fill its device or image file. resize2fs
/// works online on a mounted file system; offline it insists on a fresh
/// fsck first.
pub fn grow_ext4(target: &Path, mounted: bool) -> Result<()> {
    if !mounted {
        // Exit status 1 is e2fsck's "errors corrected": the file system is
        // fine, as after a resize that was killed part way.
        run_accepting(
            "e2fsck",
            [OsString::from("-f"), "-p".into(), target.into()],
            &[0, 1],
        )?;
    }
    run("resize2fs", [target.as_os_str()])
}

/// xfs grows only while mounted, addressed by its mount point.
pub fn grow_xfs(mount_point: &Path) -> Result<()> {
    run("xfs_growfs", [mount_point.as_os_str()])
}

#[cfg(test)]
mod tests {
    use super::failure_reason;

    #[test]
    fn the_reason_is_the_tool_s_own_line_not_its_usage() {
        let stderr = "mkfs.ext4: invalid option -- 'Z'\nUsage: mkfs.ext4 [-c|-l filename]\n\t[-jnqvDFSV] device [blocks-count]\n";
        assert_eq!(
            failure_reason("mkfs.ext4", stderr, ""),
            "mkfs.ext4: invalid option -- 'Z'"
        );
        assert_eq!(failure_reason("mkfs.xfs", "first\nlast\n\n", ""), "last");
        assert_eq!(failure_reason("x", "", "out\n"), "out");
        assert_eq!(failure_reason("x", "", ""), "no output");
    }
}
