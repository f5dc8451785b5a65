//! The DNS proxy under attack, on the real kernel (root only), with the table flock renders:
//! a pod with a domain rule, its resolver and an attacker pod on one node, an "outside"
//! namespace behind the node's uplink (another node, the internet). Each test replays an
//! attack of issue "The DNS proxy under attack" and checks it fails: forged answers teach
//! nothing (from the pod, from another pod, from off the node, with every id), nothing the
//! steering did not deliver reaches the proxy (no self-queries), the resolver's own policy
//! judges the pod's queries, floods hold a bounded number of sockets, and a flood kept in the
//! socket keeper's listeners while no proxy runs is drained by the next within its bounds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flock::apply::Applier;
use flock::apply::kernel::NftCli;
use flock::dns_proxy::domain_rules;
use flock::dns_proxy::learner::{DomainLearner, KernelWriter};
use flock::dns_proxy::proxy::{Bounds, DnsProxy, ProxyConfig, ProxyStats, RefusedBy};
use flock::model::{LocalEndpoint, Snapshot};
use flock::netns::{self, Netns};
use flock::render::{self, DnsSteer, RenderOptions};
use flock::testkit::kernel::{NetnsGuard, Node, Pod, require_root, serve_dns_proxy, serve_in};
use flock::translate::{NodePolicy, Options, ResolverPods, translate};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};

const PORT: u16 = 15355;
const NAME: &str = "allowed.example.test";

/// One family's addresses for the test cluster.
struct Family {
    client: &'static str,
    attacker: &'static str,
    resolver: &'static str,
    /// The node's address towards the outside, and the outside namespace's.
    node: &'static str,
    outside: &'static str,
    /// What the resolver answers for the allowed name, and what forgeries point it to (the
    /// client's policy denies it).
    good: &'static str,
    denied: &'static str,
    prefix: u8,
}

const V4: Family = Family {
    client: "198.18.230.2",
    attacker: "198.18.230.9",
    resolver: "198.18.231.53",
    node: "198.18.232.1",
    outside: "198.18.232.2",
    good: "198.18.233.80",
    denied: "198.18.233.66",
    prefix: 32,
};

const V6: Family = Family {
    client: "2001:db8:230::2",
    attacker: "2001:db8:230::9",
    resolver: "2001:db8:231::53",
    node: "2001:db8:232::1",
    outside: "2001:db8:232::2",
    good: "2001:db8:233::80",
    denied: "2001:db8:233::66",
    prefix: 128,
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The cluster's manifests: the client (a domain rule for [`NAME`] on TCP 80, DNS to the
/// resolver), the attacker (no policy), the resolver (the cluster DNS), dual-stack; and, with
/// `resolver_policy`, a NetworkPolicy admitting into the resolver only kube-system.
fn manifests(resolver_policy: bool, steer_attacker: bool) -> String {
    let mut m = format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: apps, labels: {{ns: apps}}}}
---
apiVersion: v1
kind: Namespace
metadata: {{name: kube-system, labels: {{ns: kube-system}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: apps, uid: u-client, labels: {{app: client}}}}
spec: {{nodeName: n1}}
status: {{phase: Running, podIPs: [{{ip: "{c4}"}}, {{ip: "{c6}"}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: attacker, namespace: apps, uid: u-attacker, labels: {{app: attacker}}}}
spec: {{nodeName: n1}}
status: {{phase: Running, podIPs: [{{ip: "{a4}"}}, {{ip: "{a6}"}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: coredns, namespace: kube-system, uid: u-coredns, labels: {{k8s-app: kube-dns}}}}
spec: {{nodeName: n1}}
status: {{phase: Running, podIPs: [{{ip: "{r4}"}}, {{ip: "{r6}"}}]}}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {{name: by-name}}
spec:
  tier: Admin
  priority: 10
  subject: {{pods: {{namespaceSelector: {{matchLabels: {{ns: apps}}}}, podSelector: {{matchLabels: {{app: client}}}}}}}}
  egress:
    - {{action: Accept, to: [{{domainNames: ['{NAME}']}}], protocols: [{{tcp: {{destinationPort: {{number: 80}}}}}}]}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: client-dns, namespace: apps}}
spec:
  podSelector: {{matchLabels: {{app: client}}}}
  policyTypes: [Egress]
  egress:
    - to: [{{ipBlock: {{cidr: "{r4}/32"}}}}, {{ipBlock: {{cidr: "{r6}/128"}}}}]
      ports: [{{protocol: UDP, port: 53}}, {{protocol: TCP, port: 53}}]
"#,
        c4 = V4.client,
        c6 = V6.client,
        a4 = V4.attacker,
        a6 = V6.attacker,
        r4 = V4.resolver,
        r6 = V6.resolver,
    );
    if steer_attacker {
        // The attacker has a domain rule too: its DNS goes through the proxy.
        m.push_str(&format!(
            r#"---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {{name: attacker-by-name}}
spec:
  tier: Admin
  priority: 11
  subject: {{pods: {{namespaceSelector: {{matchLabels: {{ns: apps}}}}, podSelector: {{matchLabels: {{app: attacker}}}}}}}}
  egress:
    - {{action: Accept, to: [{{domainNames: ['{NAME}']}}], protocols: [{{tcp: {{destinationPort: {{number: 80}}}}}}]}}
"#
        ));
    }
    if resolver_policy {
        m.push_str(
            r#"---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: dns-from-kube-system-only, namespace: kube-system}
spec:
  podSelector: {matchLabels: {k8s-app: kube-dns}}
  policyTypes: [Ingress]
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: kube-system}}}]}]
"#,
        );
    }
    m
}

/// What the resolver saw and how it answers: `A`/`AAAA` for [`NAME`] at once with the good
/// address; a TXT question after `slow` (a cache miss: time for forgeries), answered with an
/// A record of the denied address slipped in (which no TXT question may teach); nothing for
/// names it does not know (a silent resolver).
#[derive(Default)]
struct Seen {
    clients: Vec<SocketAddr>,
}

fn answer(q: &Message, records: Vec<Record>) -> Vec<u8> {
    let mut r = Message::new();
    r.set_id(q.id()).set_message_type(MessageType::Response).set_op_code(OpCode::Query).set_response_code(ResponseCode::NoError);
    r.set_recursion_desired(q.recursion_desired()).set_recursion_available(true);
    r.add_queries(q.queries().to_vec());
    r.add_answers(records);
    r.to_vec().unwrap()
}

fn address(s: &str) -> RData {
    match ip(s) {
        IpAddr::V4(a) => RData::A(A(a)),
        IpAddr::V6(a) => RData::AAAA(AAAA(a)),
    }
}

/// The resolver on port 53 (UDP) of each of `ips` in `ns`.
fn resolver(
    ns: Netns,
    ips: Vec<IpAddr>,
    slow: Duration,
    seen: Arc<Mutex<Seen>>,
) -> (tokio::sync::watch::Sender<bool>, std::thread::JoinHandle<()>) {
    serve_in(ns, move |mut stop, ready| {
        Box::pin(async move {
            let mut socks = Vec::new();
            for ip in ips {
                socks.push(Arc::new(tokio::net::UdpSocket::bind((ip, 53)).await.unwrap()));
            }
            let _ = ready.send(());
            let mut tasks = tokio::task::JoinSet::new();
            for sock in socks {
                let seen = seen.clone();
                let mut stop = stop.clone();
                tasks.spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    loop {
                        let (n, from) = tokio::select! {
                            r = sock.recv_from(&mut buf) => r.unwrap(),
                            _ = stop.wait_for(|s| *s) => return,
                        };
                        seen.lock().unwrap().clients.push(from);
                        let Ok(q) = Message::from_vec(&buf[..n]) else { continue };
                        let Some(question) = q.queries().first().cloned() else { continue };
                        let owner = question.name().clone();
                        if !owner.to_ascii().eq_ignore_ascii_case(&format!("{NAME}.")) {
                            continue;
                        }
                        let fam = if from.is_ipv4() { &V4 } else { &V6 };
                        let sock = sock.clone();
                        tokio::spawn(async move {
                            let bytes = match question.query_type() {
                                RecordType::A | RecordType::AAAA => answer(&q, vec![Record::from_rdata(owner, 60, address(fam.good))]),
                                _ => {
                                    tokio::time::sleep(slow).await;
                                    answer(
                                        &q,
                                        vec![
                                            Record::from_rdata(owner.clone(), 60, RData::TXT(TXT::new(vec!["v=1".into()]))),
                                            Record::from_rdata(owner, 3600, address(fam.denied)),
                                        ],
                                    )
                                }
                            };
                            let _ = sock.send_to(&bytes, from).await;
                        });
                    }
                });
            }
            let _ = stop.wait_for(|s| *s).await;
            tasks.shutdown().await;
        })
    })
}

/// The node with the three pods wired as flock-cni wires them, an outside namespace on its
/// uplink, flock's rendered table applied, policy routing for marked DNS.
struct Cluster {
    node: Node,
    client: Pod,
    attacker: Pod,
    resolver: Pod,
    outside: NetnsGuard,
    np: NodePolicy,
}

fn cluster(tag: &str, resolver_policy: bool) -> Cluster {
    cluster_with(tag, resolver_policy, false)
}

/// [`cluster`], where the attacker's DNS also goes through the proxy (`steer_attacker`).
fn cluster_with(tag: &str, resolver_policy: bool, steer_attacker: bool) -> Cluster {
    let node = Node::new(&format!("{tag}n"));
    let s: Snapshot = flock::testkit::parse_manifests(&manifests(resolver_policy, steer_attacker)).to_snapshot();
    let pod = |ns: &str, name: &str| s.pod_by_name(&flock::model::ObjectRef::new(ns, name)).unwrap().clone();
    let (client, attacker, coredns) = (pod("apps", "client"), pod("apps", "attacker"), pod("kube-system", "coredns"));
    let wire = |p: &flock::model::Pod, t: &str| node.add_pod(&format!("{tag}{t}"), &LocalEndpoint::for_pod(p).interface, &p.ips);
    let (pc, pa, pr) = (wire(&client, "c"), wire(&attacker, "a"), wire(&coredns, "r"));
    // The outside: a namespace behind a second uplink, holding the "good" and "denied"
    // addresses (servers on port 80) and sending forgeries.
    let outside = NetnsGuard::new(&format!("{tag}o"));
    flock::testkit::kernel::run(&[
        "ip",
        "-n",
        &node.ns.name,
        "link",
        "add",
        "ext0",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &outside.name,
    ]);
    node.ns.ip(&["link", "set", "ext0", "up"]);
    outside.ip(&["link", "set", "eth0", "up"]);
    outside.ip(&["link", "set", "lo", "up"]);
    for fam in [&V4, &V6] {
        let f = if fam.prefix == 32 { "-4" } else { "-6" };
        node.ns.ip(&[f, "addr", "add", &format!("{}/{}", fam.node, fam.prefix), "dev", "ext0", "nodad"]);
        for a in [fam.outside, fam.good, fam.denied] {
            outside.ip(&[f, "addr", "add", &format!("{a}/{}", fam.prefix), "dev", "eth0", "nodad"]);
            node.ns.ip(&[f, "route", "add", &format!("{a}/{}", fam.prefix), "dev", "ext0"]);
        }
        outside.ip(&[f, "route", "add", &format!("{}/{}", fam.node, fam.prefix), "dev", "eth0"]);
        for a in [fam.client, fam.attacker, fam.resolver] {
            outside.ip(&[f, "route", "add", &format!("{a}/{}", fam.prefix), "via", fam.node, "dev", "eth0"]);
        }
    }
    let endpoints: Vec<LocalEndpoint> = [&client, &attacker, &coredns].iter().map(|p| LocalEndpoint::for_pod(p)).collect();
    let options = Options { dns_resolvers: Some(ResolverPods::cluster_dns()), ..Options::default() };
    let np = translate(&s, &endpoints, &options);
    assert!(np.problems.is_empty(), "{:?}", np.problems);
    assert_eq!(np.dns_resolvers.len(), 2, "the resolver pod is trusted");
    let rs =
        render::render_with(&np, &RenderOptions { dns: Some(DnsSteer::new(PORT, render::DNS_MARK, Vec::new())), ..RenderOptions::DEFAULT });
    Applier::new(NftCli::new(node.ns.netns())).apply(&rs).unwrap();
    for f in ["-4", "-6"] {
        node.ns.ip(&[f, "rule", "add", "fwmark", "0x80/0x80", "lookup", "181"]);
    }
    node.ns.ip(&["-4", "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "181"]);
    node.ns.ip(&["-6", "route", "add", "local", "::/0", "dev", "lo", "table", "181"]);
    Cluster { node, client: pc, attacker: pa, resolver: pr, outside, np }
}

impl Cluster {
    /// The proxy as the agent runs it, with `bounds`.
    fn proxy(
        &self,
        bounds: Bounds,
    ) -> (Arc<ProxyStats>, Arc<DomainLearner<KernelWriter>>, tokio::sync::watch::Sender<bool>, std::thread::JoinHandle<()>) {
        let learner = Arc::new(DomainLearner::new(KernelWriter::default()));
        learner.set_rules(domain_rules(&self.np));
        let mut config = ProxyConfig::new(PORT, self.np.dns_resolvers.clone());
        config.bounds = bounds;
        let proxy = DnsProxy::new(config, learner.clone());
        let stats = proxy.stats();
        let (stop, thread) = serve_dns_proxy(self.node.ns.netns(), proxy);
        (stats, learner, stop, thread)
    }

    /// What the domain rule's timed set of `fam` learned.
    fn learned(&self, fam: &Family) -> Vec<IpAddr> {
        let def = render::domain_uses(&self.np).keys().next().copied().cloned().unwrap();
        let set = render::domain_set_name(&def, fam.prefix == 128);
        netns::run_in(&self.node.ns.netns(), move || flock::apply::netlink::NfSocket::open().unwrap().dump_timed(&set).unwrap())
            .unwrap()
            .into_iter()
            .map(|e| e.addr)
            .collect()
    }

    /// The packets a rule of chain `chain` whose text contains `needle` counted.
    fn counted(&self, chain: &str, needle: &str) -> u64 {
        let out = String::from_utf8(self.node.ns.exec(&["nft", "list", "chain", "inet", "flock", chain]).stdout).unwrap();
        let line = out.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("no rule with {needle:?} in {chain}:\n{out}"));
        let after = line.split("counter packets ").nth(1).unwrap();
        after.split_whitespace().next().unwrap().parse().unwrap()
    }
}

fn query(id: u16, t: RecordType) -> Vec<u8> {
    let mut q = Message::new();
    q.set_id(id).set_recursion_desired(true);
    q.add_query(Query::query(Name::from_ascii(format!("{NAME}.")).unwrap(), t));
    q.to_vec().unwrap()
}

/// Asks `resolver` from `ns` over UDP; the answer, if one comes within `wait`.
fn ask(ns: &Netns, resolver: IpAddr, q: Vec<u8>, wait: Duration) -> Option<Message> {
    netns::run_in(ns, move || {
        let s = UdpSocket::bind(SocketAddr::new(if resolver.is_ipv4() { ip("0.0.0.0") } else { ip("::") }, 0)).unwrap();
        s.connect((resolver, 53)).unwrap();
        s.set_read_timeout(Some(wait)).unwrap();
        s.send(&q).unwrap();
        let mut buf = vec![0u8; 4096];
        s.recv(&mut buf).ok().map(|n| Message::from_vec(&buf[..n]).unwrap())
    })
    .unwrap()
}

fn connects(ns: &Netns, dst: SocketAddr) -> bool {
    netns::run_in(ns, move || TcpStream::connect_timeout(&dst, Duration::from_millis(700)).is_ok()).unwrap()
}

/// Sends `payload` from `src` (any address: a transparent socket) to each of `dsts` from
/// namespace `ns`, once per id in `ids` (the first two bytes rewritten).
fn forge(ns: &Netns, src: SocketAddr, dsts: &[SocketAddr], payload: &[u8], ids: std::ops::RangeInclusive<u16>) {
    let (payload, dsts) = (payload.to_vec(), dsts.to_vec());
    netns::run_in(ns, move || {
        let family = if src.is_ipv4() { nix::sys::socket::AddressFamily::Inet } else { nix::sys::socket::AddressFamily::Inet6 };
        let fd = nix::sys::socket::socket(family, nix::sys::socket::SockType::Datagram, nix::sys::socket::SockFlag::empty(), None).unwrap();
        nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::IpTransparent, &true).unwrap();
        nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReuseAddr, &true).unwrap();
        nix::sys::socket::bind(fd.as_raw_fd(), &nix::sys::socket::SockaddrStorage::from(src)).unwrap();
        let sock = UdpSocket::from(fd);
        let mut msg = payload;
        for dst in dsts {
            for id in ids.clone() {
                msg[0..2].copy_from_slice(&id.to_be_bytes());
                // A full socket buffer drops some: the forger does not care.
                let _ = sock.send_to(&msg, dst);
            }
        }
    })
    .unwrap();
}

/// The proxy's upstream source port for the client's query (its conntrack entry carries
/// the proxied mark): what an attacker would have to guess, given to it here.
fn upstream_port(node: &Netns, client: IpAddr) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let entries = netns::run_in(node, || flock::conntrack::ConntrackSocket::open().unwrap().dump().unwrap().entries).unwrap();
        if let Some(e) = entries.iter().find(|e| e.mark & render::DNS_PROXIED_MARK != 0 && e.orig.src == client && e.orig.dport == 53) {
            return e.orig.sport;
        }
        assert!(Instant::now() < deadline, "the proxy's upstream query has no conntrack entry");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn forged_answers_teach_nothing_whoever_sends_them() {
    if !require_root("forged_answers_teach_nothing_whoever_sends_them") {
        return;
    }
    let c = cluster("dnsf", false);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (stop_dns, dns) = resolver(c.resolver.ns.netns(), vec![ip(V4.resolver), ip(V6.resolver)], Duration::from_secs(3), seen.clone());
    // Servers at the good and the denied addresses.
    let (stop_web, web) = serve_in(c.outside.netns(), |mut stop, ready| {
        Box::pin(async move {
            let l = tokio::net::TcpListener::bind("[::]:80").await.unwrap();
            let _ = ready.send(());
            loop {
                tokio::select! {
                    _ = l.accept() => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        })
    });
    let (stats, _learner, stop_proxy, proxy) = c.proxy(Bounds::default());
    let client = c.client.ns.netns();

    for (fam, t) in [(&V4, RecordType::A), (&V6, RecordType::AAAA)] {
        let denied: SocketAddr = (ip(fam.denied), 80).into();
        let resolver53: SocketAddr = (ip(fam.resolver), 53).into();
        assert!(!connects(&client, denied), "{denied} reachable before any answer");
        // The slow question: a TXT for the allowed name.
        let asker = {
            let client = client.clone();
            std::thread::spawn(move || ask(&client, ip(fam.resolver), query(0x7777, RecordType::TXT), Duration::from_secs(8)))
        };
        let sport = upstream_port(&c.node.ns.netns(), ip(fam.client));
        // The forged answer: the pod's own id, the name as the pod wrote it, an A/AAAA record
        // of the denied address.
        let q = Message::from_vec(&query(0x7777, RecordType::TXT)).unwrap();
        let owner = Name::from_ascii(format!("{NAME}.")).unwrap();
        let forged = answer(&q, vec![Record::from_rdata(owner, 3600, address(fam.denied))]);
        let to_pod: SocketAddr = (ip(fam.client), sport).into();
        // From the client pod itself, to every port of the node's address (the issue's
        // attack); from another pod on the node, and from off the node, to the proxy's
        // upstream port (given to them here) with every id.
        let spoofed = if fam.prefix == 32 { "iifname . ip saddr" } else { "iifname . ip6 saddr" };
        let (spoof_before, pod_forged_before) =
            (c.counted(render::FROM_PODS, spoofed), c.counted(render::DNS_PROXY_CHAIN, "a forged answer"));
        // (Off the node first: those reach the proxy's socket only while it waits.)
        let before = stats.mismatched.load(std::sync::atomic::Ordering::Relaxed);
        forge(&c.outside.netns(), resolver53, &[to_pod], &forged, 0..=u16::MAX);
        forge(&c.attacker.ns.netns(), resolver53, &[to_pod], &forged, 0..=u16::MAX);
        let node_ports: Vec<SocketAddr> = (1024..=65535u16).map(|p| (ip(fam.node), p).into()).collect();
        forge(&client, resolver53, &node_ports, &forged, 0x7777..=0x7777);
        let answer = asker.join().unwrap().unwrap_or_else(|| panic!("the TXT question was not answered: {stats:?}"));
        assert_eq!(answer.id(), 0x7777);
        // From pods: dropped as spoofed (to the node's address) or as forged answers (to the
        // proxy's port), before any socket.
        assert!(c.counted(render::FROM_PODS, spoofed) - spoof_before > 10_000);
        assert!(c.counted(render::DNS_PROXY_CHAIN, "a forged answer") - pod_forged_before > 10_000);
        // Off the node, nothing but the id (random) and the name's case (random) tells the
        // proxy a forgery from the answer: the kernel delivered them (as many as the socket's
        // buffer held), the proxy refused each.
        let refused = stats.mismatched.load(std::sync::atomic::Ordering::Relaxed) - before;
        assert!(refused > 500, "{refused} forgeries from outside refused by the proxy");
        // Nothing was learned: not the forgeries, not the A record slipped into the TXT answer.
        assert_eq!(c.learned(fam), Vec::<IpAddr>::new(), "{fam:?}", fam = fam.client);
        assert!(!connects(&client, denied), "{denied} reachable after the forgeries");
        // The resolver saw the pod's own address; a real answer teaches and admits.
        assert!(seen.lock().unwrap().clients.iter().all(|a| a.ip() == ip(V4.client) || a.ip() == ip(V6.client)));
        let real = ask(&client, ip(fam.resolver), query(0x1234, t), Duration::from_secs(3)).expect("no answer to the A question");
        assert_eq!(real.id(), 0x1234);
        assert_eq!(c.learned(fam), vec![ip(fam.good)]);
        assert!(connects(&client, (ip(fam.good), 80).into()));
    }

    for stop in [stop_proxy, stop_dns, stop_web] {
        stop.send(true).unwrap();
    }
    for t in [proxy, dns, web] {
        t.join().unwrap();
    }
}

/// What a namespace holds open: established and listening TCP sockets, UDP sockets (`ss`;
/// TIME-WAIT entries hold no descriptor).
fn sockets(ns: &NetnsGuard) -> usize {
    let count = |args: &[&str]| String::from_utf8(ns.exec(args).stdout).unwrap().lines().count();
    count(&["ss", "-H", "-tan", "state", "established"]) + count(&["ss", "-H", "-tln"]) + count(&["ss", "-H", "-uan"])
}

#[test]
fn nothing_the_steering_did_not_deliver_reaches_the_proxy() {
    if !require_root("nothing_the_steering_did_not_deliver_reaches_the_proxy") {
        return;
    }
    let c = cluster("dnsl", false);
    let (stats, _learner, stop_proxy, proxy) = c.proxy(Bounds::default());
    let client = c.client.ns.netns();
    let q = query(1, RecordType::A);
    for fam in [&V4, &V6] {
        // Straight at the node's address, port 15355 (UDP and TCP), and at its loopback
        // address (which the kernel never delivers from a pod).
        for dst in [ip(fam.node), if fam.prefix == 32 { ip("127.0.0.1") } else { ip("::1") }] {
            let to: SocketAddr = (dst, PORT).into();
            assert!(ask_port(&client, to, q.clone()).is_none(), "{to} answered");
            assert!(!connects(&client, to), "{to} accepted a connection");
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(stats.queries.load(std::sync::atomic::Ordering::Relaxed), 0, "the proxy took a query the steering did not send");
    assert_eq!(stats.upstream_failures.load(std::sync::atomic::Ordering::Relaxed), 0);
    stop_proxy.send(true).unwrap();
    proxy.join().unwrap();
}

fn ask_port(ns: &Netns, to: SocketAddr, q: Vec<u8>) -> Option<Vec<u8>> {
    netns::run_in(ns, move || {
        let s = UdpSocket::bind(SocketAddr::new(if to.is_ipv4() { ip("0.0.0.0") } else { ip("::") }, 0)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let _ = s.send_to(&q, to);
        let mut buf = [0u8; 512];
        s.recv(&mut buf).ok().map(|n| buf[..n].to_vec())
    })
    .unwrap()
}

#[test]
fn a_resolvers_ingress_policy_judges_the_pods_queries() {
    if !require_root("a_resolvers_ingress_policy_judges_the_pods_queries") {
        return;
    }
    // The resolver admits only kube-system: the client's queries, through the proxy, are
    // the client's and get no answer; before the policy they did.
    for (policy, answered) in [(false, true), (true, false)] {
        let c = cluster(if policy { "dnsp" } else { "dnsq" }, policy);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (stop_dns, dns) = resolver(c.resolver.ns.netns(), vec![ip(V4.resolver), ip(V6.resolver)], Duration::ZERO, seen.clone());
        let (stats, _learner, stop_proxy, proxy) = c.proxy(Bounds::default());
        for (fam, t) in [(&V4, RecordType::A), (&V6, RecordType::AAAA)] {
            let got = ask(&c.client.ns.netns(), ip(fam.resolver), query(7, t), Duration::from_millis(1500));
            assert_eq!(got.is_some(), answered, "policy {policy}, {}", fam.client);
        }
        if policy {
            assert!(seen.lock().unwrap().clients.is_empty(), "the resolver saw queries its policy denies");
            assert!(c.learned(&V4).is_empty());
        } else {
            assert!(seen.lock().unwrap().clients.iter().all(|a| a.ip() == ip(V4.client) || a.ip() == ip(V6.client)));
            assert_eq!(stats.learned.load(std::sync::atomic::Ordering::Relaxed), 2);
        }
        stop_proxy.send(true).unwrap();
        stop_dns.send(true).unwrap();
        proxy.join().unwrap();
        dns.join().unwrap();
    }
}

#[test]
fn floods_hold_a_bounded_number_of_sockets() {
    if !require_root("floods_hold_a_bounded_number_of_sockets") {
        return;
    }
    let c = cluster("dnsb", false);
    // A silent resolver: no answer to an unknown name.
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (stop_dns, dns) = resolver(c.resolver.ns.netns(), vec![ip(V4.resolver)], Duration::ZERO, seen);
    let bounds = Bounds { tcp_idle: Duration::from_secs(2), ..Bounds::default() };
    let (stats, _learner, stop_proxy, proxy) = c.proxy(bounds);
    let baseline = sockets(&c.node.ns);

    // 5,000 queries for a name never answered, as fast as the pod can send them.
    let mut unknown = Message::new();
    unknown.set_id(1).set_recursion_desired(true);
    unknown.add_query(Query::query(Name::from_ascii("never.example.test.").unwrap(), RecordType::A));
    let unknown = unknown.to_vec().unwrap();
    forge(&c.client.ns.netns(), (ip(V4.client), 40000).into(), &[(ip(V4.resolver), 53).into()], &unknown, 0..=4999);
    std::thread::sleep(Duration::from_millis(300));
    let held = sockets(&c.node.ns).saturating_sub(baseline);
    assert!(held <= bounds.in_flight_per_pod + 8, "{held} sockets held by one pod's flood");
    let udp_refused = stats.refused(RefusedBy::PodLimit);
    assert!(udp_refused > 1000, "{udp_refused} refused");

    // 3,000 TCP connections that never send a query: a few are taken (and closed when idle),
    // the rest closed at once.
    let conns = netns::run_in(&c.client.ns.netns(), || {
        (0..3000)
            .filter_map(|_| TcpStream::connect_timeout(&(ip(V4.resolver), 53).into(), Duration::from_millis(500)).ok())
            .collect::<Vec<_>>()
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let held = sockets(&c.node.ns).saturating_sub(baseline);
    assert!(held < 100, "{held} sockets held for {} idle connections", conns.len());
    assert!(
        stats.refused(RefusedBy::PodLimit) - udp_refused > 1000,
        "{} TCP connections refused",
        stats.refused(RefusedBy::PodLimit) - udp_refused
    );
    // The ones taken are closed once idle: each reads end-of-stream.
    std::thread::sleep(bounds.tcp_idle + Duration::from_millis(500));
    let mut open = 0;
    for mut s in conns {
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut b = [0u8; 1];
        if matches!(s.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut) {
            open += 1;
        }
    }
    assert_eq!(open, 0, "connections still held after the idle timeout");
    stop_proxy.send(true).unwrap();
    stop_dns.send(true).unwrap();
    proxy.join().unwrap();
    dns.join().unwrap();
}

/// The attacker floods while no proxy runs (the agent restarting or being upgraded), when
/// the socket keeper holds the proxy's listeners: of 5,000 UDP queries for a name never
/// answered, the UDP receive queue keeps what it holds (a few hundred), and TCP connections
/// fill the accept backlog until the kernel takes no more. The next proxy takes the listeners from the keeper and drains the
/// flood within its bounds (the attacker's per-pod limits; its sockets bounded), while
/// another pod's query, asked again as resolvers do, is answered, and that pod can connect
/// over TCP.
#[test]
fn a_flood_kept_for_the_next_proxy_is_drained_within_its_bounds() {
    if !require_root("a_flood_kept_for_the_next_proxy_is_drained_within_its_bounds") {
        return;
    }
    let c = cluster_with("dnsk", false, true);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (stop_dns, dns) = resolver(c.resolver.ns.netns(), vec![ip(V4.resolver), ip(V6.resolver)], Duration::ZERO, seen);
    let keeping = flock::testkit::kernel::SocketKeeper::start(env!("CARGO_BIN_EXE_flock-socket-keeper"), "dnsk");
    let bounds = Bounds { tcp_idle: Duration::from_secs(2), ..Bounds::default() };
    let mut config = ProxyConfig::new(PORT, c.np.dns_resolvers.clone());
    config.bounds = bounds;

    // The first proxy binds and deposits its listeners, and is gone.
    keeping.hold_new_listeners(c.node.ns.netns(), &config);
    let baseline = sockets(&c.node.ns);

    // The flood, while nothing reads.
    let mut unknown = Message::new();
    unknown.set_id(1).set_recursion_desired(true);
    unknown.add_query(Query::query(Name::from_ascii("never.example.test.").unwrap(), RecordType::A));
    let unknown = unknown.to_vec().unwrap();
    forge(&c.attacker.ns.netns(), (ip(V4.attacker), 40000).into(), &[(ip(V4.resolver), 53).into()], &unknown, 0..=4999);
    let (conns, refused_at) = netns::run_in(&c.attacker.ns.netns(), || {
        let mut conns = Vec::new();
        let mut refused_at = None;
        for i in 0..2000 {
            match TcpStream::connect_timeout(&(ip(V4.resolver), 53).into(), Duration::from_millis(300)) {
                Ok(s) => conns.push(s),
                Err(_) => {
                    refused_at = Some(i);
                    break;
                }
            }
        }
        (conns, refused_at)
    })
    .unwrap();
    assert!(refused_at.is_some(), "the backlog took {} connections and never filled: the attack did not happen", conns.len());
    assert!(conns.len() >= 100, "only {} connections waited in the backlog", conns.len());

    // The next proxy.
    let learner = Arc::new(DomainLearner::new(KernelWriter::default()));
    learner.set_rules(domain_rules(&c.np));
    let proxy = DnsProxy::new(config.clone(), learner);
    let stats = proxy.stats();
    let (stop_proxy, proxy_thread) = keeping.serve_kept(c.node.ns.netns(), proxy);
    // Another pod is served beside the flood, in both families, and can connect over TCP. A
    // query it sends while the flood still fills the kept receive queue is lost, as every
    // query is while no proxy runs without a keeper: it asks as resolvers do, again after a
    // timeout (1 s here; glibc waits 5 s), and that is answered.
    for (fam, id) in [(&V4, 7), (&V6, 8)] {
        let t = if fam.prefix == 32 { RecordType::A } else { RecordType::AAAA };
        let a = (0..3).find_map(|_| ask(&c.client.ns.netns(), ip(fam.resolver), query(id, t), Duration::from_secs(1)));
        let a = a.unwrap_or_else(|| {
            let n = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
            panic!(
                "{} got no answer while the kept flood drained ({} queries, {} answers; refused: {} not steered, {} by the pod's limit, {} by the node's)",
                fam.client,
                n(&stats.queries),
                n(&stats.answers),
                stats.refused(RefusedBy::NotSteered),
                stats.refused(RefusedBy::PodLimit),
                stats.refused(RefusedBy::NodeLimit)
            )
        });
        assert_eq!(a.answers().len(), 1, "{a:?}");
    }
    assert!(connects(&c.client.ns.netns(), (ip(V4.resolver), 53).into()), "the other pod cannot connect over TCP after the flood");
    // The flood was read and refused by the attacker's own limits, holding few sockets.
    let deadline = Instant::now() + Duration::from_secs(5);
    while stats.refused(RefusedBy::PodLimit) < 1000 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let refused = stats.refused(RefusedBy::PodLimit);
    assert!(refused >= 1000, "{refused} of the kept flood refused by the pod's limits");
    // The kept UDP queries were read too (the connections sent none): the queue drained.
    let read = stats.queries.load(std::sync::atomic::Ordering::Relaxed);
    assert!(read >= 100, "only {read} kept UDP queries read");
    let held = sockets(&c.node.ns).saturating_sub(baseline);
    assert!(held <= bounds.in_flight_per_pod + bounds.tcp_per_pod + 16, "{held} sockets held for the kept flood");
    drop(conns);
    stop_proxy.send(true).unwrap();
    proxy_thread.join().unwrap();
    stop_dns.send(true).unwrap();
    dns.join().unwrap();
}
