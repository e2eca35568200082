//! A volume is listed with its clones and snapshots: each clone right
//! after the volume it was cloned from (and its own clones after it),
//! indented under it in the table.

use std::collections::{HashMap, HashSet};

use crate::engine::inspect::VolumeInfo;

/// `volumes` in their order, each followed by its clones. A clone whose
/// origin is not listed stays where it was; origins that loop (edited by
/// hand) cannot lose or repeat a volume.
pub fn clones_after_origins(volumes: Vec<VolumeInfo>) -> Vec<VolumeInfo> {
    let position: HashMap<&str, usize> = volumes
        .iter()
        .enumerate()
        .map(|(i, v)| (v.uuid.as_str(), i))
        .collect();
    let parent = |v: &VolumeInfo| -> Option<usize> {
        let origin = v.origin.as_deref()?;
        position
            .get(origin)
            .copied()
            .filter(|&p| volumes[p].uuid != v.uuid)
    };
    let mut clones: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, v) in volumes.iter().enumerate() {
        if let Some(p) = parent(v) {
            clones.entry(p).or_default().push(i);
        }
    }
    let mut order = Vec::with_capacity(volumes.len());
    let mut placed = HashSet::new();
    let starts = (0..volumes.len())
        .filter(|&i| parent(&volumes[i]).is_none())
        // Members of an origin loop have no start of their own.
        .chain(0..volumes.len());
    for start in starts {
        let mut stack = vec![start];
        while let Some(i) = stack.pop() {
            if !placed.insert(i) {
                continue;
            }
            order.push(i);
            if let Some(children) = clones.get(&i) {
                stack.extend(children.iter().rev());
            }
        }
    }
    let mut slots: Vec<Option<VolumeInfo>> = volumes.into_iter().map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
}

/// How many listed origins stand above each volume (0: none listed).
pub fn depths(volumes: &[VolumeInfo]) -> Vec<usize> {
    let origin_of: HashMap<&str, &str> = volumes
        .iter()
        .filter_map(|v| Some((v.uuid.as_str(), v.origin.as_deref()?)))
        .collect();
    let listed: HashSet<&str> = volumes.iter().map(|v| v.uuid.as_str()).collect();
    volumes
        .iter()
        .map(|v| {
            let mut seen = HashSet::from([v.uuid.as_str()]);
            let mut current = v.uuid.as_str();
            let mut depth = 0;
            while let Some(&origin) = origin_of.get(current) {
                if !listed.contains(origin) || !seen.insert(origin) {
                    break;
                }
                depth += 1;
                current = origin;
            }
            depth
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::inspecting::list::table::tests::volume_info;

    fn listed(pairs: &[(&'static str, Option<&str>)]) -> Vec<VolumeInfo> {
        pairs
            .iter()
            .map(|(uuid, origin)| VolumeInfo {
                origin: origin.map(str::to_string),
                ..volume_info(uuid)
            })
            .collect()
    }

    fn uuids(volumes: &[VolumeInfo]) -> Vec<&str> {
        volumes.iter().map(|v| v.uuid.as_str()).collect()
    }

    #[test]
    fn clones_follow_their_origin_and_loops_lose_nothing() {
        let volumes = listed(&[
            ("c1", Some("a")),
            ("a", None),
            ("b", None),
            ("c2", Some("a")),
            ("c1-1", Some("c1")),
            ("orphan", Some("gone")),
            ("x", Some("y")),
            ("y", Some("x")),
            ("self", Some("self")),
        ]);
        let ordered = clones_after_origins(volumes);
        assert_eq!(
            uuids(&ordered),
            ["a", "c1", "c1-1", "c2", "b", "orphan", "self", "x", "y"]
        );
        assert_eq!(depths(&ordered), [0, 1, 2, 1, 0, 0, 0, 1, 1]);
    }
}
