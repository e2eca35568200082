//! `sparse-volume pv`: the PersistentVolume manifests of real registered
//! volumes (ext4, xfs, block; read-only; disabled; an odd size), checked
//! by an independent validator (tests/k8s/validate.py: PyYAML and
//! jsonschema against the Kubernetes v1.37.0 schema plus the API
//! server's rules the schema lacks) and against the registry file as
//! TOML, never by matching our own strings.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use common::{new_uuid, test_python, tool, Fixture, Run, SIZE};

const VALIDATOR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/k8s/validate.py");
const UUID_LABEL: &str = "sparse-volume/uuid";
const NAME_ANNOTATION: &str = "sparse-volume/name";
/// Everything YAML could misread in a plain or badly quoted scalar, text
/// beyond ASCII, and U+2028/U+FEFF, which YAML 1.1 readers take for a
/// line break and a byte-order mark. (The registry refuses control
/// characters, so no newline can reach a name.)
const ODD_NAME: &str = " --- \"quoted\": a #b & *c !d |e >f {g} [h] 'i' \\j % @k `l` yes null 0x1F Zürich データ 💾 \u{2028}\u{FEFF} end ";

struct Volume {
    uuid: String,
    mode: &'static str,
    read_only: bool,
    enabled: bool,
}

/// Five volumes made the way operators make them: four with `create`,
/// one registered by hand with a size that is no whole KiB.
struct Volumes {
    fixture: Fixture,
    all: Vec<Volume>,
}

impl Volumes {
    fn new() -> Self {
        let fixture = Fixture::new();
        let mut all = Vec::new();
        let mut create = |args: &[&str], mode: &'static str, read_only: bool, enabled: bool| {
            let uuid = new_uuid();
            let mut command = vec!["create", "--uuid", &uuid];
            command.extend_from_slice(args);
            fixture.run_ok(&command);
            if read_only {
                set_flag(&fixture, &uuid, "read_only", true);
            }
            if !enabled {
                set_flag(&fixture, &uuid, "enabled", false);
            }
            all.push(Volume {
                uuid,
                mode,
                read_only,
                enabled,
            });
        };
        create(&["--size", "64M", "--name", ODD_NAME], "ext4", false, true);
        create(
            &["--size", "320M", "--fs", "xfs", "--name", "read-only xfs"],
            "xfs",
            true,
            true,
        );
        create(&["--size", "1G", "--mode", "block"], "block", true, true);
        create(&["--size", "1536M"], "ext4", false, false);
        // 64 MiB and three sectors: only plain bytes say that exactly.
        let uuid = new_uuid();
        let path = fixture.backing(&uuid);
        fixture.sparse_file_of(&path, SIZE + 1536);
        let path = path.to_str().expect("UTF-8 path");
        tool("sgdisk", &["-n", "1:0:0", "-u", &format!("1:{uuid}"), path]);
        fixture.register(&uuid, "block", "");
        all.push(Volume {
            uuid,
            mode: "block",
            read_only: false,
            enabled: true,
        });
        Self { fixture, all }
    }

    fn enabled(&self) -> BTreeSet<String> {
        self.all
            .iter()
            .filter(|v| v.enabled)
            .map(|v| v.uuid.clone())
            .collect()
    }
}

/// Flips a flag in the registry file as an operator would, by editing it.
fn set_flag(fixture: &Fixture, uuid: &str, key: &str, value: bool) {
    let file = fixture.registry_file(uuid);
    let text = fs::read_to_string(&file).expect("registry file");
    let from = format!("{key} = {}", !value);
    assert!(text.contains(&from), "{from:?} not in {text}");
    fs::write(&file, text.replace(&from, &format!("{key} = {value}"))).expect("registry file");
}

fn registry(fixture: &Fixture, uuid: &str) -> toml::Table {
    fs::read_to_string(fixture.registry_file(uuid))
        .expect("registry file")
        .parse()
        .expect("registry file is TOML")
}

/// The validator's verdict: the objects it read, or what it rejected.
fn validate(form: &str, text: &str) -> Result<Vec<Value>, String> {
    let mut child = Command::new(test_python())
        .args([VALIDATOR, form])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running the validator");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("feeding the validator");
    let output = child.wait_with_output().expect("running the validator");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    match output.status.code() {
        Some(0) => Ok(serde_json::from_slice(&output.stdout).expect("validator output")),
        Some(1) if !stderr.is_empty() => Err(stderr),
        _ => panic!("the validator itself failed: {stderr}"),
    }
}

fn valid(form: &str, run: &Run) -> Vec<Value> {
    validate(form, &run.stdout)
        .unwrap_or_else(|e| panic!("rejected:\n{e}\nmanifest:\n{}", run.stdout))
}

/// Bytes of a Kubernetes quantity, only for the exact forms (an integer,
/// optionally with a binary suffix): anything rounded fails the test.
fn quantity_bytes(quantity: &str) -> u64 {
    let split = quantity
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(quantity.len());
    let (digits, suffix) = quantity.split_at(split);
    let shift = match suffix {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        "Ti" => 40,
        "Pi" => 50,
        "Ei" => 60,
        other => panic!("{quantity:?}: suffix {other:?} is not exact"),
    };
    let number: u64 = digits.parse().expect("quantity digits");
    number.checked_shl(shift).expect("quantity in range")
}

fn host_name() -> String {
    tool("uname", &["-n"]).trim().to_lowercase()
}

/// Every field that follows from the registry, checked against the
/// registry file itself.
fn check_against_registry(fixture: &Fixture, volume: &Volume, pv: &Value, node: &str) {
    let entry = registry(fixture, &volume.uuid);
    let uuid = &volume.uuid;
    assert_eq!(pv["apiVersion"], "v1");
    assert_eq!(pv["kind"], "PersistentVolume");
    assert_eq!(pv["metadata"]["name"], format!("sparse-volume-{uuid}"));
    assert_eq!(pv["metadata"]["labels"][UUID_LABEL], *uuid);
    match entry.get("name") {
        Some(name) => assert_eq!(
            pv["metadata"]["annotations"][NAME_ANNOTATION].as_str(),
            name.as_str()
        ),
        None => assert!(pv["metadata"]["annotations"].get(NAME_ANNOTATION).is_none()),
    }
    let spec = &pv["spec"];
    let size = entry["size"].as_integer().expect("size") as u64;
    let storage = spec["capacity"]["storage"].as_str().expect("capacity");
    assert_eq!(quantity_bytes(storage), size, "capacity {storage}");
    let local = spec["local"].as_object().expect("local");
    match entry["mode"].as_str().expect("mode") {
        "filesystem" => {
            assert_eq!(spec["volumeMode"], "Filesystem");
            assert_eq!(local["path"], format!("/dev/disk/by-uuid/{uuid}"));
            let fs_type = entry.get("fs_type").and_then(|t| t.as_str());
            assert_eq!(local["fsType"].as_str(), fs_type);
            assert_eq!(fs_type, Some(volume.mode));
        }
        "block" => {
            assert_eq!(volume.mode, "block");
            assert_eq!(spec["volumeMode"], "Block");
            assert_eq!(local["path"], format!("/dev/disk/by-partuuid/{uuid}"));
            assert!(local.get("fsType").is_none(), "{local:?}");
        }
        other => panic!("mode {other}"),
    }
    // Absent means false (the documented default of the registry).
    let read_only = entry
        .get("read_only")
        .is_some_and(|v| v.as_bool() == Some(true));
    assert_eq!(read_only, volume.read_only);
    if read_only {
        assert_eq!(spec["accessModes"], json!(["ReadOnlyMany"]));
    } else {
        assert_eq!(spec["accessModes"], json!(["ReadWriteOnce"]));
    }
    // Block volumes are never mounted; a read-only file system must be.
    let expected_options = (read_only && volume.mode != "block").then(|| json!(["ro"]));
    assert_eq!(spec.get("mountOptions").cloned(), expected_options);
    assert_eq!(
        spec["nodeAffinity"],
        json!({ "required": { "nodeSelectorTerms": [{ "matchExpressions": [{
            "key": "kubernetes.io/hostname", "operator": "In", "values": [node],
        }]}]}})
    );
}

#[test]
fn every_manifest_passes_the_kubernetes_schema_and_says_what_the_registry_says() {
    needs_root!();
    let volumes = Volumes::new();
    let fixture = &volumes.fixture;
    let node = host_name();
    for volume in &volumes.all {
        let yaml = fixture.run_ok(&["pv", &volume.uuid]);
        let json = fixture.run_ok(&["pv", &volume.uuid, "--output", "json"]);
        let from_yaml = valid("yaml", &yaml);
        let from_json = valid("json", &json);
        assert_eq!(from_yaml.len(), 1, "{}", yaml.stdout);
        // PyYAML reads back exactly what the JSON says: no scalar, the odd
        // name included, was misquoted.
        assert_eq!(from_yaml, from_json);
        check_against_registry(fixture, volume, &from_yaml[0], &node);
        assert_eq!(from_yaml[0]["spec"]["storageClassName"], "local-storage");
        assert_eq!(
            from_yaml[0]["spec"]["persistentVolumeReclaimPolicy"],
            "Retain"
        );
        if !volume.enabled {
            assert!(yaml.stderr.contains("disabled"), "{}", yaml.stderr);
        }
    }
}

#[test]
fn all_lists_exactly_the_enabled_volumes() {
    needs_root!();
    let volumes = Volumes::new();
    let fixture = &volumes.fixture;
    let node = host_name();
    // A file that does not read is left out, with a warning naming it;
    // the generator skips it at boot too.
    let broken = fixture.host("/etc/sparse-volume/volumes.d/broken.toml");
    fs::write(&broken, "uuid = \"not closed\n").expect("broken entry");
    let yaml = fixture.run_ok(&["pv", "--all"]);
    assert!(yaml.stderr.contains("broken.toml"), "{}", yaml.stderr);
    let json = fixture.run_ok(&["--json", "pv", "--all"]);
    let from_yaml = valid("yaml", &yaml);
    let from_json = valid("json", &json);
    assert_eq!(from_yaml, from_json);
    let list = json.json();
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(list["kind"], "List");
    assert_eq!(
        list["items"].as_array().map(Vec::len),
        Some(from_json.len())
    );
    let listed: Vec<String> = from_yaml
        .iter()
        .map(|pv| {
            pv["metadata"]["labels"][UUID_LABEL]
                .as_str()
                .expect("label")
                .to_string()
        })
        .collect();
    let unique: BTreeSet<String> = listed.iter().cloned().collect();
    assert_eq!(unique.len(), listed.len(), "listed twice: {listed:?}");
    assert_eq!(unique, volumes.enabled());
    assert_eq!(listed.len(), 4);
    for pv in &from_yaml {
        let uuid = pv["metadata"]["labels"][UUID_LABEL]
            .as_str()
            .expect("label");
        let volume = volumes.all.iter().find(|v| v.uuid == uuid).expect("known");
        check_against_registry(fixture, volume, pv, &node);
    }
}

#[test]
fn no_enabled_volume_means_no_documents() {
    needs_root!();
    let fixture = Fixture::new();
    let empty = fixture.run_ok(&["pv", "--all"]);
    assert_eq!(empty.stdout, "");
    let uuid = new_uuid();
    fixture.run_ok(&[
        "create", "--uuid", &uuid, "--size", "64M", "--mode", "block",
    ]);
    set_flag(&fixture, &uuid, "enabled", false);
    let yaml = fixture.run_ok(&["pv", "--all"]);
    assert_eq!(yaml.stdout, "");
    assert_eq!(valid("yaml", &yaml), Vec::<Value>::new());
    let json = fixture.run_ok(&["pv", "--all", "--output", "json"]);
    assert_eq!(valid("json", &json), Vec::<Value>::new());
    assert_eq!(json.json()["items"], json!([]));
    assert_eq!(json.json()["kind"], "List");
}

#[test]
fn options_reach_the_manifest() {
    needs_root!();
    let fixture = Fixture::new();
    let uuid = new_uuid();
    fixture.run_ok(&["create", "--uuid", &uuid, "--size", "10G"]);
    let run = fixture.run_ok(&[
        "pv",
        &uuid,
        "--node",
        "worker-7.example.com",
        "--storage-class",
        "fast-local",
        "--reclaim",
        "delete",
    ]);
    let pv = &valid("yaml", &run)[0];
    let spec = &pv["spec"];
    assert_eq!(spec["storageClassName"], "fast-local");
    assert_eq!(spec["persistentVolumeReclaimPolicy"], "Delete");
    assert_eq!(spec["capacity"]["storage"], "10Gi");
    assert_eq!(
        spec["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"],
        json!(["worker-7.example.com"])
    );
    // No class at all is a choice too: claims then ask for "".
    let run = fixture.run_ok(&["pv", &uuid, "--storage-class", "", "--json"]);
    assert_eq!(valid("json", &run)[0]["spec"]["storageClassName"], "");
}

/// Runs `pv` in a UTS namespace of its own whose host name is `name`.
fn pv_on_host(fixture: &Fixture, name: &str, uuid: &str) -> Run {
    let output = Command::new("unshare")
        .args([
            "--uts",
            "sh",
            "-c",
            r#"printf '%s' "$1" > /proc/sys/kernel/hostname && shift && exec "$@""#,
            "sh",
            name,
            env!("CARGO_BIN_EXE_sparse-volume"),
            "pv",
            uuid,
        ])
        .env("SPARSE_VOLUME_ROOT", fixture.root.path())
        .env("DBUS_SYSTEM_BUS_ADDRESS", fixture.absent_bus())
        .env_remove("JOURNAL_STREAM")
        .output()
        .expect("running unshare");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[test]
fn the_default_node_is_the_host_name_as_kubelet_registers_it() {
    needs_root!();
    let fixture = Fixture::new();
    let uuid = new_uuid();
    fixture.run_ok(&["create", "--uuid", &uuid, "--size", "64M"]);
    let values = |run: &Run| {
        valid("yaml", run)[0]["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]
            ["matchExpressions"][0]["values"]
            .clone()
    };
    assert_eq!(
        values(&fixture.run_ok(&["pv", &uuid])),
        json!([host_name()])
    );
    // kubelet lowercases the host name; so must the default.
    let run = pv_on_host(&fixture, "Worker-7.Example.COM", &uuid);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(values(&run), json!(["worker-7.example.com"]));
    // A host name no node can have: say so, and what to do.
    let run = pv_on_host(&fixture, "bad_host", &uuid);
    assert_eq!(run.code, 1);
    assert_eq!(run.stdout, "");
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("\"bad_host\"") && run.stderr.contains("--node"),
        "{}",
        run.stderr
    );
}

#[test]
fn errors_are_one_line_and_exit_1() {
    needs_root!();
    let fixture = Fixture::new();
    let uuid = new_uuid();
    fixture.run_ok(&["create", "--uuid", &uuid, "--size", "64M"]);
    let unknown = new_uuid();
    let long = "a".repeat(64);
    let cases: [(&[&str], &str); 6] = [
        (&["pv", &unknown], unknown.as_str()),
        (&["pv", &uuid, "--node", "Worker_7"], "\"Worker_7\""),
        (&["pv", &uuid, "--node", ""], "--node \"\""),
        (&["pv", &uuid, "--node", &long], "63"),
        (&["pv", "--all", "--node=-node"], "\"-node\""),
        (
            &["pv", &uuid, "--storage-class", "Fast Local"],
            "\"Fast Local\"",
        ),
    ];
    for (args, named) in cases {
        let run = fixture.run(args);
        assert_eq!(run.code, 1, "{args:?}: {}", run.stderr);
        assert_eq!(run.stdout, "", "{args:?}");
        assert_eq!(run.stderr.lines().count(), 1, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(named), "{args:?}: {}", run.stderr);
    }
    let run = fixture.run(&["pv", &unknown]);
    assert!(run.stderr.contains("not registered"), "{}", run.stderr);
}

/// A registry directory others can write to makes every entry untrusted:
/// that is an error, not an empty list that would read as "no volumes".
#[test]
fn an_untrusted_registry_is_an_error_not_an_empty_list() {
    needs_root!();
    let fixture = Fixture::new();
    let uuid = new_uuid();
    fixture.run_ok(&["create", "--uuid", &uuid, "--size", "64M"]);
    let volumes_dir = fixture.host("/etc/sparse-volume/volumes.d");
    fs::set_permissions(&volumes_dir, fs::Permissions::from_mode(0o777)).expect("chmod");
    for args in [&["pv", "--all"][..], &["pv", &uuid]] {
        let run = fixture.run(args);
        assert_eq!(run.code, 1, "{args:?}: {}", run.stderr);
        assert_eq!(run.stdout, "", "{args:?}");
        assert!(run.stderr.contains("volumes.d"), "{args:?}: {}", run.stderr);
    }
}

/// The validator is only worth something if it can say no: each defect
/// below is rejected, by the schema that should catch it, while the
/// manifest it was made from passes.
#[test]
fn the_validator_rejects_broken_manifests() {
    needs_root!();
    let fixture = Fixture::new();
    let uuid = new_uuid();
    fixture.run_ok(&["create", "--uuid", &uuid, "--size", "64M"]);
    let yaml = fixture.run_ok(&["pv", &uuid]);
    let good = valid("json", &fixture.run_ok(&["pv", &uuid, "--json"])).remove(0);
    valid("yaml", &yaml);
    const SCHEMA: &str = "[kubernetes v1.37.0 schema]";
    const RULES: &str = "[api-server rules]";
    type Breakage = fn(&mut Value);
    let breakages: [(&str, Breakage, &str); 10] = [
        (
            "unknown top-level field",
            |pv| pv["metdata"] = json!({}),
            SCHEMA,
        ),
        (
            "typo in local",
            |pv| {
                let fs_type = pv["spec"]["local"]["fsType"].take();
                pv["spec"]["local"]["fstype"] = fs_type;
            },
            SCHEMA,
        ),
        (
            "unknown spec field",
            |pv| pv["spec"]["readOnly"] = json!(true),
            SCHEMA,
        ),
        (
            "accessModes not a list",
            |pv| pv["spec"]["accessModes"] = json!("ReadWriteOnce"),
            SCHEMA,
        ),
        (
            "volumeMode Blok",
            |pv| pv["spec"]["volumeMode"] = json!("Blok"),
            RULES,
        ),
        (
            "capacity not a quantity",
            |pv| pv["spec"]["capacity"]["storage"] = json!("64 MiB"),
            RULES,
        ),
        (
            "local without nodeAffinity",
            |pv| {
                pv["spec"]
                    .as_object_mut()
                    .expect("spec")
                    .remove("nodeAffinity");
            },
            RULES,
        ),
        (
            "name not a DNS subdomain",
            |pv| pv["metadata"]["name"] = json!("Sparse_Volume"),
            RULES,
        ),
        (
            "label value too long",
            |pv| pv["metadata"]["labels"][UUID_LABEL] = json!("x".repeat(64)),
            RULES,
        ),
        (
            "reclaim policy unknown",
            |pv| pv["spec"]["persistentVolumeReclaimPolicy"] = json!("Keep"),
            RULES,
        ),
    ];
    for (what, breakage, caught_by) in breakages {
        let mut broken = good.clone();
        breakage(&mut broken);
        assert_ne!(broken, good, "{what}: nothing changed");
        let error = validate("json", &broken.to_string()).expect_err(what);
        assert!(error.contains(caught_by), "{what}: {error}");
    }
    // The YAML path is held to the same rules.
    let broken = yaml.stdout.replace("\"Filesystem\"", "\"Blok\"");
    assert_ne!(broken, yaml.stdout);
    let error = validate("yaml", &broken).expect_err("Blok in YAML");
    assert!(error.contains("Blok") && error.contains(RULES), "{error}");
}
