//! Probes: from inside a source namespace, one connection attempt to a destination address,
//! classified as connected, refused, timeout, unreachable or unavailable.
//!
//! A probe by name first resolves it (through the given DNS server, from the source, as a
//! stub resolver: the query sent again when the probe's timeout passes without an answer,
//! [`super::dns::ATTEMPTS`] times in all) and connects to the first address of the answer; a
//! name that does not resolve is "unresolved".
//!
//! TCP: a completed handshake. UDP: a datagram that is answered (ICMP port unreachable is
//! "refused"). SCTP: a completed association, or "unavailable" when the kernel has no SCTP.
//! Policy drops are silent, so a blocked flow is a timeout; refused and unreachable mean the
//! packet was answered by the network, not by policy.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{self, AddressFamily, SockFlag, SockProtocol, SockType, SockaddrStorage, sockopt};

use crate::model::Protocol;
use crate::netns::{self, Netns};

/// What a probe saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    Connected,
    Refused,
    Timeout,
    Unreachable,
    /// The kernel lacks the protocol.
    Unavailable,
    /// A probe by name: no answer, or none with an address of the family.
    Unresolved,
}

impl Outcome {
    /// Every outcome, in the order truth-table legends list them.
    pub const ALL: [Outcome; 6] = [Self::Connected, Self::Timeout, Self::Refused, Self::Unreachable, Self::Unavailable, Self::Unresolved];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connected => "connected",
            Self::Refused => "refused",
            Self::Timeout => "timeout",
            Self::Unreachable => "unreachable",
            Self::Unavailable => "unavailable",
            Self::Unresolved => "unresolved",
        }
    }

    /// One character for truth tables.
    pub fn symbol(self) -> char {
        match self {
            Self::Connected => '.',
            Self::Refused => 'R',
            Self::Timeout => 'X',
            Self::Unreachable => 'U',
            Self::Unavailable => '?',
            Self::Unresolved => 'N',
        }
    }

    /// What the outcome means, for the legend under a truth table.
    pub fn meaning(self) -> &'static str {
        match self {
            Self::Connected => "connected",
            Self::Timeout => "timeout: no answer (a NetworkPolicy drop is silent)",
            Self::Refused => "refused: the packet got there, but the destination does not serve that port",
            Self::Unreachable => "unreachable: no route to the destination",
            Self::Unavailable => "unavailable: this kernel lacks the protocol",
            Self::Unresolved => "unresolved: the name got no answer with an address of the family",
        }
    }
}

/// Where a probe goes.
#[derive(Debug, Clone)]
pub enum Dest {
    Address(SocketAddr),
    /// `name`'s first address of the family (IPv6 or not) the `resolver` answers, on `port`.
    Name {
        name: String,
        v6: bool,
        resolver: SocketAddr,
        port: u16,
    },
}

/// One probe to run.
#[derive(Debug, Clone)]
pub struct Task {
    pub src: Netns,
    pub dst: Dest,
    pub protocol: Protocol,
}

const PAYLOAD: &[u8] = b"flock-probe";

/// Runs one probe from `src` (on a thread that enters it).
pub fn probe(task: &Task, timeout: Duration) -> Outcome {
    let (dst, proto) = (task.dst.clone(), task.protocol);
    netns::run_in(&task.src, move || {
        let dst = match dst {
            Dest::Address(a) => a,
            Dest::Name { name, v6, resolver, port } => {
                let Some(first) = super::dns::lookup(&name, v6, resolver, timeout).and_then(|a| a.first().copied()) else {
                    return Outcome::Unresolved;
                };
                SocketAddr::new(first, port)
            }
        };
        match proto {
            Protocol::Tcp => tcp(dst, timeout),
            Protocol::Udp => udp(dst, timeout),
            Protocol::Sctp => sctp(dst, timeout),
        }
    })
    .unwrap_or(Outcome::Unreachable)
}

/// Runs every task with at most `parallelism` at a time; outcomes in task order.
pub fn probe_all(tasks: &[Task], timeout: Duration, parallelism: usize) -> Vec<Outcome> {
    let next = AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<Outcome>>> = tasks.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..parallelism.clamp(1, tasks.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(t) = tasks.get(i) else { return };
                    let o = probe(t, timeout);
                    if let Ok(mut slot) = results[i].lock() {
                        *slot = Some(o);
                    }
                }
            });
        }
    });
    results.into_iter().map(|m| m.into_inner().ok().flatten().unwrap_or(Outcome::Unreachable)).collect()
}

fn classify(e: &std::io::Error) -> Outcome {
    match e.kind() {
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionReset => Outcome::Refused,
        ErrorKind::TimedOut | ErrorKind::WouldBlock => Outcome::Timeout,
        _ => match e.raw_os_error() {
            Some(nix::libc::EPROTONOSUPPORT | nix::libc::ESOCKTNOSUPPORT) => Outcome::Unavailable,
            _ => Outcome::Unreachable,
        },
    }
}

fn tcp(dst: SocketAddr, timeout: Duration) -> Outcome {
    match TcpStream::connect_timeout(&dst, timeout) {
        Ok(_) => Outcome::Connected,
        Err(e) => classify(&e),
    }
}

fn udp(dst: SocketAddr, timeout: Duration) -> Outcome {
    let any: SocketAddr = if dst.is_ipv4() { "0.0.0.0:0".parse() } else { "[::]:0".parse() }.unwrap_or(dst);
    let run = || -> std::io::Result<Outcome> {
        let s = UdpSocket::bind(any)?;
        s.connect(dst)?;
        s.set_read_timeout(Some(timeout))?;
        s.send(PAYLOAD)?;
        let mut buf = [0u8; 64];
        let n = s.recv(&mut buf)?;
        Ok(if &buf[..n] == PAYLOAD { Outcome::Connected } else { Outcome::Unreachable })
    };
    run().unwrap_or_else(|e| classify(&e))
}

fn sctp(dst: SocketAddr, timeout: Duration) -> Outcome {
    let family = if dst.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    let fd = match socket::socket(family, SockType::Stream, SockFlag::SOCK_NONBLOCK, SockProtocol::Sctp) {
        Ok(fd) => fd,
        Err(nix::Error::EPROTONOSUPPORT | nix::Error::ESOCKTNOSUPPORT) => return Outcome::Unavailable,
        Err(_) => return Outcome::Unreachable,
    };
    let addr = SockaddrStorage::from(dst);
    match socket::connect(fd.as_raw_fd(), &addr) {
        Ok(()) => return Outcome::Connected,
        Err(nix::Error::EINPROGRESS) => {}
        Err(e) => return classify(&std::io::Error::from(e)),
    }
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Outcome::Timeout;
        }
        let mut fds = [PollFd::new(std::os::fd::AsFd::as_fd(&fd), PollFlags::POLLOUT)];
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => return Outcome::Timeout,
            Ok(_) => break,
            Err(nix::Error::EINTR) => continue,
            Err(_) => return Outcome::Unreachable,
        }
    }
    match socket::getsockopt(&fd, sockopt::SocketError) {
        Ok(0) => Outcome::Connected,
        Ok(errno) => classify(&std::io::Error::from_raw_os_error(errno)),
        Err(_) => Outcome::Unreachable,
    }
}
