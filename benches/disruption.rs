//! Restarts without disruption, measured like a conn-disrupt test (root: network namespaces,
//! real nft, real processes). Two nodes (network namespaces joined by a link) run real
//! `flock-agent` processes against the in-repo API server (listening on node a's address);
//! pods are attached through `flock-cni` as a container runtime would. While traffic runs,
//! node a's agent is restarted:
//!
//! - `graceful-restart`: SIGTERM, then a new process;
//! - `kill-restart`: SIGKILL, then a new process;
//! - `upgrade`: SIGTERM, the previous release's table (a fixture, ruleset format 0) in place
//!   of this one's, then a new process, which adopts it;
//! - `surge-rollout`: a new process starts while the old one runs (as a DaemonSet with
//!   `maxSurge` would), waits for the node lock, and takes over when the old one gets SIGTERM;
//! - `long-restart`: SIGKILL, and the new process only after the DNS client's timeout (an
//!   agent slow to come back: its image pulled, its node busy).
//!
//! Each node runs `flock-socket-keeper` (as deploy/ does), which holds the DNS proxy's
//! listeners across the restarts; `--no-keeper` runs without it, to show what it is for.
//!
//! The traffic: long-lived TCP streams (16 bytes each way every 10 ms; one same-node, one
//! cross-node per direction of the cluster), new TCP connections every 20 ms (connect and a
//! reply within 1 s), UDP request/response every 20 ms (an answer within 1 s), probes that
//! policy denies every 50 ms (counted if one connects), DNS through node a's proxy for a pod
//! with a domain rule every 100 ms (an answer within 1 s, or 5 s after one retry) followed by a connection
//! to the answer, and a CNI ADD of a new pod on node a issued while its agent is down (the
//! runtime's ADD must wait and succeed).
//!
//! Prints JSON: `{"scenarios": [{"name", "established", "established_broken", "new_conns",
//! "new_conn_failed", "udp_requests", "udp_unanswered", "denied_probes", "denied_admitted",
//! "dns_queries", "dns_unanswered", "cni_adds", "cni_add_failed", "cni_add_max_ms",
//! "agent_gap_ms"}]}` (`agent_gap_ms`: from the old process's end to the new one's readiness).
//!
//! `cargo bench --bench disruption [-- --runs N] [--no-keeper]` (the full scenarios, each N
//! times). Under `cargo test` (no `--bench` argument) it runs a short version of each
//! scenario and fails unless every disruption count is zero.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flock::testkit::kernel::{NetnsGuard, Node, TempDir, flock_cni_binary, require_root, serve_in, sweep, workspace_binary};
use flock_cni::netns::{self, Netns};
use flock_cni::runtime::{ConfList, Runtime, Sandbox};
use flock_test_apiserver::{ApiServer, Config};
use serde_json::{Value, json};

const NODE_A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 80);
const NODE_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 81);
const STREAM_PORT: u16 = 8080;
const CONN_PORT: u16 = 8081;
const UDP_PORT: u16 = 8082;
/// The name the DNS client resolves (to srv's address) before each connection.
const SRV_NAME: &str = "srv.bench.test";

/// How long traffic runs before and after the disruption, and how long the agent stays down.
#[derive(Clone, Copy)]
struct Timing {
    before: Duration,
    after: Duration,
    down: Duration,
    /// How long the agent stays down in `long-restart`: past the DNS client's timeout.
    long_down: Duration,
}

/// The counts of one scenario.
#[derive(Default)]
struct Counts {
    established: AtomicU64,
    established_broken: AtomicU64,
    new_conns: AtomicU64,
    new_conn_failed: AtomicU64,
    udp_requests: AtomicU64,
    udp_unanswered: AtomicU64,
    denied_probes: AtomicU64,
    denied_admitted: AtomicU64,
    dns_queries: AtomicU64,
    dns_unanswered: AtomicU64,
    /// What failed and when (since the disruption began; 0: before it), for the report.
    failed: Mutex<Vec<String>>,
    started: Mutex<Option<Instant>>,
}

impl Counts {
    fn fail(&self, counter: &AtomicU64, what: String) {
        bump(counter);
        let at = self.started.lock().unwrap().map(|t| t.elapsed().as_millis()).unwrap_or(0);
        self.failed.lock().unwrap().push(format!("{at} ms: {what}"));
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A child process (a flock-agent, a socket keeper), killed on drop.
struct Agent {
    child: Option<Child>,
}

impl Agent {
    fn signal(&mut self, sig: &str) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill").args([&format!("-{sig}"), &child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.signal("KILL");
    }
}

/// `cmd` started with its output in `log` (and FLOCK_LOG unset: its own default filter).
fn spawn_logged(mut cmd: Command, log: &Path) -> Agent {
    let log = std::fs::File::create(log).unwrap();
    let child = cmd.env_remove("FLOCK_LOG").stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log).spawn().unwrap();
    Agent { child: Some(child) }
}

struct NodeRig {
    name: &'static str,
    node: Node,
    dir: PathBuf,
    cidr: &'static str,
    /// The socket keeper's socket, which the agents hold the DNS proxy's listeners with.
    keeper: Option<PathBuf>,
}

impl NodeRig {
    fn socket(&self) -> PathBuf {
        self.dir.join("cni.sock")
    }

    fn conflist(&self) -> ConfList {
        let text = json!({
            "cniVersion": "1.0.0",
            "name": format!("flock-bench-{}", self.name),
            "plugins": [
                {"type": "loopback"},
                {
                    "type": "flock-cni",
                    "agentSocket": self.socket(),
                    "stateDir": self.dir.join("cni-state"),
                    "pendingDelDir": self.dir.join("pending-del"),
                    "agentTimeoutSeconds": 60,
                    "ipam": {"type": "host-local", "dataDir": self.dir.join("ipam"), "ranges": [[{"subnet": self.cidr}]]}
                }
            ]
        })
        .to_string();
        ConfList::parse(&text).unwrap()
    }

    fn runtime(&self) -> Runtime {
        let bin = flock_cni_binary();
        Runtime { cni_path: vec![bin.parent().unwrap().to_path_buf(), PathBuf::from("/usr/lib/cni")], netns: self.node.ns.netns() }
    }

    /// Starts this node's agent; `generation` names its log file.
    fn start_agent(&self, kubeconfig: &Path, generation: usize) -> Agent {
        let bin = workspace_binary("flock", "flock-agent");
        let d = |p: &str| self.dir.join(p).to_str().unwrap().to_string();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.node.ns.name, bin.to_str().unwrap()])
            .args(["--node-name", self.name, "--socket", &d("cni.sock"), "--pending-del-dir", &d("pending-del")])
            .args(["--state-dir", &d("state"), "--metrics-address", &format!("unix:{}", d("metrics.sock"))])
            .args(["--no-cni-conf", "--no-events", "--node-status", "false", "--log-format", "json"])
            // The DNS proxy, trusting the resolver pod.
            .args(["--dns-proxy", "true", "--dns-resolver-pods", "default/app=dns"])
            .args(["--pod-name", &format!("flock-agent-{}-{generation}", self.name)])
            .args(self.keeper.iter().flat_map(|k| [Path::new("--dns-socket-keeper"), k]))
            .env("KUBECONFIG", kubeconfig);
        spawn_logged(cmd, &self.dir.join(format!("agent-{generation}.log")))
    }

    /// Starts this node's socket keeper (as its own DaemonSet would run it).
    fn start_keeper(&mut self) -> Agent {
        let path = self.dir.join("keeper.sock");
        let mut cmd = Command::new(workspace_binary("flock", "flock-socket-keeper"));
        cmd.args(["--socket", path.to_str().unwrap(), "--log-format", "json"]);
        let keeper = spawn_logged(cmd, &self.dir.join("keeper.log"));
        wait_for("the socket keeper", Duration::from_secs(10), || path.exists());
        self.keeper = Some(path);
        keeper
    }

    fn ready(&self) -> bool {
        http_get(&self.dir.join("metrics.sock"), "/readyz").0 == 200
    }
}

fn http_get(socket: &Path, path: &str) -> (u16, String) {
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) else { return (0, String::new()) };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(s, "GET {path} HTTP/1.0\r\nHost: flock\r\n\r\n").is_err() {
        return (0, String::new());
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
    start.elapsed()
}

/// The sandbox of pod `name` (namespace default) in `ns`, as the runtime describes it.
fn sandbox(name: &str, ns: &NetnsGuard) -> Sandbox {
    Sandbox::for_pod(&format!("cid-{name}"), &format!("/run/netns/{}", ns.name), "default", name, Some(&format!("uid-{name}")))
}

/// A pod: its network namespace and address.
struct PodRig {
    ns: NetnsGuard,
    ip: IpAddr,
}

struct Cluster {
    _dir: TempDir,
    nodes: [NodeRig; 2],
    server: ApiServer,
    _api: (tokio::sync::watch::Sender<bool>, std::thread::JoinHandle<()>),
    kubeconfig: PathBuf,
    pods: Vec<PodRig>,
    added: usize,
}

fn pod_json(name: &str, node: &str, app: &str, ip: Option<IpAddr>) -> Value {
    // `app` may carry a role: `cli+dns-client`.
    let (app, role) = app.split_once('+').map_or((app, None), |(a, r)| (a, Some(r)));
    let mut labels = json!({"app": app});
    if let Some(r) = role {
        labels["role"] = json!(r);
    }
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running"}});
    if let Some(ip) = ip {
        p["status"]["podIP"] = json!(ip.to_string());
        p["status"]["podIPs"] = json!([{"ip": ip.to_string()}]);
    }
    p
}

impl Cluster {
    fn new() -> Self {
        sweep();
        let dir = TempDir::new("disrupt");
        let make = |name: &'static str, cidr: &'static str| {
            let node = Node::new(&format!("dis{name}"));
            let d = dir.join(name);
            std::fs::create_dir_all(&d).unwrap();
            NodeRig { name, node, dir: d, cidr, keeper: None }
        };
        let nodes = [make("a", "198.18.80.0/24"), make("b", "198.18.81.0/24")];
        let (a, b) = (&nodes[0].node.ns, &nodes[1].node.ns);
        a.ip(&["link", "add", "to-b", "type", "veth", "peer", "name", "to-a", "netns", &b.name]);
        for (ns, dev, own, peer, peer_cidr) in
            [(a, "to-b", NODE_A, NODE_B, "198.18.81.0/24"), (b, "to-a", NODE_B, NODE_A, "198.18.80.0/24")]
        {
            ns.ip(&["addr", "add", &format!("{own}/32"), "dev", dev]);
            ns.ip(&["link", "set", dev, "up"]);
            ns.ip(&["route", "add", &format!("{peer}/32"), "dev", dev]);
            ns.ip(&["route", "add", peer_cidr, "via", &peer.to_string(), "dev", dev]);
        }
        // The API server listens on node a's address (node b reaches it over the link).
        let (tx, rx) = std::sync::mpsc::channel();
        let api = serve_in(a.netns(), move |mut stop, ready| {
            Box::pin(async move {
                let server = ApiServer::start_tcp(SocketAddr::from((NODE_A, 0)), Config::default()).await.unwrap();
                flock_test_apiserver::load::install_crds(&server).unwrap();
                tx.send(server).unwrap();
                ready.send(()).unwrap();
                let _ = stop.changed().await;
            })
        });
        let server = rx.recv().unwrap();
        let addr = server.local_addr().unwrap();
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: http://{addr}\nusers:\n- name: t\n  user: {{}}\n\
                 contexts:\n- name: t\n  context:\n    cluster: t\n    user: t\ncurrent-context: t\n"
            ),
        )
        .unwrap();
        for (n, ip, cidr) in [("a", NODE_A, "198.18.80.0/24"), ("b", NODE_B, "198.18.81.0/24")] {
            server
                .apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n},
                    "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
                    "status": {"addresses": [{"type": "InternalIP", "address": ip.to_string()}], "conditions": [{"type": "Ready", "status": "True"}]}}))
                .unwrap();
        }
        server.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default", "labels": {"kubernetes.io/metadata.name": "default"}}})).unwrap();
        // The servers take the clients' streams, connections and datagrams; nothing else.
        server
            .apply(json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": "srv", "namespace": "default"},
                "spec": {"podSelector": {"matchLabels": {"app": "srv"}}, "policyTypes": ["Ingress"],
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "cli"}}}],
                                      "ports": [{"port": STREAM_PORT, "protocol": "TCP"}, {"port": CONN_PORT, "protocol": "TCP"}, {"port": UDP_PORT, "protocol": "UDP"}]}]}}))
            .unwrap();
        // The DNS client may ask the resolver and reach srv's name (and only that).
        server
            .apply(json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": "by-name", "namespace": "default",
                             "annotations": {"flock.dev/egress-domains": format!("[{{\"name\": \"{SRV_NAME}\", \"ports\": [{{\"protocol\": \"TCP\", \"port\": {CONN_PORT}}}]}}]")}},
                "spec": {"podSelector": {"matchLabels": {"role": "dns-client"}}, "policyTypes": ["Egress"],
                         "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "dns"}}}],
                                     "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}]}}))
            .unwrap();
        Self { _dir: dir, nodes, server, _api: api, kubeconfig, pods: Vec::new(), added: 0 }
    }

    /// A pod through the runtime: the object first (the agent waits for it), then CNI ADD,
    /// then its address in the object's status (as kubelet reports it). How long the ADD took.
    fn add_pod(&mut self, name: &str, node: usize, app: &str) -> Result<Duration, String> {
        let n = &self.nodes[node];
        let ns = NetnsGuard::new(&format!("p{name}"));
        self.server.apply(pod_json(name, n.name, app, None)).unwrap();
        let sandbox = sandbox(name, &ns);
        let started = Instant::now();
        let result = n.runtime().add(&n.conflist(), &sandbox).map_err(|e| format!("CNI ADD of {name}: {e}"))?;
        let took = started.elapsed();
        // The loopback plugin's address comes first.
        let ip: IpAddr = result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["address"].as_str()?.split('/').next()?.parse::<IpAddr>().ok())
            .find(|a| !a.is_loopback())
            .unwrap();
        self.server.apply(pod_json(name, n.name, app, Some(ip))).unwrap();
        self.pods.push(PodRig { ns, ip });
        Ok(took)
    }

    fn pod(&self, i: usize) -> (Netns, IpAddr) {
        (self.pods[i].ns.netns(), self.pods[i].ip)
    }
}

/// Runs `f` on a thread of its own inside `ns`.
fn spawn_in(ns: Netns, f: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || netns::run_in(&ns, f).unwrap())
}

/// The servers of the `srv` pod, until `stop`.
fn servers(ns: Netns, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<()>> {
    // Bound in the pod's namespace before any client starts (a socket stays in the namespace
    // it was made in; the threads serving them need not enter it).
    let (echo_l, hello_l, udp_s) = netns::run_in(&ns, || {
        (
            TcpListener::bind(("0.0.0.0", STREAM_PORT)).unwrap(),
            TcpListener::bind(("0.0.0.0", CONN_PORT)).unwrap(),
            UdpSocket::bind(("0.0.0.0", UDP_PORT)).unwrap(),
        )
    })
    .unwrap();
    let s1 = stop.clone();
    let echo = std::thread::spawn(move || {
        let l = echo_l;
        l.set_nonblocking(true).unwrap();
        while !s1.load(Ordering::Relaxed) {
            match l.accept() {
                Ok((mut c, _)) => {
                    c.set_nonblocking(false).unwrap();
                    let stop = s1.clone();
                    std::thread::spawn(move || {
                        let _ = c.set_read_timeout(Some(Duration::from_millis(200)));
                        let mut buf = [0u8; 64];
                        while !stop.load(Ordering::Relaxed) {
                            match c.read(&mut buf) {
                                Ok(0) => return,
                                Ok(n) => {
                                    if c.write_all(&buf[..n]).is_err() {
                                        return;
                                    }
                                }
                                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                                Err(_) => return,
                            }
                        }
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    });
    let s2 = stop.clone();
    let hello = std::thread::spawn(move || {
        let l = hello_l;
        l.set_nonblocking(true).unwrap();
        while !s2.load(Ordering::Relaxed) {
            match l.accept() {
                Ok((mut c, _)) => {
                    let _ = c.set_nonblocking(false);
                    let _ = c.write_all(b"y");
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    });
    let udp = std::thread::spawn(move || {
        let s = udp_s;
        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let mut buf = [0u8; 64];
        while !stop.load(Ordering::Relaxed) {
            if let Ok((n, from)) = s.recv_from(&mut buf) {
                let _ = s.send_to(&buf[..n], from);
            }
        }
    });
    vec![echo, hello, udp]
}

/// One long-lived stream from a client pod, until `stop`.
fn stream(ns: Netns, to: IpAddr, stop: Arc<AtomicBool>, counts: Arc<Counts>) -> std::thread::JoinHandle<()> {
    spawn_in(ns, move || {
        let Ok(mut c) = TcpStream::connect_timeout(&SocketAddr::new(to, STREAM_PORT), Duration::from_secs(2)) else {
            bump(&counts.established_broken);
            return;
        };
        bump(&counts.established);
        c.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let msg = [7u8; 16];
        let mut back = [0u8; 16];
        while !stop.load(Ordering::Relaxed) {
            if let Err(e) = c.write_all(&msg).and_then(|()| c.read_exact(&mut back)) {
                counts.fail(&counts.established_broken, format!("stream to {to}: {e}"));
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    })
}

/// New connections every 20 ms, each answered within 1 s.
fn new_conns(ns: Netns, to: IpAddr, stop: Arc<AtomicBool>, counts: Arc<Counts>) -> std::thread::JoinHandle<()> {
    spawn_in(ns, move || {
        while !stop.load(Ordering::Relaxed) {
            bump(&counts.new_conns);
            let began = counts.started.lock().unwrap().map(|t| t.elapsed().as_millis());
            let ok = TcpStream::connect_timeout(&SocketAddr::new(to, CONN_PORT), Duration::from_secs(1)).is_ok_and(|mut c| {
                let mut b = [0u8; 1];
                c.set_read_timeout(Some(Duration::from_secs(1))).is_ok() && c.read_exact(&mut b).is_ok()
            });
            if !ok {
                counts.fail(&counts.new_conn_failed, format!("new connection to {to} begun at {} ms", began.unwrap_or(0)));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

/// A UDP request every 20 ms, answered within 1 s.
fn udp(ns: Netns, to: IpAddr, stop: Arc<AtomicBool>, counts: Arc<Counts>) -> std::thread::JoinHandle<()> {
    spawn_in(ns, move || {
        let s = UdpSocket::bind(("0.0.0.0", 0)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut n: u64 = 0;
        let mut buf = [0u8; 16];
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            bump(&counts.udp_requests);
            let _ = s.send_to(&n.to_be_bytes(), SocketAddr::new(to, UDP_PORT));
            // Late answers to earlier requests are skipped.
            let deadline = Instant::now() + Duration::from_secs(1);
            let answered = loop {
                match s.recv(&mut buf) {
                    Ok(8) if buf[..8] == n.to_be_bytes() => break true,
                    Ok(_) if Instant::now() < deadline => {}
                    _ => break false,
                }
            };
            if !answered {
                counts.fail(&counts.udp_unanswered, format!("UDP request {n} to {to}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

/// The A query for `name`, id `id`.
fn dns_query(name: &str, id: u16) -> Vec<u8> {
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RecordType};
    let mut q = Message::new();
    q.set_id(id);
    q.set_recursion_desired(true);
    q.add_query(Query::query(Name::from_ascii(format!("{name}.")).unwrap(), RecordType::A));
    q.to_vec().unwrap()
}

/// The first A record of an answer to query `id`.
fn dns_answer(buf: &[u8], id: u16) -> Option<IpAddr> {
    let m = hickory_proto::op::Message::from_vec(buf).ok()?;
    if m.id() != id {
        return None;
    }
    m.answers().iter().find_map(|r| match r.data() {
        hickory_proto::rr::RData::A(a) => Some(IpAddr::V4(a.0)),
        _ => None,
    })
}

/// Every 100 ms: resolve srv's name at the resolver (an answer within 1 s, or within 5 s of
/// one retry, as glibc's resolver waits by default), then connect to the answer (within
/// 1 s). The retry's wait is a resolver's, not a bound on the agent's start: a query the
/// keeper held while the agent was down is answered once it is back, however slow its
/// node; a query lost is never answered.
fn dns_client(ns: Netns, resolver: IpAddr, stop: Arc<AtomicBool>, counts: Arc<Counts>) -> std::thread::JoinHandle<()> {
    spawn_in(ns, move || {
        let s = UdpSocket::bind(("0.0.0.0", 0)).unwrap();
        s.connect((resolver, 53)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let mut id: u16 = 0;
        let mut buf = [0u8; 512];
        while !stop.load(Ordering::Relaxed) {
            bump(&counts.dns_queries);
            let mut answer = None;
            'tries: for wait in [Duration::from_secs(1), Duration::from_secs(5)] {
                id = id.wrapping_add(1);
                let _ = s.send(&dns_query(SRV_NAME, id));
                let deadline = Instant::now() + wait;
                while Instant::now() < deadline {
                    if let Ok(n) = s.recv(&mut buf)
                        && let Some(a) = dns_answer(&buf[..n], id)
                    {
                        answer = Some(a);
                        break 'tries;
                    }
                }
            }
            let Some(addr) = answer else {
                counts.fail(&counts.dns_unanswered, format!("DNS query for {SRV_NAME} (twice)"));
                continue;
            };
            bump(&counts.new_conns);
            let ok = TcpStream::connect_timeout(&SocketAddr::new(addr, CONN_PORT), Duration::from_secs(1)).is_ok_and(|mut c| {
                let mut b = [0u8; 1];
                c.set_read_timeout(Some(Duration::from_secs(1))).is_ok() && c.read_exact(&mut b).is_ok()
            });
            if !ok {
                counts.fail(&counts.new_conn_failed, format!("connection to {addr}, resolved"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// Connections policy denies, every 50 ms.
fn denied(ns: Netns, to: IpAddr, stop: Arc<AtomicBool>, counts: Arc<Counts>) -> std::thread::JoinHandle<()> {
    spawn_in(ns, move || {
        while !stop.load(Ordering::Relaxed) {
            bump(&counts.denied_probes);
            if TcpStream::connect_timeout(&SocketAddr::new(to, CONN_PORT), Duration::from_millis(200)).is_ok() {
                counts.fail(&counts.denied_admitted, format!("denied connection to {to} admitted"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
}

/// Tries a connection until one succeeds (the peers' addresses reach the other node).
fn connects(ns: &Netns, to: IpAddr, port: u16) -> bool {
    netns::run_in(ns, || TcpStream::connect_timeout(&SocketAddr::new(to, port), Duration::from_millis(300)).is_ok()).unwrap()
}

/// One scenario on `cluster`: traffic, node a's agent stopped with `signal` and started again.
fn scenario(cluster: &mut Cluster, agents: &mut [Agent; 2], generation: &mut usize, name: &str, signal: &str, t: Timing) -> Value {
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    // Pods: 0 srv (a), 1 cli (a), 2 cli (b), 3 bad (b).
    let (srv_ns, srv) = cluster.pod(0);
    // The servers stop after the clients (a server gone first would refuse their last tries).
    let servers_stop = Arc::new(AtomicBool::new(false));
    let server_threads = servers(srv_ns.clone(), servers_stop.clone());
    let mut threads = Vec::new();
    for client in [1, 2] {
        let (ns, _) = cluster.pod(client);
        let start = Instant::now();
        while !connects(&ns, srv, CONN_PORT) {
            if start.elapsed() > Duration::from_secs(20) {
                let dump = |n: &NodeRig| {
                    let rules = n.node.ns.try_exec(&["nft", "list", "ruleset"]);
                    let log = std::fs::read_to_string(n.dir.join(format!("agent-{generation}.log"))).unwrap_or_default();
                    format!("== {}: ruleset\n{}\n== log\n{}", n.name, String::from_utf8_lossy(&rules.stdout), log)
                };
                panic!("pod {client} cannot connect to srv {srv}\n{}\n{}", dump(&cluster.nodes[0]), dump(&cluster.nodes[1]));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        threads.push(stream(ns.clone(), srv, stop.clone(), counts.clone()));
        threads.push(new_conns(ns.clone(), srv, stop.clone(), counts.clone()));
        threads.push(udp(ns, srv, stop.clone(), counts.clone()));
    }
    let (bad_ns, _) = cluster.pod(3);
    threads.push(denied(bad_ns, srv, stop.clone(), counts.clone()));
    // Pods 4 dns (b), 5 dns-cli (a): the client's DNS goes through node a's proxy.
    let (_, resolver) = cluster.pod(4);
    let (dns_ns, _) = cluster.pod(5);
    threads.push(dns_client(dns_ns, resolver, stop.clone(), counts.clone()));
    std::thread::sleep(t.before);
    *counts.started.lock().unwrap() = Some(Instant::now());

    // A surge rollout: the new agent starts beside the old one, waits for the node, and takes
    // over when the old one is told to stop.
    let mut successor = None;
    if signal == "SURGE" {
        *generation += 1;
        successor = Some(cluster.nodes[0].start_agent(&cluster.kubeconfig, *generation));
        std::thread::sleep(t.down);
        assert!(cluster.nodes[0].ready(), "{name}: the old agent stopped serving while the new one waited");
    }
    let status = agents[0].signal(match signal {
        "SURGE" | "UPGRADE" => "TERM",
        other => other,
    });
    let down_at = Instant::now();
    assert!(status.is_some(), "{name}: the agent did not stop");
    if signal == "UPGRADE" {
        // The previous release's table, as it wrote it, in place of this one's (one
        // transaction): the new agent starts on it.
        let (ns, fixture) = (&cluster.nodes[0].node.ns, fixture_path());
        // What the old agent learned from DNS stays, as in a real upgrade (the fixture's
        // timed sets are empty).
        let learned = learned_elements(ns);
        assert!(!learned.is_empty(), "{name}: nothing learned from DNS before the upgrade");
        let text = format!("delete table inet flock\n{}\n{}", std::fs::read_to_string(&fixture).unwrap(), learned.join("\n"));
        let script = cluster.nodes[0].dir.join("previous.nft");
        std::fs::write(&script, text).unwrap();
        let out = ns.try_exec(&["nft", "-f", script.to_str().unwrap()]);
        assert!(out.status.success(), "{name}: loading {}: {}", fixture.display(), String::from_utf8_lossy(&out.stderr));
        let listed = String::from_utf8_lossy(&ns.exec(&["nft", "list", "table", "inet", "flock"]).stdout).to_string();
        assert_eq!(flock::render::table_format(&listed), Some(0), "{name}: the fixture is not a format-0 table");
    }
    // A pod created while the agent is down: the runtime's ADD waits for the new agent.
    cluster.added += 1;
    let new_pod = format!("new{}", cluster.added);
    let add = {
        let server = cluster.server.clone();
        let n = &cluster.nodes[0];
        let (runtime, conf) = (n.runtime(), n.conflist());
        let ns = NetnsGuard::new(&format!("p{new_pod}"));
        server.apply(pod_json(&new_pod, "a", "cli", None)).unwrap();
        let sandbox = sandbox(&new_pod, &ns);
        let result = Arc::new(Mutex::new(None));
        let out = result.clone();
        let handle = std::thread::spawn(move || {
            let started = Instant::now();
            let r = runtime.add(&conf, &sandbox).map(|_| started.elapsed()).map_err(|e| e.to_string());
            *out.lock().unwrap() = Some(r);
        });
        (handle, result, ns)
    };
    agents[0] = match successor {
        Some(a) => a,
        None => {
            std::thread::sleep(t.down);
            *generation += 1;
            cluster.nodes[0].start_agent(&cluster.kubeconfig, *generation)
        }
    };
    wait_for("the new agent's readiness", Duration::from_secs(30), || cluster.nodes[0].ready());
    let gap = down_at.elapsed();
    if signal == "UPGRADE" {
        assert!(!learned_elements(&cluster.nodes[0].node.ns).is_empty(), "{name}: the learned addresses did not survive the upgrade");
    }
    // The mechanism each scenario is about was exercised, as the new agent's log says.
    let log = std::fs::read_to_string(cluster.nodes[0].dir.join(format!("agent-{generation}.log"))).unwrap_or_default();
    match signal {
        "UPGRADE" => {
            assert!(log.contains("another flock-agent version wrote"), "{name}: the new agent did not adopt the old table:\n{log}")
        }
        "SURGE" => assert!(log.contains("holds this node's lock") && log.contains("takes over"), "{name}: no handover:\n{log}"),
        _ => {}
    }
    if cluster.nodes[0].keeper.is_some() {
        assert!(log.contains("took over the listeners"), "{name}: the DNS listeners were not taken from the socket keeper:\n{log}");
    }
    std::thread::sleep(t.after);
    stop.store(true, Ordering::Relaxed);
    for th in threads {
        th.join().unwrap();
    }
    servers_stop.store(true, Ordering::Relaxed);
    for th in server_threads {
        th.join().unwrap();
    }
    let (handle, result, ns) = add;
    handle.join().unwrap();
    let added = result.lock().unwrap().take().unwrap();
    // The pod stays (its sandbox is this run's); its netns goes with the guard.
    drop(ns);
    let (add_ms, add_failed) = match &added {
        Ok(d) => (d.as_secs_f64() * 1000.0, 0),
        Err(e) => {
            eprintln!("{name}: {e}");
            (0.0, 1)
        }
    };
    if !counts.failed.lock().unwrap().is_empty() {
        // What the agents said about it: revocations, warnings, errors.
        for n in &cluster.nodes {
            for g in generation.saturating_sub(1)..=*generation {
                let log = std::fs::read_to_string(n.dir.join(format!("agent-{g}.log"))).unwrap_or_default();
                for line in log.lines().filter(|l| l.contains("revok") || l.contains("\"WARN\"") || l.contains("\"ERROR\"")) {
                    eprintln!("{name}: node {} agent {g}: {line}", n.name);
                }
            }
        }
    }
    let c = |x: &AtomicU64| x.load(Ordering::Relaxed);
    json!({
        "name": name,
        "established": c(&counts.established),
        "established_broken": c(&counts.established_broken),
        "new_conns": c(&counts.new_conns),
        "new_conn_failed": c(&counts.new_conn_failed),
        "udp_requests": c(&counts.udp_requests),
        "udp_unanswered": c(&counts.udp_unanswered),
        "denied_probes": c(&counts.denied_probes),
        "denied_admitted": c(&counts.denied_admitted),
        "dns_queries": c(&counts.dns_queries),
        "dns_unanswered": c(&counts.dns_unanswered),
        "cni_adds": 1,
        "cni_add_failed": add_failed,
        "cni_add_max_ms": (add_ms * 10.0).round() / 10.0,
        "agent_gap_ms": (gap.as_secs_f64() * 10_000.0).round() / 10.0,
        "failures": counts.failed.lock().unwrap().clone(),
    })
}

/// The table a previous release (ruleset format 0) wrote on node a for this cluster's first
/// pods: the `upgrade` scenario's starting point. `FLOCK_BLESS=1` captured it from format 0's
/// agent; it is kept as it is when the format changes.
fn fixture_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/fixtures/format-0-node-a.nft")
}

/// The elements of the table's timed sets (what DNS taught), as `add element` commands with
/// the time each has left.
fn learned_elements(ns: &NetnsGuard) -> Vec<String> {
    let out = ns.exec(&["nft", "-j", "list", "table", "inet", "flock"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut cmds = Vec::new();
    for o in v["nftables"].as_array().into_iter().flatten() {
        let set = &o["set"];
        if !set["flags"].as_array().is_some_and(|f| f.iter().any(|x| x == "timeout")) {
            continue;
        }
        for e in set["elem"].as_array().into_iter().flatten() {
            let (Some(addr), Some(left)) = (e["elem"]["val"].as_str(), e["elem"]["expires"].as_u64()) else { continue };
            cmds.push(format!("add element inet flock {} {{ {addr} timeout {}s }}", set["name"].as_str().unwrap(), left.max(1)));
        }
    }
    cmds
}

/// Writes the fixture from node a's table now, as format 0 named it (`FLOCK_BLESS=1`).
fn bless_fixture(cluster: &Cluster) {
    let listed = String::from_utf8_lossy(&cluster.nodes[0].node.ns.exec(&["nft", "list", "table", "inet", "flock"]).stdout).to_string();
    let current = format!("flock ruleset format {}: ", flock::render::RULESET_FORMAT);
    let text = listed.replace(&current, "flock: ");
    std::fs::create_dir_all(fixture_path().parent().unwrap()).unwrap();
    std::fs::write(fixture_path(), text).unwrap();
}

/// The failures of a scenario's counts (what must be zero).
fn failures(s: &Value) -> Vec<String> {
    ["established_broken", "new_conn_failed", "udp_unanswered", "denied_admitted", "dns_unanswered", "cni_add_failed"]
        .iter()
        .filter(|k| s[**k].as_u64() != Some(0))
        .map(|k| format!("{} {k}={}", s["name"], s[*k]))
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bench = args.iter().any(|a| a == "--bench");
    if !require_root("disruption") {
        return;
    }
    let runs = args.iter().position(|a| a == "--runs").and_then(|i| args.get(i + 1)?.parse().ok()).unwrap_or(1usize);
    let timing = if bench {
        Timing {
            before: Duration::from_secs(3),
            after: Duration::from_secs(3),
            down: Duration::from_millis(500),
            long_down: Duration::from_millis(1200),
        }
    } else {
        Timing {
            before: Duration::from_millis(800),
            after: Duration::from_millis(800),
            down: Duration::from_millis(300),
            long_down: Duration::from_millis(1200),
        }
    };
    let mut cluster = Cluster::new();
    // `--no-keeper`: the agents hold the DNS proxy's listeners alone (to see what the keeper
    // is for: DNS of the agent's down time is lost).
    let _keepers: Vec<Agent> =
        if args.iter().any(|a| a == "--no-keeper") { Vec::new() } else { cluster.nodes.iter_mut().map(NodeRig::start_keeper).collect() };
    let mut generation = 0;
    let mut agents = [cluster.nodes[0].start_agent(&cluster.kubeconfig, 0), cluster.nodes[1].start_agent(&cluster.kubeconfig, 0)];
    for n in &cluster.nodes {
        wait_for("the agents' readiness", Duration::from_secs(30), || n.ready());
    }
    for (name, node, app) in [
        ("srv", 0, "srv"),
        ("cli-a", 0, "cli"),
        ("cli-b", 1, "cli"),
        ("bad-b", 1, "bad"),
        ("dns", 1, "dns"),
        ("dns-cli", 0, "cli+dns-client"),
    ] {
        cluster.add_pod(name, node, app).unwrap();
    }
    // The resolver pod serves srv's name.
    let (dns_ns, dns_ip) = cluster.pod(4);
    let zone = flock::sim::dns::Zone::new(vec![flock::sim::dns::Record {
        name: SRV_NAME.into(),
        ttl: 300,
        data: flock::sim::dns::RecordData::Address(cluster.pods[0].ip),
    }]);
    let _dns = flock::testkit::kernel::serve_dns(dns_ns, vec![dns_ip], zone);
    if std::env::var_os("FLOCK_BLESS").is_some_and(|v| v == "1") {
        wait_for("node a's table", Duration::from_secs(10), || {
            cluster.nodes[0].node.ns.try_exec(&["nft", "list", "table", "inet", "flock"]).status.success()
        });
        bless_fixture(&cluster);
    }
    let mut scenarios = Vec::new();
    for _ in 0..runs {
        for (name, signal) in [
            ("upgrade", "UPGRADE"),
            ("graceful-restart", "TERM"),
            ("kill-restart", "KILL"),
            ("surge-rollout", "SURGE"),
            ("long-restart", "KILL"),
        ] {
            let t = if name == "long-restart" { Timing { down: timing.long_down, ..timing } } else { timing };
            scenarios.push(scenario(&mut cluster, &mut agents, &mut generation, name, signal, t));
        }
    }
    let out = json!({"scenarios": scenarios});
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
    let bad: Vec<String> = scenarios.iter().flat_map(failures).collect();
    if !bench {
        assert!(bad.is_empty(), "disruption: {bad:?}\n{out:#}");
    } else if !bad.is_empty() {
        eprintln!("disruption: not zero: {bad:?}");
    }
}
