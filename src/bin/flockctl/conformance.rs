//! `flockctl conformance [--base FILE] DIR...`: run conformance cases on a simulated cluster
//! built from the base — or, with `--kubeconfig`/`--context`, on that real cluster
//! (`super::live`) — and print `PASS|FAIL|SKIP <case> (why)` lines and a summary.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;

use flock::sim::Sim;
use flock::sim::runner::{self, CaseOutcome, Verdict};

use super::cluster::ClusterArgs;
use super::live::{LiveOptions, Runner};
use super::sim::{CommonArgs, cleanup_on_interrupt, note_kept, preflight, runtime};

#[derive(Args)]
pub struct ConformanceArgs {
    /// Case folders, or folders of case folders.
    #[arg(required = true, value_name = "DIR")]
    dirs: Vec<PathBuf>,
    /// The base cluster (default: base-cluster.yaml in the folder holding the cases).
    #[arg(long, value_name = "FILE")]
    base: Option<PathBuf>,
    /// Print timings per step on stderr.
    #[arg(long, short)]
    verbose: bool,
    /// Run the cases in an order shuffled with this seed (a case's outcome must not depend
    /// on what ran before it: the cluster, its connections included, is not reset between
    /// cases, only its objects).
    #[arg(long, value_name = "SEED")]
    shuffle: Option<u64>,
    #[command(flatten)]
    common: CommonArgs,
    /// Run the cases on the real cluster of this kubeconfig (or of --context) instead of a
    /// simulation: pods are created there, probes go through the API's exec.
    #[command(flatten)]
    cluster: ClusterArgs,
    /// On a real cluster: the agnhost image of every pod (default: the base's pods' image).
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
    /// On a real cluster: put before every namespace and ClusterNetworkPolicy the run
    /// creates (keeps it away from other objects).
    #[arg(long, value_name = "PREFIX", default_value = "flock-conformance-")]
    namespace_prefix: String,
    /// On a real cluster: how long after a step's writes a cell may take to match.
    #[arg(long, value_name = "DURATION", default_value = "20s", value_parser = duration)]
    settle: std::time::Duration,
    /// On a real cluster: how long a pod may take to be ready.
    #[arg(long, value_name = "DURATION", default_value = "3m", value_parser = duration)]
    ready_timeout: std::time::Duration,
}

fn duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("{s:?}: {e} (a duration like 20s, 500ms, 1m)"))
}

/// A name the API takes as a namespace prefix: lowercase letters, digits and `-`, starting
/// with a letter, short enough to leave room for the case's names.
fn check_prefix(p: &str) -> anyhow::Result<()> {
    let ok = !p.is_empty()
        && p.len() <= 40
        && p.starts_with(|c: char| c.is_ascii_lowercase())
        && p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        bail!("--namespace-prefix {p:?}: lowercase letters, digits and '-', starting with a letter, at most 40");
    }
    Ok(())
}

pub fn run(args: &ConformanceArgs) -> anyhow::Result<ExitCode> {
    let live = args.cluster.kubeconfig.is_some() || args.cluster.context.is_some();
    let dirs = flock::source::files::find_cases(&args.dirs)?;
    let base_path = match &args.base {
        Some(b) => b.clone(),
        None => {
            let first = &args.dirs[0];
            let holder =
                if first.join("case.yaml").is_file() { first.parent().map(PathBuf::from).unwrap_or_default() } else { first.clone() };
            holder.join("base-cluster.yaml")
        }
    };
    if !base_path.is_file() {
        bail!("base cluster {} not found (pass --base FILE)", base_path.display());
    }
    let base = flock::source::files::load_manifests(std::slice::from_ref(&base_path))
        .with_context(|| format!("reading {}", base_path.display()))?
        .to_snapshot();
    let mut cases = dirs.iter().map(|d| flock::source::files::load_case(d)).collect::<Result<Vec<_>, _>>()?;
    if let Some(seed) = args.shuffle {
        flock::synth::Rng::new(seed).shuffle(&mut cases);
        eprintln!("{} cases in an order shuffled with seed {seed}", cases.len());
    }
    if live {
        return run_live(args, &base_path, base, &cases);
    }
    let opts = preflight(&args.common)?;
    let rt = runtime()?;
    let (_passed, failed, _skipped) = rt.block_on(async {
        cleanup_on_interrupt()?;
        let started = Instant::now();
        let mut sim = Sim::build(base.clone(), opts).await?;
        let base = sim.snapshot();
        eprintln!(
            "built the base cluster ({} pods, {} nodes) in {:.2}s",
            sim.pod_names().len(),
            base.nodes().count(),
            started.elapsed().as_secs_f64()
        );
        note_kept(&sim);
        let (mut passed, mut failed, mut skipped) = (0, 0, 0);
        let mut steps = 0usize;
        let mut step_time = 0.0;
        for case in &cases {
            let o = runner::run_case(&mut sim, &base, case).await;
            for p in &o.problems {
                eprintln!("warning: {}: {p}", case.dir_name);
            }
            if flock::sim::fabric::interrupted().is_some() {
                // The case's outcome is the interrupt's doing: no verdict.
                return Err(flock::sim::SimError::Interrupted.into());
            }
            match o.verdict {
                Verdict::Pass => passed += 1,
                Verdict::Fail => failed += 1,
                Verdict::Skip => skipped += 1,
            }
            println!("{}", verdict_line(&case.dir_name, &o));
            steps += o.step_times.len();
            step_time += o.step_times.iter().map(|d| d.as_secs_f64()).sum::<f64>();
            if args.verbose {
                let t: Vec<String> = o.step_times.iter().map(|d| format!("{:.2}s", d.as_secs_f64())).collect();
                eprintln!("  {}: steps {}", case.dir_name, t.join(" "));
            }
        }
        println!("{passed} passed, {failed} failed, {skipped} skipped");
        eprintln!(
            "total {:.1}s; {steps} steps, {:.2}s per step on average",
            started.elapsed().as_secs_f64(),
            if steps > 0 { step_time / steps as f64 } else { 0.0 }
        );
        sim.teardown().await?;
        anyhow::Ok((passed, failed, skipped))
    })?;
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The cases on a real cluster; everything the run created is deleted at the end, also
/// after an error or a signal.
fn run_live(
    args: &ConformanceArgs,
    base_path: &std::path::Path,
    base: flock::model::Snapshot,
    cases: &[flock::conformance::Case],
) -> anyhow::Result<ExitCode> {
    check_prefix(&args.namespace_prefix)?;
    let image = match &args.image {
        Some(i) => i.clone(),
        None => base_image(base_path)?,
    };
    let opts = LiveOptions {
        image,
        prefix: args.namespace_prefix.clone(),
        parallel: args.common.parallel,
        connect_timeout: std::time::Duration::from_millis(args.common.timeout_ms),
        settle: args.settle,
        ready_timeout: args.ready_timeout,
        verbose: args.verbose,
    };
    let rt = runtime()?;
    rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let (client, server) = super::cluster::client(&args.cluster).await?;
        let started = Instant::now();
        let run = super::live::run_id();
        eprintln!("run {run} on the cluster at {server} (namespaces {}*)", args.namespace_prefix);
        let mut runner: Option<Runner> = None;
        let work = async {
            runner = Some(Runner::start(client.clone(), base, opts, run.clone()).await?);
            let Some(r) = runner.as_mut() else { bail!("the run did not start") };
            let (mut passed, mut failed, mut skipped) = (0, 0, 0);
            for case in cases {
                let o = r.run_case(case).await;
                match o.verdict {
                    Verdict::Pass => passed += 1,
                    Verdict::Fail => failed += 1,
                    Verdict::Skip => skipped += 1,
                }
                println!("{}", flock::text::visible(&verdict_line(&case.dir_name, &o)));
                for e in o.errors.iter().skip(3) {
                    eprintln!("  {}: {}", case.dir_name, flock::text::visible(e));
                }
            }
            anyhow::Ok((passed, failed, skipped))
        };
        let (outcome, signal) = tokio::select! {
            r = work => (r, None),
            _ = hup.recv() => (Err(anyhow::anyhow!("interrupted")), Some(("SIGHUP", nix::libc::SIGHUP))),
            _ = int.recv() => (Err(anyhow::anyhow!("interrupted")), Some(("SIGINT", nix::libc::SIGINT))),
            _ = term.recv() => (Err(anyhow::anyhow!("interrupted")), Some(("SIGTERM", nix::libc::SIGTERM))),
        };
        // Whatever happened, the run's objects go (a runner that failed to start may have
        // made some: a fresh one over the same client finds them by label).
        let cleanup = match &runner {
            Some(r) => r.teardown().await,
            None => super::live::teardown_run(&client, &run).await,
        };
        if let Some(r) = &runner {
            eprintln!("{}", settle_summary(&r.settled));
        }
        eprintln!("total {:.1}s", started.elapsed().as_secs_f64());
        if let Some((name, number)) = signal {
            // As a shell reports a process a signal ended: 128 + its number.
            match cleanup {
                Ok(()) => eprintln!("interrupted ({name}): everything the run created is deleted"),
                Err(e) => eprintln!("interrupted ({name}); deleting what the run created failed: {e:#}"),
            }
            return Ok(ExitCode::from(128 + number as u8));
        }
        let (passed, failed, skipped) = outcome?;
        cleanup.context("deleting what the run created")?;
        println!("{passed} passed, {failed} failed, {skipped} skipped");
        anyhow::Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
    })
}

/// How steps converged: how many matched at each cell's first probe, and for the others
/// how long after the step's writes their last cell matched.
fn settle_summary(settled: &[(usize, f64)]) -> String {
    let first = settled.iter().filter(|(r, _)| *r == 1).count();
    let mut later: Vec<f64> = settled.iter().filter(|(r, _)| *r > 1).map(|(_, t)| *t).collect();
    later.sort_by(f64::total_cmp);
    let mut s = format!("{first} of {} settled steps matched at every cell's first probe", settled.len());
    if let (Some(p50), Some(max)) = (later.get(later.len() / 2), later.last()) {
        s.push_str(&format!("; the other {} after {p50:.2}s (p50), {max:.2}s (max) from the step's writes", later.len()));
    }
    s
}

/// The image of the base's first pod.
fn base_image(path: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    flock::model::manifest::first_pod_image(&text).with_context(|| format!("{} has no pod with an image: pass --image", path.display()))
}

/// `PASS|FAIL|SKIP <case>`, with why: the cells that differ and errors for a failure, the
/// reason for a skip, and skipped probes of a case that passed.
fn verdict_line(case: &str, o: &CaseOutcome) -> String {
    let mut line = format!("{} {case}", o.verdict.as_str());
    match o.verdict {
        Verdict::Fail => {
            let cells: Vec<String> = o.mismatches.iter().take(5).map(ToString::to_string).chain(o.errors.iter().take(3).cloned()).collect();
            line.push_str(&format!(" ({} cells differ; {})", o.mismatches.len(), cells.join("; ")));
        }
        Verdict::Skip if o.skip_reasons.is_empty() => line.push_str(" (no probe could run)"),
        Verdict::Skip => line.push_str(&format!(" ({})", o.skip_reasons.join("; "))),
        Verdict::Pass if o.probes_skipped > 0 => line.push_str(&format!(
            " ({} of {} probes skipped: {})",
            o.probes_skipped,
            o.probes_skipped + o.probes_run,
            o.skip_reasons.join("; ")
        )),
        Verdict::Pass => {}
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(verdict: Verdict, run: usize, skipped: usize) -> CaseOutcome {
        CaseOutcome {
            verdict,
            mismatches: Vec::new(),
            errors: Vec::new(),
            probes_run: run,
            probes_skipped: skipped,
            skip_reasons: if skipped > 0 { vec!["SCTP not available in this kernel".into()] } else { Vec::new() },
            step_times: Vec::new(),
            problems: Vec::new(),
        }
    }

    #[test]
    fn every_skip_says_why() {
        assert_eq!(verdict_line("055-sctp", &outcome(Verdict::Skip, 0, 1)), "SKIP 055-sctp (SCTP not available in this kernel)");
        assert_eq!(verdict_line("055-sctp", &outcome(Verdict::Skip, 0, 0)), "SKIP 055-sctp (no probe could run)");
        assert_eq!(
            verdict_line("060-mixed", &outcome(Verdict::Pass, 2, 1)),
            "PASS 060-mixed (1 of 3 probes skipped: SCTP not available in this kernel)"
        );
        assert_eq!(verdict_line("001-deny", &outcome(Verdict::Pass, 1, 0)), "PASS 001-deny");
    }
}
