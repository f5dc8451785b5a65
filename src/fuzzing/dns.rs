//! Target `dns_answer`: a resolver's response, any bytes, to one of a few queries — what the
//! agent's DNS proxy will hand [`crate::dns::learn`]. It never panics, and whatever it teaches
//! is in the response: the asked name, a chain within the limit, and every address an A or
//! AAAA record of the answer section owned by the asked name or a name on the chain, its TTL
//! within the floor and cap, no more addresses than the cap.

use std::net::IpAddr;
use std::str::FromStr;

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RData, Record, RecordType};

use crate::dns::{self, Limits};

/// The queries an input answers (its first byte picks one).
const QUERIES: [(&str, RecordType); 4] = [
    ("a.example.com", RecordType::A),
    ("www.example.com", RecordType::AAAA),
    ("files.pypi.org", RecordType::A),
    ("GitHub.com", RecordType::AAAA),
];

const ID: u16 = 0x2a2a;

const LIMITS: Limits = Limits { min_ttl: 5, max_ttl: 600, max_addresses: 64, max_chain: 8 };

/// The query `pick` selects, as bytes (`None` only if hickory cannot encode it).
pub fn query(pick: u8) -> Option<Vec<u8>> {
    let (name, t) = QUERIES[usize::from(pick) % QUERIES.len()];
    let mut m = Message::new();
    m.set_id(ID).set_message_type(MessageType::Query).set_op_code(OpCode::Query).set_recursion_desired(true);
    m.add_query(Query::query(Name::from_str(name).ok()?, t));
    m.to_vec().ok()
}

/// Target `dns_answer`: see the module doc. Returns no ruleset (nothing to load with nft).
#[allow(clippy::panic)]
pub fn dns_answer(data: &[u8]) -> Vec<String> {
    let Some((&pick, response)) = data.split_first() else { return Vec::new() };
    let Some(q) = query(pick) else { panic!("query {pick} cannot be encoded") };
    let Ok(learned) = dns::learn(&q, response, &LIMITS) else { return Vec::new() };
    let asked = QUERIES[usize::from(pick) % QUERIES.len()].0.to_ascii_lowercase();
    assert_eq!(learned.name, asked);
    assert!(learned.chain.len() <= LIMITS.max_chain, "{learned:?}");
    assert!(learned.addresses.len() <= LIMITS.max_addresses, "{learned:?}");
    let Ok(msg) = Message::from_vec(response) else { panic!("learn took a response that does not parse") };
    let owners: Vec<&str> = std::iter::once(asked.as_str()).chain(learned.chain.iter().map(String::as_str)).collect();
    for (addr, ttl) in &learned.addresses {
        assert!((LIMITS.min_ttl..=LIMITS.max_ttl).contains(ttl), "{addr}: ttl {ttl}");
        let found = msg.answers().iter().any(|r| {
            let ip = match r.data() {
                RData::A(a) => IpAddr::V4(a.0),
                RData::AAAA(a) => IpAddr::V6(a.0),
                _ => return false,
            };
            ip == *addr && owners.contains(&dns::answer::text(r.name()).as_str())
        });
        assert!(found, "{addr} was learned but no A/AAAA record of {owners:?} holds it");
    }
    Vec::new()
}

/// Seeds: a valid answer to each query (an address, a CNAME chain, several addresses).
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (pick, (name, t)) in QUERIES.iter().enumerate() {
        let Ok(pick) = u8::try_from(pick) else { continue };
        let (Ok(asked), Ok(target)) = (Name::from_str(&format!("{name}.")), Name::from_str("edge.cdn.example.net.")) else { continue };
        let data = |i: u8| match t {
            RecordType::A => RData::A(hickory_proto::rr::rdata::A(std::net::Ipv4Addr::new(198, 18, 5, i))),
            _ => RData::AAAA(hickory_proto::rr::rdata::AAAA(std::net::Ipv6Addr::new(0x2001, 0xdb8, 5, 0, 0, 0, 0, u16::from(i)))),
        };
        let answers = vec![
            vec![Record::from_rdata(asked.clone(), 60, data(1))],
            vec![
                Record::from_rdata(asked.clone(), 30, RData::CNAME(hickory_proto::rr::rdata::CNAME(target.clone()))),
                Record::from_rdata(target.clone(), 300, data(2)),
                Record::from_rdata(target.clone(), 300, data(3)),
            ],
        ];
        for (i, records) in answers.into_iter().enumerate() {
            let mut m = Message::new();
            m.set_id(ID).set_message_type(MessageType::Response).set_op_code(OpCode::Query);
            m.add_query(Query::query(asked.clone(), *t));
            m.add_answers(records);
            if let Ok(bytes) = m.to_vec() {
                out.push((format!("seed-{pick}-{i}"), [&[pick][..], &bytes].concat()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_seed_teaches() {
        let seeds = seeds();
        assert_eq!(seeds.len(), 8);
        for (name, data) in seeds {
            let q = query(data[0]).unwrap();
            let learned = dns::learn(&q, &data[1..], &LIMITS).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!learned.addresses.is_empty(), "{name}");
            dns_answer(&data);
        }
    }

    /// Found by the fuzzer: a CNAME to the root name; the check named the root differently
    /// from what `learn` reports.
    #[test]
    fn a_chain_through_the_root_name_is_checked_alike() {
        let asked = Name::from_str("a.example.com.").unwrap();
        let mut m = Message::new();
        m.set_id(ID).set_message_type(MessageType::Response).set_op_code(OpCode::Query);
        m.add_query(Query::query(asked.clone(), RecordType::A));
        m.add_answers(vec![
            Record::from_rdata(asked, 30, RData::CNAME(hickory_proto::rr::rdata::CNAME(Name::root()))),
            Record::from_rdata(Name::root(), 30, RData::A(hickory_proto::rr::rdata::A(std::net::Ipv4Addr::new(198, 18, 5, 2)))),
        ]);
        let data = [&[0u8][..], &m.to_vec().unwrap()].concat();
        let learned = dns::learn(&query(0).unwrap(), &data[1..], &LIMITS).unwrap();
        assert_eq!(learned.chain, ["."]);
        dns_answer(&data);
    }
}
