//! flock-agent's HTTP endpoints: `/healthz` (alive: a sync committed recently; it also shows
//! the API health, each watch's state and the last API error, which do not fail it — the
//! agent is alive and enforcing last-known rules while the API is away), `/readyz` (caches
//! synced and the first sync committed), `/metrics` (Prometheus text format; the health
//! gauges are refreshed from the API health at every scrape, so they always agree with it).
//! Served on TCP, or on a unix socket (`unix:/path`) for tests and sidecars.

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
use hyper_util::rt::TokioIo;
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
            let healthy = match age {
                Some(a) => a <= state.max_sync_age,
                None => state.started.elapsed() <= state.startup_grace,
            };
            let body = json!({
                "status": if healthy { "ok" } else { "stale" },
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

/// Answers a request path with a response (no bodies are read: every endpoint is a GET).
pub type Handler = Arc<dyn Fn(&str) -> Response<Full<Bytes>> + Send + Sync>;

/// A small HTTP/1 server for health and metrics endpoints (shared by flock-agent and
/// flock-controller), on TCP or a unix socket, until `stop`.
pub async fn serve_with(addr: ListenAddr, handler: Handler, mut stop: watch::Receiver<bool>) -> std::io::Result<()> {
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
    tracing::info!(address = ?addr, "serving health and metrics endpoints");
    loop {
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
            let svc = service_fn(move |req: Request<Incoming>| {
                let r = handler(req.uri().path());
                async move { Ok::<_, Infallible>(r) }
            });
            let result = match conn {
                Conn::Tcp(s) => http1::Builder::new().serve_connection(TokioIo::new(s), svc).await,
                Conn::Unix(s) => http1::Builder::new().serve_connection(TokioIo::new(s), svc).await,
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "HTTP connection ended with an error");
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
