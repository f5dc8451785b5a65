//! Egress by domain name through flock-agent (root): a simulated cluster whose agents run
//! their DNS proxy, a ClusterNetworkPolicy whose Accept rule names domains, flock's DNS
//! server on a host as the trusted resolver. The agent renders the domain rule's timed sets
//! and the DNS steering; a pod reaches a domain's address only after resolving it, until
//! the TTL passes; a pod whose policy does not admit DNS to the resolver gets no answer
//! (the proxy does not widen policy); a sync keeps what was learned.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use flock::dns_proxy::DnsConfig;
use flock::model::Protocol;
use flock::netns::{self, Netns};
use flock::sim::dns::{Record, RecordData, Zone};
use flock::sim::{HostSpec, Sim, SimOptions};
use flock::testkit::kernel::{flock_cni_binary, require_root, serve_dns};
use flock::testkit::{self, parse_manifests};
use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{Name, RData, RecordType};

/// The addresses and names of one family's run.
struct Fam {
    v6: bool,
    resolver: &'static str,
    web: &'static str,
    other: &'static str,
    /// The policies' CIDRs: the resolver's host prefix, and everything.
    resolver_cidr: &'static str,
    all: &'static str,
}

const V4: Fam = Fam {
    v6: false,
    resolver: "198.18.250.53",
    web: "198.18.250.80",
    other: "198.18.250.81",
    resolver_cidr: "198.18.250.53/32",
    all: "0.0.0.0/0",
};
const V6: Fam = Fam {
    v6: true,
    resolver: "2001:db8:250::53",
    web: "2001:db8:250::80",
    other: "2001:db8:250::81",
    resolver_cidr: "2001:db8:250::53/128",
    all: "::/0",
};

/// y's pods may use DNS at the resolver and reach `*.example.test` on TCP 80; x/a may reach
/// the domains but not DNS; nothing else for either.
const POLICY: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: by-name}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {ns: y}}}
  egress:
    - name: dns
      action: Accept
      to: [{networks: [RESOLVER_CIDR]}]
      protocols: [{udp: {destinationPort: {number: 53}}}, {tcp: {destinationPort: {number: 53}}}]
    - name: example
      action: Accept
      to: [{domainNames: ['*.example.test']}]
      protocols: [{tcp: {destinationPort: {number: 80}}}]
    - name: rest
      action: Deny
      to: [{networks: [ALL]}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: no-dns}
spec:
  tier: Admin
  priority: 11
  subject: {pods: {namespaceSelector: {matchLabels: {ns: x}}, podSelector: {matchLabels: {pod: a}}}}
  egress:
    - name: example
      action: Accept
      to: [{domainNames: ['*.example.test']}]
      protocols: [{tcp: {destinationPort: {number: 80}}}]
    - name: rest
      action: Deny
      to: [{networks: [ALL]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: z-by-name
  namespace: z
  annotations:
    flock.dev/egress-domains: '[{"name": "api.example.test", "ports": [{"protocol": "TCP", "port": 80}]}]'
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Egress]
  egress:
    - to: [{ipBlock: {cidr: RESOLVER_CIDR}}]
      ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]
"#;

fn query(name: &str, id: u16, v6: bool) -> Vec<u8> {
    let mut q = Message::new();
    q.set_id(id);
    q.set_recursion_desired(true);
    let kind = if v6 { RecordType::AAAA } else { RecordType::A };
    q.add_query(Query::query(Name::from_ascii(format!("{name}.")).unwrap(), kind));
    q.to_vec().unwrap()
}

/// The addresses of the answer to `name` from `pod` (A or AAAA, the family's), or `None`
/// without an answer.
fn resolve(fam: &Fam, pod: &Netns, name: &str) -> Option<Vec<IpAddr>> {
    let q = query(name, 7, fam.v6);
    let resolver: IpAddr = fam.resolver.parse().unwrap();
    netns::run_in(pod, move || {
        let s = UdpSocket::bind(if resolver.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }).unwrap();
        s.connect((resolver, 53)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
        s.send(&q).unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.recv(&mut buf).ok()?;
        let m = Message::from_vec(&buf[..n]).unwrap();
        Some(
            m.answers()
                .iter()
                .filter_map(|r| match r.data() {
                    RData::A(a) => Some(IpAddr::V4(a.0)),
                    RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                    _ => None,
                })
                .collect(),
        )
    })
    .unwrap()
}

fn connects(pod: &Netns, ip: &str) -> bool {
    let dst = SocketAddr::new(ip.parse().unwrap(), 80);
    netns::run_in(pod, move || TcpStream::connect_timeout(&dst, Duration::from_millis(700)).is_ok()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_reaches_a_domain_after_resolving_it_until_its_ttl() {
    if !require_root("a_pod_reaches_a_domain_after_resolving_it_until_its_ttl") {
        return;
    }
    run(&V4, testkit::base_cluster()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_reaches_a_domain_after_resolving_it_until_its_ttl_ipv6() {
    if !require_root("a_pod_reaches_a_domain_after_resolving_it_until_its_ttl_ipv6") {
        return;
    }
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/conformance-v6/base-cluster.yaml")).unwrap();
    run(&V6, parse_manifests(&text).to_snapshot()).await;
}

async fn run(fam: &Fam, mut snapshot: flock::model::Snapshot) {
    let policy = POLICY.replace("RESOLVER_CIDR", fam.resolver_cidr).replace("ALL", fam.all);
    for o in parse_manifests(&policy).objects {
        o.apply_to(&mut snapshot);
    }
    let mut opts = SimOptions::new(flock_cni_binary().parent().unwrap().to_path_buf());
    let host = |name: &str, addrs: &str| -> HostSpec { format!("{name}={addrs}").parse().unwrap() };
    opts.hosts = vec![host("dns", fam.resolver), host("web", fam.web), host("other", fam.other)];
    opts.host_ports = vec![(80, Protocol::Tcp)];
    opts.dns = Some(DnsConfig {
        resolvers: vec![fam.resolver.parse().unwrap()],
        limits: flock::dns::Limits { min_ttl: 1, ..flock::dns::Limits::default() },
        upstream_timeout: Duration::from_secs(2),
        ..DnsConfig::default()
    });
    let mut sim = Sim::build(snapshot, opts).await.unwrap();
    let zone = Zone::new(vec![
        Record { name: "api.example.test".into(), ttl: 3, data: RecordData::Address(fam.web.parse().unwrap()) },
        Record { name: "www.example.test".into(), ttl: 300, data: RecordData::Cname("api.example.test".into()) },
        Record { name: "other.test".into(), ttl: 300, data: RecordData::Address(fam.other.parse().unwrap()) },
    ]);
    let dns_ns = Netns::named(&sim.host_netns("dns").unwrap());
    let (stop_dns, dns_thread) = serve_dns(dns_ns, vec![fam.resolver.parse().unwrap()], zone);

    let ya = Netns::named(&sim.pod_netns("y/a").unwrap());
    let xa = Netns::named(&sim.pod_netns("x/a").unwrap());
    // The node renders the steering and the domain rule's timed sets.
    let node_name = sim.snapshot().pod_by_name(&testkit::pod_ref("y/a")).and_then(|p| p.node.clone()).unwrap();
    let node = Netns::named(&sim.node_netns(&node_name).unwrap());
    let table =
        netns::run_in(&node, || std::process::Command::new("nft").args(["list", "table", "inet", "flock"]).output().unwrap()).unwrap();
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(table.contains("chain dns-steer") && table.contains("tproxy ip to 127.0.0.1:15053"), "{table}");
    assert!(table.contains("flags timeout"), "{table}");

    // Not reachable before the name is resolved; other names teach nothing.
    assert!(!connects(&ya, fam.web), "reachable before resolving");
    assert_eq!(resolve(fam, &ya, "other.test"), Some(vec![fam.other.parse().unwrap()]));
    assert!(!connects(&ya, fam.other), "a name no rule names admits nothing");
    // Resolved (through a CNAME): reachable right away.
    assert_eq!(resolve(fam, &ya, "www.example.test"), Some(vec![fam.web.parse().unwrap()]));
    assert!(connects(&ya, fam.web), "not reachable right after the answer");
    // A sync (a pod relabelled) keeps what was learned.
    sim.apply(|s| {
        let mut p = s.pod_by_name(&testkit::pod_ref("y/b")).cloned().unwrap();
        p.labels.insert("touched", "1");
        s.upsert_pod(p);
    })
    .await
    .unwrap();
    assert!(connects(&ya, fam.web), "learned address lost by a sync");
    // After the TTL: closed again.
    std::thread::sleep(Duration::from_millis(3500));
    assert!(!connects(&ya, fam.web), "reachable after the TTL");

    // x/a's policy does not admit DNS: its query is dropped as without the proxy, and it
    // learns nothing.
    assert_eq!(resolve(fam, &xa, "api.example.test"), None, "a pod whose policy denies DNS got an answer");
    assert!(!connects(&xa, fam.web));

    // A NetworkPolicy's flock.dev/egress-domains: one more egress allow of that policy, by name
    // (only the exact name it lists).
    let za = Netns::named(&sim.pod_netns("z/a").unwrap());
    assert!(!connects(&za, fam.web));
    assert_eq!(resolve(fam, &za, "www.example.test"), Some(vec![fam.web.parse().unwrap()]));
    assert!(!connects(&za, fam.web), "www.example.test is not api.example.test");
    assert_eq!(resolve(fam, &za, "api.example.test"), Some(vec![fam.web.parse().unwrap()]));
    assert!(connects(&za, fam.web), "not reachable after resolving the annotated name");
    assert!(!connects(&za, fam.other));

    stop_dns.send(true).unwrap();
    dns_thread.join().unwrap();
    sim.teardown().await.unwrap();
}
