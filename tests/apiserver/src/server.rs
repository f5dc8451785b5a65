//! [`ApiServer`]: starting and stopping the server, and the handle tests hold — direct store
//! access, fault switches and observation.
//!
//! The server accepts connections on a unix socket (or, for the `flock-test-apiserver`
//! binary, a TCP address: [`ApiServer::start_tcp`]) and serves each with hyper's HTTP/1
//! connection driver; a ticker sends watch bookmarks every [`Config::bookmark_interval`].
//! Dropping the last handle (or [`ApiServer::shutdown`]) stops it: open watches end,
//! connections are closed, and the socket (and the directory of [`ApiServer::start_temp`]) is
//! removed.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use kube::Resource;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, UnixListener},
    sync::watch,
    task::JoinHandle,
    task::JoinSet,
    time::MissedTickBehavior,
};
use tracing::{debug, warn};

use crate::{
    client::client_for_socket,
    error::{Error, Result},
    faults::{FailRule, Faults, RequestLog, RequestRecord},
    http::handle,
    registry::ResourceDef,
    store::{Backup, ObjKey, Store},
};

/// Server settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// How many events the watch history keeps; a watch from a resourceVersion older than
    /// the oldest kept event gets 410 Expired. Default 10 000.
    pub history_limit: usize,
    /// How often open watches that allow bookmarks get one (`None`: only on
    /// [`ApiServer::send_bookmarks`]). Default 1 s.
    pub bookmark_interval: Option<Duration>,
    /// Largest accepted request body. Default 16 MiB.
    pub max_body_bytes: usize,
    /// How many requests the log keeps (oldest dropped first). Default 100 000.
    pub request_log_limit: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            history_limit: 10_000,
            bookmark_interval: Some(Duration::from_secs(1)),
            max_body_bytes: 16 << 20,
            request_log_limit: 100_000,
        }
    }
}

/// State shared by the connection tasks and the handle.
pub(crate) struct Shared {
    pub store: Arc<Store>,
    pub faults: Arc<Faults>,
    pub log: RequestLog,
    pub config: Config,
}

/// Where the server listens.
#[derive(Debug, Clone)]
enum Endpoint {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

struct Inner {
    shared: Arc<Shared>,
    endpoint: Endpoint,
    temp_dir: Option<PathBuf>,
    shutdown: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        self.shared.store.close_watches();
        if let Endpoint::Unix(socket) = &self.endpoint {
            let _ = std::fs::remove_file(socket);
        }
        if let Some(dir) = &self.temp_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A running test API server and the handle to drive it. Cheap to clone; the server stops
/// when the last clone is dropped or on [`ApiServer::shutdown`].
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer").field("endpoint", &self.inner.endpoint).finish_non_exhaustive()
    }
}

impl ApiServer {
    /// Starts a server listening on a unix socket at `socket_path` (which must not exist).
    pub async fn start(socket_path: impl AsRef<Path>) -> Result<Self> {
        Self::start_with(socket_path, Config::default()).await
    }

    /// [`ApiServer::start`] with settings.
    pub async fn start_with(socket_path: impl AsRef<Path>, config: Config) -> Result<Self> {
        Self::spawn(socket_path.as_ref().to_path_buf(), None, config)
    }

    /// Starts a server on a socket in a new private temporary directory, removed when the
    /// server stops.
    pub async fn start_temp() -> Result<Self> {
        Self::start_temp_with(Config::default()).await
    }

    /// [`ApiServer::start_temp`] with settings.
    pub async fn start_temp_with(config: Config) -> Result<Self> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("flock-test-apiserver-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|source| Error::TempDir { path: dir.clone(), source })?;
        Self::spawn(dir.join("apiserver.sock"), Some(dir), config)
    }

    /// Starts a server on a TCP address (port 0 picks a free one: see
    /// [`ApiServer::local_addr`]), plain HTTP without authentication — for the
    /// `flock-test-apiserver` binary, which programs reach through a kubeconfig.
    pub async fn start_tcp(addr: SocketAddr, config: Config) -> Result<Self> {
        let listener = TcpListener::bind(addr).await.map_err(|source| Error::BindTcp { addr, source })?;
        let local = listener.local_addr().map_err(|source| Error::BindTcp { addr, source })?;
        Self::serve_on(Listener::Tcp(listener), Endpoint::Tcp(local), None, config)
    }

    fn spawn(socket: PathBuf, temp_dir: Option<PathBuf>, config: Config) -> Result<Self> {
        let listener = UnixListener::bind(&socket).map_err(|source| Error::Bind { path: socket.clone(), source })?;
        Self::serve_on(Listener::Unix(listener), Endpoint::Unix(socket), temp_dir, config)
    }

    fn serve_on(listener: Listener, endpoint: Endpoint, temp_dir: Option<PathBuf>, config: Config) -> Result<Self> {
        let shared = Arc::new(Shared {
            store: Store::new(config.history_limit),
            faults: Arc::new(Faults::default()),
            log: RequestLog::new(config.request_log_limit),
            config,
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        let task = tokio::spawn(serve(listener, shared.clone(), shutdown_rx));
        debug!(?endpoint, "test API server listening");
        Ok(Self { inner: Arc::new(Inner { shared, endpoint, temp_dir, shutdown, task: Mutex::new(Some(task)) }) })
    }

    /// The socket the server listens on (empty for a TCP server).
    pub fn socket_path(&self) -> &Path {
        match &self.inner.endpoint {
            Endpoint::Unix(socket) => socket,
            Endpoint::Tcp(_) => Path::new(""),
        }
    }

    /// The address a TCP server listens on (`None` on a unix socket).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match &self.inner.endpoint {
            Endpoint::Unix(_) => None,
            Endpoint::Tcp(addr) => Some(*addr),
        }
    }

    /// A real `kube::Client` (default namespace `default`) connected over the socket, or
    /// over TCP to a [`ApiServer::start_tcp`] server.
    pub fn client(&self) -> kube::Client {
        client_for(&self.inner.endpoint)
    }

    /// What builds a client like [`Self::client`] where it is called: on another thread's
    /// runtime, as flock-agent's informers build theirs.
    pub fn client_builder(&self) -> impl FnOnce() -> Result<kube::Client, kube::Error> + Send + 'static {
        let endpoint = self.inner.endpoint.clone();
        move || Ok(client_for(&endpoint))
    }

    /// Stops the server: ends open watches, closes connections, removes the socket. Later
    /// requests fail to connect.
    pub async fn shutdown(&self) {
        let _ = self.inner.shutdown.send(true);
        self.store().close_watches();
        let task = self.inner.task.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(task) = task {
            let _ = task.await;
        }
        if let Endpoint::Unix(socket) = &self.inner.endpoint {
            let _ = std::fs::remove_file(socket);
        }
    }

    fn store(&self) -> &Arc<Store> {
        &self.inner.shared.store
    }

    fn def(&self, api_version: &str, kind: &str) -> Result<Arc<ResourceDef>> {
        self.store()
            .resolve_kind(api_version, kind)
            .ok_or_else(|| Error::UnknownKind { api_version: api_version.to_owned(), kind: kind.to_owned() })
    }

    fn key(def: &ResourceDef, namespace: Option<&str>, name: &str) -> ObjKey {
        let ns = if def.namespaced { namespace.unwrap_or("default") } else { "" };
        (ns.to_owned(), name.to_owned())
    }

    // ---- resources ------------------------------------------------------------------

    /// Serves a custom resource (`flock.dev`, `v1alpha1`, `Run`, `runs`, namespaced), with a
    /// `/status` subresource. Creating a `CustomResourceDefinition` object registers its
    /// kinds the same way.
    pub fn register(&self, group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) {
        self.register_resource(ResourceDef::new(group, version, kind, plural, namespaced));
    }

    /// Serves a resource described in full (status subresource, field selectors, …).
    pub fn register_resource(&self, def: ResourceDef) {
        self.store().register(def);
    }

    // ---- direct store access ----------------------------------------------------------

    /// Creates or replaces an object as given (status, uid, labels… all kept; no
    /// optimistic concurrency), with the ADDED or MODIFIED watch event. Namespaced objects
    /// without a namespace go to `default`. Returns the stored object.
    pub fn apply(&self, object: Value) -> Result<Value> {
        let (Some(api_version), Some(kind)) = (object["apiVersion"].as_str(), object["kind"].as_str()) else {
            return Err(Error::MissingType);
        };
        let def = self.def(api_version, kind)?;
        self.store().put_direct(&def, object).map_err(Error::rejected)
    }

    /// One object, or `None`. `namespace` is ignored for cluster-scoped kinds.
    pub fn get(&self, api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Result<Option<Value>> {
        let def = self.def(api_version, kind)?;
        Ok(self.store().get(&def, &Self::key(&def, namespace, name)).map(|v| (*v).clone()))
    }

    /// Every object of a kind, in one namespace or (`None`) all, ordered by namespace/name.
    pub fn list(&self, api_version: &str, kind: &str, namespace: Option<&str>) -> Result<Vec<Value>> {
        let def = self.def(api_version, kind)?;
        let namespace = if def.namespaced { namespace } else { None };
        Ok(self.store().all(&def, namespace).into_iter().map(|v| (*v).clone()).collect())
    }

    /// Removes an object at once (finalizers ignored), with the DELETED watch event; returns
    /// its last state, or `None` if it did not exist.
    pub fn delete(&self, api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Result<Option<Value>> {
        let def = self.def(api_version, kind)?;
        Ok(self.store().remove_direct(&def, &Self::key(&def, namespace, name)))
    }

    /// [`ApiServer::apply`] for a typed object (`k8s_openapi` or `kube::CustomResource`).
    pub fn apply_resource<K>(&self, object: &K) -> Result<K>
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned,
    {
        let mut value = serde_json::to_value(object)?;
        if let Some(map) = value.as_object_mut() {
            map.insert("apiVersion".into(), K::api_version(&()).into());
            map.insert("kind".into(), K::kind(&()).into());
        }
        Ok(serde_json::from_value(self.apply(value)?)?)
    }

    /// [`ApiServer::get`] for a typed object.
    pub fn get_resource<K>(&self, namespace: Option<&str>, name: &str) -> Result<Option<K>>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let value = self.get(&K::api_version(&()), &K::kind(&()), namespace, name)?;
        Ok(value.map(serde_json::from_value).transpose()?)
    }

    /// [`ApiServer::list`] for a typed object.
    pub fn list_resources<K>(&self, namespace: Option<&str>) -> Result<Vec<K>>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let values = self.list(&K::api_version(&()), &K::kind(&()), namespace)?;
        Ok(values.into_iter().map(serde_json::from_value).collect::<Result<_, _>>()?)
    }

    /// [`ApiServer::delete`] for a typed object.
    pub fn delete_resource<K>(&self, namespace: Option<&str>, name: &str) -> Result<Option<K>>
    where
        K: Resource<DynamicType = ()> + DeserializeOwned,
    {
        let value = self.delete(&K::api_version(&()), &K::kind(&()), namespace, name)?;
        Ok(value.map(serde_json::from_value).transpose()?)
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.store().resource_version()
    }

    // ---- faults -------------------------------------------------------------------------

    /// While on, every request gets 503 ServiceUnavailable (with a `Status`); switching it
    /// on also ends every open watch.
    pub fn unavailable(&self, on: bool) {
        self.inner.shared.faults.set_unavailable(on);
        if on {
            self.store().close_watches();
        }
    }

    /// Ends every open watch stream now (cleanly, as an API server restart or a load
    /// balancer would); clients re-watch from their last resourceVersion.
    pub fn drop_watches(&self) {
        self.store().close_watches();
    }

    /// Forgets the event history (like an etcd compaction): the next watch from any
    /// earlier resourceVersion gets an ERROR event with 410 Expired, and so do list continue
    /// tokens. Open watches stay open; combine with [`ApiServer::drop_watches`] to force
    /// clients through the 410 and a relist.
    pub fn expire_history(&self) {
        self.store().expire_history();
    }

    /// The objects and resourceVersion now, to [`ApiServer::restore`] later (an etcd
    /// snapshot).
    pub fn backup(&self) -> Backup {
        self.store().backup()
    }

    /// Loses state as an etcd restore does: the objects go back to `backup` (objects
    /// written since vanish, deleted ones return, no watch event says so), the
    /// resourceVersion goes back to the backup's, the history is gone, and open watches end.
    /// A watch from an older resourceVersion then gets 410 Expired; a watch or a
    /// `NotOlderThan` list from a newer one — what every client that saw later writes holds
    /// — gets 504 "Too large resource version". New writes continue from the backup's
    /// resourceVersion.
    pub fn restore(&self, backup: &Backup) {
        self.store().restore(backup, 0);
    }

    /// [`ApiServer::restore`] the way `etcdutl snapshot restore --bump-revision N
    /// --mark-compacted` does it: the resourceVersion moves `bump` past the backup's and
    /// everything before is compacted, so every client's watch gets 410 Expired and relists.
    pub fn restore_bumped(&self, backup: &Backup, bump: u64) {
        self.store().restore(backup, bump);
    }

    /// While on, watch streams send a malformed JSON line before every line (and one at
    /// once), and lists and gets answer 200 with a body that is not JSON.
    pub fn garbage(&self, on: bool) {
        self.inner.shared.faults.set_garbage(on);
        if on {
            self.store().send_garbage();
        }
    }

    /// Delays every response by `delay` (`None` to stop).
    pub fn slow(&self, delay: Option<Duration>) {
        self.inner.shared.faults.set_slow(delay);
    }

    /// The next `n` requests fail with `code` (and a `Status` with the matching reason).
    pub fn fail_next(&self, n: usize, code: u16) {
        self.fail_requests(FailRule::new(n, code));
    }

    /// The next requests matching `rule` fail with its code. Rules are consulted in the
    /// order added.
    pub fn fail_requests(&self, rule: FailRule) {
        self.inner.shared.faults.add_rule(rule);
    }

    /// Drops the pending [`FailRule`]s (from `fail_next` and `fail_requests`).
    pub fn clear_failures(&self) {
        self.inner.shared.faults.clear_rules();
    }

    /// Sends a BOOKMARK at the current resourceVersion on every watch that allows them.
    pub fn send_bookmarks(&self) {
        self.store().send_bookmarks();
    }

    // ---- observation --------------------------------------------------------------------

    /// The requests served so far (oldest first).
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.inner.shared.log.snapshot()
    }

    /// Empties the request log.
    pub fn clear_requests(&self) {
        self.inner.shared.log.clear();
    }

    /// Number of open watch streams.
    pub fn open_watches(&self) -> usize {
        self.store().open_watches()
    }

    /// Number of open watch streams of one resource (by its plural name: `pods`).
    pub fn open_watches_of(&self, plural: &str) -> usize {
        self.store().open_watches_of(plural)
    }

    /// Waits until at least `n` watch streams are open.
    pub async fn wait_for_watches(&self, n: usize, timeout: Duration) -> Result<()> {
        let mut count = self.store().watch_count();
        let waited = tokio::time::timeout(timeout, count.wait_for(|open| *open >= n)).await;
        match waited {
            Ok(Ok(_)) => Ok(()),
            _ => Err(Error::WatchTimeout { wanted: n, open: self.open_watches(), timeout }),
        }
    }
}

/// Accepts connections until shutdown; ticks bookmarks.
enum Accepted {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream),
}

async fn accept(listener: &Listener) -> std::io::Result<Accepted> {
    Ok(match listener {
        Listener::Unix(l) => Accepted::Unix(l.accept().await?.0),
        Listener::Tcp(l) => Accepted::Tcp(l.accept().await?.0),
    })
}

async fn connection(stream: impl AsyncRead + AsyncWrite + Unpin + Send + 'static, shared: Arc<Shared>) {
    let service = service_fn(move |req| handle(shared.clone(), req));
    if let Err(err) = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await {
        debug!(%err, "connection ended with an error");
    }
}

async fn serve(listener: Listener, shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    let mut ticker = shared.config.bookmark_interval.map(|period| {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
        ticker
    });
    loop {
        tokio::select! {
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
            }
            accepted = accept(&listener) => match accepted {
                Ok(Accepted::Unix(stream)) => {
                    connections.spawn(connection(stream, shared.clone()));
                }
                Ok(Accepted::Tcp(stream)) => {
                    connections.spawn(connection(stream, shared.clone()));
                }
                Err(err) => {
                    warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            () = tick(ticker.as_mut()) => shared.store.send_bookmarks(),
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    shared.store.close_watches();
    connections.shutdown().await;
    debug!("test API server stopped");
}

async fn tick(ticker: Option<&mut tokio::time::Interval>) {
    match ticker {
        Some(ticker) => {
            ticker.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// A client of the server at `endpoint`, on the runtime it is called on.
fn client_for(endpoint: &Endpoint) -> kube::Client {
    match endpoint {
        Endpoint::Unix(socket) => client_for_socket(socket.clone()),
        Endpoint::Tcp(addr) => crate::client::client_for_address(*addr),
    }
}
