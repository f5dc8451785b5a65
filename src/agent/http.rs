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
//!   from a Prometheus on another node (many pods together can, and the reserve stays).
//! - **Time.** The request headers within `header_read` (2 s: a real client sends them in one
//!   packet; hyper's deadline is for all of them, so dribbling bytes does not extend it), the
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
//! (`FLOCK_METRICS_ADDRESS`; default `0.0.0.0:9781` for flock-agent, `0.0.0.0:9782` for
//! flock-controller), or deny that egress by policy.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
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
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

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
            header_read: Duration::from_secs(2),
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
        ListenAddr::Tcp(a) => Listener::Tcp(tokio::net::TcpListener::bind(a).await?),
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
async fn serve_on(listener: Listener, handler: Handler, limits: Limits, mut stop: watch::Receiver<bool>) {
    let slots = Slots::new(&limits);
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
        let peer = match peer_addr {
            None => Peer::Local,
            Some(a) if local.is_local(a.ip(), Instant::now()) => Peer::Local,
            Some(a) => Peer::Remote(a.ip().to_canonical()),
        };
        let slot = match slots.admit(peer) {
            Ok(s) => s,
            Err(why) => {
                // Closed unread: the client sees the connection end (FIN or RST) at once.
                drop(conn);
                refusals.count(peer_addr, why, Instant::now());
                continue;
            }
        };
        let handler = handler.clone();
        let (header_read, connection) = (limits.header_read, limits.connection);
        tokio::spawn(async move {
            let _slot = slot;
            let svc = service_fn(move |req: Request<Incoming>| {
                let r = handler(req.uri().path());
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
            match tokio::time::timeout(connection, served).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(peer = ?peer_addr, error = %e, "HTTP connection ended with an error"),
                Err(_) => tracing::debug!(peer = ?peer_addr, limit = ?connection, "HTTP connection cut: too slow"),
            }
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
    /// No slot: the shared pool is full (for a local peer, its reserve too).
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

/// Connections being served per remote peer address.
type PeerCounts = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// The slots: a reserve for local peers, a shared pool for everyone, connections per remote
/// peer. Decided without waiting: a connection gets a slot now or none.
struct Slots {
    local: Arc<Semaphore>,
    shared: Arc<Semaphore>,
    per_peer: usize,
    peers: PeerCounts,
}

/// A connection's slot, given back when dropped.
struct Slot {
    _permit: OwnedSemaphorePermit,
    peer: Option<(IpAddr, PeerCounts)>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some((ip, peers)) = &self.peer {
            let mut peers = peers.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(n) = peers.get_mut(ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    peers.remove(ip);
                }
            }
        }
    }
}

impl Slots {
    fn new(limits: &Limits) -> Self {
        Self {
            local: Arc::new(Semaphore::new(limits.local_connections.min(Semaphore::MAX_PERMITS))),
            shared: Arc::new(Semaphore::new(limits.max_connections.min(Semaphore::MAX_PERMITS))),
            per_peer: limits.per_peer,
            peers: PeerCounts::default(),
        }
    }

    fn admit(&self, peer: Peer) -> Result<Slot, Refused> {
        match peer {
            Peer::Local => {
                let permit = self.local.clone().try_acquire_owned().or_else(|_| self.shared.clone().try_acquire_owned());
                Ok(Slot { _permit: permit.map_err(|_| Refused::PoolFull)?, peer: None })
            }
            Peer::Remote(ip) => {
                let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
                let n = peers.get(&ip).copied().unwrap_or(0);
                if n >= self.per_peer {
                    return Err(Refused::PeerCap);
                }
                let permit = self.shared.clone().try_acquire_owned().map_err(|_| Refused::PoolFull)?;
                peers.insert(ip, n + 1);
                Ok(Slot { _permit: permit, peer: Some((ip, self.peers.clone())) })
            }
        }
    }
}

/// A warning about refused connections is logged at most this often.
const REFUSALS_WARNING_EVERY: Duration = Duration::from_secs(60);

/// Connections closed unserved: each at debug level, and a warning counting them at most every
/// [`REFUSALS_WARNING_EVERY`] (a flood must not flood the log).
#[derive(Debug, Default)]
struct Refusals {
    peer_cap: u64,
    pool_full: u64,
    warned_at: Option<Instant>,
}

impl Refusals {
    fn count(&mut self, peer: Option<SocketAddr>, why: Refused, now: Instant) {
        tracing::debug!(peer = ?peer, reason = why.as_str(), "HTTP connection refused: closed unread");
        match why {
            Refused::PeerCap => self.peer_cap += 1,
            Refused::PoolFull => self.pool_full += 1,
        }
        if self.warned_at.is_none_or(|t| now.saturating_duration_since(t) >= REFUSALS_WARNING_EVERY) {
            tracing::warn!(
                per_peer_cap = self.peer_cap,
                pool_full = self.pool_full,
                last_peer = ?peer,
                "HTTP connections refused since the last such warning: too many at once from one peer or in all (see the debug log for each)"
            );
            (self.peer_cap, self.pool_full, self.warned_at) = (0, 0, Some(now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::Ipv4Addr;
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

    /// 127.0.0.`n`: a remote peer for [`tcp_server`] (Linux routes all of 127.0.0.0/8 to lo).
    fn pod(n: u8) -> Ipv4Addr {
        Ipv4Addr::new(127, 0, 0, n)
    }

    /// A server on 127.0.0.1 for which only 127.0.0.1 is local: [`pod`]s are remote.
    async fn tcp_server(limits: Limits) -> (SocketAddr, watch::Sender<bool>, JoinHandle<()>) {
        let limits = Limits { local_peers: LocalPeers::Listed([IpAddr::V4(Ipv4Addr::LOCALHOST)].into()), ..limits };
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop) = watch::channel(false);
        let server = tokio::spawn(serve_on(Listener::Tcp(listener), handler(), limits, stop));
        (addr, stop_tx, server)
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
        let (addr, stop_tx, server) = tcp_server(limits).await;
        // Two pods request /big and never read: 8 connections, the whole shared pool...
        let mut held = Vec::new();
        for p in [2, 3] {
            for _ in 0..4 {
                held.push(non_reader(pod(p), addr).await);
            }
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

    #[test]
    fn slots_keep_the_reserve_for_the_node_and_cap_each_peer() {
        let slots = Slots::new(&Limits { local_connections: 1, max_connections: 2, per_peer: 1, ..Limits::default() });
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = ("10.1.0.1".parse().unwrap(), "10.1.0.2".parse().unwrap(), "10.1.0.3".parse().unwrap());
        let first = slots.admit(Peer::Remote(a)).unwrap();
        assert_eq!(slots.admit(Peer::Remote(a)).err(), Some(Refused::PeerCap));
        let second = slots.admit(Peer::Remote(b)).unwrap();
        // The shared pool is full: a third peer is refused, the node is not...
        assert_eq!(slots.admit(Peer::Remote(c)).err(), Some(Refused::PoolFull));
        let local = slots.admit(Peer::Local).unwrap();
        // ...until its reserve is busy too.
        assert_eq!(slots.admit(Peer::Local).err(), Some(Refused::PoolFull));
        // A refused peer leaves no count behind; a slot given back frees its peer.
        assert_eq!(slots.peers.lock().unwrap().len(), 2);
        drop(first);
        assert_eq!(slots.peers.lock().unwrap().len(), 1);
        let again = slots.admit(Peer::Remote(a)).unwrap();
        // Local peers fall back on the shared pool when their reserve is busy.
        drop((again, second));
        let shared = slots.admit(Peer::Local).unwrap();
        assert!(slots.peers.lock().unwrap().is_empty());
        drop((local, shared));
        assert_eq!(slots.local.available_permits(), 1);
        assert_eq!(slots.shared.available_permits(), 2);
    }
}
