//! flockctl: the operator's tool. Renders a node's ruleset offline, explains a flow's
//! verdict, runs a simulated cluster from manifests, and runs conformance cases on it.

mod bench;
mod cluster;
mod conformance;
mod dataplane;
mod explain;
mod live;
mod overlay;
mod render;
mod sim;
mod status;
mod sweep;
mod table;
mod twins;
mod whatif;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "flockctl", version, about = "flock's operator tool: render, simulate and check NetworkPolicy enforcement")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Render the nftables ruleset flock enforces on one node, from Kubernetes manifests or
    /// the cluster of the kubeconfig.
    Render(render::RenderArgs),
    /// Benchmark the pipeline on a synthetic cluster; prints JSON.
    Bench(bench::BenchArgs),
    /// Build a simulated cluster from manifests (network namespaces, flock-cni, real nft),
    /// probe every pair of pods and print what connects.
    Sim(sim::SimArgs),
    /// Run conformance cases on a simulated cluster.
    Conformance(conformance::ConformanceArgs),
    /// Why one flow is allowed or denied: the deciding tier, policies and rules, per
    /// direction (from manifests, the cluster of the kubeconfig, or --live from this node's
    /// table).
    Explain(explain::ExplainArgs),
    /// Which flows a change (manifests to apply, objects to delete) would open or close:
    /// every pod pair, port and family whose verdict changes, and what decided it.
    Whatif(whatif::WhatifArgs),
    /// Every node's enforcement as its flock-agent reports it (FlockNode): version, API
    /// health, ruleset size and hash, last error, staleness, and each sandboxed run's policy;
    /// exit status 1 when a node is not ok.
    Status(status::StatusArgs),
}

/// The command line. Installed as `kubectl-flock` (kubectl's plugin convention: `kubectl
/// flock explain …` runs it), help and errors say `kubectl flock`.
fn parse() -> Result<Cli, clap::Error> {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let invoked = std::path::Path::new(&argv0).file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    let mut command = Cli::command();
    if invoked.starts_with("kubectl-flock") {
        command = command.bin_name("kubectl flock").display_name("kubectl-flock");
    }
    Cli::from_arg_matches(&command.try_get_matches()?)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        // Once a signal has removed a simulation under its agents, their complaints about
        // the missing namespaces are noise.
        .with_writer(|| -> Box<dyn std::io::Write> {
            if flock::sim::fabric::interrupted().is_some() { Box::new(std::io::sink()) } else { Box::new(std::io::stderr()) }
        })
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("FLOCK_LOG").unwrap_or_else(|_| "warn".into()))
        .init();
    let cli = match parse() {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        Command::Render(args) => render::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Sim(args) => sim::run(&args),
        Command::Conformance(args) => conformance::run(&args),
        Command::Explain(args) => explain::run(&args),
        Command::Whatif(args) => whatif::run(&args),
        Command::Status(args) => status::run(&args),
    };
    // An interrupted simulation unwinds with an error; what counts is the interrupt.
    if let Some(code) = sim::exit_if_interrupted() {
        return code;
    }
    match result {
        Ok(code) => code,
        // 2, as grep and diff: 1 is an answer (a Deny with `explain --exit-code`, failing
        // conformance cases).
        Err(e) => {
            // An error may quote the API server or a file: its controls are escaped.
            eprintln!("error: {}", flock::text::visible_lines(&flock::process::error_chain(&*e)));
            ExitCode::from(2)
        }
    }
}
