//! The documentation agrees with the code: `docs/reference.md` lists every flag of every
//! program (from each binary's `--help`, with its environment variable and default) and every
//! metric flock-agent and flock-controller export (from their registries), and nothing else;
//! `docs/troubleshooting.md` names every kind of object a rendered table holds; flock-cni's
//! configuration keys are the ones its `NetConf` reads; every relative link of `README.md` and
//! `docs/*.md` resolves, anchors included; `README.md` stays an entry page (≤ 200 lines).
//!
//! Each test's failure lists everything that disagrees, per program, not only the first.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use regex::Regex;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn reference() -> String {
    read(&root().join("docs/reference.md"))
}

// ---------------------------------------------------------------------------------------
// Markdown helpers

/// The text without fenced code blocks (their lines become empty, so line numbers hold).
fn without_code_blocks(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if !fenced {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// A heading line's level and text (outside code blocks only: call on
/// [`without_code_blocks`]).
fn heading(line: &str) -> Option<(usize, &str)> {
    let level = line.chars().take_while(|c| *c == '#').count();
    if level == 0 || level > 6 || !line[level..].starts_with(' ') {
        return None;
    }
    Some((level, line[level..].trim()))
}

/// The lines under the heading whose text is `title`, up to the next heading of any level.
fn section(text: &str, title: &str) -> Option<Vec<String>> {
    let text = without_code_blocks(text);
    let mut lines = text.lines();
    lines.by_ref().find(|l| heading(l).is_some_and(|(_, t)| t == title))?;
    Some(lines.take_while(|l| heading(l).is_none()).map(str::to_string).collect())
}

/// The cells of a table row (`| a | b |`), `\|` kept as a literal `|` inside a cell.
fn cells(line: &str) -> Option<Vec<String>> {
    let line = line.trim();
    if !line.starts_with('|') {
        return None;
    }
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = line[1..].chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cur.push('|');
                chars.next();
            }
            '|' => out.push(std::mem::take(&mut cur).trim().to_string()),
            _ => cur.push(c),
        }
    }
    Some(out)
}

/// The tables of a section: each as its header cells and its data rows.
fn tables(lines: &[String]) -> Vec<(Vec<String>, Vec<Vec<String>>)> {
    let mut out: Vec<(Vec<String>, Vec<Vec<String>>)> = Vec::new();
    let mut in_table = false;
    for line in lines {
        match cells(line) {
            Some(row) if !in_table => {
                out.push((row.iter().map(|c| c.to_lowercase()).collect(), Vec::new()));
                in_table = true;
            }
            Some(row) if row.iter().all(|c| !c.is_empty() && c.chars().all(|ch| ch == '-' || ch == ':')) => {}
            Some(row) => out.last_mut().unwrap().1.push(row),
            None => in_table = false,
        }
    }
    out
}

/// The code spans of a cell (`` `a`, `b` `` → `a`, `b`).
fn code_spans(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

// ---------------------------------------------------------------------------------------
// README

#[test]
fn readme_is_an_entry_page_of_at_most_200_lines() {
    let lines = read(&root().join("README.md")).lines().count();
    assert!(lines <= 200, "README.md has {lines} lines; at most 200 (move detail into docs/)");
}

// ---------------------------------------------------------------------------------------
// Flags

/// One option of a `--help`: its environment variable and default, as clap prints them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Opt {
    env: Option<String>,
    default: Option<String>,
}

fn help(bin: &str, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).arg("--help").env_clear().output().unwrap();
    assert!(out.status.success(), "{bin} {args:?} --help failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The long options of a `--help` (`--help` itself left out), with what they say of their
/// environment variable and default.
fn options(help: &str) -> BTreeMap<String, Opt> {
    // clap indents an option two spaces, then `-x, ` or four spaces; descriptions more.
    let option = Regex::new(r"^  (?:-[A-Za-z0-9], |    )(--[a-z0-9][a-z0-9-]*)").unwrap();
    let env = Regex::new(r"\[env: ([A-Za-z0-9_]+)=[^\]]*\]").unwrap();
    // A default may hold brackets itself (`[::]:9781`): up to the `]` that ends the line's
    // annotation or precedes another one.
    let default = Regex::new(r"\[default: ((?:\[[^\]]*\]|[^\]\[])*)\]").unwrap();
    let mut texts: Vec<(String, String)> = Vec::new();
    let mut in_options = false;
    for line in help.lines() {
        if line.ends_with(':') && !line.starts_with(' ') {
            in_options = line == "Options:";
            continue;
        }
        if !in_options {
            continue;
        }
        if let Some(m) = option.captures(line) {
            texts.push((m[1].to_string(), line.to_string()));
        } else if let Some(last) = texts.last_mut() {
            last.1.push(' ');
            last.1.push_str(line.trim());
        }
    }
    texts
        .into_iter()
        .filter(|(flag, _)| flag != "--help")
        .map(|(flag, text)| {
            let opt =
                Opt { env: env.captures(&text).map(|c| c[1].to_string()), default: default.captures(&text).map(|c| c[1].to_string()) };
            (flag, opt)
        })
        .collect()
}

/// The subcommands a `--help` lists (`help` left out).
fn subcommands(help: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_commands = false;
    for line in help.lines() {
        if line.ends_with(':') && !line.starts_with(' ') {
            in_commands = line == "Commands:";
            continue;
        }
        if in_commands
            && let Some(name) = line.strip_prefix("  ").and_then(|l| l.split_whitespace().next())
            && name != "help"
        {
            out.push(name.to_string());
        }
    }
    out
}

/// What a cell of the environment or default column says: the value in its code span, or
/// `None` for a cell without one (`—`).
fn cell_value(cell: &str) -> Option<String> {
    code_spans(cell).into_iter().next()
}

/// What the reference says of one flag: the environment column (`None` when the table has
/// none; `Some(None)` for `—`) and the default column.
type Documented = (Option<Option<String>>, Option<String>);

/// The flags the reference documents under `title`: every `--flag` in the first column of
/// its tables, with the environment and default columns when the table has them.
fn documented_flags(reference: &str, title: &str) -> Result<BTreeMap<String, Documented>, String> {
    let lines = section(reference, title).ok_or_else(|| format!("no heading {title:?} in docs/reference.md"))?;
    let mut out = BTreeMap::new();
    for (header, rows) in tables(&lines) {
        if header.first().map(String::as_str) != Some("flag") {
            continue;
        }
        let env_col = header.iter().position(|h| h == "environment");
        let default_col = header.iter().position(|h| h == "default");
        for row in rows {
            for span in code_spans(&row[0]) {
                if !span.starts_with("--") {
                    continue;
                }
                let env = env_col.map(|i| row.get(i).and_then(|c| cell_value(c)));
                let default = default_col.and_then(|i| row.get(i)).and_then(|c| cell_value(c));
                if out.insert(span.clone(), (env, default)).is_some() {
                    return Err(format!("{span} is documented twice under {title:?}"));
                }
            }
        }
    }
    Ok(out)
}

/// The programs and subcommands whose flags the reference documents: the heading, the
/// binary and its arguments.
fn programs() -> Vec<(String, String, Vec<String>)> {
    let flockctl = env!("CARGO_BIN_EXE_flockctl");
    let apiserver = flock::testkit::kernel::workspace_binary("flock-test-apiserver", "flock-test-apiserver");
    let mut out = vec![
        ("flock-agent flags".to_string(), env!("CARGO_BIN_EXE_flock-agent").to_string(), vec![]),
        ("flock-controller flags".to_string(), env!("CARGO_BIN_EXE_flock-controller").to_string(), vec![]),
        ("flock-socket-keeper flags".to_string(), env!("CARGO_BIN_EXE_flock-socket-keeper").to_string(), vec![]),
        ("flockctl flags".to_string(), flockctl.to_string(), vec![]),
        ("flock-test-apiserver flags".to_string(), apiserver.to_string_lossy().into_owned(), vec![]),
    ];
    for sub in subcommands(&help(flockctl, &[])) {
        out.push((format!("flockctl {sub}"), flockctl.to_string(), vec![sub]));
    }
    out
}

#[test]
fn reference_documents_every_flag_of_every_program_and_no_other() {
    let reference = reference();
    let mut problems = Vec::new();
    for (title, bin, args) in programs() {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let program = format!("{} {}", Path::new(&bin).file_name().unwrap().to_string_lossy(), args.join(" "));
        let program = program.trim();
        let opts = options(&help(&bin, &args));
        let documented = match documented_flags(&reference, &title) {
            Ok(d) => d,
            Err(e) => {
                problems.push(format!("{program}: {e} (it has {})", opts.keys().cloned().collect::<Vec<_>>().join(", ")));
                continue;
            }
        };
        let missing: Vec<&String> = opts.keys().filter(|f| !documented.contains_key(*f)).collect();
        let extra: Vec<&String> = documented.keys().filter(|f| !opts.contains_key(*f)).collect();
        if !missing.is_empty() {
            problems.push(format!("{program}: not in docs/reference.md ({title:?}): {missing:?}"));
        }
        if !extra.is_empty() {
            problems.push(format!("{program}: documented under {title:?} but not in --help: {extra:?}"));
        }
        for (flag, opt) in &opts {
            let Some((env, default)) = documented.get(flag) else { continue };
            match env {
                Some(env) if *env != opt.env => {
                    problems.push(format!("{program} {flag}: environment {:?} in --help, {:?} in the reference", opt.env, env));
                }
                None if opt.env.is_some() => {
                    problems.push(format!("{program} {flag}: --help names environment {:?}; the table has no environment column", opt.env));
                }
                _ => {}
            }
            if *default != opt.default {
                problems.push(format!("{program} {flag}: default {:?} in --help, {:?} in the reference", opt.default, default));
            }
        }
    }
    assert!(problems.is_empty(), "docs/reference.md and the programs disagree:\n  {}", problems.join("\n  "));
}

#[test]
fn the_help_parser_sees_options_environment_and_defaults() {
    // The parser the test above relies on, on clap's two layouts.
    let short = "Usage: x\n\nOptions:\n  -f, --manifests <PATH>  Files; repeatable\n      --timeout-ms <MS>   Probe timeout [default: 1000]\n  -h, --help              Print help\n";
    let long = "Usage: y\n\nOptions:\n      --node-name <NODE_NAME>\n          This node [env: NODE_NAME=]\n\n      --metrics-address <A>\n          Where [env: FLOCK_METRICS_ADDRESS=] [default: [::]:9781]\n\n      --resync-period <P>\n          Period\n          --dataplane: not an option [env: FLOCK_RESYNC_PERIOD=x] [default: 30s]\n  -V, --version\n          Print version\n";
    let s = options(short);
    assert_eq!(s.keys().collect::<Vec<_>>(), ["--manifests", "--timeout-ms"]);
    assert_eq!(s["--timeout-ms"], Opt { env: None, default: Some("1000".into()) });
    let l = options(long);
    assert_eq!(l.keys().collect::<Vec<_>>(), ["--metrics-address", "--node-name", "--resync-period", "--version"]);
    assert_eq!(l["--node-name"], Opt { env: Some("NODE_NAME".into()), default: None });
    assert_eq!(l["--metrics-address"], Opt { env: Some("FLOCK_METRICS_ADDRESS".into()), default: Some("[::]:9781".into()) });
    assert_eq!(l["--resync-period"], Opt { env: Some("FLOCK_RESYNC_PERIOD".into()), default: Some("30s".into()) });
    assert_eq!(subcommands("x\n\nCommands:\n  render  R\n  help    H\n\nOptions:\n"), ["render"]);
}

// ---------------------------------------------------------------------------------------
// flock-cni

/// The network configuration keys flock-cni's `NetConf` reads (its serde names).
fn netconf_keys() -> BTreeSet<String> {
    let file = syn::parse_file(&read(&root().join("cni-plugin/src/spec.rs"))).unwrap();
    let netconf = file
        .items
        .iter()
        .find_map(|i| match i {
            syn::Item::Struct(s) if s.ident == "NetConf" => Some(s),
            _ => None,
        })
        .expect("struct NetConf in cni-plugin/src/spec.rs");
    let mut keys = BTreeSet::new();
    for field in &netconf.fields {
        let mut name = field.ident.as_ref().unwrap().to_string();
        for attr in field.attrs.iter().filter(|a| a.path().is_ident("serde")) {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("rename") {
                    name = meta.value()?.parse::<syn::LitStr>()?.value();
                } else if meta.input.peek(syn::Token![=]) {
                    meta.value()?.parse::<syn::Expr>()?;
                }
                Ok(())
            })
            .unwrap();
        }
        keys.insert(name);
    }
    keys
}

#[test]
fn reference_documents_flock_cni_configuration_and_no_flags() {
    let reference = reference();
    let lines = section(&reference, "Network configuration keys").expect("a heading \"Network configuration keys\"");
    let documented: BTreeSet<String> = tables(&lines)
        .into_iter()
        .filter(|(h, _)| h.first().map(String::as_str) == Some("key"))
        .flat_map(|(_, rows)| rows)
        .flat_map(|row| code_spans(&row[0]))
        .collect();
    let keys = netconf_keys();
    let missing: Vec<&String> = keys.difference(&documented).collect();
    let extra: Vec<&String> = documented.difference(&keys).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "flock-cni: network configuration keys not in docs/reference.md: {missing:?}; documented but not read by NetConf: {extra:?}"
    );
    // flock-cni reads the CNI environment and stdin, never its command line: no flags to
    // document (the reference says so).
    let main = read(&root().join("cni-plugin/src/main.rs"));
    assert!(!main.contains("args()") && !main.contains("clap"), "flock-cni parses its command line now: document its flags");
    let cni = section(&reference, "flock-cni").expect("a heading \"flock-cni\"").join("\n");
    assert!(cni.contains("no command-line flags"), "the reference's flock-cni section should say it takes no flags");
}

// ---------------------------------------------------------------------------------------
// Metrics

/// The metric families of a text exposition: name → (type, label names seen in samples;
/// `None` when the family has no sample).
fn families(exposition: &str) -> BTreeMap<String, (String, Option<BTreeSet<String>>)> {
    let label = Regex::new(r#"([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*""#).unwrap();
    let mut out: BTreeMap<String, (String, Option<BTreeSet<String>>)> = BTreeMap::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            let (name, kind) = (words.next().unwrap(), words.next().unwrap());
            out.insert(name.to_string(), (kind.to_string(), None));
        }
    }
    for line in exposition.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let sample = &line[..end];
        let family = out
            .keys()
            .filter(|f| {
                sample == f.as_str()
                    || ["_total", "_bucket", "_sum", "_count", "_created", "_info"]
                        .iter()
                        .any(|s| sample.strip_suffix(s) == Some(f.as_str()))
            })
            .max_by_key(|f| f.len())
            .unwrap_or_else(|| panic!("sample {sample} of no family in\n{exposition}"))
            .clone();
        let labels: BTreeSet<String> = match line[end..].strip_prefix('{') {
            Some(rest) => {
                let inner = &rest[..rest.find("} ").or_else(|| rest.rfind('}')).unwrap()];
                label.captures_iter(inner).map(|c| c[1].to_string()).filter(|l| l != "le").collect()
            }
            None => BTreeSet::new(),
        };
        out.get_mut(&family).unwrap().1.get_or_insert_with(BTreeSet::new).extend(labels);
    }
    out
}

/// The metrics the reference documents under `title`: name (as queried: counters with
/// `_total`) → (type, labels).
fn documented_metrics(reference: &str, title: &str) -> BTreeMap<String, (String, BTreeSet<String>)> {
    let lines = section(reference, title).unwrap_or_else(|| panic!("no heading {title:?} in docs/reference.md"));
    let name = Regex::new(r"^([a-z_][a-z0-9_]*)(?:\{([a-z0-9_,]*)\})?$").unwrap();
    let mut out = BTreeMap::new();
    for (header, rows) in tables(&lines) {
        if header.first().map(String::as_str) != Some("metric") {
            continue;
        }
        let type_col = header.iter().position(|h| h == "type").expect("a type column");
        for row in rows {
            let span = code_spans(&row[0]).into_iter().next().unwrap_or_else(|| panic!("{title}: a row without a metric: {row:?}"));
            let m = name.captures(&span).unwrap_or_else(|| panic!("{title}: {span:?} is not `name` or `name{{label,…}}`"));
            let labels =
                m.get(2).map(|l| l.as_str().split(',').filter(|s| !s.is_empty()).map(str::to_string).collect()).unwrap_or_default();
            out.insert(m[1].to_string(), (row[type_col].trim_matches('`').to_string(), labels));
        }
    }
    out
}

fn compare_metrics(program: &str, exposition: &str, title: &str, problems: &mut Vec<String>) {
    let exported = families(exposition);
    let documented = documented_metrics(&reference(), title);
    let queried = |family: &str, kind: &str| if kind == "counter" { format!("{family}_total") } else { family.to_string() };
    let mut seen = BTreeSet::new();
    for (family, (kind, labels)) in &exported {
        let name = queried(family, kind);
        seen.insert(name.clone());
        let Some((doc_kind, doc_labels)) = documented.get(&name) else {
            let labels = labels.as_ref().map(|l| l.iter().cloned().collect::<Vec<_>>().join(",")).unwrap_or_else(|| "…".into());
            problems.push(format!("{program}: {name}{{{labels}}} ({kind}) is not in docs/reference.md ({title:?})"));
            continue;
        };
        if doc_kind != kind {
            problems.push(format!("{program}: {name} is a {kind}; the reference says {doc_kind}"));
        }
        match labels {
            Some(labels) if labels != doc_labels => {
                problems.push(format!("{program}: {name} has labels {labels:?}; the reference says {doc_labels:?}"));
            }
            // A family with no series yet: labelled (every unlabelled metric has a sample).
            None if doc_labels.is_empty() => {
                problems.push(format!("{program}: {name} is a labelled family; document it as {name}{{label,…}}"));
            }
            _ => {}
        }
    }
    for name in documented.keys().filter(|n| !seen.contains(*n)) {
        problems.push(format!("{program}: {name} is documented under {title:?} but not exported"));
    }
}

/// The family names a metrics source registers (`register("name", …)`), with `prefix`.
fn registered(source: &str, prefix: &str) -> BTreeSet<String> {
    let register = Regex::new(r#"\.register\(\s*"([a-z0-9_]+)""#).unwrap();
    register.captures_iter(&read(&root().join(source))).map(|c| format!("{prefix}{}", &c[1])).collect()
}

/// flock-agent's exposition with a series in every family: an empty family is not encoded
/// at all, so each recording method is called once.
fn agent_exposition() -> String {
    let m = flock::agent::metrics::Metrics::new();
    m.sync(true, 0.01);
    m.sync_failed("nft_rejected");
    m.enforced("source", 0.01);
    m.tracked(1, 1, 1);
    m.cluster_policies_tracked(1);
    m.ruleset(1, 1);
    m.watch("pods", true);
    m.watch_error("pods");
    m.watch_reconnected("pods");
    m.watch_relisted("pods", "initial");
    m.api_probe(true);
    m.health("Connected");
    m.resource_served("clusternetworkpolicies", true);
    m.denied("x", "ingress");
    m.audit_denied("x", "ingress");
    m.allowed_logged("x", "ingress");
    m.revocation_sweep(Some((1, 0.01)));
    m.revoked("x", "ingress");
    m.denial_records_lost();
    m.denial_record_unreadable();
    m.cni("add", true);
    m.coalesced(1);
    m.drift_repaired();
    m.translated("full");
    m.translation_disagreed();
    m.problems(1);
    m.cluster_problems(1);
    m.reporter(true);
    m.cluster_policies_enforced(1, 0);
    m.status_request("get", true);
    m.event_request("get", true);
    m.node_status_write(true);
    use flock::dns_proxy::learner::LearnedStats;
    m.learned("x/p[0]", 1);
    m.evicted(1, 1);
    m.encode()
}

/// flock-controller's exposition with a series in every family.
fn controller_exposition() -> String {
    use flock::controller::metrics::{ApplyResult, Metrics};
    let m = Metrics::new();
    m.applied(ApplyResult::Recreated);
    m.deleted();
    m.enforcement(true);
    m.reconciled("Run", 0.01);
    m.reconcile_error("Run");
    m.runs_in_backoff(1);
    m.leader(true);
    m.audited("Granted");
    m.audit_collected(1);
    m.audit_collection_failed();
    m.slice_write("create", "ok");
    m.slice_totals(1, 1, 0);
    m.encode()
}

#[test]
fn reference_documents_every_metric_and_no_other() {
    let mut problems = Vec::new();
    let agent = agent_exposition();
    let controller = controller_exposition();
    // Every family the sources register is in the exposition (else this test would not see
    // a new one): a family without a series is not encoded.
    for (program, exposition, source, prefix) in [
        ("flock-agent", &agent, "src/agent/metrics.rs", "flock_"),
        ("flock-controller", &controller, "src/controller/metrics.rs", "flock_controller_"),
    ] {
        let exported = families(exposition);
        for name in registered(source, prefix).iter().filter(|n| !exported.contains_key(*n)) {
            problems.push(format!("{program}: {name} is registered in {source} but has no series here: record one in tests/docs.rs"));
        }
    }
    compare_metrics("flock-agent", &agent, "flock-agent metrics", &mut problems);
    compare_metrics("flock-controller", &controller, "flock-controller metrics", &mut problems);
    assert!(problems.is_empty(), "docs/reference.md and the exporters disagree:\n  {}", problems.join("\n  "));
}

#[test]
fn the_exposition_parser_sees_families_types_and_labels() {
    let text = "# HELP a_b A.\n# TYPE a_b counter\na_b_total{x=\"1\",y=\"q\\\"}\"} 2\n# TYPE c gauge\nc 1\n# TYPE d histogram\nd_bucket{le=\"1\"} 0\nd_sum 0\nd_count 0\n# TYPE e counter\n# EOF\n";
    let f = families(text);
    assert_eq!(f["a_b"], ("counter".into(), Some(["x".to_string(), "y".to_string()].into())));
    assert_eq!(f["c"], ("gauge".into(), Some(BTreeSet::new())));
    assert_eq!(f["d"], ("histogram".into(), Some(BTreeSet::new())));
    assert_eq!(f["e"], ("counter".into(), None));
}

// ---------------------------------------------------------------------------------------
// The ruleset's objects

/// Objects of every kind a table can hold, beyond what the goldens show: peer classes, ties
/// of equal priority, Admin tiers, log-allowed namespaces, audited policies and audited
/// ties, named ports of ClusterNetworkPolicies, domain rules, both families.
const ALL_OBJECTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: w, labels: {kubernetes.io/metadata.name: w}, annotations: {flock.dev/log-allowed: "true"}}
---
apiVersion: v1
kind: Pod
metadata: {name: logged, namespace: w, labels: {pod: logged}}
spec: {nodeName: node-1, containers: [{name: c, image: x, ports: [{containerPort: 80, name: http, protocol: TCP}]}]}
status: {phase: Running, podIP: 198.18.1.77, podIPs: [{ip: 198.18.1.77}]}
---
apiVersion: v1
kind: Pod
metadata: {name: named, namespace: w, labels: {pod: named}}
spec: {nodeName: node-1, containers: [{name: c, image: x, ports: [{containerPort: 80, name: http, protocol: TCP}]}]}
status: {phase: Running, podIP: 198.18.1.78, podIPs: [{ip: 198.18.1.78}, {ip: "fd00:1::78"}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: w-ingress, namespace: w}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: x}}}], ports: [{port: http}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: many, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Ingress, Egress]
  ingress:
  - {from: [{podSelector: {matchLabels: {pod: b}}}], ports: [{port: 80}]}
  - {from: [{podSelector: {matchLabels: {pod: c}}}]}
  - {from: [{namespaceSelector: {matchLabels: {ns: y}}, podSelector: {matchLabels: {pod: a}}}]}
  - {from: [{namespaceSelector: {matchLabels: {ns: z}}}]}
  - {from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}]}
  - {from: [{ipBlock: {cidr: 192.0.2.0/24}}]}
  - {from: [{ipBlock: {cidr: 203.0.113.0/24}}]}
  - {from: [{namespaceSelector: {matchLabels: {ns: y}}, podSelector: {matchLabels: {pod: b}}}]}
  - {ports: [{port: 443}]}
  egress:
  - {to: [{podSelector: {matchLabels: {pod: b}}}], ports: [{port: serve-81-tcp}]}
  - {to: [{ipBlock: {cidr: 10.0.0.0/8}}]}
  - {to: [{namespaceSelector: {matchLabels: {ns: y}}}], ports: [{port: serve-80-tcp}]}
  - {to: [{namespaceSelector: {matchLabels: {ns: z}}}]}
  - {to: [{ipBlock: {cidr: 192.0.2.0/24}}]}
  - {to: [{ipBlock: {cidr: 203.0.113.0/24}}]}
  - {to: [{podSelector: {matchLabels: {pod: c}}}]}
  - {to: [{ipBlock: {cidr: 198.51.100.0/24}}]}
  - {ports: [{port: 53, protocol: UDP}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: audited, namespace: y, annotations: {flock.dev/enforcement: audit}}
spec: {podSelector: {}, policyTypes: [Ingress]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: accept-y}
spec:
  tier: Admin
  priority: 7
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}}
  ingress: [{name: accept-from-y, action: Accept, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: y}}}]}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: deny-y-a}
spec:
  tier: Admin
  priority: 7
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}}
  ingress:
  - name: deny-from-y-a
    action: Deny
    from: [{pods: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}, podSelector: {matchLabels: {pod: a}}}}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: by-name}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}}
  egress:
  - {name: by-name, action: Accept, to: [{domainNames: [api.example.test, "*.example.org"]}], protocols: [{tcp: {destinationPort: {number: 80}}}]}
  - {name: nodes, action: Accept, to: [{nodes: {matchLabels: {kubernetes.io/os: linux}}}]}
  - {name: nothing-else, action: Deny, to: [{networks: ["0.0.0.0/0"]}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: audited-a, annotations: {flock.dev/enforcement: audit}}
spec:
  tier: Admin
  priority: 20
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: y}}}
  egress: [{name: deny-x, action: Deny, to: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}]}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: audited-b, annotations: {flock.dev/enforcement: audit}}
spec:
  tier: Admin
  priority: 20
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: y}}}
  egress: [{name: accept-x, action: Accept, to: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}]}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: named-port}
spec:
  tier: Baseline
  priority: 5
  subject: {pods: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: w}}, podSelector: {matchLabels: {pod: named}}}}
  egress:
  - {name: to-http, action: Accept, to: [{pods: {namespaceSelector: {}, podSelector: {}}}], protocols: [{destinationNamedPort: http}]}
  - {name: to-v6, action: Deny, to: [{networks: ["fd00::/8"]}]}
"#;

/// An object's name as the troubleshooting page lists it: static names as they are, dynamic
/// ones (`<purpose>-<HASH8>-<human>`) as `<purpose>-…`, a peer class's sets as
/// `<purpose>-…/all` or `…/ports`.
fn object_kind(kind: &str, name: &str) -> String {
    let dynamic = Regex::new(r"^(.+?)-[A-Z2-7]{8}-(.*)$").unwrap();
    match dynamic.captures(name) {
        None => name.to_string(),
        Some(c) if kind == "set" && c[1].ends_with("-class") => {
            format!("{}-…/{}", &c[1], c[2].rsplit('/').next().unwrap())
        }
        Some(c) => format!("{}-…", &c[1]),
    }
}

/// Every object kind of an nft listing: `chain`/`set`/`map` and its documented name.
fn object_kinds(nft: &str) -> BTreeSet<(String, String)> {
    let object = Regex::new(r"^\s*(chain|set|map) (\S+) \{").unwrap();
    nft.lines().filter_map(|l| object.captures(l)).map(|c| (c[1].to_string(), object_kind(&c[1], &c[2]))).collect()
}

#[test]
fn troubleshooting_names_every_object_a_table_holds() {
    let mut tables: Vec<(String, String)> = Vec::new();
    let golden = root().join("tests/golden");
    for entry in std::fs::read_dir(&golden).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "nft") {
            tables.push((path.display().to_string(), read(&path)));
        }
    }
    let manifest = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("docs-all-objects-{}.yaml", std::process::id()));
    std::fs::write(&manifest, ALL_OBJECTS).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_flockctl"))
        .args(["render", "--allow-audit-mode", "--node", "node-1", "-f"])
        .arg(root().join("tests/conformance/base-cluster.yaml"))
        .arg("-f")
        .arg(&manifest)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&manifest);
    assert!(out.status.success(), "flockctl render failed: {}", String::from_utf8_lossy(&out.stderr));
    tables.push(("flockctl render of ALL_OBJECTS".into(), String::from_utf8(out.stdout).unwrap()));

    let page = read(&root().join("docs/troubleshooting.md"));
    let listed = section_from(&page, "Every object in the table");
    let mut missing: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut all = BTreeSet::new();
    for (source, nft) in &tables {
        for (kind, name) in object_kinds(nft) {
            if !listed.contains(&format!("`{name}`")) {
                missing.entry((kind.clone(), name.clone())).or_default().push(source.clone());
            }
            all.insert(name);
        }
    }
    // The render above must cover what it was written for, or this test checks less.
    for expected in ["ingress-class-…/ports", "ingress-tie-…", "audit-egress-tie-…", "ingress-allow-…", "nport-v4-…", "domains-v6-…"]
    {
        assert!(all.contains(expected), "no {expected} in any table: ALL_OBJECTS no longer renders one");
    }
    let missing: Vec<String> = missing.iter().map(|((k, n), s)| format!("{k} {n} (in {})", s.join(", "))).collect();
    assert!(missing.is_empty(), "docs/troubleshooting.md, \"Every object in the table\", does not name:\n  {}", missing.join("\n  "));
}

/// The text from the heading `title` to the end of its level (subsections included).
fn section_from(text: &str, title: &str) -> String {
    let text = without_code_blocks(text);
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.iter().position(|l| heading(l).is_some_and(|(_, t)| t == title)).unwrap_or_else(|| panic!("no heading {title:?}"));
    let level = heading(lines[start]).unwrap().0;
    lines[start + 1..].iter().take_while(|l| heading(l).is_none_or(|(lv, _)| lv > level)).copied().collect::<Vec<_>>().join("\n")
}

#[test]
fn object_names_reduce_to_their_kind() {
    assert_eq!(object_kind("chain", "forward"), "forward");
    assert_eq!(object_kind("chain", "ingress-deny-6LHNZM62-shop/db"), "ingress-deny-…");
    assert_eq!(object_kind("chain", "egress-class-ABCDEFGH-x/all"), "egress-class-…");
    assert_eq!(object_kind("set", "egress-class-ABCDEFGH-x/pod.b/ports"), "egress-class-…/ports");
    assert_eq!(object_kind("set", "peers-v4-ABCDEFGH-ns-x/all"), "peers-v4-…");
}

// ---------------------------------------------------------------------------------------
// Links

/// GitHub's anchor for a heading: lowercase; letters, digits, `-`, `_` and spaces kept, the
/// spaces as `-`; everything else dropped (inline markup included).
fn slug(heading: &str) -> String {
    let text = Regex::new(r"\[([^\]]*)\]\([^)]*\)").unwrap().replace_all(heading, "$1");
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file: its headings' slugs (repeats get `-1`, `-2`, … as on
/// GitHub) and explicit `<a id>`/`<a name>` anchors.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let text = without_code_blocks(text);
    for (_, h) in text.lines().filter_map(heading) {
        let s = slug(h);
        let n = seen.entry(s.clone()).or_insert(0);
        out.insert(if *n == 0 { s.clone() } else { format!("{s}-{n}") });
        *n += 1;
    }
    let explicit = Regex::new(r#"<a (?:id|name)="([^"]+)""#).unwrap();
    out.extend(explicit.captures_iter(&text).map(|c| c[1].to_string()));
    out
}

fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

#[test]
fn every_relative_link_resolves() {
    let link = Regex::new(r"\[[^\]]*\]\(([^)\s]+)\)").unwrap();
    let inline_code = Regex::new(r"`[^`]*`").unwrap();
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = read(&file);
        let prose = without_code_blocks(&text);
        for (n, line) in prose.lines().enumerate() {
            let line = inline_code.replace_all(line, "");
            for c in link.captures_iter(&line) {
                let target = &c[1];
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let at = format!("{}:{}: {target}", file.strip_prefix(root()).unwrap().display(), n + 1);
                let (path, anchor) = target.split_once('#').map_or((target, None), |(p, a)| (p, Some(a)));
                let dest = if path.is_empty() { file.clone() } else { file.parent().unwrap().join(path) };
                if !dest.exists() {
                    problems.push(format!("{at}: {} does not exist", dest.display()));
                    continue;
                }
                if let Some(anchor) = anchor {
                    if dest.extension().is_none_or(|e| e != "md") {
                        problems.push(format!("{at}: an anchor into a file that is not Markdown"));
                    } else if !anchors(&read(&dest)).contains(anchor) {
                        problems.push(format!("{at}: no heading with anchor #{anchor} in {}", dest.display()));
                    }
                }
            }
        }
    }
    assert!(checked > 0, "no relative links found: the link pattern is broken");
    assert!(problems.is_empty(), "broken links:\n  {}", problems.join("\n  "));
}

#[test]
fn slugs_follow_github() {
    assert_eq!(slug("Revocation: a policy change cuts what it now denies"), "revocation-a-policy-change-cuts-what-it-now-denies");
    assert_eq!(slug("flock's own isolation comes first"), "flocks-own-isolation-comes-first");
    assert_eq!(slug("`flockctl` and [flock-cni](x.md)"), "flockctl-and-flock-cni");
    assert_eq!(slug("Is the node enforcing?"), "is-the-node-enforcing");
    let a = anchors("# A\n## A\n```\n# not a heading\n```\n<a id=\"x\"></a>\n");
    assert_eq!(a, ["a".to_string(), "a-1".to_string(), "x".to_string()].into());
}

// ---------------------------------------------------------------------------------------
// Helm values

/// The leaf values of a values schema (objects recursed into; anything else is a value), as
/// dotted paths.
fn schema_leaves(schema: &serde_json::Value, prefix: &str, out: &mut BTreeSet<String>) {
    match schema.get("properties").and_then(serde_json::Value::as_object) {
        // Resources are one value (requests and limits), as the reference lists them.
        Some(props) if !prefix.ends_with("resources") => {
            for (k, v) in props {
                let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                schema_leaves(v, &path, out);
            }
        }
        _ => {
            out.insert(prefix.to_string());
        }
    }
}

/// Every value of the chart's schema is a row of the reference's Helm values table, and
/// every row is a value of the schema; each object of the schema refuses unknown keys.
#[test]
fn reference_lists_every_helm_value() {
    let schema: serde_json::Value = serde_json::from_str(&read(&root().join("deploy/helm/flock/values.schema.json"))).unwrap();
    let mut want = BTreeSet::new();
    schema_leaves(&schema, "", &mut want);
    fn closed(v: &serde_json::Value, path: &str) {
        if let Some(props) = v.get("properties").and_then(serde_json::Value::as_object) {
            assert_eq!(v.get("additionalProperties"), Some(&serde_json::Value::Bool(false)), "{path} accepts unknown keys");
            for (k, p) in props {
                closed(p, &format!("{path}.{k}"));
            }
        }
        if let Some(items) = v.get("items") {
            closed(items, &format!("{path}[]"));
        }
    }
    closed(&schema, "values");
    let lines = section(&reference(), "Helm values").expect("docs/reference.md has no Helm values section");
    let mut have = BTreeSet::new();
    for (header, rows) in tables(&lines) {
        assert_eq!(header.first().map(String::as_str), Some("value"), "{header:?}");
        for row in rows {
            have.extend(code_spans(&row[0]));
        }
    }
    let missing: Vec<_> = want.difference(&have).collect();
    let extra: Vec<_> = have.difference(&want).collect();
    assert!(missing.is_empty() && extra.is_empty(), "docs/reference.md#helm-values: missing {missing:?}, not values {extra:?}");
}
