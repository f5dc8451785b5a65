//! flock-agent's HTTP endpoints: `/healthz` (alive: a sync committed recently; it also shows
//! the API health, each watch's state and the last API error, which do not fail it — the
//! agent is alive and enforcing last-known rules while the API is away), `/readyz` (caches
//! synced and the first sync committed), `/metrics` (Prometheus text format; the health
//! gauges are refreshed from the API health at every scrape, so they always agree with it).
//! Served on TCP, or on a unix socket (`unix:/path`) for tests and sidecars; flock-controller
//! serves its own endpoints with the same server ([`serve_with`]).
//!
//! The server owns who gets served and for how long. It is small and defensive: flock-agent
//! listens on every address of every node (host network), so any pod can connect, and a
//! kubelet probe that times out restarts the agent. The bounds ([`Limits`], defaults in
//! parentheses):
//!
//! - **Accept first, then decide.** Every connection is accepted at once and either gets a
//!   slot or is closed at once, unread (each logged at debug level with the peer and the
//!   reason, per-peer cap or pool full, and a warning at most once a minute counts them). None
//!   waits unseen in the kernel's accept queue behind held slots, where a probe would time out.
//! - **A reserve for the node** (`local_connections`, 8). Peers on loopback or on one of the
//!   node's own addresses ([`node_addresses`], cached for `node_address_refresh`, 5 s, so an
//!   address added later is recognised and a flood costs one listing per 5 s), and unix-socket
//!   clients, are the kubelet's probes, host-network pods and sidecars: they get slots no other
//!   client can take, and the shared ones when theirs are busy. 8 is liveness and readiness
//!   probes with a node-local scraper and room to spare. A pod cannot pass as the node: its
//!   source check drops spoofed sources, and TCP's handshake needs the reply, which for a node
//!   address stays on the node. (flock-controller runs in the pod network: there only loopback
//!   is local, and the kubelet's probes come through the shared pool, as the node's address.)
//! - **Everyone else shares a pool** (`max_connections`, 64) with **a bound per peer address**
//!   (`per_peer`, 4): a scraper uses one connection at a time, and one pod cannot take the pool
//!   from a Prometheus on another node.
//! - **A fair share when the pool is full.** A newcomer whose peer address holds fewer shared
//!   slots than the peer holding the most takes one of that peer's slots whose connection is
//!   still waiting for its request headers (its oldest; that connection is closed). A real
//!   client sends its headers in one packet right after connecting, so what waits is a slow
//!   client; a connection being answered is never cut for another. Many pods holding the whole
//!   pool with partial headers (slowloris: 16 or 100 addresses × 4 connections) only take slots
//!   from each other, and a scraper at one more address gets in at once (`tests` replay it).
//!   What fairness cannot give: a slot while every shared one is being answered (requests
//!   that arrived whole are served within `connection`), and more than one address's share to
//!   a client behind many addresses.
//! - **Time.** The request headers within `header_read` (1 s, the kubelet's default probe
//!   timeout: a real client sends them in one packet; hyper's deadline runs from the
//!   connection's start and is for all of them, so dribbling bytes does not extend it), the
//!   whole connection — request, handler and writing the response to a client that reads
//!   slowly — within `connection` (10 s: Prometheus' default scrape timeout; the kubelet gives
//!   up after 1 s). One request per connection (no keep-alive, so no idle connections).
//!
//! What a pod can read: it reaches the port unless a NetworkPolicy denies its egress to the
//! node (flock polices pod-to-node traffic: docs/policy.md, "Traffic to the node and host-network pods"). `/metrics` names
//! namespaces and policies in its labels and counts pods, denials and syncs, and `/healthz`
//! shows the last sync and API errors: the shape of the cluster's policy, nothing secret (no
//! tokens, no keys, no payloads). That is acceptable for the default. Operators who do not
//! want pods to read it bind the endpoints to one address (an internal interface, or
//! `127.0.0.1` with the probes' `httpGet.host` set) or a unix socket with `--metrics-address`
//! (`FLOCK_METRICS_ADDRESS`; default `[::]:9781` for flock-agent, `[::]:9782` for
//! flock-controller), or deny that egress by policy.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use tokio::sync::{Notify, watch};

use super::SyncStatus;
use super::metrics::Metrics;
use super::revocation::node_addresses;
use crate::source::Source;
use crate::source::kube::ApiHealth;

/// Where to listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::str::FromStr for ListenAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.strip_prefix("unix:") {
            Some(p) => Ok(Self::Unix(PathBuf::from(p))),
            None => s.parse().map(Self::Tcp).map_err(|_| format!("{s:?}: expected HOST:PORT or unix:/path")),
        }
    }
}

/// What the endpoints read.
#[derive(Clone)]
pub(crate) struct HttpState {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) status: watch::Receiver<SyncStatus>,
    pub(crate) source: Source,
    pub(crate) health: Option<Arc<ApiHealth>>,
    /// `/healthz` fails when the last committed sync is older than this.
    pub(crate) max_sync_age: Duration,
    /// Before the first sync, `/healthz` passes for this long (caches are loading).
    pub(crate) startup_grace: Duration,
    pub(crate) started: Instant,
}

/// A JSON response.
pub(crate) fn json_response(code: StatusCode, body: serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = code;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

/// A Prometheus (OpenMetrics text) response.
pub(crate) fn metrics_response(text: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(text)));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    r
}

/// Answers one request.
pub(crate) fn respond(state: &HttpState, path: &str) -> Response<Full<Bytes>> {
    let st = state.status.borrow().clone();
    let report = state.health.as_ref().map(|h| h.report());
    let api = report.as_ref().map(|r| r.state.as_str());
    match path {
        "/healthz" => {
            let age = st.last_commit.map(|t| t.elapsed());
            // Pending until the first sync commits (caches loading): alive for
            // `startup_grace`, then not.
            let (healthy, status) = match age {
                Some(a) if a <= state.max_sync_age => (true, "ok"),
                Some(_) => (false, "stale"),
                None if state.started.elapsed() <= state.startup_grace => (true, "pending"),
                None => (false, "pending"),
            };
            let body = json!({
                "status": status,
                "lastSuccessfulSyncAgeSeconds": age.map(|a| a.as_secs_f64()),
                "lastError": st.error,
                "api": api,
                "apiLastError": report.as_ref().and_then(|r| r.last_error.as_ref()).map(|(e, _)| e),
                "apiLastErrorAgeSeconds": report.as_ref().and_then(|r| r.last_error.as_ref()).map(|(_, age)| age.as_secs_f64()),
                "watches": report.as_ref().map(|r| {
                    r.watches.iter().map(|(res, ok)| (res.as_str().to_string(), json!(if *ok { "ok" } else { "failing" }))).collect::<serde_json::Map<_, _>>()
                }),
                "apiProbeFailing": report.as_ref().map(|r| r.probe_failing),
            });
            json_response(if healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, body)
        }
        "/readyz" => {
            let synced = state.source.is_complete();
            let ready = synced && st.ready;
            let body = json!({"ready": ready, "cachesSynced": synced, "firstSyncCommitted": st.ready, "api": api});
            json_response(if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, body)
        }
        "/metrics" => {
            if let Some(h) = &state.health {
                h.export(state.metrics.as_ref());
            }
            metrics_response(state.metrics.encode())
        }
        _ => json_response(StatusCode::NOT_FOUND, json!({"error": "not found", "paths": ["/healthz", "/readyz", "/metrics"]})),
    }
}

/// Serves the agent's endpoints until `stop`.
pub(crate) async fn serve(addr: ListenAddr, state: HttpState, stop: watch::Receiver<bool>) -> std::io::Result<()> {
    let handler: Handler = Arc::new(move |path: &str| respond(&state, path));
    serve_with(addr, handler, stop).await
}

/// How much the endpoint server lets one client take (the module doc says why these
/// defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// A connection's request headers must arrive within this.
    pub(crate) header_read: Duration,
    /// A connection (request, handler and response, written to a client that may read slowly)
    /// is cut after this.
    pub(crate) connection: Duration,
    /// Connections served at once from the shared pool: every peer that is not local, and
    /// local ones when their reserve is busy.
    pub(crate) max_connections: usize,
    /// Connections served at once from one remote peer address (in the shared pool).
    pub(crate) per_peer: usize,
    /// Connections reserved for local peers ([`LocalPeers`]) and unix-socket clients: no other
    /// peer can take them.
    pub(crate) local_connections: usize,
    /// Which TCP peers are local.
    pub(crate) local_peers: LocalPeers,
    /// The node's addresses are listed again when the last listing is older than this.
    pub(crate) node_address_refresh: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read: Duration::from_secs(1),
            connection: Duration::from_secs(10),
            max_connections: 64,
            per_peer: 4,
            local_connections: 8,
            local_peers: LocalPeers::Node,
            node_address_refresh: Duration::from_secs(5),
        }
    }
}

/// Which TCP peers are the node itself, served from [`Limits::local_connections`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum LocalPeers {
    /// Loopback and the node's own addresses, on every interface ([`node_addresses`]).
    #[default]
    Node,
    /// Exactly these addresses (tests, which tell local from remote peers on 127.0.0.0/8).
    #[cfg(test)]
    Listed(BTreeSet<IpAddr>),
}

/// Binds a TCP listener. `[::]` (the default) takes both families on a dual-stack socket,
/// so that the kubelet's probes reach the endpoints at the node's (the pod's) address on an
/// IPv6-only node as on an IPv4 one (IPv4 peers then arrive as `::ffff:a.b.c.d`, which
/// every peer check canonicalizes); where the kernel has IPv6 turned off it falls back to
/// `0.0.0.0` with the same port.
async fn bind_tcp(a: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    match tokio::net::TcpListener::bind(a).await {
        Err(e) if a.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED) && e.raw_os_error() == Some(nix::errno::Errno::EAFNOSUPPORT as i32) => {
            tracing::info!(port = a.port(), "IPv6 is off on this node: serving on 0.0.0.0");
            tokio::net::TcpListener::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), a.port())).await
        }
        r => r,
    }
}

/// Answers a request path with a response (no bodies are read: every endpoint is a GET).
pub(crate) type Handler = Arc<dyn Fn(&str) -> Response<Full<Bytes>> + Send + Sync>;

/// A small HTTP/1 server for health and metrics endpoints (shared by flock-agent and
/// flock-controller), on TCP or a unix socket, until `stop`.
pub async fn serve_with(addr: ListenAddr, handler: Handler, stop: watch::Receiver<bool>) -> std::io::Result<()> {
    serve_limited(addr, handler, Limits::default(), stop).await
}

/// [`serve_with`] with explicit [`Limits`].
pub(crate) async fn serve_limited(addr: ListenAddr, handler: Handler, limits: Limits, stop: watch::Receiver<bool>) -> std::io::Result<()> {
    let listener = match &addr {
        ListenAddr::Tcp(a) => Listener::Tcp(bind_tcp(*a).await?),
        ListenAddr::Unix(p) => {
            let _ = std::fs::remove_file(p);
            Listener::Unix(tokio::net::UnixListener::bind(p)?)
        }
    };
    tracing::info!(address = ?addr, ?limits, "serving health and metrics endpoints");
    serve_on(listener, handler, limits, stop).await;
    if let ListenAddr::Unix(p) = &addr {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

enum Listener {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener),
}

impl Listener {
    /// The next connection, with its peer's address (none on a unix socket).
    async fn accept(&self) -> std::io::Result<(Conn, Option<SocketAddr>)> {
        match self {
            Self::Tcp(l) => l.accept().await.map(|(s, a)| (Conn::Tcp(s), Some(a))),
            Self::Unix(l) => l.accept().await.map(|(s, _)| (Conn::Unix(s), None)),
        }
    }
}

enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// Accepts connections until `stop`, each served in its own task or closed at once.
async fn serve_on(listener: Listener, handler: Handler, limits: Limits, stop: watch::Receiver<bool>) {
    let slots = Slots::new(&limits);
    serve_slots(listener, handler, limits, Arc::new(slots), stop).await
}

/// [`serve_on`] with the slots given (tests look into them).
async fn serve_slots(listener: Listener, handler: Handler, limits: Limits, slots: Arc<Slots>, mut stop: watch::Receiver<bool>) {
    let mut local = match &limits.local_peers {
        #[cfg(test)]
        LocalPeers::Listed(a) => Classifier::Listed(a.iter().map(IpAddr::to_canonical).collect()),
        LocalPeers::Node => {
            let mut node = NodeAddresses::new(limits.node_address_refresh, Box::new(node_addresses));
            node.refresh(Instant::now());
            Classifier::Node(node)
        }
    };
    let mut refusals = Refusals::default();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => break,
        };
        let (conn, peer_addr) = match accepted {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accepting an HTTP connection");
                // Out of file descriptors or memory: let some connections end rather than spin.
                if e.raw_os_error().map(nix::errno::Errno::from_raw).is_some_and(|e| {
                    matches!(
                        e,
                        nix::errno::Errno::EMFILE | nix::errno::Errno::ENFILE | nix::errno::Errno::ENOBUFS | nix::errno::Errno::ENOMEM
                    )
                }) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        let now = Instant::now();
        let peer = match peer_addr {
            None => Peer::Local,
            Some(a) if local.is_local(a.ip(), now) => Peer::Local,
            Some(a) => Peer::Remote(a.ip().to_canonical()),
        };
        let admitted = slots.admit(peer, now);
        refusals.evicted(slots.take_evictions(), peer_addr, now);
        let slot = match admitted {
            Ok(s) => s,
            Err(why) => {
                // Closed unread: the client sees the connection end (FIN or RST) at once.
                drop(conn);
                refusals.count(peer_addr, why, now);
                continue;
            }
        };
        let handler = handler.clone();
        let (header_read, connection) = (limits.header_read, limits.connection);
        tokio::spawn(async move {
            let evicted = slot.evicted();
            let slot = Arc::new(slot);
            let marker = slot.clone();
            let svc = service_fn(move |req: Request<Incoming>| {
                // The headers are in: from now on the slot stays this connection's.
                let r = if marker.serving() {
                    handler(req.uri().path())
                } else {
                    json_response(StatusCode::SERVICE_UNAVAILABLE, json!({"error": "slot given to another peer"}))
                };
                async move { Ok::<_, Infallible>(r) }
            });
            let mut builder = http1::Builder::new();
            builder.keep_alive(false).timer(TokioTimer::new()).header_read_timeout(header_read);
            let served = async {
                match conn {
                    Conn::Tcp(s) => builder.serve_connection(TokioIo::new(s), svc).await,
                    Conn::Unix(s) => builder.serve_connection(TokioIo::new(s), svc).await,
                }
            };
            tokio::select! {
                r = tokio::time::timeout(connection, served) => match r {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::debug!(peer = ?peer_addr, error = %e, "HTTP connection ended with an error"),
                    Err(_) => tracing::debug!(peer = ?peer_addr, limit = ?connection, "HTTP connection cut: too slow"),
                },
                () = evicted.notified() => {
                    tracing::debug!(peer = ?peer_addr, "HTTP connection cut before its headers arrived: its slot went to a peer with fewer");
                }
            }
            drop(slot);
        });
    }
}

/// Where a connection comes from, for [`Slots::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// The node itself (loopback, one of its addresses) or a unix-socket client.
    Local,
    /// Anyone else, by address (IPv4-mapped IPv6 as IPv4).
    Remote(IpAddr),
}

/// Tells local TCP peers from remote ones.
enum Classifier {
    #[cfg(test)]
    Listed(BTreeSet<IpAddr>),
    Node(NodeAddresses),
}

impl Classifier {
    fn is_local(&mut self, peer: IpAddr, now: Instant) -> bool {
        match self {
            #[cfg(test)]
            Self::Listed(a) => a.contains(&peer.to_canonical()),
            Self::Node(n) => n.is_local(peer, now),
        }
    }
}

/// Lists the node's addresses.
type ListAddresses = Box<dyn Fn() -> nix::Result<BTreeSet<IpAddr>> + Send>;

/// Loopback and the node's addresses, listed again when the last listing is older than
/// `every` (one `getifaddrs` per `every` at most, however many connections arrive).
struct NodeAddresses {
    known: BTreeSet<IpAddr>,
    listed_at: Option<Instant>,
    every: Duration,
    list: ListAddresses,
}

impl NodeAddresses {
    fn new(every: Duration, list: ListAddresses) -> Self {
        Self { known: BTreeSet::new(), listed_at: None, every, list }
    }

    /// Lists the addresses now; on failure keeps those known (and tries again after `every`).
    fn refresh(&mut self, now: Instant) {
        self.listed_at = Some(now);
        match (self.list)() {
            Ok(a) => self.known = a.into_iter().map(|a| a.to_canonical()).collect(),
            Err(e) => tracing::warn!(
                error = %e,
                known = self.known.len(),
                "listing the node's addresses for the HTTP server; local peers are loopback and the addresses listed before"
            ),
        }
    }

    /// Whether `peer` is loopback or one of the node's addresses.
    fn is_local(&mut self, peer: IpAddr, now: Instant) -> bool {
        let peer = peer.to_canonical();
        if peer.is_loopback() {
            return true;
        }
        if self.listed_at.is_none_or(|t| now.saturating_duration_since(t) >= self.every) {
            self.refresh(now);
        }
        self.known.contains(&peer)
    }
}

/// Why a connection was closed unserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// Its remote peer already has [`Limits::per_peer`] connections.
    PeerCap,
    /// No slot: the shared pool is full (for a local peer, its reserve too) and no peer with
    /// more connections than this one's has one still waiting for its headers.
    PoolFull,
}

impl Refused {
    fn as_str(self) -> &'static str {
        match self {
            Self::PeerCap => "per-peer cap",
            Self::PoolFull => "pool full",
        }
    }
}

/// Who a shared slot counts against: the node (local peers whose reserve is busy), or a
/// remote address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PeerKey {
    Node,
    Addr(IpAddr),
}

/// How far a connection has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Its request headers have not all arrived: its shared slot may go to a fairer peer.
    Headers,
    /// Being answered: it keeps its slot until it ends or `connection` cuts it.
    Serving,
}

/// A connection holding a slot.
struct Entry {
    /// `None`: a slot of the local reserve (never taken away).
    shared: Option<PeerKey>,
    since: Instant,
    phase: Phase,
    /// Woken when the slot is taken away ([`Slots::admit`]).
    evict: Arc<Notify>,
}

/// The slots' bookkeeping, behind one lock (a few dozen entries: decided in microseconds).
#[derive(Default)]
struct Ledger {
    next_id: u64,
    conns: HashMap<u64, Entry>,
    /// Shared slots per peer.
    shared_by_peer: HashMap<PeerKey, usize>,
    reserve_used: usize,
    shared_used: usize,
    /// Slots taken away from a peer with more, since the last [`Slots::take_evictions`].
    evictions: u64,
}

impl Ledger {
    fn count(&self, key: PeerKey) -> usize {
        self.shared_by_peer.get(&key).copied().unwrap_or(0)
    }

    /// Removes connection `id`'s entry and gives its slot back (nothing when it is gone).
    fn release(&mut self, id: u64) -> Option<Entry> {
        let entry = self.conns.remove(&id)?;
        match entry.shared {
            None => self.reserve_used = self.reserve_used.saturating_sub(1),
            Some(key) => {
                self.shared_used = self.shared_used.saturating_sub(1);
                if let Some(n) = self.shared_by_peer.get_mut(&key) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        self.shared_by_peer.remove(&key);
                    }
                }
            }
        }
        Some(entry)
    }

    /// The connection to take a shared slot from for a newcomer of `key`: one still waiting
    /// for its headers, of the peer holding the most shared slots (the oldest of its
    /// connections), if that peer holds more than `key` does. Connections being answered
    /// are never taken: their request arrived whole.
    fn victim(&self, key: PeerKey) -> Option<u64> {
        let mine = self.count(key);
        self.conns
            .iter()
            .filter_map(|(id, e)| match (e.shared, e.phase) {
                (Some(k), Phase::Headers) => Some((self.count(k), std::cmp::Reverse(e.since), *id)),
                _ => None,
            })
            .max()
            .filter(|(theirs, _, _)| *theirs > mine)
            .map(|(_, _, id)| id)
    }

    fn insert(&mut self, shared: Option<PeerKey>, now: Instant) -> (u64, Arc<Notify>) {
        let id = self.next_id;
        self.next_id += 1;
        match shared {
            None => self.reserve_used += 1,
            Some(key) => {
                self.shared_used += 1;
                *self.shared_by_peer.entry(key).or_insert(0) += 1;
            }
        }
        let evict = Arc::new(Notify::new());
        self.conns.insert(id, Entry { shared, since: now, phase: Phase::Headers, evict: evict.clone() });
        (id, evict)
    }
}

/// The slots: a reserve for local peers, a shared pool for everyone, shared among peers
/// fairly. Decided without waiting: a connection gets a slot now or is closed.
///
/// Fairness: when the pool is full, a newcomer whose peer holds fewer shared slots than the
/// peer holding the most takes one of that peer's slots whose connection is still waiting for
/// its headers (the oldest; that connection is closed). A real client sends its headers in
/// one packet, right after connecting, so what waits is almost always a slow client. Many
/// peers holding the whole pool with partial headers therefore only take slots from each
/// other, and one more peer — a scraper — is always let in (the attack: 16 or 100
/// addresses × 4 such connections).
struct Slots {
    local_connections: usize,
    max_connections: usize,
    per_peer: usize,
    #[cfg(test)]
    fair: bool,
    ledger: Arc<Mutex<Ledger>>,
}

/// A connection's slot, given back when dropped.
struct Slot {
    id: u64,
    evict: Arc<Notify>,
    ledger: Arc<Mutex<Ledger>>,
}

impl Slot {
    /// Marks the connection's request as arrived whole: its slot is no longer taken away.
    /// False if it already was.
    fn serving(&self) -> bool {
        let mut ledger = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
        match ledger.conns.get_mut(&self.id) {
            Some(e) => {
                e.phase = Phase::Serving;
                true
            }
            None => false,
        }
    }

    /// Woken once the slot has been given to another peer.
    fn evicted(&self) -> Arc<Notify> {
        self.evict.clone()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner).release(self.id);
    }
}

impl Slots {
    fn new(limits: &Limits) -> Self {
        Self {
            local_connections: limits.local_connections,
            max_connections: limits.max_connections,
            per_peer: limits.per_peer,
            #[cfg(test)]
            fair: true,
            ledger: Arc::default(),
        }
    }

    fn admit(&self, peer: Peer, now: Instant) -> Result<Slot, Refused> {
        let mut ledger = self.ledger.lock().unwrap_or_else(PoisonError::into_inner);
        let key = match peer {
            Peer::Local if ledger.reserve_used < self.local_connections => {
                let (id, evict) = ledger.insert(None, now);
                return Ok(Slot { id, evict, ledger: self.ledger.clone() });
            }
            Peer::Local => PeerKey::Node,
            Peer::Remote(ip) => {
                if ledger.count(PeerKey::Addr(ip)) >= self.per_peer {
                    return Err(Refused::PeerCap);
                }
                PeerKey::Addr(ip)
            }
        };
        if ledger.shared_used >= self.max_connections {
            #[cfg(test)]
            if !self.fair {
                return Err(Refused::PoolFull);
            }
            let victim = ledger.victim(key).ok_or(Refused::PoolFull)?;
            if let Some(e) = ledger.release(victim) {
                e.evict.notify_one();
                ledger.evictions += 1;
            }
        }
        let (id, evict) = ledger.insert(Some(key), now);
        Ok(Slot { id, evict, ledger: self.ledger.clone() })
    }

    /// Slots taken away since the last call.
    fn take_evictions(&self) -> u64 {
        std::mem::take(&mut self.ledger.lock().unwrap_or_else(PoisonError::into_inner).evictions)
    }
}

/// A warning about refused connections is logged at most this often.
const REFUSALS_WARNING_EVERY: Duration = Duration::from_secs(60);

/// Connections closed unserved or cut for a fairer peer: each at debug level, and a warning
/// counting them at most every [`REFUSALS_WARNING_EVERY`] (a flood must not flood the log).
#[derive(Debug, Default)]
struct Refusals {
    peer_cap: u64,
    pool_full: u64,
    /// Connections cut before their headers arrived, their slot given to a peer with fewer.
    evicted: u64,
    warned_at: Option<Instant>,
}

impl Refusals {
    fn evicted(&mut self, n: u64, peer: Option<SocketAddr>, now: Instant) {
        if n > 0 {
            self.evicted += n;
            self.warn(peer, now);
        }
    }

    fn count(&mut self, peer: Option<SocketAddr>, why: Refused, now: Instant) {
        tracing::debug!(peer = ?peer, reason = why.as_str(), "HTTP connection refused: closed unread");
        match why {
            Refused::PeerCap => self.peer_cap += 1,
            Refused::PoolFull => self.pool_full += 1,
        }
        self.warn(peer, now);
    }

    fn warn(&mut self, peer: Option<SocketAddr>, now: Instant) {
        if self.warned_at.is_none_or(|t| now.saturating_duration_since(t) >= REFUSALS_WARNING_EVERY) {
            tracing::warn!(
                per_peer_cap = self.peer_cap,
                pool_full = self.pool_full,
                cut_waiting_for_headers = self.evicted,
                last_peer = ?peer,
                "HTTP connections refused or cut since the last such warning: too many at once from one peer or in all (see the debug log for each)"
            );
            (self.peer_cap, self.pool_full, self.evicted, self.warned_at) = (0, 0, 0, Some(now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpSocket, TcpStream};
    use tokio::task::JoinHandle;

    /// `/big`'s body: far more than the kernel buffers of a client that does not read, so
    /// writing it holds the connection.
    fn big() -> Bytes {
        static BIG: OnceLock<Bytes> = OnceLock::new();
        BIG.get_or_init(|| Bytes::from(vec![b'x'; 16 << 20])).clone()
    }

    fn handler() -> Handler {
        Arc::new(|path: &str| match path {
            "/big" => Response::new(Full::new(big())),
            _ => json_response(StatusCode::OK, json!({"path": path})),
        })
    }

    fn get(socket: &std::path::Path) -> std::io::Result<String> {
        let mut s = std::os::unix::net::UnixStream::connect(socket)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        s.write_all(b"GET /x HTTP/1.1\r\nHost: flock\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_and_idle_clients_are_dropped_and_connections_are_bounded() {
        let dir = std::env::temp_dir().join(format!("flock-http-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("http.sock");
        // Unix-socket clients are local: two slots of their own, none shared.
        let limits = Limits {
            header_read: Duration::from_millis(300),
            connection: Duration::from_secs(2),
            local_connections: 2,
            max_connections: 0,
            ..Limits::default()
        };
        let (stop_tx, stop) = watch::channel(false);
        let server = tokio::spawn(serve_limited(ListenAddr::Unix(socket.clone()), handler(), limits, stop));
        while !socket.exists() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let sock = socket.clone();
        tokio::task::spawn_blocking(move || {
            // One request per connection: the server closes after answering.
            let out = get(&sock).unwrap();
            assert!(out.starts_with("HTTP/1.1 200") && out.contains("\"path\":\"/x\""), "{out}");
            assert!(out.to_ascii_lowercase().contains("connection: close"), "{out}");

            // Two clients that send nothing take both slots...
            let idle: Vec<_> = (0..2).map(|_| std::os::unix::net::UnixStream::connect(&sock).unwrap()).collect();
            // ...so a third is closed unanswered (at once, not queued behind them)...
            std::thread::sleep(Duration::from_millis(50));
            match get(&sock) {
                Ok(out) => assert!(out.is_empty(), "served while both slots were held: {out}"),
                Err(e) => assert!(e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::TimedOut, "{e}"),
            }
            for mut c in idle {
                let mut buf = Vec::new();
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                // Dropped by the server for not sending headers: EOF (or a 408 before it), not a hang.
                let read = c.read_to_end(&mut buf);
                assert!(!matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock), "an idle client was not dropped");
            }
            // ...and once they are dropped, the next is served.
            let started = std::time::Instant::now();
            loop {
                match get(&sock) {
                    Ok(out) if out.starts_with("HTTP/1.1 200") => break,
                    other => {
                        assert!(started.elapsed() < Duration::from_secs(5), "not served after the idle clients were dropped: {other:?}")
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .await
        .unwrap();
        stop_tx.send(true).unwrap();
        server.await.unwrap().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The default `[::]` takes both families: an IPv4 client (which arrives as
    /// `::ffff:127.0.0.1`) is still the local peer the listed addresses name, and an IPv6
    /// client is served too. (An IPv6-only node's kubelet probes the node's IPv6 address: a
    /// `0.0.0.0` default refused every probe there, found on a real IPv6 cluster.)
    #[tokio::test]
    async fn the_unspecified_ipv6_address_serves_both_families() {
        let listener = bind_tcp(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let limits = Limits { local_peers: LocalPeers::Listed([IpAddr::V4(Ipv4Addr::LOCALHOST)].into()), ..Limits::default() };
        let (stop_tx, stop) = watch::channel(false);
        let server = tokio::spawn(serve_on(Listener::Tcp(listener), handler(), limits, stop));
        let v4 = served_eventually(Ipv4Addr::LOCALHOST, SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)).await;
        assert!(v4.starts_with("HTTP/1.1 200"), "{v4}");
        let mut s = TcpStream::connect((Ipv6Addr::LOCALHOST, port)).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: flock\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await.unwrap().unwrap();
        assert!(String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"), "{}", String::from_utf8_lossy(&out));
        // The IPv4 loopback client, mapped, is still the listed local peer.
        let peer = SocketAddr::new(IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped()), 1);
        assert!(Classifier::Listed([IpAddr::V4(Ipv4Addr::LOCALHOST)].into()).is_local(peer.ip(), Instant::now()));
        stop_tx.send(true).unwrap();
        server.await.unwrap();
    }

    /// 127.0.0.`n`: a remote peer for [`tcp_server`] (Linux routes all of 127.0.0.0/8 to lo).
    fn pod(n: u8) -> Ipv4Addr {
        Ipv4Addr::new(127, 0, 0, n)
    }

    /// A server on 127.0.0.1 for which only 127.0.0.1 is local: [`pod`]s are remote.
    async fn tcp_server(limits: Limits) -> (SocketAddr, watch::Sender<bool>, JoinHandle<()>) {
        let (addr, stop_tx, server, _) = tcp_server_fair(limits, true).await;
        (addr, stop_tx, server)
    }

    /// [`tcp_server`], with its slots, fair or not (`false`: a full pool refuses everyone,
    /// as before fairness).
    async fn tcp_server_fair(limits: Limits, fair: bool) -> (SocketAddr, watch::Sender<bool>, JoinHandle<()>, Arc<Slots>) {
        let limits = Limits { local_peers: LocalPeers::Listed([IpAddr::V4(Ipv4Addr::LOCALHOST)].into()), ..limits };
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop) = watch::channel(false);
        let slots = Arc::new(Slots { fair, ..Slots::new(&limits) });
        let server = tokio::spawn(serve_slots(Listener::Tcp(listener), handler(), limits, slots.clone(), stop));
        (addr, stop_tx, server, slots)
    }

    /// A connection from `from`, with a small receive buffer (a client that does not read
    /// blocks the server's writes soon).
    async fn connect_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
        let s = TcpSocket::new_v4()?;
        s.bind((from, 0).into())?;
        s.set_recv_buffer_size(4096)?;
        s.connect(to).await
    }

    /// GET `path` from `from`: the whole answer, within `within`.
    async fn get_from(from: Ipv4Addr, to: SocketAddr, path: &str, within: Duration) -> std::io::Result<String> {
        let exchange = async {
            let mut s = connect_from(from, to).await?;
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: flock\r\n\r\n").as_bytes()).await?;
            let mut out = Vec::new();
            s.read_to_end(&mut out).await?;
            Ok(String::from_utf8_lossy(&out).into_owned())
        };
        tokio::time::timeout(within, exchange)
            .await
            .unwrap_or_else(|_| Err(std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no answer within {within:?}"))))
    }

    /// Retries [`get_from`] for up to 5 s until it is answered 200.
    async fn served_eventually(from: Ipv4Addr, to: SocketAddr) -> String {
        let started = Instant::now();
        loop {
            match get_from(from, to, "/healthz", Duration::from_secs(1)).await {
                Ok(out) if out.starts_with("HTTP/1.1 200") => return out,
                other => assert!(started.elapsed() < Duration::from_secs(5), "{from} not served: {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A client that requests `/big` and never reads the answer. The request is written
    /// even if the server already closed the connection (a refused one).
    async fn non_reader(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
        let mut s = connect_from(from, to).await.unwrap();
        let _ = s.write_all(b"GET /big HTTP/1.1\r\nHost: flock\r\n\r\n").await;
        s
    }

    /// Whether the server closed `s` without answering: EOF or a reset before any byte,
    /// within `within`.
    async fn closed_unanswered(s: &mut TcpStream, within: Duration) -> Result<(), String> {
        let mut buf = [0u8; 64];
        match tokio::time::timeout(within, s.read(&mut buf)).await {
            Ok(Ok(0)) => Ok(()),
            Ok(Err(e)) if matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe) => Ok(()),
            Ok(Ok(n)) => Err(format!("answered: {:?}", String::from_utf8_lossy(&buf[..n]))),
            Ok(Err(e)) => Err(format!("{e}")),
            Err(_) => Err(format!("still open after {within:?}")),
        }
    }

    /// A client that sends its headers one byte per `every` (never their end) and connects
    /// again when cut, until aborted.
    fn dribbler(from: Ipv4Addr, to: SocketAddr, every: Duration) -> JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                if let Ok(mut s) = connect_from(from, to).await {
                    for b in b"GET /healthz HTTP/1.1\r\nX-Slow: ".iter().chain(std::iter::repeat(&b'a')) {
                        if s.write_all(&[*b]).await.is_err() {
                            break;
                        }
                        tokio::time::sleep(every).await;
                    }
                }
                tokio::time::sleep(every).await;
            }
        })
    }

    async fn stop(stop_tx: watch::Sender<bool>, server: JoinHandle<()>) {
        stop_tx.send(true).unwrap();
        server.await.unwrap();
    }

    /// The review's attack: pods hold every shared slot with slow clients (more than the
    /// pool), and the node's probe is still answered at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_client_flood_from_pods_does_not_starve_the_nodes_probes() {
        let limits = Limits {
            max_connections: 8,
            per_peer: 4,
            local_connections: 2,
            // As long as before the fix, so only the reserve and refusing can save the probe.
            connection: Duration::from_secs(30),
            ..Limits::default()
        };
        let (addr, stop_tx, server, slots) = tcp_server_fair(limits, true).await;
        // Two pods request /big and never read: 8 connections being answered, the whole
        // shared pool (none waits for headers, so fairness takes none of them)...
        let mut held = Vec::new();
        for p in [2, 3] {
            for _ in 0..4 {
                held.push(non_reader(pod(p), addr).await);
            }
        }
        let started = Instant::now();
        while slots.serving() < 8 {
            assert!(started.elapsed() < Duration::from_secs(10), "the non-readers were not all answered");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // ...and ten more send their headers one byte per 500 ms, 4 connections each,
        // connecting again when cut: 40 more than the pool.
        let dribblers: Vec<_> = (4..14).flat_map(|p| (0..4).map(move |_| dribbler(pod(p), addr, Duration::from_millis(500)))).collect();
        // The pool is held: another pod is closed at once, not left in the accept queue.
        let mut late = connect_from(pod(200), addr).await.unwrap();
        closed_unanswered(&mut late, Duration::from_secs(5)).await.unwrap();

        // The kubelet's probes (from the node: 127.0.0.1 here) are answered, each well within
        // the kubelet's default timeout of 1 s.
        for _ in 0..5 {
            let out = get_from(Ipv4Addr::LOCALHOST, addr, "/healthz", Duration::from_secs(1)).await.unwrap();
            assert!(out.starts_with("HTTP/1.1 200") && out.contains("\"path\":\"/healthz\""), "{out}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        // The flood was on all along: the pool is still held.
        let mut late = connect_from(pod(201), addr).await.unwrap();
        closed_unanswered(&mut late, Duration::from_secs(5)).await.unwrap();
        // The non-readers were served (their answers are stuck in the kernel's buffers).
        for c in &mut held {
            let mut status = [0u8; 12];
            tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut status)).await.unwrap().unwrap();
            assert_eq!(&status, b"HTTP/1.1 200");
        }
        for d in dribblers {
            d.abort();
        }
        stop(stop_tx, server).await;
    }

    /// One pod gets at most `per_peer` connections served at once; the rest are closed at
    /// once, and other pods are served meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_peer_gets_at_most_per_peer_connections() {
        let limits = Limits { max_connections: 64, per_peer: 4, connection: Duration::from_secs(30), ..Limits::default() };
        let (addr, stop_tx, server) = tcp_server(limits).await;
        let mut conns = Vec::new();
        for _ in 0..10 {
            conns.push(non_reader(pod(2), addr).await);
        }
        // The first four are served (their answers start)...
        for c in &mut conns[..4] {
            let mut status = [0u8; 12];
            tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut status)).await.unwrap().unwrap();
            assert_eq!(&status, b"HTTP/1.1 200");
        }
        // ...the other six are closed unanswered, at once.
        for (i, c) in conns[4..].iter_mut().enumerate() {
            if let Err(e) = closed_unanswered(c, Duration::from_secs(5)).await {
                panic!("connection {} beyond the cap: {e}", i + 5);
            }
        }
        // Another pod is served while the first holds its four.
        let out = get_from(pod(3), addr, "/healthz", Duration::from_secs(5)).await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        // Once its connections end, the pod is served again.
        drop(conns);
        served_eventually(pod(2), addr).await;
        stop(stop_tx, server).await;
    }

    /// A client that dribbles its headers is cut after `header_read`; one that does not read
    /// its answer, after `connection`; and their slots are given back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_clients_are_cut_after_the_limits() {
        // One slot for the remote pod: served again only once the slow connection is cut.
        let one = Limits { max_connections: 1, per_peer: 1, local_connections: 0, ..Limits::default() };

        // Headers one byte per 100 ms: cut by the header deadline (300 ms), long before the
        // connection's (30 s).
        let (addr, stop_tx, server) =
            tcp_server(Limits { header_read: Duration::from_millis(300), connection: Duration::from_secs(30), ..one.clone() }).await;
        let s = connect_from(pod(2), addr).await.unwrap();
        let (mut rd, mut wr) = s.into_split();
        let writer = tokio::spawn(async move {
            for b in b"GET /healthz HTTP/1.1\r\nX-Slow: ".iter().chain(std::iter::repeat(&b'a')) {
                if wr.write_all(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let mut out = Vec::new();
        match tokio::time::timeout(Duration::from_secs(10), rd.read_to_end(&mut out)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
            Err(_) => panic!("a client dribbling its headers was not cut"),
        }
        let out = String::from_utf8_lossy(&out);
        assert!(out.is_empty() || out.starts_with("HTTP/1.1 408"), "{out}");
        writer.abort();
        served_eventually(pod(2), addr).await;
        stop(stop_tx, server).await;

        // A request whose answer is never read: cut after `connection` (1 s).
        let (addr, stop_tx, server) =
            tcp_server(Limits { header_read: Duration::from_secs(2), connection: Duration::from_secs(1), ..one }).await;
        let mut s = non_reader(pod(2), addr).await;
        // Its slot is given back when the connection is cut (while the client still does not read).
        served_eventually(pod(2), addr).await;
        // It got a part of the answer, not all of it.
        let mut got = Vec::new();
        match tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
            Err(_) => panic!("a client that did not read its answer was not cut"),
        }
        assert!(got.len() < big().len(), "the whole answer was written: {} bytes", got.len());
        stop(stop_tx, server).await;
    }

    /// A slowloris attacker on a runtime of its own (so that the test measures the server,
    /// not its own scheduling): `peers` addresses (127.0.1.x, 127.0.2.x, ...) with 4
    /// connections each that send a part of their headers and then one byte per 500 ms,
    /// connecting again 200 ms after being cut (ten times as eager as the attacker,
    /// which came back every 2 s), until dropped.
    struct Slowloris {
        runtime: Option<tokio::runtime::Runtime>,
    }

    impl Drop for Slowloris {
        fn drop(&mut self) {
            if let Some(rt) = self.runtime.take() {
                rt.shutdown_background();
            }
        }
    }

    fn slowloris(peers: usize, to: SocketAddr) -> Slowloris {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        for p in 0..peers {
            let from = Ipv4Addr::new(127, 0, 1 + (p / 250) as u8, 1 + (p % 250) as u8);
            for _ in 0..4 {
                runtime.spawn(async move {
                    loop {
                        if let Ok(mut s) = connect_from(from, to).await
                            && s.write_all(b"GET /metrics HTTP/1.1\r\nHost: flock\r\nX-Slow: ").await.is_ok()
                        {
                            let mut buf = [0u8; 64];
                            loop {
                                // Cut (EOF or reset) ends the connection; else one more byte.
                                match tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await {
                                    Ok(Ok(0) | Err(_)) => break,
                                    Ok(Ok(_)) => {}
                                    Err(_) => {
                                        if s.write_all(b"a").await.is_err() {
                                            break;
                                        }
                                    }
                                }
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                });
            }
        }
        Slowloris { runtime: Some(runtime) }
    }

    /// `n` GETs of `path` from `from`, one every 100 ms: how many were answered 200 within 1 s.
    async fn answered(from: Ipv4Addr, to: SocketAddr, path: &str, n: usize) -> usize {
        let mut ok = 0;
        for _ in 0..n {
            match get_from(from, to, path, Duration::from_secs(1)).await {
                Ok(out) if out.starts_with("HTTP/1.1 200") => ok += 1,
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ok
    }

    /// Waits until the flood holds every shared slot (at most 10 s).
    async fn pool_held(slots: &Slots, limits: &Limits) {
        let started = Instant::now();
        while slots.usage().1 < limits.max_connections {
            assert!(started.elapsed() < Duration::from_secs(10), "the flood never held the pool: {:?}", slots.usage());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The attack, with the default limits: 16, then 100 addresses each hold 4
    /// connections with partial headers (reconnecting when cut). A scraper at another
    /// address gets 29 of 30 answers within 1 s, the node's probes all 30 — and without
    /// fairness the same flood blinds the scraper.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slowloris_flood_from_many_addresses_leaves_a_scraper_its_share() {
        let limits = Limits::default();
        // Without fairness (and a header deadline the flood's connections outlive, so that none
        // is cut meanwhile): 16 addresses hold the pool and the scraper gets nothing.
        let unfair_limits = Limits { header_read: Duration::from_secs(30), ..limits.clone() };
        let (addr, stop_tx, server, slots) = tcp_server_fair(unfair_limits, false).await;
        let flood = slowloris(16, addr);
        pool_held(&slots, &limits).await;
        let unfair = answered(pod(250), addr, "/metrics", 10).await;
        assert_eq!(unfair, 0, "the attack did not work without fairness: {unfair} of 10 answered");
        drop(flood);
        stop(stop_tx, server).await;

        for peers in [16, 100] {
            let (addr, stop_tx, server, slots) = tcp_server_fair(limits.clone(), true).await;
            let flood = slowloris(peers, addr);
            pool_held(&slots, &limits).await;
            let (scraper, probes) =
                tokio::join!(answered(pod(250), addr, "/metrics", 30), answered(Ipv4Addr::LOCALHOST, addr, "/healthz", 30),);
            eprintln!("{peers} peers × 4 slow connections: the scraper got {scraper} of 30 answers within 1 s, the node's probes {probes}");
            assert!(scraper >= 29, "{peers} peers: the scraper got {scraper} of 30 answers within 1 s");
            assert_eq!(probes, 30, "{peers} peers: the node's probes got {probes} of 30 answers within 1 s");
            // The flood is still on (it holds the pool again as soon as the scraper is done),
            // spread over its addresses.
            pool_held(&slots, &limits).await;
            assert!(slots.usage().2 >= peers.min(limits.max_connections / limits.per_peer), "{:?}", slots.usage());
            drop(flood);
            stop(stop_tx, server).await;
        }
    }

    #[test]
    fn the_node_addresses_are_cached_and_listed_again() {
        let node: Arc<Mutex<BTreeSet<IpAddr>>> = Arc::new(Mutex::new(["10.0.0.1".parse().unwrap()].into()));
        let listings = Arc::new(AtomicUsize::new(0));
        let (n, l) = (node.clone(), listings.clone());
        let mut addrs = NodeAddresses::new(
            Duration::from_secs(5),
            Box::new(move || {
                l.fetch_add(1, Ordering::SeqCst);
                Ok(n.lock().unwrap().clone())
            }),
        );
        let t0 = Instant::now();
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        assert!(addrs.is_local(ip("10.0.0.1"), t0));
        assert_eq!(listings.load(Ordering::SeqCst), 1);
        // IPv4-mapped IPv6 (a dual-stack listener) is the IPv4 address; loopback is local
        // without a listing.
        assert!(addrs.is_local(ip("::ffff:10.0.0.1"), t0));
        assert!(addrs.is_local(ip("127.0.0.9"), t0) && addrs.is_local(ip("::1"), t0));
        assert!(!addrs.is_local(ip("10.0.0.2"), t0));
        // An address added later: not listed again within 5 s, however many peers ask...
        node.lock().unwrap().insert(ip("10.0.0.2"));
        for _ in 0..100 {
            assert!(!addrs.is_local(ip("10.0.0.2"), t0 + Duration::from_secs(4)));
        }
        assert_eq!(listings.load(Ordering::SeqCst), 1);
        // ...then recognised; and a removed one forgotten.
        node.lock().unwrap().remove(&ip("10.0.0.1"));
        assert!(addrs.is_local(ip("10.0.0.2"), t0 + Duration::from_secs(5)));
        assert!(!addrs.is_local(ip("10.0.0.1"), t0 + Duration::from_secs(5)));
        assert_eq!(listings.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_failed_listing_keeps_the_known_addresses() {
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let f = fail.clone();
        let mut addrs = NodeAddresses::new(
            Duration::ZERO,
            Box::new(
                move || if f.load(Ordering::SeqCst) { Err(nix::errno::Errno::ENOBUFS) } else { Ok(["10.0.0.1".parse().unwrap()].into()) },
            ),
        );
        let now = Instant::now();
        assert!(addrs.is_local("10.0.0.1".parse().unwrap(), now));
        fail.store(true, Ordering::SeqCst);
        assert!(addrs.is_local("10.0.0.1".parse().unwrap(), now));
    }

    impl Slots {
        /// (reserve slots used, shared slots used, peers holding shared slots).
        fn usage(&self) -> (usize, usize, usize) {
            let l = self.ledger.lock().unwrap();
            (l.reserve_used, l.shared_used, l.shared_by_peer.len())
        }

        /// Connections being answered.
        fn serving(&self) -> usize {
            self.ledger.lock().unwrap().conns.values().filter(|e| e.phase == Phase::Serving).count()
        }
    }

    #[test]
    fn slots_keep_the_reserve_for_the_node_and_cap_each_peer() {
        let slots = Slots::new(&Limits { local_connections: 1, max_connections: 2, per_peer: 1, ..Limits::default() });
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = ("10.1.0.1".parse().unwrap(), "10.1.0.2".parse().unwrap(), "10.1.0.3".parse().unwrap());
        let now = Instant::now();
        let first = slots.admit(Peer::Remote(a), now).unwrap();
        assert_eq!(slots.admit(Peer::Remote(a), now).err(), Some(Refused::PeerCap));
        let second = slots.admit(Peer::Remote(b), now).unwrap();
        // Both are being answered: the shared pool is full and a third peer is refused, the
        // node is not...
        assert!(first.serving() && second.serving());
        assert_eq!(slots.admit(Peer::Remote(c), now).err(), Some(Refused::PoolFull));
        let local = slots.admit(Peer::Local, now).unwrap();
        // ...until its reserve is busy too.
        assert_eq!(slots.admit(Peer::Local, now).err(), Some(Refused::PoolFull));
        // A refused peer leaves no count behind; a slot given back frees its peer.
        assert_eq!(slots.usage(), (1, 2, 2));
        drop(first);
        assert_eq!(slots.usage(), (1, 1, 1));
        let again = slots.admit(Peer::Remote(a), now).unwrap();
        // Local peers fall back on the shared pool when their reserve is busy.
        drop((again, second));
        let shared = slots.admit(Peer::Local, now).unwrap();
        assert_eq!(slots.usage(), (1, 1, 1));
        drop((local, shared));
        assert_eq!(slots.usage(), (0, 0, 0));
        assert_eq!(slots.take_evictions(), 0);
    }

    #[test]
    fn a_full_pool_gives_a_waiting_slot_of_the_peer_with_most_to_a_peer_with_fewer() {
        let slots = Slots::new(&Limits { local_connections: 0, max_connections: 4, per_peer: 3, ..Limits::default() });
        let ip = |n: u8| Peer::Remote(IpAddr::V4(Ipv4Addr::new(198, 18, 0, n)));
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Peer 1 holds three slots waiting for headers (the oldest at 0 ms), peer 2 one.
        let a: Vec<_> = (0..3).map(|i| slots.admit(ip(1), at(i)).unwrap()).collect();
        let b = slots.admit(ip(2), at(10)).unwrap();
        // Peer 3 holds none: it takes peer 1's oldest slot, whose connection is told.
        let c = slots.admit(ip(3), at(20)).unwrap();
        assert_eq!(slots.take_evictions(), 1);
        assert!(!a[0].serving(), "the oldest of the peer with most was not taken");
        assert!(a[1].serving() && a[2].serving());
        // Peer 1's two are being answered now: what still waits is peer 2's and peer 3's, one
        // each, so peer 4 (none) takes the older of them, peer 2's.
        let d = slots.admit(ip(4), at(30)).unwrap();
        assert!(!b.serving() && c.serving() && d.serving());
        // Everyone holds one or more and nothing waits: peer 5 is refused; and a peer with as
        // many as the one with most takes nothing either.
        assert_eq!(slots.admit(ip(5), at(40)).err(), Some(Refused::PoolFull));
        drop(d);
        let d = slots.admit(ip(4), at(50)).unwrap();
        assert_eq!(slots.admit(ip(4), at(60)).err(), Some(Refused::PoolFull), "peer 4 (1) took from peer 4 (1)");
        assert_eq!(slots.take_evictions(), 1);
        // The taken slots were counted off at once: four in use, by three peers.
        assert_eq!(slots.usage(), (0, 4, 3));
        drop((a, b, c, d));
        assert_eq!(slots.usage(), (0, 0, 0));
        // The node's connections in the shared pool count as one peer.
        let node: Vec<_> = (0..4).map(|i| slots.admit(Peer::Local, at(100 + i)).unwrap()).collect();
        let e = slots.admit(ip(1), at(200)).unwrap();
        assert!(!node[0].serving() && node[1].serving());
        assert_eq!(slots.usage(), (0, 4, 2));
        drop(e);
    }
}
