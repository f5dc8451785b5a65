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
    attr_with(out, ty, |b| b.extend_from_slice(payload));
}

/// Appends attribute `ty` whose payload `fill` writes in place, padded to 4 bytes.
pub(crate) fn attr_with(out: &mut Vec<u8>, ty: u16, fill: impl FnOnce(&mut Vec<u8>)) {
    let start = begin_nested(out);
    fill(out);
    end_attr(out, start, ty);
}

/// Appends nested attribute `ty` whose content `fill` writes.
pub(crate) fn nested(out: &mut Vec<u8>, ty: u16, fill: impl FnOnce(&mut Vec<u8>)) {
    let start = begin_nested(out);
    fill(out);
    end_nested(out, start, ty);
}

/// [`nested`] whose `fill` may fail (the caller then drops what was written).
pub(crate) fn try_nested<E>(out: &mut Vec<u8>, ty: u16, fill: impl FnOnce(&mut Vec<u8>) -> Result<(), E>) -> Result<(), E> {
    let start = begin_nested(out);
    fill(out)?;
    end_nested(out, start, ty);
    Ok(())
}

/// Opens an attribute whose content the caller appends; [`end_nested`] closes it.
pub(crate) fn begin_nested(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    start
}

/// Closes the nested attribute `ty` opened at `start`.
pub(crate) fn end_nested(out: &mut Vec<u8>, start: usize, ty: u16) {
    end_attr(out, start, ty | NLA_F_NESTED);
}

/// Sets the header of the attribute opened at `start` (type `ty`, its length) and pads it.
fn end_attr(out: &mut Vec<u8>, start: usize, ty: u16) {
    // Callers bound their payloads far below 64 KiB (nf_tables' element lists, keys, names).
    let len = (out.len() - start) as u16;
    out[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    out[start + 2..start + 4].copy_from_slice(&ty.to_ne_bytes());
    out.resize(out.len().next_multiple_of(4), 0);
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
    let start = begin_message(out, ty, flags, seq, family, res_id);
    out.extend_from_slice(body);
    end_message(out, start);
}

/// Appends a netlink message's header and nfgenmsg, its length still to be set by
/// [`end_message`] once its body is written after them; returns where it starts.
pub(crate) fn begin_message(out: &mut Vec<u8>, ty: u16, flags: u16, seq: u32, family: u8, res_id: u16) -> usize {
    let start = out.len();
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.push(family);
    out.push(0); // NFNETLINK_V0
    out.extend_from_slice(&res_id.to_be_bytes());
    start
}

/// Sets the length of the message begun at `start` to what follows it in `out`.
pub(crate) fn end_message(out: &mut [u8], start: usize) {
    // Batches are bounded far below 4 GiB (`MAX_BATCH_BYTES`).
    let len = u32::try_from(out.len() - start).unwrap_or(u32::MAX);
    out[start..start + 4].copy_from_slice(&len.to_ne_bytes());
}
