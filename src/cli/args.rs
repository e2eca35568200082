//! The command line, defined once for parsing, man pages and completions.

use std::io::Read;
use std::path::PathBuf;

use clap::builder::{PossibleValue, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum, ValueHint};

use crate::commands::inspecting::pv::{ManifestFormat, PvRequest, Reclaim};
use crate::commands::provisioning::apply::desired::{Desired, State};
use crate::commands::provisioning::clone::CloneRequest;
use crate::commands::provisioning::create::{CreateRequest, EncryptRequest};
use crate::commands::provisioning::import::ImportRequest;
use crate::commands::provisioning::register::{RegisterMode, RegisterRequest};
use crate::volume::id::VolumeId;
use crate::volume::reference::{check_name_as_reference, parse_uuid_any_case, VolumeRef};
use crate::volume::size::parse_size;
use crate::volume::spec::{FsType, ModeKind, SECTOR_SIZES};

#[derive(Debug, Parser)]
#[command(
    name = "sparse-volume",
    version,
    about = "Persistent loop-device volumes on sparse files, brought back at boot by systemd"
)]
pub struct Cli {
    /// Print one JSON object instead of a sentence.
    #[arg(long, global = true)]
    pub json: bool,

    /// More log output on stderr (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a backing file, format or partition it, and register it.
    ///
    /// Never formats an existing file. Repeating the command with the same
    /// spec changes nothing; a different spec for an existing UUID is an
    /// error (use `resize` to grow).
    Create(CreateArgs),
    /// Adopt an existing backing file whose content carries the UUID.
    Register(RegisterArgs),
    /// Write a volume as one stream: a tar (sparse member, holes kept)
    /// with its spec and a checksum, from one instant of it.
    ///
    /// `sparse-volume export U | ssh node2 sparse-volume import` moves a
    /// volume to another node. A volume in use is read from a reflink
    /// taken for the export (frozen for that moment when mounted).
    Export {
        /// The volume: its UUID, its name, the beginning of its UUID (8 or more characters), its loop device or its backing file.
        #[arg(value_name = "VOLUME")]
        volume: VolumeRef,
        /// Write the stream to this file (made new, named once complete)
        /// instead of standard output.
        #[arg(long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Where the storage cannot share extents, freeze a mounted volume
        /// for the whole copy the export is read from.
        #[arg(long)]
        freeze_during_copy: bool,
    },
    /// Make a volume from an `export` stream, its checksum verified first.
    Import(ImportArgs),
    /// Make a new volume whose content is another's at one instant.
    ///
    /// The copy gets an identity of its own (file system UUID, or GPT
    /// GUIDs and partition name). On xfs (reflink) and btrfs storage the
    /// backing file is cloned by reflink (no data copied); elsewhere its
    /// data is copied, holes kept. A mounted source is frozen for the moment of
    /// the copy. `--snapshot` makes a read-only clone that is not attached
    /// at boot.
    Clone(CloneArgs),
    /// Detach and unregister a volume; keeps its data unless asked.
    Remove {
        /// The volume: its UUID, its name, the beginning of its UUID (8 or more characters), its loop device or its backing file.
        #[arg(value_name = "VOLUME")]
        volume: VolumeRef,
        /// Also delete the backing file.
        #[arg(long)]
        delete_data: bool,
        #[command(flatten)]
        dry: DryRun,
    },
    /// Grow a volume: file, loop device, partition and file system.
    Resize {
        /// The volume: its UUID, its name, the beginning of its UUID (8 or more characters), its loop device or its backing file.
        #[arg(value_name = "VOLUME")]
        volume: VolumeRef,
        /// New size (e.g. 20G); never smaller than the current size.
        #[arg(long, value_parser = parse_size_arg, value_hint = ValueHint::Other)]
        size: u64,
        #[command(flatten)]
        dry: DryRun,
    },
    /// Attach a registered volume to a loop device (the unit's ExecStart).
    ///
    /// Reuses the loop device if the backing file is already attached,
    /// verifies the content carries the volume UUID, and waits for the
    /// udev link when udev runs.
    Attach {
        /// The volume: its UUID, its name, the beginning of its UUID (8 or more characters), its loop device or its backing file.
        #[arg(value_name = "VOLUME")]
        volume: VolumeRef,
        #[command(flatten)]
        dry: DryRun,
    },
    /// Detach a volume's loop device (the unit's ExecStop).
    ///
    /// Given by UUID, needs no registry entry; a volume that is not
    /// attached is success.
    Detach {
        /// The volume: its UUID, its name, the beginning of its UUID (8 or more characters), its loop device or its backing file.
        #[arg(value_name = "VOLUME")]
        volume: VolumeRef,
        #[command(flatten)]
        dry: DryRun,
    },
    /// Enable a volume: set its registry flag and reload systemd, so the
    /// generator makes it attach at every boot.
    Enable {
        /// The volume: its UUID, its name, the beginning of its UUID (8 or more characters), its loop device or its backing file.
        #[arg(value_name = "VOLUME")]
        volume: VolumeRef,
        /// Also start its unit now and wait for the result.
        #[arg(long)]
        now: bool,
        #[command(flatten)]
        dry: DryRun,
    },
    /// Disable a volume: clear its registry flag and reload systemd.
    Disable {
        /// The volume: its UUID, its name, the beginning of its UUID (8 or more characters), its loop device or its backing file.
        #[arg(value_name = "VOLUME")]
        volume: VolumeRef,
        /// Also stop its unit now (detaching it) and wait for the result.
        #[arg(long)]
        now: bool,
        #[command(flatten)]
        dry: DryRun,
    },
    /// Start the volume's unit (attach it) and wait for the job result.
    Start {
        /// The volume: its UUID, its name, the beginning of its UUID (8 or more characters), its loop device or its backing file.
        #[arg(value_name = "VOLUME")]
        volume: VolumeRef,
        #[command(flatten)]
        dry: DryRun,
    },
    /// Stop the volume's unit (detach it) and wait for the job result.
    Stop {
        /// The volume: its UUID, its name, the beginning of its UUID (8 or more characters), its loop device or its backing file.
        #[arg(value_name = "VOLUME")]
        volume: VolumeRef,
        #[command(flatten)]
        dry: DryRun,
    },
    /// Every volume at a glance: name, mode, size, allocation, device, state.
    List {
        /// Every column (UUID, enabled flag, I/O since the attach, unit
        /// state, the volume a clone was made from, path), one line per
        /// volume however long.
        #[arg(long)]
        wide: bool,
        /// Only each volume's UUID and name, one per line, read from the
        /// registry alone (for scripts and shell completion).
        #[arg(long, conflicts_with = "wide")]
        names: bool,
    },
    /// One volume in detail (the same fields as `list`).
    Status {
        /// The volume: its UUID, its name, the beginning of its UUID (8 or more characters), its loop device or its backing file.
        #[arg(value_name = "VOLUME")]
        volume: VolumeRef,
    },
    /// Audit the registry against files and loop devices.
    Check {
        /// Fix what is safe to fix (leftovers, duplicates, unattached volumes).
        #[arg(long)]
        repair: bool,
        #[command(flatten)]
        dry: DryRun,
    },
    /// Prometheus metrics: every volume (space, state, I/O since its
    /// attach, file-system errors) and backing file system.
    Metrics {
        /// Write DIR/sparse_volume.prom atomically (node_exporter's textfile
        /// collector) instead of printing; without DIR, the directory named
        /// by `metrics_textfile_directory` in config.toml.
        #[arg(long, value_name = "DIR", num_args = 0..=1)]
        textfile: Option<Option<PathBuf>>,
    },
    /// A Kubernetes local PersistentVolume for a registered volume.
    Pv(PvArgs),
    /// Converge one volume to a desired state (for config management):
    /// create it, grow it, set its flags, start or stop it, or remove it,
    /// doing only what differs. Prints what changed, before and after.
    Apply(ApplyArgs),
}

/// `--dry-run`, offered only by the commands that change something.
#[derive(Debug, Clone, Copy, Args)]
pub struct DryRun {
    /// Run every check of the command and report what it would change,
    /// changing nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// The desired state as flags; `--stdin` reads it as one JSON object or
/// TOML document instead (the same keys, `fs_type` for `--fs`).
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// Read the desired state from stdin (JSON or TOML) instead of flags.
    #[arg(long, conflicts_with_all = [
        "uuid", "name", "state", "size", "mode", "fs_type", "path", "enabled", "read_only",
        "preallocate", "sector_size", "mkfs_options", "delete_data", "now", "clone_of",
        "freeze_during_copy", "replaces_unit", "encrypt", "key_file",
    ])]
    pub stdin: bool,
    /// The volume's UUID (any case); with `--name`, both must agree.
    #[arg(long, value_parser = parse_uuid_any_case, value_hint = ValueHint::Other)]
    pub uuid: Option<VolumeId>,
    /// The volume's name: unique on the node, so it names the volume in
    /// every command as its UUID does.
    #[arg(long, value_parser = parse_name_arg, value_hint = ValueHint::Other)]
    pub name: Option<String>,
    /// `present` makes or keeps the volume; `absent` removes it.
    #[arg(long, value_enum, default_value_t = State::Present)]
    pub state: State,
    /// Size (grown to when larger; never shrunk).
    #[arg(long, value_parser = parse_size_arg, value_hint = ValueHint::Other)]
    pub size: Option<u64>,
    /// `filesystem` (default when creating) or `block`; refused if it
    /// differs from an existing volume's.
    #[arg(long, value_enum)]
    pub mode: Option<ModeKind>,
    /// File system type when creating (default ext4); refused if it
    /// differs from an existing volume's.
    #[arg(long = "fs", value_enum)]
    pub fs_type: Option<FsType>,
    /// Backing file path when creating (default: <first storage
    /// root>/<UUID>); refused if it differs from an existing volume's.
    #[arg(long)]
    pub path: Option<PathBuf>,
    /// Attach at every boot (true) or not (false).
    #[arg(long, value_name = "BOOL")]
    pub enabled: Option<bool>,
    /// Attach the loop device read-only; takes effect at the next attach.
    #[arg(long, value_name = "BOOL")]
    pub read_only: Option<bool>,
    /// Reserve the space (fallocate) when creating.
    #[arg(long)]
    pub preallocate: bool,
    /// Logical sector size when creating, 512 or 4096 (default: the
    /// storage device's); refused if it differs from an existing volume's.
    #[arg(long, value_parser = sector_size_parser())]
    pub sector_size: Option<u32>,
    /// Extra option passed to mkfs when creating (repeatable); refused if
    /// it differs from the options an existing volume was made with.
    #[arg(long = "mkfs-option", allow_hyphen_values = true, value_hint = ValueHint::Other)]
    pub mkfs_options: Vec<String>,
    /// Encrypt it when creating (LUKS2, unlocked at boot by a key file; the
    /// report shows its recovery key, once); refused for an existing
    /// volume that is not encrypted.
    #[arg(long)]
    pub encrypt: bool,
    /// With --encrypt: the key file that unlocks it, root's alone (default:
    /// a new one in /etc/sparse-volume/keys); refused if it differs from an
    /// existing volume's.
    #[arg(long, requires = "encrypt", value_name = "PATH")]
    pub key_file: Option<PathBuf>,
    /// Make the volume as a clone of this one (its content at one
    /// instant, see `sparse-volume clone`); an existing volume must be
    /// its clone.
    #[arg(long, value_name = "VOLUME")]
    pub clone_of: Option<VolumeRef>,
    /// A clone on storage without reflink: freeze a mounted source for the
    /// whole copy instead of refusing.
    #[arg(long, requires = "clone_of")]
    pub freeze_during_copy: bool,
    /// Take the volume over from the unit that attached its file so far
    /// (see `sparse-volume register --replaces-unit`): the existing file
    /// at `--path` is registered, never made; needs `--uuid`.
    #[arg(long, value_name = "UNIT", value_parser = parse_replaced_unit, value_hint = ValueHint::Other)]
    pub replaces_unit: Option<String>,
    /// With `--state absent`: also delete the backing file.
    #[arg(long)]
    pub delete_data: bool,
    /// Also start (enabled) or stop (disabled) the unit now.
    #[arg(long)]
    pub now: bool,
    #[command(flatten)]
    pub dry: DryRun,
}

impl ApplyArgs {
    /// The desired state from the flags or, with `--stdin`, from the
    /// document there; anything wrong with it is a usage error.
    pub fn read_desired(&self) -> Result<Desired, String> {
        if !self.stdin {
            let desired = self.desired();
            desired.check()?;
            return Ok(desired);
        }
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("reading the desired state from stdin: {e}"))?;
        Desired::from_document(&text)
    }

    fn desired(&self) -> Desired {
        Desired {
            state: self.state,
            uuid: self.uuid,
            name: self.name.clone(),
            size: self.size,
            mode: self.mode,
            fs_type: self.fs_type,
            path: self.path.clone(),
            enabled: self.enabled,
            read_only: self.read_only,
            preallocate: self.preallocate.then_some(true),
            sector_size: self.sector_size,
            mkfs_options: (!self.mkfs_options.is_empty()).then(|| self.mkfs_options.clone()),
            encrypt: self.encrypt.then_some(true),
            key_file: self.key_file.clone(),
            clone_of: self.clone_of.clone(),
            freeze_during_copy: self.freeze_during_copy,
            replaces_unit: self.replaces_unit.clone(),
            delete_data: self.delete_data,
            now: self.now,
        }
    }
}

#[derive(Debug, Args)]
pub struct PvArgs {
    /// The volume: its UUID, its name, the beginning of its UUID (8 or more characters), its loop device or its backing file.
    #[arg(
        required_unless_present = "all",
        conflicts_with = "all",
        value_name = "VOLUME"
    )]
    pub volume: Option<VolumeRef>,
    /// One PersistentVolume per enabled volume.
    #[arg(long)]
    pub all: bool,
    /// `spec.storageClassName`.
    #[arg(long, default_value = "local-storage", value_hint = ValueHint::Other)]
    pub storage_class: String,
    /// The Kubernetes node name for `nodeAffinity` (default: this host's
    /// name, as kubelet registers it).
    #[arg(long, value_hint = ValueHint::Other)]
    pub node: Option<String>,
    /// `spec.persistentVolumeReclaimPolicy`.
    #[arg(long, value_enum, ignore_case = true, default_value_t = Reclaim::Retain)]
    pub reclaim: Reclaim,
    /// Output format (`--json` means `--output json`).
    #[arg(long, value_enum, ignore_case = true, default_value_t = ManifestFormat::Yaml)]
    pub output: ManifestFormat,
}

#[derive(Debug, Args)]
pub struct RegisterArgs {
    /// The UUID the backing file's content carries (file system UUID, or
    /// the GPT partition GUID of a block volume).
    #[arg(long, value_parser = parse_uuid_any_case, value_hint = ValueHint::Other)]
    pub uuid: VolumeId,
    /// Backing file path, inside a storage root.
    #[arg(long)]
    pub path: PathBuf,
    /// `filesystem` or `block`; read from the content when omitted (a GPT
    /// is a block volume).
    #[arg(long, value_enum)]
    pub mode: Option<ModeKind>,
    /// File system type (filesystem mode); detected when omitted.
    #[arg(long = "fs", value_enum)]
    pub fs_type: Option<FsType>,
    /// The volume's name: unique on the node, so it names the volume in
    /// every command as its UUID does.
    #[arg(long, value_parser = parse_name_arg, value_hint = ValueHint::Other)]
    pub name: Option<String>,
    /// Logical sector size (512 or 4096); detected from the content
    /// when omitted, refused when the content does not read with it.
    #[arg(long, value_parser = sector_size_parser())]
    pub sector_size: Option<u32>,
    /// The unit that attached this file so far (a MetalK8s
    /// `metalk8s-sparse-volume@<UUID>.service`): masked at every boot,
    /// disabled and stopped without its ExecStop, and the loop device it
    /// made adopted by the volume's own unit, with consumers mounted.
    #[arg(long, value_name = "UNIT", value_parser = parse_replaced_unit, value_hint = ValueHint::Other)]
    pub replaces_unit: Option<String>,
    /// Start the volume's unit afterwards (and wait for its device).
    #[arg(long)]
    pub now: bool,
    #[command(flatten)]
    pub dry: DryRun,
}

fn parse_replaced_unit(value: &str) -> Result<String, String> {
    crate::registry::check_replaced_unit(value)
        .map(|()| value.to_string())
        .map_err(|reason| reason.replacen("replaces_unit ", "", 1))
}

impl RegisterArgs {
    /// The request, refusing flags that contradict each other; an omitted
    /// `--fs` stays open (register reads the type from the file).
    pub fn request(&self, dry_run: bool) -> Result<RegisterRequest, String> {
        let mode = match (self.mode, self.fs_type) {
            (None, None) => RegisterMode::Detected,
            (None | Some(ModeKind::Filesystem), fs_type) => RegisterMode::Filesystem(fs_type),
            (Some(ModeKind::Block), Some(_)) => {
                return Err("--fs is only valid with --mode filesystem".into())
            }
            (Some(ModeKind::Block), None) => RegisterMode::Block,
        };
        Ok(RegisterRequest {
            uuid: self.uuid,
            path: self.path.clone(),
            mode,
            name: self.name.clone(),
            sector_size: self.sector_size,
            replaces_unit: self.replaces_unit.clone(),
            now: self.now,
            dry_run,
        })
    }
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Size (4096, 512M, 1.5G, 10GiB, 1TB: K to E in any case, KB… for powers of 1000); rounded up to whole MiB.
    #[arg(long, value_parser = parse_size_arg, value_hint = ValueHint::Other)]
    pub size: u64,
    #[arg(long, value_enum, default_value_t = ModeKind::Filesystem)]
    pub mode: ModeKind,
    /// File system type (filesystem mode; default ext4; xfs needs 300 MiB
    /// or more).
    #[arg(long = "fs", value_enum)]
    pub fs_type: Option<FsType>,
    /// Volume UUID; a new one is chosen (and reported) when omitted.
    #[arg(long, value_parser = parse_uuid_any_case, value_hint = ValueHint::Other)]
    pub uuid: Option<VolumeId>,
    /// The volume's name: unique on the node, so it names the volume in
    /// every command as its UUID does.
    #[arg(long, value_parser = parse_name_arg, value_hint = ValueHint::Other)]
    pub name: Option<String>,
    /// Backing file path (default: <first storage root>/<UUID>).
    #[arg(long)]
    pub path: Option<PathBuf>,
    /// Reserve the space now (fallocate) instead of a sparse file.
    #[arg(long)]
    pub preallocate: bool,
    /// Logical sector size, 512 or 4096 (default: the storage device's).
    /// Smaller than the storage device's sectors means no direct I/O.
    #[arg(long, value_parser = sector_size_parser())]
    pub sector_size: Option<u32>,
    /// Extra option passed to mkfs (repeatable).
    #[arg(long = "mkfs-option", allow_hyphen_values = true, value_hint = ValueHint::Other)]
    pub mkfs_options: Vec<String>,
    /// Encrypt it: LUKS2 inside the backing file (block mode: inside its
    /// partition), unlocked at boot by a key file. Prints a recovery key,
    /// once.
    #[arg(long)]
    pub encrypt: bool,
    /// With --encrypt: the key file that unlocks it, root's alone (default:
    /// a new one in /etc/sparse-volume/keys).
    #[arg(long, requires = "encrypt", value_name = "PATH")]
    pub key_file: Option<PathBuf>,
    /// Also attach the volume now.
    #[arg(long)]
    pub now: bool,
    #[command(flatten)]
    pub dry: DryRun,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Read the stream from this file instead of standard input.
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// The volume's name here (default: the exported volume's).
    #[arg(long, value_parser = parse_name_arg, value_hint = ValueHint::Other)]
    pub name: Option<String>,
    /// Keep the exported UUID (the default: a move; refused when a volume
    /// here has it).
    #[arg(long, conflicts_with = "new_uuid")]
    pub keep_uuid: bool,
    /// A new UUID, and a new identity in the content (a copy beside the
    /// original).
    #[arg(long)]
    pub new_uuid: bool,
    /// Also attach the volume now.
    #[arg(long)]
    pub now: bool,
    #[command(flatten)]
    pub dry: DryRun,
}

impl ImportArgs {
    pub fn request(&self, dry_run: bool) -> ImportRequest {
        ImportRequest {
            input: self.input.clone().filter(|p| p.as_os_str() != "-"),
            name: self.name.clone(),
            new_uuid: self.new_uuid,
            now: self.now,
            dry_run,
        }
    }
}

#[derive(Debug, Args)]
pub struct CloneArgs {
    /// The volume to copy: its UUID, its name, the beginning of its UUID (8 or more characters), its loop device or its backing file.
    #[arg(value_name = "VOLUME")]
    pub volume: VolumeRef,
    /// The clone's name (required: it is how a repeated clone is known).
    #[arg(long, value_parser = parse_name_arg, value_hint = ValueHint::Other)]
    pub name: String,
    /// The clone's UUID; a new one is chosen (and reported) when omitted.
    #[arg(long, value_parser = parse_uuid_any_case, value_hint = ValueHint::Other)]
    pub uuid: Option<VolumeId>,
    /// Attach the clone read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Attach the clone at every boot (default true; false with --snapshot).
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub enabled: Option<bool>,
    /// A snapshot: read-only and not enabled (as --read-only --enabled false).
    #[arg(long, conflicts_with_all = ["read_only", "now"])]
    pub snapshot: bool,
    /// Where the storage cannot share extents, freeze a mounted source
    /// for the whole copy (its writers wait until the copy ends) instead
    /// of refusing.
    #[arg(long)]
    pub freeze_during_copy: bool,
    /// Also attach the clone now.
    #[arg(long)]
    pub now: bool,
    #[command(flatten)]
    pub dry: DryRun,
}

impl CloneArgs {
    pub fn request(&self, source: VolumeId, dry_run: bool) -> CloneRequest {
        CloneRequest {
            source,
            name: self.name.clone(),
            uuid: self.uuid,
            read_only: self.read_only || self.snapshot,
            enabled: self.enabled.unwrap_or(!self.snapshot),
            freeze_during_copy: self.freeze_during_copy,
            grow_to: None,
            now: self.now,
            dry_run,
        }
    }
}

impl CreateArgs {
    pub fn request(&self, dry_run: bool) -> Result<CreateRequest, String> {
        Ok(CreateRequest {
            size: self.size,
            mode: self.mode.to_mode(self.fs_type, self.mkfs_options.clone())?,
            uuid: self.uuid,
            name: self.name.clone(),
            path: self.path.clone(),
            preallocate: self.preallocate,
            sector_size: self.sector_size,
            now: self.now,
            dry_run,
            encryption: self.encrypt.then(|| EncryptRequest {
                key_file: self.key_file.clone(),
            }),
        })
    }
}

impl PvArgs {
    /// `--json` means `--output json`.
    pub fn request(&self, uuid: Option<VolumeId>, json: bool) -> PvRequest {
        PvRequest {
            uuid,
            storage_class: self.storage_class.clone(),
            node: self.node.clone(),
            reclaim: self.reclaim,
            format: if json {
                ManifestFormat::Json
            } else {
                self.output
            },
        }
    }
}

/// clap's value enums for the spec's and the commands' own enums, which
/// know nothing of clap: each value is the word the registry and JSON use.
macro_rules! value_enum {
    ($kind:ty { $($value:ident => $word:literal),* $(,)? }) => {
        impl ValueEnum for $kind {
            fn value_variants<'a>() -> &'a [Self] {
                &[$(<$kind>::$value),*]
            }

            fn to_possible_value(&self) -> Option<PossibleValue> {
                Some(PossibleValue::new(match self {
                    $(<$kind>::$value => $word),*
                }))
            }
        }
    };
}

value_enum!(ModeKind { Filesystem => "filesystem", Block => "block" });
value_enum!(FsType { Ext4 => "ext4", Xfs => "xfs" });
value_enum!(State { Present => "present", Absent => "absent" });
value_enum!(Reclaim { Retain => "retain", Delete => "delete" });
value_enum!(ManifestFormat { Yaml => "yaml", Json => "json" });

/// Zero is refused here like any other size that cannot be, so that
/// `--size 0` is the same usage error as `--size -1`.
fn parse_size_arg(text: &str) -> Result<u64, String> {
    match parse_size(text)? {
        0 => Err("the size must be greater than zero".into()),
        size => Ok(size),
    }
}

/// What could never name a volume (empty, control characters, a UUID) is
/// a usage error in every command that gives a name, `apply` included.
fn parse_name_arg(text: &str) -> Result<String, String> {
    check_name_as_reference(text).map(|()| text.to_string())
}

/// 512 or 4096, listed as possible values so that `--help` and the
/// completions offer them; anything else is refused by
/// [`parse_sector_size`]'s sentence.
fn sector_size_parser() -> SectorSizeParser {
    SectorSizeParser
}

#[derive(Clone, Copy)]
struct SectorSizeParser;

impl TypedValueParser for SectorSizeParser {
    type Value = u32;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<u32, clap::Error> {
        let parse: fn(&str) -> Result<u32, String> = parse_sector_size;
        parse.parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(
            SECTOR_SIZE_WORDS
                .iter()
                .map(|word| PossibleValue::new(*word)),
        ))
    }
}

fn parse_sector_size(text: &str) -> Result<u32, String> {
    text.parse()
        .ok()
        .filter(|size| SECTOR_SIZES.contains(size))
        .ok_or_else(|| format!("{text:?} is not a supported sector size (512 or 4096)"))
}

/// [`SECTOR_SIZES`] as words (a unit test keeps the two the same).
const SECTOR_SIZE_WORDS: [&str; 2] = ["512", "4096"];

impl Command {
    /// The existing volume a command is about, as the user named it.
    pub fn volume(&self) -> Option<&VolumeRef> {
        match self {
            Command::Attach { volume, .. }
            | Command::Detach { volume, .. }
            | Command::Remove { volume, .. }
            | Command::Resize { volume, .. }
            | Command::Enable { volume, .. }
            | Command::Disable { volume, .. }
            | Command::Start { volume, .. }
            | Command::Stop { volume, .. }
            | Command::Status { volume } => Some(volume),
            Command::Pv(args) => args.volume.as_ref(),
            Command::Clone(args) => Some(&args.volume),
            Command::Export { volume, .. } => Some(volume),
            Command::Create(_)
            | Command::Apply(_)
            | Command::Import(_)
            | Command::Register(_)
            | Command::Check { .. }
            | Command::List { .. }
            | Command::Metrics { .. } => None,
        }
    }

    /// Everything but the read-only reports changes state that only root
    /// may change; saying so up front beats "Permission denied" on a lock.
    pub fn needs_root(&self) -> bool {
        !matches!(
            self,
            Command::List { .. }
                | Command::Status { .. }
                | Command::Check { repair: false, .. }
                | Command::Metrics { .. }
                | Command::Pv(_)
        )
    }

    /// What the command does, to start the line of its failure; `id` is
    /// the volume it names, resolved.
    pub fn doing(&self, id: Option<&VolumeId>) -> String {
        let volume = id.map_or(String::new(), |id| format!(" {id}"));
        match self {
            Command::Create(args) => match args.uuid {
                Some(uuid) => format!("creating {uuid}"),
                None => "creating a volume".into(),
            },
            Command::Register(args) => format!("registering {}", args.uuid),
            Command::Clone(args) => format!("cloning{volume} into {:?}", args.name),
            Command::Export { .. } => format!("exporting{volume}"),
            Command::Import(_) => "importing a volume".into(),
            Command::Remove { .. } => format!("removing{volume}"),
            Command::Resize { .. } => format!("resizing{volume}"),
            Command::Attach { .. } => format!("attaching{volume}"),
            Command::Detach { .. } => format!("detaching{volume}"),
            Command::Enable { .. } => format!("enabling{volume}"),
            Command::Disable { .. } => format!("disabling{volume}"),
            Command::Start { .. } => format!("starting{volume}"),
            Command::Stop { .. } => format!("stopping{volume}"),
            Command::List { .. } => "listing volumes".into(),
            Command::Status { .. } => format!("reading the status of{volume}"),
            Command::Check { .. } => "checking volumes".into(),
            Command::Metrics { textfile: None } => "collecting metrics".into(),
            Command::Metrics { .. } => "writing the metrics textfile".into(),
            Command::Pv(_) if id.is_some() => format!("writing the PersistentVolume of{volume}"),
            Command::Pv(_) => "writing PersistentVolumes".into(),
            Command::Apply(_) => "applying".into(),
        }
    }

    /// `--dry-run`: false for the commands that only read.
    pub fn dry_run(&self) -> bool {
        match self {
            Command::Create(CreateArgs { dry, .. })
            | Command::Register(RegisterArgs { dry, .. })
            | Command::Clone(CloneArgs { dry, .. })
            | Command::Import(ImportArgs { dry, .. })
            | Command::Apply(ApplyArgs { dry, .. })
            | Command::Remove { dry, .. }
            | Command::Resize { dry, .. }
            | Command::Attach { dry, .. }
            | Command::Detach { dry, .. }
            | Command::Enable { dry, .. }
            | Command::Disable { dry, .. }
            | Command::Start { dry, .. }
            | Command::Stop { dry, .. }
            | Command::Check { dry, .. } => dry.dry_run,
            Command::List { .. }
            | Command::Status { .. }
            | Command::Metrics { .. }
            | Command::Export { .. }
            | Command::Pv(_) => false,
        }
    }

    /// Standard output carries a stream, not a report: `export` to `-`.
    pub fn streams_to_stdout(&self) -> bool {
        matches!(self, Command::Export { output, .. } if output.as_ref().is_none_or(|p| p.as_os_str() == "-"))
    }

    /// The UUID a command gives a volume it makes, when the user chose it.
    pub fn new_uuid(&self) -> Option<VolumeId> {
        match self {
            Command::Register(args) => Some(args.uuid),
            Command::Create(args) => args.uuid,
            Command::Apply(args) => args.uuid,
            Command::Clone(args) => args.uuid,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sector_sizes_offered_are_the_supported_ones() {
        let offered: Vec<u32> = SECTOR_SIZE_WORDS
            .iter()
            .map(|w| w.parse().unwrap())
            .collect();
        assert_eq!(offered, SECTOR_SIZES);
        let refused = Cli::try_parse_from([
            "sparse-volume",
            "create",
            "--size",
            "1G",
            "--sector-size",
            "1024",
        ]);
        assert!(refused.is_err_and(|e| e
            .to_string()
            .contains("\"1024\" is not a supported sector size (512 or 4096)")));
    }

    #[test]
    fn a_zero_size_is_a_usage_error() {
        for args in [
            &["create", "--size", "0"][..],
            &["create", "--size", "0G"],
            &[
                "resize",
                "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b",
                "--size",
                "0",
            ],
        ] {
            let error =
                Cli::try_parse_from(std::iter::once("sparse-volume").chain(args.iter().copied()))
                    .expect_err(&format!("{args:?} accepted"));
            assert_eq!(error.exit_code(), 2, "{args:?}");
        }
        assert!(Cli::try_parse_from(["sparse-volume", "create", "--size", "1"]).is_ok());
    }
}
