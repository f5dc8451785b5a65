//! `flockctl bench --conntrack-entries N`: what a revocation sweep costs the agent
//! (`flock::agent::revocation`): in a throwaway network namespace (root), N conntrack entries
//! between the synthetic cluster's node-0 pods and peers across the cluster; then, per run,
//! the table listed (ctnetlink dump), every entry judged against node-0's translated policy
//! ([`flock::revoke::Judge`]), and the denied ones marked — as after a change. Between runs
//! the marks are cleared again (not timed). A second pass with nothing to change is the
//! periodic sweep's cost.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use flock::conntrack::{ConntrackSocket, Entry, NewEntry, Tuple};
use flock::revoke::Judge;
use flock::synth::{self, Params, Rng};
use flock::translate::{self, Options};
use flock_cni::testing::NetnsGuard;

use crate::twins::median;

const PORTS: [u16; 6] = [80, 443, 8080, 53, 5432, 9090];

pub fn run(params: &Params, entries: usize, runs: usize) -> anyhow::Result<Value> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(json!({"conntrack": {"skipped": "not root"}}));
    }
    let cluster = synth::generate(params);
    let s = &cluster.snapshot;
    let endpoints = s.derived_endpoints(&cluster.node);
    if endpoints.is_empty() {
        bail!("node-0 has no pods");
    }
    let np = translate::translate(s, &endpoints, &Options::default());
    let family_v6 = cluster.ipv6;
    let peers: Vec<IpAddr> = s.pods().flat_map(|p| p.ips.iter().copied()).filter(|ip| ip.is_ipv6() == family_v6).collect();
    if peers.is_empty() {
        bail!("no peer addresses");
    }
    // Connections of node-0's pods, half as clients, half as servers, with peers anywhere.
    let mut rng = Rng::new(params.seed);
    let mut flows = Vec::with_capacity(entries);
    for i in 0..entries {
        let ep = &endpoints[i % endpoints.len()];
        let Some(own) = ep.addrs.iter().copied().find(|a| a.is_ipv6() == family_v6) else { continue };
        let peer = *rng.pick(&peers);
        let protocol = if rng.chance(70) { 6 } else { 17 };
        let port = *rng.pick(&PORTS);
        let sport = 1024 + (i / endpoints.len()) as u16 % 60_000;
        let (src, dst) = if rng.chance(50) { (own, peer) } else { (peer, own) };
        flows.push(Tuple { src, dst, protocol, sport, dport: port });
    }

    let ns = NetnsGuard::new("sweep");
    let bit = flock::render::REVOKED_MARK;
    let out = flock::netns::run_in(&ns.netns(), || -> anyhow::Result<Value> {
        let mut socket = ConntrackSocket::open()?;
        let started = Instant::now();
        let mut created = 0usize;
        for f in &flows {
            // A tuple drawn twice is refused (exclusive create): skipped.
            if socket.create(&NewEntry::plain(*f, 3600)).is_ok() {
                created += 1;
            }
        }
        let fill = started.elapsed();
        let none = BTreeSet::new();
        let judge = Judge::new(&np, &none);
        let (mut dump_t, mut judge_t, mut mark_t, mut total_t, mut steady_t) = (vec![], vec![], vec![], vec![], vec![]);
        let mut denied = 0;
        for _ in 0..runs.max(1) {
            let t0 = Instant::now();
            let dump = socket.dump()?;
            let t1 = Instant::now();
            let sweep = judge.sweep(&dump.entries, bit);
            let t2 = Instant::now();
            let doomed: Vec<&Entry> = sweep.revoke.iter().map(|(e, _)| *e).collect();
            socket.set_mark(&doomed, bit, true)?;
            let t3 = Instant::now();
            denied = doomed.len();
            dump_t.push(t1 - t0);
            judge_t.push(t2 - t1);
            mark_t.push(t3 - t2);
            total_t.push(t3 - t0);
            // The same again: nothing left to change (the periodic sweep).
            let t4 = Instant::now();
            let again = socket.dump()?;
            let sw = judge.sweep(&again.entries, bit);
            if !sw.revoke.is_empty() || !sw.restore.is_empty() {
                bail!("a second sweep found {} to revoke and {} to restore", sw.revoke.len(), sw.restore.len());
            }
            steady_t.push(t4.elapsed());
            socket.set_mark(&doomed, bit, false)?;
        }
        let stat = |v: &[Duration]| {
            let ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
            json!({"median": round2(median(&ms)), "min": round2(ms.iter().copied().fold(f64::MAX, f64::min)), "max": round2(ms.iter().copied().fold(0.0, f64::max))})
        };
        Ok(json!({"conntrack": {
            "entries": created,
            "fill_s": round2(fill.as_secs_f64()),
            "denied": denied,
            "local_pods": endpoints.len(),
            "runs": runs.max(1),
            "sweep_ms": {"list": stat(&dump_t), "judge": stat(&judge_t), "mark": stat(&mark_t), "total": stat(&total_t)},
            "steady_sweep_ms": stat(&steady_t),
            "note": "per run: ctnetlink dump of the table, every entry judged against node-0's policy, the denied ones marked (one ct mark bit); steady: the same with nothing to change",
        }}))
    })
    .context("entering the benchmark's network namespace")??;
    Ok(out)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
