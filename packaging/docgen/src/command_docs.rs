//! What each command's man page says beyond its `--help` text, which clap
//! knows nothing about: what its exit status means, examples, and related
//! pages. One table, one entry per command; the examples are the
//! invocations of README.md, docs/guide/ and docs/reference/cli.md, so the
//! pages and the documents show the same commands (a test parses each one
//! with the CLI's own definitions).

use roff::{bold, roman, Inline, Roff};

pub struct CommandDoc {
    pub name: &'static str,
    /// What exit status 0 covers besides plain success, when it is more
    /// than that: "nothing to do" cases a script should not take for
    /// failures.
    pub success: Option<&'static str>,
    /// What makes this command exit 1 besides a plain failure.
    pub failure: Option<&'static str>,
    pub examples: &'static [Example],
    /// Pages besides sparse-volume(8), as `page(section)`.
    pub see_also: &'static [&'static str],
}

pub struct Example {
    /// What the commands do, one sentence ending in a colon.
    pub what: &'static str,
    /// Shell lines, as typed.
    pub commands: &'static str,
}

pub const COMMAND_DOCS: &[CommandDoc] = &[
    CommandDoc {
        name: "create",
        success: Some(
            "A repeated create with the same spec changes nothing and succeeds \
             (\"changed\": false).",
        ),
        failure: Some(
            "Also when a volume with that UUID or name exists with another spec \
             (use resize to grow it), or when the space is not there.",
        ),
        examples: &[
            Example {
                what: "A 1 GiB ext4 volume named pg-data, attached now through systemd, \
                       and mounted from /etc/fstab by its UUID:",
                commands: "uuid=$(cat /proc/sys/kernel/random/uuid)\n\
                           sparse-volume create --size 1G --uuid \"$uuid\" --name pg-data --now\n\
                           mkdir -p /srv/pg\n\
                           echo \"UUID=$uuid /srv/pg ext4 defaults,nofail 0 2\" >>/etc/fstab\n\
                           systemctl daemon-reload\n\
                           mount /srv/pg",
            },
            Example {
                what: "Run twice, this makes one volume: the second run reports \
                       \"changed\": false:",
                commands: "sparse-volume create --name pg-data --size 10G --json",
            },
            Example {
                what: "A raw block volume: a GPT whose one partition carries the volume \
                       UUID, found at /dev/disk/by-partuuid/UUID:",
                commands: "sparse-volume create --size 10G --mode block --name kube-raw",
            },
        ],
        see_also: &[
            "sparse-volume-register(8)",
            "sparse-volume-resize(8)",
            "sparse-volume-remove(8)",
            "sparse-volume.toml(5)",
            "fstab(5)",
        ],
    },
    CommandDoc {
        name: "register",
        success: Some("Registering a registered volume again with the same spec changes nothing."),
        failure: Some(
            "Also when the file's content does not carry the UUID, or the file is \
             not inside a storage root.",
        ),
        examples: &[Example {
            what: "Adopt a backing file whose ext4 was made with the volume's UUID (mode, \
                   file system and sector size are read from the content):",
            commands: "sparse-volume register --uuid 6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b \\\n    \
                       --path /var/lib/sparse-volume/6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b \\\n    \
                       --name pg-data",
        }],
        see_also: &[
            "sparse-volume-create(8)",
            "sparse-volume-remove(8)",
            "sparse-volume.toml(5)",
        ],
    },
    CommandDoc {
        name: "clone",
        success: Some(
            "A repeated clone (the same source, name and properties) changes nothing \
             (\"changed\": false).",
        ),
        failure: Some(
            "Also when the name is another volume's, when the space is not there (a \
             reflink clone commits its size and what the source now shares), and when \
             a copy of a volume in use could not be consistent: the storage cannot \
             share extents and the source is attached (detach it, or freeze a mounted \
             one with --freeze-during-copy), or it is a mounted xfs. Nothing is left \
             then.",
        ),
        examples: &[
            Example {
                what: "A snapshot of pg-data before an upgrade (read-only, not attached \
                       at boot; a mounted pg-data is frozen for the moment of the copy):",
                commands: "sparse-volume clone pg-data --name pg-data-before-upgrade --snapshot",
            },
            Example {
                what: "A writable copy for a test, attached now, on storage without \
                       reflink (its writers wait for the copy):",
                commands: "sparse-volume clone pg-data --name pg-test --now --freeze-during-copy",
            },
        ],
        see_also: &[
            "sparse-volume-create(8)",
            "sparse-volume-list(8)",
            "sparse-volume.toml(5)",
        ],
    },
    CommandDoc {
        name: "export",
        success: None,
        failure: Some(
            "Also when the volume is in use on storage that cannot share extents and \
             --freeze-during-copy was not given, or when the output file exists; a \
             file named by --output is always a whole export.",
        ),
        examples: &[
            Example {
                what: "A copy of pg-data beside it, through a pipe:",
                commands: "sparse-volume export pg-data | sparse-volume import --new-uuid --name pg-data-copy",
            },
            Example {
                what: "Into a file, which GNU tar reads too (a sparse member, a manifest, a \
                       checksum):",
                commands: "sparse-volume export pg-data --output /var/backups/pg-data.tar\n\
                           tar -tvf /var/backups/pg-data.tar",
            },
        ],
        see_also: &["sparse-volume-import(8)", "sparse-volume-clone(8)", "tar(1)"],
    },
    CommandDoc {
        name: "import",
        success: None,
        failure: Some(
            "Also when the stream is damaged or cut (checked before anything is \
             registered; nothing is left), when a volume here has its UUID (use \
             --new-uuid) or its name (use --name), or when the space is not there.",
        ),
        examples: &[Example {
            what: "A copy of an exported volume, beside the original (a new UUID, and a \
                   new identity in its content):",
            commands: "sparse-volume import --input /var/backups/pg-data.tar --new-uuid --name pg-data-restored",
        }],
        see_also: &["sparse-volume-export(8)", "sparse-volume-create(8)"],
    },
    CommandDoc {
        name: "remove",
        success: Some(
            "Also when no volume has the name given, or the UUID is not registered \
             (anymore): there is nothing to remove.",
        ),
        failure: Some("Also while the volume is mounted or held; nothing is changed then."),
        examples: &[
            Example {
                what: "Detach and unregister pg-data, keeping its backing file:",
                commands: "sparse-volume remove pg-data",
            },
            Example {
                what: "Delete its backing file too, after a look at what that would do:",
                commands: "sparse-volume remove pg-data --delete-data --dry-run\n\
                           sparse-volume remove pg-data --delete-data",
            },
        ],
        see_also: &[
            "sparse-volume-disable(8)",
            "sparse-volume-detach(8)",
            "sparse-volume-create(8)",
        ],
    },
    CommandDoc {
        name: "resize",
        success: Some("Also when the volume already has that size."),
        failure: Some(
            "Also for a size below the current one (volumes only grow), or one the \
             storage root's free space cannot hold.",
        ),
        examples: &[Example {
            what: "Grow pg-data to 20 GiB: its file, its loop device and its file system \
                   (online when mounted):",
            commands: "sparse-volume resize pg-data --size 20G",
        }],
        see_also: &[
            "sparse-volume-create(8)",
            "sparse-volume-check(8)",
            "resize2fs(8)",
            "xfs_growfs(8)",
        ],
    },
    CommandDoc {
        name: "attach",
        success: Some("Also when the volume is attached already: its loop device is reused."),
        failure: Some(
            "Also when the content does not carry the volume's UUID, and while the \
             kernel command line skips the volume (sparse_volume.skip=, \
             sparse_volume=off), naming the switch.",
        ),
        examples: &[Example {
            what: "Attach pg-data by hand, as its unit does at boot, and see where:",
            commands: "sparse-volume attach pg-data\n\
                       sparse-volume status pg-data",
        }],
        see_also: &[
            "sparse-volume-detach(8)",
            "sparse-volume-start(8)",
            "sparse-volume-generator(8)",
            "losetup(8)",
        ],
    },
    CommandDoc {
        name: "detach",
        success: Some("Also when the volume is not attached."),
        failure: Some(
            "Also while its device is mounted, and while another program holds it \
             open (the kernel then detaches it at that program's last close).",
        ),
        examples: &[Example {
            what: "Unmount pg-data and detach it by hand (sparse-volume stop detaches \
                   it through its unit instead):",
            commands: "umount /srv/pg\n\
                       sparse-volume detach pg-data",
        }],
        see_also: &[
            "sparse-volume-attach(8)",
            "sparse-volume-stop(8)",
            "losetup(8)",
        ],
    },
    CommandDoc {
        name: "enable",
        success: Some(
            "Also without systemd (a chroot, an image build): the flag is written, \
             and a warning says it takes effect at the next boot.",
        ),
        failure: Some("With --now, also when the start job does not end in done."),
        examples: &[Example {
            what: "Attach pg-data at every boot, and now:",
            commands: "sparse-volume enable pg-data --now",
        }],
        see_also: &[
            "sparse-volume-disable(8)",
            "sparse-volume-start(8)",
            "sparse-volume-generator(8)",
        ],
    },
    CommandDoc {
        name: "disable",
        success: Some(
            "Also without systemd (a chroot, an image build): the flag is written, \
             and a warning says it takes effect at the next boot.",
        ),
        failure: Some(
            "With --now, also while the volume is mounted or held (nothing is \
             changed then, not even the flag), and when the stop job does not end \
             in done.",
        ),
        examples: &[
            Example {
                what: "Keep pg-data from attaching at the next boots; it stays attached now:",
                commands: "sparse-volume disable pg-data",
            },
            Example {
                what: "And detach it now too:",
                commands: "sparse-volume disable pg-data --now",
            },
        ],
        see_also: &[
            "sparse-volume-enable(8)",
            "sparse-volume-stop(8)",
            "sparse-volume-remove(8)",
        ],
    },
    CommandDoc {
        name: "start",
        success: None,
        failure: Some(
            "Also when the start job does not end in done (the unit, the job's \
             result and the unit's last journal lines are named), and when systemd \
             cannot be reached on the system bus.",
        ),
        examples: &[Example {
            what: "Attach pg-data through its unit and wait for the result:",
            commands: "sparse-volume start pg-data",
        }],
        see_also: &[
            "sparse-volume-stop(8)",
            "sparse-volume-attach(8)",
            "systemctl(1)",
        ],
    },
    CommandDoc {
        name: "stop",
        success: None,
        failure: Some(
            "Also while the volume is mounted or held, when the stop job does not \
             end in done, and when systemd cannot be reached on the system bus.",
        ),
        examples: &[Example {
            what: "Unmount pg-data, then detach it through its unit:",
            commands: "umount /srv/pg\n\
                       sparse-volume stop pg-data",
        }],
        see_also: &[
            "sparse-volume-start(8)",
            "sparse-volume-detach(8)",
            "systemctl(1)",
        ],
    },
    CommandDoc {
        name: "list",
        success: None,
        failure: Some(
            "When a registry file does not read: it gets an error row, and every \
             other volume is listed.",
        ),
        examples: &[
            Example {
                what: "Every volume at a glance, then with every column:",
                commands: "sparse-volume list\n\
                           sparse-volume list --wide",
            },
            Example {
                what: "For a script, one JSON object:",
                commands: "sparse-volume list --json",
            },
        ],
        see_also: &["sparse-volume-status(8)", "sparse-volume-check(8)"],
    },
    CommandDoc {
        name: "status",
        success: None,
        failure: None,
        examples: &[Example {
            what: "One volume in detail, for people and as JSON:",
            commands: "sparse-volume status pg-data\n\
                       sparse-volume status pg-data --json",
        }],
        see_also: &["sparse-volume-list(8)", "sparse-volume-check(8)"],
    },
    CommandDoc {
        name: "check",
        success: Some(
            "No finding of severity error is left; warnings and notes alone do not \
             fail.",
        ),
        failure: Some(
            "While a finding of severity error is left (after the repairs, with \
             --repair), including an audit that could not read everything (without \
             root).",
        ),
        examples: &[
            Example {
                what: "Audit the registry against files and devices, then fix what is \
                       safe to fix:",
                commands: "sparse-volume check\n\
                           sparse-volume check --repair",
            },
            Example {
                what: "What --repair would change, changing nothing:",
                commands: "sparse-volume check --repair --dry-run",
            },
        ],
        see_also: &[
            "sparse-volume-list(8)",
            "sparse-volume-status(8)",
            "sparse-volume.toml(5)",
        ],
    },
    CommandDoc {
        name: "metrics",
        success: None,
        failure: None,
        examples: &[
            Example {
                what: "Print the metrics in Prometheus' text format:",
                commands: "sparse-volume metrics",
            },
            Example {
                what: "Write node_exporter's textfile once, then every minute through the \
                       package's timer:",
                commands: "sparse-volume metrics --textfile\n\
                           systemctl enable --now sparse-volume-metrics.timer",
            },
        ],
        see_also: &[
            "sparse-volume-check(8)",
            "sparse-volume.toml(5)",
            "systemd.timer(5)",
        ],
    },
    CommandDoc {
        name: "pv",
        success: None,
        failure: None,
        examples: &[
            Example {
                what: "A local PersistentVolume for pg-data, straight into the cluster:",
                commands: "sparse-volume pv pg-data | kubectl apply -f -",
            },
            Example {
                what: "One for every enabled volume, on a node kubelet registers under \
                       another name:",
                commands: "sparse-volume pv --all --node worker-3 | kubectl apply -f -",
            },
        ],
        see_also: &["sparse-volume-list(8)", "sparse-volume-status(8)"],
    },
    CommandDoc {
        name: "apply",
        success: Some("Also when the volume is as desired already (\"changed\": false)."),
        failure: Some(
            "Also when a property that cannot change differs (mode, file system, \
             path, sector size, preallocation, encryption, key file) or the size \
             would shrink, naming it.",
        ),
        examples: &[
            Example {
                what: "Converge pg-data to a 20 GiB xfs volume, started now, as config \
                       management does:",
                commands: "echo '{\"name\": \"pg-data\", \"size\": \"20G\", \"fs_type\": \"xfs\", \"now\": true}' |\n    \
                           sparse-volume apply --stdin --json",
            },
            Example {
                what: "The same with flags, then the volume gone (its file kept):",
                commands: "sparse-volume apply --name pg-data --size 20G --fs xfs --now\n\
                           sparse-volume apply --name pg-data --state absent",
            },
            Example {
                what: "An encrypted volume; the report shows its recovery key (\"recovery_key\"), \
                       only in the run that creates it:",
                commands: "sparse-volume apply --name vault --size 1G --encrypt --json",
            },
        ],
        see_also: &[
            "sparse-volume-create(8)",
            "sparse-volume-resize(8)",
            "sparse-volume-remove(8)",
            "sparse-volume-enable(8)",
        ],
    },
];

/// The entry of the command NAME.
pub fn command_doc(name: &str) -> Option<&'static CommandDoc> {
    COMMAND_DOCS.iter().find(|doc| doc.name == name)
}

/// The sections appended to the command's page: EXIT STATUS, EXAMPLES,
/// SEE ALSO.
pub fn page_tail(doc: &CommandDoc) -> String {
    let mut roff = Roff::new();
    exit_status(&mut roff, doc);
    examples(&mut roff, doc.examples);
    see_also(&mut roff, doc.see_also);
    roff.render()
}

fn exit_status(roff: &mut Roff, doc: &CommandDoc) {
    let with = |first: &str, more: Option<&str>| match more {
        Some(more) => format!("{first} {more}"),
        None => first.to_owned(),
    };
    roff.control("SH", ["EXIT STATUS"]);
    for (status, text) in [
        ("0", with("Success.", doc.success)),
        (
            "1",
            with(
                "Failure: one line on standard error names the volume and the cause \
                 (with --json, the JSON object on standard output has it too).",
                doc.failure,
            ),
        ),
        (
            "2",
            "Usage error: an unknown option, or an argument missing or malformed.".to_owned(),
        ),
    ] {
        roff.control("TP", [] as [&str; 0]);
        roff.text([roman(status)]);
        roff.text([roman(text)]);
    }
}

fn examples(roff: &mut Roff, examples: &[Example]) {
    roff.control("SH", ["EXAMPLES"]);
    for example in examples {
        roff.control("PP", [] as [&str; 0]);
        roff.text([roman(example.what)]);
        roff.control("PP", [] as [&str; 0]);
        roff.control("RS", ["4"]);
        roff.control("nf", [] as [&str; 0]);
        for line in example.commands.lines() {
            roff.text([roman(line)]);
        }
        roff.control("fi", [] as [&str; 0]);
        roff.control("RE", [] as [&str; 0]);
    }
}

fn see_also(roff: &mut Roff, pages: &[&str]) {
    roff.control("SH", ["SEE ALSO"]);
    let mut text: Vec<Inline> = Vec::new();
    for page in std::iter::once("sparse-volume(8)").chain(pages.iter().copied()) {
        let (name, section) = page.split_once('(').unwrap_or((page, ""));
        if !text.is_empty() {
            text.push(roman(", "));
        }
        text.push(bold(name));
        text.push(roman(format!("({section}")));
    }
    roff.text(text);
}

#[cfg(test)]
mod tests {
    use super::*;

    use clap::{CommandFactory, Parser};
    use sparse_volume::cli::args::Cli;

    /// What `$uuid` stands for in the examples.
    const UUID_EXAMPLE: &str = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";

    fn visible_subcommands() -> Vec<String> {
        Cli::command()
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| s.get_name().to_owned())
            .collect()
    }

    /// A new subcommand gets its exit status, examples and related pages,
    /// and the table names no command that is gone.
    #[test]
    fn every_subcommand_has_an_entry_with_examples() {
        let subcommands = visible_subcommands();
        for name in &subcommands {
            let doc = command_doc(name).unwrap_or_else(|| {
                panic!("COMMAND_DOCS has no entry for `{name}`: add its exit status, examples and SEE ALSO")
            });
            assert!(!doc.examples.is_empty(), "`{name}` has no example");
        }
        for doc in COMMAND_DOCS {
            assert!(
                subcommands.iter().any(|name| name == doc.name),
                "COMMAND_DOCS describes `{}`, which is no subcommand",
                doc.name
            );
        }
    }

    /// The words of a shell line, quotes removed; an unquoted |, ;, &, >
    /// or # ends a word and is a word of its own (a command's end).
    fn shell_words(line: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut word = String::new();
        let mut quote = None;
        for c in line.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), c) => word.push(c),
                (None, '"' | '\'') => quote = Some(c),
                (None, c) if c.is_whitespace() || "|;&>#".contains(c) => {
                    if !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                    if !c.is_whitespace() {
                        words.push(c.to_string());
                    }
                }
                (None, c) => word.push(c),
            }
        }
        words.extend((!word.is_empty()).then_some(word));
        words
    }

    /// Each `sparse-volume ...` of an example, as its argument list
    /// (continued lines joined, `$uuid` given a value).
    fn invocations(commands: &str) -> Vec<Vec<String>> {
        let joined = commands.replace("\\\n", " ").replace("$uuid", UUID_EXAMPLE);
        let mut found = Vec::new();
        for line in joined.lines() {
            let words = shell_words(line);
            let mut rest = words.iter().skip_while(|word| *word != "sparse-volume");
            if rest.next().is_some() {
                let args = rest.take_while(|word| !"|;&>#".contains(word.as_str()));
                found.push(
                    std::iter::once("sparse-volume".to_owned())
                        .chain(args.cloned())
                        .collect(),
                );
            }
        }
        found
    }

    /// Every example is an invocation the CLI accepts, and each example
    /// runs the command whose page shows it.
    #[test]
    fn examples_are_invocations_the_cli_accepts() {
        for doc in COMMAND_DOCS {
            for example in doc.examples {
                let found = invocations(example.commands);
                assert!(
                    found
                        .iter()
                        .any(|args| args.get(1).map(String::as_str) == Some(doc.name)),
                    "an example of `{}` does not run it: {}",
                    doc.name,
                    example.commands
                );
                for args in found {
                    if let Err(e) = Cli::try_parse_from(&args) {
                        panic!("example of `{}` does not parse: {args:?}\n{e}", doc.name);
                    }
                }
            }
        }
    }

    #[test]
    fn shell_words_split_like_a_shell() {
        assert_eq!(
            shell_words(r#"echo '{"a": 1}' | sparse-volume apply --stdin"#),
            [
                "echo",
                r#"{"a": 1}"#,
                "|",
                "sparse-volume",
                "apply",
                "--stdin"
            ]
        );
        assert_eq!(
            invocations("x=1\nsparse-volume create --uuid \"$uuid\" \\\n  --now >>log # note"),
            [["sparse-volume", "create", "--uuid", UUID_EXAMPLE, "--now"]]
        );
    }

    /// SEE ALSO names a page of ours only when there is one.
    #[test]
    fn see_also_names_pages_that_exist() {
        let subcommands = visible_subcommands();
        let ours_exist = |page: &str| match page.strip_prefix("sparse-volume-") {
            Some(rest) => {
                rest == "generator(8)"
                    || subcommands.iter().any(|name| format!("{name}(8)") == rest)
            }
            None => !page.starts_with("sparse-volume") || page == "sparse-volume.toml(5)",
        };
        for doc in COMMAND_DOCS {
            for page in doc.see_also {
                assert!(
                    ours_exist(page),
                    "`{}` names {page}, which is no page of ours",
                    doc.name
                );
                assert!(
                    page.ends_with(')') && page.contains('('),
                    "`{}`: {page} is not page(section)",
                    doc.name
                );
            }
        }
    }
}
