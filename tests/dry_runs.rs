//! What a dry run says (issue 25, item 12): what the real run *would* do,
//! in the conditional for every command (not "created" for a volume that
//! does not exist), no UUID it invented, and `--dry-run` offered only by
//! the commands that change something.

mod common;

use common::Fixture;

fn created(fx: &Fixture) -> String {
    let run = fx.run_ok(&["create", "--size", "16M", "--name", "pg", "--json"]);
    run.json()["uuid"].as_str().expect("a uuid").to_string()
}

#[test]
fn every_dry_run_says_what_it_would_do() {
    needs_root!();
    let fx = Fixture::new();
    let planned = fx.run_ok(&["create", "--size", "16M", "--name", "other", "--dry-run"]);
    assert!(
        planned
            .stdout
            .starts_with("dry run, nothing changed: would create a filesystem volume"),
        "{}",
        planned.stdout
    );
    let uuid = created(&fx);
    for (args, expected) in [
        (&["remove", "pg"][..], "would remove"),
        (&["remove", "pg", "--delete-data"], "and delete"),
        (&["resize", "pg", "--size", "32M"], "would grow"),
        (&["attach", "pg"], "would be attached"),
        (&["detach", "pg"], "is not attached"),
    ] {
        let run = fx.run_ok(&[args, &["--dry-run"]].concat());
        assert!(
            run.stdout.starts_with("dry run, nothing changed: "),
            "{args:?}: {}",
            run.stdout
        );
        assert!(run.stdout.contains(expected), "{args:?}: {}", run.stdout);
        for past in ["removed", "deleted", "grew", "created", "detached "] {
            assert!(
                !run.stdout.contains(past),
                "{args:?} says {past:?} of a dry run: {}",
                run.stdout
            );
        }
    }
    let attached = fx.run_ok(&["attach", "pg"]);
    let detach = fx.run_ok(&["detach", "pg", "--dry-run"]);
    assert!(
        detach.stdout.contains("would detach"),
        "{}\nafter {}",
        detach.stdout,
        attached.stdout
    );
    fx.run_ok(&["detach", &uuid]);
}

#[test]
fn a_dry_run_of_create_reports_no_uuid_it_chose() {
    needs_root!();
    let fx = Fixture::new();
    let run = fx.run_ok(&["create", "--size", "16M", "--dry-run", "--json"]);
    let report = run.json();
    assert!(report["uuid"].is_null(), "{report}");
    assert_eq!(report["path"], "/var/lib/sparse-volume/<uuid>", "{report}");
    let human = fx.run_ok(&["create", "--size", "16M", "--dry-run"]);
    assert!(
        human.stdout.contains("a UUID chosen when it is created"),
        "{}",
        human.stdout
    );
    // A UUID the user chose is the one the real run uses: reported.
    let chosen = common::new_uuid();
    let run = fx.run_ok(&[
        "create",
        "--size",
        "16M",
        "--uuid",
        &chosen,
        "--dry-run",
        "--json",
    ]);
    assert_eq!(run.json()["uuid"], chosen.as_str());
}

#[test]
fn read_only_commands_do_not_offer_a_dry_run() {
    let fx = Fixture::new();
    for command in ["list", "status", "metrics", "pv"] {
        let help = fx.run(&[command, "--help"]);
        assert_eq!(help.code, 0, "{command} --help: {}", help.stderr);
        assert!(
            !help.stdout.contains("--dry-run"),
            "{command} --help offers --dry-run:\n{}",
            help.stdout
        );
    }
    let refused = fx.run(&["list", "--dry-run"]);
    assert_eq!(refused.code, 2, "{}{}", refused.stdout, refused.stderr);
    for command in [
        "create", "remove", "resize", "attach", "detach", "apply", "check",
    ] {
        let help = fx.run(&[command, "--help"]);
        assert!(
            help.stdout.contains("--dry-run"),
            "{command} --help lacks --dry-run:\n{}",
            help.stdout
        );
    }
}
