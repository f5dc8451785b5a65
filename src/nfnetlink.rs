//! The nfnetlink codec that flock's netfilter sockets share — nf_tables batches
//! (`crate::apply::netlink`), conntrack (`crate::conntrack`) and NFLOG (`crate::nflog`):
//! netlink message headers with their nfgenmsg, attributes (flat and nested) and the
//! kernel's acknowledgements, each way. Pure: bytes in, bytes out.

// From linux/netlink.h.
pub(crate) const NLM_F_REQUEST: u16 = 0x1;
pub(crate) const NLM_F_MULTI: u16 = 0x2;
pub(crate) const NLM_F_ACK: u16 = 0x4;
pub(crate) const NLM_F_EXCL: u16 = 0x200;
pub(crate) const NLM_F_DUMP: u16 = 0x300;
pub(crate) const NLM_F_CREATE: u16 = 0x400;
pub(crate) const NLMSG_ERROR: u16 = 0x2;
pub(crate) const NLMSG_DONE: u16 = 0x3;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

/// A datagram whose message header claims more bytes than arrived (or fewer than a header).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a netlink message of {claimed} bytes in {received} received")]
pub(crate) struct Malformed {
    pub(crate) claimed: usize,
    pub(crate) received: usize,
}

pub(crate) fn nul_terminated(s: &str) -> Vec<u8> {
    let mut b = s.as_bytes().to_vec();
    b.push(0);
    b
}

/// Appends attribute `ty` holding `payload`, padded to 4 bytes.
pub(crate) fn attr(out: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    // Callers bound their payloads far below 64 KiB (nf_tables' element lists, keys, names).
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(out.len().next_multiple_of(4), 0);
}

/// Appends nested attribute `ty` whose content `fill` writes.
pub(crate) fn nested(out: &mut Vec<u8>, ty: u16, fill: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    fill(out);
    let len = (out.len() - start) as u16;
    out[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    out[start + 2..start + 4].copy_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
}

/// The netlink messages of one datagram: (type, flags, seq, body after the header).
pub(crate) fn messages(mut b: &[u8]) -> impl Iterator<Item = Result<(u16, u16, u32, &[u8]), Malformed>> {
    std::iter::from_fn(move || {
        if b.len() < 16 {
            return None;
        }
        let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if len < 16 || len > b.len() {
            let e = Malformed { claimed: len, received: b.len() };
            b = &[];
            return Some(Err(e));
        }
        let t = u16::from_ne_bytes([b[4], b[5]]);
        let flags = u16::from_ne_bytes([b[6], b[7]]);
        let seq = u32::from_ne_bytes([b[8], b[9], b[10], b[11]]);
        let body = &b[16..len];
        b = &b[len.next_multiple_of(4).min(b.len())..];
        Some(Ok((t, flags, seq, body)))
    })
}

/// The (seq, error code) of every acknowledgement or error in a datagram.
pub(crate) fn acks(datagram: &[u8]) -> Vec<(u32, i32)> {
    messages(datagram)
        .filter_map(Result::ok)
        .filter(|(t, _, _, body)| *t == NLMSG_ERROR && body.len() >= 4)
        .map(|(_, _, seq, body)| (seq, i32::from_ne_bytes([body[0], body[1], body[2], body[3]])))
        .collect()
}

/// The attributes of a netlink message body: (type without flags, value).
pub(crate) fn attributes(b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    raw_attributes(b).map(|(ty, _, value)| (ty, value))
}

/// The attributes of a body as (type without flags, the whole attribute with its padding,
/// its value): what a reader that keeps attributes as they came needs.
pub(crate) fn raw_attributes(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8], &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([b[0], b[1]]));
        let ty = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            return None;
        }
        let padded = len.next_multiple_of(4).min(b.len());
        let (raw, value) = (&b[..padded], &b[4..len]);
        b = &b[padded..];
        Some((ty, raw, value))
    })
}

/// Appends a netlink message: header, nfgenmsg, `body`.
pub(crate) fn message(out: &mut Vec<u8>, ty: u16, flags: u16, seq: u32, family: u8, res_id: u16, body: &[u8]) {
    let len = 16 + 4 + body.len();
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.push(family);
    out.push(0); // NFNETLINK_V0
    out.extend_from_slice(&res_id.to_be_bytes());
    out.extend_from_slice(body);
}
