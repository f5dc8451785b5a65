//! flock-agent's HTTP endpoints: `/healthz` (alive: a sync committed recently; it also shows
//! the API health, each watch's state and the last API error, which do not fail it — the
//! agent is alive and enforcing last-known rules while the API is away), `/readyz` (caches
//! synced and the first sync committed), `/metrics` (Prometheus text format; the health
//! gauges are refreshed from the API health at every scrape, so they always agree with it).
//! Served on TCP, or on a unix socket (`unix:/path`) for tests and sidecars.
//!
//! The server is small and defensive (it listens on every node, often on the host
//! network): one request per connection (no keep-alive, so no idle connections), a client
//! that does not send its headers in time is dropped, a connection that takes too long in
//! all is cut, and at most a fixed number of connections are served at once — the rest wait
//! in the kernel's accept queue ([`Limits`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use tokio::sync::watch;

use super::SyncStatus;
use super::metrics::Metrics;
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
pub struct HttpState {
    pub metrics: Arc<Metrics>,
    pub status: watch::Receiver<SyncStatus>,
    pub source: Source,
    pub health: Option<Arc<ApiHealth>>,
    /// `/healthz` fails when the last committed sync is older than this.
    pub max_sync_age: Duration,
    /// Before the first sync, `/healthz` passes for this long (caches are loading).
    pub startup_grace: Duration,
    pub started: Instant,
}

/// A JSON response.
pub fn json_response(code: StatusCode, body: serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = code;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

/// A Prometheus (OpenMetrics text) response.
pub fn metrics_response(text: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(text)));
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    r
}

/// Answers one request.
pub fn respond(state: &HttpState, path: &str) -> Response<Full<Bytes>> {
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
pub async fn serve(addr: ListenAddr, state: HttpState, stop: watch::Receiver<bool>) -> std::io::Result<()> {
    let handler: Handler = Arc::new(move |path: &str| respond(&state, path));
    serve_with(addr, handler, stop).await
}

/// How much the endpoint server lets one client take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A connection's request headers must arrive within this.
    pub header_read: Duration,
    /// A connection (request and response) is cut after this.
    pub connection: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { header_read: Duration::from_secs(5), connection: Duration::from_secs(30), max_connections: 64 }
    }
}

/// Answers a request path with a response (no bodies are read: every endpoint is a GET).
pub type Handler = Arc<dyn Fn(&str) -> Response<Full<Bytes>> + Send + Sync>;

/// A small HTTP/1 server for health and metrics endpoints (shared by flock-agent and
/// flock-controller), on TCP or a unix socket, until `stop`.
pub async fn serve_with(addr: ListenAddr, handler: Handler, stop: watch::Receiver<bool>) -> std::io::Result<()> {
    serve_limited(addr, handler, Limits::default(), stop).await
}

/// [`serve_with`] with explicit [`Limits`].
pub async fn serve_limited(addr: ListenAddr, handler: Handler, limits: Limits, mut stop: watch::Receiver<bool>) -> std::io::Result<()> {
    enum Listener {
        Tcp(tokio::net::TcpListener),
        Unix(tokio::net::UnixListener),
    }
    let listener = match &addr {
        ListenAddr::Tcp(a) => Listener::Tcp(tokio::net::TcpListener::bind(a).await?),
        ListenAddr::Unix(p) => {
            let _ = std::fs::remove_file(p);
            Listener::Unix(tokio::net::UnixListener::bind(p)?)
        }
    };
    tracing::info!(address = ?addr, ?limits, "serving health and metrics endpoints");
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    loop {
        // A free slot first: beyond the limit, connections wait in the accept queue.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = stop.changed() => break,
        };
        let accepted = tokio::select! {
            a = async {
                match &listener {
                    Listener::Tcp(l) => l.accept().await.map(|(s, _)| Conn::Tcp(s)),
                    Listener::Unix(l) => l.accept().await.map(|(s, _)| Conn::Unix(s)),
                }
            } => a,
            _ = stop.changed() => break,
        };
        let conn = match accepted {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accepting an HTTP connection");
                continue;
            }
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let svc = service_fn(move |req: Request<Incoming>| {
                let r = handler(req.uri().path());
                async move { Ok::<_, Infallible>(r) }
            });
            let mut builder = http1::Builder::new();
            builder.keep_alive(false).timer(TokioTimer::new()).header_read_timeout(limits.header_read);
            let served = async {
                match conn {
                    Conn::Tcp(s) => builder.serve_connection(TokioIo::new(s), svc).await,
                    Conn::Unix(s) => builder.serve_connection(TokioIo::new(s), svc).await,
                }
            };
            match tokio::time::timeout(limits.connection, served).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "HTTP connection ended with an error"),
                Err(_) => tracing::debug!(limit = ?limits.connection, "HTTP connection cut: too slow"),
            }
        });
    }
    if let ListenAddr::Unix(p) = &addr {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn handler() -> Handler {
        Arc::new(|path: &str| json_response(StatusCode::OK, json!({"path": path})))
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
        let limits = Limits { header_read: Duration::from_millis(300), connection: Duration::from_secs(2), max_connections: 2 };
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
            let started = std::time::Instant::now();
            // ...so a third is served only once they are dropped for not sending headers.
            let out = get(&sock).unwrap();
            assert!(out.starts_with("HTTP/1.1 200"), "{out}");
            assert!(started.elapsed() >= Duration::from_millis(250), "served before the idle clients were dropped");
            for mut c in idle {
                let mut buf = Vec::new();
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                // Dropped by the server: EOF (or a 408 before it), not a hang.
                let _ = c.read_to_end(&mut buf);
            }
        })
        .await
        .unwrap();
        stop_tx.send(true).unwrap();
        server.await.unwrap().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
