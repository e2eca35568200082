//! Named points where tests make a kernel call fail the way an older or
//! different kernel would, so that the fallbacks behind them run on any
//! machine. `SPARSE_VOLUME_FAULT=<name>[*<times>][,…]` makes the point
//! `<name>` fail (the first `<times>` times, or always); nothing else
//! changes. Like the crash points, the hook costs one environment lookup.

use std::collections::HashMap;
use std::sync::Mutex;

pub const ENV: &str = "SPARSE_VOLUME_FAULT";

/// `LOOP_CONFIGURE` is unknown (kernels before 5.8): `EINVAL`.
pub const CONFIGURE_UNSUPPORTED: &str = "configure-unsupported";
/// `LOOP_CONFIGURE` refuses direct I/O for this backing file: `EINVAL`.
pub const DIRECT_IO_REFUSED: &str = "direct-io-refused";
/// Another process bound the device first: `EBUSY`.
pub const DEVICE_TAKEN: &str = "device-taken";
/// The kernel ignores the read-only and partition-scan flags it was given.
pub const FLAGS_IGNORED: &str = "flags-ignored";

static FIRED: Mutex<Option<HashMap<String, u32>>> = Mutex::new(None);

/// Whether the point `name` fails this time.
pub fn fails(name: &str) -> bool {
    let Ok(spec) = std::env::var(ENV) else {
        return false;
    };
    let Some(limit) = limit_for(&spec, name) else {
        return false;
    };
    let Ok(mut fired) = FIRED.lock() else {
        return false;
    };
    let count = fired
        .get_or_insert_with(HashMap::new)
        .entry(name.to_string())
        .or_insert(0);
    *count += 1;
    limit.is_none_or(|limit| *count <= limit)
}

/// `Some(None)`: always; `Some(Some(n))`: the first n times; `None`: not named.
fn limit_for(spec: &str, name: &str) -> Option<Option<u32>> {
    spec.split(',').find_map(|item| {
        let (point, times) = match item.trim().split_once('*') {
            Some((point, times)) => (point, times.parse().ok()),
            None => (item.trim(), None),
        };
        (point == name).then_some(times)
    })
}

#[cfg(test)]
mod tests {
    use super::limit_for;

    #[test]
    fn spec_names_points_and_counts() {
        assert_eq!(limit_for("a,b*2", "a"), Some(None));
        assert_eq!(limit_for("a,b*2", "b"), Some(Some(2)));
        assert_eq!(limit_for("a, b*2", "c"), None);
        assert_eq!(limit_for("ab", "a"), None);
    }
}
