//! The layering rule (`sparse_volume::LAYERS`, docs/design/ARCHITECTURE.md):
//! a module under `src/` uses only its own layer and the layers below it,
//! the second-level modules (`engine::attach`, `commands::running`, …) use
//! each other without cycles, the command groups (provisioning, running,
//! inspecting) share code only through the engine and `commands::report`,
//! and only the kernel-facing layer may hold `unsafe` code. Every path in the sources is read as Rust (`syn`): `use`
//! lines, grouped imports and paths written inline alike. Needs no root.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The layer a module may not go above, and where a use goes.
#[derive(Debug)]
struct Arrow {
    from: Vec<String>,
    to: Vec<String>,
    line: usize,
}

/// Collects every `crate::…`, `super::…` and `sparse_volume::…` path of one
/// file, resolved to a module path from the crate root.
struct Paths {
    /// The module being read: the file's, and the inline modules (`mod
    /// tests { … }`) it is inside of.
    module: Vec<String>,
    arrows: Vec<Arrow>,
    allows_unsafe: Vec<usize>,
}

impl Paths {
    fn resolve(&mut self, segments: &[String], line: usize) {
        let Some(first) = segments.first() else {
            return;
        };
        let target: Vec<String> = match first.as_str() {
            "crate" | "sparse_volume" => segments[1..].to_vec(),
            "super" => {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                let Some(base) = self.module.len().checked_sub(ups) else {
                    return;
                };
                let mut target = self.module[..base].to_vec();
                target.extend(segments[ups..].iter().cloned());
                target
            }
            _ => return,
        };
        if !target.is_empty() {
            self.arrows.push(Arrow {
                from: self.module.clone(),
                to: target,
                line,
            });
        }
    }

    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        use proc_macro2::TokenTree;
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut at = 0;
        while at < trees.len() {
            match &trees[at] {
                TokenTree::Group(group) => self.tokens(group.stream()),
                TokenTree::Ident(ident) if ident == "crate" || ident == "sparse_volume" => {
                    let line = ident.span().start().line;
                    let mut segments = vec![ident.to_string()];
                    let mut next = at + 1;
                    // `::` is two `:` punctuation tokens.
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(name)),
                    ) = (trees.get(next), trees.get(next + 1), trees.get(next + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        segments.push(name.to_string());
                        next += 3;
                    }
                    if segments.len() > 1 {
                        self.resolve(&segments, line);
                    }
                    at = next - 1;
                }
                _ => {}
            }
            at += 1;
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Group(group) => {
                for item in &group.items {
                    self.use_tree(prefix, item);
                }
            }
            syn::UseTree::Name(name) => {
                let mut full = prefix.clone();
                if name.ident != "self" {
                    full.push(name.ident.to_string());
                }
                self.resolve(&full, name.ident.span().start().line);
            }
            syn::UseTree::Rename(rename) => {
                let mut full = prefix.clone();
                full.push(rename.ident.to_string());
                self.resolve(&full, rename.ident.span().start().line);
            }
            syn::UseTree::Glob(glob) => {
                self.resolve(prefix, glob.star_token.spans[0].start().line);
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        self.module.push(item.ident.to_string());
        syn::visit::visit_item_mod(self, item);
        self.module.pop();
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = path
            .segments
            .first()
            .map_or(0, |s| s.ident.span().start().line);
        self.resolve(&segments, line);
        syn::visit::visit_path(self, path);
    }

    /// Paths inside a macro's arguments (`format!`, `bail!`, `tracing::warn!`),
    /// which syn leaves as tokens: every `crate::a::b` among them.
    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }

    fn visit_attribute(&mut self, attribute: &'ast syn::Attribute) {
        if attribute.path().is_ident("allow") {
            let text = quote_tokens(&attribute.meta);
            if text.contains("unsafe_code") {
                self.allows_unsafe
                    .push(attribute.pound_token.span.start().line);
            }
        }
        syn::visit::visit_attribute(self, attribute);
    }
}

fn quote_tokens(meta: &syn::Meta) -> String {
    match meta {
        syn::Meta::List(list) => list.tokens.to_string(),
        _ => String::new(),
    }
}

/// The module path of a source file: `src/engine/attach.rs` is
/// `engine::attach`, `src/kernel/mod.rs` is `kernel`; `main.rs` is the
/// binary, which sits on top of the CLI layer.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).expect("a file below src");
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    match stem {
        "mod" | "lib" => {}
        "main" => parts.extend(["cli".into(), "main".into()]),
        _ => parts.push(stem.into()),
    }
    parts
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("reading src") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// What one source file says, as arrows between modules.
fn read_source(module: &[String], text: &str) -> Paths {
    let syntax = syn::parse_file(text).expect("the source parses");
    let mut paths = Paths {
        module: module.to_vec(),
        arrows: Vec::new(),
        allows_unsafe: Vec::new(),
    };
    paths.visit_file(&syntax);
    paths
}

fn layer_index(module: &[String]) -> Option<usize> {
    let first = module.first()?;
    sparse_volume::LAYERS
        .iter()
        .position(|layer| layer == first)
}

/// The uses that point up, one line each.
fn upward(file: &str, arrows: &[Arrow]) -> Vec<String> {
    arrows
        .iter()
        .filter_map(|arrow| {
            let from = layer_index(&arrow.from)?;
            let to = layer_index(&arrow.to)?;
            (to > from).then(|| {
                format!(
                    "{file}:{}: {} uses {} ({} is above {})",
                    arrow.line,
                    arrow.from.join("::"),
                    arrow.to.join("::"),
                    arrow.to[0],
                    arrow.from[0],
                )
            })
        })
        .collect()
}

/// Uses from one command group into another: what two groups share
/// belongs in the engine (or in `commands::report`).
fn across_command_groups(file: &str, arrows: &[Arrow]) -> Vec<String> {
    arrows
        .iter()
        .filter(|a| a.from.len() > 1 && a.to.len() > 1)
        .filter(|a| a.from[0] == "commands" && a.to[0] == "commands")
        .filter(|a| a.from[1] != a.to[1] && a.from[1] != "report" && a.to[1] != "report")
        .map(|a| {
            format!(
                "{file}:{}: {} uses {} (command groups share through the engine)",
                a.line,
                a.from.join("::"),
                a.to.join("::")
            )
        })
        .collect()
}

/// A module's node in the cycle check: its layer and the module below it.
fn node(module: &[String]) -> String {
    module
        .iter()
        .take(2)
        .cloned()
        .collect::<Vec<_>>()
        .join("::")
}

/// Every cycle among the nodes, as the nodes on it.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        found: &mut Vec<Vec<String>>,
    ) {
        if let Some(at) = stack.iter().position(|n| n == node) {
            found.push(stack[at..].to_vec());
            return;
        }
        if done.contains(node) {
            return;
        }
        stack.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            visit(next, edges, stack, done, found);
        }
        stack.pop();
        done.insert(node.to_string());
    }
    let mut found = Vec::new();
    let mut done = BTreeSet::new();
    for start in edges.keys() {
        visit(start, edges, &mut Vec::new(), &mut done, &mut found);
    }
    found
}

fn edges_of(arrows: &[Arrow]) -> BTreeMap<String, BTreeSet<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for arrow in arrows {
        let (from, to) = (node(&arrow.from), node(&arrow.to));
        // Only modules of the crate: `crate::LAYERS` and the like are not.
        if from != to && layer_index(&arrow.to).is_some() {
            edges.entry(from).or_default().insert(to);
        }
    }
    edges
}

#[test]
fn no_module_uses_a_layer_above_its_own_and_no_modules_use_each_other_in_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut arrows = Vec::new();
    let mut problems = Vec::new();
    for file in &files {
        let module = module_of(&src, file);
        let name = file
            .strip_prefix(&src)
            .expect("below src")
            .display()
            .to_string();
        let text = fs::read_to_string(file).expect("reading a source file");
        let paths = read_source(&module, &text);
        if !module.is_empty() && layer_index(&module).is_none() {
            problems.push(format!(
                "src/{name}: module {} is in no layer of sparse_volume::LAYERS",
                module.join("::")
            ));
        }
        problems.extend(upward(&format!("src/{name}"), &paths.arrows));
        problems.extend(across_command_groups(&format!("src/{name}"), &paths.arrows));
        if name != "kernel/mod.rs" {
            problems.extend(
                paths.allows_unsafe.iter().map(|line| {
                    format!("src/{name}:{line}: allows unsafe code outside src/kernel/")
                }),
            );
        }
        arrows.extend(paths.arrows);
    }
    // Guards the reader: the crate has many arrows, some of them down.
    assert!(arrows.len() > 300, "only {} uses found", arrows.len());
    assert!(arrows
        .iter()
        .any(|a| a.from[0] == "engine" && a.to[0] == "kernel"));
    let up = problems.len();
    let edges = edges_of(&arrows);
    let found = cycles(&edges);
    for cycle in &found {
        problems.push(format!("a cycle: {} -> {}", cycle.join(" -> "), cycle[0]));
    }
    let count: usize = edges.values().map(BTreeSet::len).sum();
    println!(
        "layering: {} files, {} uses, {} arrows between {} modules, {up} up or unsafe, {} cycles",
        files.len(),
        arrows.len(),
        count,
        edges.len(),
        found.len()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_crate_root_denies_unsafe_code_and_only_the_kernel_layer_allows_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = fs::read_to_string(root.join("lib.rs")).expect("lib.rs");
    assert!(
        lib.contains("#![deny(unsafe_code)]"),
        "lib.rs must deny unsafe code"
    );
    let main = fs::read_to_string(root.join("main.rs")).expect("main.rs");
    assert!(
        main.contains("#![deny(unsafe_code)]"),
        "main.rs must deny unsafe code"
    );
    let kernel = fs::read_to_string(root.join("kernel/mod.rs")).expect("kernel/mod.rs");
    assert!(kernel.contains("#![allow(unsafe_code)]"));
}

/// The checker itself, on sources made up to break the rule: a planted
/// upward use is named with its line, in each form a use can take.
#[test]
fn a_planted_upward_use_is_reported() {
    let kernel_file: Vec<String> = vec!["kernel".into(), "files".into()];
    for (text, line) in [
        ("use crate::engine::attach::attach;\n", 1),
        ("use crate::{hooks::Crash, commands::report::Report};\n", 1),
        ("fn f() {\n    crate::cli::output::warn(\"x\");\n}\n", 2),
        ("use super::super::registry::Registry;\n", 1),
        (
            "fn f() {\n    let _ = format!(\"{}\", crate::engine::inspect::UNKNOWN);\n}\n",
            2,
        ),
    ] {
        let paths = read_source(&kernel_file, text);
        let found = upward("src/kernel/files.rs", &paths.arrows);
        assert_eq!(found.len(), 1, "{text:?}: {found:?}");
        assert!(
            found[0].starts_with(&format!("src/kernel/files.rs:{line}: kernel::files uses ")),
            "{found:?}"
        );
    }
    let down = read_source(
        &["engine".into(), "attach".into()],
        "use crate::kernel::files;\n",
    );
    assert!(upward("x", &down.arrows).is_empty());
    let across = read_source(
        &["commands".into(), "running".into(), "enable".into()],
        "use crate::commands::provisioning::create::create;\nuse crate::commands::report::Report;\n",
    );
    assert_eq!(across_command_groups("x", &across.arrows).len(), 1);
    let unsafe_allowed = read_source(&kernel_file, "#[allow(unsafe_code)]\nfn f() {}\n");
    assert_eq!(unsafe_allowed.allows_unsafe, vec![1]);
}

#[test]
fn a_planted_cycle_is_reported() {
    let mut arrows = read_source(
        &["engine".into(), "attach".into()],
        "use crate::engine::detach::x;\n",
    )
    .arrows;
    arrows.extend(
        read_source(
            &["engine".into(), "detach".into()],
            "use crate::engine::attach::y;\n",
        )
        .arrows,
    );
    let found = cycles(&edges_of(&arrows));
    assert_eq!(
        found,
        vec![vec![
            "engine::attach".to_string(),
            "engine::detach".to_string()
        ]]
    );
}
