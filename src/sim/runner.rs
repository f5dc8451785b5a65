//! The conformance runner: cases (`crate::conformance`) on a running [`Sim`]. Each step's
//! objects are applied through the static source (pods stay up; a Pod with a new uid gets a
//! new sandbox), the runner waits until every node has committed the change and what it
//! brought up works (new pods' links, the case's DNS server answering: [`Sim::apply`]),
//! probes, and compares every checked cell — and `flockctl explain`'s verdict for it. After
//! a case the base cluster's objects are restored; nothing else is reset, as in a real
//! cluster: the connections earlier steps and cases made stay in conntrack (a policy change
//! cuts those it denies: `crate::revoke`), so a case's outcome must not depend on what ran
//! before it (`flockctl conformance --shuffle`).
//!
//! A case with `dns` has its records served from its server pod (UDP and TCP 53) while it
//! runs; a step's `wait` comes before its changes; its probes by name run before those by
//! address, so that what they resolved is in place for the latter.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{ProbeSpec, Sim, SimError};
use crate::conformance::{self, Case, Expect, HostSeen, Mismatch};
use crate::model::Snapshot;
use crate::sim::probe::Outcome;

/// How a case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
    Skip,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::Skip => "SKIP",
        }
    }
}

/// The result of one case.
#[derive(Debug, Clone)]
pub struct CaseOutcome {
    pub verdict: Verdict,
    pub mismatches: Vec<Mismatch>,
    /// Probes that could not be performed, and other errors.
    pub errors: Vec<String>,
    pub probes_run: usize,
    pub probes_skipped: usize,
    /// Why probes were skipped (each reason once, e.g. `SCTP not available in this kernel`).
    pub skip_reasons: Vec<String>,
    pub step_times: Vec<Duration>,
    /// Problems of the policies the case applied (each once), as the agent reports them;
    /// the case goes on, enforcing what the agent enforces.
    pub problems: Vec<String>,
}

impl CaseOutcome {
    /// Before the case runs: a pass with nothing seen yet.
    pub fn new() -> Self {
        Self {
            verdict: Verdict::Pass,
            mismatches: Vec::new(),
            errors: Vec::new(),
            probes_run: 0,
            probes_skipped: 0,
            skip_reasons: Vec::new(),
            step_times: Vec::new(),
            problems: Vec::new(),
        }
    }
}

impl Default for CaseOutcome {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs `case` on `sim`, starting from `base`, and restores `base` afterwards.
pub async fn run_case(sim: &mut Sim, base: &Snapshot, case: &Case) -> CaseOutcome {
    let mut out = CaseOutcome::new();
    let dns = sim.set_dns(case.dns.clone());
    if let Err(e) = &dns {
        out.errors.push(format!("dns: {e}"));
    }
    for (i, step) in case.steps.iter().enumerate() {
        if dns.is_err() {
            break;
        }
        if !step.wait.is_zero() {
            tokio::time::sleep(step.wait).await;
        }
        let started = Instant::now();
        if let Err(e) = sim.apply(|s| conformance::apply_step(s, step)).await {
            out.errors.push(format!("step {}: {e}", i + 1));
            break;
        }
        let snapshot = sim.snapshot();
        if let Some(e) = untrusted_dns(sim, &snapshot, case, &step.host_probes) {
            out.errors.push(format!("step {}: {e}", i + 1));
            break;
        }
        for probe in &step.host_probes {
            if !sim.protocol_available(probe.protocol) {
                out.errors.push(format!("step {}: {}: the kernel lacks {}", i + 1, probe.label(), probe.protocol));
                continue;
            }
            let sources: Vec<String> = probe.checked().map(String::from).collect();
            let spec = ProbeSpec { port: probe.port, protocol: probe.protocol, family: probe.family };
            match sim.probe_host(spec, &probe.host, &sources) {
                Ok(cells) => {
                    out.probes_run += 1;
                    let mut observed = BTreeMap::new();
                    for c in cells {
                        let seen = match c.outcome {
                            Some(Outcome::Connected) => Some(HostSeen::Connected),
                            Some(Outcome::Unresolved) => Some(HostSeen::Unresolved),
                            Some(_) => Some(HostSeen::Blocked),
                            None => None,
                        };
                        match seen {
                            Some(seen) => {
                                observed.insert(c.from, seen);
                            }
                            None => out.errors.push(format!(
                                "step {}: {}: {} has no {} address, or the DNS server none",
                                i + 1,
                                probe.label(),
                                c.from,
                                c.family.as_str()
                            )),
                        }
                    }
                    out.mismatches.extend(conformance::compare_host(i, probe, &observed));
                }
                Err(e) => out.errors.push(format!("step {}: {}: {e}", i + 1, probe.label())),
            }
        }
        for p in crate::translate::validate_all(&snapshot) {
            let p = p.to_string();
            if !out.problems.contains(&p) {
                out.problems.push(p);
            }
        }
        for probe in &step.probes {
            if !sim.protocol_available(probe.protocol) {
                if probe.kernel_optional {
                    out.probes_skipped += 1;
                    let why = format!("{} not available in this kernel", probe.protocol);
                    if !out.skip_reasons.contains(&why) {
                        out.skip_reasons.push(why);
                    }
                } else {
                    out.errors.push(format!("step {}: {}: the kernel lacks {}", i + 1, probe.label(), probe.protocol));
                }
                continue;
            }
            let wanted: Vec<(String, String)> = probe
                .order
                .iter()
                .flat_map(|f| probe.order.iter().map(move |t| (f.clone(), t.clone())))
                .filter(|(f, t)| f != t && probe.expect(f, t) != Expect::Unchecked)
                .collect();
            let sources: Vec<String> = unique(wanted.iter().map(|(f, _)| f.clone()));
            let dests: Vec<String> = unique(wanted.iter().map(|(_, t)| t.clone()));
            let spec = ProbeSpec { port: probe.port, protocol: probe.protocol, family: probe.family };
            match sim.probe(spec, &sources, &dests) {
                Ok(cells) => {
                    out.probes_run += 1;
                    let mut observed = BTreeMap::new();
                    for c in cells {
                        match c.outcome {
                            Some(Outcome::Unavailable) if probe.kernel_optional => {}
                            Some(o) => {
                                observed.insert((c.from, c.to), o == Outcome::Connected);
                            }
                            None if wanted.contains(&(c.from.clone(), c.to.clone())) => {
                                out.errors.push(format!(
                                    "step {}: {}: {} -> {} has no {} address",
                                    i + 1,
                                    probe.label(),
                                    c.from,
                                    c.to,
                                    c.family.as_str()
                                ));
                            }
                            None => {}
                        }
                    }
                    out.mismatches.extend(conformance::compare(i, probe, &observed));
                    // explain judges without the DNS answers: not the cells a record's
                    // address may have been learned for.
                    observed.retain(|(_, to), _| case.judged_offline(&snapshot, to));
                    out.errors.extend(explain_disagreements(&snapshot, i, probe, &observed));
                }
                Err(e) => out.errors.push(format!("step {}: {}: {e}", i + 1, probe.label())),
            }
        }
        out.step_times.push(started.elapsed());
    }
    if let Err(e) = sim.set_dns(None) {
        out.errors.push(format!("dns: {e}"));
    }
    if let Err(e) = restore(sim, base).await {
        out.errors.push(format!("restoring the base cluster: {e}"));
    }
    out.verdict = if !out.mismatches.is_empty() || !out.errors.is_empty() {
        Verdict::Fail
    } else if out.probes_run == 0 && out.probes_skipped > 0 {
        Verdict::Skip
    } else {
        Verdict::Pass
    };
    out
}

/// Why probes by name cannot mean what the case says: the DNS server pod is not up, or the
/// agents do not trust it (it is not one of the resolver pods they are configured with), so
/// that what it answers would teach nothing.
fn untrusted_dns(sim: &Sim, snapshot: &Snapshot, case: &Case, probes: &[conformance::HostProbe]) -> Option<String> {
    let dns = case.dns.as_ref()?;
    if probes.is_empty() {
        return None;
    }
    let Some(pod) = snapshot.pod_by_name(&dns.server) else {
        return Some(format!("dns.server {} is not a pod of the cluster", dns.server));
    };
    if !pod.ips.iter().any(|ip| sim.dns_server(crate::model::Family::of(*ip)).is_some()) {
        return Some(format!("dns.server {} has no sandbox to serve DNS from", dns.server));
    }
    let trusted = sim.trusted_resolvers(snapshot);
    if !pod.ips.iter().all(|ip| trusted.contains(ip)) {
        return Some(format!("dns.server {} is not a resolver the agents trust (they trust {})", dns.server, sim.resolver_selector()));
    }
    None
}

/// `flockctl explain` on every observed cell: it must give the verdict the kernel gave.
fn explain_disagreements(
    snapshot: &Snapshot,
    step: usize,
    probe: &conformance::Probe,
    observed: &BTreeMap<(String, String), bool>,
) -> Vec<String> {
    let mut explainer = crate::explain::Explainer::new(snapshot, crate::translate::Options::default());
    let mut out = Vec::new();
    for ((from, to), connected) in observed {
        // Hosts of the simulation are not in the cluster: nothing to explain.
        if from.starts_with("host/") || to.starts_with("host/") {
            continue;
        }
        let end = |s: &str| crate::explain::End::parse(s);
        let query = match (end(from), end(to)) {
            (Ok(from), Ok(to)) => {
                // As the probe: without a family, the destination's first address decides.
                let first = match &to {
                    crate::explain::End::Pod(p) => snapshot.pod_by_name(p).and_then(|p| p.ips.first().copied()),
                    crate::explain::End::Address(a) => Some(*a),
                };
                let family = probe.family.or(first.map(crate::model::Family::of));
                crate::explain::Query { from, to, protocol: probe.protocol, port: probe.port, family }
            }
            (Err(e), _) | (_, Err(e)) => {
                out.push(format!("step {}: {}: explain: {e}", step + 1, probe.label()));
                continue;
            }
        };
        // A pod serves only its declared ports: a probe of another port fails whatever the
        // policy, so only a connection (policy must allow) or a refusal on a served port
        // (policy must deny) says what the kernel enforced.
        let served = match &query.to {
            crate::explain::End::Pod(p) => {
                snapshot.pod_by_name(p).is_some_and(|p| p.ports.iter().any(|c| c.port == probe.port && c.protocol == probe.protocol))
            }
            crate::explain::End::Address(_) => true,
        };
        match explainer.explain(&query) {
            Ok(e) if (e.verdict == crate::explain::Verdict::Allow) != *connected && (*connected || served) => out.push(format!(
                "step {}: {}: {from} -> {to}: the kernel {}, explain says {}",
                step + 1,
                probe.label(),
                if *connected { "connected" } else { "did not connect" },
                e.verdict
            )),
            Ok(_) => {}
            Err(e) => out.push(format!("step {}: {}: {from} -> {to}: explain: {e}", step + 1, probe.label())),
        }
    }
    out
}

async fn restore(sim: &mut Sim, base: &Snapshot) -> Result<(), SimError> {
    let base = base.clone();
    sim.apply(move |s| *s = base).await
}

fn unique(it: impl Iterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = it.collect();
    v.sort();
    v.dedup();
    v
}
