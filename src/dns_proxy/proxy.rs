//! The agent's transparent DNS proxy (issue "Egress by domain name"): DNS queries of local
//! pods whose egress has a domain rule reach it through nft `tproxy` (UDP and TCP), it asks
//! the resolver the pod addressed, and before the pod sees an answer from a trusted resolver
//! it hands what the answer teaches ([`crate::dns::learn`]) to a [`Learner`] (the agent's:
//! addresses into the domain rules' timed nft sets). The pod receives the answer only after
//! the learner has admitted the addresses, so it can never connect to an address before flock
//! admits it — no race by construction.
//!
//! Every packet it takes is a hostile pod's, so (issue "The DNS proxy under attack"):
//! - It takes only what the steering delivers. It listens on the loopback addresses
//!   (127.0.0.1 and ::1, transparent), where the rendered `tproxy` sends steered DNS and where
//!   no pod can address a packet (the kernel drops loopback destinations arriving on other
//!   interfaces); a query whose original destination is not port 53 of a trusted resolver is
//!   dropped (the steering sends nothing else), so nothing can make it query itself.
//! - It asks as the pod: the upstream socket is transparent, bound to the pod's address, so
//!   the resolver's own policy judges the pod (on another node in its `forward` chain, on this
//!   one in `dns-upstream`, which sends such packets through the resolver's ingress chain),
//!   and the resolver sees the pod, not the node. The socket carries a mark
//!   ([`ProxyConfig::upstream_mark`]) by which the rendered table marks its connection, whose
//!   answers policy routing then delivers back here, not to the pod.
//! - An answer counts only as the answer to the query the proxy sent: its own random id (never
//!   the pod's, which the pod knows), a fresh source port per query (UDP), the question byte for
//!   byte with the name's letters in a random case (DNS 0x20, [`ProxyConfig::randomize_case`]);
//!   anything else is dropped and counted, and the proxy keeps waiting for the real one
//!   ([`crate::dns::exchange`]). What it learns is only the asked type (A or AAAA).
//! - It is bounded ([`Bounds`]): queries in flight per pod and per node, TCP connections per
//!   pod and per node with an idle timeout, the upstream timeout, the size of a UDP answer
//!   (a larger one is answered truncated, so the pod asks over TCP). What it refuses is
//!   counted by reason ([`ProxyStats::refused`]).
//!
//! The pod gets the answer from the resolver's own address and port (a transparent socket
//! bound to it), so its stub resolver takes it. One that teaches nothing (another question
//! type, an error code, from a resolver not trusted) is passed on and counted; when the
//! learner fails, the pod gets `SERVFAIL` instead of an answer it could not use (its
//! connections to those addresses would be dropped: fail closed, and said so). What it does
//! not own: the nft steering and policy routing (the renderer and the agent), which pods'
//! queries come here, and what a name admits (the learner's).

use std::collections::HashMap;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, ResponseCode};
use nix::sys::socket::{
    self, AddressFamily, Backlog, ControlMessageOwned, MsgFlags, SockFlag, SockType, SockaddrIn, SockaddrIn6, SockaddrStorage, sockopt,
};
use tokio::io::Interest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream, UdpSocket};
use tokio::sync::watch;

use crate::dns::exchange::{self, Outstanding};
use crate::dns::{Learned, Limits, learn, response_to};

/// How much the proxy lets pods take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// UDP queries waiting for their answer, per pod and on the node; beyond, dropped.
    pub in_flight_per_pod: usize,
    pub in_flight: usize,
    /// TCP connections from pods, per pod and on the node; beyond, closed at once.
    pub tcp_per_pod: usize,
    pub tcp: usize,
    /// A pod's TCP connection with no complete query for this long is closed.
    pub tcp_idle: Duration,
    /// The largest UDP answer taken from a resolver; a larger one reaches the pod as a
    /// truncated answer, and the pod asks again over TCP.
    pub max_udp_answer: usize,
}

impl Default for Bounds {
    /// A node's pods resolve a few hundred names a second, answered in milliseconds: a few in
    /// flight. These leave room for bursts and a slow resolver, and keep what a flooding pod
    /// can hold to a few hundred sockets and a few megabytes (each UDP query in flight holds a
    /// socket and its answer buffer; each TCP connection two sockets).
    fn default() -> Self {
        Self { in_flight_per_pod: 32, in_flight: 256, tcp_per_pod: 4, tcp: 64, tcp_idle: Duration::from_secs(10), max_udp_answer: 4096 }
    }
}

/// The proxy's settings.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The port the proxy listens on, on 127.0.0.1 and ::1 (UDP and TCP; tproxy delivers
    /// there).
    pub(crate) port: u16,
    /// Resolvers whose answers teach addresses at first ([`DnsProxy::trusted`] replaces
    /// them); queries to others are not steered here and are dropped if they come.
    pub(crate) trusted: Vec<IpAddr>,
    /// Bounds on what an answer teaches.
    pub limits: Limits,
    /// How long to wait for the resolver's answer.
    pub(crate) upstream_timeout: Duration,
    /// Listen on IPv6 too.
    pub ipv6: bool,
    /// The packet mark of the proxy's upstream sockets (`SO_MARK`): the rendered table marks
    /// their connections so that answers come back to the proxy (0: unmarked, for tests
    /// without the rendered table).
    pub(crate) upstream_mark: u32,
    /// The letters of an asked name go upstream in a random case (DNS 0x20): the answer must
    /// echo them. Off for a resolver that does not keep the case.
    pub(crate) randomize_case: bool,
    pub bounds: Bounds,
}

impl ProxyConfig {
    pub fn new(port: u16, trusted: Vec<IpAddr>) -> Self {
        Self {
            port,
            trusted,
            limits: Limits::default(),
            upstream_timeout: Duration::from_secs(5),
            ipv6: true,
            upstream_mark: crate::render::DNS_UPSTREAM_MARK,
            randomize_case: true,
            bounds: Bounds::default(),
        }
    }
}

/// Takes what an answer teaches before the pod sees the answer.
pub trait Learner: Send + Sync + 'static {
    /// Admits `learned` for the pod at `client`, which asked `resolver`. Returns once the
    /// addresses are admitted (or with why they could not be).
    fn learn(
        &self,
        client: IpAddr,
        resolver: SocketAddr,
        learned: &Learned,
    ) -> impl Future<Output = Result<(), crate::apply::netlink::NetlinkError>> + Send;
}

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("DNS proxy: cannot listen on {protocol} {addr}: {source}")]
    Listen { protocol: &'static str, addr: SocketAddr, source: io::Error },
}

/// Why a query or connection was refused, for [`ProxyStats::refused`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RefusedBy {
    /// Not what the steering delivers: no original destination, not port 53, not a trusted
    /// resolver.
    NotSteered,
    /// Not a standard query with one question ([`exchange::Refused`]).
    Malformed,
    /// The pod, or the node, has as many queries in flight (or TCP connections) as allowed.
    PodLimit,
    NodeLimit,
}

impl RefusedBy {
    pub(crate) const ALL: [Self; 4] = [Self::NotSteered, Self::Malformed, Self::PodLimit, Self::NodeLimit];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::NotSteered => "not_steered",
            Self::Malformed => "malformed",
            Self::PodLimit => "pod_limit",
            Self::NodeLimit => "node_limit",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What the proxy did, for metrics and tests.
#[derive(Debug)]
pub struct ProxyStats {
    /// Queries received (UDP datagrams and TCP messages).
    pub queries: AtomicU64,
    /// Answers passed on to the pod (SERVFAILs and truncated ones included).
    pub answers: AtomicU64,
    /// Answers from trusted resolvers that taught addresses to the learner.
    pub learned: AtomicU64,
    /// Answers from trusted resolvers that taught nothing ([`crate::dns::Unusable`]), passed
    /// on unchanged.
    pub unusable: AtomicU64,
    /// Answers from resolvers not trusted, passed on untouched.
    pub untrusted: AtomicU64,
    /// Learner failures (the pod got SERVFAIL).
    pub learn_failures: AtomicU64,
    /// Queries the resolver did not answer in time, or that could not be forwarded.
    pub upstream_failures: AtomicU64,
    /// Messages that came back on an upstream socket and were not the answer to its query
    /// (another id, another question or case): dropped (forgeries, or stale answers).
    pub mismatched: AtomicU64,
    /// UDP answers larger than [`Bounds::max_udp_answer`]: the pod got a truncated answer.
    pub(crate) truncated: AtomicU64,
    /// Queries and TCP connections refused, by [`RefusedBy`].
    pub(crate) refused: [AtomicU64; 4],
    /// Total time answers were held for the learner, microseconds (with `learned`: the mean).
    pub(crate) held_micros: AtomicU64,
    /// The same, per answer (seconds; the agent exports it as a histogram).
    pub(crate) held: prometheus_client::metrics::histogram::Histogram,
}

impl Default for ProxyStats {
    fn default() -> Self {
        Self {
            queries: AtomicU64::new(0),
            answers: AtomicU64::new(0),
            learned: AtomicU64::new(0),
            unusable: AtomicU64::new(0),
            untrusted: AtomicU64::new(0),
            learn_failures: AtomicU64::new(0),
            upstream_failures: AtomicU64::new(0),
            mismatched: AtomicU64::new(0),
            truncated: AtomicU64::new(0),
            refused: Default::default(),
            held_micros: AtomicU64::new(0),
            // 25 µs to ~0.4 s.
            held: prometheus_client::metrics::histogram::Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.000_025, 2.0, 15,
            )),
        }
    }
}

impl ProxyStats {
    /// Refused so far for `why`.
    pub fn refused(&self, why: RefusedBy) -> u64 {
        self.refused[why.index()].load(Ordering::Relaxed)
    }

    fn refuse(&self, why: RefusedBy) {
        bump(&self.refused[why.index()]);
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Counts held per pod and in all, bounded: a slot is taken for a query in flight or a TCP
/// connection and given back when its [`Slot`] drops.
#[derive(Debug, Default)]
struct Slots {
    held: Mutex<(HashMap<IpAddr, usize>, usize)>,
}

/// One taken slot.
struct Slot {
    slots: Arc<Slots>,
    pod: IpAddr,
}

impl Slots {
    fn take(self: &Arc<Self>, pod: IpAddr, per_pod: usize, total: usize) -> Result<Slot, RefusedBy> {
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (by_pod, all) = &mut *held;
        if *all >= total {
            return Err(RefusedBy::NodeLimit);
        }
        let mine = by_pod.entry(pod).or_insert(0);
        if *mine >= per_pod {
            return Err(RefusedBy::PodLimit);
        }
        *mine += 1;
        *all += 1;
        Ok(Slot { slots: self.clone(), pod })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (by_pod, all) = &mut *held;
        *all = all.saturating_sub(1);
        if let Some(n) = by_pod.get_mut(&self.pod) {
            *n -= 1;
            if *n == 0 {
                by_pod.remove(&self.pod);
            }
        }
    }
}

/// The proxy's sockets, bound in the network namespace that was current when
/// [`Listeners::bind`] ran (the agent's: the node's).
pub struct Listeners {
    udp: Vec<UdpSocket>,
    tcp: Vec<TcpListener>,
}

impl Listeners {
    /// Binds the transparent listeners on 127.0.0.1 (and ::1) at `config.port`. Needs a
    /// tokio runtime (the sockets register with it) and CAP_NET_ADMIN (transparent sockets).
    pub fn bind(config: &ProxyConfig) -> Result<Self, ProxyError> {
        let addrs = Self::addrs(config);
        let mut udp = Vec::new();
        let mut tcp = Vec::new();
        for addr in addrs {
            let listen = |protocol, source| ProxyError::Listen { protocol, addr, source };
            let fd = transparent_socket(addr, SockType::Datagram, true, 0).map_err(|e| listen("UDP", e))?;
            udp.push(UdpSocket::from_std(std::net::UdpSocket::from(fd)).map_err(|e| listen("UDP", e))?);
            let fd = transparent_socket(addr, SockType::Stream, false, 0).map_err(|e| listen("TCP", e))?;
            socket::listen(&fd, Backlog::new(1024).unwrap_or(Backlog::MAXCONN)).map_err(|e| listen("TCP", e.into()))?;
            tcp.push(TcpListener::from_std(std::net::TcpListener::from(fd)).map_err(|e| listen("TCP", e))?);
        }
        Ok(Self { udp, tcp })
    }

    /// The loopback addresses the listeners are bound to, in order.
    fn addrs(config: &ProxyConfig) -> Vec<SocketAddr> {
        let mut addrs = vec![SocketAddr::from((Ipv4Addr::LOCALHOST, config.port))];
        if config.ipv6 {
            addrs.push(SocketAddr::from((Ipv6Addr::LOCALHOST, config.port)));
        }
        addrs
    }

    /// Listeners a previous agent bound (from the socket keeper, in [`Listeners::fds`]'
    /// order), if they are exactly what [`Listeners::bind`] would bind for `config`: a UDP
    /// and a listening TCP socket, transparent, on each address. Why not otherwise.
    pub fn adopt(config: &ProxyConfig, fds: Vec<OwnedFd>) -> Result<Self, String> {
        let addrs = Self::addrs(config);
        if fds.len() != 2 * addrs.len() {
            return Err(format!("{} sockets, not {}", fds.len(), 2 * addrs.len()));
        }
        let (mut udp, mut tcp) = (Vec::new(), Vec::new());
        let mut fds = fds.into_iter();
        for addr in addrs {
            for kind in [SockType::Datagram, SockType::Stream] {
                let Some(fd) = fds.next() else { return Err("too few sockets".into()) };
                let what = if kind == SockType::Datagram { "UDP" } else { "TCP" };
                let check = || -> Result<bool, nix::Error> {
                    let bound = socket::getsockname::<SockaddrStorage>(fd.as_raw_fd())?;
                    let fits = socket::getsockopt(&fd, sockopt::SockType)? == kind
                        && std_addr(&bound) == Some(addr)
                        && socket::getsockopt(&fd, sockopt::IpTransparent)?
                        && (kind == SockType::Datagram || socket::getsockopt(&fd, sockopt::AcceptConn)?)
                        && (addr.is_ipv4() || socket::getsockopt(&fd, sockopt::Ipv6V6Only)?);
                    if fits && kind == SockType::Datagram {
                        // What serving needs, set again whatever the previous agent set.
                        if addr.is_ipv4() {
                            socket::setsockopt(&fd, sockopt::Ipv4OrigDstAddr, &true)?;
                        } else {
                            socket::setsockopt(&fd, sockopt::Ipv6OrigDstAddr, &true)?;
                        }
                    }
                    Ok(fits)
                };
                match check() {
                    Ok(true) => {}
                    Ok(false) => return Err(format!("not a transparent {what} listener on {addr}")),
                    Err(e) => return Err(format!("the {what} socket for {addr}: {e}")),
                }
                let err = |e: io::Error| format!("the {what} socket for {addr}: {e}");
                // tokio takes only non-blocking sockets (the flag is the shared file's).
                let fd = {
                    let std_fd = std::net::UdpSocket::from(fd);
                    std_fd.set_nonblocking(true).map_err(err)?;
                    OwnedFd::from(std_fd)
                };
                if kind == SockType::Datagram {
                    udp.push(UdpSocket::from_std(std::net::UdpSocket::from(fd)).map_err(err)?);
                } else {
                    tcp.push(TcpListener::from_std(std::net::TcpListener::from(fd)).map_err(err)?);
                }
            }
        }
        Ok(Self { udp, tcp })
    }

    /// Duplicates of the listeners' descriptors, per address UDP then TCP (what
    /// [`Listeners::adopt`] takes).
    pub fn fds(&self) -> io::Result<Vec<OwnedFd>> {
        let mut out = Vec::new();
        for (u, t) in self.udp.iter().zip(&self.tcp) {
            out.push(u.as_fd().try_clone_to_owned()?);
            out.push(t.as_fd().try_clone_to_owned()?);
        }
        Ok(out)
    }
}

/// A non-blocking socket with `IP_TRANSPARENT` bound to `addr` (IPv6 sockets IPv6 only):
/// transparent so that it may take tproxied traffic for addresses not its own, and bind one
/// (a pod's, a resolver's). `orig_dst` asks for each datagram's original destination; `mark`
/// (unless 0) is its packets' mark.
fn transparent_socket(addr: SocketAddr, kind: SockType, orig_dst: bool, mark: u32) -> io::Result<OwnedFd> {
    let family = if addr.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    let fd = socket::socket(family, kind, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None)?;
    // IP_TRANSPARENT also sets the flag IPV6_TRANSPARENT sets on an IPv6 socket (one bit in
    // the kernel's inet socket), which nix has no option for.
    socket::setsockopt(&fd, sockopt::IpTransparent, &true)?;
    socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    if mark != 0 {
        socket::setsockopt(&fd, sockopt::Mark, &mark)?;
    }
    if addr.is_ipv6() {
        socket::setsockopt(&fd, sockopt::Ipv6V6Only, &true)?;
        if orig_dst {
            socket::setsockopt(&fd, sockopt::Ipv6OrigDstAddr, &true)?;
        }
    } else if orig_dst {
        socket::setsockopt(&fd, sockopt::Ipv4OrigDstAddr, &true)?;
    }
    socket::bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
    Ok(fd)
}

/// One datagram and where it came from and was going.
fn recv_with_orig_dst(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, SocketAddr, Option<SocketAddr>)> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut control = nix::cmsg_space!(nix::libc::sockaddr_in6);
    let msg = socket::recvmsg::<SockaddrStorage>(fd, &mut iov, Some(&mut control), MsgFlags::MSG_DONTWAIT)?;
    let from = msg.address.as_ref().and_then(std_addr).ok_or_else(|| io::Error::other("a datagram without a source address"))?;
    let mut orig = None;
    for c in msg.cmsgs()? {
        match c {
            ControlMessageOwned::Ipv4OrigDstAddr(a) => orig = Some(SocketAddr::from(SockaddrIn::from(a))),
            ControlMessageOwned::Ipv6OrigDstAddr(a) => orig = Some(SocketAddr::from(SockaddrIn6::from(a))),
            _ => {}
        }
    }
    Ok((msg.bytes, from, orig))
}

fn std_addr(a: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = a.as_sockaddr_in() {
        return Some(SocketAddr::from(*v4));
    }
    a.as_sockaddr_in6().map(|v6| SocketAddr::from(*v6))
}

/// A fresh query id and case pattern, from the operating system's random source.
fn randomness() -> io::Result<(u16, u64)> {
    let mut b = [0u8; 10];
    getrandom::fill(&mut b).map_err(|e| io::Error::other(format!("the random source: {e}")))?;
    let [i0, i1, c @ ..] = b;
    Ok((u16::from_be_bytes([i0, i1]), u64::from_be_bytes(c)))
}

/// The resolvers whose answers teach, replaceable while the proxy serves (resolver pods come
/// and go): the configured ones, then as the agent's translation finds them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Trusted(Arc<std::sync::RwLock<Arc<std::collections::BTreeSet<IpAddr>>>>);

impl Trusted {
    pub(crate) fn set(&self, addrs: std::collections::BTreeSet<IpAddr>) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(addrs);
    }

    pub(crate) fn contains(&self, addr: &IpAddr) -> bool {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).contains(addr)
    }
}

/// The proxy: serves [`Listeners`] until told to stop.
pub struct DnsProxy<L> {
    config: Arc<ProxyConfig>,
    trusted: Trusted,
    learner: Arc<L>,
    stats: Arc<ProxyStats>,
    in_flight: Arc<Slots>,
    connections: Arc<Slots>,
}

impl<L> Clone for DnsProxy<L> {
    fn clone(&self) -> Self {
        Self {
            config: self.config.clone(),
            trusted: self.trusted.clone(),
            learner: self.learner.clone(),
            stats: self.stats.clone(),
            in_flight: self.in_flight.clone(),
            connections: self.connections.clone(),
        }
    }
}

/// An answer from upstream, or why there is none.
enum Upstream {
    Answer(Vec<u8>),
    /// Larger than the pod's transport takes: it gets a truncated answer.
    TooLarge,
}

impl<L: Learner> DnsProxy<L> {
    pub fn new(config: ProxyConfig, learner: Arc<L>) -> Self {
        Self::with_stats(config, learner, Arc::new(ProxyStats::default()))
    }

    /// A proxy counting into `stats` (the agent's metrics hold them).
    pub(crate) fn with_stats(config: ProxyConfig, learner: Arc<L>, stats: Arc<ProxyStats>) -> Self {
        let trusted = Trusted::default();
        trusted.set(config.trusted.iter().copied().collect());
        Self { config: Arc::new(config), trusted, learner, stats, in_flight: Arc::default(), connections: Arc::default() }
    }

    /// The trusted resolvers, to replace while serving.
    pub(crate) fn trusted(&self) -> Trusted {
        self.trusted.clone()
    }

    pub(crate) fn config(&self) -> &ProxyConfig {
        &self.config
    }

    pub fn stats(&self) -> Arc<ProxyStats> {
        self.stats.clone()
    }

    /// Serves until `stop` turns true (or its sender is gone). Each query is served on a
    /// task of its own.
    pub async fn serve(self, listeners: Listeners, stop: watch::Receiver<bool>) {
        let mut tasks = tokio::task::JoinSet::new();
        for sock in listeners.udp {
            tasks.spawn(self.clone().serve_udp(sock, stop.clone()));
        }
        for listener in listeners.tcp {
            tasks.spawn(self.clone().serve_tcp(listener, stop.clone()));
        }
        while tasks.join_next().await.is_some() {}
    }

    /// Whether a query to `resolver` is what the steering delivers: to port 53 of a trusted
    /// resolver (the steering sends nothing else here, and nothing else can reach the
    /// loopback listeners).
    fn steered(&self, resolver: SocketAddr) -> bool {
        resolver.port() == 53 && self.trusted.contains(&resolver.ip())
    }

    async fn serve_udp(self, sock: UdpSocket, mut stop: watch::Receiver<bool>) {
        let sock = Arc::new(sock);
        let mut buf = vec![0u8; crate::dns::answer::MAX_MESSAGE];
        loop {
            let received = tokio::select! {
                r = sock.async_io(Interest::READABLE, || recv_with_orig_dst(sock.as_raw_fd(), &mut buf)) => r,
                _ = stopped(&mut stop) => return,
            };
            let (n, client, orig) = match received {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "DNS proxy: receiving a UDP query");
                    continue;
                }
            };
            bump(&self.stats.queries);
            let Some(resolver) = orig.filter(|r| self.steered(*r)) else {
                self.stats.refuse(RefusedBy::NotSteered);
                tracing::debug!(%client, original = ?orig, "DNS proxy: a UDP query the steering did not deliver, dropped");
                continue;
            };
            let slot = match self.in_flight.take(client.ip(), self.config.bounds.in_flight_per_pod, self.config.bounds.in_flight) {
                Ok(slot) => slot,
                Err(why) => {
                    self.stats.refuse(why);
                    tracing::debug!(%client, reason = why.as_str(), "DNS proxy: too many queries in flight, one dropped");
                    continue;
                }
            };
            let query = buf[..n].to_vec();
            let proxy = self.clone();
            tokio::spawn(async move {
                proxy.udp_exchange(query, client, resolver).await;
                drop(slot);
            });
        }
    }

    async fn udp_exchange(self, query: Vec<u8>, client: SocketAddr, resolver: SocketAddr) {
        let (up, outstanding) = match self.prepare(&query) {
            Some(p) => p,
            None => return,
        };
        let answer = match self.ask_udp(&up, &outstanding, client.ip(), resolver).await {
            Ok(Upstream::Answer(answer)) => self.vet(&query, answer, client, resolver).await,
            Ok(Upstream::TooLarge) => {
                bump(&self.stats.truncated);
                outstanding.bare_response(exchange::recursion_desired(&query), 0, true)
            }
            Err(e) => {
                bump(&self.stats.upstream_failures);
                tracing::debug!(%client, %resolver, error = %e, "DNS proxy: no answer from the resolver");
                return;
            }
        };
        // From the resolver's own address and port: the pod's stub resolver takes only that.
        let sent = async {
            let fd = transparent_socket(resolver, SockType::Datagram, false, 0)?;
            let sock = UdpSocket::from_std(std::net::UdpSocket::from(fd))?;
            sock.send_to(&answer, client).await
        };
        match sent.await {
            Ok(_) => bump(&self.stats.answers),
            Err(e) => tracing::warn!(%client, %resolver, error = %e, "DNS proxy: answering the pod"),
        }
    }

    /// The query as it goes upstream (the proxy's id and case), or `None` when it is not one
    /// to proxy (counted).
    fn prepare(&self, query: &[u8]) -> Option<(Vec<u8>, Outstanding)> {
        let (id, case) = match randomness() {
            Ok(r) => r,
            Err(e) => {
                bump(&self.stats.upstream_failures);
                tracing::error!(error = %e, "DNS proxy: no randomness for a query id; the query is dropped");
                return None;
            }
        };
        match exchange::prepare(query, id, self.config.randomize_case.then_some(case)) {
            Ok(p) => Some(p),
            Err(why) => {
                self.stats.refuse(RefusedBy::Malformed);
                tracing::debug!(reason = %why, "DNS proxy: a query not proxied");
                None
            }
        }
    }

    /// Sends `up` to `resolver` as the pod at `pod` (a transparent socket bound to its
    /// address, a port of the kernel's choosing, the upstream mark) and waits for the answer
    /// to it: other messages on the socket are dropped and counted.
    async fn ask_udp(&self, up: &[u8], outstanding: &Outstanding, pod: IpAddr, resolver: SocketAddr) -> io::Result<Upstream> {
        let fd = transparent_socket(SocketAddr::new(pod, 0), SockType::Datagram, false, self.config.upstream_mark)?;
        let sock = UdpSocket::from_std(std::net::UdpSocket::from(fd))?;
        sock.connect(resolver).await?;
        sock.send(up).await?;
        let max = self.config.bounds.max_udp_answer;
        let mut buf = vec![0u8; max + 1];
        let deadline = tokio::time::Instant::now() + self.config.upstream_timeout;
        loop {
            let n = tokio::time::timeout_at(deadline, sock.recv(&mut buf))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the resolver did not answer"))??;
            if n > max {
                return Ok(Upstream::TooLarge);
            }
            match outstanding.accept(&buf[..n]) {
                Ok(answer) => return Ok(Upstream::Answer(answer)),
                Err(why) => {
                    bump(&self.stats.mismatched);
                    tracing::debug!(%pod, %resolver, reason = %why, "DNS proxy: a message that is not the answer, dropped");
                }
            }
        }
    }

    async fn serve_tcp(self, listener: TcpListener, mut stop: watch::Receiver<bool>) {
        loop {
            let accepted = tokio::select! {
                r = listener.accept() => r,
                _ = stopped(&mut stop) => return,
            };
            let (stream, client) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "DNS proxy: accepting a TCP connection");
                    continue;
                }
            };
            // A tproxied connection's local address is the one the pod connected to.
            let resolver = match stream.local_addr() {
                Ok(a) if self.steered(a) => a,
                other => {
                    self.stats.refuse(RefusedBy::NotSteered);
                    tracing::debug!(%client, original = ?other.ok(), "DNS proxy: a TCP connection the steering did not deliver, closed");
                    continue;
                }
            };
            let slot = match self.connections.take(client.ip(), self.config.bounds.tcp_per_pod, self.config.bounds.tcp) {
                Ok(slot) => slot,
                Err(why) => {
                    self.stats.refuse(why);
                    tracing::debug!(%client, reason = why.as_str(), "DNS proxy: too many TCP connections, one closed");
                    continue;
                }
            };
            let proxy = self.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                if let Err(e) = proxy.tcp_connection(stream, client, resolver, stop).await {
                    tracing::debug!(%client, %resolver, error = %e, "DNS proxy: TCP connection ended");
                }
                drop(slot);
            });
        }
    }

    /// Queries one by one over one connection to the resolver (opened as the pod, at the
    /// first query), each answer matched to its query and vetted before it is written back.
    /// A pod that sends no complete query for [`Bounds::tcp_idle`] is closed.
    async fn tcp_connection(
        &self,
        mut pod: TcpStream,
        client: SocketAddr,
        resolver: SocketAddr,
        mut stop: watch::Receiver<bool>,
    ) -> io::Result<()> {
        let mut upstream: Option<TcpStream> = None;
        loop {
            let query = tokio::select! {
                q = tokio::time::timeout(self.config.bounds.tcp_idle, read_message(&mut pod)) => match q {
                    Ok(q) => q?,
                    Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "idle")),
                },
                _ = stopped(&mut stop) => return Ok(()),
            };
            let Some(query) = query else { return Ok(()) };
            bump(&self.stats.queries);
            let Some((up_query, outstanding)) = self.prepare(&query) else { return Ok(()) };
            let up = match upstream.as_mut() {
                Some(up) => up,
                None => match tokio::time::timeout(self.config.upstream_timeout, self.connect_as(client.ip(), resolver)).await {
                    Ok(Ok(s)) => upstream.insert(s),
                    Ok(Err(e)) => {
                        bump(&self.stats.upstream_failures);
                        return Err(e);
                    }
                    Err(_) => {
                        bump(&self.stats.upstream_failures);
                        return Err(io::Error::new(io::ErrorKind::TimedOut, "connecting to the resolver"));
                    }
                },
            };
            let exchange = async {
                write_message(up, &up_query).await?;
                read_message(up).await
            };
            let answer = match tokio::time::timeout(self.config.upstream_timeout, exchange).await {
                Ok(Ok(Some(answer))) => answer,
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                    bump(&self.stats.upstream_failures);
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "the resolver did not answer over TCP"));
                }
            };
            // Over TCP the resolver answers in order: anything but the answer ends the
            // connection (the pod asks again).
            let answer = match outstanding.accept(&answer) {
                Ok(a) => a,
                Err(why) => {
                    bump(&self.stats.mismatched);
                    return Err(io::Error::new(io::ErrorKind::InvalidData, format!("not the answer: {why}")));
                }
            };
            let answer = self.vet(&query, answer, client, resolver).await;
            write_message(&mut pod, &answer).await?;
            bump(&self.stats.answers);
        }
    }

    /// A TCP connection to `resolver` from the pod's address `pod` (transparent, marked).
    async fn connect_as(&self, pod: IpAddr, resolver: SocketAddr) -> io::Result<TcpStream> {
        let fd = transparent_socket(SocketAddr::new(pod, 0), SockType::Stream, false, self.config.upstream_mark)?;
        TcpSocket::from_std_stream(std::net::TcpStream::from(fd)).connect(resolver).await
    }

    /// What the pod gets for `answer` (already matched to its query): the answer itself once
    /// its addresses are admitted (or when it teaches nothing), SERVFAIL when the learner
    /// failed.
    async fn vet(&self, query: &[u8], answer: Vec<u8>, client: SocketAddr, resolver: SocketAddr) -> Vec<u8> {
        if !self.trusted.contains(&resolver.ip()) {
            bump(&self.stats.untrusted);
            return answer;
        }
        let learned = match learn(query, &answer, &self.config.limits) {
            Ok(learned) => learned,
            Err(why) => {
                bump(&self.stats.unusable);
                tracing::debug!(%client, %resolver, reason = %why, "DNS proxy: an answer that teaches nothing, passed on unchanged");
                return answer;
            }
        };
        let held = Instant::now();
        let admitted = self.learner.learn(client.ip(), resolver, &learned).await;
        let micros = u64::try_from(held.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.stats.held_micros.fetch_add(micros, Ordering::Relaxed);
        self.stats.held.observe(held.elapsed().as_secs_f64());
        match admitted {
            Ok(()) => {
                bump(&self.stats.learned);
                answer
            }
            Err(e) => {
                bump(&self.stats.learn_failures);
                tracing::warn!(%client, name = %learned.name, error = %e, "DNS proxy: the learned addresses could not be admitted; the pod gets SERVFAIL");
                servfail(query).unwrap_or(answer)
            }
        }
    }
}

/// A SERVFAIL answer to `query` (None when the query is not a DNS message).
fn servfail(query: &[u8]) -> Option<Vec<u8>> {
    let mut r = response_to(&Message::from_vec(query).ok()?);
    r.set_recursion_available(true);
    r.set_response_code(ResponseCode::ServFail);
    r.to_vec().ok()
}

/// One length-prefixed DNS message from a TCP stream (None at a clean end of stream).
pub(crate) async fn read_message(s: &mut TcpStream) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 2];
    match s.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut msg).await?;
    Ok(Some(msg))
}

/// Writes `msg` to a TCP stream with its two-byte length.
pub(crate) async fn write_message(s: &mut TcpStream, msg: &[u8]) -> io::Result<()> {
    let len = u16::try_from(msg.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a DNS message over 65,535 bytes"))?;
    let mut framed = Vec::with_capacity(msg.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(msg);
    s.write_all(&framed).await
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    // A dropped sender stops the proxy as well.
    let _ = stop.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{MessageType, Query};
    use hickory_proto::rr::{Name, RecordType};

    struct Refuse;

    impl Learner for Refuse {
        async fn learn(&self, _: IpAddr, _: SocketAddr, _: &Learned) -> Result<(), crate::apply::netlink::NetlinkError> {
            Err(crate::apply::netlink::NetlinkError::Protocol("refused".into()))
        }
    }

    #[tokio::test]
    async fn answers_that_teach_nothing_pass_on_unchanged() {
        let resolver: SocketAddr = "198.18.0.53:53".parse().unwrap();
        let client: SocketAddr = "198.18.0.7:40000".parse().unwrap();
        let proxy = DnsProxy::new(ProxyConfig::new(15353, vec![resolver.ip()]), Arc::new(Refuse));
        let mut q = Message::new();
        q.set_id(9);
        q.add_query(Query::query(Name::from_ascii("example.com.").unwrap(), RecordType::A));
        let query = q.to_vec().unwrap();
        // Malformed, truncated mid-header, and another id: unchanged, counted, no learner.
        for answer in [b"\xff\xff garbage".to_vec(), query[..5].to_vec(), {
            let mut a = query.clone();
            a[0] ^= 1;
            a
        }] {
            assert_eq!(proxy.vet(&query, answer.clone(), client, resolver).await, answer);
        }
        assert_eq!(proxy.stats.unusable.load(Ordering::Relaxed), 3);
        assert_eq!(proxy.stats.learn_failures.load(Ordering::Relaxed), 0);
        // The same bytes from a resolver not trusted: untouched, not even parsed.
        let other: SocketAddr = "198.18.0.54:53".parse().unwrap();
        assert_eq!(proxy.vet(&query, b"x".to_vec(), client, other).await, b"x".to_vec());
        assert_eq!(proxy.stats.untrusted.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn servfail_answers_the_query() {
        let mut q = Message::new();
        q.set_id(4242);
        q.set_recursion_desired(true);
        q.add_query(Query::query(Name::from_ascii("example.com.").unwrap(), RecordType::A));
        let r = Message::from_vec(&servfail(&q.to_vec().unwrap()).unwrap()).unwrap();
        assert_eq!(r.id(), 4242);
        assert_eq!(r.message_type(), MessageType::Response);
        assert_eq!(r.response_code(), ResponseCode::ServFail);
        assert_eq!(r.queries(), q.queries());
        assert!(servfail(b"not dns").is_none());
    }
}
