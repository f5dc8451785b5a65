//! The kernel's connection tracking table over ctnetlink: list the entries of a network
//! namespace ([`ConntrackSocket::dump`]), set or clear bits of their ct mark
//! ([`ConntrackSocket::set_mark`]), and create entries (benchmarks and tests fill a table
//! without traffic: [`ConntrackSocket::create`]).
//!
//! flock uses it to cut the connections a policy change denies (`crate::revoke`): the
//! ruleset accepts packets of established connections without looking at policy, so a
//! connection admitted before the change would otherwise outlive it; marked, it is stopped.
//!
//! The encoding and decoding are pure (bytes in, entries out; unit-tested on the messages
//! the kernel sends); the socket is the I/O edge, tested in network namespaces.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use crate::nfnetlink::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_MULTI, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, acks, attr, attributes, message,
    messages, nested,
};

// From linux/netfilter/nfnetlink_conntrack.h.
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const CTA_PROTOINFO: u16 = 4;
const CTA_TIMEOUT: u16 = 7;
const CTA_MARK: u16 = 8;
const CTA_ID: u16 = 12;
const CTA_ZONE: u16 = 18;
const CTA_MARK_MASK: u16 = 21;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;
const TCP_CONNTRACK_ESTABLISHED: u8 = 3;
const TCP_CONNTRACK_TIME_WAIT: u8 = 7;
const TCP_CONNTRACK_CLOSE: u8 = 8;
const IPS_ASSURED: u32 = 1 << 2;
const IPS_CONFIRMED: u32 = 1 << 3;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const ENOENT: i32 = 2;

/// Protocols whose tuples carry ports.
const TCP: u8 = 6;
const UDP: u8 = 17;
const SCTP: u8 = 132;

/// Requests sent before their acknowledgements are read.
const WINDOW: usize = 256;

/// Why the table cannot be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error("cannot open a ctnetlink socket: {0}")]
    Socket(#[source] io::Error),
    #[error("listing the conntrack table: {0}")]
    Dump(#[source] io::Error),
    #[error("ctnetlink sent an unexpected reply: {0}")]
    Protocol(String),
    #[error("creating the conntrack entry {tuple}: {error}")]
    Create {
        tuple: String,
        #[source]
        error: io::Error,
    },
    #[error("changing conntrack entries: {0}")]
    Update(#[source] io::Error),
}

/// One direction of a connection: addresses, protocol and ports (0 for a protocol without
/// ports, e.g. ICMP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub protocol: u8,
    pub sport: u16,
    pub dport: u16,
}

impl std::fmt::Display for Tuple {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let proto = protocol_name(self.protocol);
        let ep = |a: IpAddr, p: u16| match (a, p) {
            (_, 0) => a.to_string(),
            (IpAddr::V4(a), p) => format!("{a}:{p}"),
            (IpAddr::V6(a), p) => format!("[{a}]:{p}"),
        };
        write!(f, "{proto} {} -> {}", ep(self.src, self.sport), ep(self.dst, self.dport))
    }
}

/// `TCP`, `UDP`, `SCTP`, `ICMP`, or the protocol's number.
pub(crate) fn protocol_name(n: u8) -> String {
    match n {
        TCP => "TCP".into(),
        UDP => "UDP".into(),
        SCTP => "SCTP".into(),
        1 | 58 => "ICMP".into(),
        n => n.to_string(),
    }
}

/// One entry of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// As the first packet was seen (before any NAT).
    pub orig: Tuple,
    /// As replies are expected (after NAT: its source is the address the first packet was
    /// translated to).
    pub(crate) reply: Tuple,
    pub(crate) zone: u16,
    /// The kernel's id of the entry.
    pub id: Option<u32>,
    pub mark: u32,
    /// TCP: conntrack's state of the connection (`TCP_CONNTRACK_*`).
    pub tcp_state: Option<u8>,
    /// The original tuple as the kernel encoded it (with whatever a protocol adds, such as
    /// ICMP's id, type and code), sent back verbatim to change the entry.
    raw_orig: Vec<u8>,
}

impl Entry {
    /// An entry of the connection `orig` whose replies are `reply` (zone 0, no mark), as the
    /// kernel would list it: for benchmarks and tests that judge entries without a kernel.
    #[cfg(test)]
    pub(crate) fn new(orig: Tuple, reply: Tuple) -> Self {
        let mut raw_orig = Vec::new();
        encode_tuple(&mut raw_orig, &orig);
        Self { orig, reply, zone: 0, id: None, mark: 0, tcp_state: None, raw_orig }
    }

    /// The connection as policy judged its first packet: from the original source to the
    /// destination after DNAT (a service's backend), on the destination port after DNAT.
    pub(crate) fn policed(&self) -> Tuple {
        Tuple { src: self.orig.src, dst: self.reply.src, protocol: self.orig.protocol, sport: self.orig.sport, dport: self.reply.sport }
    }

    /// A TCP connection both ends have closed (TIME_WAIT, CLOSE): nothing flows on it any
    /// more, and a SYN of the same tuple starts a new connection that policy judges.
    pub fn is_closed(&self) -> bool {
        matches!(self.tcp_state, Some(TCP_CONNTRACK_TIME_WAIT | TCP_CONNTRACK_CLOSE))
    }

    fn family(&self) -> u8 {
        if self.orig.src.is_ipv4() { AF_INET } else { AF_INET6 }
    }
}

/// What a change of entries did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changed {
    /// Entries changed.
    pub changed: usize,
    /// Entries already gone (expired meanwhile).
    pub gone: usize,
    /// Entries the kernel refused to change, by original tuple, with why.
    pub failed: Vec<(Tuple, String)>,
}

/// An entry to create (see [`ConntrackSocket::create`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewEntry {
    pub orig: Tuple,
    pub reply: Tuple,
    /// Seconds until it expires.
    pub timeout: u32,
    pub mark: u32,
}

impl NewEntry {
    /// A connection seen both ways, without NAT.
    pub fn plain(orig: Tuple, timeout: u32) -> Self {
        let reply = Tuple { src: orig.dst, dst: orig.src, protocol: orig.protocol, sport: orig.dport, dport: orig.sport };
        Self { orig, reply, timeout, mark: 0 }
    }
}

/// What a listing of the table found.
#[derive(Debug, Default)]
pub struct Dump {
    pub entries: Vec<Entry>,
    /// Messages that could not be decoded, with why.
    pub unreadable: Vec<String>,
}

/// A ctnetlink socket of the calling thread's network namespace.
pub struct ConntrackSocket {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl ConntrackSocket {
    /// Opens a socket in the calling thread's network namespace (it stays bound to it).
    pub fn open() -> Result<Self, ConntrackError> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(ConntrackError::Socket)?;
        socket.bind_auto().map_err(ConntrackError::Socket)?;
        socket.connect(&SocketAddr::new(0, 0)).map_err(ConntrackError::Socket)?;
        socket.set_cap_ack(true).map_err(ConntrackError::Socket)?;
        {
            use nix::sys::socket::{setsockopt, sockopt};
            // A dump's messages arrive as fast as they are read; acknowledgements of a window
            // of changes must all fit.
            setsockopt(&socket, sockopt::RcvBufForce, &(4 << 20)).map_err(|e| ConntrackError::Socket(e.into()))?;
        }
        Ok(Self { socket, seq: 1, buf: Vec::with_capacity(1 << 20) })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Every entry of the table (both families).
    pub fn dump(&mut self) -> Result<Dump, ConntrackError> {
        let seq = self.next_seq();
        let mut msg = Vec::with_capacity(20);
        message(&mut msg, ty(IPCTNL_MSG_CT_GET), NLM_F_REQUEST | NLM_F_DUMP, seq, 0, 0, &[]);
        self.socket.send(&msg, 0).map_err(ConntrackError::Dump)?;
        let mut out = Dump::default();
        loop {
            self.buf.clear();
            self.socket.recv(&mut self.buf, 0).map_err(ConntrackError::Dump)?;
            if decode_dump(&self.buf, seq, &mut out)? {
                return Ok(out);
            }
        }
    }

    /// Sets (`on`) or clears the bits `mask` of the ct mark of `entries` (each found by its
    /// original tuple and zone), leaving the other bits alone.
    pub fn set_mark(&mut self, entries: &[&Entry], mask: u32, on: bool) -> Result<Changed, ConntrackError> {
        let mut out = Changed::default();
        for window in entries.chunks(WINDOW) {
            let first = self.seq.wrapping_add(1);
            let mut buf = Vec::with_capacity(window.len() * 96);
            for e in window {
                let seq = self.next_seq();
                buf.extend_from_slice(&encode_mark(e, mask, on, seq));
            }
            self.socket.send(&buf, 0).map_err(ConntrackError::Update)?;
            let mut pending = window.len();
            while pending > 0 {
                self.buf.clear();
                self.socket.recv(&mut self.buf, 0).map_err(ConntrackError::Update)?;
                for (seq, code) in acks(&self.buf) {
                    let Some(e) = seq.checked_sub(first).and_then(|i| window.get(i as usize)) else { continue };
                    pending -= 1;
                    match code {
                        0 => out.changed += 1,
                        c if c == -ENOENT => out.gone += 1,
                        c => out.failed.push((e.orig, io::Error::from_raw_os_error(-c).to_string())),
                    }
                }
            }
        }
        Ok(out)
    }

    /// Creates an entry as if its connection had been seen both ways (TCP: established).
    pub fn create(&mut self, e: &NewEntry) -> Result<(), ConntrackError> {
        let seq = self.next_seq();
        let msg = encode_create(e, seq);
        let failed = |error| ConntrackError::Create { tuple: e.orig.to_string(), error };
        self.socket.send(&msg, 0).map_err(failed)?;
        loop {
            self.buf.clear();
            self.socket.recv(&mut self.buf, 0).map_err(failed)?;
            if let Some((_, code)) = acks(&self.buf).into_iter().find(|(s, _)| *s == seq) {
                return if code == 0 { Ok(()) } else { Err(failed(io::Error::from_raw_os_error(-code))) };
            }
        }
    }
}

fn ty(msg: u16) -> u16 {
    (NFNL_SUBSYS_CTNETLINK << 8) | msg
}

/// Decodes one datagram of a dump answering `seq` into `out`; `true` once the dump is done.
fn decode_dump(datagram: &[u8], seq: u32, out: &mut Dump) -> Result<bool, ConntrackError> {
    for m in messages(datagram) {
        let (t, flags, s, body) = m.map_err(|e| ConntrackError::Protocol(e.to_string()))?;
        if s != seq {
            continue;
        }
        match t {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let code = body.get(..4).map_or(0, |c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]));
                if code != 0 {
                    return Err(ConntrackError::Dump(io::Error::from_raw_os_error(-code)));
                }
                if flags & NLM_F_MULTI == 0 {
                    return Ok(true);
                }
            }
            t if t == ty(IPCTNL_MSG_CT_NEW) => match decode_entry(body) {
                Ok(e) => out.entries.push(e),
                Err(why) => out.unreadable.push(why),
            },
            _ => {}
        }
    }
    Ok(false)
}

/// One IPCTNL_MSG_CT_NEW body (nfgenmsg, then attributes).
fn decode_entry(body: &[u8]) -> Result<Entry, String> {
    let attrs = body.get(4..).ok_or("an entry without its nfgenmsg header")?;
    let (mut orig, mut reply, mut raw_orig) = (None, None, Vec::new());
    let (mut zone, mut id, mut mark, mut tcp_state) = (0, None, 0, None);
    for (t, v) in attributes(attrs) {
        match t {
            CTA_TUPLE_ORIG => {
                orig = Some(decode_tuple(v)?);
                raw_orig = v.to_vec();
            }
            CTA_TUPLE_REPLY => reply = Some(decode_tuple(v)?),
            CTA_ZONE => zone = be_u16(v).unwrap_or(0),
            CTA_ID => id = be_u32(v),
            CTA_MARK => mark = be_u32(v).unwrap_or(0),
            CTA_PROTOINFO => {
                let tcp = attributes(v).find(|(t, _)| *t == CTA_PROTOINFO_TCP);
                tcp_state =
                    tcp.and_then(|(_, v)| attributes(v).find(|(t, _)| *t == CTA_PROTOINFO_TCP_STATE)).and_then(|(_, v)| v.first().copied());
            }
            _ => {}
        }
    }
    match (orig, reply) {
        (Some(orig), Some(reply)) => Ok(Entry { orig, reply, zone, id, mark, tcp_state, raw_orig }),
        _ => Err("an entry without both tuples".into()),
    }
}

fn decode_tuple(v: &[u8]) -> Result<Tuple, String> {
    let (mut src, mut dst, mut protocol, mut sport, mut dport) = (None, None, None, 0, 0);
    for (t, v) in attributes(v) {
        match t {
            CTA_TUPLE_IP => {
                for (t, v) in attributes(v) {
                    match t {
                        CTA_IP_V4_SRC => src = v4(v),
                        CTA_IP_V4_DST => dst = v4(v),
                        CTA_IP_V6_SRC => src = v6(v),
                        CTA_IP_V6_DST => dst = v6(v),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for (t, v) in attributes(v) {
                    match t {
                        CTA_PROTO_NUM => protocol = v.first().copied(),
                        CTA_PROTO_SRC_PORT => sport = be_u16(v).unwrap_or(0),
                        CTA_PROTO_DST_PORT => dport = be_u16(v).unwrap_or(0),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    match (src, dst, protocol) {
        (Some(src), Some(dst), Some(protocol)) => Ok(Tuple { src, dst, protocol, sport, dport }),
        _ => Err("a tuple without addresses or protocol".into()),
    }
}

/// An update of `e`'s ct mark: `(mark & !mask) | (on ? mask : 0)` (the kernel computes
/// `(mark & ~CTA_MARK_MASK) ^ CTA_MARK`).
fn encode_mark(e: &Entry, mask: u32, on: bool, seq: u32) -> Vec<u8> {
    let mut body = Vec::with_capacity(e.raw_orig.len() + 32);
    nested(&mut body, CTA_TUPLE_ORIG, |b| b.extend_from_slice(&e.raw_orig));
    attr(&mut body, CTA_ZONE, &e.zone.to_be_bytes());
    attr(&mut body, CTA_MARK, &(if on { mask } else { 0 }).to_be_bytes());
    attr(&mut body, CTA_MARK_MASK, &mask.to_be_bytes());
    let mut out = Vec::with_capacity(body.len() + 20);
    // An update: without NLM_F_CREATE, a missing entry is an error (ENOENT), not created.
    message(&mut out, ty(IPCTNL_MSG_CT_NEW), NLM_F_REQUEST | NLM_F_ACK, seq, e.family(), 0, &body);
    out
}

fn encode_tuple(out: &mut Vec<u8>, t: &Tuple) {
    nested(out, CTA_TUPLE_IP, |b| match (t.src, t.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            attr(b, CTA_IP_V4_SRC, &s.octets());
            attr(b, CTA_IP_V4_DST, &d.octets());
        }
        (s, d) => {
            attr(b, CTA_IP_V6_SRC, &v6_octets(s));
            attr(b, CTA_IP_V6_DST, &v6_octets(d));
        }
    });
    nested(out, CTA_TUPLE_PROTO, |b| {
        attr(b, CTA_PROTO_NUM, &[t.protocol]);
        if matches!(t.protocol, TCP | UDP | SCTP) {
            attr(b, CTA_PROTO_SRC_PORT, &t.sport.to_be_bytes());
            attr(b, CTA_PROTO_DST_PORT, &t.dport.to_be_bytes());
        }
    });
}

fn encode_create(e: &NewEntry, seq: u32) -> Vec<u8> {
    let mut body = Vec::with_capacity(160);
    nested(&mut body, CTA_TUPLE_ORIG, |b| encode_tuple(b, &e.orig));
    nested(&mut body, CTA_TUPLE_REPLY, |b| encode_tuple(b, &e.reply));
    attr(&mut body, CTA_TIMEOUT, &e.timeout.to_be_bytes());
    // ASSURED keeps the entry from early drop, as a connection seen both ways is; CONFIRMED
    // is what the kernel sets on an entry it inserts (conntrack-tools sends it too: a status
    // differing there is refused, EBUSY), SEEN_REPLY it refuses to set.
    attr(&mut body, CTA_STATUS, &(IPS_ASSURED | IPS_CONFIRMED).to_be_bytes());
    if e.mark != 0 {
        attr(&mut body, CTA_MARK, &e.mark.to_be_bytes());
    }
    if e.orig.protocol == TCP {
        nested(&mut body, CTA_PROTOINFO, |b| {
            nested(b, CTA_PROTOINFO_TCP, |b| attr(b, CTA_PROTOINFO_TCP_STATE, &[TCP_CONNTRACK_ESTABLISHED]));
        });
    }
    let family = if e.orig.src.is_ipv4() { AF_INET } else { AF_INET6 };
    let mut out = Vec::with_capacity(body.len() + 20);
    message(&mut out, ty(IPCTNL_MSG_CT_NEW), NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, seq, family, 0, &body);
    out
}

fn v6_octets(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V6(a) => a.octets(),
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
    }
}

fn v4(v: &[u8]) -> Option<IpAddr> {
    let o: [u8; 4] = v.get(..4)?.try_into().ok()?;
    Some(Ipv4Addr::from(o).into())
}

fn v6(v: &[u8]) -> Option<IpAddr> {
    let o: [u8; 16] = v.get(..16)?.try_into().ok()?;
    Some(Ipv6Addr::from(o).into())
}

fn be_u16(v: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(v.get(..2)?.try_into().ok()?))
}

fn be_u32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(src: &str, dst: &str, protocol: u8, sport: u16, dport: u16) -> Tuple {
        Tuple { src: src.parse().unwrap(), dst: dst.parse().unwrap(), protocol, sport, dport }
    }

    /// An IPCTNL_MSG_CT_NEW message as the kernel sends it in a dump: the tuples (nested
    /// flags set), then other attributes.
    fn dumped(orig: &Tuple, reply: &Tuple, zone: u16, id: u32, seq: u32) -> Vec<u8> {
        let mut body = Vec::new();
        nested(&mut body, CTA_TUPLE_ORIG, |b| encode_tuple(b, orig));
        nested(&mut body, CTA_TUPLE_REPLY, |b| encode_tuple(b, reply));
        attr(&mut body, CTA_STATUS, &0x18eu32.to_be_bytes());
        if orig.protocol == TCP {
            nested(&mut body, CTA_PROTOINFO, |b| {
                nested(b, CTA_PROTOINFO_TCP, |b| attr(b, CTA_PROTOINFO_TCP_STATE, &[TCP_CONNTRACK_TIME_WAIT]))
            });
        }
        attr(&mut body, CTA_MARK, &7u32.to_be_bytes());
        attr(&mut body, CTA_ZONE, &zone.to_be_bytes());
        attr(&mut body, CTA_ID, &id.to_be_bytes());
        let mut out = Vec::new();
        let family = if orig.src.is_ipv4() { AF_INET } else { AF_INET6 };
        message(&mut out, ty(IPCTNL_MSG_CT_NEW), NLM_F_MULTI, seq, family, 0, &body);
        out
    }

    #[test]
    fn a_dump_is_decoded_and_its_policed_flow_is_after_dnat() {
        // A service flow: 198.18.0.5 -> VIP 198.19.0.1:80, DNAT to 198.18.1.7:8080.
        let orig = tuple("198.18.0.5", "198.19.0.1", TCP, 40000, 80);
        let reply = tuple("198.18.1.7", "198.18.0.5", TCP, 8080, 40000);
        let v6o = tuple("2001:db8::5", "2001:db8::7", UDP, 5353, 53);
        let v6r = tuple("2001:db8::7", "2001:db8::5", UDP, 53, 5353);
        let mut datagram = dumped(&orig, &reply, 0, 11, 9);
        datagram.extend(dumped(&v6o, &v6r, 3, 12, 9));
        // Another request's message is not this dump's.
        datagram.extend(dumped(&v6o, &v6r, 3, 13, 8));
        let mut out = Dump::default();
        assert!(!decode_dump(&datagram, 9, &mut out).unwrap());
        assert_eq!(out.entries.len(), 2);
        let e = &out.entries[0];
        assert_eq!((e.orig, e.reply, e.zone, e.id, e.mark), (orig, reply, 0, Some(11), 7));
        assert_eq!(e.policed(), tuple("198.18.0.5", "198.18.1.7", TCP, 40000, 8080));
        assert_eq!(e.tcp_state, Some(TCP_CONNTRACK_TIME_WAIT));
        assert!(e.is_closed());
        assert!(!out.entries[1].is_closed());
        assert_eq!(out.entries[1].zone, 3);
        assert_eq!(out.entries[1].policed(), v6o);

        let mut done = Vec::new();
        message(&mut done, NLMSG_DONE, NLM_F_MULTI, 9, 0, 0, &[0; 4]);
        assert!(decode_dump(&done, 9, &mut out).unwrap());
    }

    #[test]
    fn a_mark_is_set_on_the_tuple_the_kernel_gave_and_only_under_the_mask() {
        let orig = tuple("198.18.0.5", "198.18.1.7", UDP, 1000, 53);
        let mut out = Dump::default();
        decode_dump(&dumped(&orig, &tuple("198.18.1.7", "198.18.0.5", UDP, 53, 1000), 2, 44, 1), 1, &mut out).unwrap();
        for (on, value) in [(true, 0x0100_0000u32), (false, 0)] {
            let msg = encode_mark(&out.entries[0], 0x0100_0000, on, 5);
            let (t, flags, seq, body) = messages(&msg).next().unwrap().unwrap();
            assert_eq!((t, flags, seq), (ty(IPCTNL_MSG_CT_NEW), NLM_F_REQUEST | NLM_F_ACK, 5));
            assert_eq!(body[0], AF_INET);
            let attrs: Vec<(u16, &[u8])> = attributes(&body[4..]).collect();
            assert_eq!(attrs.len(), 4);
            assert_eq!(decode_tuple(attrs[0].1).unwrap(), orig);
            assert_eq!((attrs[1].0, attrs[1].1), (CTA_ZONE, &2u16.to_be_bytes()[..]));
            assert_eq!((attrs[2].0, attrs[2].1), (CTA_MARK, &value.to_be_bytes()[..]));
            assert_eq!((attrs[3].0, attrs[3].1), (CTA_MARK_MASK, &0x0100_0000u32.to_be_bytes()[..]));
        }
    }

    #[test]
    fn broken_messages_are_reported_not_trusted() {
        let mut out = Dump::default();
        let mut body = Vec::new();
        nested(&mut body, CTA_TUPLE_ORIG, |b| attr(b, CTA_TUPLE_IP, &[]));
        let mut m = Vec::new();
        message(&mut m, ty(IPCTNL_MSG_CT_NEW), NLM_F_MULTI, 1, AF_INET, 0, &body);
        assert!(!decode_dump(&m, 1, &mut out).unwrap());
        assert!(out.entries.is_empty());
        assert_eq!(out.unreadable.len(), 1);
        // A length beyond the datagram.
        let mut bad = m.clone();
        bad[0] = 0xff;
        assert!(matches!(decode_dump(&bad, 1, &mut out), Err(ConntrackError::Protocol(_))));
        // An error answering the dump.
        let mut err = Vec::new();
        message(&mut err, NLMSG_ERROR, 0, 1, 0, 0, &[]);
        let code = (-1i32).to_ne_bytes();
        let at = err.len() - 4;
        err[at..].copy_from_slice(&code);
        assert!(matches!(decode_dump(&err, 1, &mut out), Err(ConntrackError::Dump(_))));
    }

    #[test]
    fn tuples_print_for_people() {
        assert_eq!(tuple("198.18.0.5", "198.18.1.7", TCP, 1000, 80).to_string(), "TCP 198.18.0.5:1000 -> 198.18.1.7:80");
        assert_eq!(tuple("2001:db8::1", "2001:db8::2", 58, 0, 0).to_string(), "ICMP 2001:db8::1 -> 2001:db8::2");
    }
}
