//! A throw-away `dbus-daemon` on a private unix socket.

use std::fs;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The bus lives as long as the value: Drop kills the daemon, so a failed
/// test cannot leave one behind.
pub struct PrivateBus {
    daemon: Child,
    pub address: String,
    dir: tempfile::TempDir,
}

impl PrivateBus {
    pub fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("sv-bus-")
            .tempdir()
            .expect("temporary directory for the bus");
        let socket = dir.path().join("system_bus_socket");
        let config = dir.path().join("bus.conf");
        let log = dir.path().join("bus.log");
        // Like the system bus, minus its policy: everyone may own and send
        // anything (the tests run as root and are the only clients).
        fs::write(
            &config,
            format!(
                r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_type="method_call"/>
    <allow send_type="method_return"/>
    <allow send_type="signal"/>
    <allow send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="signal"/>
    <allow receive_type="error"/>
  </policy>
</busconfig>
"#,
                socket.display()
            ),
        )
        .expect("writing the bus configuration");
        let mut daemon = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", config.display()))
            .args(["--nofork", "--nopidfile", "--nosyslog", "--print-address"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // Its complaints (it cannot raise its fd limit in a container)
            // go to a file, read only if it fails to start.
            .stderr(fs::File::create(&log).expect("creating the bus log"))
            .spawn()
            .expect("starting dbus-daemon (package dbus)");
        // The daemon prints its address once it listens; EOF means it died.
        let mut address = String::new();
        let stdout = daemon.stdout.take().expect("dbus-daemon stdout");
        BufReader::new(stdout)
            .read_line(&mut address)
            .expect("reading the bus address");
        let address = address.trim().to_string();
        if address.is_empty() {
            let _ = daemon.kill();
            let _ = daemon.wait();
            panic!(
                "dbus-daemon exited without printing its address: {}",
                fs::read_to_string(&log).unwrap_or_default()
            );
        }
        Self {
            daemon,
            address,
            dir,
        }
    }
}

impl Drop for PrivateBus {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}
