//! The stages' data and the pure stages — no I/O, clock, process, randomness, async runtime,
//! network, kernel or hash-order iteration — so they can be unit-tested, fuzzed and trusted
//! to give equal output for equal input. This test keeps them that way structurally: it
//! parses every source file under `src/model/`, `src/translate/`, `src/render/`,
//! `src/nft/`, `src/explain/`, `src/dns/` and `src/conformance/` (the case model and its
//! carrying over onto a real cluster) (every level), `src/revoke.rs` and `src/slices.rs`, with `syn` and refuses any `use` or path (in code,
//! types, patterns and macro names) that would bring those in. Test code (`#[cfg(test)]`
//! items, `tests.rs`) may use what it likes. Reading files is the source edge's
//! (`src/source/files.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use syn::visit::{self, Visit};

/// Path prefixes the pure stages may not name (`::`-joined, matched segment-wise).
const FORBIDDEN_PREFIXES: &[&str] = &[
    "tokio",
    "kube",
    "kube_runtime",
    "k8s_openapi",
    "rtnetlink",
    "netlink_packet_route",
    "netlink_sys",
    "netlink_packet_core",
    "nftables",
    "nix",
    "libc",
    "rand",
    "hyper",
    "std::process",
    "std::fs",
    "std::io",
    "std::net::TcpStream",
    "std::net::TcpListener",
    "std::net::UdpSocket",
    "std::time",
    "std::thread",
    "std::env",
    "std::os",
    "crate::apply",
    "crate::netns",
    "crate::agent",
    "crate::dns_proxy",
    "crate::source",
    "crate::sim",
    "crate::daemon",
    "crate::controller",
    "crate::process",
    "crate::conntrack::ConntrackSocket",
];

/// Paths under a forbidden prefix that are plain values: a `Duration` is a length of time
/// (a set element's timeout), not a reading of the clock (`Instant` and `SystemTime` stay
/// forbidden by name).
///
/// Scoped threads whose results are joined in input order are a way to compute, not an
/// effect: a large manifest or snapshot is built on every core, identical to one built on
/// one (how many cores only decides how the work is cut).
const ALLOWED_PATHS: &[&str] = &["std::time::Duration", "core::time::Duration", "std::thread::scope", "std::thread::available_parallelism"];

/// What one place may use, and why it stays pure there: (file path suffix or directory
/// prefix under `src/`, forbidden prefix or name it may use).
const EXCEPTIONS: &[(&str, &str)] = &[
    // The Kubernetes API types are plain data, and what the model is converted from (in one
    // place per source); the stages after it never see them.
    ("model/", "k8s_openapi"),
    // The label intern pool: strings looked up and dropped, never iterated into output.
    ("model/labels.rs", "HashSet"),
];

/// Names that are impure wherever they come from (hash order, clocks).
const FORBIDDEN_NAMES: &[&str] = &["HashMap", "HashSet", "RandomState", "Instant", "SystemTime"];

/// Macros that do I/O.
const FORBIDDEN_MACROS: &[&str] = &["println", "eprintln", "print", "eprint", "dbg"];

struct Checker<'a> {
    file: &'a Path,
    /// What this file may use ([`EXCEPTIONS`]).
    excepted: Vec<&'static str>,
    violations: Vec<String>,
}

impl Checker<'_> {
    fn check_path(&mut self, segments: &[String]) {
        let joined = segments.join("::");
        let allowed = ALLOWED_PATHS.iter().any(|a| {
            let a: Vec<&str> = a.split("::").collect();
            segments.len() >= a.len() && segments.iter().zip(&a).all(|(s, a)| s == a)
        });
        for f in FORBIDDEN_PREFIXES.iter().filter(|f| !allowed && !self.excepted.contains(f)) {
            let prefix: Vec<&str> = f.split("::").collect();
            if segments.len() >= prefix.len() && segments.iter().zip(&prefix).all(|(a, b)| a == b) {
                self.violations.push(format!("{}: `{joined}` ({f} is not pure)", self.file.display()));
            }
        }
        for n in FORBIDDEN_NAMES.iter().filter(|n| !self.excepted.contains(n)) {
            if segments.iter().any(|s| s == n) {
                self.violations.push(format!("{}: `{joined}` ({n} is not pure)", self.file.display()));
            }
        }
    }

    fn check_use(&mut self, tree: &syn::UseTree, prefix: &mut Vec<String>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.check_use(&p.tree, prefix);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.check_path(prefix);
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.check_path(prefix);
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.check_path(prefix),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.check_use(t, prefix);
                }
            }
        }
    }
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Meta>().is_ok_and(|m| matches!(&m, syn::Meta::Path(p) if p.is_ident("test")))
    }) || attrs.iter().any(|a| a.path().is_ident("test"))
}

impl<'ast> Visit<'ast> for Checker<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Impl(i) => &i.attrs,
            _ => &[],
        };
        if is_test_only(attrs) {
            return;
        }
        visit::visit_item(self, item);
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.check_use(&u.tree, &mut Vec::new());
    }

    fn visit_item_extern_crate(&mut self, e: &'ast syn::ItemExternCrate) {
        self.check_path(&[e.ident.to_string()]);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.check_path(&segments);
        visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        if let Some(last) = m.path.segments.last()
            && FORBIDDEN_MACROS.contains(&last.ident.to_string().as_str())
        {
            self.violations.push(format!("{}: `{}!` does I/O", self.file.display(), last.ident));
        }
        visit::visit_macro(self, m);
    }
}

/// Every `.rs` file under `dir`, at any depth, `tests.rs` files left out.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files.extend(sources(&p));
        } else if p.extension().is_some_and(|e| e == "rs") && p.file_name().is_some_and(|n| n != "tests.rs") {
            files.push(p);
        }
    }
    files
}

fn violations_in(file: &Path, text: &str) -> Vec<String> {
    let ast = syn::parse_file(text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let path = file.to_string_lossy();
    let excepted = EXCEPTIONS
        .iter()
        .filter(|(place, _)| path.ends_with(place) || (place.ends_with('/') && path.contains(&format!("src/{place}"))))
        .map(|(_, what)| *what)
        .collect();
    let mut c = Checker { file, excepted, violations: Vec::new() };
    c.visit_file(&ast);
    c.violations
}

#[test]
fn the_model_and_the_pure_stages_are_pure() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut checked = Vec::new();
    let mut violations = Vec::new();
    // The stages' plain data; the translator and renderer; the nft model (the fake applier,
    // the tracer); explain, which reads their output (and a listing it is given); what a DNS
    // answer teaches (the agent's DNS proxy feeds it bytes).
    let mut files: Vec<PathBuf> =
        ["model", "translate", "render", "nft", "explain", "dns", "conformance"].iter().flat_map(|d| sources(&root.join(d))).collect();
    // Which connections a policy change cuts.
    files.push(root.join("revoke.rs"));
    // What a PodSlice shows and where each pod goes.
    files.push(root.join("slices.rs"));
    for file in files {
        violations.extend(violations_in(&file, &std::fs::read_to_string(&file).unwrap()));
        checked.push(file.strip_prefix(&root).unwrap().display().to_string());
    }
    // Nested modules are walked too.
    for nested in ["model/manifest.rs", "render/rule.rs", "nft/trace.rs", "translate/ir.rs", "conformance/cluster.rs"] {
        assert!(checked.iter().any(|c| c == nested), "{nested} not checked: {checked:?}");
    }
    assert!(violations.is_empty(), "the pure stages may not use these:\n{}", violations.join("\n"));
}

#[test]
fn the_checker_catches_each_kind_of_impurity() {
    let bad = [
        ("use std::fs;", "std::fs"),
        ("use std::{collections::BTreeMap, time::Instant};", "Instant"),
        ("fn f() { let _ = std::process::Command::new(\"nft\"); }", "std::process"),
        ("fn f() -> std::collections::HashMap<u8, u8> { todo!() }", "HashMap"),
        ("use tokio as t;", "tokio"),
        ("fn f() { eprintln!(\"x\"); }", "eprintln"),
        ("use crate::apply::Applier;", "crate::apply"),
        ("extern crate nix;", "nix"),
        ("fn f(x: &dyn std::io::Write) {}", "std::io"),
        ("fn f() { let _ = std::time::SystemTime::now(); }", "std::time"),
        ("use std::time::{Duration, Instant};", "Instant"),
        ("fn f() { std::thread::spawn(|| ()); }", "std::thread"),
    ];
    for (code, what) in bad {
        let v = violations_in(Path::new("x.rs"), code);
        assert!(v.iter().any(|m| m.contains(what)), "{code}: {v:?}");
    }
    let fine = "use std::collections::BTreeMap;\nuse crate::model::Snapshot;\n\
                fn f(m: &BTreeMap<u8, u8>) -> String { format!(\"{}\", m.len()) }\n\
                fn d(t: std::time::Duration) -> u64 { t.as_secs() }\n\
                fn p() -> usize { std::thread::scope(|s| s.spawn(|| 1).join().unwrap_or(0)) }\n\
                #[cfg(test)]\nmod tests { use std::fs; fn g() { println!(\"ok\"); } }";
    assert_eq!(violations_in(Path::new("x.rs"), fine), Vec::<String>::new());
    // An exception holds where it is granted only.
    let api = "use k8s_openapi::api::core::v1::Pod;";
    assert!(violations_in(Path::new("src/model/convert.rs"), api).is_empty());
    assert!(!violations_in(Path::new("src/translate/mod.rs"), api).is_empty());
    assert!(!violations_in(Path::new("src/model/convert.rs"), "use std::collections::HashSet;").is_empty());
}
