//! Reading what the kernel logs to an NFLOG group (`log group N` in flock's ruleset): a
//! netfilter netlink socket bound to the group ([`NflogSocket`]), the records decoded
//! ([`parse`]: prefix, interfaces, addresses, protocol, ports), and — in [`denial`] — turned
//! into denials that name pods and policies.
//!
//! The decoding is pure (bytes in, records out) and tested on captured messages; the socket
//! is the I/O edge, tested in network namespaces (`tests/kernel_denials.rs`).

pub mod denial;

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use crate::nfnetlink::{NLM_F_ACK, NLM_F_REQUEST, acks, attr, attributes, message, messages};

// From linux/netfilter/nfnetlink_log.h.
const NFNL_SUBSYS_ULOG: u16 = 4;
const NFULNL_MSG_PACKET: u16 = 0;
const NFULNL_MSG_CONFIG: u16 = 1;
const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;
const NFULA_IFINDEX_INDEV: u16 = 4;
const NFULA_IFINDEX_OUTDEV: u16 = 5;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_PREFIX: u16 = 10;
/// Bytes of each packet copied to the record: the network and transport headers (IPv6 with
/// a few extension headers included).
const COPY_RANGE: u32 = 160;

/// Why the group cannot be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NflogError {
    #[error("cannot open a netfilter netlink socket: {0}")]
    Socket(#[source] io::Error),
    #[error("cannot bind NFLOG group {group}: {error}")]
    Bind {
        group: u16,
        #[source]
        error: io::Error,
    },
    #[error("reading NFLOG group {group}: {error}")]
    Read {
        group: u16,
        #[source]
        error: io::Error,
    },
}

/// One logged packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Logged {
    /// The log rule's prefix.
    pub(crate) prefix: String,
    /// Interface indexes the packet came in on and was to go out on.
    pub(crate) indev: Option<u32>,
    pub(crate) outdev: Option<u32>,
    pub(crate) src: IpAddr,
    pub(crate) dst: IpAddr,
    /// The IP protocol number (6 TCP, 17 UDP, 132 SCTP, 1 / 58 ICMP).
    pub(crate) protocol: u8,
    /// The destination port (TCP, UDP, SCTP).
    pub(crate) dport: Option<u16>,
}

impl Logged {
    /// `TCP`, `UDP`, `SCTP`, `ICMP`, or the protocol's number.
    pub(crate) fn protocol_name(&self) -> String {
        match self.protocol {
            6 => "TCP".into(),
            17 => "UDP".into(),
            132 => "SCTP".into(),
            1 | 58 => "ICMP".into(),
            n => n.to_string(),
        }
    }
}

/// What one datagram from an NFLOG socket holds.
#[derive(Debug, Default)]
pub(crate) struct Received {
    pub(crate) records: Vec<Logged>,
    /// Why each record that could not be decoded could not.
    pub(crate) unreadable: Vec<String>,
}

/// Decodes the messages of one datagram from an NFLOG socket.
pub(crate) fn parse(datagram: &[u8]) -> Received {
    let (mut out, mut bad) = (Vec::new(), Vec::new());
    for m in messages(datagram) {
        match m {
            Ok((ty, _, _, body)) if ty == (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET => match packet(body) {
                Ok(p) => out.push(p),
                Err(e) => bad.push(e),
            },
            Ok(_) => {}
            Err(e) => bad.push(e.to_string()),
        }
    }
    Received { records: out, unreadable: bad }
}

/// One NFULNL_MSG_PACKET's body (after the netlink header): nfgenmsg, then attributes.
fn packet(body: &[u8]) -> Result<Logged, String> {
    let attrs = body.get(4..).ok_or("a record without its nfgenmsg header")?;
    let (mut prefix, mut indev, mut outdev, mut payload) = (String::new(), None, None, None);
    for (ty, value) in attributes(attrs) {
        match ty {
            NFULA_PREFIX => prefix = String::from_utf8_lossy(value.split(|b| *b == 0).next().unwrap_or_default()).into_owned(),
            NFULA_IFINDEX_INDEV => indev = be_u32(value),
            NFULA_IFINDEX_OUTDEV => outdev = be_u32(value),
            NFULA_PAYLOAD => payload = Some(value),
            _ => {}
        }
    }
    let payload = payload.ok_or_else(|| format!("a record ({prefix:?}) without the packet"))?;
    let (src, dst, protocol, transport) =
        ip_header(payload).ok_or_else(|| format!("a record ({prefix:?}) with a packet that is not IP"))?;
    let dport = match protocol {
        6 | 17 | 132 => transport.get(2..4).map(|p| u16::from_be_bytes([p[0], p[1]])),
        _ => None,
    };
    Ok(Logged { prefix, indev, outdev, src, dst, protocol, dport })
}

fn be_u32(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

/// Source, destination, protocol and the transport header of an IPv4 or IPv6 packet
/// (IPv6 extension headers skipped).
fn ip_header(p: &[u8]) -> Option<(IpAddr, IpAddr, u8, &[u8])> {
    match p.first()? >> 4 {
        4 => {
            let ihl = usize::from(p[0] & 0x0f) * 4;
            let src: [u8; 4] = p.get(12..16)?.try_into().ok()?;
            let dst: [u8; 4] = p.get(16..20)?.try_into().ok()?;
            Some((Ipv4Addr::from(src).into(), Ipv4Addr::from(dst).into(), *p.get(9)?, p.get(ihl..).unwrap_or_default()))
        }
        6 => {
            let src: [u8; 16] = p.get(8..24)?.try_into().ok()?;
            let dst: [u8; 16] = p.get(24..40)?.try_into().ok()?;
            let (mut next, mut at) = (*p.get(6)?, 40);
            // Hop-by-hop, routing, destination options (length in 8-byte units, not counting
            // the first 8), fragment (8 bytes).
            for _ in 0..8 {
                match next {
                    0 | 43 | 60 => {
                        let h = p.get(at..at + 2)?;
                        next = h[0];
                        at += (usize::from(h[1]) + 1) * 8;
                    }
                    44 => {
                        next = *p.get(at)?;
                        at += 8;
                    }
                    _ => break,
                }
            }
            Some((Ipv6Addr::from(src).into(), Ipv6Addr::from(dst).into(), next, p.get(at..).unwrap_or_default()))
        }
        _ => None,
    }
}

/// A socket bound to one NFLOG group of the calling thread's network namespace.
pub(crate) struct NflogSocket {
    socket: Socket,
    group: u16,
    buf: Vec<u8>,
}

impl NflogSocket {
    /// Binds `group` (one reader per group and namespace: the kernel refuses a second) and
    /// asks for packet headers; `recv` returns after `timeout` without records.
    pub(crate) fn open(group: u16, timeout: Duration) -> Result<Self, NflogError> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(NflogError::Socket)?;
        socket.bind_auto().map_err(NflogError::Socket)?;
        socket.connect(&SocketAddr::new(0, 0)).map_err(NflogError::Socket)?;
        {
            use nix::sys::socket::{setsockopt, sockopt};
            let tv = nix::sys::time::TimeVal::new(i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX), i64::from(timeout.subsec_micros()));
            setsockopt(&socket, sockopt::ReceiveTimeout, &tv).map_err(|e| NflogError::Socket(e.into()))?;
            // Records arrive in bursts (the rate limit's burst): room for a few hundred.
            setsockopt(&socket, sockopt::RcvBufForce, &(1 << 20)).map_err(|e| NflogError::Socket(e.into()))?;
        }
        let mut s = Self { socket, group, buf: Vec::with_capacity(64 * 1024) };
        let bind = |b: &mut Vec<u8>| attr(b, NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]);
        s.config(1, bind).map_err(|error| NflogError::Bind { group, error })?;
        let mode = |b: &mut Vec<u8>| {
            let mut m = COPY_RANGE.to_be_bytes().to_vec();
            m.extend_from_slice(&[NFULNL_COPY_PACKET, 0]);
            attr(b, NFULA_CFG_MODE, &m);
        };
        s.config(2, mode).map_err(|error| NflogError::Bind { group, error })?;
        Ok(s)
    }

    /// Sends one configuration message for the group and waits for its acknowledgement.
    fn config(&mut self, seq: u32, attrs: impl FnOnce(&mut Vec<u8>)) -> io::Result<()> {
        let mut body = Vec::new();
        attrs(&mut body);
        // nfgenmsg: family unspecified, version 0, the group as res_id.
        let mut msg = Vec::with_capacity(20 + body.len());
        message(&mut msg, (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, seq, 0, self.group, &body);
        self.socket.send(&msg, 0)?;
        loop {
            self.buf.clear();
            self.socket.recv(&mut self.buf, 0)?;
            if let Some((_, code)) = acks(&self.buf).into_iter().find(|(s, _)| *s == seq) {
                return if code == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(-code)) };
            }
        }
    }

    /// The next datagram's records (empty after the timeout). Records the kernel could not
    /// queue because the socket was full are lost: `Ok(None)` says so.
    pub(crate) fn recv(&mut self) -> Result<Option<Received>, NflogError> {
        self.buf.clear();
        match self.socket.recv(&mut self.buf, 0) {
            Ok(_) => Ok(Some(parse(&self.buf))),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Ok(Some(Received::default())),
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => Ok(None),
            Err(error) => Err(NflogError::Read { group: self.group, error }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfnetlink::nul_terminated;

    /// An NFULNL_MSG_PACKET as the kernel sends it, for `payload` with `prefix`.
    pub(crate) fn message(prefix: &str, indev: Option<u32>, outdev: Option<u32>, payload: &[u8]) -> Vec<u8> {
        let mut body = vec![2u8, 0, 0, 100];
        attr(&mut body, 1, &[0x08, 0x00, 2, 0]);
        attr(&mut body, NFULA_PREFIX, &nul_terminated(prefix));
        if let Some(i) = indev {
            attr(&mut body, NFULA_IFINDEX_INDEV, &i.to_be_bytes());
        }
        if let Some(i) = outdev {
            attr(&mut body, NFULA_IFINDEX_OUTDEV, &i.to_be_bytes());
        }
        attr(&mut body, NFULA_PAYLOAD, payload);
        let mut msg = Vec::new();
        msg.extend_from_slice(&u32::try_from(16 + body.len()).unwrap().to_ne_bytes());
        msg.extend_from_slice(&((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET).to_ne_bytes());
        msg.extend_from_slice(&0u16.to_ne_bytes());
        msg.extend_from_slice(&[0; 8]);
        msg.extend_from_slice(&body);
        msg
    }

    pub(crate) fn tcp_syn_v4(src: [u8; 4], dst: [u8; 4], dport: u16) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0];
        p.extend_from_slice(&src);
        p.extend_from_slice(&dst);
        p.extend_from_slice(&40000u16.to_be_bytes());
        p.extend_from_slice(&dport.to_be_bytes());
        p.extend_from_slice(&[0; 16]);
        p
    }

    #[test]
    fn decodes_ipv4_and_ipv6_records_and_reports_bad_ones() {
        let mut d = message("flock:deny:ingress:flk1", Some(3), Some(7), &tcp_syn_v4([198, 18, 1, 11], [198, 18, 2, 21], 80));
        // IPv6 UDP behind a hop-by-hop header.
        let mut v6 = vec![0x60, 0, 0, 0, 0, 16, 0, 64];
        v6.extend_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&"2001:db8::2".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&[17, 0, 0, 0, 0, 0, 0, 0]);
        v6.extend_from_slice(&[0x9c, 0x40, 0x00, 0x35, 0, 8, 0, 0]);
        d.extend(message("flock:spoofed", Some(4), None, &v6));
        d.extend(message("flock:unknown-pod", None, Some(5), &[0x00, 1, 2]));
        let Received { records: ok, unreadable: bad } = parse(&d);
        assert_eq!(ok.len(), 2);
        assert_eq!(
            ok[0],
            Logged {
                prefix: "flock:deny:ingress:flk1".into(),
                indev: Some(3),
                outdev: Some(7),
                src: "198.18.1.11".parse().unwrap(),
                dst: "198.18.2.21".parse().unwrap(),
                protocol: 6,
                dport: Some(80),
            }
        );
        assert_eq!((ok[1].src.to_string().as_str(), ok[1].protocol, ok[1].dport), ("2001:db8::1", 17, Some(53)));
        assert_eq!(ok[1].protocol_name(), "UDP");
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(bad[0].contains("flock:unknown-pod"), "{bad:?}");
        // Truncated input does not panic.
        for cut in 0..d.len() {
            let _ = parse(&d[..cut]);
        }
    }
}
