//! ADD and DEL latency of flock-cni against Debian's `ptp`, in the same run, with host-local
//! IPAM and an agent that acknowledges at once. Root only (network namespaces).
//!
//! `cargo bench -p flock-cni --bench add_del [-- PODS]` prints JSON: p50/p99 per plugin and
//! verb, in milliseconds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flock_cni::runtime::{ConfList, Runtime, Sandbox};
use flock_cni::testing::{FakeAgent, NetnsGuard, TempDir};
use serde_json::json;

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn run(runtime: &Runtime, conf: &ConfList, pods: &[NetnsGuard], tag: &str) -> serde_json::Value {
    let sandboxes: Vec<Sandbox> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| Sandbox::for_pod(&format!("{tag}-{i}"), &format!("/run/netns/{}", p.name), "bench", &format!("p{i}"), None))
        .collect();
    let mut add = Vec::new();
    let mut results = Vec::new();
    for sb in &sandboxes {
        let t = Instant::now();
        results.push(runtime.add(conf, sb).unwrap_or_else(|e| panic!("{tag} ADD: {e}")));
        add.push(t.elapsed());
    }
    let mut del = Vec::new();
    for (sb, r) in sandboxes.iter().zip(&results) {
        let t = Instant::now();
        runtime.del(conf, sb, Some(r)).unwrap_or_else(|e| panic!("{tag} DEL: {e}"));
        del.push(t.elapsed());
    }
    add.sort();
    del.sort();
    json!({
        "add_ms": {"p50": percentile(&add, 0.5), "p99": percentile(&add, 0.99)},
        "del_ms": {"p50": percentile(&del, 0.5), "p99": percentile(&del, 0.99)},
    })
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("add_del: needs root (network namespaces); skipped");
        return;
    }
    let n: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(200);
    flock_cni::testing::sweep();
    let node = NetnsGuard::new("bench-node");
    node.ip(&["link", "add", "uplink", "type", "veth", "peer", "name", "uplink-peer"]);
    node.ip(&["link", "set", "uplink", "up"]);
    node.ip(&["route", "add", "default", "dev", "uplink"]);
    let dir = TempDir::new("bench");
    let _agent = FakeAgent::acking(&dir.join("cni.sock"));
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_flock-cni")).parent().unwrap().to_path_buf();
    let runtime = Runtime { cni_path: vec![bin_dir, PathBuf::from("/usr/lib/cni")], netns: node.netns() };
    let flock = ConfList::parse(
        &json!({"cniVersion": "1.0.0", "name": "bench-flock", "plugins": [{
            "type": "flock-cni", "agentSocket": dir.join("cni.sock"), "stateDir": dir.join("state"), "pendingDelDir": dir.join("spool"),
            "ipam": {"type": "host-local", "dataDir": dir.join("ipam"), "ranges": [[{"subnet": "198.18.64.0/22"}]]}}]})
        .to_string(),
    )
    .unwrap();
    let ptp = ConfList::parse(
        &json!({"cniVersion": "1.0.0", "name": "bench-ptp", "plugins": [{
            "type": "ptp", "ipMasq": false,
            "ipam": {"type": "host-local", "dataDir": dir.join("ipam"), "ranges": [[{"subnet": "198.18.68.0/22"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]})
        .to_string(),
    )
    .unwrap();
    let pods: Vec<NetnsGuard> = (0..n).map(|i| NetnsGuard::new(&format!("b{i}"))).collect();
    // Warm up both (page cache, first exec), then measure alternately-ordered runs.
    let _ = run(&runtime, &flock, &pods[..5.min(n)], "warm-flock");
    let _ = run(&runtime, &ptp, &pods[..5.min(n)], "warm-ptp");
    let f = run(&runtime, &flock, &pods, "flock");
    let p = run(&runtime, &ptp, &pods, "ptp");
    let ratio = |verb: &str, q: &str| f[verb][q].as_f64().unwrap() / p[verb][q].as_f64().unwrap();
    println!(
        "{}",
        json!({
            "pods": n,
            "flock-cni": f,
            "ptp": p,
            "ratio": {"add_p50": ratio("add_ms", "p50"), "add_p99": ratio("add_ms", "p99"), "del_p50": ratio("del_ms", "p50"), "del_p99": ratio("del_ms", "p99")},
        })
    );
}
