//! A real `kube::Client` that reaches the server over its unix socket.
//!
//! The stack is what kube builds for a cluster, minus TLS and auth: a hyper-util legacy
//! client (HTTP/1, connection pool) whose connector dials the socket instead of resolving the
//! URI, behind kube's `BaseUriLayer` (requests are made absolute against a placeholder
//! `http://flock-test-apiserver.invalid`; the host is never resolved). No IP address is used.

use std::{
    future::Future,
    path::PathBuf,
    pin::Pin,
    sync::Arc,
    sync::atomic::{AtomicU64, Ordering},
    task::{Context, Poll},
};

use hyper_util::{
    client::legacy::Client as HttpClient,
    rt::{TokioExecutor, TokioIo},
};
use kube::client::middleware::BaseUriLayer;
use tokio::net::UnixStream;

/// Placeholder base URI; only its scheme matters (plain HTTP).
const BASE_URI: &str = "http://flock-test-apiserver.invalid";

/// Connects every request to one unix socket, whatever its URI; counts the bytes received.
#[derive(Debug, Clone)]
pub struct UnixConnector {
    path: Arc<PathBuf>,
    received: Arc<AtomicU64>,
}

impl UnixConnector {
    /// A connector to the socket at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: Arc::new(path.into()), received: Arc::default() }
    }
}

impl tower::Service<http::Uri> for UnixConnector {
    type Response = TokioIo<Counted>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let (path, received) = (self.path.clone(), self.received.clone());
        Box::pin(async move { Ok(TokioIo::new(Counted { inner: UnixStream::connect(&*path).await?, received })) })
    }
}

/// A connection that adds what it reads (headers and bodies, as sent) to a counter.
#[derive(Debug)]
pub struct Counted {
    inner: UnixStream,
    received: Arc<AtomicU64>,
}

impl tokio::io::AsyncRead for Counted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut tokio::io::ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before);
        self.received.fetch_add(n as u64, Ordering::Relaxed);
        r
    }
}

impl tokio::io::AsyncWrite for Counted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl hyper_util::client::legacy::connect::Connection for Counted {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        hyper_util::client::legacy::connect::Connected::new()
    }
}

/// A `kube::Client` (default namespace `default`) talking to the socket at `path`.
pub fn client_for_socket(path: impl Into<PathBuf>) -> kube::Client {
    client_for_socket_counting(path, Arc::default())
}

/// [`client_for_socket`], adding every byte it receives from the server to `received` (what
/// a client costs the API server: `agent_scale`'s `api_received_bytes`).
pub fn client_for_socket_counting(path: impl Into<PathBuf>, received: Arc<AtomicU64>) -> kube::Client {
    let connector = UnixConnector { path: Arc::new(path.into()), received };
    let http = HttpClient::builder(TokioExecutor::new()).build::<_, kube::client::Body>(connector);
    let service = tower::ServiceBuilder::new().layer(BaseUriLayer::new(http::Uri::from_static(BASE_URI))).service(http);
    kube::Client::new(service, "default")
}

/// A `kube::Client` (default namespace `default`) for a server on a TCP address, plain HTTP,
/// as a kubeconfig naming `http://ADDR` would give.
pub fn client_for_address(addr: std::net::SocketAddr) -> kube::Client {
    let http = HttpClient::builder(TokioExecutor::new()).build_http::<kube::client::Body>();
    let base = http::Uri::try_from(format!("http://{addr}")).unwrap_or_else(|_| http::Uri::from_static(BASE_URI));
    let service = tower::ServiceBuilder::new().layer(BaseUriLayer::new(base)).service(http);
    kube::Client::new(service, "default")
}
