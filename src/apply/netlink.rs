//! Element updates sent to nf_tables over netlink, without an `nft` process.
//!
//! The frequent transaction is small: a pod appears or goes, so elements are added to and
//! deleted from flock's exact sets and verdict maps, and nothing else changes. Through `nft`
//! such a transaction costs an nft process — its start, and at its exit the wait of a socket
//! closed after a commit ([`NfSocket`]): 10–15 ms at 150k pods, whatever the change. Here it
//! is one nfnetlink batch on a socket kept open, atomic like `nft -f`: every element of it is
//! committed, or none.
//!
//! Keys and data are encoded as nft encodes them, so nft lists them back exactly as if it had
//! written them (the kernel tests compare the two listings): an `ifname` is 16 bytes,
//! zero-padded; addresses are in network order; in a concatenation every part takes a
//! multiple of 4 bytes; a comment is the element's user data (`NFTNL_UDATA_SET_ELEM_COMMENT`,
//! NUL-terminated); a verdict is a code and, for `jump`/`goto`, a chain name. Interval sets
//! are not written here: their elements are ranges that nft splits and merges (the applier
//! sends those through nft).

use std::io;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use crate::render::names::TABLE;
use crate::render::{Element, Set};

/// The elements of one set to delete and to add (deletions go first).
#[derive(Debug, Clone)]
pub struct ElementChange<'a> {
    pub set: &'a Set,
    pub delete: Vec<&'a Element>,
    pub add: Vec<&'a Element>,
}

/// Why an element batch could not be encoded or was not committed.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("set {set}: cannot encode element {key}: {why}")]
    Encode { set: String, key: String, why: String },
    #[error("set {set}: interval sets are written through nft")]
    Interval { set: String },
    #[error("the element batch is {bytes} bytes, more than one netlink batch carries ({max})")]
    TooLarge { bytes: usize, max: usize },
    #[error("netlink socket: {0}")]
    Socket(io::Error),
    #[error("reading nf_tables' reply: {0}")]
    Reply(io::Error),
    #[error("nf_tables refused the element batch at {what} of set {set}: {error}")]
    Refused { what: &'static str, set: String, error: io::Error },
    #[error("nf_tables sent an unexpected reply: {0}")]
    Protocol(String),
}

// From linux/netlink.h, linux/netfilter/nfnetlink.h and linux/netfilter/nf_tables.h.
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 0x2;
const NLMSG_DONE: u16 = 0x3;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFPROTO_INET: u8 = 1;
const NLA_F_NESTED: u16 = 0x8000;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NF_DROP: i32 = 0;
const NF_ACCEPT: i32 = 1;
const NFT_CONTINUE: i32 = -1;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
const NFT_RETURN: i32 = -5;
/// libnftnl's user-data type of an element's comment.
const NFTNL_UDATA_SET_ELEM_COMMENT: u8 = 0;
/// IFNAMSIZ: an `ifname` key is this long, zero-padded.
const IFNAMSIZ: usize = 16;

/// A nested attribute's length is a u16: a message's element list stays well below it.
const MAX_ELEMENTS_BYTES: usize = 60_000;
/// The whole batch goes in one `send`, which the socket's default send buffer must hold;
/// larger changes are not the small ones this path is for (the applier uses nft for them).
pub const MAX_BATCH_BYTES: usize = 128 * 1024;

/// One element's encoded attributes (an `NFTA_LIST_ELEM`).
fn encode_element(set: &Set, e: &Element, with_data: bool) -> Result<Vec<u8>, NetlinkError> {
    let err = |why: String| NetlinkError::Encode { set: set.name.clone(), key: e.key.clone(), why };
    let mut out = Vec::new();
    let key = encode_key(&set.key, &e.key).map_err(err)?;
    nested(&mut out, NFTA_SET_ELEM_KEY, |b| attr(b, NFTA_DATA_VALUE, &key));
    if with_data && set.data.is_some() {
        let Some(verdict) = &e.verdict else { return Err(err("a verdict map's element without a verdict".into())) };
        let (code, chain) = parse_verdict(verdict).map_err(err)?;
        nested(&mut out, NFTA_SET_ELEM_DATA, |b| {
            nested(b, NFTA_DATA_VERDICT, |v| {
                attr(v, NFTA_VERDICT_CODE, &code.to_be_bytes());
                if let Some(chain) = chain {
                    attr(v, NFTA_VERDICT_CHAIN, &nul_terminated(chain));
                }
            })
        });
    }
    if with_data && !e.comment.is_empty() {
        // Type, length (with the NUL), the comment: libnftnl's TLV, whose length is a byte.
        let len = u8::try_from(e.comment.len() + 1).map_err(|_| err(format!("comment of {} bytes", e.comment.len())))?;
        let mut udata = vec![NFTNL_UDATA_SET_ELEM_COMMENT, len];
        udata.extend_from_slice(e.comment.as_bytes());
        udata.push(0);
        attr(&mut out, NFTA_SET_ELEM_USERDATA, &udata);
    }
    Ok(out)
}

/// The key's bytes for a set of `types` (concatenated when more than one).
pub fn encode_key(types: &[&str], key: &str) -> Result<Vec<u8>, String> {
    let parts = split_key(key)?;
    if parts.len() != types.len() {
        return Err(format!("{} parts for a key of type {}", parts.len(), types.join(" . ")));
    }
    let concat = types.len() > 1;
    let mut out = Vec::new();
    for (ty, part) in types.iter().zip(parts) {
        let bytes = match *ty {
            "ifname" => {
                let name = part
                    .strip_prefix('"')
                    .and_then(|p| p.strip_suffix('"'))
                    .ok_or_else(|| format!("interface name {part} is not quoted"))?;
                if name.len() >= IFNAMSIZ || name.contains('\0') || name.contains('*') {
                    return Err(format!("{part} is not an interface name"));
                }
                let mut b = name.as_bytes().to_vec();
                b.resize(IFNAMSIZ, 0);
                b
            }
            "ipv4_addr" => part.parse::<std::net::Ipv4Addr>().map_err(|e| format!("{part}: {e}"))?.octets().to_vec(),
            "ipv6_addr" => part.parse::<std::net::Ipv6Addr>().map_err(|e| format!("{part}: {e}"))?.octets().to_vec(),
            "inet_proto" => vec![protocol_number(part)?],
            "inet_service" => part.parse::<u16>().map_err(|_| format!("{part} is not a port"))?.to_be_bytes().to_vec(),
            other => return Err(format!("key type {other}")),
        };
        out.extend_from_slice(&bytes);
        if concat {
            // Every part of a concatenation fills whole 32-bit registers.
            out.resize(out.len().next_multiple_of(4), 0);
        }
    }
    Ok(out)
}

/// The parts of a key as flock writes it: ` . `-separated, interface names quoted.
fn split_key(key: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut rest = key;
    loop {
        let end = if let Some(quoted) = rest.strip_prefix('"') {
            quoted.find('"').map(|i| i + 2).ok_or_else(|| format!("unterminated quote in {key}"))?
        } else {
            rest.find(" . ").unwrap_or(rest.len())
        };
        parts.push(&rest[..end]);
        rest = &rest[end..];
        if rest.is_empty() {
            return Ok(parts);
        }
        rest = rest.strip_prefix(" . ").ok_or_else(|| format!("unexpected {rest:?} in {key}"))?;
    }
}

fn protocol_number(name: &str) -> Result<u8, String> {
    Ok(match name {
        "tcp" => 6,
        "udp" => 17,
        "sctp" => 132,
        "icmp" => 1,
        "ipv6-icmp" | "icmpv6" => 58,
        n => n.parse().map_err(|_| format!("protocol {n}"))?,
    })
}

/// A verdict as flock writes it: its code and chain.
fn parse_verdict(v: &str) -> Result<(i32, Option<&str>), String> {
    Ok(match v.split_once(' ') {
        None => match v {
            "accept" => (NF_ACCEPT, None),
            "drop" => (NF_DROP, None),
            "return" => (NFT_RETURN, None),
            "continue" => (NFT_CONTINUE, None),
            other => return Err(format!("verdict {other}")),
        },
        Some(("jump", chain)) => (NFT_JUMP, Some(chain)),
        Some(("goto", chain)) => (NFT_GOTO, Some(chain)),
        Some(_) => return Err(format!("verdict {v}")),
    })
}

fn nul_terminated(s: &str) -> Vec<u8> {
    let mut b = s.as_bytes().to_vec();
    b.push(0);
    b
}

/// Appends attribute `ty` holding `payload`, padded to 4 bytes.
fn attr(out: &mut Vec<u8>, ty: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    // Lengths are bounded by MAX_ELEMENTS_BYTES (checked by the caller) and the key sizes.
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(out.len().next_multiple_of(4), 0);
}

/// Appends nested attribute `ty` whose content `fill` writes.
fn nested(out: &mut Vec<u8>, ty: u16, fill: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    fill(out);
    let len = (out.len() - start) as u16;
    out[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    out[start + 2..start + 4].copy_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
}

/// Appends a netlink message: header, nfgenmsg, `body`.
fn message(out: &mut Vec<u8>, ty: u16, flags: u16, seq: u32, family: u8, res_id: u16, body: &[u8]) {
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

impl NetlinkError {
    /// Nothing reached the kernel: the same change can still be sent another way.
    pub fn is_unsent(&self) -> bool {
        matches!(self, Self::Encode { .. } | Self::Interval { .. } | Self::TooLarge { .. } | Self::Socket(_))
    }
}

/// What each acknowledged message of a batch was, to name it in an error.
struct Sent {
    seq: u32,
    what: &'static str,
    set: String,
}

/// Encodes `changes` as one batch: every set's deletions, then every set's additions.
/// Messages are numbered from `first`.
fn encode_batch(changes: &[ElementChange<'_>], first: u32) -> Result<(Vec<u8>, Vec<Sent>), NetlinkError> {
    let mut out = Vec::new();
    let mut sent = Vec::new();
    let mut seq = first;
    message(&mut out, NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, 0, NFNL_SUBSYS_NFTABLES, &[]);
    for deleting in [true, false] {
        for c in changes {
            if c.set.interval {
                return Err(NetlinkError::Interval { set: c.set.name.clone() });
            }
            let elements = if deleting { &c.delete } else { &c.add };
            let (ty, flags, what) = if deleting {
                (NFT_MSG_DELSETELEM, NLM_F_REQUEST | NLM_F_ACK, "deleting elements")
            } else {
                (NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_ACK, "adding elements")
            };
            let encoded = elements.iter().map(|e| encode_element(c.set, e, !deleting)).collect::<Result<Vec<_>, _>>()?;
            let mut next = 0;
            while next < encoded.len() {
                // One message per chunk of elements whose list fits a nested attribute.
                let mut list = Vec::new();
                while next < encoded.len() && list.len() < MAX_ELEMENTS_BYTES {
                    nested(&mut list, NFTA_LIST_ELEM, |b| b.extend_from_slice(&encoded[next]));
                    next += 1;
                }
                let mut body = Vec::new();
                attr(&mut body, NFTA_SET_ELEM_LIST_TABLE, &nul_terminated(TABLE));
                attr(&mut body, NFTA_SET_ELEM_LIST_SET, &nul_terminated(&c.set.name));
                nested(&mut body, NFTA_SET_ELEM_LIST_ELEMENTS, |b| b.extend_from_slice(&list));
                seq = seq.wrapping_add(1);
                message(&mut out, (NFNL_SUBSYS_NFTABLES << 8) | ty, flags, seq, NFPROTO_INET, 0, &body);
                sent.push(Sent { seq, what, set: c.set.name.clone() });
            }
        }
    }
    seq = seq.wrapping_add(1);
    message(&mut out, NFNL_MSG_BATCH_END, NLM_F_REQUEST, seq, 0, NFNL_SUBSYS_NFTABLES, &[]);
    if out.len() > MAX_BATCH_BYTES {
        return Err(NetlinkError::TooLarge { bytes: out.len(), max: MAX_BATCH_BYTES });
    }
    Ok((out, sent))
}

/// A netfilter netlink socket kept open between batches, in the network namespace it was
/// opened in.
///
/// Kept open because closing one is slow: a socket's release waits until nf_tables has
/// freed what the last commit replaced or deleted (an RCU grace period and the frees; measured
/// 10–20 ms on 2 cores, 0.01 ms when nothing was deleted), so a batch that deletes one
/// element on a socket of its own costs a hundred times what its commit costs. A socket is
/// bound to its namespace for life; the caller checks [`NfSocket::is_in`] before each use.
pub struct NfSocket {
    socket: Socket,
    /// The namespace's identity (device, inode of its nsfs file) when the socket was opened.
    netns: (u64, u64),
    /// The next sequence number: increasing across batches, so a late reply to an earlier
    /// batch is never taken for one of this batch.
    seq: u32,
}

impl std::fmt::Debug for NfSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NfSocket").field("netns", &self.netns).field("seq", &self.seq).finish()
    }
}

impl NfSocket {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> Result<Self, NetlinkError> {
        let netns =
            crate::netns::identity(std::path::Path::new(crate::netns::OWN_NETNS)).map_err(|e| NetlinkError::Socket(io::Error::other(e)))?;
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(NetlinkError::Socket)?;
        socket.bind_auto().map_err(NetlinkError::Socket)?;
        socket.connect(&SocketAddr::new(0, 0)).map_err(NetlinkError::Socket)?;
        Ok(Self { socket, netns, seq: 1 })
    }

    /// Whether the socket belongs to the namespace whose identity is `netns`.
    pub fn is_in(&self, netns: (u64, u64)) -> bool {
        self.netns == netns
    }

    /// Sends `changes` as one batch and waits for every acknowledgement. After an error the
    /// socket may hold replies of the failed batch: drop it rather than use it again.
    pub fn write(&mut self, changes: &[ElementChange<'_>]) -> Result<(), NetlinkError> {
        let first = self.seq;
        let (batch, sent) = encode_batch(changes, first)?;
        if sent.is_empty() {
            return Ok(());
        }
        self.seq = first.wrapping_add(u32::try_from(sent.len() + 2).unwrap_or(u32::MAX));
        let socket = &mut self.socket;
        let n = socket.send(&batch, 0).map_err(NetlinkError::Socket)?;
        if n != batch.len() {
            return Err(NetlinkError::Protocol(format!("sent {n} of {} bytes", batch.len())));
        }
        // One NLMSG_ERROR per acknowledged message: 0, or the first refusal (the batch is then
        // aborted as a whole).
        let mut acked = 0;
        let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
        while acked < sent.len() {
            buf.clear();
            socket.recv(&mut buf, 0).map_err(NetlinkError::Reply)?;
            let mut rest = &buf[..];
            while rest.len() >= 16 {
                let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                let ty = u16::from_ne_bytes([rest[4], rest[5]]);
                let seq = u32::from_ne_bytes([rest[8], rest[9], rest[10], rest[11]]);
                if len < 16 || len > rest.len() {
                    return Err(NetlinkError::Protocol(format!("a message of {len} bytes in {} received", rest.len())));
                }
                let ours = sent.iter().find(|s| s.seq == seq);
                match ty {
                    NLMSG_ERROR if len >= 20 && ours.is_some() => {
                        let code = i32::from_ne_bytes([rest[16], rest[17], rest[18], rest[19]]);
                        if code != 0 {
                            let (what, set) = ours.map_or(("a message", String::from("?")), |s| (s.what, s.set.clone()));
                            return Err(NetlinkError::Refused { what, set, error: io::Error::from_raw_os_error(-code) });
                        }
                        acked += 1;
                    }
                    // Not a reply to this batch (none is expected, but a socket that lives
                    // on must not mistake one for an acknowledgement).
                    NLMSG_ERROR | NLMSG_DONE => {}
                    other => return Err(NetlinkError::Protocol(format!("message type {other:#x}"))),
                }
                rest = &rest[len.next_multiple_of(4).min(rest.len())..];
            }
        }
        Ok(())
    }
}

/// Sends `changes` as one batch on a new netfilter netlink socket of the calling thread's
/// network namespace and waits for every acknowledgement (closing the socket afterwards: see
/// [`NfSocket`] for what that costs).
pub fn write(changes: &[ElementChange<'_>]) -> Result<(), NetlinkError> {
    NfSocket::open()?.write(changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_encoded_as_nft_encodes_them() {
        assert_eq!(encode_key(&["ipv4_addr"], "198.18.0.1").unwrap(), [198, 18, 0, 1]);
        assert_eq!(encode_key(&["inet_service"], "443").unwrap(), [1, 187]);
        assert_eq!(encode_key(&["inet_proto"], "udp").unwrap(), [17]);
        let mut ifname = b"flk0a".to_vec();
        ifname.resize(16, 0);
        assert_eq!(encode_key(&["ifname"], "\"flk0a\"").unwrap(), ifname);
        // A concatenation: every part padded to 4 bytes.
        let k = encode_key(&["ifname", "inet_proto", "inet_service"], "\"flk0a\" . tcp . 8080").unwrap();
        assert_eq!(k.len(), 16 + 4 + 4);
        assert_eq!(&k[16..], [6, 0, 0, 0, 0x1f, 0x90, 0, 0]);
        let k = encode_key(&["ipv6_addr", "inet_proto", "inet_service"], "2001:db8::1 . sctp . 5").unwrap();
        assert_eq!(k.len(), 24);
        for bad in [
            (&["ifname"][..], "flk0a"),
            (&["ifname"], "\"a-name-much-too-long\""),
            (&["ipv4_addr"], "2001:db8::1"),
            (&["inet_service"], "1-2"),
        ] {
            assert!(encode_key(bad.0, bad.1).is_err(), "{bad:?}");
        }
        assert!(encode_key(&["ipv4_addr", "inet_service"], "198.18.0.1").is_err());
    }

    #[test]
    fn verdicts() {
        assert_eq!(parse_verdict("accept").unwrap(), (NF_ACCEPT, None));
        assert_eq!(parse_verdict("goto ingress-X-ns/pod").unwrap(), (NFT_GOTO, Some("ingress-X-ns/pod")));
        assert_eq!(parse_verdict("jump c").unwrap(), (NFT_JUMP, Some("c")));
        assert!(parse_verdict("queue").is_err());
    }
}
