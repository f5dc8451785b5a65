//! flockctl: the operator's tool. Renders a node's ruleset offline, explains a flow's
//! verdict, runs a simulated cluster from manifests, and runs conformance cases on it.

mod bench;
mod conformance;
mod dataplane;
mod explain;
mod render;
mod sim;
mod sweep;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "flockctl", version, about = "flock's operator tool: render, simulate and check NetworkPolicy enforcement")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Render the nftables ruleset flock enforces on one node, from Kubernetes manifests.
    Render(render::RenderArgs),
    /// Benchmark the pipeline on a synthetic cluster; prints JSON.
    Bench(bench::BenchArgs),
    /// Build a simulated cluster from manifests (network namespaces, flock-cni, real nft),
    /// probe every pair of pods and print what connects.
    Sim(sim::SimArgs),
    /// Run conformance cases on a simulated cluster.
    Conformance(conformance::ConformanceArgs),
    /// Why one flow is allowed or denied: the deciding tier, policies and rules, per
    /// direction (offline from manifests, or --live from this node's table).
    Explain(explain::ExplainArgs),
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
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Render(args) => render::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Sim(args) => sim::run(&args),
        Command::Conformance(args) => conformance::run(&args),
        Command::Explain(args) => explain::run(&args),
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
            eprintln!("error: {}", flock::process::error_chain(&*e));
            ExitCode::from(2)
        }
    }
}
