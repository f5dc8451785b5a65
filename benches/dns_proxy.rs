//! The DNS proxy under load (root: real network namespaces, tproxy and timed nft sets): a
//! client pod sends A queries at a fixed rate (default 1,000/s for 10 s, each for one of
//! 1,000 names a domain rule admits) through the node's proxy to flock's DNS server in a
//! resolver pod. Every answer teaches an address, written into the rule's timed set before the
//! answer goes on. Prints JSON: how long answers were held for the learner (`held_ms`: the
//! netlink batch into the set) and the client's query-to-answer latency through the proxy
//! (`answer_ms`), p50/p99/max, and how many queries were answered.
//!
//! `cargo bench --bench dns_proxy [-- RATE SECONDS]`. Under `cargo test` (no `--bench`
//! argument) it runs as a smoke test: 200 queries/s for one second, every one answered.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flock::dns::{DomainPattern, Learned};
use flock::dns_proxy::learner::{DomainLearner, DomainRule, KernelWriter};
use flock::dns_proxy::proxy::{DnsProxy, Learner, ProxyConfig};
use flock::netns;
use flock::sim::dns::{Record, RecordData, Zone};
use flock::testkit::kernel::{Node, redirect_dns, require_root, serve_dns, serve_dns_proxy};
use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{Name, RecordType};
use serde_json::json;

const PORT: u16 = 15353;
const NAMES: usize = 1000;

/// The domain learner, timed.
struct Timed {
    inner: DomainLearner<KernelWriter>,
    held: Mutex<Vec<Duration>>,
}

impl Learner for Timed {
    async fn learn(&self, client: IpAddr, resolver: SocketAddr, learned: &Learned) -> Result<(), flock::apply::netlink::NetlinkError> {
        let start = Instant::now();
        let r = self.inner.learn(client, resolver, learned).await;
        self.held.lock().unwrap().push(start.elapsed());
        r
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn summary(mut v: Vec<Duration>) -> serde_json::Value {
    v.sort();
    json!({
        "p50": percentile(&v, 0.50),
        "p99": percentile(&v, 0.99),
        "max": v.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0),
        "count": v.len(),
    })
}

fn name(i: usize) -> String {
    format!("h{i}.example.test")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bench = args.iter().any(|a| a == "--bench");
    let numbers: Vec<u64> = args.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (rate, seconds) = if bench { (numbers.first().copied().unwrap_or(1000), numbers.get(1).copied().unwrap_or(10)) } else { (200, 1) };
    if !require_root("bench dns_proxy") {
        return;
    }

    let node = Node::new("dnsb");
    let client_ip: IpAddr = "198.18.220.2".parse().unwrap();
    let client = node.add_pod("dnsbc", "vc-dnsb", &[client_ip]);
    let resolver_ip: IpAddr = "198.18.221.53".parse().unwrap();
    let resolver = node.add_pod("dnsbr", "vr-dnsb", &[resolver_ip]);
    node.ns.ip(&["addr", "add", "198.18.222.1/32", "dev", "uplink"]);
    redirect_dns(
        &node,
        "vc-dnsb",
        PORT,
        "set dom-b-v4 { type ipv4_addr; flags timeout; }\nset dom-b-v6 { type ipv6_addr; flags timeout; }",
    );

    // One address per name, as data only (nothing connects to them).
    let records = (0..NAMES)
        .map(|i| Record {
            name: name(i),
            ttl: 300,
            data: RecordData::Address(IpAddr::V4(Ipv4Addr::new(198, 19, (i / 256) as u8, (i % 256) as u8))),
        })
        .collect();
    let zone = Zone::new(records);
    let (stop_dns, dns_thread) = serve_dns(resolver.ns.netns(), vec![resolver_ip], zone);
    let inner = DomainLearner::new(KernelWriter::default());
    inner.set_rules(vec![DomainRule {
        source: "bench".into(),
        pods: [client_ip].into_iter().collect(),
        patterns: vec![DomainPattern::parse("*.example.test").unwrap()],
        set_v4: "dom-b-v4".into(),
        set_v6: "dom-b-v6".into(),
    }]);
    let learner = Arc::new(Timed { inner, held: Mutex::new(Vec::new()) });
    let mut config = ProxyConfig::new(PORT, vec![resolver_ip]);
    config.ipv6 = false;
    let proxy = DnsProxy::new(config, learner.clone());
    let stats = proxy.stats();
    let (stop_proxy, proxy_thread) = serve_dns_proxy(node.ns.netns(), proxy);

    // The client: one sender pacing queries, one receiver matching answers by id.
    let total = usize::try_from(rate * seconds).unwrap();
    let resolver_addr: SocketAddr = (resolver_ip, 53).into();
    let latencies = netns::run_in(&client.ns.netns(), move || {
        let sock = UdpSocket::bind("0.0.0.0:0").unwrap();
        sock.connect(resolver_addr).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let receiver = sock.try_clone().unwrap();
        let sent: Arc<Mutex<HashMap<u16, Instant>>> = Arc::default();
        let sent_by_receiver = sent.clone();
        let rx = std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut buf = [0u8; 4096];
            while out.len() < total {
                let Ok(n) = receiver.recv(&mut buf) else { break };
                let Ok(m) = Message::from_vec(&buf[..n]) else { continue };
                if let Some(at) = sent_by_receiver.lock().unwrap().remove(&m.id()) {
                    out.push(at.elapsed());
                }
            }
            out
        });
        let start = Instant::now();
        let interval = Duration::from_secs_f64(1.0 / rate as f64);
        for i in 0..total {
            let due = start + interval * u32::try_from(i).unwrap();
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let id = u16::try_from(i % 65_536).unwrap();
            let mut q = Message::new();
            q.set_id(id);
            q.set_recursion_desired(true);
            q.add_query(Query::query(Name::from_ascii(format!("{}.", name(i % NAMES))).unwrap(), RecordType::A));
            sent.lock().unwrap().insert(id, Instant::now());
            sock.send(&q.to_vec().unwrap()).unwrap();
        }
        rx.join().unwrap()
    })
    .unwrap();

    stop_proxy.send(true).unwrap();
    stop_dns.send(true).unwrap();
    proxy_thread.join().unwrap();
    dns_thread.join().unwrap();

    let held = learner.held.lock().unwrap().clone();
    let answered = latencies.len();
    let report = json!({
        "rate_per_s": rate,
        "seconds": seconds,
        "sent": total,
        "answered": answered,
        "learned": stats.learned.load(std::sync::atomic::Ordering::Relaxed),
        "held_ms": summary(held),
        "answer_ms": summary(latencies),
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    assert_eq!(answered, total, "queries without an answer");
}
