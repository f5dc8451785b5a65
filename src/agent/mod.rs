//! The node agent core: everything one node does, fed by a [`crate::source`] of cluster
//! state. The daemon (`flock-agent`, informer source) and the simulated cluster (`flockctl
//! sim`, static source) both run it unchanged.
//!
//! It owns the node's endpoint registry (filled by flock-cni's ADD/DEL over the unix socket,
//! persisted so a restart keeps it), runs translate → render → apply into the node's
//! network namespace (one nft transaction per sync, skipped when unchanged), programs routes
//! to the other nodes' pod CIDRs, and acknowledges an ADD only once a sync that includes the
//! new endpoint has committed.
//!
//! Syncs are level-triggered and coalesced: any change (source, endpoints) bumps a
//! generation and wakes one loop, which waits a few milliseconds for more changes (not when
//! a CNI request waits: a pod's sync starts at once, and the periodic check waits behind
//! it), then renders the complete desired state from the latest inputs. A periodic resync reads the
//! kernel's table back and repairs drift. Nothing is programmed before the source is
//! complete (its initial list finished). Rules stay in the kernel when the agent stops.

mod backoff;
pub(crate) mod cni;
pub mod cniconf;
pub(crate) mod denials;
mod digest;
pub mod http;
pub mod metrics;
pub mod node_lock;
pub(crate) mod registry;
pub mod revocation;
pub mod routes;
pub mod run_policies;
mod sync_state;
mod translation;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::apply::kernel::NftCli;
use crate::apply::{Applier, Drift, Outcome};
use crate::dns_proxy as dns;
use crate::model::LocalEndpoint;
use crate::netns::Netns;
use crate::render::{self, Stats};
use crate::source::Source;
use crate::translate;
use sync_state::{Commit, LoopState, SweepOutcome, Wake};

pub use digest::RulesetDigest;

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// This node's name (pods with this `spec.nodeName` are local).
    pub node: String,
    /// Where the node's nftables and routes live.
    pub(crate) netns: Netns,
    /// flock-cni's socket.
    pub(crate) socket: PathBuf,
    /// DELs flock-cni queued while the agent was down.
    pub(crate) spool_dir: PathBuf,
    /// Where the endpoint registry is persisted (`None`: memory only).
    pub state_dir: Option<PathBuf>,
    /// How long an ADD waits for its Pod object to appear in the source.
    pub pod_wait: Duration,
    /// How long an ADD waits for the sync that includes it.
    pub(crate) ack_timeout: Duration,
    /// A sync starts once no change arrived for this long...
    pub(crate) coalesce: Duration,
    /// ...or this long after the first change, whichever comes first: a lone change is
    /// enforced within milliseconds, a burst of thousands makes a handful of syncs.
    pub(crate) max_coalesce: Duration,
    /// Period of the drift check and full resync.
    pub resync: Duration,
    /// Program routes to other nodes' pod CIDRs.
    pub routes: bool,
    /// How other nodes' pods are reached (host-gw, VXLAN, auto) and the overlay's settings.
    pub routing: routes::RoutingConfig,
    pub translate: translate::Options,
    /// The `nft` binary.
    pub nft: PathBuf,
    /// Write every transaction through `nft` instead of as nf_tables netlink batches: a way
    /// back should a kernel refuse what the batches encode (slower; docs/reference.md, `--nft-transactions`).
    pub nft_transactions: bool,
    /// Denied packets logged by the kernel (NFLOG) and read back as structured logs and
    /// metrics ([`denials`]); `None`: only dropped.
    pub deny_log: Option<render::log::DenyLog>,
    /// After each commit that changed the table, cut the established connections the policy
    /// in force denies by setting this bit of their ct mark ([`revocation`]); `None`: they
    /// live on until they end.
    pub revoke: Option<u32>,
    /// Egress by domain name: the DNS proxy and what it trusts (`None`: no proxy; domain
    /// rules then admit nothing).
    pub dns: Option<dns::DnsConfig>,
    /// Where to count what happens.
    pub metrics: Arc<metrics::Metrics>,
    /// Each change of this counter forces a full sync (the API came back after failing).
    pub(crate) full_resync: Option<watch::Receiver<u64>>,
    /// Called as each sync reaches a stage (tests inject faults here).
    #[doc(hidden)]
    pub sync_hook: Option<SyncHook>,
}

/// The stages of a sync, as [`SyncHook`] sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncStage {
    /// Translate and render, on a blocking thread.
    Render,
    /// The nft transaction, on a blocking thread.
    Apply,
}

/// A function called at each [`SyncStage`].
#[derive(Clone)]
pub struct SyncHook(pub Arc<dyn Fn(SyncStage) + Send + Sync>);

impl std::fmt::Debug for SyncHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SyncHook")
    }
}

impl AgentConfig {
    /// Defaults for `node` in `netns` with the socket at `socket`.
    pub fn new(node: &str, netns: Netns, socket: PathBuf, spool_dir: PathBuf) -> Self {
        Self {
            node: node.to_string(),
            netns,
            socket,
            spool_dir,
            state_dir: None,
            pod_wait: Duration::from_secs(10),
            ack_timeout: Duration::from_secs(25),
            coalesce: Duration::from_millis(5),
            max_coalesce: Duration::from_millis(250),
            resync: Duration::from_secs(30),
            routes: true,
            routing: routes::RoutingConfig::default(),
            translate: translate::Options::default(),
            nft: PathBuf::from("nft"),
            nft_transactions: false,
            deny_log: Some(render::log::DenyLog::DEFAULT),
            revoke: Some(render::REVOKED_MARK),
            dns: None,
            metrics: Arc::new(metrics::Metrics::new()),
            full_resync: None,
            sync_hook: None,
        }
    }
}

/// What the sync loop has done, published after every attempt.
#[derive(Debug, Clone, Default)]
pub struct SyncStatus {
    /// The input generation of the last attempt.
    pub attempted: u64,
    /// The input generation of the last committed sync.
    pub committed: u64,
    /// The source version included in the last committed sync.
    pub source_version: u64,
    /// Why the last attempt failed (`None` when it succeeded).
    pub error: Option<String>,
    /// Whether a sync has ever committed (the agent is ready).
    pub ready: bool,
    pub syncs_applied: u64,
    pub syncs_unchanged: u64,
    pub sync_failures: u64,
    /// Periodic checks that compared the kernel's table with a baseline.
    pub drift_checks: u64,
    pub drift_repairs: u64,
    pub route_failures: u64,
    pub last_commit: Option<Instant>,
    pub last_duration: Duration,
    pub stats: Stats,
    pub endpoints: usize,
    /// Problems of the policies that apply to this node's pods, from the last render.
    pub problems: Vec<translate::PolicyProblem>,
    /// Syncs failed in a row (0 once one commits).
    pub consecutive_failures: u32,
    /// While failing syncs back off: when the next attempt is due (a CNI request tries at
    /// once regardless).
    pub retry_at: Option<Instant>,
    /// Revocation sweeps completed, and the connections they cut.
    pub sweeps: u64,
    pub revoked: u64,
    /// The source version of the commit the last completed revocation sweep judged against.
    pub swept_source_version: u64,
    /// The NetworkPolicies the last commit enforces for this node's run pods, with their
    /// generations ([`run_policies`]).
    pub run_policies: Arc<run_policies::RunPolicyMap>,
    /// The input generation of the last commit that changed the table (or of the first
    /// commit): the ruleset whose digest is owed.
    pub last_applied: u64,
    /// The digest of a committed ruleset, computed beside the loop: it trails
    /// [`Self::last_applied`] for a moment after a commit.
    pub ruleset_digest: Option<RulesetDigest>,
}

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {socket}: {error}")]
    Socket { socket: PathBuf, error: std::io::Error },
    #[error(transparent)]
    Routes(#[from] routes::RouteError),
    #[error("cannot read the endpoint registry {path}: {error}")]
    Registry { path: PathBuf, error: registry::LoadError },
    #[error("cannot start the endpoint registry writer: {0}")]
    Persister(std::io::Error),
    #[error("nft ({program}) cannot be used on this node: {error}")]
    Nft { program: PathBuf, error: crate::apply::ApplyError },
    #[error("preparing the node agent panicked: {0}")]
    Panicked(String),
    #[error(transparent)]
    Dns(#[from] dns::DnsError),
}

/// A ruleset with one endpoint of every kind flock renders (isolated both ways, both
/// families): what the start-up probe of `nft` loads with `nft -c`.
fn probe_ruleset() -> String {
    let ep = LocalEndpoint {
        interface: flock_cni::host_interface_name("flock-probe", "eth0"),
        container_id: "flock-probe".into(),
        pod: crate::model::ObjectRef::new("flock-probe", "flock-probe"),
        pod_uid: None,
        addrs: vec![std::net::IpAddr::from([198, 18, 0, 1]), std::net::IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0, 1])],
    };
    let policy = translate::translate(&crate::model::Snapshot::new(), &[ep], &translate::Options::default());
    render::render(&policy).to_text()
}

struct Inner {
    endpoints: BTreeMap<String, LocalEndpoint>,
    /// Input generation: bumped by every change of the source or the endpoints.
    generation: u64,
    /// ADDs in flight (waiting for their Pod), per interface: how many, and the sequence
    /// number of the last DEL that arrived for the interface meanwhile. A DEL that overtakes
    /// a waiting ADD (the plugin gave up and withdrew it) must win: the ADD then registers
    /// nothing. Entries live only while an ADD for the interface is in flight.
    pending_adds: BTreeMap<String, PendingAdd>,
    del_seq: u64,
    /// CNI requests changing the endpoints that are in flight, and when the last one ended:
    /// while pods are being wired, revocation sweeps give way ([`CniRequest`]).
    cni_in_flight: usize,
    cni_last_end: Option<Instant>,
}

/// A CNI request that changes the endpoints (ADD, DEL, GC), from its arrival to its reply.
pub(crate) struct CniRequest<'a>(&'a Shared);

impl Drop for CniRequest<'_> {
    fn drop(&mut self) {
        let mut inner = self.0.lock();
        inner.cni_in_flight = inner.cni_in_flight.saturating_sub(1);
        inner.cni_last_end = Some(Instant::now());
        self.0.config.metrics.cni_in_flight(inner.cni_in_flight);
    }
}

#[derive(Default)]
struct PendingAdd {
    count: usize,
    last_del: u64,
}

pub(crate) struct Shared {
    config: AgentConfig,
    inner: Mutex<Inner>,
    wake: Notify,
    /// Set with a wake that must be served at once even while failing syncs back off (a CNI
    /// request: a pod is waiting to start).
    urgent: AtomicBool,
    status: watch::Sender<SyncStatus>,
    source: Source,
    persister: registry::Persister,
    /// Why a task of the agent ended unexpectedly (a panic, a closed socket): the process
    /// must end so the kubelet restarts it.
    crashed: watch::Sender<Option<String>>,
    /// What denies each local endpoint, as last translated (for reading denial records).
    deniers: watch::Sender<Arc<crate::nflog::denial::Endpoints>>,
    /// Each denial read, for whoever listens (the simulated cluster collects them).
    denied: tokio::sync::broadcast::Sender<crate::nflog::denial::Denial>,
    /// Committed rulesets waiting to be hashed ([`digest`]).
    digests: digest::Slot,
    /// The DNS proxy, when domain rules are enforced: it learns for the committed rules.
    dns: Option<dns::DnsService>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Records a change of the endpoints with `f` and wakes the sync loop; the generation
    /// that includes it.
    fn change_endpoints(&self, f: impl FnOnce(&mut BTreeMap<String, LocalEndpoint>) -> bool) -> u64 {
        let generation = {
            let mut inner = self.lock();
            if !f(&mut inner.endpoints) {
                return inner.generation;
            }
            inner.generation += 1;
            // Queued under the lock: the writer sees changes in order.
            self.persister.submit(inner.generation, &inner.endpoints);
            inner.generation
        };
        self.wake_urgently();
        generation
    }

    /// Wakes the sync loop for a CNI request: served at once, even while backing off.
    fn wake_urgently(&self) {
        self.urgent.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// A CNI request that changes the endpoints arrived; it counts as in flight until the
    /// returned guard is dropped.
    pub(crate) fn cni_request(&self) -> CniRequest<'_> {
        let mut inner = self.lock();
        inner.cni_in_flight += 1;
        self.config.metrics.cni_in_flight(inner.cni_in_flight);
        drop(inner);
        CniRequest(self)
    }

    /// Whether pods are being wired: a CNI request changing the endpoints is in flight, or
    /// one ended less than [`sync_state::CNI_QUIET`] ago.
    fn cni_busy(&self, now: Instant) -> bool {
        let inner = self.lock();
        inner.cni_in_flight > 0 || inner.cni_last_end.is_some_and(|t| now.saturating_duration_since(t) < sync_state::CNI_QUIET)
    }

    /// Records that a task ended unexpectedly (the first reason wins).
    fn crash(&self, reason: String) {
        tracing::error!(%reason, "the node agent cannot go on; exiting so that it is restarted (rules stay in the kernel)");
        self.crashed.send_if_modified(|c| {
            if c.is_some() {
                return false;
            }
            *c = Some(reason);
            true
        });
    }

    /// An ADD for `iface` starts waiting; the token to pass to [`Self::finish_add`].
    fn begin_add(&self, iface: &str) -> u64 {
        let mut inner = self.lock();
        let entry = inner.pending_adds.entry(iface.to_string()).or_default();
        entry.count += 1;
        entry.last_del
    }

    /// A DEL for `iface` arrived: an ADD in flight for it must not register afterwards.
    fn note_del(&self, iface: &str) {
        let mut inner = self.lock();
        inner.del_seq += 1;
        let seq = inner.del_seq;
        if let Some(p) = inner.pending_adds.get_mut(iface) {
            p.last_del = seq;
        }
    }

    /// The ADD begun with `token` is done waiting. With `register`, its endpoint is
    /// registered — unless a DEL overtook the ADD — under the same lock a DEL takes, so no
    /// DEL can slip between the check and the insert. The generation that includes the
    /// endpoint, or `None` when a DEL overtook it (or nothing was to be registered).
    fn finish_add(&self, token: u64, iface: &str, register: Option<LocalEndpoint>) -> Option<u64> {
        let generation = {
            let mut inner = self.lock();
            let overtaken = match inner.pending_adds.get_mut(iface) {
                Some(p) => {
                    let overtaken = p.last_del > token;
                    p.count = p.count.saturating_sub(1);
                    if p.count == 0 {
                        inner.pending_adds.remove(iface);
                    }
                    overtaken
                }
                None => false,
            };
            let ep = register.filter(|_| !overtaken)?;
            inner.endpoints.insert(ep.interface.clone(), ep);
            inner.generation += 1;
            self.persister.submit(inner.generation, &inner.endpoints);
            inner.generation
        };
        self.wake_urgently();
        Some(generation)
    }

    /// Waits until a sync including generation `generation` committed; the error of a failed one.
    async fn wait_committed(&self, generation: u64, timeout: Duration) -> Result<(), WaitError> {
        let mut rx = self.status.subscribe();
        let wait = rx.wait_for(|s| s.committed >= generation || (s.attempted >= generation && s.error.is_some()));
        match tokio::time::timeout(timeout, wait).await {
            Ok(Ok(s)) if s.committed >= generation => Ok(()),
            Ok(Ok(s)) => Err(WaitError::SyncFailed(s.error.clone().unwrap_or_default())),
            Ok(Err(_)) => Err(WaitError::ShuttingDown),
            Err(_) => Err(WaitError::NotCommitted { timeout }),
        }
    }
}

/// Why waiting for the agent's work ended without it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WaitError {
    #[cfg(feature = "tool")]
    #[error("the agent stopped")]
    Stopped,
    #[error("the agent is shutting down")]
    ShuttingDown,
    #[error("the sync failed: {0}")]
    SyncFailed(String),
    #[error("no sync committed within {timeout:?}")]
    NotCommitted { timeout: Duration },
    #[cfg(feature = "tool")]
    #[error("node {node}: source version {version} not committed (and swept) within {timeout:?} (last error: {last_error})")]
    SourceNotCommitted { node: String, version: u64, timeout: Duration, last_error: String },
    #[error("cannot persist the endpoint registry in {dir}: {error}")]
    Persist { dir: String, error: String },
    #[error("the endpoint registry was not written within {timeout:?}")]
    NotPersisted { timeout: Duration },
    #[error("the registry writer stopped")]
    WriterStopped,
}

/// A running node agent.
pub struct Agent {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    stop: watch::Sender<bool>,
}

impl Agent {
    /// Loads the persisted registry, drains the DEL spool, listens on the socket and starts
    /// the sync loop. Nothing is programmed until `source` is complete.
    pub async fn start(config: AgentConfig, source: Source) -> Result<Self, StartError> {
        // Files and a process: on a blocking thread, not on the runtime's.
        let prep = config.clone();
        let prepared = tokio::task::spawn_blocking(move || -> Result<_, StartError> {
            let mut endpoints = match &prep.state_dir {
                Some(dir) => registry::load(dir).map_err(|error| StartError::Registry { path: dir.clone(), error })?,
                None => BTreeMap::new(),
            };
            let version = NftCli::new(prep.netns.clone())
                .with_program(prep.nft.clone())
                .probe(&probe_ruleset())
                .map_err(|error| StartError::Nft { program: prep.nft.clone(), error })?;
            drain_spool(&prep, &mut endpoints);
            Ok((endpoints, version))
        });
        let (endpoints, version) = prepared.await.map_err(|e| StartError::Panicked(e.to_string()))??;
        tracing::info!(nft = %version, "nft works here");
        // Without the overlay, no device of flock's may stay up (and unguarded) from an
        // earlier configuration; before any sync, so never with a table without the guard.
        if !config.routes || config.routing.routing == routes::Routing::HostGw {
            match routes::remove_overlay(&config.netns).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(devices = n, "removed the VXLAN devices of an earlier configuration"),
                Err(e) => tracing::warn!(error = %e, "cannot look for VXLAN devices of an earlier configuration"),
            }
        }
        let router = if config.routes { Some(routes::Router::start(config.netns.clone(), config.routing.clone())?) } else { None };
        // Listening before the first sync renders a redirect to it.
        let dns = match &config.dns {
            Some(d) => {
                let remembered = config.state_dir.as_ref().map(|d| d.join(dns::RESOLVERS_FILE));
                // Off the runtime: it waits for the proxy's thread (and the socket keeper).
                let (d2, ns, metrics) = (d.clone(), config.netns.clone(), config.metrics.clone());
                let service =
                    tokio::task::spawn_blocking(move || dns::DnsService::start(&d2, &ns, metrics.dns_stats(), metrics, remembered))
                        .await
                        .map_err(|e| StartError::Panicked(e.to_string()))??;
                tracing::info!(port = d.port, resolvers = ?d.resolvers, "DNS proxy listening");
                Some(service)
            }
            None => None,
        };
        let listener = cni::bind(&config.socket).map_err(|error| StartError::Socket { socket: config.socket.clone(), error })?;
        let persister = registry::Persister::start(config.state_dir.clone()).map_err(StartError::Persister)?;
        // The spool's DELs are in the registry only once it is written again.
        persister.submit(1, &endpoints);
        let shared = Arc::new(Shared {
            config: config.clone(),
            inner: Mutex::new(Inner {
                endpoints: endpoints.clone(),
                generation: 1,
                pending_adds: BTreeMap::new(),
                del_seq: 0,
                cni_in_flight: 0,
                cni_last_end: None,
            }),
            wake: Notify::new(),
            urgent: AtomicBool::new(false),
            status: watch::channel(SyncStatus::default()).0,
            source,
            persister,
            crashed: watch::channel(None).0,
            deniers: watch::channel(Arc::default()).0,
            denied: tokio::sync::broadcast::channel(1024).0,
            digests: digest::Slot::default(),
            dns,
        });
        let (stop, stop_rx) = watch::channel(false);
        let mut tasks = vec![
            supervise("sync loop", shared.clone(), stop_rx.clone(), sync_loop(shared.clone(), router, stop_rx.clone())),
            supervise("source watch", shared.clone(), stop_rx.clone(), watch_source(shared.clone(), stop_rx.clone())),
            supervise("ruleset hasher", shared.clone(), stop_rx.clone(), digest::run(shared.clone(), stop_rx.clone())),
        ];
        if let Some(log) = config.deny_log {
            tasks.push(supervise(
                "denial reader",
                shared.clone(),
                stop_rx.clone(),
                denials::read(shared.clone(), log.group, stop_rx.clone()),
            ));
        }
        tasks.push(supervise("CNI socket server", shared.clone(), stop_rx.clone(), cni::serve(shared.clone(), listener, stop_rx)));
        shared.wake.notify_one();
        tracing::info!(node = %config.node, netns = %config.netns.describe(), socket = %config.socket.display(), endpoints = endpoints.len(), "node agent started");
        Ok(Self { shared, tasks, stop })
    }

    /// The sync status, updated after every attempt.
    pub fn status(&self) -> watch::Receiver<SyncStatus> {
        self.shared.status.subscribe()
    }

    /// The denials read from the kernel from now on (each one also logged and counted).
    #[cfg(feature = "tool")]
    pub(crate) fn denials(&self) -> tokio::sync::broadcast::Receiver<crate::nflog::denial::Denial> {
        self.shared.denied.subscribe()
    }

    /// The registered endpoints.
    pub fn endpoints(&self) -> Vec<LocalEndpoint> {
        self.shared.lock().endpoints.values().cloned().collect()
    }

    /// Waits until a committed sync includes source version `version` and, with revocation,
    /// a sweep has judged the node's connections against it (before that, a connection the
    /// change denies may still pass, or one it admits again still be stopped).
    #[cfg(feature = "tool")]
    pub(crate) async fn wait_source(&self, version: u64, timeout: Duration) -> Result<(), WaitError> {
        let mut rx = self.shared.status.subscribe();
        let revoke = self.shared.config.revoke.is_some();
        let done = |s: &SyncStatus| s.source_version >= version && (!revoke || s.swept_source_version >= version);
        match tokio::time::timeout(timeout, rx.wait_for(done)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(WaitError::Stopped),
            Err(_) => {
                let s = self.shared.status.borrow().clone();
                Err(WaitError::SourceNotCommitted {
                    node: self.shared.config.node.clone(),
                    version,
                    timeout,
                    last_error: s.error.unwrap_or_default(),
                })
            }
        }
    }

    /// Resolves when a task of the agent ended unexpectedly (a panic in a sync, the socket
    /// server failing), with the reason. The agent cannot go on: the daemon exits non-zero
    /// so the kubelet restarts it; the rules stay in the kernel meanwhile.
    pub async fn crashed(&self) -> String {
        let mut rx = self.shared.crashed.subscribe();
        let reason = rx.wait_for(Option::is_some).await.map(|r| r.clone().unwrap_or_default());
        match reason {
            Ok(r) => r,
            // The sender lives in `shared`, which outlives this borrow.
            Err(_) => std::future::pending().await,
        }
    }

    /// Stops serving and syncing. Rules and routes stay in the kernel; the socket is
    /// removed.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        self.shared.wake.notify_one();
        for t in self.tasks {
            let _ = t.await;
        }
        let shared = self.shared.clone();
        if tokio::task::spawn_blocking(move || shared.persister.stop()).await.is_err() {
            tracing::error!("the registry writer did not stop cleanly");
        }
        let _ = std::fs::remove_file(&self.shared.config.socket);
        tracing::info!(node = %self.shared.config.node, "node agent stopped (rules stay in place)");
    }
}

/// Runs one of the agent's tasks. A task that panics, or returns while the agent is not
/// stopping, crashes the agent ([`Agent::crashed`]).
fn supervise(
    name: &'static str,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
    task: impl std::future::Future<Output = ()> + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let outcome = std::panic::AssertUnwindSafe(task).catch_unwind().await;
        if *stop.borrow() {
            return;
        }
        match outcome {
            Err(panic) => {
                let why = crate::panic_message(panic.as_ref()).unwrap_or_default();
                shared.crash(format!("the {name} panicked: {why}"));
            }
            Ok(()) => shared.crash(format!("the {name} ended")),
        }
    })
}

/// Applies the DELs flock-cni spooled while the agent was down, then removes the files.
fn drain_spool(config: &AgentConfig, endpoints: &mut BTreeMap<String, LocalEndpoint>) {
    let spooled = match flock_cni::protocol::read_spool(&config.spool_dir) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, dir = %config.spool_dir.display(), "cannot read the DEL spool");
            return;
        }
    };
    for (path, del) in spooled {
        match del {
            Ok(d) => {
                let removed = endpoints.remove(&d.host_interface).is_some();
                tracing::info!(host_interface = %d.host_interface, container = %d.container_id, removed, "spooled DEL applied");
            }
            Err(e) => tracing::warn!(error = %e, file = %path.display(), "unreadable spooled DEL dropped"),
        }
        if let Err(e) = std::fs::remove_file(&path) {
            tracing::warn!(error = %e, file = %path.display(), "cannot remove a spooled DEL");
        }
    }
}

async fn watch_source(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut rx = shared.source.versions();
    loop {
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    // The source is gone (its owner dropped it): no more changes, nothing wrong.
                    let _ = stop.changed().await;
                    return;
                }
                shared.lock().generation += 1;
                shared.wake.notify_one();
            }
            _ = stop.changed() => return,
        }
    }
}

/// The sync loop: waits for an event, does the work it calls for, and keeps its state and
/// decisions in a [`LoopState`] (`sync_state`, unit-tested event by event).
async fn sync_loop(shared: Arc<Shared>, router: Option<routes::Router>, mut stop: watch::Receiver<bool>) {
    let cfg = shared.config.clone();
    // The drift baseline (a full JSON listing: ~0.1 s for a 150k-pod cluster's table) is
    // read once changes have been quiet for a moment, never on a pod's path.
    let backend = NftCli::new(cfg.netns.clone()).with_program(cfg.nft.clone()).with_netlink(!cfg.nft_transactions);
    let mut applier = Some(Applier::new(backend).defer_baseline());
    let mut baseline_job: Option<tokio::task::JoinHandle<BaselineRead>> = None;
    // Kept from one sync to the next: each translates only what changed since the last.
    let render_options = render::RenderOptions {
        log: cfg.deny_log,
        revoked: cfg.revoke,
        dns: cfg.dns.as_ref().map(dns::DnsConfig::steer),
        ..render::RenderOptions::DEFAULT
    };
    let mut translate = cfg.translate.clone();
    // Under an overlay, the table takes VXLAN from nodes only.
    if cfg.routes && cfg.routing.routing != routes::Routing::HostGw {
        translate.overlay_port = Some(cfg.routing.vxlan.port);
        translate.overlay_node = Some(cfg.node.clone());
    }
    let mut translation = Some(translation::Translation::new(translate, render_options));
    let mut run_policies = Some(run_policies::RunPolicies::new(&cfg.node));
    let mut tick = tokio::time::interval(cfg.resync);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut full_resync = cfg.full_resync.clone();
    let mut state = LoopState::new(cfg.revoke.is_some(), backoff::Backoff::from_entropy());
    let mut sweep_job: Option<tokio::task::JoinHandle<SweepRun>> = None;
    // Counts commits a sweep must reflect: a sweep that sees it move on is stale.
    let commits = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let at = |t: Option<Instant>| t.map(tokio::time::Instant::from_std);
    // Node routes are planned only where this agent programs them.
    let plans_routes = router.is_some();
    // A sync begun (translating) while the last one's transaction ran.
    let mut next: Option<Begun> = None;
    loop {
        if next.is_none() {
            let wake = tokio::select! {
                _ = shared.wake.notified() => Wake::Changed,
                _ = tick.tick() => Wake::Tick,
                Ok(()) = async { match full_resync.as_mut() { Some(r) => r.changed().await, None => std::future::pending().await } } => Wake::FullResync,
                () = sleep_until(at(state.retry_at())) => Wake::RetryDue,
                () = sleep_until(at(state.baseline_at())) => {
                    // Listing a large table takes seconds (3 s for 225k set elements): it runs
                    // beside the loop so that a CNI ADD meanwhile is not kept waiting.
                    if state.baseline_due()
                        && let Some((commit, mut backend)) = applier.as_ref().and_then(Applier::baseline_reader)
                    {
                        baseline_job = Some(tokio::task::spawn_blocking(move || (commit, crate::apply::Backend::read_state(&mut backend))));
                        state.baseline_started();
                    }
                    continue;
                }
                done = async { match baseline_job.as_mut() { Some(job) => job.await, None => std::future::pending().await } } => {
                    baseline_job = None;
                    match done {
                        Ok((commit, Ok(table))) => {
                            let accepted = applier.as_mut().is_some_and(|ap| ap.accept_baseline(commit, table));
                            let still_needed = applier.as_ref().is_some_and(Applier::needs_baseline);
                            state.baseline_read(accepted, still_needed, Instant::now());
                        }
                        Ok((_, Err(e))) => {
                            tracing::warn!(error = %e, "cannot read the table for the drift baseline; the next drift check reads it");
                            state.baseline_read(false, false, Instant::now());
                        }
                        Err(e) => {
                            shared.crash(format!("reading the drift baseline panicked: {e}"));
                            return;
                        }
                    }
                    continue;
                }
                done = async { match sweep_job.as_mut() { Some(job) => job.await, None => std::future::pending().await } } => {
                    sweep_job = None;
                    let Some(outcome) = sweep_done(&shared, done, (state.committed_version(), commits.load(Ordering::SeqCst))) else { return };
                    let mut hold = state.sweep_finished(outcome, *stop.borrow(), Instant::now());
                    while let Some(version) = hold {
                        let Some(job) = start_sweep(&cfg, translation.as_ref(), &commits, version) else {
                            state.sweep_not_started(Instant::now());
                            break;
                        };
                        let Some(o) = sweep_done(&shared, job.await, (state.committed_version(), commits.load(Ordering::SeqCst))) else { return };
                        hold = state.sweep_finished(o, *stop.borrow(), Instant::now());
                    }
                    continue;
                }
                () = sleep_until(at(state.sweep_at())) => {
                    // Pods being wired go first: the sweep waits for a burst of CNI requests
                    // to pause, a bounded while.
                    let now = Instant::now();
                    if shared.cni_busy(now) && state.sweep_gives_way(now) {
                        continue;
                    }
                    if let Some(version) = state.sweep_due(*stop.borrow()) {
                        sweep_job = start_sweep(&cfg, translation.as_ref(), &commits, version);
                        state.sweep_started(sweep_job.is_some(), Instant::now());
                    }
                    continue;
                }
                _ = stop.changed() => return,
            };
            state.wake(wake);
            if *stop.borrow() {
                return;
            }
            let mut urgent = shared.urgent.swap(false, Ordering::SeqCst);
            if !state.may_sync(urgent) {
                continue;
            }
            if urgent {
                // A pod waits for this sync: no gathering window. Requests arriving together
                // are taken in by this sync or the next, which begins translating while this
                // one's transaction runs.
                tokio::task::yield_now().await;
            } else {
                // Changes are gathered for a moment (longer while more arrive); a CNI request
                // arriving meanwhile ends the window: its pod does not wait it out.
                let first = Instant::now();
                let mut seen = shared.lock().generation;
                loop {
                    gather(&shared.wake, &shared.urgent, cfg.coalesce).await;
                    urgent = shared.urgent.swap(false, Ordering::SeqCst);
                    let now = shared.lock().generation;
                    if urgent || now == seen || first.elapsed() >= cfg.max_coalesce {
                        break;
                    }
                    seen = now;
                }
            }
            if !shared.source.is_complete() {
                tracing::debug!("source not complete yet: nothing programmed");
                continue;
            }
            next = begin_sync(&shared, &mut state, &mut translation, &mut run_policies, urgent, plans_routes, 0);
        }
        let Some(begun) = next.take() else { return };
        if *stop.borrow() {
            return;
        }
        // The sync's span is entered only around code that does not await (a guard held
        // across an await would lend it to whatever else runs on the thread meanwhile).
        let Begun { attempt, generation, source_version, changes, started, span, job: render_job } = begun;
        let (tr, rp, translated, runs, wanted_routes, counts) = match render_job.await {
            Ok(r) => r,
            Err(e) => {
                publish_failure(&shared, generation, "panic", format!("render panicked: {e}"));
                shared.crash(format!("translate/render panicked: {e}"));
                return;
            }
        };
        translation = Some(tr);
        run_policies = Some(rp);
        // What the DNS learner is given once this ruleset is committed (the next sync may be
        // translating by then).
        let committed_policy = translation.as_ref().and_then(translation::Translation::shared_policy);
        shared.deniers.send_replace(Arc::new(translated.deniers));
        cfg.metrics.translated(translated.mode.as_str());
        if translated.checked {
            cfg.metrics.translated("check");
        }
        if translated.disagreed.is_some() {
            cfg.metrics.translation_disagreed();
        }
        let (ruleset, problems) = (translated.ruleset, translated.problems);
        span.in_scope(|| {
            // Each problem is logged when it appears, not on every sync.
            for p in state.new_problems(&problems) {
                tracing::warn!(problem = %p, "policy cannot be enforced as written");
            }
            for p in state.new_overlay_problems(&translated.overlay_problems) {
                tracing::warn!(problem = %p, "overlay: an address of a node is not trusted");
            }
        });
        let mode = translated.mode.as_str();
        cfg.metrics.problems(problems.len());
        cfg.metrics.coalesced(state.coalesced(generation));
        let Some(mut ap) = applier.take() else { return };
        let (unverified_for, resync) = (state.unverified_for(Instant::now()), cfg.resync);
        let stats = ruleset.stats();
        let rendered = started.elapsed();
        let hook = cfg.sync_hook.clone();
        let apply_span = span.clone();
        let job = tokio::task::spawn_blocking(move || {
            let _enter = apply_span.enter();
            if let Some(h) = &hook {
                (h.0)(SyncStage::Apply);
            }
            let mut repaired = false;
            if attempt.forced {
                ap.invalidate();
            }
            // Changes never went quiet long enough to read a baseline for a whole resync
            // period: what the kernel holds cannot be vouched for, so the drift check rewrites
            // the table and reads it back. A baseline merely still to come (the last change
            // was moments ago) defers the check to the next tick instead.
            let unverified = attempt.periodic && ap.needs_baseline() && unverified_for >= resync;
            let mut checked = false;
            if unverified {
                ap.invalidate();
            } else if attempt.periodic && !ap.needs_baseline() {
                checked = true;
                match ap.check_drift() {
                    Ok(Drift::InSync | Drift::NotApplied) => {}
                    Ok(Drift::Unverified) => ap.invalidate(),
                    Ok(d) => {
                        tracing::warn!(drift = ?d, "table inet flock changed behind flock's back; repairing");
                        ap.invalidate();
                        repaired = true;
                    }
                    // Fail closed: a table flock cannot vouch for is rewritten.
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the table back for the drift check; rewriting it");
                        ap.invalidate();
                    }
                }
            }
            let r = ap.apply(&ruleset);
            if unverified
                && r.is_ok()
                && let Err(e) = ap.record_baseline()
            {
                tracing::warn!(error = %e, "cannot read the table for the drift baseline");
            }
            (ap, r, repaired, checked, ruleset)
        });
        // While the transaction runs, a CNI request that arrives is translated beside it: the
        // pod then waits for this commit and its own transaction, not for a translation too.
        let mut job = job;
        let mut woken = false;
        let applied = loop {
            tokio::select! {
                r = &mut job => break r,
                _ = shared.wake.notified(), if next.is_none() && !woken => {
                    // Only for a request this sync does not include (its endpoint came later).
                    if shared.source.is_complete()
                        && !*stop.borrow()
                        && shared.lock().generation > generation
                        && shared.urgent.swap(false, Ordering::SeqCst)
                    {
                        match begin_sync(&shared, &mut state, &mut translation, &mut run_policies, true, plans_routes, source_version) {
                            Some(b) => next = Some(b),
                            None => return,
                        }
                    } else {
                        woken = true;
                    }
                }
            }
        };
        // A wake not acted on here is the loop's next.
        if woken {
            shared.wake.notify_one();
        }
        let (ap, result, repaired, checked, ruleset) = match applied {
            Ok(x) => x,
            Err(e) => {
                publish_failure(&shared, generation, "panic", format!("apply panicked: {e}"));
                shared.crash(format!("the nft apply panicked: {e}"));
                return;
            }
        };
        let needs_baseline = ap.needs_baseline();
        state.applied(needs_baseline, Instant::now());
        applier = Some(ap);
        // Only over a committed table: VXLAN devices never come up before the table's guard.
        if let (Some(r), Some(wanted)) = (router.as_ref().filter(|_| result.is_ok()), wanted_routes) {
            let synced = r.sync(wanted).instrument(span.clone()).await;
            let _enter = span.enter();
            match synced {
                Ok(c) if c.added + c.removed > 0 => tracing::info!(added = c.added, removed = c.removed, "node routes updated"),
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(error = %e, "cannot program node routes");
                    shared.status.send_modify(|s| s.route_failures += 1);
                }
            }
        }
        let elapsed = started.elapsed();
        // Nothing below awaits.
        let _enter = span.enter();
        match result {
            Ok(outcome) => {
                tracing::debug!(?outcome, mode, ?elapsed, ?rendered, rules = stats.rules, elements = stats.elements, "sync committed");
                let applied = matches!(outcome, Outcome::Applied { .. });
                let after = state.committed(Commit { attempt, applied, needs_baseline, source_version }, Instant::now());
                let m = &cfg.metrics;
                m.sync(applied, elapsed.as_secs_f64());
                m.ruleset(stats.rules, stats.elements);
                m.tracked(counts.0, counts.1, counts.2);
                m.cluster_policies_tracked(counts.3);
                if repaired {
                    m.drift_repaired();
                }
                let now = Instant::now();
                for t in &changes {
                    m.enforced("source", now.duration_since(*t).as_secs_f64());
                }
                // The learner feeds the sets of what is committed now (a set it names exists).
                if let (Some(d), Some(np)) = (&shared.dns, committed_policy) {
                    d.set_rules(&np);
                }
                // Hashed beside the loop; only a ruleset the table changed to is new.
                if after.hash {
                    shared.digests.submit(digest::Job { generation, ruleset, endpoints: counts.2 });
                }
                shared.status.send_modify(|s| {
                    s.attempted = generation;
                    s.committed = generation;
                    s.source_version = source_version;
                    s.error = None;
                    s.ready = true;
                    match outcome {
                        Outcome::Applied { .. } => s.syncs_applied += 1,
                        Outcome::Unchanged => s.syncs_unchanged += 1,
                    }
                    if repaired {
                        s.drift_repairs += 1;
                    }
                    if checked {
                        s.drift_checks += 1;
                    }
                    s.last_commit = Some(Instant::now());
                    s.last_duration = elapsed;
                    s.stats = stats;
                    // What this sync committed, not the live registry: a DEL or GC that
                    // arrived meanwhile is not in the kernel yet.
                    s.endpoints = counts.2;
                    s.problems = problems.clone();
                    s.consecutive_failures = 0;
                    s.retry_at = None;
                    s.run_policies = runs;
                    if after.hash {
                        s.last_applied = generation;
                    }
                    // Nothing changed the table since the last sweep: it holds.
                    if after.swept_holds {
                        s.swept_source_version = s.swept_source_version.max(source_version);
                    }
                });
                // Sweeps run beside the loop (a large conntrack table takes a while to
                // judge), with the translation just committed, shared, not copied.
                if after.count_for_sweeps {
                    commits.fetch_add(1, Ordering::SeqCst);
                }
            }
            Err(e) => {
                let delay = state.failed(attempt, Instant::now());
                tracing::error!(error = %e, failures = state.failures(), retry_in = ?delay, "sync failed; the previous ruleset stays in force");
                publish_failure(&shared, generation, e.metric_label(), e.to_string());
                let failures = state.failures();
                shared.status.send_modify(|s| {
                    s.consecutive_failures = failures;
                    s.retry_at = Some(Instant::now() + delay);
                });
            }
        }
    }
}

/// A sync's translation and render, running or done.
type RenderedSync = (
    translation::Translation,
    run_policies::RunPolicies,
    translation::Translated,
    Arc<run_policies::RunPolicyMap>,
    Option<routes::Peers>,
    (usize, usize, usize, usize),
);

/// A sync begun: what it was asked to do and of which state, and its render job.
struct Begun {
    attempt: sync_state::Attempt,
    /// The endpoint generation it includes.
    generation: u64,
    /// The sync's span: its translation, transaction and outcome log in it.
    span: tracing::Span,
    source_version: u64,
    /// When the source changes it is the first sync to include were made.
    changes: Vec<Instant>,
    started: Instant,
    job: JoinHandle<RenderedSync>,
}

/// Starts a sync of the current snapshot and endpoints: translates and renders them on a
/// blocking thread. `counted`: a source version up to which a sync begun earlier reports
/// the changes' latencies. `None` when the translation state is gone (a panic ended a sync).
fn begin_sync(
    shared: &Arc<Shared>,
    state: &mut LoopState,
    translation: &mut Option<translation::Translation>,
    run_policies: &mut Option<run_policies::RunPolicies>,
    urgent: bool,
    plans_routes: bool,
    counted: u64,
) -> Option<Begun> {
    let (Some(mut tr), Some(mut rp)) = (translation.take(), run_policies.take()) else { return None };
    let cfg = &shared.config;
    let attempt = state.start(urgent);
    if state.owes_periodic() {
        // The periodic sync deferred for this request runs right after it.
        shared.wake.notify_one();
    }
    let (endpoints, generation) = {
        let inner = shared.lock();
        (inner.endpoints.values().cloned().collect::<Vec<_>>(), inner.generation)
    };
    let started = Instant::now();
    // The snapshot is taken and the lock released at once: the watcher keeps writing while
    // this sync translates (see `crate::source`).
    let (source_version, snapshot) = shared.source.snapshot();
    let changes: Vec<Instant> = {
        let observed = state.last_observed().max(counted);
        let source = shared.source.read();
        source.changed_at.iter().filter(|(v, _)| *v > observed && *v <= source_version).map(|(_, t)| *t).collect()
    };
    let journal = tr.version().and_then(|v| shared.source.changes(v, source_version));
    let node = cfg.node.clone();
    let hook = cfg.sync_hook.clone();
    let periodic = attempt.periodic;
    let span = tracing::info_span!("sync", node = %cfg.node, generation, endpoints = endpoints.len(), periodic);
    let render_span = span.clone();
    let job = tokio::task::spawn_blocking(move || {
        let _enter = render_span.enter();
        if let Some(h) = &hook {
            (h.0)(SyncStage::Render);
        }
        // The journal holds the changes since the translation's version, which the run
        // policies are kept in step with (else they look at every pod).
        let rp_changes = journal.as_deref().filter(|_| rp.version() == tr.version());
        // The periodic tick also translates in full and compares (see `translation`).
        let out = tr.sync(&snapshot, source_version, &endpoints, journal.as_deref(), periodic);
        let runs = rp.sync(&snapshot, source_version, rp_changes, periodic);
        let counts = (snapshot.pod_count(), snapshot.policy_count(), endpoints.len(), snapshot.cluster_policies().count());
        (tr, rp, out, runs, plans_routes.then(|| routes::peers(&snapshot, &node)), counts)
    });
    Some(Begun { attempt, generation, span, source_version, changes, started, job })
}

/// Waits out one gathering window of `d`, unless a CNI request wakes the loop meanwhile
/// (`urgent` set): its pod does not wait for other changes to be gathered. Other wakes are
/// taken in by the sync that follows the window.
async fn gather(wake: &Notify, urgent: &AtomicBool, d: Duration) {
    let window = tokio::time::sleep(d);
    tokio::pin!(window);
    loop {
        tokio::select! {
            () = &mut window => return,
            _ = wake.notified() => if urgent.load(Ordering::SeqCst) { return },
        }
    }
}

/// Sleeps until `t`; forever when there is none.
async fn sleep_until(t: Option<tokio::time::Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Reports a finished sweep; `None`: it panicked (the agent is crashing). `now`: the
/// source version the table holds and the commit count, as the loop knows them.
fn sweep_done(shared: &Shared, done: Result<SweepRun, tokio::task::JoinError>, now: (Option<u64>, u64)) -> Option<SweepOutcome> {
    let metrics = &shared.config.metrics;
    match done {
        Ok((Ok(swept), took, of)) => {
            revocation::report(metrics, &swept, took.as_secs_f64());
            // No change of the table since it started: it holds for what is committed now
            // (commits that changed nothing included).
            let holds_for = match now {
                (Some(version), commits) if commits == of.commits => version,
                _ => of.version,
            };
            shared.status.send_modify(|s| {
                s.sweeps += u64::from(!swept.stale);
                s.revoked += swept.revoked.len() as u64;
                if !swept.stale {
                    s.swept_source_version = s.swept_source_version.max(holds_for);
                }
            });
            Some(SweepOutcome { owed: !swept.refused.is_empty() || swept.unrestored > 0 || swept.stale, stale: swept.stale })
        }
        Ok((Err(e), _, _)) => {
            metrics.revocation_sweep(None);
            tracing::error!(error = %e, "cannot cut the established connections the policy denies; the next sync tries again");
            Some(SweepOutcome { owed: true, stale: false })
        }
        Err(e) => {
            shared.crash(format!("the revocation sweep panicked: {e}"));
            None
        }
    }
}

/// A revocation sweep's outcome, its duration, and what it judged against.
type SweepRun = (Result<revocation::Swept, revocation::SweepError>, Duration, SweepOf);

/// What a sweep judged against: the source version committed when it started, and the
/// commit count then (see `sync_loop`).
#[derive(Debug, Clone, Copy)]
struct SweepOf {
    version: u64,
    commits: u64,
}

/// Starts a revocation sweep with the translation last committed, if revocation is on.
fn start_sweep(
    cfg: &AgentConfig,
    translation: Option<&translation::Translation>,
    commits: &Arc<std::sync::atomic::AtomicU64>,
    version: u64,
) -> Option<tokio::task::JoinHandle<SweepRun>> {
    let bit = cfg.revoke?;
    let np = translation?.shared_policy()?;
    let (netns, commits) = (cfg.netns.clone(), Arc::clone(commits));
    let mine = commits.load(Ordering::SeqCst);
    Some(tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let current = || commits.load(Ordering::SeqCst) == mine;
        (revocation::sweep(&netns, &np, bit, &current), started.elapsed(), SweepOf { version, commits: mine })
    }))
}

/// A drift baseline read beside the sync loop: the commit it followed and what it read.
type BaselineRead = (u64, Result<Option<crate::apply::state::TableState>, crate::apply::ApplyError>);

fn publish_failure(shared: &Shared, generation: u64, reason: &str, error: String) {
    shared.config.metrics.sync_failed(reason);
    shared.status.send_modify(|s| {
        s.attempted = generation;
        s.error = Some(error);
        s.sync_failures += 1;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CNI request ends a gathering window; other wakes do not.
    #[tokio::test]
    async fn a_cni_request_ends_a_gathering_window() {
        let (wake, urgent) = (Notify::new(), AtomicBool::new(false));
        let window = Duration::from_secs(60);
        let mut gathering = Box::pin(gather(&wake, &urgent, window));
        // A change of the source wakes the loop: the window goes on.
        wake.notify_one();
        assert!(tokio::time::timeout(Duration::from_millis(200), &mut gathering).await.is_err(), "a plain wake ended the window");
        // An ADD (or DEL) wakes it urgently: the window ends at once, not after a minute.
        urgent.store(true, Ordering::SeqCst);
        wake.notify_one();
        assert!(tokio::time::timeout(Duration::from_secs(10), gathering).await.is_ok(), "a CNI request waited out the window");
    }
}
