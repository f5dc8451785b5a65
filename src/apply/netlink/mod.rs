//! nf_tables netlink batches: flock's transactions without an `nft` process.
//!
//! This module holds the batch ([`Batch`]), the socket it goes through ([`NfSocket`], kept
//! open), element changes, and the writer that puts elements straight into a batch's buffer
//! ([`ElementWriter`]: a change of thousands of elements is not copied element by element on
//! its way); [`transaction`] encodes whole-table and incremental
//! transactions, [`rule`] flock's rules. A batch is atomic like `nft -f`: every message of it
//! is committed, or none.
//!
//! The frequent transaction is small: a pod appears or goes, so elements are added to and
//! deleted from flock's exact sets and verdict maps, and nothing else changes. Through `nft`
//! such a transaction costs an nft process — its start, and at its exit the wait of a socket
//! closed after a commit ([`NfSocket`]): 10–15 ms at 150k pods, whatever the change.
//!
//! Keys and data are encoded as nft encodes them, so nft lists them back exactly as if it had
//! written them (the kernel tests compare the two listings): an `ifname` is 16 bytes,
//! zero-padded; addresses are in network order; in a concatenation every part takes a
//! multiple of 4 bytes; a comment is the element's user data (`NFTNL_UDATA_SET_ELEM_COMMENT`,
//! NUL-terminated); a verdict is a code and, for `jump`/`goto`, a chain name. Interval sets'
//! elements are ranges, split as nft splits them ([`transaction`]); an element change of an
//! interval set rewrites the whole set (an incremental transaction).

pub(crate) mod dump;
mod rule;
pub mod timed;
pub(crate) mod transaction;

use std::io;
use std::net::IpAddr;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use crate::nfnetlink::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, attr, attr_with, attributes, begin_message, begin_nested, end_message,
    end_nested, message, messages, nested, nul_terminated, try_nested,
};
use crate::render::names::TABLE;
use crate::render::rule::{TYPEOF_INNER_SADDR_V4, TYPEOF_INNER_SADDR_V6, TYPEOF_SADDR_V4, TYPEOF_SADDR_V6};
use crate::render::{Element, Key, KeyPart, Set};

/// The elements of one set to delete and to add (deletions go first).
#[derive(Debug, Clone)]
pub struct ElementChange<'a> {
    pub set: &'a Set,
    pub delete: Vec<&'a Element>,
    pub add: Vec<&'a Element>,
}

/// Why a batch could not be encoded or was not committed.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("set {set}: cannot encode element {key}: {why}")]
    Encode { set: String, key: String, why: String },
    #[error("{object}: cannot encode {what}: {why}")]
    Unsupported { object: String, what: String, why: String },
    #[error("set {set}: an interval set is rewritten whole (an incremental transaction), not changed element by element")]
    Interval { set: String },
    #[error("the batch is {bytes} bytes, more than one netlink batch carries ({max})")]
    TooLarge { bytes: usize, max: usize },
    #[error("netlink socket: {0}")]
    Socket(io::Error),
    #[error("reading nf_tables' reply: {0}")]
    Reply(io::Error),
    #[error("nf_tables refused the batch at {what} {object}: {error}")]
    Refused { what: &'static str, object: String, error: io::Error },
    #[error("nf_tables sent an unexpected reply: {0}")]
    Protocol(String),
}

// From linux/netlink.h, linux/netfilter/nfnetlink.h and linux/netfilter/nf_tables.h.
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWSETELEM: u16 = 12;
pub(crate) const NFT_MSG_DELSETELEM: u16 = 14;
const NFPROTO_INET: u8 = 1;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
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
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
const NFT_RETURN: i32 = -5;
/// libnftnl's user-data type of an element's comment.
const NFTNL_UDATA_SET_ELEM_COMMENT: u8 = 0;
/// IFNAMSIZ: an `ifname` key is this long, zero-padded.
const IFNAMSIZ: usize = 16;

/// A nested attribute's length is a u16: a message's element list stays well below it.
const MAX_ELEMENTS_BYTES: usize = 60_000;
/// The whole batch goes in one `send` (the socket's buffers are sized to it): a sanity bound,
/// far above a whole table of 150k pods with its ClusterNetworkPolicies.
pub(crate) const MAX_BATCH_BYTES: usize = 256 * 1024 * 1024;

/// Writes one element's attributes (the content of an `NFTA_LIST_ELEM`) to `out`.
fn write_element(set: &Set, e: &Element, with_data: bool, out: &mut Vec<u8>) -> Result<(), NetlinkError> {
    let err = |why: String| NetlinkError::Encode { set: set.name.clone(), key: e.key.to_string(), why };
    let key = encode_key(&set.key, &e.key).map_err(err)?;
    nested(out, NFTA_SET_ELEM_KEY, |b| attr(b, NFTA_DATA_VALUE, &key));
    if with_data {
        write_element_data(set, e, out)?;
    }
    Ok(())
}

/// Writes an element's verdict (maps) and comment to `out`.
fn write_element_data(set: &Set, e: &Element, out: &mut Vec<u8>) -> Result<(), NetlinkError> {
    let err = |why: String| NetlinkError::Encode { set: set.name.clone(), key: e.key.to_string(), why };
    if set.data.is_some() {
        let Some(verdict) = &e.verdict else { return Err(err("a verdict map's element without a verdict".into())) };
        nested(out, NFTA_SET_ELEM_DATA, |b| write_verdict(verdict, b));
    }
    if !e.comment.is_empty() {
        transaction::comment_attr(out, NFTA_SET_ELEM_USERDATA, NFTNL_UDATA_SET_ELEM_COMMENT, &e.comment).map_err(err)?;
    }
    Ok(())
}

/// The key's bytes for an exact set of `types` (concatenated when more than one): every part
/// one value, not a range.
fn encode_key(types: &[&str], key: &Key) -> Result<Vec<u8>, String> {
    let (start, end) = key_range(types, key)?;
    if start != end {
        return Err(format!("{key} is a range, in a set of single values"));
    }
    Ok(start)
}

/// The first and last key bytes `key` covers in a set of `types`: the same for single
/// values; a prefix covers its network to its broadcast address, a port range its ends.
/// Each part must be of the type at its position; in a concatenation every part fills
/// whole 32-bit registers.
fn key_range(types: &[&str], key: &Key) -> Result<(Vec<u8>, Vec<u8>), String> {
    if key.parts().len() != types.len() {
        return Err(format!("{} parts for a key of type {}", key.parts().len(), types.join(" . ")));
    }
    let concat = types.len() > 1;
    let (mut start, mut end) = (Vec::new(), Vec::new());
    let octets = |ip: IpAddr| match ip {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    };
    for (ty, part) in types.iter().zip(key.parts()) {
        let (a, b) = match (*ty, part) {
            ("ifname", KeyPart::Ifname(name)) => {
                // The printed name must be the name itself, so that text and batch agree.
                if name.len() >= IFNAMSIZ || name.contains(['\0', '*']) || crate::render::names::comment(name) != *name {
                    return Err(format!("{part} is not an interface name"));
                }
                let mut b = name.as_bytes().to_vec();
                b.resize(IFNAMSIZ, 0);
                (b.clone(), b)
            }
            ("ipv4_addr" | TYPEOF_SADDR_V4, KeyPart::Addr(a @ IpAddr::V4(_)))
            | ("ipv6_addr" | TYPEOF_SADDR_V6, KeyPart::Addr(a @ IpAddr::V6(_))) => (octets(*a), octets(*a)),
            (TYPEOF_INNER_SADDR_V4, KeyPart::Raw(n @ ipnet::IpNet::V4(_)))
            | (TYPEOF_INNER_SADDR_V6, KeyPart::Raw(n @ ipnet::IpNet::V6(_))) => (octets(n.network()), octets(n.broadcast())),
            ("ipv4_addr", KeyPart::Net(n @ ipnet::IpNet::V4(_))) | ("ipv6_addr", KeyPart::Net(n @ ipnet::IpNet::V6(_))) => {
                (octets(n.network()), octets(n.broadcast()))
            }
            ("inet_proto", KeyPart::Proto(p)) => (vec![p.number()], vec![p.number()]),
            ("inet_service", KeyPart::Ports(lo, hi)) if lo <= hi => (lo.to_be_bytes().to_vec(), hi.to_be_bytes().to_vec()),
            ("inet_service", KeyPart::Ports(..)) => return Err(format!("{part}: an empty range")),
            (ty, part) => return Err(format!("{part} in a key part of type {ty}")),
        };
        start.extend_from_slice(&a);
        end.extend_from_slice(&b);
        if concat {
            start.resize(start.len().next_multiple_of(4), 0);
            end.resize(end.len().next_multiple_of(4), 0);
        }
    }
    Ok((start, end))
}

/// A verdict as nf_tables data, appended to `out`: `NFTA_DATA_VERDICT` holding its code
/// and, for `jump` and `goto`, the chain.
pub(crate) fn write_verdict(v: &crate::render::rule::Verdict, out: &mut Vec<u8>) {
    use crate::render::rule::Verdict;
    let (code, chain) = match v {
        Verdict::Accept => (NF_ACCEPT, None),
        Verdict::Drop => (NF_DROP, None),
        Verdict::Return => (NFT_RETURN, None),
        Verdict::Jump(c) => (NFT_JUMP, Some(c)),
        Verdict::Goto(c) => (NFT_GOTO, Some(c)),
    };
    nested(out, NFTA_DATA_VERDICT, |b| {
        attr(b, NFTA_VERDICT_CODE, &code.to_be_bytes());
        if let Some(chain) = chain {
            attr_with(b, NFTA_VERDICT_CHAIN, |b| {
                b.extend_from_slice(chain.as_bytes());
                b.push(0);
            });
        }
    });
}

impl NetlinkError {
    /// Nothing reached the kernel: the same change can still be sent another way.
    pub fn is_unsent(&self) -> bool {
        matches!(self, Self::Encode { .. } | Self::Unsupported { .. } | Self::Interval { .. } | Self::TooLarge { .. } | Self::Socket(_))
    }
}

/// What each acknowledged message of a batch was, to name it in an error.
struct Sent {
    seq: u32,
    what: &'static str,
    object: String,
}

/// One nfnetlink batch: `BATCH_BEGIN`, nf_tables messages, `BATCH_END`, committed as one
/// transaction. Messages are numbered from 0; [`NfSocket::send`] renumbers them.
pub(crate) struct Batch {
    buf: Vec<u8>,
    sent: Vec<Sent>,
    seq: u32,
    /// Where the last message starts: only it asks for an acknowledgement (a refusal is
    /// reported whether asked for or not, and each acknowledgement costs a `recv`).
    last: usize,
}

impl Batch {
    pub(crate) fn new() -> Self {
        let mut buf = Vec::new();
        message(&mut buf, NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 0, 0, NFNL_SUBSYS_NFTABLES, &[]);
        Self { buf, sent: Vec::new(), seq: 0, last: 0 }
    }

    /// Appends an nf_tables message of type `ty` with `flags` (beyond request and ack):
    /// `what` and `object` name it in a refusal.
    fn push(&mut self, ty: u16, flags: u16, body: &[u8], what: &'static str, object: &str) {
        let start = self.open(ty, flags, what, object);
        self.buf.extend_from_slice(body);
        end_message(&mut self.buf, start);
    }

    /// Begins a message like [`Self::push`] whose body the caller appends to `buf`, then
    /// closes with `end_message` at the returned start.
    fn open(&mut self, ty: u16, flags: u16, what: &'static str, object: &str) -> usize {
        self.seq += 1;
        self.last = self.buf.len();
        self.sent.push(Sent { seq: self.seq, what, object: object.to_string() });
        begin_message(&mut self.buf, (NFNL_SUBSYS_NFTABLES << 8) | ty, NLM_F_REQUEST | flags, self.seq, NFPROTO_INET, 0)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }

    fn finish(mut self) -> (Vec<u8>, Vec<Sent>) {
        if !self.sent.is_empty() {
            let at = self.last + 6;
            let flags = u16::from_ne_bytes([self.buf[at], self.buf[at + 1]]) | NLM_F_ACK;
            self.buf[at..at + 2].copy_from_slice(&flags.to_ne_bytes());
        }
        self.seq += 1;
        message(&mut self.buf, NFNL_MSG_BATCH_END, NLM_F_REQUEST, self.seq, 0, NFNL_SUBSYS_NFTABLES, &[]);
        (self.buf, self.sent)
    }
}

impl Default for Batch {
    fn default() -> Self {
        Self::new()
    }
}

/// Element messages of one set written straight into a batch (no copy of an element on
/// its way): `ty` with `flags`, each holding as many elements as a nested attribute fits.
/// A message is opened by the first element after the last one filled up, and closed when
/// full or when the writer is dropped.
pub(crate) struct ElementWriter<'b> {
    batch: &'b mut Batch,
    set: &'b str,
    /// The set's id in the batch: an anonymous set's name is the kernel's to choose.
    id: Option<u32>,
    ty: u16,
    flags: u16,
    what: &'static str,
    /// The open message's start and its element list's.
    open: Option<(usize, usize)>,
}

impl<'b> ElementWriter<'b> {
    pub(crate) fn new(batch: &'b mut Batch, set: &'b str, id: Option<u32>, ty: u16, flags: u16, what: &'static str) -> Self {
        Self { batch, set, id, ty, flags, what, open: None }
    }

    /// Appends an element whose attributes `fill` writes.
    pub(crate) fn element<E>(&mut self, fill: impl FnOnce(&mut Vec<u8>) -> Result<(), E>) -> Result<(), E> {
        let list = match self.open {
            Some((_, list)) => list,
            None => self.open_message(),
        };
        try_nested(&mut self.batch.buf, NFTA_LIST_ELEM, fill)?;
        if self.batch.buf.len() - list >= MAX_ELEMENTS_BYTES {
            self.close();
        }
        Ok(())
    }

    fn open_message(&mut self) -> usize {
        let start = self.batch.open(self.ty, self.flags, self.what, self.set);
        let buf = &mut self.batch.buf;
        attr(buf, NFTA_SET_ELEM_LIST_TABLE, &nul_terminated(TABLE));
        attr(buf, NFTA_SET_ELEM_LIST_SET, &nul_terminated(self.set));
        if let Some(id) = self.id {
            attr(buf, NFTA_SET_ELEM_LIST_SET_ID, &id.to_be_bytes());
        }
        let list = begin_nested(buf);
        self.open = Some((start, list));
        list
    }

    fn close(&mut self) {
        if let Some((start, list)) = self.open.take() {
            end_nested(&mut self.batch.buf, list, NFTA_SET_ELEM_LIST_ELEMENTS);
            end_message(&mut self.batch.buf, start);
        }
    }
}

impl Drop for ElementWriter<'_> {
    fn drop(&mut self) {
        self.close();
    }
}

/// Encodes `changes` as one batch: every set's deletions, then every set's additions.
pub(crate) fn encode_batch(changes: &[ElementChange<'_>]) -> Result<Batch, NetlinkError> {
    let mut batch = Batch::new();
    for deleting in [true, false] {
        for c in changes {
            if c.set.interval {
                return Err(NetlinkError::Interval { set: c.set.name.clone() });
            }
            let (elements, mut w) = if deleting {
                (&c.delete, ElementWriter::new(&mut batch, &c.set.name, None, NFT_MSG_DELSETELEM, 0, "deleting elements of set"))
            } else {
                (&c.add, ElementWriter::new(&mut batch, &c.set.name, None, NFT_MSG_NEWSETELEM, NLM_F_CREATE, "adding elements to set"))
            };
            for e in elements {
                w.element(|b| write_element(c.set, e, !deleting, b))?;
            }
        }
    }
    Ok(batch)
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
    /// The buffer sizes set so far (0: the kernel's defaults).
    send_buffer: usize,
    receive_buffer: usize,
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
        // A refusal's reply carries the refused message's header only, not the message.
        socket.set_cap_ack(true).map_err(NetlinkError::Socket)?;
        Ok(Self { socket, netns, seq: 1, send_buffer: 0, receive_buffer: 0 })
    }

    /// Whether the socket belongs to the namespace whose identity is `netns`.
    pub(crate) fn is_in(&self, netns: (u64, u64)) -> bool {
        self.netns == netns
    }

    /// Sends `changes` as one batch and waits for every acknowledgement. After an error the
    /// socket may hold replies of the failed batch: drop it rather than use it again.
    pub(crate) fn write(&mut self, changes: &[ElementChange<'_>]) -> Result<(), NetlinkError> {
        self.send(encode_batch(changes)?)
    }

    /// Sends `batch` and waits until nf_tables has acknowledged every message of it: then
    /// the transaction is committed. After an error, drop the socket.
    pub(crate) fn send(&mut self, batch: Batch) -> Result<(), NetlinkError> {
        if batch.is_empty() {
            return Ok(());
        }
        let (mut buf, mut sent) = batch.finish();
        if buf.len() > MAX_BATCH_BYTES {
            return Err(NetlinkError::TooLarge { bytes: buf.len(), max: MAX_BATCH_BYTES });
        }
        // Number the messages from this socket's next sequence number, so a late reply to an
        // earlier batch is never taken for one of this batch.
        let base = self.seq;
        let mut at = 0;
        while at + 16 <= buf.len() {
            let len = u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
            let seq = u32::from_ne_bytes([buf[at + 8], buf[at + 9], buf[at + 10], buf[at + 11]]).wrapping_add(base);
            buf[at + 8..at + 12].copy_from_slice(&seq.to_ne_bytes());
            at += len.next_multiple_of(4).max(16);
        }
        for s in &mut sent {
            s.seq = s.seq.wrapping_add(base);
        }
        self.seq = base.wrapping_add(u32::try_from(sent.len() + 2).unwrap_or(u32::MAX));
        self.size_buffers(buf.len(), sent.len())?;
        let socket = &mut self.socket;
        let n = socket.send(&buf, 0).map_err(NetlinkError::Socket)?;
        if n != buf.len() {
            return Err(NetlinkError::Protocol(format!("sent {n} of {} bytes", buf.len())));
        }
        // An NLMSG_ERROR for every refused message (the batch is then aborted as a whole: the
        // first refusal names the cause), and the last message's acknowledgement after them.
        let last = sent.last().map_or(base, |s| s.seq);
        let mut done = false;
        let mut recv: Vec<u8> = Vec::with_capacity(64 * 1024);
        while !done {
            recv.clear();
            socket.recv(&mut recv, 0).map_err(NetlinkError::Reply)?;
            for m in messages(&recv) {
                let (ty, _, seq, body) = m.map_err(|e| NetlinkError::Protocol(e.to_string()))?;
                // Sequence numbers increase through the batch: find the message by position.
                let ours = seq.wrapping_sub(base).checked_sub(1).and_then(|i| sent.get(i as usize)).filter(|s| s.seq == seq);
                match ty {
                    NLMSG_ERROR if body.len() >= 4 && (ours.is_some() || seq == base) => {
                        let code = i32::from_ne_bytes([body[0], body[1], body[2], body[3]]);
                        if code != 0 {
                            // The batch itself (seq == base): the kernel could not queue the
                            // refusals, e.g. out of memory.
                            let (what, object) = ours.map_or(("the batch", String::new()), |s| (s.what, s.object.clone()));
                            return Err(NetlinkError::Refused { what, object, error: io::Error::from_raw_os_error(-code) });
                        }
                        done |= seq == last;
                    }
                    // Not a reply to this batch (none is expected, but a socket that lives
                    // on must not mistake one for an acknowledgement).
                    NLMSG_ERROR | NLMSG_DONE => {}
                    other => return Err(NetlinkError::Protocol(format!("message type {other:#x}"))),
                }
            }
        }
        Ok(())
    }

    /// Makes the socket's buffers hold a batch of `bytes` and the acknowledgements of its
    /// `messages` (the kernel queues them all before `send` returns). Beyond the defaults
    /// this needs CAP_NET_ADMIN, which writing nf_tables needs anyway.
    fn size_buffers(&mut self, bytes: usize, messages: usize) -> Result<(), NetlinkError> {
        use nix::sys::socket::{setsockopt, sockopt};
        // Refusals: a header and the refused message's header each (the socket caps them),
        // plus the kernel's own overhead per reply; a batch refused at many messages may lose
        // some beyond the first (then the socket reports an overrun, and the batch an error).
        let send = (bytes + 64 * 1024).next_power_of_two();
        let receive = (messages.min(1024) * 1024 + 64 * 1024).next_power_of_two();
        if send > self.send_buffer {
            setsockopt(&self.socket, sockopt::SndBufForce, &send).map_err(|e| NetlinkError::Socket(e.into()))?;
            self.send_buffer = send;
        }
        if receive > self.receive_buffer {
            setsockopt(&self.socket, sockopt::RcvBufForce, &receive).map_err(|e| NetlinkError::Socket(e.into()))?;
            self.receive_buffer = receive;
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

    fn key(parts: &[KeyPart]) -> Key {
        Key::new(parts.to_vec())
    }

    #[test]
    fn keys_are_encoded_as_nft_encodes_them() {
        use crate::render::Proto;
        let addr = |a: &str| KeyPart::Addr(a.parse().unwrap());
        assert_eq!(encode_key(&["ipv4_addr"], &key(&[addr("198.18.0.1")])).unwrap(), [198, 18, 0, 1]);
        assert_eq!(encode_key(&["inet_service"], &key(&[KeyPart::Ports(443, 443)])).unwrap(), [1, 187]);
        assert_eq!(encode_key(&["inet_proto"], &key(&[KeyPart::Proto(Proto::Udp)])).unwrap(), [17]);
        let mut ifname = b"flk0a".to_vec();
        ifname.resize(16, 0);
        let flk0a = KeyPart::Ifname("flk0a".into());
        assert_eq!(encode_key(&["ifname"], &key(std::slice::from_ref(&flk0a))).unwrap(), ifname);
        // A concatenation: every part padded to 4 bytes.
        let k = encode_key(
            &["ifname", "inet_proto", "inet_service"],
            &key(&[flk0a.clone(), KeyPart::Proto(Proto::Tcp), KeyPart::Ports(8080, 8080)]),
        )
        .unwrap();
        assert_eq!(k.len(), 16 + 4 + 4);
        assert_eq!(&k[16..], [6, 0, 0, 0, 0x1f, 0x90, 0, 0]);
        let k = encode_key(
            &["ipv6_addr", "inet_proto", "inet_service"],
            &key(&[addr("2001:db8::1"), KeyPart::Proto(Proto::Sctp), KeyPart::Ports(5, 5)]),
        )
        .unwrap();
        assert_eq!(k.len(), 24);
        for bad in [
            (&["ifname"][..], key(&[addr("198.18.0.1")])),
            (&["ifname"], key(&[KeyPart::Ifname("a-name-much-too-long".into())])),
            (&["ifname"], key(&[KeyPart::Ifname("flk\"0".into())])),
            (&["ipv4_addr"], key(&[addr("2001:db8::1")])),
            (&["inet_service"], key(&[KeyPart::Ports(1, 2)])),
            (&["ipv4_addr", "inet_service"], key(&[addr("198.18.0.1")])),
        ] {
            assert!(encode_key(bad.0, &bad.1).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ranges_and_their_ends() {
        use crate::render::Proto;
        let (a, b) = key_range(&["ipv4_addr"], &key(&[KeyPart::Net("198.18.0.0/23".parse().unwrap())])).unwrap();
        assert_eq!((a, b), (vec![198, 18, 0, 0], vec![198, 18, 1, 255]));
        let k = key(&[KeyPart::Ifname("flk0a".into()), KeyPart::Proto(Proto::Tcp), KeyPart::Ports(8000, 8099)]);
        let (a, b) = key_range(&["ifname", "inet_proto", "inet_service"], &k).unwrap();
        assert_eq!(a.len(), 24);
        assert_eq!(&a[16..], [6, 0, 0, 0, 0x1f, 0x40, 0, 0]);
        assert_eq!(&b[20..22], [0x1f, 0xa3]);
        assert!(key_range(&["ipv4_addr"], &key(&[KeyPart::Net("2001:db8::/32".parse().unwrap())])).is_err());
        assert!(key_range(&["inet_service"], &key(&[KeyPart::Ports(90, 80)])).is_err());
    }

    #[test]
    fn verdicts() {
        use crate::render::Verdict;
        let code = |v: &Verdict| {
            let mut data = Vec::new();
            write_verdict(v, &mut data);
            let inner = crate::nfnetlink::attributes(&data).next().unwrap().1;
            let code = crate::nfnetlink::attributes(inner).find(|(t, _)| *t == NFTA_VERDICT_CODE).unwrap().1;
            i32::from_be_bytes(code.try_into().unwrap())
        };
        assert_eq!(code(&Verdict::Accept), NF_ACCEPT);
        assert_eq!(code(&Verdict::Goto("ingress-X-ns/pod".into())), NFT_GOTO);
        assert_eq!(code(&Verdict::Jump("c".into())), NFT_JUMP);
    }

    /// Elements written in place fill messages up to the bound of a nested attribute, each
    /// message well-formed and naming its set; every element arrives once, in order.
    #[test]
    fn element_messages_are_split_below_a_nested_attribute() {
        let set = Set {
            name: "peers-v4".into(),
            comment: String::new(),
            key: vec!["ipv4_addr"],
            data: None,
            interval: false,
            timeout: false,
            limit: None,
            elements: std::sync::Arc::new(Vec::new()),
        };
        let elements: Vec<Element> = (0..20_000u32)
            .map(|i| Element {
                key: key(&[KeyPart::Addr(IpAddr::from([198, 18, (i >> 8) as u8, i as u8]))]),
                comment: format!("ns-{i}/pod"),
                verdict: None,
            })
            .collect();
        let mut batch = Batch::new();
        {
            let mut w = ElementWriter::new(&mut batch, &set.name, None, NFT_MSG_NEWSETELEM, NLM_F_CREATE, "adding elements to set");
            for e in &elements {
                w.element(|b| write_element(&set, e, true, b)).unwrap();
            }
        }
        // A writer given nothing writes nothing.
        drop(ElementWriter::new(&mut batch, "empty", None, NFT_MSG_DELSETELEM, 0, "deleting elements of set"));
        let (buf, sent) = batch.finish();
        let mut keys = Vec::new();
        let mut bodies = 0;
        for m in messages(&buf) {
            let (ty, _, _, body) = m.unwrap();
            if ty != (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWSETELEM {
                continue;
            }
            bodies += 1;
            let attrs: Vec<(u16, &[u8])> = attributes(&body[4..]).collect();
            assert_eq!(attrs[1], (NFTA_SET_ELEM_LIST_SET, &b"peers-v4\0"[..]));
            let list = attrs.iter().find(|(t, _)| *t == NFTA_SET_ELEM_LIST_ELEMENTS).unwrap().1;
            assert!(list.len() <= MAX_ELEMENTS_BYTES + 200, "{} bytes", list.len());
            for (t, el) in attributes(list) {
                assert_eq!(t, NFTA_LIST_ELEM);
                let k = attributes(el).find(|(t, _)| *t == NFTA_SET_ELEM_KEY).unwrap().1;
                keys.push(attributes(k).next().unwrap().1.to_vec());
            }
        }
        assert!(bodies > 10, "{bodies} messages");
        assert_eq!(sent.len(), bodies);
        let want: Vec<Vec<u8>> = elements.iter().map(|e| encode_key(&set.key, &e.key).unwrap()).collect();
        assert_eq!(keys, want);
    }
}
