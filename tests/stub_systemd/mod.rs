//! A private system bus with a stand-in for systemd on it, for testing the
//! D-Bus client without touching the host's systemd.
//!
//! [`PrivateBus`] is a real `dbus-daemon` on a socket in a temporary
//! directory. [`StubSystemd`] is a zbus service in the test process that
//! owns `org.freedesktop.systemd1` there and answers the Manager calls the
//! client makes, like systemd 252 does (object paths, error names, the
//! `JobRemoved(uoss)` signal after the reply), with a job result the test
//! chooses. It records every call so tests can check their order.

#![allow(dead_code)]

mod bus;
mod service;

pub use bus::PrivateBus;
pub use service::StubSystemd;
