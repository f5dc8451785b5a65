//! `flockctl conformance [--base FILE] DIR...`: run conformance cases on a simulated cluster
//! built from the base, and print `PASS|FAIL|SKIP <case> (why)` lines and a summary.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;

use flock::sim::Sim;
use flock::sim::runner::{self, CaseOutcome, Verdict};

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
}

pub fn run(args: &ConformanceArgs) -> anyhow::Result<ExitCode> {
    let opts = preflight(&args.common)?;
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
