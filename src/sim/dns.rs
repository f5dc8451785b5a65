//! flock's own small authoritative DNS server for the simulated cluster (the conformance
//! format's case-level `dns` records) and the DNS proxy's tests: a fixed zone of A/AAAA and
//! CNAME records served over UDP and TCP, encoded with hickory-proto.
//!
//! A question is answered from the zone: the CNAME chain from the asked name (each record in
//! the answer section), then the A or AAAA records of the chain's last name; a name with no
//! record at all is NXDOMAIN, a name with records of other types only is NOERROR and empty.
//! Over UDP, an answer larger than the query allows (512 bytes, or its EDNS payload size) is
//! sent truncated (TC, no records), so that clients ask again over TCP, as real servers do.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{Name, RData, Record as HRecord, RecordType};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::watch;

use crate::conformance::{DnsSpec, RecordData as CaseData};
use crate::dns::answer::MAX_MESSAGE;
use crate::dns::response_to;
use crate::dns_proxy::proxy::{read_message, write_message};
use crate::model::Snapshot;
use crate::netns::{self, Netns};

/// What a name resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordData {
    Address(IpAddr),
    Cname(String),
}

/// One record of the zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub name: String,
    pub ttl: u32,
    pub data: RecordData,
}

/// The records a server answers from, by name (lowercase, no trailing dot).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Zone {
    by_name: BTreeMap<String, Vec<Record>>,
}

fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

fn fqdn(name: &str) -> Result<Name, String> {
    let mut n = Name::from_ascii(name).map_err(|e| format!("{name:?}: {e}"))?;
    n.set_fqdn(true);
    Ok(n)
}

impl Zone {
    pub fn new(records: Vec<Record>) -> Self {
        let mut by_name: BTreeMap<String, Vec<Record>> = BTreeMap::new();
        for r in records {
            by_name.entry(key(&r.name)).or_default().push(r);
        }
        Self { by_name }
    }

    /// The zone of a conformance case's `dns` on `snapshot`: a record naming a pod answers
    /// with the addresses the pod has now (before the record's fixed ones).
    pub(crate) fn for_case(spec: &DnsSpec, snapshot: &Snapshot) -> Self {
        let mut records = Vec::new();
        for r in &spec.records {
            let rec = |data| Record { name: r.name.clone(), ttl: r.ttl, data };
            match &r.data {
                CaseData::Cname(target) => records.push(rec(RecordData::Cname(target.clone()))),
                CaseData::Addresses { pod, fixed } => {
                    let pod_ips = pod.as_ref().and_then(|p| snapshot.pod_by_name(p)).map(|p| p.ips.clone()).unwrap_or_default();
                    records.extend(pod_ips.into_iter().chain(fixed.iter().copied()).map(|a| rec(RecordData::Address(a))));
                }
            }
        }
        Self::new(records)
    }

    /// [`Self::answer`] for a UDP query: truncated (TC, no records) when it would not fit
    /// the query's payload size.
    pub(crate) fn answer_udp(&self, query: &[u8]) -> Option<Vec<u8>> {
        let answer = self.answer(query)?;
        let limit = Message::from_vec(query).map_or(512, |q| usize::from(q.max_payload()));
        if answer.len() <= limit {
            return Some(answer);
        }
        let mut r = Message::from_vec(&answer).ok()?;
        r.take_answers();
        r.set_truncated(true);
        r.to_vec().ok()
    }

    /// The answer to `query`, or None when it is not a DNS query at all (dropped, as a
    /// server would).
    pub(crate) fn answer(&self, query: &[u8]) -> Option<Vec<u8>> {
        let q = Message::from_vec(query).ok()?;
        if q.message_type() != MessageType::Query {
            return None;
        }
        let mut r = response_to(&q);
        r.set_authoritative(true);
        match q.queries() {
            [question] => match self.records_for(question.name(), question.query_type()) {
                Ok(Some(records)) => {
                    r.add_answers(records);
                }
                Ok(None) => {
                    r.set_response_code(ResponseCode::NXDomain);
                }
                Err(_) => {
                    r.set_response_code(ResponseCode::ServFail);
                }
            },
            _ => {
                r.set_response_code(ResponseCode::FormErr);
            }
        }
        r.to_vec().ok()
    }

    /// The answer records for `name` and `kind`: None when the zone knows nothing of the name.
    fn records_for(&self, name: &Name, kind: RecordType) -> Result<Option<Vec<HRecord>>, String> {
        let mut current = key(&name.to_ascii());
        let mut seen = BTreeSet::from([current.clone()]);
        let mut out = Vec::new();
        let mut known = false;
        loop {
            let owned: &[Record] = self.by_name.get(&current).map_or(&[], Vec::as_slice);
            known |= !owned.is_empty();
            let cname = owned.iter().find_map(|r| match &r.data {
                RecordData::Cname(target) => Some((r.ttl, target.clone())),
                RecordData::Address(_) => None,
            });
            if let Some((ttl, target)) = cname {
                out.push(HRecord::from_rdata(fqdn(&current)?, ttl, RData::CNAME(CNAME(fqdn(&target)?))));
                let next = key(&target);
                if !seen.insert(next.clone()) {
                    return Ok(Some(out));
                }
                current = next;
                continue;
            }
            for r in owned {
                let RecordData::Address(addr) = r.data else { continue };
                let rdata = match (addr, kind) {
                    (IpAddr::V4(a), RecordType::A) => RData::A(A(a)),
                    (IpAddr::V6(a), RecordType::AAAA) => RData::AAAA(AAAA(a)),
                    _ => continue,
                };
                out.push(HRecord::from_rdata(fqdn(&current)?, r.ttl, rdata));
            }
            return Ok(known.then_some(out));
        }
    }
}

/// Serves `zone` on `udp` and `tcp` until `stop` turns true (or its sender is gone).
pub(crate) async fn serve(zone: Arc<Zone>, udp: UdpSocket, tcp: TcpListener, stop: watch::Receiver<bool>) {
    let udp_zone = zone.clone();
    let mut udp_stop = stop.clone();
    let udp_task = async move {
        let mut buf = vec![0u8; MAX_MESSAGE];
        loop {
            let received = tokio::select! {
                r = udp.recv_from(&mut buf) => r,
                _ = udp_stop.wait_for(|s| *s) => return,
            };
            let Ok((n, from)) = received else { continue };
            if let Some(answer) = udp_zone.answer_udp(&buf[..n]) {
                let _ = udp.send_to(&answer, from).await;
            }
        }
    };
    let mut tcp_stop = stop.clone();
    let tcp_task = async move {
        loop {
            let accepted = tokio::select! {
                r = tcp.accept() => r,
                _ = tcp_stop.wait_for(|s| *s) => return,
            };
            let Ok((stream, _)) = accepted else { continue };
            tokio::spawn(serve_connection(zone.clone(), stream));
        }
    };
    tokio::join!(udp_task, tcp_task);
}

async fn serve_connection(zone: Arc<Zone>, mut s: TcpStream) -> io::Result<()> {
    while let Some(query) = read_message(&mut s).await? {
        let Some(answer) = zone.answer(&query) else { break };
        write_message(&mut s, &answer).await?;
    }
    Ok(())
}

/// A server of a zone on port 53 (UDP and TCP) of some addresses in a namespace, on its own
/// thread; stopped when dropped.
pub(crate) struct DnsServer {
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl DnsServer {
    /// Starts serving `zone` on `ips` in `ns`; returns once the sockets are bound.
    pub(crate) fn start(ns: Netns, ips: Vec<IpAddr>, zone: Zone) -> Result<Self, String> {
        let (stop, stop_rx) = watch::channel(false);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let desc = ns.describe();
        let thread = std::thread::Builder::new()
            .name("flock-sim-dns".into())
            .spawn(move || {
                let fail = ready_tx.clone();
                let served = netns::run_in(&ns, move || {
                    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = ready_tx.send(Err(format!("a runtime: {e}")));
                            return;
                        }
                    };
                    rt.block_on(async move {
                        let zone = Arc::new(zone);
                        let mut servers = tokio::task::JoinSet::new();
                        for ip in ips {
                            let bound = match (UdpSocket::bind((ip, 53)).await, TcpListener::bind((ip, 53)).await) {
                                (Ok(u), Ok(t)) => (u, t),
                                (Err(e), _) | (_, Err(e)) => {
                                    let _ = ready_tx.send(Err(format!("binding {ip} port 53: {e}")));
                                    return;
                                }
                            };
                            servers.spawn(serve(zone.clone(), bound.0, bound.1, stop_rx.clone()));
                        }
                        let _ = ready_tx.send(Ok(()));
                        while servers.join_next().await.is_some() {}
                    });
                });
                if let Err(e) = served {
                    let _ = fail.send(Err(e.to_string()));
                }
            })
            .map_err(|e| format!("a thread for DNS in {desc}: {e}"))?;
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => Ok(Self { stop, thread: Some(thread) }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(format!("DNS in {desc}: {e}"))
            }
            Err(_) => {
                // Stuck somewhere: told to stop should it ever start, and left (not joined).
                let _ = stop.send(true);
                Err(format!("DNS in {desc} did not start"))
            }
        }
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How many times a lookup sends its query over UDP before it gives up, waiting its timeout
/// for an answer after each: resolv.conf's default (`attempts:2`), as a pod's stub resolver
/// does. A datagram lost on the way (the proxy's upstream query included: it asks once)
/// costs a retry, not the answer; DNS that policy drops gets no answer to any attempt, and
/// reads as unresolved after them all.
pub(crate) const ATTEMPTS: usize = 2;

/// One lookup: `name`'s addresses of one family (A or AAAA) from the server at `server`,
/// over UDP, again over TCP when the answer is truncated, as a stub resolver does: the query
/// is sent up to [`ATTEMPTS`] times from one socket, each time waiting `timeout`, and an
/// answer to any of them counts. `None`: no usable answer; an empty list: the name has no
/// address of that family (NXDOMAIN included). Runs in the caller's namespace.
pub(crate) fn lookup(name: &str, v6: bool, server: std::net::SocketAddr, timeout: Duration) -> Option<Vec<IpAddr>> {
    lookup_tries(name, v6, server, timeout, ATTEMPTS)
}

fn lookup_tries(name: &str, v6: bool, server: std::net::SocketAddr, timeout: Duration, attempts: usize) -> Option<Vec<IpAddr>> {
    let kind = if v6 { RecordType::AAAA } else { RecordType::A };
    let mut q = Message::new();
    q.set_id(0x5eed);
    q.set_recursion_desired(true);
    q.add_query(hickory_proto::op::Query::query(fqdn(name).ok()?, kind));
    let query = q.to_vec().ok()?;
    let udp = || -> io::Result<Vec<u8>> {
        let s = std::net::UdpSocket::bind(if server.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" })?;
        s.connect(server)?;
        s.set_read_timeout(Some(timeout))?;
        let mut buf = vec![0u8; MAX_MESSAGE];
        let mut waited = io::Error::from(io::ErrorKind::TimedOut);
        for _ in 0..attempts.max(1) {
            s.send(&query)?;
            match s.recv(&mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    return Ok(buf);
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => waited = e,
                Err(e) => return Err(e),
            }
        }
        Err(waited)
    };
    let tcp = || -> io::Result<Vec<u8>> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect_timeout(&server, timeout)?;
        s.set_read_timeout(Some(timeout))?;
        let len = u16::try_from(query.len()).map_err(|_| io::Error::other("query too long"))?;
        s.write_all(&len.to_be_bytes())?;
        s.write_all(&query)?;
        let mut len = [0u8; 2];
        s.read_exact(&mut len)?;
        let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
        s.read_exact(&mut buf)?;
        Ok(buf)
    };
    let mut answer = Message::from_vec(&udp().ok()?).ok()?;
    if answer.truncated() {
        answer = Message::from_vec(&tcp().ok()?).ok()?;
    }
    if answer.id() != q.id() || answer.message_type() != MessageType::Response {
        return None;
    }
    Some(
        answer
            .answers()
            .iter()
            .filter_map(|r| match r.data() {
                RData::A(a) if !v6 => Some(IpAddr::V4(a.0)),
                RData::AAAA(a) if v6 => Some(IpAddr::V6(a.0)),
                _ => None,
            })
            .collect(),
    )
}

/// The name [`wait_answering`] asks: in no zone (`.invalid`), so the answer is NXDOMAIN.
const READINESS_NAME: &str = "readiness.flock-sim.invalid";

/// Waits until the DNS server on each of `ips` (port 53) answers a query sent from `from`
/// — any answer, NXDOMAIN included — asking again every 200 ms, for at most `timeout` in all:
/// what a kubelet's readiness probe of the server pod sees (from the pod's node, whose traffic
/// to its own pods no policy judges). Until then, the server's sockets may be bound while
/// queries cannot reach them yet (a new pod's link drops packets until the kernel has
/// activated it, `super::fabric::wait_link_up`).
pub(crate) fn wait_answering(from: &Netns, ips: &[IpAddr], timeout: Duration) -> Result<(), String> {
    const TRY: Duration = Duration::from_millis(200);
    let deadline = std::time::Instant::now() + timeout;
    let ips = ips.to_vec();
    let asked = netns::run_in(from, move || {
        for ip in ips {
            let server = std::net::SocketAddr::new(ip, 53);
            loop {
                let started = std::time::Instant::now();
                if lookup_tries(READINESS_NAME, ip.is_ipv6(), server, TRY, 1).is_some() {
                    break;
                }
                if std::time::Instant::now() >= deadline {
                    return Err(format!(
                        "its DNS server on {server} did not answer within {:.1}s (a query every {}ms)",
                        timeout.as_secs_f64(),
                        TRY.as_millis()
                    ));
                }
                // A refusal comes back at once: wait out the rest of the try.
                std::thread::sleep(TRY.saturating_sub(started.elapsed()));
            }
        }
        Ok(())
    });
    asked.map_err(|e| format!("cannot ask its DNS server from {}: {e}", from.describe()))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dns::{Limits, learn};
    use hickory_proto::op::Query;

    fn query(name: &str, kind: RecordType) -> Vec<u8> {
        let mut q = Message::new();
        q.set_id(7);
        q.set_recursion_desired(true);
        q.add_query(Query::query(fqdn(name).unwrap(), kind));
        q.to_vec().unwrap()
    }

    fn zone() -> Zone {
        let rec = |name: &str, ttl, data| Record { name: name.into(), ttl, data };
        Zone::new(vec![
            rec("api.example.test", 30, RecordData::Address("198.18.1.10".parse().unwrap())),
            rec("api.example.test", 30, RecordData::Address("2001:db8:1::10".parse().unwrap())),
            rec("www.example.test", 60, RecordData::Cname("API.example.test.".into())),
            rec("loop.example.test", 60, RecordData::Cname("loop.example.test".into())),
        ])
    }

    #[test]
    fn answers_follow_cnames_and_families() {
        let z = zone();
        let q = query("WWW.example.test", RecordType::A);
        let learned = learn(&q, &z.answer(&q).unwrap(), &Limits { min_ttl: 1, ..Limits::default() }).unwrap();
        assert_eq!(learned.chain, vec!["api.example.test".to_string()]);
        assert_eq!(learned.addresses, vec![("198.18.1.10".parse().unwrap(), 30)]);
        let q = query("api.example.test", RecordType::AAAA);
        let learned = learn(&q, &z.answer(&q).unwrap(), &Limits { min_ttl: 1, ..Limits::default() }).unwrap();
        assert_eq!(learned.addresses, vec![("2001:db8:1::10".parse().unwrap(), 30)]);
    }

    #[test]
    fn unknown_names_are_nxdomain_and_loops_end() {
        let z = zone();
        let r = Message::from_vec(&z.answer(&query("nope.example.test", RecordType::A)).unwrap()).unwrap();
        assert_eq!(r.response_code(), ResponseCode::NXDomain);
        let r = Message::from_vec(&z.answer(&query("loop.example.test", RecordType::A)).unwrap()).unwrap();
        assert_eq!(r.response_code(), ResponseCode::NoError);
        assert_eq!(r.answers().len(), 1);
        assert!(z.answer(b"garbage").is_none());
    }

    #[test]
    fn a_cases_zone_follows_its_pods_and_udp_answers_too_large_are_truncated() {
        let text = "name: x\ndns: {server: kube-system/dns, records: [\
                    {name: api.example.test, pod: z/a}, \
                    {name: many.example.test, pod: z/b, addresses: [198.18.3.2, 198.18.0.9]}, \
                    {name: big.example.test, addresses: [ADDRS]}, \
                    {name: gone.example.test, pod: q/q}]}\nsteps: []\n";
        let addrs: Vec<String> = (1..=60).map(|i| format!("198.18.4.{i}")).collect();
        let case = crate::conformance::parse_case(std::path::Path::new("c.yaml"), "", &text.replace("ADDRS", &addrs.join(", "))).unwrap();
        let z = Zone::for_case(case.dns.as_ref().unwrap(), &crate::testkit::base_cluster());
        let limits = Limits { min_ttl: 1, ..Limits::default() };
        let q = query("many.example.test", RecordType::A);
        let answer = z.answer(&q).unwrap();
        let got: Vec<IpAddr> = Message::from_vec(&answer)
            .unwrap()
            .answers()
            .iter()
            .filter_map(|r| match r.data() {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                _ => None,
            })
            .collect();
        let want: Vec<IpAddr> = ["198.18.2.32", "198.18.3.2", "198.18.0.9"].iter().map(|a| a.parse().unwrap()).collect();
        assert_eq!(got, want, "the pod's address first, then the fixed ones in order");
        assert!(learn(&q, &answer, &limits).unwrap().addresses.iter().all(|(_, ttl)| *ttl == crate::conformance::DEFAULT_TTL));
        // A pod the snapshot does not have answers nothing.
        let r = Message::from_vec(&z.answer(&query("gone.example.test", RecordType::A)).unwrap()).unwrap();
        assert_eq!(r.response_code(), ResponseCode::NXDomain);
        // Over UDP, 60 records do not fit 512 bytes: TC and no records; over TCP all of them.
        let q = query("big.example.test", RecordType::A);
        let udp = Message::from_vec(&z.answer_udp(&q).unwrap()).unwrap();
        assert!(udp.truncated() && udp.answers().is_empty());
        assert_eq!(Message::from_vec(&z.answer(&q).unwrap()).unwrap().answers().len(), 60);
        let small = Message::from_vec(&z.answer_udp(&query("api.example.test", RecordType::A)).unwrap()).unwrap();
        assert!(!small.truncated() && small.answers().len() == 1);
    }
}
