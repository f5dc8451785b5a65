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

/// Connects every request to one unix socket, whatever its URI.
#[derive(Debug, Clone)]
pub struct UnixConnector {
    path: Arc<PathBuf>,
}

impl UnixConnector {
    /// A connector to the socket at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: Arc::new(path.into()) }
    }
}

impl tower::Service<http::Uri> for UnixConnector {
    type Response = TokioIo<UnixStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: http::Uri) -> Self::Future {
        let path = self.path.clone();
        Box::pin(async move { Ok(TokioIo::new(UnixStream::connect(&*path).await?)) })
    }
}

/// A `kube::Client` (default namespace `default`) talking to the socket at `path`.
pub fn client_for_socket(path: impl Into<PathBuf>) -> kube::Client {
    let http = HttpClient::builder(TokioExecutor::new()).build::<_, kube::client::Body>(UnixConnector::new(path));
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
