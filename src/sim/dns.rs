//! flock's own small authoritative DNS server for the simulated cluster (the conformance
//! format's case-level `dns` records) and the DNS proxy's tests: a fixed zone of A/AAAA and
//! CNAME records served over UDP and TCP, encoded with hickory-proto.
//!
//! A question is answered from the zone: the CNAME chain from the asked name (each record in
//! the answer section), then the A or AAAA records of the chain's last name; a name with no
//! record at all is NXDOMAIN, a name with records of other types only is NOERROR and empty.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::IpAddr;
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{Name, RData, Record as HRecord, RecordType};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::watch;

use crate::agent::dns_proxy::{read_message, write_message};
use crate::dns::answer::MAX_MESSAGE;
use crate::dns::response_to;

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
#[derive(Debug, Clone, Default)]
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

    /// The answer to `query`, or None when it is not a DNS query at all (dropped, as a
    /// server would).
    pub fn answer(&self, query: &[u8]) -> Option<Vec<u8>> {
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
pub async fn serve(zone: Arc<Zone>, udp: UdpSocket, tcp: TcpListener, stop: watch::Receiver<bool>) {
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
            if let Some(answer) = udp_zone.answer(&buf[..n]) {
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
}
