//! The DNS proxy's side of one exchange with a resolver, the part that needs no socket: a
//! pod's query checked and rewritten before it goes upstream, and an answer accepted only as
//! the answer to that rewritten query. Pure, so it is unit-tested and fuzzed (target
//! `dns_exchange`) on any bytes.
//!
//! The rewrite is what a careful stub resolver does against off-path forgery: the query leaves
//! with the proxy's own random id (never the pod's, which the pod knows) and, where the
//! resolver keeps it (DNS 0x20, draft-vixie-dnsext-dns0x20), the letters of the asked name in
//! a random case. An answer is accepted only when its id is that id and its question section
//! is the query's, byte for byte (so the case too); the pod then gets it with its own id and
//! its own question bytes back. The question's length does not change, so compression
//! pointers into it (answers point their owner names at offset 12) stay valid.
//!
//! Only standard queries with one question, no answer or authority records and a name without
//! compression pointers are proxied: anything else is refused ([`Refused`]) and never forwarded
//! (a stub resolver sends nothing else; an attacker's odd message is not worth the resolver's
//! time).

use std::ops::Range;

/// The DNS header's length.
const HEADER: usize = 12;
/// The longest name in wire form (RFC 1035).
const MAX_NAME: usize = 255;

/// Why a pod's query is not proxied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    #[error("shorter than a DNS header")]
    Short,
    #[error("a response, not a query")]
    Response,
    #[error("opcode {0}, not a standard query")]
    Opcode(u8),
    #[error("{0} questions, not one")]
    Questions(u16),
    #[error("answer or authority records in a query")]
    Records,
    #[error("the question's name is malformed (a compression pointer, a label past the end, or longer than 255 bytes)")]
    Name,
}

/// Why an answer is not the answer to the outstanding query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Mismatch {
    #[error("shorter than the query's header and question")]
    Short,
    #[error("not a response")]
    NotAResponse,
    #[error("another id")]
    Id,
    #[error("not exactly one question")]
    Questions,
    #[error("another question (name, case, type or class)")]
    Question,
}

/// A query sent upstream, waiting for its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outstanding {
    /// The pod's id and question bytes, given back with the answer.
    pod_id: [u8; 2],
    pod_question: Vec<u8>,
    /// What went upstream: the proxy's id and the question bytes (the name's case rewritten).
    id: [u8; 2],
    question: Vec<u8>,
    /// The asked type (`QTYPE`).
    pub(crate) qtype: u16,
}

/// The question section's bytes in `msg` (name, type, class), when the name is well formed and
/// uncompressed.
fn question(msg: &[u8]) -> Option<Range<usize>> {
    let mut at = HEADER;
    loop {
        let len = usize::from(*msg.get(at)?);
        if len == 0 {
            at += 1;
            break;
        }
        // 0b11xxxxxx is a pointer, 0b01/0b10 are reserved label types.
        if len > 63 {
            return None;
        }
        at += 1 + len;
        if at - HEADER > MAX_NAME {
            return None;
        }
    }
    let end = at + 4;
    (end <= msg.len() && at - HEADER <= MAX_NAME).then_some(HEADER..end)
}

fn u16_at(msg: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([msg[at], msg[at + 1]])
}

/// Checks a pod's `query` and rewrites it for the resolver: `id` as its id and, with
/// `case_bits`, the letters of the name flipped to upper case where the next bit is set
/// (`None`: the case as the pod wrote it). Returns the bytes to send and what the answer
/// must match.
pub(crate) fn prepare(query: &[u8], id: u16, case_bits: Option<u64>) -> Result<(Vec<u8>, Outstanding), Refused> {
    if query.len() < HEADER {
        return Err(Refused::Short);
    }
    if query[2] & 0x80 != 0 {
        return Err(Refused::Response);
    }
    let opcode = (query[2] >> 3) & 0x0f;
    if opcode != 0 {
        return Err(Refused::Opcode(opcode));
    }
    let qdcount = u16_at(query, 4);
    if qdcount != 1 {
        return Err(Refused::Questions(qdcount));
    }
    if u16_at(query, 6) != 0 || u16_at(query, 8) != 0 {
        return Err(Refused::Records);
    }
    let q = question(query).ok_or(Refused::Name)?;
    let mut up = query.to_vec();
    up[0..2].copy_from_slice(&id.to_be_bytes());
    if let Some(mut bits) = case_bits {
        // The name's bytes: labels and their lengths, up to the type and class.
        let name_end = q.end - 4;
        let mut at = q.start;
        while at < name_end {
            let len = usize::from(up[at]);
            for b in &mut up[at + 1..at + 1 + len] {
                if b.is_ascii_alphabetic() {
                    *b = if bits & 1 == 1 { b.to_ascii_uppercase() } else { b.to_ascii_lowercase() };
                    bits = bits.rotate_right(1);
                }
            }
            at += 1 + len;
        }
    }
    let outstanding = Outstanding {
        pod_id: [query[0], query[1]],
        pod_question: query[q.clone()].to_vec(),
        id: [up[0], up[1]],
        question: up[q.clone()].to_vec(),
        qtype: u16_at(query, q.end - 4),
    };
    Ok((up, outstanding))
}

impl Outstanding {
    /// The id the query went upstream with.
    #[cfg(feature = "testkit")]
    pub(crate) fn id(&self) -> u16 {
        u16::from_be_bytes(self.id)
    }

    /// Whether `answer` is the answer to this query (its id, one question equal to the one
    /// sent, byte for byte); if so, the answer as the pod gets it: its own id and question.
    pub(crate) fn accept(&self, answer: &[u8]) -> Result<Vec<u8>, Mismatch> {
        let q = HEADER..HEADER + self.question.len();
        if answer.len() < q.end {
            return Err(Mismatch::Short);
        }
        if answer[2] & 0x80 == 0 {
            return Err(Mismatch::NotAResponse);
        }
        if answer[0..2] != self.id {
            return Err(Mismatch::Id);
        }
        if u16_at(answer, 4) != 1 {
            return Err(Mismatch::Questions);
        }
        if answer[q.clone()] != self.question[..] {
            return Err(Mismatch::Question);
        }
        let mut out = answer.to_vec();
        out[0..2].copy_from_slice(&self.pod_id);
        out[q].copy_from_slice(&self.pod_question);
        Ok(out)
    }

    /// A response to the pod's query with only a header and its question, and `rcode` (e.g.
    /// `SERVFAIL`, 2) — or, with `truncated`, the TC bit, so the pod asks again over TCP.
    pub(crate) fn bare_response(&self, rd: bool, rcode: u8, truncated: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER + self.pod_question.len());
        out.extend_from_slice(&self.pod_id);
        // QR, opcode 0, TC, RD; then RA and the code.
        out.push(0x80 | if truncated { 0x02 } else { 0 } | u8::from(rd));
        out.push(0x80 | (rcode & 0x0f));
        out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&self.pod_question);
        out
    }
}

/// Whether `query` asks for recursion (the RD bit), to echo it.
pub(crate) fn recursion_desired(query: &[u8]) -> bool {
    query.get(2).is_some_and(|b| b & 1 == 1)
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{Name, RData, Record, RecordType};

    use super::*;

    fn query(id: u16, name: &str) -> Vec<u8> {
        let mut m = Message::new();
        m.set_id(id).set_message_type(MessageType::Query).set_op_code(OpCode::Query).set_recursion_desired(true);
        m.add_query(Query::query(Name::from_str(name).unwrap(), RecordType::A));
        m.to_vec().unwrap()
    }

    /// The resolver's answer to `up` (as sent), with one A record owned by the question's
    /// name (compressed: a pointer to offset 12).
    fn answer_to(up: &[u8]) -> Vec<u8> {
        let q = Message::from_vec(up).unwrap();
        let mut r = Message::new();
        r.set_id(q.id()).set_message_type(MessageType::Response).set_op_code(OpCode::Query).set_response_code(ResponseCode::NoError);
        r.add_queries(q.queries().to_vec());
        r.add_answer(Record::from_rdata(q.queries()[0].name().clone(), 60, RData::A(A::new(198, 18, 3, 4))));
        r.to_vec().unwrap()
    }

    #[test]
    fn the_query_goes_with_our_id_and_case_and_the_answer_comes_back_with_the_pods() {
        // `Name::from_str` lowercases (IDNA): the pod's capital E by hand ([3]api[7]example...).
        let mut pod = query(0x1234, "api.example.com.");
        assert_eq!(pod[17], b'e');
        pod[17] = b'E';
        let (up, out) = prepare(&pod, 0xbeef, Some(0b1010_1010_1010)).unwrap();
        assert_eq!(out.id(), 0xbeef);
        assert_eq!(&up[0..2], &[0xbe, 0xef]);
        let asked = Message::from_vec(&up).unwrap();
        let name = asked.queries()[0].name().to_ascii();
        assert!(name.eq_ignore_ascii_case("api.example.com.") && name != "api.Example.com.", "{name}");
        let back = out.accept(&answer_to(&up)).unwrap();
        let m = Message::from_vec(&back).unwrap();
        assert_eq!(m.id(), 0x1234);
        assert_eq!(m.queries()[0].name().to_ascii(), "api.Example.com.");
        // The answer's owner name points at the question: the pod's case now.
        assert_eq!(m.answers()[0].name().to_ascii(), "api.Example.com.");
        assert_eq!(crate::dns::learn(&pod, &back, &crate::dns::Limits::default()).unwrap().addresses.len(), 1);
    }

    #[test]
    fn forged_answers_are_refused() {
        let pod = query(7, "allowed.example.com.");
        let (up, out) = prepare(&pod, 0x5151, Some(u64::MAX / 3)).unwrap();
        let good = answer_to(&up);
        // The pod's own id (what a forger in the pod knows): refused.
        let mut forged = good.clone();
        forged[0..2].copy_from_slice(&7u16.to_be_bytes());
        assert_eq!(out.accept(&forged), Err(Mismatch::Id));
        // The right id but the name in another case (a forger who guessed the id).
        let mut forged = good.clone();
        forged[13] ^= 0x20;
        assert_eq!(out.accept(&forged), Err(Mismatch::Question));
        // Another type, a query, no question, too short.
        let mut forged = good.clone();
        let t = 12 + out.question.len() - 3;
        forged[t] ^= 0x01;
        assert_eq!(out.accept(&forged), Err(Mismatch::Question));
        let mut forged = good.clone();
        forged[2] &= 0x7f;
        assert_eq!(out.accept(&forged), Err(Mismatch::NotAResponse));
        let mut forged = good.clone();
        forged[5] = 0;
        assert_eq!(out.accept(&forged), Err(Mismatch::Questions));
        assert_eq!(out.accept(&good[..20]), Err(Mismatch::Short));
        assert!(out.accept(&good).is_ok());
    }

    #[test]
    fn odd_queries_are_not_proxied() {
        let good = query(1, "a.example.com.");
        assert_eq!(prepare(&good[..11], 1, None), Err(Refused::Short));
        let mut m = good.clone();
        m[2] |= 0x80;
        assert_eq!(prepare(&m, 1, None), Err(Refused::Response));
        let mut m = good.clone();
        m[2] |= 5 << 3;
        assert_eq!(prepare(&m, 1, None), Err(Refused::Opcode(5)));
        let mut m = good.clone();
        m[5] = 2;
        assert_eq!(prepare(&m, 1, None), Err(Refused::Questions(2)));
        let mut m = good.clone();
        m[7] = 1;
        assert_eq!(prepare(&m, 1, None), Err(Refused::Records));
        let mut m = good.clone();
        m[12] = 0xc0;
        assert_eq!(prepare(&m, 1, None), Err(Refused::Name));
        // A label running past the end.
        let mut m = good[..14].to_vec();
        m[12] = 40;
        assert_eq!(prepare(&m, 1, None), Err(Refused::Name));
        // Without case bits the name goes as written.
        let (up, _) = prepare(&good, 9, None).unwrap();
        assert_eq!(up[2..], good[2..]);
    }

    #[test]
    fn a_bare_response_answers_the_pods_question() {
        let pod = query(0x4242, "x.example.com.");
        let (_, out) = prepare(&pod, 1, Some(0)).unwrap();
        let m = Message::from_vec(&out.bare_response(true, 2, false)).unwrap();
        assert_eq!((m.id(), m.message_type(), m.response_code()), (0x4242, MessageType::Response, ResponseCode::ServFail));
        assert_eq!(m.queries()[0].name().to_ascii(), "x.example.com.");
        assert!(Message::from_vec(&out.bare_response(true, 0, true)).unwrap().truncated());
    }
}
