//! The emergency switch on the kernel command line, as `attach` and
//! `detach` see it: real loop devices, `/proc/cmdline` read below the test
//! root (the generator's side is in generator/tests/golden.rs).

mod common;

use std::fs;

use common::{loops_of, new_uuid, Fixture};

fn set_cmdline(fx: &Fixture, cmdline: &str) {
    let path = fx.host("/proc/cmdline");
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, cmdline).unwrap();
}

/// exit 1, one line naming the volume and the switch, nothing bound.
fn assert_skipped(fx: &Fixture, uuid: &str, switch: &str, file: &std::path::Path) {
    let run = fx.run(&["attach", uuid]);
    assert_eq!(run.code, 1, "attach should be refused: {}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(run.stderr.contains(uuid), "{}", run.stderr);
    assert!(
        run.stderr
            .contains(&format!("{switch} on the kernel command line")),
        "the switch is not named: {}",
        run.stderr
    );
    assert!(
        run.stderr.contains("reboot without"),
        "no way out named: {}",
        run.stderr
    );
    assert!(
        loops_of(file).is_empty(),
        "{uuid} was attached although skipped"
    );
}

#[test]
fn skip_refuses_the_listed_volumes_only() {
    needs_root!();
    let fx = Fixture::new();
    let (skipped, other, also_skipped) = (new_uuid(), new_uuid(), new_uuid());
    let skipped_file = fx.make_ext4(&skipped);
    let other_file = fx.make_ext4(&other);
    let also_file = fx.make_gpt(&also_skipped);
    fx.register(&skipped, "filesystem", "");
    fx.register(&other, "filesystem", "");
    fx.register(&also_skipped, "block", "");
    // Upper case, a bad entry, a second word and quotes: as the generator
    // parses it.
    set_cmdline(
        &fx,
        &format!(
            "root=/dev/vda1 ro \"sparse_volume.skip={},bogus\" sparse-volume.skip={also_skipped}\n",
            skipped.to_uppercase()
        ),
    );

    assert_skipped(&fx, &skipped, "sparse_volume.skip=", &skipped_file);
    assert_skipped(&fx, &also_skipped, "sparse_volume.skip=", &also_file);
    let attached = fx.run_ok(&["attach", &other, "--json"]).json();
    assert_eq!(
        loops_of(&other_file),
        vec![attached["device"].as_str().unwrap().to_string()]
    );
    fx.run_ok(&["detach", &other]);

    // Without the switch (the reboot), the same volume attaches.
    fs::remove_file(fx.host("/proc/cmdline")).unwrap();
    fx.run_ok(&["attach", &skipped]);
    assert_eq!(loops_of(&skipped_file).len(), 1);
    fx.run_ok(&["detach", &skipped]);
}

#[test]
fn off_refuses_every_volume_and_the_last_word_wins() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let file = fx.make_ext4(&uuid);
    fx.register(&uuid, "filesystem", "");

    set_cmdline(&fx, "quiet sparse_volume=on sparse_volume=off\n");
    assert_skipped(&fx, &uuid, "sparse_volume=off", &file);

    set_cmdline(&fx, "quiet sparse_volume=off sparse_volume=on\n");
    fx.run_ok(&["attach", &uuid]);
    assert_eq!(loops_of(&file).len(), 1);
    fx.run_ok(&["detach", &uuid]);
}

#[test]
fn detach_still_works_under_the_switch() {
    needs_root!();
    // The switch keeps a volume out of the boot; it must never keep the
    // operator from taking one down.
    let fx = Fixture::new();
    let uuid = new_uuid();
    let file = fx.make_ext4(&uuid);
    fx.register(&uuid, "filesystem", "");
    fx.run_ok(&["attach", &uuid]);
    assert_eq!(loops_of(&file).len(), 1);

    set_cmdline(&fx, &format!("sparse_volume.skip={uuid}"));
    let detached = fx.run_ok(&["detach", &uuid, "--json"]).json();
    assert_eq!(detached["changed"], true);
    assert!(loops_of(&file).is_empty());
}

#[test]
fn check_reports_a_skipped_volume_and_repair_leaves_it_detached() {
    needs_root!();
    // Recovery: boot with the switch, fix, `check --repair`. The repair
    // must not attach what the operator kept out of this boot.
    let fx = Fixture::new();
    let (skipped, other) = (new_uuid(), new_uuid());
    let skipped_file = fx.make_ext4(&skipped);
    let other_file = fx.make_ext4(&other);
    fx.register(&skipped, "filesystem", "");
    fx.register(&other, "filesystem", "");
    set_cmdline(&fx, &format!("sparse_volume.skip={skipped}"));

    let run = fx.run(&["check", "--repair", "--json"]);
    let report = run.json();
    let findings = report["findings"].as_array().unwrap();
    let skipped_findings: Vec<_> = findings
        .iter()
        .filter(|f| f["kind"] == "skipped-by-kernel-cmdline")
        .collect();
    assert_eq!(skipped_findings.len(), 1, "{}", run.stdout);
    assert_eq!(skipped_findings[0]["uuid"], skipped.as_str());
    assert_eq!(skipped_findings[0]["severity"], "warning");
    assert_eq!(skipped_findings[0]["repaired"], false);
    assert_eq!(run.code, 0, "a skip is no error: {}", run.stdout);
    assert!(
        loops_of(&skipped_file).is_empty(),
        "repair attached a skipped volume"
    );
    assert_eq!(
        loops_of(&other_file).len(),
        1,
        "repair did not attach the other volume"
    );
    fx.run_ok(&["detach", &other]);
}
