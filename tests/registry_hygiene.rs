//! Registry hygiene: files and directories that anyone but root can change
//! are refused (one volume, or all of a directory, never the others);
//! two registry files naming one backing file are reported and never
//! attach it twice; leftovers are found at any depth of a storage root.

mod common;

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use common::{loops_of, new_uuid, Fixture, Run};
use serde_json::Value;

/// `nobody` on Debian; any uid but root's does.
const OTHER_UID: u32 = 65534;

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn findings(run: &Run) -> Vec<Value> {
    run.json()["findings"]
        .as_array()
        .expect("findings")
        .to_vec()
}

fn of_kind<'a>(findings: &'a [Value], kind: &str) -> Vec<&'a Value> {
    findings.iter().filter(|f| f["kind"] == kind).collect()
}

fn uuids_of(finding: &Value) -> Vec<String> {
    let mut uuids: Vec<String> = finding["uuids"]
        .as_array()
        .expect("uuids")
        .iter()
        .map(|u| u.as_str().unwrap().to_string())
        .collect();
    uuids.sort();
    uuids
}

fn sorted(mut items: Vec<String>) -> Vec<String> {
    items.sort();
    items
}

/// Detaches what the fixture's volumes attached (and only that) even when
/// an assertion fails first.
struct Detach<'a>(&'a Fixture, Vec<String>);

impl Drop for Detach<'_> {
    fn drop(&mut self) {
        for uuid in &self.1 {
            let _ = self.0.run(&["detach", uuid]);
        }
    }
}

/// Makes a volume file untrusted in one of the ways an operator could.
fn spoil(fx: &Fixture, uuid: &str, how: &str) {
    let file = fx.registry_file(uuid);
    match how {
        "group-writable" => chmod(&file, 0o664),
        "world-writable" => chmod(&file, 0o646),
        "foreign-owner" => std::os::unix::fs::chown(&file, Some(OTHER_UID), None).unwrap(),
        "symlink" => {
            let target = fx.host("/etc/elsewhere.toml");
            fs::rename(&file, &target).unwrap();
            symlink(&target, &file).unwrap();
        }
        _ => unreachable!(),
    }
}

#[test]
fn an_untrusted_volume_file_is_refused_and_the_others_keep_working() {
    needs_root!();
    for (how, says) in [
        ("group-writable", "mode 0664"),
        ("world-writable", "mode 0646"),
        ("foreign-owner", "owner uid 65534"),
        ("symlink", "refused: a symbolic link"),
    ] {
        let fx = Fixture::new();
        let (good, bad) = (new_uuid(), new_uuid());
        for uuid in [&good, &bad] {
            fx.run_ok(&["create", "--size", "16M", "--uuid", uuid]);
        }
        spoil(&fx, &bad, how);
        let _detach = Detach(&fx, vec![good.clone(), bad.clone()]);
        let file = fx.registry_file(&bad).display().to_string();

        let refused = fx.run(&["attach", &bad]);
        assert_eq!(refused.code, 1, "{how}: {}", refused.stdout);
        let line = refused.stderr.trim_end();
        assert_eq!(line.lines().count(), 1, "{how}: {line}");
        assert!(line.contains(&file) && line.contains(says), "{how}: {line}");
        if how != "symlink" {
            assert!(
                line.contains(&format!("chown root: {file}; chmod go-w {file}")),
                "{how}: {line}"
            );
        }
        assert!(loops_of(&fx.backing(&bad)).is_empty(), "{how}: attached");
        fx.run_ok(&["attach", &good]);
        assert_eq!(loops_of(&fx.backing(&good)).len(), 1);

        let status = fx.run(&["status", &bad]);
        assert_eq!(status.code, 1, "{how}");
        assert!(status.stderr.contains(says), "{how}: {}", status.stderr);

        let list = fx.run(&["list", "--json"]);
        assert_eq!(list.code, 1, "{how}: a refused file must fail the listing");
        let listed = list.json();
        assert_eq!(listed["volumes"].as_array().unwrap().len(), 1, "{how}");
        assert_eq!(listed["volumes"][0]["uuid"], good.as_str());
        assert_eq!(listed["errors"][0]["file"], file.as_str());

        let check = fx.run(&["check", "--json"]);
        assert_eq!(check.code, 1, "{how}: {}", check.stdout);
        let all = findings(&check);
        let untrusted = of_kind(&all, "untrusted-registry-file");
        assert_eq!(untrusted.len(), 1, "{how}: {}", check.stdout);
        assert_eq!(untrusted[0]["path"], file.as_str());
        assert!(untrusted[0]["message"].as_str().unwrap().contains(says));
        // Its backing file is still somebody's data, not a stray file.
        assert!(
            how == "symlink" || of_kind(&all, "unregistered-file").is_empty(),
            "{how}: {}",
            check.stdout
        );
    }
}

/// Issue 24 item 2: a name lookup read every registry file that did not
/// validate with a plain read, so a FIFO hung it (and a create holding the
/// registry lock) and a link to /dev/zero read until memory ran out.
#[test]
fn a_name_lookup_reads_registry_files_only_through_the_trusted_reader() {
    needs_root!();
    for planted in ["fifo", "link to /dev/zero"] {
        let fx = Fixture::new();
        let named = new_uuid();
        fx.run_ok(&[
            "create", "--size", "16M", "--name", "data", "--uuid", &named,
        ]);
        let file = fx.registry_file(&new_uuid());
        match planted {
            "fifo" => {
                nix::unistd::mkfifo(&file, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
            }
            _ => symlink("/dev/zero", &file).unwrap(),
        }

        let status = fx.run_within(20, &["status", "data", "--json"]);
        assert_ne!(status.code, 124, "{planted}: status NAME hung");
        assert_eq!(
            status.json()["uuid"],
            named.as_str(),
            "{planted}: {}",
            status.stderr
        );

        let other = new_uuid();
        let create = fx.run_within(
            20,
            &[
                "create", "--size", "16M", "--name", "other", "--uuid", &other,
            ],
        );
        assert_ne!(create.code, 124, "{planted}: create --name hung");
        assert_eq!(create.code, 0, "{planted}: {}", create.stderr);
        // The same create again finds the named volume, not a new one.
        let again = fx.run_within(20, &["create", "--size", "16M", "--name", "data", "--json"]);
        assert_eq!(again.code, 0, "{planted}: {}", again.stderr);
        assert_eq!(again.json()["uuid"], named.as_str(), "{planted}");
        assert_eq!(again.json()["changed"], false, "{planted}");
    }
}

#[test]
fn a_writable_registry_directory_refuses_every_volume_with_one_finding() {
    needs_root!();
    let fx = Fixture::new();
    let (a, b) = (new_uuid(), new_uuid());
    for uuid in [&a, &b] {
        fx.run_ok(&["create", "--size", "16M", "--uuid", uuid]);
    }
    let dir = fx.host("/etc/sparse-volume/volumes.d");
    chmod(&dir, 0o777);
    let _detach = Detach(&fx, vec![a.clone(), b.clone()]);

    for uuid in [&a, &b] {
        let refused = fx.run(&["attach", uuid]);
        assert_eq!(refused.code, 1);
        assert!(
            refused
                .stderr
                .contains(&format!("its directory {} is writable", dir.display()))
                && refused
                    .stderr
                    .contains(&format!("chmod go-w {}", dir.display())),
            "{}",
            refused.stderr
        );
        assert!(loops_of(&fx.backing(uuid)).is_empty());
    }
    // Nothing may be registered there either, and nothing is made.
    let c = new_uuid();
    let create = fx.run(&["create", "--size", "16M", "--uuid", &c]);
    assert_eq!(create.code, 1, "{}", create.stdout);
    assert!(create.stderr.contains("mode 0777"), "{}", create.stderr);
    assert!(!fx.backing(&c).exists() && !fx.registry_file(&c).exists());

    let check = fx.run(&["check", "--json"]);
    assert_eq!(check.code, 1);
    let all = findings(&check);
    let directory = of_kind(&all, "untrusted-registry-directory");
    assert_eq!(directory.len(), 1, "{}", check.stdout);
    assert_eq!(directory[0]["path"], dir.display().to_string().as_str());
    assert_eq!(uuids_of(directory[0]), sorted(vec![a.clone(), b.clone()]));
    assert!(
        of_kind(&all, "invalid-registry-file").is_empty()
            && of_kind(&all, "untrusted-registry-file").is_empty(),
        "one finding for the directory, not one per file: {}",
        check.stdout
    );

    chmod(&dir, 0o755);
    fx.run_ok(&["attach", &a]);
}

#[test]
fn a_writable_config_is_reported_and_volumes_still_attach() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.run_ok(&["create", "--size", "16M", "--uuid", &uuid]);
    let config = fx.host("/etc/sparse-volume/config.toml");
    fs::write(&config, "overcommit_ratio = 2.0\n").unwrap();
    chmod(&config, 0o666);
    let _detach = Detach(&fx, vec![uuid.clone()]);

    let check = fx.run(&["check", "--json"]);
    assert_eq!(check.code, 1);
    let all = findings(&check);
    let untrusted = of_kind(&all, "untrusted-config");
    assert_eq!(untrusted.len(), 1, "{}", check.stdout);
    let message = untrusted[0]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("chmod go-w {}", config.display()))
            && message.contains("mode 0666")
            && message.contains("built-in defaults"),
        "{message}"
    );
    // Like an invalid config: provisioning refuses, attaching goes on.
    let create = fx.run(&["create", "--size", "16M"]);
    assert_eq!(create.code, 1);
    assert!(
        create.stderr.contains(&config.display().to_string()),
        "{}",
        create.stderr
    );
    fx.run_ok(&["attach", &uuid]);
    assert_eq!(loops_of(&fx.backing(&uuid)).len(), 1);
}

#[test]
fn two_registry_files_for_one_backing_file_are_reported_and_attach_once() {
    needs_root!();
    let fx = Fixture::new();
    let owner = new_uuid();
    fx.run_ok(&["create", "--size", "16M", "--uuid", &owner]);
    let file = fx.backing(&owner);
    // Same path in a second registry file, and a hard link (another path,
    // same device and inode) in a third.
    let same_path = new_uuid();
    let alias = new_uuid();
    let alias_path = fx.host("/var/lib/sparse-volume/alias");
    fs::hard_link(&file, &alias_path).unwrap();
    let size = fs::metadata(&file).unwrap().len();
    for (uuid, path) in [
        (&same_path, fx.logical_backing(&owner)),
        (&alias, "/var/lib/sparse-volume/alias".to_string()),
    ] {
        fs::write(
            fx.registry_file(uuid),
            format!("uuid = \"{uuid}\"\npath = \"{path}\"\nsize = {size}\nmode = \"filesystem\"\n"),
        )
        .unwrap();
    }
    let _detach = Detach(&fx, vec![owner.clone()]);

    let check = fx.run(&["check", "--json"]);
    let all = findings(&check);
    let duplicates = of_kind(&all, "duplicate-backing-file");
    assert_eq!(duplicates.len(), 1, "{}", check.stdout);
    assert_eq!(
        uuids_of(duplicates[0]),
        sorted(vec![owner.clone(), same_path.clone(), alias.clone()])
    );
    let message = duplicates[0]["message"].as_str().unwrap();
    for uuid in [&owner, &same_path, &alias] {
        assert!(message.contains(uuid.as_str()), "{message}");
    }

    // The impostors first, then the owner, then the impostors again:
    // only the owner attaches, and the file has exactly one device.
    let mut refusals = 0;
    for uuid in [&same_path, &alias, &owner, &same_path, &alias] {
        let run = fx.run(&["attach", uuid, "--json"]);
        if uuid == &owner {
            assert_eq!(run.code, 0, "{}", run.stderr);
        } else {
            assert_eq!(run.code, 1, "{uuid} attached another volume's file");
            assert!(run.stderr.contains(&owner), "{}", run.stderr);
            refusals += 1;
        }
    }
    assert_eq!(refusals, 4);
    assert_eq!(loops_of(&file).len(), 1, "{:?}", loops_of(&file));

    // Taking an impostor down must not take the owner's device with it.
    for uuid in [&same_path, &alias] {
        let run = fx.run_ok(&["detach", uuid, "--json"]);
        assert_eq!(run.json()["changed"], false, "{uuid}: {}", run.stdout);
        assert_eq!(loops_of(&file).len(), 1, "detach {uuid} detached the owner");
    }
    fx.run_ok(&["remove", &alias]);
    assert_eq!(
        loops_of(&file).len(),
        1,
        "remove of an impostor detached the owner"
    );
}

/// A create killed at `point`, for a file at `logical`.
fn interrupted_create(fx: &Fixture, uuid: &str, logical: &str, point: &str) {
    let status = fx
        .command(&["create", "--size", "16M", "--uuid", uuid, "--path", logical])
        .env(sparse_volume::hooks::CRASH_ENV, point)
        .status()
        .unwrap();
    assert!(!status.success(), "create was not killed at {point}");
}

#[test]
fn leftovers_are_found_at_any_depth_of_a_storage_root() {
    needs_root!();
    let fx = Fixture::new();
    let deep = "/var/lib/sparse-volume/pods/team-a";
    // A registered volume down there is nobody's leftover.
    let registered = new_uuid();
    fx.run_ok(&[
        "create",
        "--size",
        "16M",
        "--uuid",
        &registered,
        "--path",
        &format!("{deep}/{registered}"),
    ]);
    // Killed before the rename: a hidden `.<name>.creating` file.
    let hidden = new_uuid();
    interrupted_create(
        &fx,
        &hidden,
        &format!("{deep}/{hidden}"),
        "create:before-rename",
    );
    let hidden_path = fx.host(&format!("{deep}/.{hidden}.creating"));
    assert!(hidden_path.exists());
    // Killed before the registry write: the final name, with the mark.
    let marked = new_uuid();
    interrupted_create(
        &fx,
        &marked,
        &format!("{deep}/{marked}"),
        "create:before-registry",
    );
    let marked_path = fx.host(&format!("{deep}/{marked}"));
    assert!(marked_path.exists() && !fx.registry_file(&marked).exists());
    // Data nobody registered (kept on purpose, or forgotten).
    let orphan = fx.host(&format!("{deep}/orphan.img"));
    fs::write(&orphan, b"data").unwrap();
    // Outside, reached only through a symbolic link: not ours to judge.
    let outside = fx.host("/srv/other");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("stray.img"), b"x").unwrap();
    symlink(&outside, fx.host("/var/lib/sparse-volume/link")).unwrap();

    let check = fx.run(&["check", "--json"]);
    let all = findings(&check);
    let paths = |kind: &str| -> Vec<String> {
        sorted(
            of_kind(&all, kind)
                .iter()
                .map(|f| f["path"].as_str().unwrap().to_string())
                .collect(),
        )
    };
    assert_eq!(
        paths("interrupted-create"),
        sorted(vec![
            hidden_path.display().to_string(),
            marked_path.display().to_string()
        ]),
        "{}",
        check.stdout
    );
    assert_eq!(
        paths("unregistered-file"),
        vec![orphan.display().to_string()],
        "{}",
        check.stdout
    );

    let repaired = fx.run(&["check", "--repair", "--json"]);
    assert!(
        !hidden_path.exists() && !marked_path.exists(),
        "{}",
        repaired.stdout
    );
    assert!(orphan.exists(), "an unregistered file is never deleted");
    assert!(outside.join("stray.img").exists());
    assert!(fx.host(&format!("{deep}/{registered}")).exists());
    let again = findings(&fx.run(&["check", "--json"]));
    assert!(of_kind(&again, "interrupted-create").is_empty());
}
