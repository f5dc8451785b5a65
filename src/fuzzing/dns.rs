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
pub(crate) fn query(pick: u8) -> Option<Vec<u8>> {
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
    let asked_type = QUERIES[usize::from(pick) % QUERIES.len()].1;
    for (addr, ttl) in &learned.addresses {
        assert!((LIMITS.min_ttl..=LIMITS.max_ttl).contains(ttl), "{addr}: ttl {ttl}");
        // Only records of the asked type teach.
        let found = msg.answers().iter().any(|r| {
            let ip = match r.data() {
                RData::A(a) if asked_type == RecordType::A => IpAddr::V4(a.0),
                RData::AAAA(a) if asked_type == RecordType::AAAA => IpAddr::V6(a.0),
                _ => return false,
            };
            ip == *addr && owners.contains(&dns::answer::text(r.name()).as_str())
        });
        assert!(found, "{addr} was learned but no A/AAAA record of {owners:?} holds it");
    }
    Vec::new()
}

/// Target `dns_exchange`: the proxy's rewriting of a pod's query and its matching of an
/// answer ([`crate::dns::exchange`]) on any bytes. The input is an id and case pattern for
/// the upstream query, a pod's query (one of [`QUERIES`], or the input's own bytes) and an
/// answer (any bytes, or the input's bytes over the true answer to the rewritten query). It
/// never panics, and: the rewritten query differs from the pod's in its id and the case of
/// its name's letters only; an accepted answer carries the upstream id and the upstream
/// question byte for byte, and the pod gets it with only those bytes changed back to its own;
/// the same answer with the pod's id (what a forger in the pod knows) is refused unless that
/// id is the upstream one.
#[allow(clippy::panic)]
pub fn dns_exchange(data: &[u8]) -> Vec<String> {
    use crate::dns::exchange::{Mismatch, prepare};
    let [id0, id1, c0, c1, c2, c3, mode, rest @ ..] = data else { return Vec::new() };
    let id = u16::from_be_bytes([*id0, *id1]);
    let case = u64::from(u32::from_be_bytes([*c0, *c1, *c2, *c3]));
    // The pod's query: one of the fixed ones (most inputs), or bytes of the input.
    let (query, rest) = if mode & 1 == 0 {
        let Some(q) = self::query(*mode >> 1) else { panic!("query {mode} cannot be encoded") };
        (q, rest)
    } else {
        let split = usize::from(mode >> 1).min(rest.len());
        (rest[..split].to_vec(), &rest[split..])
    };
    let Ok((up, out)) = prepare(&query, id, (mode & 2 == 0).then_some(case)) else { return Vec::new() };
    assert_eq!(up.len(), query.len());
    assert_eq!(out.id(), id);
    assert_eq!(&up[0..2], &id.to_be_bytes());
    for (i, (a, b)) in query.iter().zip(&up).enumerate().skip(2) {
        assert!(a == b || (a.is_ascii_alphabetic() && a.eq_ignore_ascii_case(b)), "byte {i}: {a:#x} became {b:#x}");
    }
    // The answer: arbitrary bytes, or the true answer to `up` with the input written over it.
    let answer = if mode & 4 == 0 {
        rest.to_vec()
    } else {
        let mut a = up.clone();
        a[2] |= 0x80;
        for (i, b) in rest.iter().enumerate() {
            let at = 12 + out_question_len(&up) + i;
            if at < a.len() {
                a[at] = *b;
            } else {
                a.push(*b);
            }
        }
        a
    };
    if let Ok(back) = out.accept(&answer) {
        {
            assert_eq!(back.len(), answer.len());
            assert_eq!(&answer[0..2], &id.to_be_bytes(), "accepted another id");
            let q = 12..12 + out_question_len(&up);
            assert_eq!(answer[q.clone()], up[q.clone()], "accepted another question");
            assert_eq!(&back[0..2], &query[0..2], "the pod's id is not given back");
            assert_eq!(back[q.clone()], query[q.clone()], "the pod's question is not given back");
            assert_eq!(back[2..q.start], answer[2..q.start]);
            assert_eq!(back[q.end..], answer[q.end..]);
            // The forger's guess: the pod's own id.
            let mut forged = answer.clone();
            forged[0..2].copy_from_slice(&query[0..2]);
            if query[0..2] != id.to_be_bytes() {
                assert_eq!(out.accept(&forged), Err(Mismatch::Id));
            }
        }
    }
    Vec::new()
}

/// The length of the question section of a query `prepare` took (a name without pointers,
/// then type and class).
fn out_question_len(msg: &[u8]) -> usize {
    let mut at = 12;
    while let Some(&len) = msg.get(at) {
        at += 1 + usize::from(len);
        if len == 0 {
            break;
        }
    }
    at + 4 - 12
}

/// Seeds for `dns_exchange`: each fixed query with the true answer and with arbitrary bytes.
pub fn exchange_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for pick in 0..QUERIES.len() as u8 {
        // id 0xbeef, case bits, mode: query `pick`, random case, true answer (bit 2).
        out.push((format!("seed-true-{pick}"), vec![0xbe, 0xef, 0x5a, 0xa5, 0x0f, 0xf0, (pick << 1) | 4, 0, 1, 0, 0, 0, 0, 0, 0]));
        out.push((format!("seed-bytes-{pick}"), vec![0x12, 0x34, 0, 0, 0, 0, pick << 1, 0x12, 0x34, 0x81, 0x80, 0, 1]));
    }
    out
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
    fn exchange_seeds_are_accepted_or_refused_without_panics() {
        use crate::dns::exchange::prepare;
        let seeds = exchange_seeds();
        assert_eq!(seeds.len(), 2 * QUERIES.len());
        for (_, data) in &seeds {
            dns_exchange(data);
        }
        // The true-answer seeds reach `accept`'s success path.
        let (_, data) = &seeds[0];
        let q = query(data[6] >> 1).unwrap();
        let (up, out) = prepare(&q, 0xbeef, Some(0x5aa5_0ff0)).unwrap();
        let mut answer = up.clone();
        answer[2] |= 0x80;
        assert!(out.accept(&answer).is_ok());
    }

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
