//! `flockctl status`: one row per Node from its FlockNode (agent version, API health,
//! endpoints, rules, set elements, ruleset hash, last error, whether anyone keeps it current)
//! and each sandboxed run's enforcement (`flock::report::fleet`). Exit status 1 when a node is
//! not ok.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, ValueEnum};

use flock::report::fleet::{self, Agents, FleetStatus};

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
            let client = crate::cluster::client(&args.cluster).await?;
            fleet::read(&client, agents).await.map_err(anyhow::Error::from)
        })
        .context("status: reading the cluster")?;
    let status = fleet::judge(&fleet, env!("CARGO_PKG_VERSION"));
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&status)?),
        Output::Table => print!("{}", table(&status)),
    }
    Ok(if status.ok() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn table(s: &FleetStatus) -> String {
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
    for n in &s.nodes {
        for r in &n.reasons {
            let _ = writeln!(out, "{}: {r}", n.name);
        }
        for r in &n.notes {
            let _ = writeln!(out, "{}: note: {r}", n.name);
        }
    }
    for r in &s.runs {
        let verdict = if r.enforced { "enforced" } else { "NOT ENFORCED" };
        let _ = writeln!(out, "run {}: {verdict}: {}", r.name, r.message);
    }
    for l in &s.leftovers {
        let _ = writeln!(out, "FlockNode {l}: no such Node (a leftover; delete it)");
    }
    let bad = s.nodes.iter().filter(|n| !n.ok).count();
    let unenforced = s.runs.iter().filter(|r| !r.enforced).count();
    let _ = writeln!(out, "{} nodes, {bad} not ok; {} runs, {unenforced} not enforced", s.nodes.len(), s.runs.len());
    out
}
