//! `flockctl status`: one row per Node from its FlockNode (agent version, API health,
//! endpoints, rules, set elements, ruleset hash, last error, whether anyone keeps it current)
//! and each sandboxed run's enforcement (`flock::report::fleet`). Exit status 1 when a node is
//! not ok.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, ValueEnum};

use flock::report::fleet::{self, Agents, FleetStatus};
use flock::text::visible;

use crate::cluster::ClusterArgs;

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The namespace flock-agent runs in.
    #[arg(long, default_value = "flock-system", value_name = "NAMESPACE")]
    agent_namespace: String,
    /// The label selector of flock-agent's pods there.
    #[arg(long, default_value = "app.kubernetes.io/name=flock-agent", value_name = "SELECTOR")]
    agent_selector: String,
    /// Only the Nodes this label selector selects (those flock-agent's DaemonSet runs on;
    /// default: every Node).
    #[arg(long, value_name = "SELECTOR")]
    node_selector: Option<String>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value = "table")]
    output: Output,
}

pub fn run(args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    let agents = Agents {
        namespace: args.agent_namespace.clone(),
        selector: args.agent_selector.clone(),
        nodes: args.node_selector.clone().unwrap_or_default(),
    };
    let fleet = runtime
        .block_on(async {
            let (client, server) = crate::cluster::client(&args.cluster).await?;
            fleet::read(&client, agents).await.with_context(|| format!("the API server at {server}"))
        })
        .context("status: reading the cluster")?;
    let status = fleet::judge(&fleet, env!("CARGO_PKG_VERSION"));
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&status)?),
        Output::Table => print!("{}", table(&status)),
    }
    Ok(if status.ok() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

pub(crate) fn table(s: &FleetStatus) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let opt = |v: Option<i64>| v.map_or_else(|| "-".to_string(), |n| n.to_string());
    let rows: Vec<[String; 8]> = s
        .nodes
        .iter()
        .map(|n| {
            let state = match (n.ok, n.stale) {
                (true, _) => "ok",
                (false, true) => "STALE",
                (false, false) => "NOT OK",
            };
            [
                n.name.clone(),
                state.into(),
                n.version.clone().unwrap_or_else(|| "-".into()),
                n.api.clone().unwrap_or_else(|| "-".into()),
                opt(n.endpoints),
                opt(n.rules),
                opt(n.elements),
                n.hash.as_deref().map_or_else(|| "-".into(), |h| h.chars().take(12).collect()),
            ]
        })
        .collect();
    out.push_str(&crate::table::columns(["NODE", "STATUS", "VERSION", "API", "ENDPOINTS", "RULES", "ELEMENTS", "HASH"], &rows, 8));
    // Why, under the table: the reasons are sentences, too long for a column.
    // Every string here comes from the API (FlockNodes, Runs, Nodes): escaped, so that none
    // can repaint or forge a line.
    for n in &s.nodes {
        let name = visible(&n.name);
        for r in &n.reasons {
            let _ = writeln!(out, "{name}: {}", visible(r));
        }
        for r in &n.notes {
            let _ = writeln!(out, "{name}: note: {}", visible(r));
        }
    }
    for r in &s.runs {
        let verdict = if r.enforced { "enforced" } else { "NOT ENFORCED" };
        let _ = writeln!(out, "run {}: {verdict}: {}", visible(&r.name), visible(&r.message));
    }
    for l in &s.leftovers {
        let _ = writeln!(out, "FlockNode {}: no such Node (a leftover; delete it)", visible(l));
    }
    let bad = s.nodes.iter().filter(|n| !n.ok).count();
    let unenforced = s.runs.iter().filter(|r| !r.enforced).count();
    let _ = writeln!(out, "{} nodes, {bad} not ok; {} runs, {unenforced} not enforced", s.nodes.len(), s.runs.len());
    out
}

#[cfg(test)]
mod tests {
    use flock::report::fleet::{FleetStatus, NodeRow, RunRow};

    fn row(name: &str, ok: bool) -> NodeRow {
        NodeRow {
            name: name.into(),
            ok,
            reasons: Vec::new(),
            notes: Vec::new(),
            stale: false,
            version: Some("0.1.0".into()),
            skew: None,
            api: Some("Connected".into()),
            endpoints: Some(2),
            rules: Some(12),
            elements: Some(3),
            hash: Some("ab".repeat(32)),
            last_error: None,
            agent_pod: None,
        }
    }

    /// The attack: a FlockNode's fields carry a terminal escape that would move up, clear the
    /// failed node's line and print it as a green "ok". Nothing of it reaches the terminal as a
    /// control character, and the failed node's line is still there, NOT OK.
    #[test]
    fn hostile_fields_cannot_repaint_a_failed_node_as_ok() {
        let repaint = "\x1b[1A\x1b[2K\rnode-2     \x1b[32mok\x1b[0m";
        let mut bad = row("node-2", false);
        bad.version = Some(format!("0.1.0{repaint}"));
        bad.api = Some("Connected\u{202e}KO".into());
        bad.reasons = vec![format!("the last sync failed: boom{repaint}\nnode-2: ok")];
        let mut evil_name = row("node-3\x1b]0;title\x07", true);
        evil_name.notes = vec!["note\r".into()];
        let status = FleetStatus {
            nodes: vec![row("node-1", true), bad, evil_name],
            runs: vec![RunRow {
                name: "ci/r\x1b[8m".into(),
                policy: "ci/p".into(),
                generation: 1,
                enforced: false,
                pending: vec![],
                message: "pending\x1b[2Kenforced".into(),
            }],
            leftovers: vec!["gone\x1b[A".into()],
        };
        let out = super::table(&status);
        let controls: Vec<char> = out.chars().filter(|c| *c != '\n' && flock::text::is_unsafe(*c)).collect();
        assert!(controls.is_empty(), "control characters printed: {controls:?}\n{out}");
        assert!(out.contains("\\u{1b}[32mok"), "not escaped visibly:\n{out}");
        // The failed node's row says so, and its reason is one line (the forged one is not a
        // line of its own).
        assert!(out.lines().any(|l| l.starts_with("node-2 ") && l.contains("NOT OK")), "{out}");
        assert!(out.contains("node-2: the last sync failed: boom\\u{1b}[1A"), "{out}");
        assert!(!out.lines().any(|l| l == "node-2: ok"), "a forged line:\n{out}");
        assert!(out.contains("3 nodes, 1 not ok"), "{out}");
    }
}
