//! Running a tool (mkfs, resize2fs, e2fsck, xfs_growfs) as a child that
//! dies with its caller, and keeping the line of its output that says why
//! it failed.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

use anyhow::Result;

/// Runs a tool; on failure the error carries the line that says why.
pub fn run<I, S>(program: &str, args: I) -> Result<()>
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    let mut command = tool_command(program);
    command.args(args.into_iter().map(Into::into));
    run_command(program, command, &[0])
}

/// Runs a tool that reads a secret on its standard input (never on its
/// command line, which every user of the machine can read in `/proc`).
pub fn run_with_input<I, S>(program: &str, args: I, input: &[u8]) -> Result<()>
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    use std::io::Write;
    use std::process::Stdio;

    let mut command = tool_command(program);
    command
        .args(args.into_iter().map(Into::into))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .map_err(|error| anyhow::Error::new(error).context(format!("running {program}")))?;
    // A tool that exits before reading all of it closes the pipe: its
    // exit status then says why, so the write's own error is not the news.
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input);
    }
    let output = child
        .wait_with_output()
        .map_err(|error| anyhow::Error::new(error).context(format!("waiting for {program}")))?;
    if output.status.success() {
        return Ok(());
    }
    let finished = Finished {
        program: program.to_string(),
        status: output.status,
        reason: failure_reason(
            program,
            &String::from_utf8_lossy(&output.stderr),
            &String::from_utf8_lossy(&output.stdout),
        ),
    };
    Err(finished.failure())
}

/// A command for `program` that dies with its caller.
pub fn tool_command(program: &str) -> Command {
    let mut command = Command::new(program);
    dies_with_caller(&mut command);
    command
}

/// Runs a command made by [`tool_command`]; a failure names its reason.
pub fn run_command(program: &str, command: Command, success: &[i32]) -> Result<()> {
    let finished = finish(program, command)?;
    if finished.code().is_some_and(|code| success.contains(&code)) {
        return Ok(());
    }
    Err(finished.failure())
}

/// How a tool ended.
pub struct Finished {
    program: String,
    status: std::process::ExitStatus,
    reason: String,
}

impl Finished {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    pub fn failure(&self) -> anyhow::Error {
        anyhow::anyhow!("{} failed ({}): {}", self.program, self.status, self.reason)
    }
}

/// Runs a command made by [`tool_command`] to its end, whatever its exit
/// status; only a command that could not be started is an error.
pub fn finish(program: &str, mut command: Command) -> Result<Finished> {
    let output = command.output().map_err(|error| {
        let hint = if error.kind() == std::io::ErrorKind::NotFound {
            " (is it installed?)"
        } else {
            ""
        };
        anyhow::Error::new(error).context(format!("running {program}{hint}"))
    })?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    Ok(Finished {
        program: program.to_string(),
        status: output.status,
        reason: failure_reason(program, &stderr, &stdout),
    })
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

/// The e2fsprogs tools put their reason on a line of its own that starts
/// with their name; mkfs.xfs puts it on the line before its usage text
/// ("Filesystem must be larger than 300MB.", then "Usage: mkfs.xfs" and
/// forty lines of options). Failing both, the last thing a tool printed is
/// the best guess.
fn failure_reason(program: &str, stderr: &str, stdout: &str) -> String {
    let prefix = format!("{program}:");
    let last_line = |text: &str| {
        text.lines()
            .rfind(|l| !l.trim().is_empty())
            .map(|l| l.trim().to_string())
    };
    let before_usage = stderr
        .split_once("Usage:")
        .and_then(|(before, _)| last_line(before));
    stderr
        .lines()
        .find(|l| l.trim_start().starts_with(&prefix))
        .map(|l| l.trim().to_string())
        .or(before_usage)
        .or_else(|| last_line(stderr))
        .or_else(|| last_line(stdout))
        .unwrap_or_else(|| "no output".to_string())
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
        let xfs = "Filesystem must be larger than 300MB.\nUsage: mkfs.xfs\n/* blocksize */\t\t[-b size=num]\n<value> is xxx (512 byte blocks).\n";
        assert_eq!(
            failure_reason("mkfs.xfs", xfs, ""),
            "Filesystem must be larger than 300MB."
        );
        assert_eq!(failure_reason("x", "", "out\n"), "out");
        assert_eq!(failure_reason("x", "", ""), "no output");
    }
}
