//! Connections a policy change denies are cut (root): long-running TCP and UDP flows between
//! the simulated cluster's pods (their own echo servers), then a change — a new policy, a
//! changed policy, a pod relabelled, a namespace relabelled, a ClusterNetworkPolicy Deny —
//! and each denied flow must end within 1 s of the commit (TCP: the client gets a reset),
//! while flows the new policy still admits lose nothing. IPv4 and IPv6 clusters.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flock::model::Snapshot;
use flock::netns::{self, Netns};
use flock::sim::{Sim, SimOptions};
use flock::testkit::kernel::{flock_cni_binary, require_root};
use flock::testkit::{self, parse_manifests};

const PORT: u16 = 7000;
/// How often a flow sends.
const EVERY: Duration = Duration::from_millis(10);

fn sim_options() -> SimOptions {
    SimOptions::new(flock_cni_binary().parent().unwrap().to_path_buf())
}

fn pod_ip(s: &Snapshot, pod: &str) -> IpAddr {
    s.pod_by_name(&testkit::pod_ref(pod)).and_then(|p| p.ips.first().copied()).expect("pod address")
}

fn pod_ns(sim: &Sim, pod: &str) -> Netns {
    Netns::named(&sim.pod_netns(pod).expect("pod namespace"))
}

/// TCP and UDP echo servers on `PORT` of a pod, until dropped.
struct Echo {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Echo {
    fn start(sim: &Sim, pod: &str) -> Self {
        let addr = SocketAddr::new(pod_ip(&sim.snapshot(), pod), PORT);
        let (tcp, udp) = netns::run_in(&pod_ns(sim, pod), || (TcpListener::bind(addr).unwrap(), UdpSocket::bind(addr).unwrap())).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        tcp.set_nonblocking(true).unwrap();
        let flag = stop.clone();
        threads.push(std::thread::spawn(move || {
            let mut conns = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                match tcp.accept() {
                    Ok((mut c, _)) => {
                        let flag = flag.clone();
                        conns.push(std::thread::spawn(move || {
                            c.set_nonblocking(false).unwrap();
                            c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                            let mut buf = [0u8; 8];
                            while !flag.load(Ordering::Relaxed) {
                                match c.read_exact(&mut buf) {
                                    Ok(()) => {
                                        if c.write_all(&buf).is_err() {
                                            return;
                                        }
                                    }
                                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                                    Err(_) => return,
                                }
                            }
                        }));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            for c in conns {
                let _ = c.join();
            }
        }));
        udp.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let flag = stop.clone();
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while !flag.load(Ordering::Relaxed) {
                if let Ok((n, from)) = udp.recv_from(&mut buf) {
                    let _ = udp.send_to(&buf[..n], from);
                }
            }
        }));
        Self { stop, threads }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proto {
    Tcp,
    Udp,
}

/// What a flow saw: when each message was sent and echoed, and how it ended.
#[derive(Debug, Default)]
struct Log {
    sent: Vec<Instant>,
    echoed: Vec<Option<Instant>>,
    ended: Option<(Instant, ErrorKind)>,
}

/// A client sending a numbered message every `EVERY` and reading the echoes.
struct Flow {
    label: String,
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Log>>,
    thread: Option<JoinHandle<()>>,
}

impl Flow {
    fn start(sim: &Sim, proto: Proto, from: &str, to: &str) -> Self {
        let dst = SocketAddr::new(pod_ip(&sim.snapshot(), to), PORT);
        Self::start_to(sim, proto, from, dst).labelled(format!("{proto:?} {from} -> {to}"))
    }

    fn labelled(mut self, label: String) -> Self {
        self.label = label;
        self
    }

    /// A flow from pod `from` to any address.
    fn start_to(sim: &Sim, proto: Proto, from: &str, dst: SocketAddr) -> Self {
        let src = pod_ip(&sim.snapshot(), from);
        let label = format!("{proto:?} {from} -> {dst}");
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Log::default()));
        let (flag, out) = (stop.clone(), log.clone());
        let ns = pod_ns(sim, from);
        let thread = match proto {
            Proto::Tcp => {
                let mut c = netns::run_in(&ns, || TcpStream::connect_timeout(&dst, Duration::from_secs(2))).unwrap().unwrap();
                c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                c.set_nodelay(true).unwrap();
                std::thread::spawn(move || {
                    let mut seq = 0u64;
                    while !flag.load(Ordering::Relaxed) {
                        out.lock().unwrap().sent.push(Instant::now());
                        let mut buf = [0u8; 8];
                        let r = c.write_all(&seq.to_be_bytes()).and_then(|()| c.read_exact(&mut buf));
                        let mut l = out.lock().unwrap();
                        match r {
                            Ok(()) if u64::from_be_bytes(buf) == seq => l.echoed.push(Some(Instant::now())),
                            Ok(()) => panic!("echo out of order"),
                            Err(e) => {
                                l.echoed.push(None);
                                l.ended = Some((Instant::now(), e.kind()));
                                return;
                            }
                        }
                        drop(l);
                        seq += 1;
                        std::thread::sleep(EVERY);
                    }
                })
            }
            Proto::Udp => {
                let u = netns::run_in(&ns, || {
                    let u = UdpSocket::bind(SocketAddr::new(src, 0))?;
                    u.connect(dst)?;
                    Ok::<_, std::io::Error>(u)
                })
                .unwrap()
                .unwrap();
                u.set_read_timeout(Some(EVERY)).unwrap();
                std::thread::spawn(move || {
                    let mut seq = 0u64;
                    while !flag.load(Ordering::Relaxed) {
                        {
                            let mut l = out.lock().unwrap();
                            l.sent.push(Instant::now());
                            l.echoed.push(None);
                        }
                        // A send refused (an ICMP error queued on the socket) is a loss too.
                        let _ = u.send(&seq.to_be_bytes());
                        let until = Instant::now() + EVERY;
                        while Instant::now() < until {
                            let mut buf = [0u8; 8];
                            if let Ok(8) = u.recv(&mut buf) {
                                let n = u64::from_be_bytes(buf) as usize;
                                let mut l = out.lock().unwrap();
                                if let Some(e) = l.echoed.get_mut(n) {
                                    *e = Some(Instant::now());
                                }
                            }
                        }
                        seq += 1;
                    }
                })
            }
        };
        Self { label, stop, log, thread: Some(thread) }
    }

    fn finish(mut self) -> (String, Log) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let log = std::mem::take(&mut *self.log.lock().unwrap());
        (self.label.clone(), log)
    }
}

/// The flow ended within 1 s of `committed` (TCP: by a reset) and nothing got through later.
fn assert_cut(label: &str, log: &Log, committed: Instant) {
    let echoes_before = log.echoed.iter().flatten().filter(|t| **t < committed).count();
    assert!(echoes_before > 0, "{label}: never flowed before the change");
    let deadline = committed + Duration::from_secs(1);
    let late: Vec<&Instant> = log.echoed.iter().flatten().filter(|t| **t > deadline).collect();
    assert!(late.is_empty(), "{label}: {} echoes more than 1 s after the commit", late.len());
    match log.ended {
        Some((at, kind)) => {
            assert_eq!(kind, ErrorKind::ConnectionReset, "{label}: ended by {kind:?}, not a reset");
            assert!(at <= deadline, "{label}: reset {:?} after the commit", at - committed);
            eprintln!("{label}: cut {:.0} ms after the commit", (at.saturating_duration_since(committed)).as_secs_f64() * 1000.0);
        }
        None => {
            // UDP: still sending after the deadline, and nothing came back.
            let tried = log.sent.iter().filter(|t| **t > deadline).count();
            assert!(tried > 10, "{label}: stopped sending ({tried} after the deadline)");
            let last = log.echoed.iter().flatten().max().copied().unwrap_or(committed);
            eprintln!("{label}: last echo {:.0} ms after the commit", last.saturating_duration_since(committed).as_secs_f64() * 1000.0);
        }
    }
}

/// The flow went on with every message echoed (the last few may be in flight at the stop).
fn assert_intact(label: &str, log: &Log) {
    assert!(log.ended.is_none(), "{label}: ended: {:?}", log.ended.map(|(_, k)| k));
    let settled = log.sent.len().saturating_sub(3);
    let lost = log.echoed.iter().take(settled).filter(|e| e.is_none()).count();
    assert!(settled > 50, "{label}: only {settled} messages");
    assert_eq!(lost, 0, "{label}: {lost} of {settled} messages lost");
}

/// Objects from YAML applied to the snapshot.
fn apply_yaml(s: &mut Snapshot, yaml: &str) {
    for o in parse_manifests(yaml).objects {
        o.apply_to(s);
    }
}

fn relabel_pod(s: &mut Snapshot, pod: &str, key: &str, value: Option<&str>) {
    let mut p = s.pod_by_name(&testkit::pod_ref(pod)).cloned().unwrap();
    match value {
        Some(v) => p.labels.insert(key, v),
        None => p.labels.remove(key),
    };
    s.upsert_pod(p);
}

fn relabel_namespace(s: &mut Snapshot, ns: &str, key: &str, value: &str) {
    let mut n = s.namespace(ns).cloned().unwrap();
    n.labels.insert(key, value);
    s.upsert_namespace(n);
}

/// One scenario: `setup` before the flows start, `change` while they run. Flows from
/// `denied` to x/b are cut, flows from `admitted` to x/b and y/b -> y/c are intact.
struct Scenario {
    name: &'static str,
    setup: fn(&mut Snapshot),
    change: fn(&mut Snapshot),
    denied: &'static [&'static str],
    admitted: &'static [&'static str],
}

/// x/b admits x/c on every port and namespace y on `port` (TCP and UDP).
fn allow_from_c_and_y(port: u16) -> String {
    format!(
        "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: b-in, namespace: x}}
spec:
  podSelector: {{matchLabels: {{pod: b}}}}
  ingress:
    - from: [{{podSelector: {{matchLabels: {{pod: c}}}}}}]
    - from: [{{namespaceSelector: {{matchLabels: {{ns: y}}}}}}]
      ports: [{{port: {port}, protocol: TCP}}, {{port: {port}, protocol: UDP}}]
"
    )
}

const ALLOW_ROLE_CLIENT: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-in, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress:
    - from: [{namespaceSelector: {}, podSelector: {matchLabels: {role: client}}}]
";

const ALLOW_TEAM_BLUE: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-in, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress:
    - from: [{namespaceSelector: {matchLabels: {team: blue}}}]
";

const CNP_DENY_Y_TO_X: &str = "
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: quarantine-x}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {ns: x}}}
  ingress:
    - action: Deny
      from: [{namespaces: {matchLabels: {ns: y}}}]
";

fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "a new policy",
            setup: |_| {},
            change: |s| {
                apply_yaml(
                    s,
                    "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-in, namespace: x}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: c}}}]}]
",
                )
            },
            denied: &["y/a", "y/b"],
            admitted: &["x/c"],
        },
        Scenario {
            name: "a changed policy",
            setup: |s| apply_yaml(s, &allow_from_c_and_y(PORT)),
            change: |s| apply_yaml(s, &allow_from_c_and_y(PORT + 1)),
            denied: &["y/a", "y/b"],
            admitted: &["x/c"],
        },
        Scenario {
            name: "a pod relabelled",
            setup: |s| {
                apply_yaml(s, ALLOW_ROLE_CLIENT);
                for p in ["y/a", "y/b", "x/c"] {
                    relabel_pod(s, p, "role", Some("client"));
                }
            },
            change: |s| {
                relabel_pod(s, "y/a", "role", None);
                relabel_pod(s, "y/b", "role", Some("server"));
            },
            denied: &["y/a", "y/b"],
            admitted: &["x/c"],
        },
        Scenario {
            name: "a namespace relabelled",
            setup: |s| {
                apply_yaml(s, ALLOW_TEAM_BLUE);
                relabel_namespace(s, "x", "team", "blue");
                relabel_namespace(s, "y", "team", "blue");
            },
            change: |s| relabel_namespace(s, "y", "team", "red"),
            denied: &["y/a", "y/b"],
            admitted: &["x/c"],
        },
        Scenario {
            name: "a ClusterNetworkPolicy Deny",
            setup: |_| {},
            change: |s| apply_yaml(s, CNP_DENY_Y_TO_X),
            denied: &["y/a", "y/b"],
            admitted: &["x/c"],
        },
    ]
}

async fn run_scenarios(base: Snapshot) {
    let mut sim = Sim::build(base, sim_options()).await.unwrap();
    let base = sim.snapshot();
    let _echo_b = Echo::start(&sim, "x/b");
    let _echo_c = Echo::start(&sim, "y/c");
    for sc in scenarios() {
        eprintln!("-- {}", sc.name);
        sim.apply(|s| (sc.setup)(s)).await.unwrap();
        let mut cut = Vec::new();
        let mut kept = Vec::new();
        for from in sc.denied {
            cut.push(Flow::start(&sim, Proto::Tcp, from, "x/b"));
            cut.push(Flow::start(&sim, Proto::Udp, from, "x/b"));
        }
        for from in sc.admitted {
            kept.push(Flow::start(&sim, Proto::Tcp, from, "x/b"));
            kept.push(Flow::start(&sim, Proto::Udp, from, "x/b"));
        }
        kept.push(Flow::start(&sim, Proto::Tcp, "y/b", "y/c"));
        kept.push(Flow::start(&sim, Proto::Udp, "z/b", "y/c"));
        tokio::time::sleep(Duration::from_millis(400)).await;
        sim.apply(|s| (sc.change)(s)).await.unwrap();
        let committed = Instant::now();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        for f in cut {
            let (label, log) = f.finish();
            assert_cut(&format!("{}: {label}", sc.name), &log, committed);
        }
        for f in kept {
            let (label, log) = f.finish();
            assert_intact(&format!("{}: {label}", sc.name), &log);
        }
        let restore = base.clone();
        sim.apply(move |s| *s = restore).await.unwrap();
    }
    sim.teardown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn denied_connections_are_cut_and_admitted_ones_keep_flowing_ipv4() {
    if !require_root("denied_connections_are_cut_and_admitted_ones_keep_flowing_ipv4") {
        return;
    }
    run_scenarios(testkit::base_cluster()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn denied_connections_are_cut_and_admitted_ones_keep_flowing_ipv6() {
    if !require_root("denied_connections_are_cut_and_admitted_ones_keep_flowing_ipv6") {
        return;
    }
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/conformance-v6/base-cluster.yaml")).unwrap();
    run_scenarios(parse_manifests(&text).to_snapshot()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_revocation_a_denied_connection_outlives_the_change() {
    if !require_root("without_revocation_a_denied_connection_outlives_the_change") {
        return;
    }
    let mut sim = Sim::build(testkit::base_cluster(), SimOptions { revoke: false, ..sim_options() }).await.unwrap();
    let _echo = Echo::start(&sim, "x/b");
    let tcp = Flow::start(&sim, Proto::Tcp, "y/a", "x/b");
    let udp = Flow::start(&sim, Proto::Udp, "y/b", "x/b");
    tokio::time::sleep(Duration::from_millis(300)).await;
    sim.apply(|s| apply_yaml(s, CNP_DENY_Y_TO_X)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // What the agent's revocation exists for: conntrack alone keeps both flows alive.
    for f in [tcp, udp] {
        let (label, log) = f.finish();
        assert_intact(&label, &log);
    }
    // A new connection is denied all the same.
    let c = sim.probe(
        flock::sim::ProbeSpec { port: 80, protocol: flock::model::Protocol::Tcp, family: None },
        &["y/a".to_string()],
        &["x/b".to_string()],
    );
    assert_ne!(c.unwrap()[0].outcome, Some(flock::sim::probe::Outcome::Connected));
    sim.teardown().await.unwrap();
}

/// A Service's connection (the client dials a virtual address; the node's DNAT, as
/// kube-proxy's, sends it to a backend pod) is judged on the backend, as policy sees it:
/// denying the backend's ingress cuts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_connection_is_judged_on_its_backend_and_cut() {
    if !require_root("a_service_connection_is_judged_on_its_backend_and_cut") {
        return;
    }
    let mut sim = Sim::build(testkit::base_cluster(), sim_options()).await.unwrap();
    let _echo = Echo::start(&sim, "x/b");
    let backend = pod_ip(&sim.snapshot(), "x/b");
    // y/a and x/b are on node-2: its prerouting DNATs the virtual address to x/b.
    let vip = "198.19.255.10";
    let node = sim.node_netns("node-2").unwrap();
    let rules = format!(
        "table ip flock-test-svc {{\n chain pre {{\n  type nat hook prerouting priority dstnat; policy accept;\n  ip daddr {vip} tcp dport 8080 dnat to {backend}:{PORT}\n  ip daddr {vip} udp dport 8080 dnat to {backend}:{PORT}\n }}\n}}\n"
    );
    let mut nft = std::process::Command::new("ip")
        .args(["netns", "exec", &node, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    nft.stdin.take().unwrap().write_all(rules.as_bytes()).unwrap();
    let out = nft.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let flows: Vec<Flow> =
        [Proto::Tcp, Proto::Udp].into_iter().map(|p| Flow::start_to(&sim, p, "y/a", SocketAddr::new(vip.parse().unwrap(), 8080))).collect();
    tokio::time::sleep(Duration::from_millis(400)).await;
    sim.apply(|s| apply_yaml(s, CNP_DENY_Y_TO_X)).await.unwrap();
    let committed = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for f in flows {
        let (label, log) = f.finish();
        assert_cut(&label, &log, committed);
    }
    sim.teardown().await.unwrap();
}

/// Both ends of a cut TCP connection end at their next send, whichever sends first: each
/// gets a reset, not a retransmission into silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn both_ends_of_a_cut_tcp_connection_get_a_reset() {
    if !require_root("both_ends_of_a_cut_tcp_connection_get_a_reset") {
        return;
    }
    let mut sim = Sim::build(testkit::base_cluster(), sim_options()).await.unwrap();
    let s = sim.snapshot();
    let server_addr = SocketAddr::new(pod_ip(&s, "x/b"), PORT);
    let listener = netns::run_in(&pod_ns(&sim, "x/b"), || TcpListener::bind(server_addr)).unwrap().unwrap();
    let mut client =
        netns::run_in(&pod_ns(&sim, "y/a"), || TcpStream::connect_timeout(&server_addr, Duration::from_secs(2))).unwrap().unwrap();
    let (mut server, _) = listener.accept().unwrap();
    for s in [&client, &server] {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    }
    let mut buf = [0u8; 4];
    client.write_all(b"ping").unwrap();
    server.read_exact(&mut buf).unwrap();
    server.write_all(b"pong").unwrap();
    client.read_exact(&mut buf).unwrap();

    sim.apply(|s| apply_yaml(s, CNP_DENY_Y_TO_X)).await.unwrap();
    let committed = Instant::now();
    // The server speaks first: it is reset...
    let r = server.write_all(b"late").and_then(|()| server.read_exact(&mut buf));
    assert_eq!(r.map_err(|e| e.kind()), Err(ErrorKind::ConnectionReset), "the server end");
    // ...and so is the client when it sends.
    let r = client.write_all(b"late").and_then(|()| client.read_exact(&mut buf));
    assert_eq!(r.map_err(|e| e.kind()), Err(ErrorKind::ConnectionReset), "the client end");
    assert!(committed.elapsed() < Duration::from_secs(1), "{:?}", committed.elapsed());
    sim.teardown().await.unwrap();
}

/// Revocation across agent restarts: a flow a change revoked stays cut while every node's
/// agent is restarted (its ct mark is the kernel's, and the new agent's table stops it as the
/// old one did), and an admitted flow keeps flowing through the restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoked_connection_stays_cut_across_agent_restarts() {
    if !require_root("a_revoked_connection_stays_cut_across_agent_restarts") {
        return;
    }
    let mut sim = Sim::build(testkit::base_cluster(), sim_options()).await.unwrap();
    let _echo = Echo::start(&sim, "x/b");
    let cut = Flow::start(&sim, Proto::Udp, "y/b", "x/b");
    let kept = Flow::start(&sim, Proto::Udp, "x/a", "x/b");
    tokio::time::sleep(Duration::from_millis(400)).await;
    sim.apply(|s| apply_yaml(s, CNP_DENY_Y_TO_X)).await.unwrap();
    let committed = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for node in ["node-1", "node-2"] {
        sim.restart_agent(node).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (label, log) = cut.finish();
    assert_cut(&format!("across restarts: {label}"), &log, committed);
    let (label, log) = kept.finish();
    assert_intact(&format!("across restarts: {label}"), &log);
    sim.teardown().await.unwrap();
}
