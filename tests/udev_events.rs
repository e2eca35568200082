//! What udev sees of an attach and a detach, without udev: the inotify
//! event its watch rule reacts to, and the uevents on the kernel's
//! netlink socket.
//!
//! * udev watches `/dev/loopN` for `IN_CLOSE_WRITE` (60-block.rules
//!   `OPTIONS+="watch"`) and answers with `BLKRRPART`, which drops and
//!   re-adds a block volume's partition under a consumer that already
//!   started on it: no writer may close a `/dev/loopN` node.
//! * Kernels before "loop: properly send KOBJ_CHANGED uevent for disk
//!   device" send no uevent for a bind without partitions, so attach
//!   sends a synthetic "change" itself (it carries `SYNTH_UUID`, which
//!   the kernel's own events do not), or udev never makes the by-uuid link.
//!
//! One test per file: another test opening loop devices in parallel
//! would blur the inotify count.

mod common;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use common::Fixture;

/// An inotify watch on `/dev` for closes of files opened for writing:
/// the directory watch names every node closed in it.
struct CloseWatch {
    fd: OwnedFd,
}

impl CloseWatch {
    fn on_dev() -> Self {
        // SAFETY: plain syscalls; the returned descriptor is owned below.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let dev = CString::new("/dev").unwrap();
        // SAFETY: valid descriptor and NUL-terminated path.
        let watch =
            unsafe { libc::inotify_add_watch(fd.as_raw_fd(), dev.as_ptr(), libc::IN_CLOSE_WRITE) };
        assert!(
            watch >= 0,
            "inotify_add_watch: {}",
            std::io::Error::last_os_error()
        );
        Self { fd }
    }

    /// Names closed after a write-open since the last call.
    fn closed(&self) -> Vec<String> {
        let mut names = Vec::new();
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: the buffer is valid for its length.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                )
            };
            if n <= 0 {
                return names;
            }
            let mut offset = 0;
            let header = std::mem::size_of::<libc::inotify_event>();
            while offset + header <= n as usize {
                // SAFETY: the kernel wrote a whole event at this offset.
                let event: libc::inotify_event =
                    unsafe { std::ptr::read_unaligned(buffer[offset..].as_ptr().cast()) };
                let name = &buffer[offset + header..offset + header + event.len as usize];
                let name = name.split(|b| *b == 0).next().unwrap_or_default();
                names.push(String::from_utf8_lossy(name).into_owned());
                offset += header + event.len as usize;
            }
        }
    }
}

/// The kernel's uevents (the netlink group udev listens to).
struct Uevents {
    fd: OwnedFd,
}

impl Uevents {
    fn listen() -> Self {
        // SAFETY: plain syscalls; the descriptor is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_KOBJECT_UEVENT,
            )
        };
        assert!(
            fd >= 0,
            "netlink socket: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_nl is plain data; zero is a valid start.
        let mut address: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        address.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        address.nl_groups = 1;
        // SAFETY: the address is valid for its size.
        let bound = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                std::ptr::addr_of!(address).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        assert_eq!(
            bound,
            0,
            "binding the uevent socket: {}",
            std::io::Error::last_os_error()
        );
        Self { fd }
    }

    /// Every uevent received within `wait`, as its KEY=VALUE fields.
    fn collect(&self, wait: Duration) -> Vec<Vec<String>> {
        let deadline = Instant::now() + wait;
        let mut events = Vec::new();
        let mut buffer = vec![0u8; 16 * 1024];
        while Instant::now() < deadline {
            // SAFETY: the buffer is valid for its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                    0,
                )
            };
            if n <= 0 {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            events.push(
                buffer[..n as usize]
                    .split(|b| *b == 0)
                    .map(|field| String::from_utf8_lossy(field).into_owned())
                    .collect(),
            );
        }
        events
    }
}

fn device_of(run: &common::Run) -> String {
    run.json()["device"]
        .as_str()
        .unwrap_or_else(|| panic!("no device: {}", run.stdout))
        .to_string()
}

#[test]
fn udev_sees_one_synthetic_change_and_no_writer_close() {
    needs_root!();
    let fx = Fixture::new();
    let filesystem = common::new_uuid();
    fx.make_ext4(&filesystem);
    fx.register(&filesystem, "filesystem", "fs_type = \"ext4\"\n");
    let block = common::new_uuid();
    fx.make_gpt(&block);
    fx.register(&block, "block", "");

    let watch = CloseWatch::on_dev();
    let uevents = Uevents::listen();
    let fs_device = device_of(&fx.run_ok(&["attach", &filesystem, "--json"]));
    let events = uevents.collect(Duration::from_millis(500));
    let block_device = device_of(&fx.run_ok(&["attach", &block, "--json"]));
    fx.run_ok(&["detach", &filesystem]);
    fx.run_ok(&["detach", &block]);

    let ours = [fs_device.as_str(), block_device.as_str()];
    let closed: Vec<String> = watch
        .closed()
        .into_iter()
        .filter(|name| ours.iter().any(|d| d.trim_start_matches("/dev/") == name))
        .collect();
    eprintln!("writer closes of {ours:?} seen by a /dev watch: {closed:?}");
    assert_eq!(
        closed,
        Vec::<String>::new(),
        "a writable /dev/loopN was closed: udev would re-read its partition table"
    );

    let name = fs_device.trim_start_matches("/dev/");
    let synthetic: Vec<&Vec<String>> = events
        .iter()
        .filter(|fields| {
            fields.iter().any(|f| f == "ACTION=change")
                && fields.iter().any(|f| *f == format!("DEVNAME={name}"))
                && fields.iter().any(|f| f.starts_with("SYNTH_UUID="))
        })
        .collect();
    eprintln!(
        "uevents for {name} after attach: {:?}",
        events
            .iter()
            .filter(|f| f.iter().any(|x| *x == format!("DEVNAME={name}")))
            .map(|f| f[0].clone())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        synthetic.len(),
        1,
        "expected one synthetic change for {name} (udev's cue on kernels that send none): {events:?}"
    );
}
