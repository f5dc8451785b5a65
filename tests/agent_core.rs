//! The node agent core over its unix socket, with a static source and real nft in a node
//! namespace (root): ADD waits for the Pod and acknowledges after the commit, unknown pods
//! are refused, the registry survives a restart whose first sync is a no-op, spooled DELs
//! are drained, drift is repaired by the periodic resync, CHECK/STATUS/GC, and a flood of
//! ADDs for unknown pods leaves nothing and holds up no known pod's ADD.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/agent.rs"]
mod common;

use std::path::Path;
use std::time::Duration;

use flock::agent::{Agent, AgentConfig, SyncHook, SyncStage};
use flock::apply::Backend;
use flock::apply::kernel::NftCli;
use flock::model::{Pod, Snapshot};
use flock::source::StaticSource;
use flock::testkit::kernel::{NetnsGuard, TempDir, require_root};
use flock_cni::protocol::{self, CheckRequest, DelRequest, GcRequest, Request};
use flock_cni::spec::Attachment;

use common::{add, pod};

fn config(node: &NetnsGuard, dir: &TempDir) -> AgentConfig {
    let mut c = AgentConfig::new("n1", node.netns(), dir.join("cni.sock"), dir.join("pending-del"));
    c.state_dir = Some(dir.join("state"));
    c.pod_wait = Duration::from_millis(500);
    c.routes = false;
    c
}

async fn call(socket: &Path, req: Request) -> Result<(), String> {
    let socket = socket.to_path_buf();
    tokio::task::spawn_blocking(move || protocol::call(&socket, req, Duration::from_secs(10)).map_err(|e| e.to_string())).await.unwrap()
}

/// The value of the sample `name` (with its labels, if any) in the metrics `text`.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
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

    // Drift: once a periodic check has a baseline to compare with, someone flushes flock's
    // base chain; the next check repairs it.
    tokio::time::timeout(Duration::from_secs(5), status.wait_for(|s| s.drift_checks >= 1)).await.unwrap().unwrap();
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
    // Through the slow nft: transactions as netlink batches would not wait for it.
    (cfg.nft, cfg.nft_transactions) = (slow_nft, true);
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

/// An `nft` that fails every transaction while `fail` exists, and logs each one.
fn failing_nft(dir: &TempDir) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let (script, fail, log) = (dir.join("nft"), dir.join("fail"), dir.join("nft.log"));
    let text = format!(
        "#!/bin/sh\ncase \" $* \" in *' -f '*) case \" $* \" in *' -c '*) ;; *) echo tx >> {log}; [ -e {fail} ] && {{ echo injected failure >&2; exit 1; }};; esac;; esac\nexec nft \"$@\"\n",
        log = log.display(),
        fail = fail.display()
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (script, fail, log)
}

fn transactions(log: &Path) -> usize {
    std::fs::read_to_string(log).map(|s| s.lines().count()).unwrap_or(0)
}

/// Failing syncs back off (events do not each cost an nft run) while a CNI ADD still tries
/// at once; the first commit ends the backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_syncs_back_off_but_an_add_tries_at_once() {
    if !require_root("failing_syncs_back_off_but_an_add_tries_at_once") {
        return;
    }
    let (node, dir) = (NetnsGuard::new("node"), TempDir::new("agent"));
    let (nft, fail, log) = failing_nft(&dir);
    let source = StaticSource::new(snapshot(&[pod("a", "198.18.74.1"), pod("b", "198.18.74.2")]));
    let mut cfg = config(&node, &dir);
    // Through the failing nft: transactions as netlink batches would not fail.
    (cfg.nft, cfg.nft_transactions) = (nft, true);
    let agent = Agent::start(cfg, source.subscribe()).await.unwrap();
    let socket = dir.join("cni.sock");
    call(&socket, add("a", "198.18.74.1")).await.unwrap();

    // nft starts failing; a stream of policy changes follows for 2.5 s.
    std::fs::write(&fail, b"").unwrap();
    let before = transactions(&log);
    let failures_before = agent.status().borrow().sync_failures;
    for i in 0..50 {
        source.update(|s| {
            s.upsert_policy(flock::model::NetworkPolicy { namespace: "default".into(), name: format!("p{}", i % 2), ..Default::default() })
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Backing off 1 s, 2 s, … (±20 %): at most 3 attempts in 2.5 s, not one per change.
    let s = agent.status().borrow().clone();
    let attempts = s.sync_failures - failures_before;
    assert!((1..=3).contains(&attempts), "{attempts} failed syncs ({} nft transactions) in 2.5 s", transactions(&log) - before);
    assert!(s.consecutive_failures >= 1 && s.error.as_deref().is_some_and(|e| e.contains("injected failure")), "{s:?}");
    let mut retry_at = s.retry_at.expect("a retry is scheduled");
    // A retry due in moments would race the ADD below: let it fail first (the next one is
    // 1.6 s or more away).
    let mut status = agent.status();
    while retry_at < std::time::Instant::now() + Duration::from_millis(500) {
        let after = retry_at;
        let s = tokio::time::timeout(Duration::from_secs(5), status.wait_for(|s| s.retry_at.is_some_and(|r| r > after)))
            .await
            .unwrap()
            .unwrap()
            .clone();
        retry_at = s.retry_at.expect("a retry is scheduled");
    }

    // nft works again; an ADD does not wait for the backoff's deadline.
    std::fs::remove_file(&fail).unwrap();
    call(&socket, add("b", "198.18.74.2")).await.unwrap();
    assert!(std::time::Instant::now() < retry_at, "the ADD waited for the backoff");
    let s = agent.status().borrow().clone();
    assert_eq!((s.consecutive_failures, s.retry_at, s.error), (0, None, None));
    assert!(table(&node).contains(&flock_cni::host_interface_name("cid-b", "eth0")));
    agent.shutdown().await;
}

/// A panic in a sync ends the agent (the daemon then exits non-zero and the kubelet restarts
/// it); the rules already committed stay in the kernel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_a_sync_crashes_the_agent_and_keeps_the_rules() {
    if !require_root("a_panic_in_a_sync_crashes_the_agent_and_keeps_the_rules") {
        return;
    }
    for stage in [SyncStage::Render, SyncStage::Apply] {
        let (node, dir) = (NetnsGuard::new("node"), TempDir::new("agent"));
        let source = StaticSource::new(snapshot(&[pod("a", "198.18.75.1")]));
        let armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut cfg = config(&node, &dir);
        cfg.sync_hook = Some(SyncHook(std::sync::Arc::new({
            let armed = armed.clone();
            move |s| {
                if s == stage && armed.load(std::sync::atomic::Ordering::SeqCst) {
                    panic!("injected panic in {s:?}");
                }
            }
        })));
        let agent = Agent::start(cfg, source.subscribe()).await.unwrap();
        call(&dir.join("cni.sock"), add("a", "198.18.75.1")).await.unwrap();
        let before = table(&node);
        armed.store(true, std::sync::atomic::Ordering::SeqCst);
        source.update(|s| {
            s.upsert_policy(flock::model::NetworkPolicy { namespace: "default".into(), name: "p".into(), ..Default::default() })
        });
        let why = tokio::time::timeout(Duration::from_secs(10), agent.crashed()).await.expect("the agent did not crash");
        assert!(why.contains("panicked") && why.contains("injected panic"), "{stage:?}: {why}");
        assert_eq!(table(&node), before, "{stage:?}: the rules changed");
        agent.shutdown().await;
    }
}

/// An ADD that arrives while a sync's transaction runs is translated beside it, not after
/// it: the pod waits for that commit and its own transaction only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_add_during_a_transaction_is_translated_beside_it() {
    if !require_root("an_add_during_a_transaction_is_translated_beside_it") {
        return;
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex, mpsc};
    let (node, dir) = (NetnsGuard::new("node"), TempDir::new("agent"));
    let pods = [pod("a", "198.18.76.1"), pod("b", "198.18.76.2"), pod("c", "198.18.76.3")];
    let source = StaticSource::new(snapshot(&pods));
    let events: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let hold = Arc::new(AtomicBool::new(false));
    let (release, released) = mpsc::channel::<()>();
    let released = Arc::new(Mutex::new(released));
    let mut cfg = config(&node, &dir);
    cfg.sync_hook = Some(SyncHook(Arc::new({
        let (events, hold) = (events.clone(), hold.clone());
        move |stage| {
            let held = stage == SyncStage::Apply && hold.swap(false, Ordering::SeqCst);
            events.lock().unwrap().push(match (stage, held) {
                (SyncStage::Render, _) => "render",
                (SyncStage::Apply, true) => "apply held",
                (SyncStage::Apply, false) => "apply",
            });
            if held {
                // The transaction "runs" until the test lets it go.
                let _ = released.lock().unwrap().recv_timeout(Duration::from_secs(20));
            }
        }
    })));
    let agent = Agent::start(cfg, source.subscribe()).await.unwrap();
    let socket = dir.join("cni.sock");
    call(&socket, add("a", "198.18.76.1")).await.unwrap();

    hold.store(true, Ordering::SeqCst);
    let b = tokio::spawn({
        let socket = socket.clone();
        async move { call(&socket, add("b", "198.18.76.2")).await }
    });
    let seen = |what: &'static str| {
        let events = events.clone();
        async move {
            for _ in 0..200 {
                let e = events.lock().unwrap().clone();
                if let Some(at) = e.iter().position(|x| *x == "apply held")
                    && e[at..].contains(&what)
                {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        }
    };
    assert!(seen("apply held").await, "b's transaction never started: {:?}", events.lock().unwrap());
    let c = tokio::spawn({
        let socket = socket.clone();
        async move { call(&socket, add("c", "198.18.76.3")).await }
    });
    // c's sync is translated while b's transaction is still held.
    assert!(seen("render").await, "c was not translated beside b's transaction: {:?}", events.lock().unwrap());
    assert!(!b.is_finished() && !c.is_finished(), "an ADD was acknowledged before its commit");
    release.send(()).unwrap();
    b.await.unwrap().unwrap();
    c.await.unwrap().unwrap();
    let t = table(&node);
    for name in ["a", "b", "c"] {
        assert!(t.contains(&flock_cni::host_interface_name(&format!("cid-{name}"), "eth0")), "{name} not in the table");
    }
    assert_eq!(agent.endpoints().len(), 3);
    agent.shutdown().await;
}

/// An nft that cannot load flock's rules fails the start with a message naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_nft_fails_the_start_clearly() {
    if !require_root("an_unusable_nft_fails_the_start_clearly") {
        return;
    }
    let (node, dir) = (NetnsGuard::new("node"), TempDir::new("agent"));
    let old = dir.join("old-nft");
    std::fs::write(&old, "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'nftables v0.9.0 (Fearless Fosdick)'; exit 0; }\necho 'Error: syntax error, unexpected ifname' >&2\nexit 1\n").unwrap();
    std::fs::set_permissions(&old, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for (program, want) in
        [(old.clone(), "v0.9.0 (Fearless Fosdick) cannot load the rules flock writes"), (dir.join("missing-nft"), "cannot run nft")]
    {
        let mut cfg = config(&node, &dir);
        cfg.nft = program.clone();
        let Err(e) = Agent::start(cfg, StaticSource::new(snapshot(&[])).subscribe()).await else { panic!("{program:?}: started") };
        let chain = format!("{:#}", anyhow_like(&e));
        assert!(chain.contains(&program.display().to_string()) && chain.contains(want), "{chain}");
    }
}

/// The error and its sources, `: `-joined (what `anyhow`'s `{:#}` prints in the daemon).
fn anyhow_like(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// Syncs after the first translate only what changed (the source's journal), the periodic
/// tick's full translation agrees with them, and the table follows every change: a policy
/// isolating `a` from everything but `b`, then `c` relabelled into its peers, then `b` gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_are_translated_incrementally_and_the_periodic_check_agrees() {
    if !require_root("changes_are_translated_incrementally_and_the_periodic_check_agrees") {
        return;
    }
    let (node, dir) = (NetnsGuard::new("node"), TempDir::new("agent"));
    let mut s = snapshot(&[pod("a", "198.18.72.1"), pod("b", "198.18.72.2"), pod("c", "198.18.72.3")]);
    for p in flock::testkit::policies(
        "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: only-peers, namespace: default}
spec:
  podSelector: {matchLabels: {role: server}}
  ingress: [{from: [{podSelector: {matchLabels: {role: peer}}}]}]",
    ) {
        s.upsert_policy(p);
    }
    let labelled = |mut p: Pod, role: &str| {
        p.labels.insert("role", role);
        p
    };
    s.upsert_pod(labelled(pod("a", "198.18.72.1"), "server"));
    s.upsert_pod(labelled(pod("b", "198.18.72.2"), "peer"));
    let source = StaticSource::new(s);
    let mut cfg = config(&node, &dir);
    cfg.resync = Duration::from_millis(400);
    let metrics = cfg.metrics.clone();
    let agent = Agent::start(cfg, source.subscribe()).await.unwrap();
    let socket = dir.join("cni.sock");
    call(&socket, add("a", "198.18.72.1")).await.unwrap();
    assert!(table(&node).contains("198.18.72.2"));
    assert!(!table(&node).contains("198.18.72.3"));

    let mut status = agent.status();
    let v = source.update(|s| s.upsert_pod(labelled(pod("c", "198.18.72.3"), "peer")));
    tokio::time::timeout(Duration::from_secs(5), status.wait_for(|s| s.source_version >= v)).await.unwrap().unwrap();
    assert!(table(&node).contains("198.18.72.3"), "{}", table(&node));
    let v = source.update(|s| {
        s.remove_pod("uid-b");
    });
    tokio::time::timeout(Duration::from_secs(5), status.wait_for(|s| s.source_version >= v)).await.unwrap().unwrap();
    assert!(!table(&node).contains("198.18.72.2"), "{}", table(&node));

    // A periodic tick compares the kept translation with a full one.
    let checked = || metrics.encode().lines().any(|l| l.starts_with("flock_translations_total{mode=\"check\"}") && !l.ends_with(" 0"));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !checked() {
        assert!(std::time::Instant::now() < deadline, "no periodic check:\n{}", metrics.encode());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = metrics.encode();
    let value = |name: &str| metric(&text, name).unwrap_or(0.0);
    assert!(value("flock_translations_total{mode=\"incremental\"}") >= 2.0, "{text}");
    assert_eq!(value("flock_translations_total{mode=\"full\"}"), 1.0, "{text}");
    assert_eq!(value("flock_translation_disagreements_total"), 0.0, "{text}");
    agent.shutdown().await;
}

/// A due revocation sweep gives way while a CNI request is being served, and only a bounded
/// while: with an ADD waiting for its Pod, the sweep a policy change owes has not started when
/// the change is committed, and starts (its bound reached) while the ADD still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_sweep_gives_way_to_a_cni_request_a_bounded_while() {
    if !require_root("a_due_sweep_gives_way_to_a_cni_request_a_bounded_while") {
        return;
    }
    let (node, dir) = (NetnsGuard::new("yield"), TempDir::new("yield"));
    let source = StaticSource::new(snapshot(&[pod("a", "198.18.72.1")]));
    let socket = dir.join("cni.sock");
    // Pod a's endpoint, registered by a first agent; the second starts with it, so that its
    // one commit and one sweep are the start's and nothing else is owed.
    let agent = Agent::start(config(&node, &dir), source.subscribe()).await.unwrap();
    call(&socket, add("a", "198.18.72.1")).await.unwrap();
    agent.shutdown().await;
    let mut cfg = config(&node, &dir);
    cfg.pod_wait = Duration::from_secs(30);
    let metrics = cfg.metrics.clone();
    let agent = Agent::start(cfg, source.subscribe()).await.unwrap();
    let mut status = agent.status();
    tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.ready && s.sweeps >= 1)).await.unwrap().unwrap();
    let in_flight = || metric(&metrics.encode(), "flock_cni_requests_in_flight");
    assert_eq!(in_flight(), Some(0.0));

    // An ADD for a pod the source does not know yet: in flight until the Pod comes.
    let pending = tokio::spawn({
        let socket = socket.clone();
        async move { call(&socket, add("late", "198.18.72.2")).await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while in_flight() != Some(1.0) {
        assert!(std::time::Instant::now() < deadline, "the ADD never arrived: {:?}", in_flight());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // A policy now isolates pod a: the table changes and a sweep is owed.
    let version = source.update(|s| {
        s.upsert_policy(flock::model::NetworkPolicy { namespace: "default".into(), name: "deny".into(), ..Default::default() })
    });
    let committed =
        tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.source_version >= version)).await.unwrap().unwrap().clone();
    // Without giving way it would start at once and take milliseconds; it waits 200 ms.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!((committed.sweeps, status.borrow().sweeps), (1, 1), "the sweep did not give way to the ADD in flight");
    // Its bound reached, it starts though the ADD still waits.
    tokio::time::timeout(Duration::from_secs(10), status.wait_for(|s| s.sweeps >= 2)).await.unwrap().unwrap();
    assert!(!pending.is_finished(), "the ADD ended before the sweep started");
    assert!(status.borrow().swept_source_version >= version);

    // The Pod comes: the ADD is acknowledged; nothing is in flight any more.
    source.update(|s| s.upsert_pod(pod("late", "198.18.72.2")));
    pending.await.unwrap().unwrap();
    assert_eq!(in_flight(), Some(0.0));
    agent.shutdown().await;
}

/// A flood of ADDs, as a tenant's churn makes it (sandboxes of pods deleted before the agent
/// saw them, or never known): 300 ADDs for pods the source never shows, beside 50 for pods it
/// does, all at once. Each unknown one is refused after the bounded wait, naming its pod, and
/// leaves nothing — no endpoint, no element, no chain; the known ones are acknowledged with
/// their rules in the kernel, none waiting behind the unknown ones; nothing stays in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_adds_for_unknown_pods_leaves_nothing_and_holds_up_no_one() {
    if !require_root("a_flood_of_adds_for_unknown_pods_leaves_nothing_and_holds_up_no_one") {
        return;
    }
    let (node, dir) = (NetnsGuard::new("addf"), TempDir::new("addf"));
    let known: Vec<Pod> = (0..50).map(|i| pod(&format!("known-{i}"), &format!("198.18.71.{}", i + 1))).collect();
    let source = StaticSource::new(snapshot(&known));
    let mut cfg = config(&node, &dir);
    // Long enough that no known pod's ADD can be mistaken for one waiting it out.
    cfg.pod_wait = Duration::from_secs(5);
    let metrics = cfg.metrics.clone();
    let agent = Agent::start(cfg, source.subscribe()).await.unwrap();
    let socket = dir.join("cni.sock");

    let started = std::time::Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..300 {
        let (socket, name) = (socket.clone(), format!("ghost-{i}"));
        let ip = format!("198.18.{}.{}", 72 + i / 200, 1 + i % 200);
        calls.spawn(async move { (name.clone(), call(&socket, add(&name, &ip)).await, started.elapsed()) });
    }
    for (i, p) in known.iter().enumerate() {
        let (socket, name) = (socket.clone(), p.name.clone());
        let ip = format!("198.18.71.{}", i + 1);
        calls.spawn(async move { (name.clone(), call(&socket, add(&name, &ip)).await, started.elapsed()) });
    }
    let (mut acked, mut refused) = (Vec::new(), Vec::new());
    while let Some(done) = calls.join_next().await {
        let (name, result, took) = done.unwrap();
        match (name.starts_with("known-"), result) {
            (true, Ok(())) => acked.push(took),
            (false, Err(e)) => {
                assert!(e.contains("not known") && e.contains(&name), "{name}: {e}");
                refused.push(took);
            }
            (_, r) => panic!("{name}: {r:?}"),
        }
    }
    assert_eq!((acked.len(), refused.len()), (50, 300));
    let slowest_ack = acked.iter().max().copied().unwrap();
    let first_refusal = refused.iter().min().copied().unwrap();
    assert!(first_refusal >= Duration::from_secs(5), "an unknown pod was refused before the wait: {first_refusal:?}");
    assert!(slowest_ack < first_refusal, "a known pod's ADD waited behind the unknown ones: {slowest_ack:?}");

    let text = table(&node);
    for i in 0..50 {
        let iface = flock_cni::host_interface_name(&format!("cid-known-{i}"), "eth0");
        assert!(text.contains(&format!("\"{iface}\" . 198.18.71.{}", i + 1)), "known-{i} is not in the table");
    }
    for i in 0..300 {
        let iface = flock_cni::host_interface_name(&format!("cid-ghost-{i}"), "eth0");
        assert!(!text.contains(&iface), "ghost-{i} left {iface} in the table");
    }
    assert!(!text.contains("198.18.72.") && !text.contains("198.18.73."), "an unknown pod's address is in the table");
    assert_eq!(agent.status().borrow().endpoints, 50);
    assert_eq!(metric(&metrics.encode(), "flock_cni_requests_in_flight"), Some(0.0));
    eprintln!("50 ADDs acknowledged within {slowest_ack:?} beside 300 unknown ones (refused from {first_refusal:?})");
    agent.shutdown().await;
}
