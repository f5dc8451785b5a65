//! flock-agent at scale, against the in-repo test API server: a synthetic cluster (default
//! 150,000 pods and 10,000 policies) served over the real list/watch protocol to the real
//! informer source and node agent core, with 110 local endpoints on one node (real nft in a
//! network namespace; root). Prints JSON: the agent's memory, time from start to the first
//! committed sync, and event-to-enforced latency p50/p99 for policy changes and for pod adds
//! (CNI ADD).
//!
//! The API server runs in a child process (this binary, re-executed with `--serve`), so the
//! measured process holds only the agent: its RSS growth is the agent's memory.
//!
//! `cargo bench --bench agent_scale [-- PODS POLICIES]`. Under `cargo test` (no `--bench`
//! argument) it runs as a smoke test on a small cluster.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use flock::agent::{Agent, AgentConfig};
use flock::model::{LabelSelector, NetworkPolicy, ObjectRef, PolicyPeer, PolicyPort, PolicyRule, PortRef, Snapshot};
use flock::source::SourceWriter;
use flock::source::kube::{ApiHealth, SourceOptions};
use flock_cni::protocol::{self, AddRequest, PodIdentity, Request};
use flock_cni::testing::{NetnsGuard, TempDir};
use flock_test_apiserver::{ApiServer, Config, client_for_socket, client_for_socket_counting};
use k8s_openapi::api::networking::v1 as net;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use std::io::{BufRead, Read};
use std::path::Path;

/// What the agent's image sets in `GLIBC_TUNABLES` (see the Dockerfile).
const MALLOC_TUNABLE: &str = "glibc.malloc.mxfast=0";

fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok()).unwrap_or(0.0) / 1024.0
}

fn selector_json(s: &LabelSelector) -> Value {
    let exprs: Vec<Value> = s.match_expressions.iter().map(|e| json!({"key": e.key, "operator": e.operator, "values": e.values})).collect();
    json!({"matchLabels": s.match_labels, "matchExpressions": exprs})
}

fn rules_json(rules: &[PolicyRule], peers_key: &str) -> Vec<Value> {
    rules
        .iter()
        .map(|r| {
            let peers: Vec<Value> = r
                .peers
                .iter()
                .map(|p: &PolicyPeer| {
                    let mut v = json!({});
                    if let Some(s) = &p.pod_selector {
                        v["podSelector"] = selector_json(s);
                    }
                    if let Some(s) = &p.namespace_selector {
                        v["namespaceSelector"] = selector_json(s);
                    }
                    if let Some(b) = &p.ip_block {
                        v["ipBlock"] = json!({"cidr": b.cidr, "except": b.except});
                    }
                    v
                })
                .collect();
            let ports: Vec<Value> = r
                .ports
                .iter()
                .map(|p: &PolicyPort| {
                    let mut v = json!({});
                    if let Some(pr) = &p.protocol {
                        v["protocol"] = json!(pr);
                    }
                    match &p.port {
                        Some(PortRef::Number(n)) => v["port"] = json!(n),
                        Some(PortRef::Name(n)) => v["port"] = json!(n),
                        None => {}
                    }
                    if let Some(e) = p.end_port {
                        v["endPort"] = json!(e);
                    }
                    v
                })
                .collect();
            json!({peers_key: peers, "ports": ports})
        })
        .collect()
}

fn policy_json(p: &NetworkPolicy) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": p.name, "namespace": p.namespace},
           "spec": {"podSelector": selector_json(&p.pod_selector), "policyTypes": p.policy_types,
                    "ingress": rules_json(&p.ingress, "from"), "egress": rules_json(&p.egress, "to")}})
}

fn seed(server: &ApiServer, s: &Snapshot) {
    for n in s.nodes() {
        let cidrs: Vec<String> = n.pod_cidrs.iter().map(ToString::to_string).collect();
        let addrs: Vec<Value> = n.internal_ips.iter().map(|a| json!({"type": "InternalIP", "address": a.to_string()})).collect();
        server.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n.name}, "spec": {"podCIDRs": cidrs}, "status": {"addresses": addrs}})).unwrap();
    }
    for ns in s.namespaces() {
        server.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns.name, "labels": ns.labels}})).unwrap();
    }
    for p in s.pods() {
        let ports: Vec<Value> =
            p.ports.iter().map(|c| json!({"name": c.name.as_deref(), "containerPort": c.port, "protocol": c.protocol.as_k8s()})).collect();
        let ips: Vec<Value> = p.ips.iter().map(|i| json!({"ip": i.to_string()})).collect();
        server
            .apply(json!({"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": p.name, "namespace": p.namespace, "uid": p.uid, "labels": p.labels},
                          "spec": {"nodeName": p.node, "containers": [{"name": "c", "image": "x", "ports": ports}]},
                          "status": {"phase": "Running", "podIPs": ips}}))
            .unwrap();
    }
    for p in s.policies() {
        server.apply(policy_json(p)).unwrap();
    }
}

fn percentiles(mut v: Vec<f64>) -> Value {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v.get(((v.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
    json!({"n": v.len(), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": v.last().copied().unwrap_or(0.0)})
}

#[derive(serde::Deserialize, Clone)]
struct LocalPod {
    namespace: String,
    name: String,
    uid: String,
    app: Option<String>,
    ips: Vec<std::net::IpAddr>,
}

/// The child: seeds a test API server with the synthetic cluster, says `ready`, and serves
/// until its stdin closes (the parent exited).
fn serve(socket: &Path, pods: usize, policies: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(async move {
        let cluster = flock::synth::generate(&flock::synth::Params::new(pods, policies));
        let server = ApiServer::start_with(socket, Config { bookmark_interval: None, ..Config::default() }).await.unwrap();
        seed(&server, &cluster.snapshot);
        // The local pods' identities for the parent, which must not build the cluster itself
        // (its freed memory would hide the agent's growth).
        let local: Vec<Value> = cluster
            .snapshot
            .pods()
            .filter(|p| p.node.as_deref() == Some(cluster.node.as_str()))
            .map(|p| json!({"namespace": p.namespace, "name": p.name, "uid": p.uid, "app": p.labels.get("app"), "ips": p.ips}))
            .collect();
        drop(cluster);
        println!("{}", Value::Array(local));
        tokio::task::spawn_blocking(|| {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
        })
        .await
        .unwrap();
        drop(server);
    });
}

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let sizes: Vec<usize> = raw.iter().filter_map(|a| a.parse().ok()).collect();
    if let Some(i) = raw.iter().position(|a| a == "--serve") {
        serve(Path::new(&raw[i + 1]), sizes[0], sizes[1]);
        return;
    }
    // The agent's image disables glibc's fastbins (see the Dockerfile): measure that.
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if !tunables.contains(MALLOC_TUNABLE) {
        use std::os::unix::process::CommandExt;
        let tunables = if tunables.is_empty() { MALLOC_TUNABLE.to_string() } else { format!("{tunables}:{MALLOC_TUNABLE}") };
        let err = std::process::Command::new(std::env::current_exe().unwrap()).args(&raw).env("GLIBC_TUNABLES", tunables).exec();
        panic!("cannot run agent_scale again with GLIBC_TUNABLES: {err}");
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("agent_scale: needs root (a network namespace and nft); skipped");
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test` runs this as a smoke test.
    let (default_pods, default_policies) = if raw.iter().any(|a| a == "--bench") { (150_000, 10_000) } else { (2_000, 200) };
    let (pods, policies) = (sizes.first().copied().unwrap_or(default_pods), sizes.get(1).copied().unwrap_or(default_policies));
    let log = std::env::var_os("FLOCK_BENCH_LOG").is_some();
    if log {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("flock=debug,agent_scale=info"))
            .with_writer(std::io::stderr)
            .init();
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let dir = TempDir::new("scale");
        let socket = dir.join("api.sock");
        let t = Instant::now();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--serve", &socket.display().to_string(), &pods.to_string(), &policies.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let local: Vec<LocalPod> = serde_json::from_str(&line).expect("the API server child failed");
        let seed_s = t.elapsed().as_secs_f64();
        // The agent's client counts what it receives; the bench writes through its own.
        let received = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let client = client_for_socket(&socket);
        // Let the allocator settle, then measure the process before the agent exists.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rss_before = rss_mb();

        let node = NetnsGuard::new("scale-node");
        let mut cfg = AgentConfig::new("node-0", node.netns(), dir.join("cni.sock"), dir.join("spool"));
        cfg.routes = false;
        cfg.resync = Duration::from_secs(3600);
        // FLOCK_BENCH_REVOKE=0: without revocation sweeps (what they cost the latencies).
        if std::env::var("FLOCK_BENCH_REVOKE").is_ok_and(|v| v == "0") {
            cfg.revoke = None;
        }
        let health = Arc::new(ApiHealth::new(Duration::from_secs(5), Duration::from_secs(60)));
        let (writer, source) = SourceWriter::new(Snapshot::new(), false);
        let (_stop_tx, stop) = tokio::sync::watch::channel(false);
        let started = Instant::now();
        // As flock-agent runs them: on a thread of their own, with their own client.
        let (sock, rcv) = (socket.clone(), received.clone());
        let _informers = flock::source::kube::spawn_thread(
            SourceOptions::default(),
            move || Ok(client_for_socket_counting(&sock, rcv)),
            writer,
            health,
            cfg.metrics.clone(),
            stop,
        )
        .await
        .unwrap();
        let agent = Agent::start(cfg, source.clone()).await.unwrap();
        let mut status = agent.status();
        status.wait_for(|s| s.ready).await.unwrap();
        let first_sync_s = started.elapsed().as_secs_f64();
        let bytes = |r: &std::sync::atomic::AtomicU64| r.load(std::sync::atomic::Ordering::Relaxed);
        let initial_bytes = bytes(&received);
        // Counted, not iterated: a reader holding the source for the 150k pods' walk (~12 ms)
        // would stall the agent's CNI handlers behind a watch update waiting to write.
        let initial_objects = {
            let r = source.read();
            r.snapshot.pod_count() + r.snapshot.policy_count() + r.snapshot.namespaces().count() + r.snapshot.nodes().count()
        };

        // 110 local pods come up through flock-cni's socket (10 at a time).
        let socket = dir.join("cni.sock");
        let mut add_ms = Vec::new();
        for chunk in local.chunks(10) {
            let handles: Vec<_> = chunk
                .iter()
                .map(|p| {
                    let (socket, p) = (socket.clone(), p.clone());
                    tokio::task::spawn_blocking(move || {
                        let cid = format!("cid-{}", p.uid);
                        let req = Request::Add(AddRequest {
                            host_interface: flock_cni::host_interface_name(&cid, "eth0"),
                            container_id: cid,
                            ifname: "eth0".into(),
                            netns: String::new(),
                            pod: PodIdentity { namespace: p.namespace.clone(), name: p.name.clone(), uid: Some(p.uid.clone()) },
                            ips: p.ips.clone(),
                        });
                        let t = Instant::now();
                        protocol::call(&socket, req, Duration::from_secs(60)).unwrap();
                        t.elapsed().as_secs_f64() * 1000.0
                    })
                })
                .collect();
            let mut chunk_ms = Vec::new();
            for h in handles {
                chunk_ms.push(h.await.unwrap());
            }
            // FLOCK_BENCH_LOG: each group's latencies beside the agent's log of its syncs.
            if log {
                tracing::info!(?chunk_ms, "bench: a group of CNI ADDs");
            }
            add_ms.extend(chunk_ms);
        }
        let st = status.borrow().clone();
        let rss_after = rss_mb();

        // Policy changes in a local pod's namespace, one at a time.
        let mut policy_ms = Vec::new();
        let mut policy_agent_ms = Vec::new();
        let target = &local[0];
        for i in 0..40 {
            let name = format!("bench-change-{i}");
            let p = NetworkPolicy {
                audit: false,
                namespace: target.namespace.clone(),
                name: name.clone(),
                pod_selector: LabelSelector { match_labels: [("app".to_string(), target.app.clone().unwrap_or_default())].into(), ..Default::default() },
                policy_types: vec!["Ingress".into()],
                ingress: vec![PolicyRule { peers: vec![], ports: vec![PolicyPort { protocol: None, port: Some(PortRef::Number(9000 + i)), end_port: None }] }],
                egress: vec![],
                generation: None,
                egress_domains: None,
            };
            let key = ObjectRef::new(p.namespace.clone(), name);
            let t0 = Instant::now();
            let np: net::NetworkPolicy = serde_json::from_value(policy_json(&p)).unwrap();
            Api::<net::NetworkPolicy>::namespaced(client.clone(), &p.namespace).create(&PostParams::default(), &np).await.unwrap();
            let (arrived, version) = loop {
                let v = {
                    let r = source.read();
                    r.snapshot.policy(&key).is_some().then_some(r.version)
                };
                if let Some(v) = v {
                    break (Instant::now(), v);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            };
            status.wait_for(|s| s.source_version >= version && s.error.is_none()).await.unwrap();
            let done = Instant::now();
            policy_ms.push((done - t0).as_secs_f64() * 1000.0);
            policy_agent_ms.push((done - arrived).as_secs_f64() * 1000.0);
        }
        // 1,000 updates of other nodes' pods (a label each: what the agent must read), and
        // what the agent received for them.
        let pods_api = Api::<k8s_openapi::api::core::v1::Pod>::all(client.clone());
        let some = pods_api.list(&kube::api::ListParams::default().limit(1000)).await.unwrap();
        let targets: Vec<(String, String)> = some
            .items
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some("node-0"))
            .filter_map(|p| Some((p.metadata.namespace.clone()?, p.metadata.name.clone()?)))
            .collect();
        let before = bytes(&received);
        for (ns, name) in &targets {
            let patch = json!({"metadata": {"labels": {"bench-rev": "1"}}});
            Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns)
                .patch(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
                .await
                .unwrap();
        }
        // One watch: the last update in means every earlier one is.
        if let Some((ns, name)) = targets.last() {
            let key = ObjectRef::new(ns.clone(), name.clone());
            loop {
                let seen = source.read().snapshot.pod_by_name(&key).is_some_and(|p| p.labels.get("bench-rev").is_some_and(|v| v == "1"));
                if seen {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let update_bytes = bytes(&received) - before;
        let per_1000 = if targets.is_empty() { 0.0 } else { update_bytes as f64 * 1000.0 / targets.len() as f64 };
        println!(
            "{}",
            json!({
                "api_received_bytes": {
                    "initial_list": initial_bytes, "initial_objects": initial_objects,
                    "pod_updates": targets.len(), "per_1000_pod_updates": per_1000.round(),
                },
                "pods": pods, "policies": policies, "local_endpoints": local.len(),
                "seed_api_server_s": seed_s,
                "start_to_first_committed_sync_s": first_sync_s,
                "agent_rss_mb": rss_after - rss_before,
                "process_rss_mb": {"before_agent": rss_before, "after_agent": rss_after},
                "ruleset": {"rules": st.stats.rules, "set_elements": st.stats.elements, "last_sync_ms": st.last_duration.as_secs_f64() * 1000.0},
                "pod_add_cni_ms": percentiles(add_ms),
                "policy_change_api_to_enforced_ms": percentiles(policy_ms),
                "policy_change_watch_to_enforced_ms": percentiles(policy_agent_ms),
            })
        );
        agent.shutdown().await;
        drop(child.stdin.take());
        let _ = child.wait();
    });
}
