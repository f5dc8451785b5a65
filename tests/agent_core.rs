//! The node agent core over its unix socket, with a static source and real nft in a node
//! namespace (root): ADD waits for the Pod and acknowledges after the commit, unknown pods
//! are refused, the registry survives a restart whose first sync is a no-op, spooled DELs
//! are drained, drift is repaired by the periodic resync, CHECK/STATUS/GC.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use flock::agent::{Agent, AgentConfig};
use flock::apply::Backend;
use flock::apply::kernel::NftCli;
use flock::model::{Pod, PodPhase, Snapshot};
use flock::source::StaticSource;
use flock::testkit::kernel::{NetnsGuard, TempDir, require_root};
use flock_cni::protocol::{self, AddRequest, CheckRequest, DelRequest, GcRequest, PodIdentity, Request};
use flock_cni::spec::Attachment;

fn pod(name: &str, ip: &str) -> Pod {
    Pod {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        labels: Default::default(),
        node: Some("n1".into()),
        phase: PodPhase::Running,
        ips: vec![ip.parse().unwrap()],
        host_network: false,
        ports: vec![],
        created: None,
    }
}

fn config(node: &NetnsGuard, dir: &TempDir) -> AgentConfig {
    let mut c = AgentConfig::new("n1", node.netns(), dir.join("cni.sock"), dir.join("pending-del"));
    c.state_dir = Some(dir.join("state"));
    c.pod_wait = Duration::from_millis(500);
    c.routes = false;
    c
}

fn add(name: &str, ip: &str) -> Request {
    let cid = format!("cid-{name}");
    Request::Add(AddRequest {
        host_interface: flock_cni::host_interface_name(&cid, "eth0"),
        container_id: cid,
        ifname: "eth0".into(),
        netns: "/run/netns/none".into(),
        pod: PodIdentity { namespace: "default".into(), name: name.into(), uid: Some(format!("uid-{name}")) },
        ips: vec![ip.parse().unwrap()],
    })
}

async fn call(socket: &Path, req: Request) -> Result<(), String> {
    let socket = socket.to_path_buf();
    tokio::task::spawn_blocking(move || protocol::call(&socket, req, Duration::from_secs(10)).map_err(|e| e.to_string())).await.unwrap()
}

fn table(node: &NetnsGuard) -> String {
    NftCli::new(node.netns()).list_table().unwrap().unwrap_or_default()
}

fn snapshot(pods: &[Pod]) -> Snapshot {
    let mut s = Snapshot::new();
    s.upsert_namespace(flock::model::convert::implicit_namespace("default"));
    for p in pods {
        s.upsert_pod(p.clone());
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_waits_for_its_pod_and_is_acknowledged_after_the_commit() {
    if !require_root("add_waits_for_its_pod_and_is_acknowledged_after_the_commit") {
        return;
    }
    let (node, dir) = (NetnsGuard::new("node"), TempDir::new("agent"));
    let source = StaticSource::new(snapshot(&[]));
    let agent = Agent::start(config(&node, &dir), source.subscribe()).await.unwrap();
    let socket = dir.join("cni.sock");

    // Unknown pod: refused after the bounded wait.
    let e = call(&socket, add("ghost", "198.18.70.9")).await.unwrap_err();
    assert!(e.contains("not known"), "{e}");

    // The Pod arrives while the ADD waits: acknowledged, and the rules are in the kernel.
    let pending = tokio::spawn({
        let socket = socket.clone();
        async move { call(&socket, add("late", "198.18.70.10")).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    source.update(|s| s.upsert_pod(pod("late", "198.18.70.10")));
    pending.await.unwrap().unwrap();
    let iface = flock_cni::host_interface_name("cid-late", "eth0");
    assert!(table(&node).contains(&format!("\"{iface}\" . 198.18.70.10")), "{}", table(&node));

    // Refused: a host interface that is not the one derived from the container id.
    let mut bad = add("late", "198.18.70.10");
    if let Request::Add(a) = &mut bad {
        a.host_interface = "flk000000000000".into();
    }
    assert!(call(&socket, bad).await.unwrap_err().contains("is not the one"));

    // CHECK and STATUS.
    call(&socket, Request::Check(CheckRequest { container_id: "cid-late".into(), ifname: "eth0".into(), host_interface: iface.clone() }))
        .await
        .unwrap();
    call(&socket, Request::Status).await.unwrap();
    let other = flock_cni::host_interface_name("cid-x", "eth0");
    assert!(
        call(&socket, Request::Check(CheckRequest { container_id: "cid-x".into(), ifname: "eth0".into(), host_interface: other }))
            .await
            .is_err()
    );

    // GC with an empty valid list drops the endpoint; its rules go.
    call(&socket, Request::Gc(GcRequest { valid: vec![Attachment { container_id: "cid-other".into(), ifname: "eth0".into() }] }))
        .await
        .unwrap();
    let mut status = agent.status();
    tokio::time::timeout(Duration::from_secs(5), status.wait_for(|s| s.endpoints == 0)).await.unwrap().unwrap();
    assert!(!table(&node).contains(&iface));
    agent.shutdown().await;
    assert!(!socket.exists(), "the socket is removed on shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_registry_and_rules_drains_the_spool_and_repairs_drift() {
    if !require_root("restart_keeps_registry_and_rules_drains_the_spool_and_repairs_drift") {
        return;
    }
    let (node, dir) = (NetnsGuard::new("node"), TempDir::new("agent"));
    let source = StaticSource::new(snapshot(&[pod("a", "198.18.71.1"), pod("b", "198.18.71.2")]));
    let socket = dir.join("cni.sock");
    let agent = Agent::start(config(&node, &dir), source.subscribe()).await.unwrap();
    call(&socket, add("a", "198.18.71.1")).await.unwrap();
    call(&socket, add("b", "198.18.71.2")).await.unwrap();
    let before = table(&node);
    agent.shutdown().await;
    // Rules stay while the agent is down.
    assert_eq!(table(&node), before);

    // Restart: the registry comes back and the first sync changes nothing.
    let agent = Agent::start(config(&node, &dir), source.subscribe()).await.unwrap();
    let mut status = agent.status();
    let s = tokio::time::timeout(Duration::from_secs(5), status.wait_for(|s| s.ready)).await.unwrap().unwrap().clone();
    assert_eq!(s.syncs_applied, 0, "the first sync after a restart rewrote the table");
    assert_eq!(s.syncs_unchanged, 1);
    assert_eq!(agent.endpoints().len(), 2);
    assert_eq!(table(&node), before);
    agent.shutdown().await;

    // A DEL spooled while the agent was down is applied at start.
    let b_if = flock_cni::host_interface_name("cid-b", "eth0");
    let del = DelRequest { container_id: "cid-b".into(), ifname: "eth0".into(), host_interface: b_if.clone(), pod: None };
    let spooled = protocol::spool_del(&dir.join("pending-del"), &del).unwrap();
    let mut cfg = config(&node, &dir);
    cfg.resync = Duration::from_millis(300);
    let agent = Agent::start(cfg, source.subscribe()).await.unwrap();
    assert!(!spooled.exists());
    assert_eq!(agent.endpoints().len(), 1);
    let mut status = agent.status();
    tokio::time::timeout(Duration::from_secs(5), status.wait_for(|s| s.ready)).await.unwrap().unwrap();
    assert!(!table(&node).contains(&b_if));

    // Drift: someone flushes flock's base chain; the periodic resync repairs it.
    node.exec(&["nft", "flush", "chain", "inet", "flock", "forward"]);
    tokio::time::timeout(Duration::from_secs(5), status.wait_for(|s| s.drift_repairs >= 1)).await.unwrap().unwrap();
    assert!(table(&node).contains("iifname \"flk*\" jump from-pods"));
    agent.shutdown().await;
}

/// The status reports what a sync committed, not the live registry: with a slow `nft`, a GC
/// that lands while a sync is in flight must not make the status say "0 endpoints" before
/// the endpoint's rules are gone from the kernel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_the_committed_endpoints_not_the_live_registry() {
    if !require_root("status_reports_the_committed_endpoints_not_the_live_registry") {
        return;
    }
    let (node, dir) = (NetnsGuard::new("node"), TempDir::new("agent"));
    let slow_nft = dir.join("slow-nft");
    std::fs::write(&slow_nft, "#!/bin/sh\nsleep 0.4\nexec nft \"$@\"\n").unwrap();
    std::fs::set_permissions(&slow_nft, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let source = StaticSource::new(snapshot(&[pod("a", "198.18.72.1")]));
    let mut cfg = config(&node, &dir);
    cfg.nft = slow_nft;
    let agent = Agent::start(cfg, source.subscribe()).await.unwrap();
    let socket = dir.join("cni.sock");
    call(&socket, add("a", "198.18.72.1")).await.unwrap();
    let iface = flock_cni::host_interface_name("cid-a", "eth0");
    let mut status = agent.status();
    tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.endpoints == 1)).await.unwrap().unwrap();

    // A sync starts (a policy now isolates the pod) and sits in the slow nft...
    source.update(|s| {
        s.upsert_policy(flock::model::NetworkPolicy { namespace: "default".into(), name: "deny".into(), ..Default::default() })
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    // ...while a GC drops the endpoint.
    let gc = tokio::spawn({
        let socket = socket.clone();
        async move { call(&socket, Request::Gc(GcRequest { valid: vec![] })).await }
    });
    tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.endpoints == 0)).await.unwrap().unwrap();
    assert!(!table(&node).contains(&iface), "the status said 0 endpoints while the kernel still had {iface}");
    gc.await.unwrap().unwrap();
    agent.shutdown().await;
}

/// A DEL that overtakes an ADD still waiting for its Pod (flock-cni gave up on the ADD and
/// withdrew it) wins: the ADD registers nothing when the Pod shows up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_del_overtaking_a_waiting_add_wins() {
    if !require_root("a_del_overtaking_a_waiting_add_wins") {
        return;
    }
    let (node, dir) = (NetnsGuard::new("node"), TempDir::new("agent"));
    let source = StaticSource::new(snapshot(&[]));
    let mut cfg = config(&node, &dir);
    cfg.pod_wait = Duration::from_secs(5);
    let agent = Agent::start(cfg, source.subscribe()).await.unwrap();
    let socket = dir.join("cni.sock");
    let pending = tokio::spawn({
        let socket = socket.clone();
        async move { call(&socket, add("late", "198.18.73.1")).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let iface = flock_cni::host_interface_name("cid-late", "eth0");
    let del = DelRequest { container_id: "cid-late".into(), ifname: "eth0".into(), host_interface: iface.clone(), pod: None };
    call(&socket, Request::Del(del)).await.unwrap();
    source.update(|s| s.upsert_pod(pod("late", "198.18.73.1")));
    let e = pending.await.unwrap().unwrap_err();
    assert!(e.contains("withdrawn by a DEL"), "{e}");
    assert!(agent.endpoints().is_empty());
    // A later ADD (the runtime's retry) works as usual.
    call(&socket, add("late", "198.18.73.1")).await.unwrap();
    assert!(table(&node).contains(&iface));
    agent.shutdown().await;
}
