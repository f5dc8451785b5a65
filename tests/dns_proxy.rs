//! The agent's DNS proxy against the real kernel (root only): a node namespace tproxies its
//! client pod's DNS (UDP and TCP, IPv4 and IPv6) to the proxy, which asks the resolver pod
//! (flock's own DNS server) and answers the client from the resolver's address — after the
//! learner has taken what the answer teaches.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flock::dns::Learned;
use flock::dns_proxy::proxy::{DnsProxy, Learner, ProxyConfig, ProxyStats, RefusedBy};
use flock::netns::{self, Netns};
use flock::sim::dns::{Record, RecordData, Zone};
use flock::testkit::kernel::{Node, redirect_dns, require_root, serve_dns, serve_dns_proxy, serve_in};
use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

const PORT: u16 = 15353;
const HOLD: Duration = Duration::from_millis(200);

/// Records what it learned and when it finished; holds every answer for [`HOLD`]; fails for
/// names starting with `fail.`.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<(IpAddr, SocketAddr, Learned, Instant)>>,
}

impl Learner for Recorder {
    async fn learn(&self, client: IpAddr, resolver: SocketAddr, learned: &Learned) -> Result<(), flock::apply::netlink::NetlinkError> {
        tokio::time::sleep(HOLD).await;
        if learned.name.starts_with("fail.") {
            return Err(flock::apply::netlink::NetlinkError::Protocol("the set is full".into()));
        }
        self.seen.lock().unwrap().push((client, resolver, learned.clone(), Instant::now()));
        Ok(())
    }
}

fn query(name: &str, kind: RecordType, id: u16) -> Vec<u8> {
    let mut q = Message::new();
    q.set_id(id);
    q.set_recursion_desired(true);
    q.add_query(Query::query(Name::from_ascii(format!("{name}.")).unwrap(), kind));
    q.to_vec().unwrap()
}

fn addresses(answer: &[u8]) -> Vec<IpAddr> {
    Message::from_vec(answer)
        .unwrap()
        .answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

fn ask_udp(client: &Netns, resolver: SocketAddr, q: Vec<u8>) -> (Vec<u8>, Instant) {
    netns::run_in(client, move || {
        let local: SocketAddr = if resolver.is_ipv4() { "0.0.0.0:0".parse().unwrap() } else { "[::]:0".parse().unwrap() };
        let s = UdpSocket::bind(local).unwrap();
        // Connected: the kernel delivers only datagrams from the resolver's address and port.
        s.connect(resolver).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.send(&q).unwrap();
        let mut buf = vec![0u8; 65_535];
        let n = s.recv(&mut buf).unwrap_or_else(|e| panic!("no answer from {resolver}: {e}"));
        buf.truncate(n);
        (buf, Instant::now())
    })
    .unwrap()
}

/// [`ask_udp`], `None` when no answer comes within a second.
fn try_udp(client: &Netns, resolver: SocketAddr, q: Vec<u8>) -> Option<Vec<u8>> {
    netns::run_in(client, move || {
        let local: SocketAddr = if resolver.is_ipv4() { "0.0.0.0:0".parse().unwrap() } else { "[::]:0".parse().unwrap() };
        let s = UdpSocket::bind(local).unwrap();
        s.connect(resolver).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        s.send(&q).unwrap();
        let mut buf = vec![0u8; 65_535];
        s.recv(&mut buf).ok().map(|n| buf[..n].to_vec())
    })
    .unwrap()
}

fn ask_tcp(client: &Netns, resolver: SocketAddr, queries: Vec<Vec<u8>>) -> Vec<(Vec<u8>, Instant)> {
    netns::run_in(client, move || {
        let mut s = TcpStream::connect_timeout(&resolver, Duration::from_secs(5)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut out = Vec::new();
        for q in queries {
            let mut framed = (q.len() as u16).to_be_bytes().to_vec();
            framed.extend_from_slice(&q);
            s.write_all(&framed).unwrap();
            let mut len = [0u8; 2];
            s.read_exact(&mut len).unwrap();
            let mut answer = vec![0u8; usize::from(u16::from_be_bytes(len))];
            s.read_exact(&mut answer).unwrap();
            out.push((answer, Instant::now()));
        }
        out
    })
    .unwrap()
}

fn stat(stats: &ProxyStats, f: impl Fn(&ProxyStats) -> &std::sync::atomic::AtomicU64) -> u64 {
    f(stats).load(std::sync::atomic::Ordering::Relaxed)
}

/// A counter the proxy bumps once the pod has its answer (so a moment after the pod reads
/// it): its value once it reached `want`, or what it is after a second.
fn settled(stats: &ProxyStats, f: impl Fn(&ProxyStats) -> &std::sync::atomic::AtomicU64, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(1);
    while stat(stats, &f) < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    stat(stats, &f)
}

#[test]
fn pods_get_answers_from_their_resolver_only_after_the_learner_admitted_them() {
    if !require_root("pods_get_answers_from_their_resolver_only_after_the_learner_admitted_them") {
        return;
    }
    let node = Node::new("dnsp");
    let client_ips: [IpAddr; 2] = ["198.18.210.2".parse().unwrap(), "2001:db8:210::2".parse().unwrap()];
    let client = node.add_pod("dnsc", "vc-dns", &client_ips);
    let resolver_ips: [IpAddr; 3] =
        ["198.18.211.53".parse().unwrap(), "2001:db8:211::53".parse().unwrap(), "198.18.211.54".parse().unwrap()];
    let resolver = node.add_pod("dnsr", "vr-dns", &resolver_ips);
    // The node's own addresses (the proxy asks as the pod, from the pod's address).
    node.ns.ip(&["addr", "add", "198.18.212.1/32", "dev", "uplink"]);
    node.ns.ip(&["-6", "addr", "add", "2001:db8:212::1/128", "dev", "uplink", "nodad"]);
    // The redirect as the agent will program it.
    redirect_dns(&node, "vc-dns", PORT, "");

    let zone = Zone::new(vec![
        Record { name: "api.example.test".into(), ttl: 300, data: RecordData::Address("198.18.1.10".parse().unwrap()) },
        Record { name: "api.example.test".into(), ttl: 300, data: RecordData::Address("2001:db8:1::10".parse().unwrap()) },
        Record { name: "www.example.test".into(), ttl: 300, data: RecordData::Cname("api.example.test".into()) },
        Record { name: "fail.example.test".into(), ttl: 300, data: RecordData::Address("198.18.1.11".parse().unwrap()) },
    ]);
    let (stop_dns, dns_thread) = serve_dns(resolver.ns.netns(), resolver_ips.to_vec(), zone);

    let learner = Arc::new(Recorder::default());
    // 198.18.211.54 is not a trusted resolver: its answers teach nothing.
    let config = ProxyConfig::new(PORT, vec![resolver_ips[0], resolver_ips[1]]);
    let proxy = DnsProxy::new(config, learner.clone());
    let stats = proxy.stats();
    let (stop_proxy, proxy_thread) = serve_dns_proxy(node.ns.netns(), proxy);

    let v4: SocketAddr = (resolver_ips[0], 53).into();
    let v6: SocketAddr = (resolver_ips[1], 53).into();
    let asked_at = Instant::now();
    let (answer, received) = ask_udp(&client.ns.netns(), v4, query("www.example.test", RecordType::A, 1));
    assert_eq!(addresses(&answer), vec!["198.18.1.10".parse::<IpAddr>().unwrap()]);
    {
        let seen = learner.seen.lock().unwrap();
        let (who, from, learned, admitted) = seen.last().expect("the learner saw nothing");
        assert_eq!((*who, *from), (client_ips[0], v4));
        assert_eq!(learned.name, "www.example.test");
        assert_eq!(learned.chain, vec!["api.example.test".to_string()]);
        assert_eq!(learned.addresses, vec![("198.18.1.10".parse().unwrap(), 300)]);
        // The answer reached the pod after the learner was done, and was held for it.
        assert!(*admitted <= received && received - asked_at >= HOLD);
    }

    let (answer, received) = ask_udp(&client.ns.netns(), v6, query("api.example.test", RecordType::AAAA, 2));
    assert_eq!(addresses(&answer), vec!["2001:db8:1::10".parse::<IpAddr>().unwrap()]);
    {
        let seen = learner.seen.lock().unwrap();
        let (who, from, learned, admitted) = seen.last().unwrap();
        assert_eq!((*who, *from, learned.name.as_str()), (client_ips[1], v6, "api.example.test"));
        assert!(*admitted <= received);
    }

    // TCP: two queries over one connection, each answered after its learning.
    let answers =
        ask_tcp(&client.ns.netns(), v4, vec![query("api.example.test", RecordType::A, 3), query("www.example.test", RecordType::A, 4)]);
    assert_eq!(answers.len(), 2);
    for (answer, received) in &answers {
        assert_eq!(addresses(answer), vec!["198.18.1.10".parse::<IpAddr>().unwrap()]);
        let seen = learner.seen.lock().unwrap();
        let name = Message::from_vec(answer).unwrap().queries()[0].name().to_ascii();
        let learned_at = seen.iter().filter(|s| format!("{}.", s.2.name) == name).map(|s| s.3).max().unwrap();
        assert!(learned_at <= *received);
    }
    assert_eq!(learner.seen.lock().unwrap().len(), 4);

    // The learner failed: SERVFAIL, not an answer the pod could not use.
    let (answer, _) = ask_udp(&client.ns.netns(), v4, query("fail.example.test", RecordType::A, 5));
    let m = Message::from_vec(&answer).unwrap();
    assert_eq!((m.id(), m.response_code()), (5, ResponseCode::ServFail));
    assert!(addresses(&answer).is_empty());

    // A query to a resolver not trusted is not what the steering delivers (it steers DNS to
    // trusted resolvers only; this test's redirect takes every port 53): dropped, counted.
    let untrusted: SocketAddr = (resolver_ips[2], 53).into();
    assert_eq!(try_udp(&client.ns.netns(), untrusted, query("api.example.test", RecordType::A, 6)), None);
    assert_eq!(stats.refused(RefusedBy::NotSteered), 1);
    // A name the resolver does not know: NXDOMAIN teaches nothing, passed on as it came.
    let (answer, _) = ask_udp(&client.ns.netns(), v4, query("nope.example.test", RecordType::A, 7));
    assert_eq!(Message::from_vec(&answer).unwrap().response_code(), ResponseCode::NXDomain);
    assert_eq!(learner.seen.lock().unwrap().len(), 4);

    assert_eq!(stat(&stats, |s| &s.queries), 7);
    assert_eq!(settled(&stats, |s| &s.answers, 6), 6);
    assert_eq!(stat(&stats, |s| &s.learned), 4);
    assert_eq!(stat(&stats, |s| &s.learn_failures), 1);
    assert_eq!(stat(&stats, |s| &s.untrusted), 0);
    assert_eq!(stat(&stats, |s| &s.unusable), 1);
    assert_eq!(stat(&stats, |s| &s.upstream_failures), 0);
    assert_eq!(stat(&stats, |s| &s.mismatched), 0);

    stop_proxy.send(true).unwrap();
    stop_dns.send(true).unwrap();
    proxy_thread.join().unwrap();
    dns_thread.join().unwrap();
}

#[test]
fn without_the_proxy_redirected_dns_fails() {
    if !require_root("without_the_proxy_redirected_dns_fails") {
        return;
    }
    // Fail closed: tproxy finds no listener and its rule does not match, so the rule after it
    // drops the query (the agent renders both): without the drop, the query would be routed
    // to the resolver past the proxy.
    let node = Node::new("dnsn");
    let client = node.add_pod("dnsnc", "vc-dnsn", &["198.18.213.2".parse().unwrap()]);
    let resolver = node.add_pod("dnsnr", "vr-dnsn", &["198.18.214.53".parse().unwrap()]);
    let zone =
        Zone::new(vec![Record { name: "api.example.test".into(), ttl: 300, data: RecordData::Address("198.18.1.10".parse().unwrap()) }]);
    let resolver_addr: SocketAddr = "198.18.214.53:53".parse().unwrap();
    let (stop_dns, dns_thread) = serve_dns(resolver.ns.netns(), vec![resolver_addr.ip()], zone);
    let probe = || {
        let q = query("api.example.test", RecordType::A, 9);
        netns::run_in(&client.ns.netns(), move || {
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            s.connect(resolver_addr).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
            s.send(&q).unwrap();
            let mut buf = [0u8; 512];
            (s.recv(&mut buf).is_ok(), TcpStream::connect_timeout(&resolver_addr, Duration::from_secs(2)).is_ok())
        })
        .unwrap()
    };
    // Without the redirect the pod reaches its resolver (the control).
    assert_eq!(probe(), (true, true));
    redirect_dns(&node, "vc-dnsn", PORT, "");
    let (udp, tcp) = probe();
    assert!(!udp && !tcp, "DNS got through without the proxy: udp {udp}, tcp {tcp}");
    stop_dns.send(true).unwrap();
    dns_thread.join().unwrap();
}

/// Whether a TCP connection from `client` to `dst` is established within a second.
fn connects(client: &Netns, dst: SocketAddr) -> bool {
    netns::run_in(client, move || TcpStream::connect_timeout(&dst, Duration::from_secs(1)).is_ok()).unwrap()
}

#[test]
fn a_pod_reaches_a_domain_from_its_answer_on_until_the_ttl_passes() {
    if !require_root("a_pod_reaches_a_domain_from_its_answer_on_until_the_ttl_passes") {
        return;
    }
    use flock::dns::DomainPattern;
    use flock::dns_proxy::learner::{DomainLearner, DomainRule, KernelWriter};

    let node = Node::new("dnse");
    let client_ips: [IpAddr; 2] = ["198.18.216.2".parse().unwrap(), "2001:db8:216::2".parse().unwrap()];
    let client = node.add_pod("dnsec", "vc-dnse", &client_ips);
    let resolver_ips: [IpAddr; 1] = ["198.18.217.53".parse().unwrap()];
    let resolver = node.add_pod("dnser", "vr-dnse", &resolver_ips);
    let server_ips: [IpAddr; 2] = ["198.18.215.80".parse().unwrap(), "2001:db8:215::80".parse().unwrap()];
    let server = node.add_pod("dnses", "vs-dnse", &server_ips);
    node.ns.ip(&["addr", "add", "198.18.218.1/32", "dev", "uplink"]);
    // The client may reach the domain rule's timed sets on port 80 and nothing else but DNS,
    // which goes to the proxy (as the agent will render it, in flock's own table).
    redirect_dns(
        &node,
        "vc-dnse",
        PORT,
        "set dom-e-v4 { type ipv4_addr; flags timeout; }\n\
         set dom-e-v6 { type ipv6_addr; flags timeout; }\n\
         chain forward {\n type filter hook forward priority filter; policy accept;\n\
         ct state established,related accept\n\
         iifname \"vc-dnse\" ip daddr @dom-e-v4 tcp dport 80 accept\n\
         iifname \"vc-dnse\" ip6 daddr @dom-e-v6 tcp dport 80 accept\n\
         iifname \"vc-dnse\" drop\n}",
    );

    // The server accepts on port 80 (both families).
    let (stop_server, server_thread) = serve_in(server.ns.netns(), |mut stop, ready| {
        Box::pin(async move {
            let listener = tokio::net::TcpListener::bind("[::]:80").await.unwrap();
            ready.send(()).unwrap();
            loop {
                tokio::select! {
                    _ = listener.accept() => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        })
    });
    let zone = Zone::new(vec![
        Record { name: "api.example.test".into(), ttl: 2, data: RecordData::Address(server_ips[0]) },
        Record { name: "api.example.test".into(), ttl: 2, data: RecordData::Address(server_ips[1]) },
    ]);
    let (stop_dns, dns_thread) = serve_dns(resolver.ns.netns(), resolver_ips.to_vec(), zone);
    let learner = Arc::new(DomainLearner::new(KernelWriter::default()));
    learner.set_rules(vec![DomainRule {
        source: "policy x/api egress[0]".into(),
        pods: client_ips.into_iter().collect(),
        patterns: vec![DomainPattern::parse("*.example.test").unwrap()],
        set_v4: "dom-e-v4".into(),
        set_v6: "dom-e-v6".into(),
    }]);
    let mut config = ProxyConfig::new(PORT, vec![resolver_ips[0]]);
    config.limits.min_ttl = 1;
    let proxy = DnsProxy::new(config, learner);
    let (stop_proxy, proxy_thread) = serve_dns_proxy(node.ns.netns(), proxy);

    let resolver_addr: SocketAddr = (resolver_ips[0], 53).into();
    for (kind, server_ip) in [(RecordType::A, server_ips[0]), (RecordType::AAAA, server_ips[1])] {
        let dst: SocketAddr = (server_ip, 80).into();
        assert!(!connects(&client.ns.netns(), dst), "{dst} reachable before any answer");
        let (answer, _) = ask_udp(&client.ns.netns(), resolver_addr, query("api.example.test", kind, 11));
        assert_eq!(addresses(&answer), vec![server_ip]);
        // Right after the answer: admitted (the proxy answered only once the set had it).
        assert!(connects(&client.ns.netns(), dst), "{dst} not reachable right after the answer");
        std::thread::sleep(Duration::from_millis(2500));
        assert!(!connects(&client.ns.netns(), dst), "{dst} still reachable after its TTL");
    }

    for stop in [stop_proxy, stop_dns, stop_server] {
        stop.send(true).unwrap();
    }
    for t in [proxy_thread, dns_thread, server_thread] {
        t.join().unwrap();
    }
}

/// The steering as flock renders it, on the real kernel, without the agent: a pod's DNS to a
/// trusted resolver is judged by its own egress chains first (a pod whose policy does not
/// admit DNS gets nothing, proxy or not), then handed to the proxy — and dropped while no
/// proxy listens (fail closed), answered once one does.
#[test]
fn the_rendered_steering_judges_dns_by_policy_and_fails_closed_without_the_proxy() {
    if !require_root("the_rendered_steering_judges_dns_by_policy_and_fails_closed_without_the_proxy") {
        return;
    }
    use flock::apply::Applier;
    use flock::apply::kernel::NftCli;
    use flock::dns_proxy::learner::{DomainLearner, KernelWriter};
    use flock::model::{LocalEndpoint, ObjectRef};
    use flock::render::{self, DnsSteer, RenderOptions};
    use flock::translate::{Options, translate};

    const STEER_PORT: u16 = 15354;
    let node = Node::new("dnsr");
    let (c1_ip, c2_ip): (IpAddr, IpAddr) = ("198.18.220.2".parse().unwrap(), "198.18.220.3".parse().unwrap());
    let c1 = node.add_pod("dnsr1", "flkdnsr1", &[c1_ip]);
    let c2 = node.add_pod("dnsr2", "flkdnsr2", &[c2_ip]);
    let resolver_ip: IpAddr = "198.18.221.53".parse().unwrap();
    let resolver = node.add_pod("dnsrr", "vr-dnsr", &[resolver_ip]);
    node.ns.ip(&["addr", "add", "198.18.222.1/32", "dev", "uplink"]);
    let manifests = r#"
apiVersion: v1
kind: Namespace
metadata: {name: apps, labels: {ns: apps}}
---
apiVersion: v1
kind: Pod
metadata: {name: c1, namespace: apps, uid: u-c1, labels: {app: c1}}
spec: {nodeName: n1}
status: {phase: Running, podIPs: [{ip: 198.18.220.2}]}
---
apiVersion: v1
kind: Pod
metadata: {name: c2, namespace: apps, uid: u-c2, labels: {app: c2}}
spec: {nodeName: n1}
status: {phase: Running, podIPs: [{ip: 198.18.220.3}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: by-name}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {ns: apps}}}
  egress:
    - {action: Accept, to: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: nothing}}}}]}
    - {action: Accept, to: [{domainNames: ['*.example.test']}], protocols: [{tcp: {destinationPort: {number: 80}}}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: c1-dns, namespace: apps}
spec:
  podSelector: {matchLabels: {app: c1}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 198.18.221.53/32}}], ports: [{protocol: UDP, port: 53}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: c2-none, namespace: apps}
spec:
  podSelector: {matchLabels: {app: c2}}
  policyTypes: [Egress]
"#;
    let s = flock::testkit::parse_manifests(manifests).to_snapshot();
    let endpoint = |iface: &str, name: &str, ip: IpAddr| LocalEndpoint {
        interface: iface.into(),
        container_id: format!("cid-{name}"),
        pod: ObjectRef::new("apps", name),
        pod_uid: Some(format!("u-{name}")),
        addrs: vec![ip],
    };
    let np = translate(&s, &[endpoint("flkdnsr1", "c1", c1_ip), endpoint("flkdnsr2", "c2", c2_ip)], &Options::default());
    assert!(np.problems.is_empty(), "{:?}", np.problems);
    let options =
        RenderOptions { dns: Some(DnsSteer::new(STEER_PORT, render::DNS_MARK, vec![resolver_ip.into()])), ..RenderOptions::DEFAULT };
    Applier::new(NftCli::new(node.ns.netns())).apply(&render::render_with(&np, &options)).unwrap();
    // The policy routing flock-agent adds for marked packets.
    node.ns.ip(&["-4", "rule", "add", "fwmark", "0x80/0x80", "lookup", "181"]);
    node.ns.ip(&["-4", "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "181"]);

    let zone =
        Zone::new(vec![Record { name: "api.example.test".into(), ttl: 300, data: RecordData::Address("198.18.223.80".parse().unwrap()) }]);
    let (stop_dns, dns_thread) = serve_dns(resolver.ns.netns(), vec![resolver_ip], zone);
    let server: SocketAddr = (resolver_ip, 53).into();
    let ask = |pod: &flock::testkit::kernel::Pod| {
        let q = query("api.example.test", RecordType::A, 9);
        netns::run_in(&pod.ns.netns(), move || {
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            s.connect(server).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(800))).unwrap();
            s.send(&q).unwrap();
            let mut buf = vec![0u8; 4096];
            s.recv(&mut buf).ok().map(|n| buf[..n].to_vec())
        })
        .unwrap()
    };
    // No proxy: the admitted query is dropped (fail closed), not sent on past it.
    assert_eq!(ask(&c1), None, "answered without the proxy");
    let chain = String::from_utf8(node.ns.exec(&["nft", "list", "chain", "inet", "flock", render::DNS_PROXY_CHAIN]).stdout).unwrap();
    assert!(chain.lines().any(|l| l.contains("drop") && l.contains("counter packets") && !l.contains("counter packets 0 ")), "{chain}");

    let learner = Arc::new(DomainLearner::new(KernelWriter::default()));
    learner.set_rules(flock::dns_proxy::domain_rules(&np));
    let proxy = DnsProxy::new(ProxyConfig::new(STEER_PORT, vec![resolver_ip]), learner);
    let stats = proxy.stats();
    let (stop_proxy, proxy_thread) = serve_dns_proxy(node.ns.netns(), proxy);
    let answer = ask(&c1).expect("no answer through the proxy");
    assert_eq!(addresses(&answer), vec!["198.18.223.80".parse::<IpAddr>().unwrap()]);
    // The learned address is in the rule's timed set.
    let def = render::domain_uses(&np).keys().next().copied().cloned().unwrap();
    let set = render::domain_set_name(&def, false);
    let learned =
        netns::run_in(&node.ns.netns(), move || flock::apply::netlink::NfSocket::open().unwrap().dump_timed(&set).unwrap()).unwrap();
    assert_eq!(learned.iter().map(|e| e.addr).collect::<Vec<_>>(), vec!["198.18.223.80".parse::<IpAddr>().unwrap()]);
    // c2's policy admits no DNS: dropped by its own egress chain, never reaching the proxy.
    assert_eq!(ask(&c2), None, "a pod whose policy denies DNS got an answer");
    assert_eq!(stat(&stats, |s| &s.queries), 1);

    stop_proxy.send(true).unwrap();
    stop_dns.send(true).unwrap();
    proxy_thread.join().unwrap();
    dns_thread.join().unwrap();
}

/// The socket keeper between two proxies (an agent restart): the first proxy's listeners,
/// deposited with the keeper, stay open after it is gone, so a query (UDP) and a connection
/// with a query (TCP) made while no proxy runs wait in them and are answered by the next
/// proxy, which takes them from the keeper. Listeners that do not fit the next proxy's
/// configuration are refused, by address.
#[test]
fn queries_made_while_no_proxy_runs_wait_in_the_kept_listeners_for_the_next() {
    use flock::dns_proxy::keeper;
    use flock::dns_proxy::proxy::Listeners;
    if !require_root("queries_made_while_no_proxy_runs_wait_in_the_kept_listeners_for_the_next") {
        return;
    }
    const KEPT_PORT: u16 = 15354;
    let node = Node::new("dnsk");
    let client_ip: IpAddr = "198.18.215.2".parse().unwrap();
    let client = node.add_pod("dnskc", "vc-dnsk", &[client_ip]);
    let resolver_ip: IpAddr = "198.18.216.53".parse().unwrap();
    let resolver = node.add_pod("dnskr", "vr-dnsk", &[resolver_ip]);
    node.ns.ip(&["addr", "add", "198.18.217.1/32", "dev", "uplink"]);
    redirect_dns(&node, "vc-dnsk", KEPT_PORT, "");
    let zone =
        Zone::new(vec![Record { name: "api.example.test".into(), ttl: 300, data: RecordData::Address("198.18.1.10".parse().unwrap()) }]);
    let (stop_dns, dns_thread) = serve_dns(resolver.ns.netns(), vec![resolver_ip], zone);

    // The keeper binary in a PID namespace of its own, as in its own pod: the agent's pid is
    // not visible to it (the kernel reports 0).
    let keeping = flock::testkit::kernel::SocketKeeper::start(env!("CARGO_BIN_EXE_flock-socket-keeper"), "dnsk");
    let k = keeping.client();
    let mut config = ProxyConfig::new(KEPT_PORT, vec![resolver_ip]);
    config.ipv6 = false;

    // The first proxy binds and deposits, then is gone without ever reading.
    keeping.hold_new_listeners(node.ns.netns(), &config);
    let resolver_addr = SocketAddr::new(resolver_ip, 53);
    let udp = {
        let ns = client.ns.netns();
        std::thread::spawn(move || {
            netns::run_in(&ns, || {
                let s = UdpSocket::bind("0.0.0.0:0").unwrap();
                s.connect(resolver_addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                s.send(&query("api.example.test", RecordType::A, 5)).unwrap();
                let mut buf = vec![0u8; 512];
                let n = s.recv(&mut buf).unwrap_or_else(|e| panic!("the query that waited got no answer: {e}"));
                buf.truncate(n);
                buf
            })
            .unwrap()
        })
    };
    let tcp = {
        let ns = client.ns.netns();
        std::thread::spawn(move || ask_tcp(&ns, resolver_addr, vec![query("api.example.test", RecordType::A, 6)]))
    };
    // Nothing reads them yet.
    std::thread::sleep(Duration::from_millis(500));
    assert!(!udp.is_finished() && !tcp.is_finished(), "answered while no proxy ran");

    // Listeners that do not fit are refused (the keeper keeps them).
    let mut other = ProxyConfig::new(KEPT_PORT + 1, vec![resolver_ip]);
    other.ipv6 = false;
    let err = netns::run_in(&node.ns.netns(), || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async { Listeners::adopt(&other, k.take(keeper::DNS_PROXY).unwrap()).err() })
    })
    .unwrap();
    assert!(err.is_some_and(|e| e.contains(&format!("127.0.0.1:{}", KEPT_PORT + 1))));

    // The next proxy takes them and answers what waited.
    let learner = Arc::new(Recorder::default());
    let proxy = DnsProxy::new(config.clone(), learner.clone());
    let (stop_proxy, proxy_thread) = keeping.serve_kept(node.ns.netns(), proxy);
    let want = vec!["198.18.1.10".parse::<IpAddr>().unwrap()];
    assert_eq!(addresses(&udp.join().unwrap()), want);
    let answers = tcp.join().unwrap();
    assert_eq!(answers.len(), 1);
    assert_eq!(addresses(&answers[0].0), want);
    assert_eq!(learner.seen.lock().unwrap().len(), 2, "the learner saw both waiting queries");
    stop_proxy.send(true).unwrap();
    proxy_thread.join().unwrap();
    stop_dns.send(true).unwrap();
    dns_thread.join().unwrap();
}
