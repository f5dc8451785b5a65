//! `flockctl whatif`: which flows a change to the cluster's objects would open or close —
//! every (source pod, destination pod, port, protocol, family) whose verdict changes, with
//! what decided it before and after (`flock::explain::whatif`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};

use flock::explain::observed;
use flock::explain::whatif::{self, Scope, WhatIf};
use flock::model::manifest::{Kind, apply_change};
use flock::model::{Family, ObjectRef, Protocol};
use flock::translate::Options;

use crate::cluster::ClusterArgs;
use crate::explain::{parse_family, parse_protocol};

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Args)]
pub struct WhatifArgs {
    /// The cluster as it is: manifest files or directories (multi-document YAML, List
    /// kinds), repeatable. Without --manifests: the cluster of the kubeconfig.
    #[arg(long = "manifests", short = 'f', value_name = "PATH", num_args = 1.., conflicts_with_all = ["kubeconfig", "context"])]
    manifests: Vec<PathBuf>,
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The change: manifests to create or replace (policies, pods, namespaces), repeatable.
    #[arg(long, value_name = "FILE", num_args = 1.., required_unless_present = "delete")]
    apply: Vec<PathBuf>,
    /// The change: an object to delete, `networkpolicy/NS/NAME`, `clusternetworkpolicy/NAME`,
    /// `pod/NS/NAME` or `namespace/NAME`; repeatable.
    #[arg(long, value_name = "KIND/[NS/]NAME")]
    delete: Vec<String>,
    /// Only this destination port (default: every port each destination pod declares).
    #[arg(long)]
    port: Option<u16>,
    /// Only this protocol: TCP, UDP or SCTP (with --port: default TCP).
    #[arg(long, value_parser = parse_protocol)]
    protocol: Option<Protocol>,
    /// Only this family: IPv4 or IPv6 (default: each family both pods have).
    #[arg(long, value_parser = parse_family)]
    family: Option<Family>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value = "table")]
    output: Output,
    /// List at most this many changed flows (all are counted).
    #[arg(long, default_value = "1000")]
    max_changes: usize,
    /// As the agent's --no-run-pod-isolation.
    #[arg(long)]
    no_run_pod_isolation: bool,
    /// As flock-agent's --allow-audit-mode.
    #[arg(long)]
    allow_audit_mode: bool,
    /// Exit with status 1 when any flow changes (0 when none; errors exit 2), for scripts.
    #[arg(long)]
    exit_code: bool,
    /// Judge only the flows flock-agent saw: its JSON log lines (--log-format json) of target
    /// flock::denied (denials and allowed connections), from files or `-` (stdin);
    /// repeatable. Lists the observed flows the change flips.
    #[arg(long, value_name = "FILE")]
    flows: Vec<PathBuf>,
}

/// `kind/ns/name` or, cluster-scoped, `kind/name`.
fn parse_delete(s: &str) -> anyhow::Result<(Kind, ObjectRef)> {
    let parts: Vec<&str> = s.split('/').collect();
    let kind = match parts.first().map(|k| k.to_ascii_lowercase()).as_deref() {
        Some("networkpolicy" | "networkpolicies" | "netpol") => Kind::NetworkPolicy,
        Some("clusternetworkpolicy" | "clusternetworkpolicies" | "cnp") => Kind::ClusterNetworkPolicy,
        Some("pod" | "pods" | "po") => Kind::Pod,
        Some("namespace" | "namespaces" | "ns") => Kind::Namespace,
        _ => bail!("--delete {s}: the kind is networkpolicy, clusternetworkpolicy, pod or namespace"),
    };
    let namespaced = matches!(kind, Kind::NetworkPolicy | Kind::Pod);
    match (namespaced, parts.as_slice()) {
        (true, [_, ns, name]) if !ns.is_empty() && !name.is_empty() => Ok((kind, ObjectRef::new(*ns, *name))),
        (false, [_, name]) if !name.is_empty() => Ok((kind, ObjectRef::new("", *name))),
        (true, _) => bail!("--delete {s}: a {kind} is named {}/NAMESPACE/NAME", parts[0]),
        (false, _) => bail!("--delete {s}: a {kind} is named {}/NAME", parts[0]),
    }
}

pub fn run(args: &WhatifArgs) -> anyhow::Result<ExitCode> {
    let deletes = args.delete.iter().map(|d| parse_delete(d)).collect::<anyhow::Result<Vec<_>>>()?;
    let before = if args.manifests.is_empty() {
        crate::cluster::read(&args.cluster, "whatif")?
    } else {
        let m = flock::source::files::load_manifests(&args.manifests).context("reading manifests")?;
        for w in &m.warnings {
            eprintln!("warning: {}", flock::text::visible(&w.to_string()));
        }
        m.into_snapshot()
    };
    for (kind, key) in &deletes {
        let present = match kind {
            Kind::NetworkPolicy => before.policies().any(|p| p.key() == *key),
            Kind::ClusterNetworkPolicy => before.cluster_policies().any(|p| p.name == key.name),
            Kind::Pod => before.pod_by_name(key).is_some(),
            Kind::Namespace => before.namespace(&key.name).is_some(),
            Kind::Node => before.node(&key.name).is_some(),
        };
        if !present {
            bail!("--delete: there is no {kind} {key} to delete");
        }
    }
    let change = flock::source::files::load_manifests(&args.apply).context("reading --apply")?;
    for w in &change.warnings {
        eprintln!("warning: --apply: {}", flock::text::visible(&w.to_string()));
    }
    let mut after = before.clone();
    apply_change(&mut after, &change.objects, &deletes);
    let options = Options {
        isolate_run_pods: !args.no_run_pod_isolation,
        audit_mode: args.allow_audit_mode,
        dns_resolvers: None,
        overlay_port: None,
        overlay_node: None,
    };
    let scope = Scope { port: args.port, protocol: args.protocol, family: args.family };
    if !args.flows.is_empty() {
        return observed(args, &before, &after, &options, &scope);
    }
    let w = whatif::whatif(&before, &after, &options, &scope, args.max_changes);
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&w)?),
        Output::Table => print!("{}", table(&w)),
    }
    Ok(if args.exit_code && w.total > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// The logged flows, read whole (the log is the operator's file; stdin once).
fn read_flows(paths: &[PathBuf]) -> anyhow::Result<String> {
    let mut text = String::new();
    for p in paths {
        if p.as_os_str() == "-" {
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).context("--flows -: reading stdin")?;
        } else {
            text += &std::fs::read_to_string(p).with_context(|| format!("--flows {}", p.display()))?;
        }
        text.push('\n');
    }
    Ok(text)
}

/// `--flows`: which observed flows the change flips.
fn observed(
    args: &WhatifArgs,
    before: &flock::model::Snapshot,
    after: &flock::model::Snapshot,
    options: &Options,
    scope: &Scope,
) -> anyhow::Result<ExitCode> {
    let mut log = observed::parse(&read_flows(&args.flows)?);
    for u in &log.unreadable {
        eprintln!("warning: --flows: left out: {}", flock::text::visible(u));
    }
    if log.unreadable_count > log.unreadable.len() {
        eprintln!("warning: --flows: {} more records left out", log.unreadable_count - log.unreadable.len());
    }
    if log.records == 0 {
        // Nothing judged is no answer: a script must not read it as "nothing flips".
        bail!(
            "--flows: no flock::denied records found in {} lines (flock-agent logs them as JSON with --log-format json)",
            log.other_lines + log.unattributed + log.unreadable_count + log.not_policy + log.portless
        );
    }
    log.flows.retain(|f, _| {
        scope.port.is_none_or(|p| p == f.port)
            && scope.protocol.is_none_or(|p| p == f.protocol)
            && scope.family.is_none_or(|want| f.family.is_none_or(|got| got == want))
    });
    log.records = log.flows.values().map(|s| s.denied + s.audit + s.allowed).sum();
    let mut f = observed::flips(before, after, options, &log);
    if let Some(family) = scope.family {
        f.flips.retain(|x| x.family == family.as_str());
    }
    let total = f.flips.len();
    f.flips.truncate(args.max_changes);
    match args.output {
        Output::Json => {
            let doc = serde_json::json!({
                "flips": f.flips,
                "total": total,
                "flows": f.flows,
                "records": f.records,
                "unjudged": f.unjudged,
                "skipped": {"otherLines": log.other_lines, "unattributed": log.unattributed, "notPolicy": log.not_policy, "portless": log.portless, "unreadable": log.unreadable_count},
            });
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
        Output::Table => print!("{}", flips_table(&f, total, &log)),
    }
    // A flow that cannot be judged is not known not to flip.
    Ok(if args.exit_code && (total > 0 || !f.unjudged.is_empty()) { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// `n` and the noun (with its verb) in the number `n` asks for: "1 flow changes", "2 flows change".
fn flows(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn flips_table(f: &observed::Flips, total: usize, log: &observed::FlowLog) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let rows: Vec<[String; 8]> = f
        .flips
        .iter()
        .map(|c| {
            let mut seen = Vec::new();
            for (n, what) in [(c.seen_denied, "denied"), (c.seen_audit, "audit"), (c.seen_allowed, "allowed")] {
                if n > 0 {
                    seen.push(format!("{n} {what}"));
                }
            }
            [
                c.from.clone(),
                c.to.clone(),
                format!("{}/{}", c.port, c.protocol),
                c.family.to_string(),
                format!("{} → {}", c.before, c.after),
                seen.join(", "),
                c.decided_before.join("; "),
                c.decided_after.join("; "),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.push_str(&crate::table::columns(
            ["FROM", "TO", "PORT", "FAMILY", "VERDICT", "SEEN", "DECIDED BEFORE", "DECIDED AFTER"],
            &rows,
            7,
        ));
    }
    for u in &f.unjudged {
        let _ = writeln!(out, "not judged: {}", flock::text::visible(u));
    }
    let listed = if f.flips.len() < total { format!(" ({} listed: --max-changes)", f.flips.len()) } else { String::new() };
    let _ = writeln!(
        out,
        "{total} of {} observed {} {}{listed} ({} records; left out: {} other lines, {} not flock-agent's, {} not policy verdicts, {} without a port, {} unreadable)",
        f.flows,
        if f.flows == 1 { "flow" } else { "flows" },
        if total == 1 { "flips" } else { "flip" },
        f.records,
        log.other_lines,
        log.unattributed,
        log.not_policy,
        log.portless,
        log.unreadable_count
    );
    out
}

fn table(w: &WhatIf) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let rows: Vec<[String; 7]> = w
        .changes
        .iter()
        .map(|c| {
            [
                c.from.clone(),
                c.to.clone(),
                format!("{}/{}", c.port, c.protocol),
                c.family.to_string(),
                format!("{} → {}", c.before, c.after),
                c.decided_before.join("; "),
                c.decided_after.join("; "),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.push_str(&crate::table::columns(["FROM", "TO", "PORT", "FAMILY", "VERDICT", "DECIDED BEFORE", "DECIDED AFTER"], &rows, 6));
    }
    let listed = if w.changes.len() < w.total { format!(" ({} listed: --max-changes)", w.changes.len()) } else { String::new() };
    let _ = writeln!(
        out,
        "{}{listed}: {} Allow → Deny, {} Deny → Allow; {} pods in {} classes, {} explained before and after",
        flows(w.total, "flow changes", "flows change"),
        w.closed,
        w.opened,
        w.pods,
        w.classes,
        flows(w.evaluated, "flow", "flows")
    );
    if !w.unchecked_ports.is_empty() {
        let _ = writeln!(
            out,
            "not judged: {} (named by the change, declared by no pod; without --port only declared ports are judged: run with --port to judge one)",
            w.unchecked_ports.join(", ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_take_the_number_they_ask_for() {
        assert_eq!(super::flows(1, "flow changes", "flows change"), "1 flow changes");
        assert_eq!(super::flows(0, "flow changes", "flows change"), "0 flows change");
        assert_eq!(super::flows(2, "flow", "flows"), "2 flows");
    }
}
