//! What a DNS answer teaches: the addresses the asked name resolves to, and for how long.
//! Pure: the pod's query and the resolver's response, as bytes, in; a [`Learned`] or the
//! reason it teaches nothing out. Parsing is hickory-proto's, never by hand.
//!
//! Only a response that answers this query teaches: same id, a response, exactly one
//! question equal to the query's (name case-insensitively, type, class), not truncated,
//! `NOERROR`. From the asked name, CNAME records are followed through the answer section
//! (each step to a name not seen before, at most [`Limits::max_chain`] steps); the records of
//! the asked type (A or AAAA: any other question teaches nothing) owned by a name on that
//! chain are learned, each valid for the smallest TTL along
//! its path, then raised to the floor and cut to the cap. Records of other owners are
//! ignored: a response cannot teach addresses for a name the pod did not ask for. Anything
//! unusable — malformed, truncated, a compression-pointer loop, oversized — is reported as
//! [`Unusable`] (the caller passes the response on unchanged and counts it); nothing here
//! panics on any input.

use std::collections::BTreeSet;
use std::net::IpAddr;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

/// Bounds on what one answer teaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// TTLs below this are raised to it (seconds).
    pub min_ttl: u32,
    /// TTLs above this are cut to it (seconds).
    pub max_ttl: u32,
    /// At most this many addresses per answer (the rest are counted, not learned).
    pub max_addresses: usize,
    /// At most this many CNAME steps from the asked name.
    pub max_chain: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { min_ttl: 30, max_ttl: 24 * 3600, max_addresses: 1024, max_chain: 16 }
    }
}

/// The largest DNS message (TCP's two-byte length; UDP payloads are smaller).
pub(crate) const MAX_MESSAGE: usize = 65_535;

/// What an answer teaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Learned {
    /// The name the pod asked for: lowercase, no trailing dot.
    pub name: String,
    /// The CNAME targets followed from it, in order (lowercase, no trailing dot).
    pub chain: Vec<String>,
    /// Each address and how long it stays admitted (seconds, within the limits), sorted.
    pub addresses: Vec<(IpAddr, u32)>,
    /// Addresses beyond [`Limits::max_addresses`], not learned.
    pub dropped: usize,
}

/// Why an answer teaches nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    #[error("the query is not a DNS message: {0}")]
    BadQuery(String),
    #[error("the response is not a DNS message: {0}")]
    Malformed(String),
    #[error("the response is {0} bytes, more than a DNS message can be")]
    Oversized(usize),
    #[error("not a response")]
    NotAResponse,
    #[error("the response's id {got} is not the query's {want}")]
    OtherId { want: u16, got: u16 },
    #[error("the response has {0} questions, not one")]
    Questions(usize),
    #[error("the response answers another question ({0})")]
    OtherQuestion(String),
    #[error("the response is truncated (the client retries over TCP)")]
    Truncated,
    #[error("the response's code is {0}")]
    Code(String),
    #[error("the CNAME chain from {0} is longer than {1} steps")]
    LongChain(String, usize),
    #[error("a {0} question: only A and AAAA answers teach addresses")]
    NotAnAddressQuestion(String),
}

/// A name as [`Learned`] writes it: lowercase, without the trailing dot (the root stays `.`).
pub(crate) fn text(name: &Name) -> String {
    let mut s = name.to_ascii().to_ascii_lowercase();
    if s.len() > 1 && s.ends_with('.') {
        s.pop();
    }
    s
}

/// The start of a response to `query`: its id, opcode, recursion-desired flag and question;
/// the caller sets the code, flags and records.
pub fn response_to(query: &Message) -> Message {
    let mut r = Message::new();
    r.set_id(query.id());
    r.set_message_type(MessageType::Response);
    r.set_op_code(query.op_code());
    r.set_recursion_desired(query.recursion_desired());
    r.add_queries(query.queries().iter().cloned());
    r
}

/// What `response` teaches as the answer to `query`.
pub fn learn(query: &[u8], response: &[u8], limits: &Limits) -> Result<Learned, Unusable> {
    if response.len() > MAX_MESSAGE {
        return Err(Unusable::Oversized(response.len()));
    }
    let q = Message::from_vec(query).map_err(|e| Unusable::BadQuery(e.to_string()))?;
    let r = Message::from_vec(response).map_err(|e| Unusable::Malformed(e.to_string()))?;
    if r.message_type() != MessageType::Response {
        return Err(Unusable::NotAResponse);
    }
    if r.id() != q.id() {
        return Err(Unusable::OtherId { want: q.id(), got: r.id() });
    }
    let [asked] = q.queries() else { return Err(Unusable::BadQuery(format!("{} questions", q.queries().len()))) };
    let [answered] = r.queries() else { return Err(Unusable::Questions(r.queries().len())) };
    if answered.name() != asked.name() || answered.query_type() != asked.query_type() || answered.query_class() != asked.query_class() {
        return Err(Unusable::OtherQuestion(format!("{} {}", answered.name(), answered.query_type())));
    }
    if r.truncated() {
        return Err(Unusable::Truncated);
    }
    if r.response_code() != ResponseCode::NoError {
        return Err(Unusable::Code(r.response_code().to_string()));
    }
    // Only the records of the asked type teach: an A record in the answer to a TXT (or AAAA)
    // question is something the pod did not ask for.
    let asked_type = asked.query_type();
    if asked_type != RecordType::A && asked_type != RecordType::AAAA {
        return Err(Unusable::NotAnAddressQuestion(asked_type.to_string()));
    }

    // The chain: from the asked name through CNAMEs, each name once, with the smallest TTL
    // so far (a CNAME's validity bounds what it leads to).
    let mut chain: Vec<(Name, u32)> = vec![(asked.name().clone(), u32::MAX)];
    let mut seen: BTreeSet<String> = BTreeSet::from([text(asked.name())]);
    while let Some((current, ttl)) = chain.last().cloned() {
        let next = r.answers().iter().find_map(|rec| match rec.data() {
            RData::CNAME(target) if *rec.name() == current => Some((target.0.clone(), rec.ttl())),
            _ => None,
        });
        let Some((target, step_ttl)) = next else { break };
        if !seen.insert(text(&target)) {
            // A loop: stop where it closes (the names so far stand).
            break;
        }
        if chain.len() > limits.max_chain {
            return Err(Unusable::LongChain(text(asked.name()), limits.max_chain));
        }
        chain.push((target, ttl.min(step_ttl)));
    }

    let mut addresses: Vec<(IpAddr, u32)> = Vec::new();
    let mut dropped = 0;
    for rec in r.answers() {
        let addr = match rec.data() {
            RData::A(a) if asked_type == RecordType::A => IpAddr::V4(a.0),
            RData::AAAA(a) if asked_type == RecordType::AAAA => IpAddr::V6(a.0),
            _ => continue,
        };
        let Some((_, chain_ttl)) = chain.iter().find(|(n, _)| n == rec.name()) else { continue };
        let ttl = rec.ttl().min(*chain_ttl).clamp(limits.min_ttl, limits.max_ttl.max(limits.min_ttl));
        if let Some(known) = addresses.iter_mut().find(|(a, _)| *a == addr) {
            known.1 = known.1.max(ttl);
            continue;
        }
        if addresses.len() >= limits.max_addresses {
            dropped += 1;
            continue;
        }
        addresses.push((addr, ttl));
    }
    addresses.sort();
    Ok(Learned { name: text(asked.name()), chain: chain.iter().skip(1).map(|(n, _)| text(n)).collect(), addresses, dropped })
}

#[cfg(test)]
pub(crate) mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::str::FromStr;

    use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
    use hickory_proto::rr::rdata::{A, AAAA, CNAME, TXT};
    use hickory_proto::rr::{Name, RData, Record, RecordType};

    use super::*;

    pub(crate) fn query(id: u16, name: &str, t: RecordType) -> Message {
        let mut m = Message::new();
        m.set_id(id).set_message_type(MessageType::Query).set_op_code(OpCode::Query).set_recursion_desired(true);
        m.add_query(Query::query(Name::from_str(name).unwrap(), t));
        m
    }

    pub(crate) fn response(q: &Message, answers: Vec<Record>) -> Message {
        let mut m = Message::new();
        m.set_id(q.id()).set_message_type(MessageType::Response).set_op_code(OpCode::Query).set_response_code(ResponseCode::NoError);
        m.add_queries(q.queries().to_vec());
        m.add_answers(answers);
        m
    }

    fn rec(name: &str, ttl: u32, data: RData) -> Record {
        Record::from_rdata(Name::from_str(name).unwrap(), ttl, data)
    }

    fn a(name: &str, ttl: u32, ip: [u8; 4]) -> Record {
        rec(name, ttl, RData::A(A(Ipv4Addr::from(ip))))
    }

    fn cname(name: &str, ttl: u32, target: &str) -> Record {
        rec(name, ttl, RData::CNAME(CNAME(Name::from_str(target).unwrap())))
    }

    fn run(q: &Message, r: &Message) -> Result<Learned, Unusable> {
        learn(&q.to_vec().unwrap(), &r.to_vec().unwrap(), &Limits { min_ttl: 5, max_ttl: 3600, ..Limits::default() })
    }

    #[test]
    fn addresses_of_the_asked_name_with_their_ttls() {
        let q = query(7, "GitHub.com.", RecordType::A);
        let r = response(
            &q,
            vec![a("github.com.", 60, [198, 18, 7, 1]), a("github.com.", 2, [198, 18, 7, 2]), a("other.com.", 60, [198, 18, 7, 3])],
        );
        let got = run(&q, &r).unwrap();
        assert_eq!(got.name, "github.com");
        assert!(got.chain.is_empty());
        // The floor raises 2 s to 5 s; another owner's record teaches nothing.
        assert_eq!(got.addresses, vec![(IpAddr::from([198, 18, 7, 1]), 60), (IpAddr::from([198, 18, 7, 2]), 5)]);
    }

    #[test]
    fn cname_chains_are_followed_and_bound_the_ttl() {
        let q = query(9, "www.example.com.", RecordType::AAAA);
        let v6 = Ipv6Addr::from_str("2001:db8::9").unwrap();
        let r = response(
            &q,
            vec![
                cname("www.example.com.", 30, "edge.cdn.example.net."),
                cname("edge.cdn.example.net.", 300, "pop7.cdn.example.net."),
                rec("pop7.cdn.example.net.", 9999, RData::AAAA(AAAA(v6))),
                rec("pop7.cdn.example.net.", 9999, RData::TXT(TXT::new(vec!["x".into()]))),
            ],
        );
        let got = run(&q, &r).unwrap();
        assert_eq!(got.chain, ["edge.cdn.example.net", "pop7.cdn.example.net"]);
        assert_eq!(got.addresses, vec![(IpAddr::V6(v6), 30)], "the first CNAME's 30 s bounds it");
        // A loop stops where it closes.
        let r = response(&q, vec![cname("www.example.com.", 30, "b.example.com."), cname("b.example.com.", 30, "www.example.com.")]);
        let got = run(&q, &r).unwrap();
        assert_eq!((got.chain.len(), got.addresses.len()), (1, 0));
        // Too long a chain teaches nothing.
        let mut records = Vec::new();
        for i in 0..20 {
            let from = if i == 0 { "www.example.com.".to_string() } else { format!("c{i}.example.com.") };
            records.push(cname(&from, 30, &format!("c{}.example.com.", i + 1)));
        }
        assert!(matches!(run(&q, &response(&q, records)), Err(Unusable::LongChain(..))));
    }

    #[test]
    fn many_addresses_only_of_the_asked_type() {
        let q = query(1, "many.example.com.", RecordType::A);
        let mut records: Vec<Record> = (0..150u8).map(|i| a("many.example.com.", 60, [198, 18, 9, i])).collect();
        records
            .extend((0..150u16).map(|i| rec("many.example.com.", 60, RData::AAAA(AAAA(Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, i))))));
        let got = run(&q, &response(&q, records.clone())).unwrap();
        assert_eq!((got.addresses.len(), got.dropped), (150, 0), "the AAAA records answer no A question");
        assert!(got.addresses.iter().all(|(a, _)| a.is_ipv4()));
        let capped = learn(
            &q.to_vec().unwrap(),
            &response(&q, records.clone()).to_vec().unwrap(),
            &Limits { max_addresses: 100, ..Limits::default() },
        )
        .unwrap();
        assert_eq!((capped.addresses.len(), capped.dropped), (100, 50));
        let q6 = query(1, "many.example.com.", RecordType::AAAA);
        let got = run(&q6, &response(&q6, records)).unwrap();
        assert_eq!(got.addresses.len(), 150);
        assert!(got.addresses.iter().all(|(a, _)| a.is_ipv6()));
    }

    /// The attack: a TXT question (a cache miss, slow) whose "answer" carries an A record of
    /// the asked name teaches nothing.
    #[test]
    fn only_address_questions_teach() {
        let q = query(2, "allowed.example.com.", RecordType::TXT);
        let r = response(&q, vec![a("allowed.example.com.", 3600, [198, 18, 66, 6])]);
        assert_eq!(run(&q, &r), Err(Unusable::NotAnAddressQuestion("TXT".into())));
    }

    #[test]
    fn answers_to_something_else_teach_nothing() {
        let q = query(3, "a.example.com.", RecordType::A);
        let good = response(&q, vec![a("a.example.com.", 60, [198, 18, 1, 1])]);
        let mut other_id = good.clone();
        other_id.set_id(4);
        assert!(matches!(run(&q, &other_id), Err(Unusable::OtherId { .. })));
        let mut not_response = good.clone();
        not_response.set_message_type(MessageType::Query);
        assert_eq!(run(&q, &not_response), Err(Unusable::NotAResponse));
        let other_question = response(&query(3, "b.example.com.", RecordType::A), vec![a("a.example.com.", 60, [198, 18, 1, 1])]);
        assert!(matches!(run(&q, &other_question), Err(Unusable::OtherQuestion(_))));
        let mut truncated = good.clone();
        truncated.set_truncated(true);
        assert_eq!(run(&q, &truncated), Err(Unusable::Truncated));
        let mut nx = good.clone();
        nx.set_response_code(ResponseCode::NXDomain);
        assert!(matches!(run(&q, &nx), Err(Unusable::Code(_))));
        assert!(run(&q, &good).is_ok());
    }

    #[test]
    fn malformed_bytes_never_panic() {
        let q = query(5, "a.example.com.", RecordType::A);
        let good = response(&q, vec![a("a.example.com.", 60, [198, 18, 1, 1])]).to_vec().unwrap();
        let qb = q.to_vec().unwrap();
        let limits = Limits::default();
        // Every truncation of a good answer.
        for n in 0..good.len() {
            assert!(learn(&qb, &good[..n], &limits).is_err(), "{n} bytes");
        }
        // A compression pointer to itself, in the answer's owner name.
        let mut looped = good.clone();
        let at = 12 + qb.len() - 12; // the answer's name starts right after the question
        looped[at] = 0xc0;
        looped[at + 1] = u8::try_from(at).unwrap();
        assert!(learn(&qb, &looped, &limits).is_err());
        assert!(matches!(learn(&qb, &vec![0u8; MAX_MESSAGE + 1], &limits), Err(Unusable::Oversized(_))));
        assert!(learn(&qb, b"", &limits).is_err());
        assert!(learn(b"\x00", &good, &limits).is_err());
    }
}
