//! The Kubernetes informer source: a list-and-watch loop per resource (Pods, Namespaces,
//! NetworkPolicies, Nodes; all namespaces; and ClusterNetworkPolicies while their CRD is
//! installed, `crd`), written into the snapshot as events arrive, and the API health the
//! agent reports.
//!
//! - Only the snapshot's fields are kept: each object is converted on arrival
//!   (`model::convert`) and the API object dropped, so memory per pod stays small.
//! - A (re)list replaces everything the snapshot holds of its resource at once, when the
//!   last page is in: objects the list does not contain are gone. Until then the snapshot —
//!   and nft — keep the last-known state; a partial list is never applied. The source becomes
//!   complete, and the agent may program nft, only once every resource has been listed (an
//!   absent ClusterNetworkPolicy CRD counts as an empty list).
//! - Each resource's loop (`reflect`) relists when its resourceVersion is unusable: 410
//!   Expired, 504 "Too large resource version" (the API server lost state, e.g. an etcd
//!   restore: objects may have vanished without a DELETE), or a watch that keeps failing.
//! - Pods are keyed by uid; a Delete removes the pod at once, and terminal pods stop being
//!   peers in the translator.
//! - Health (`health`) is judged from the watches themselves — events, bookmarks, lists,
//!   watches that stay open are proof; failed requests and ERROR events are failures — and
//!   `/version` is probed only when every watch has been quiet for 30 s (jittered), so a
//!   healthy cluster gets no probes. Connected → Degraded (`degraded_after`) → Disconnected
//!   (`disconnected_after`) while any watch or the probe fails; last-known rules stay in
//!   force throughout, and recovery bumps a resync counter the agent turns into a full sync.
//! - The agent runs all of it on a thread of its own ([`spawn_thread`]: a single-threaded
//!   runtime and its own API client): decoding a list of 150,000 pods, and the heap it
//!   leaves to tidy, never holds up a CNI request or the sync loop on the agent's runtime.

mod crd;
mod health;
mod list;
mod reflect;
mod slices;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1 as net;
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};

pub use self::health::{ApiHealth, HealthReport, HealthState, ProbeConfig, Proof, seed_from};
pub use self::list::{ListError, Listed, list_cluster};
pub use self::reflect::Options as WatchOptions;
use self::reflect::{Kind, Reflector};
use super::SourceWriter;
use crate::model::cnp::ClusterNetworkPolicy;
use crate::model::{Namespace, NetworkPolicy, Node, ObjectRef, Pod, Snapshot, convert, derived_uid};

/// The watched resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    Pods,
    Namespaces,
    NetworkPolicies,
    Nodes,
    /// `policy.networking.k8s.io/v1alpha2`, when its CRD is installed.
    ClusterNetworkPolicies,
    /// `flock.dev/v1alpha1` PodSlices (with [`PodSource::Slices`]; Pods are then this
    /// node's alone).
    PodSlices,
}

impl Resource {
    pub(crate) const ALL: [Resource; 6] = [
        Resource::Pods,
        Resource::Namespaces,
        Resource::NetworkPolicies,
        Resource::Nodes,
        Resource::ClusterNetworkPolicies,
        Resource::PodSlices,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pods => "pods",
            Self::Namespaces => "namespaces",
            Self::NetworkPolicies => "networkpolicies",
            Self::Nodes => "nodes",
            Self::ClusterNetworkPolicies => "clusternetworkpolicies",
            Self::PodSlices => "podslices",
        }
    }
}

/// Where the agent learns every pod's identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum PodSource {
    /// Every Pod in the cluster, watched.
    #[default]
    Pods,
    /// flock-controller's PodSlices, and only this node's own Pods (field-selected:
    /// `spec.nodeName`), for their own chains and CNI ADDs; `writer` is the writer's leader
    /// Lease, read to report its absence.
    Slices { node: String, writer: WriterLease },
}

/// The Lease of the PodSlices' writer (flock-controller's leader), read from the API
/// server's cache every `every` (plus up to half as much, jittered per node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterLease {
    pub namespace: String,
    pub name: String,
    pub every: Duration,
}

impl Default for WriterLease {
    fn default() -> Self {
        Self { namespace: "flock-system".into(), name: "flock-controller".into(), every: Duration::from_secs(30) }
    }
}

impl PodSource {
    /// The resources the source watches: each must have listed before it is complete.
    pub fn resources(&self) -> Vec<Resource> {
        match self {
            Self::Pods => Resource::ALL.iter().copied().filter(|r| *r != Resource::PodSlices).collect(),
            Self::Slices { .. } => Resource::ALL.to_vec(),
        }
    }
}

/// How the source lists, watches and probes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceOptions {
    pub watch: WatchOptions,
    pub probe: ProbeConfig,
    pub pods: PodSource,
}

impl SourceOptions {
    /// The defaults, with jitter seeded from the node's name (so nodes spread out).
    pub fn for_node(node: &str) -> Self {
        let seed = seed_from(node);
        Self {
            watch: WatchOptions { seed, ..WatchOptions::default() },
            probe: ProbeConfig { seed, ..ProbeConfig::default() },
            pods: PodSource::default(),
        }
    }
}

/// What one watch item becomes.
enum Change {
    /// A whole (re)list: replaces everything of the resource.
    Relisted(Vec<Object>),
    Apply(Box<Object>),
    Delete(Key),
}

enum Object {
    Pod(Pod),
    Namespace(Namespace),
    Policy(NetworkPolicy),
    Node(Node),
    ClusterPolicy(ClusterNetworkPolicy),
    /// A PodSlice's name and the pods it shows.
    Slice(String, Vec<Pod>),
}

#[derive(Debug)]
enum Key {
    Pod(String),
    Namespace(String),
    Policy(ObjectRef),
    Node(String),
    ClusterPolicy(String),
    Slice(String),
}

fn pod_key(p: &core::Pod) -> Key {
    let ns = p.metadata.namespace.clone().unwrap_or_else(|| convert::DEFAULT_NAMESPACE.into());
    let name = p.metadata.name.clone().unwrap_or_default();
    Key::Pod(p.metadata.uid.clone().filter(|u| !u.is_empty()).unwrap_or_else(|| derived_uid(&ns, &name)))
}

// An update flock cannot read removes a pod (fail closed: no peer; a local pod is closed as
// unknown). A policy is only unreadable without a name, which the API server never stores:
// keeping its last version keeps its pods isolated, dropping it could open them.
const PODS: Kind<core::Pod> = Kind { convert: |p| convert::pod(p).map(Object::Pod), key: pod_key, drop_unreadable: true, optional: false };
const NAMESPACES: Kind<core::Namespace> = Kind {
    convert: |n| convert::namespace(n).map(Object::Namespace),
    key: |n| Key::Namespace(n.metadata.name.clone().unwrap_or_default()),
    drop_unreadable: false,
    optional: false,
};
const POLICIES: Kind<net::NetworkPolicy> = Kind {
    convert: |p| convert::network_policy(p).map(Object::Policy),
    key: |p| Key::Policy(ObjectRef::new(p.metadata.namespace.clone().unwrap_or_default(), p.metadata.name.clone().unwrap_or_default())),
    drop_unreadable: false,
    optional: false,
};
const NODES: Kind<core::Node> = Kind {
    convert: |n| convert::node(n).map(Object::Node),
    key: |n| Key::Node(n.metadata.name.clone().unwrap_or_default()),
    drop_unreadable: false,
    optional: false,
};

/// What the informers count, implemented by whoever exports metrics (the agent's
/// `Metrics`): the source layer sits below the agent and does not know its metrics type.
pub trait SourceMetrics: Send + Sync {
    /// Whether `resource`'s watch is connected (healthy).
    fn watch(&self, resource: &str, connected: bool);
    fn watch_error(&self, resource: &str);
    fn watch_reconnected(&self, resource: &str);
    fn watch_relisted(&self, resource: &str, reason: &str);
    fn api_probe(&self, ok: bool);
    /// The API health state (`Connected`, `Degraded`, `Disconnected`).
    fn health(&self, state: &str);
    /// Whether an optional resource (a CRD's) is served, as discovery last said.
    fn resource_served(&self, resource: &str, served: bool);
    /// With [`PodSource::Slices`]: whether the PodSlices' writer holds and renews its Lease.
    fn pod_slice_writer(&self, _up: bool) {}
}

/// Why the watches ended before they were told to stop. The snapshot then stops following
/// the cluster: the agent must exit (its rules stay in the kernel) so that it is restarted,
/// not go on enforcing an ever older state as if nothing were wrong.
#[derive(Debug, thiserror::Error)]
pub enum SourceFailed {
    #[error("the {task} panicked: {reason}")]
    Panicked { task: String, reason: String },
    #[error("the {task} ended before the source was stopped")]
    Ended { task: String },
    #[error("the informers' thread panicked")]
    ThreadPanicked,
}

/// Runs the watches into `writer` until `stop`, with the default options. Never returns
/// early on errors the API answers (they are retried); returns [`SourceFailed`] when a
/// watch's task itself ended (a panic).
pub async fn run(
    client: Client,
    writer: SourceWriter,
    health: Arc<ApiHealth>,
    metrics: Arc<dyn SourceMetrics>,
    stop: watch::Receiver<bool>,
) -> Result<(), SourceFailed> {
    run_with(SourceOptions::default(), client, writer, health, metrics, stop).await
}

/// [`run`] with options.
pub async fn run_with(
    opts: SourceOptions,
    client: Client,
    writer: SourceWriter,
    health: Arc<ApiHealth>,
    metrics: Arc<dyn SourceMetrics>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), SourceFailed> {
    let (tx, mut rx) = mpsc::channel::<(Resource, Change)>(4096);
    // Each task with its name, for the error when one ends early.
    let mut tasks = tokio::task::JoinSet::new();
    let mut names: Vec<(tokio::task::Id, String)> = Vec::new();
    macro_rules! reflect {
        ($k:ty, $res:expr, $kind:expr) => {
            reflect!($k, $res, $kind, None)
        };
        ($k:ty, $res:expr, $kind:expr, $fields:expr) => {
            let handle = tasks.spawn(
                Reflector {
                    api: Api::<$k>::all(client.clone()),
                    resource: $res,
                    kind: $kind,
                    tx: tx.clone(),
                    health: health.clone(),
                    metrics: metrics.clone(),
                    opts: opts.watch.clone(),
                    fields: $fields,
                }
                .run_until_stopped(),
            );
            names.push((handle.id(), format!("{} watch", $res.as_str())));
        };
    }
    let mut merge = match &opts.pods {
        PodSource::Pods => {
            reflect!(core::Pod, Resource::Pods, PODS);
            None
        }
        PodSource::Slices { node, writer } => {
            reflect!(core::Pod, Resource::Pods, PODS, Some(format!("spec.nodeName={node}")));
            reflect!(crate::crd::PodSlice, Resource::PodSlices, slices::POD_SLICES);
            let handle = tasks.spawn(slices::watch_writer(client.clone(), writer.clone(), opts.watch.seed, metrics.clone(), stop.clone()));
            names.push((handle.id(), "PodSlice writer check".to_string()));
            Some(slices::PodMerge::new(node))
        }
    };
    let required = opts.pods.resources();
    reflect!(core::Namespace, Resource::Namespaces, NAMESPACES);
    reflect!(net::NetworkPolicy, Resource::NetworkPolicies, POLICIES);
    reflect!(core::Node, Resource::Nodes, NODES);
    let handle = tasks.spawn(crd::run(client.clone(), opts.watch.clone(), tx.clone(), health.clone(), metrics.clone()));
    names.push((handle.id(), format!("{} watch", Resource::ClusterNetworkPolicies.as_str())));
    drop(tx);
    let handle = tasks.spawn(probe(client, opts.probe.clone(), health.clone(), metrics.clone(), stop.clone()));
    names.push((handle.id(), "API server probe".to_string()));

    let mut listed: BTreeSet<Resource> = BTreeSet::new();
    let mut complete = false;
    let mut batch = Vec::with_capacity(1024);
    let outcome = loop {
        let received = tokio::select! {
            n = rx.recv_many(&mut batch, 1024) => n,
            Some(ended) = tasks.join_next_with_id() => {
                // Every task runs until the source stops: one that ends first leaves a
                // resource unwatched.
                if *stop.borrow() {
                    break Ok(());
                }
                let id = match &ended {
                    Ok((id, ())) => *id,
                    Err(e) => e.id(),
                };
                let task = names.iter().find(|(i, _)| *i == id).map_or_else(|| "unknown task".to_string(), |(_, n)| n.clone());
                let failed = match ended {
                    Err(e) if e.is_panic() => {
                        SourceFailed::Panicked { task, reason: crate::panic_message(e.into_panic().as_ref()).unwrap_or_else(|| "(not a string)".to_string()) }
                    }
                    _ => SourceFailed::Ended { task },
                };
                tracing::error!(error = %failed, "a watch of the source ended: the snapshot no longer follows the cluster");
                break Err(failed);
            }
            _ = stop.changed() => break Ok(()),
        };
        if received == 0 {
            // Every watch dropped its sender: ended, all of them.
            break if *stop.borrow() { Ok(()) } else { Err(SourceFailed::Ended { task: "every watch".to_string() }) };
        }
        let mut changes = std::mem::take(&mut batch);
        // Most updates of a watched object (a pod's conditions, a heartbeat, a new
        // resourceVersion) change nothing flock keeps: they must not cost a sync. (A
        // slice's pods are compared one by one as they are merged.)
        {
            let reader = writer.reader();
            let current = reader.read();
            changes.retain(|(_, c)| !matches!(c, Change::Apply(o) if unchanged(&current.snapshot, o)));
        }
        if changes.is_empty() {
            continue;
        }
        writer.update(|s| {
            for (res, c) in changes {
                if let Some(m) = merge.as_mut()
                    && matches!(res, Resource::Pods | Resource::PodSlices)
                {
                    if matches!(c, Change::Relisted(_)) {
                        listed.insert(res);
                    }
                    merged(m, s, res, c);
                    continue;
                }
                match c {
                    Change::Relisted(objects) => {
                        let vanished = replace(s, res, objects);
                        if vanished > 0 && listed.contains(&res) {
                            tracing::info!(resource = res.as_str(), vanished, "objects missing from the relist are gone");
                        }
                        listed.insert(res);
                    }
                    Change::Apply(o) => upsert(s, *o),
                    Change::Delete(k) => delete(s, &k),
                }
            }
        });
        if !complete && required.iter().all(|r| listed.contains(r)) {
            complete = true;
            let s = writer.reader();
            let (pods, policies, cluster_policies) = {
                let r = s.read();
                (r.snapshot.pod_count(), r.snapshot.policy_count(), r.snapshot.cluster_policies().count())
            };
            tracing::info!(pods, policies, cluster_policies, "every watch finished its initial list: the source is complete");
            writer.set_complete();
        }
    };
    tasks.abort_all();
    outcome
}

/// Why the informers' thread did not start.
#[derive(Debug, thiserror::Error)]
pub enum SourceThreadError {
    #[error("cannot start the informers' thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("cannot build the informers' runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("cannot build the informers' API client: {0}")]
    Client(#[source] kube::Error),
    #[error("the informers' thread ended before it started")]
    Gone,
}

/// The informers' thread, running [`run_with`]; it ends when `stop` turns true, or early
/// when a watch failed ([`SourceFailed`]).
#[derive(Debug)]
pub struct SourceThread {
    done: tokio::sync::oneshot::Receiver<Result<(), SourceFailed>>,
}

impl SourceThread {
    /// Waits until the thread's watches have ended: `Ok` when they were stopped.
    pub async fn finished(self) -> Result<(), SourceFailed> {
        // A sender dropped without sending: the thread panicked outside the watches.
        self.done.await.unwrap_or(Err(SourceFailed::ThreadPanicked))
    }
}

/// Runs [`run_with`] on a thread of its own, on a single-threaded runtime, with the API
/// client `client` builds there (a client's connections live on the runtime that built it).
/// The informers' work — above all a (re)list's decoding, conversion and the garbage it
/// leaves in the allocator's arena — then never takes a worker of the caller's runtime from
/// a CNI request or the sync loop. Returns once the client is built.
pub async fn spawn_thread<C>(
    opts: SourceOptions,
    client: C,
    writer: SourceWriter,
    health: Arc<ApiHealth>,
    metrics: Arc<dyn SourceMetrics>,
    stop: watch::Receiver<bool>,
) -> Result<SourceThread, SourceThreadError>
where
    C: FnOnce() -> Result<Client, kube::Error> + Send + 'static,
{
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (done_tx, done) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("flock-informers".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = started_tx.send(Err(SourceThreadError::Runtime(e)));
                    return;
                }
            };
            let done = rt.block_on(async move {
                let client = match client() {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = started_tx.send(Err(SourceThreadError::Client(e)));
                        return Ok(());
                    }
                };
                let _ = started_tx.send(Ok(()));
                run_with(opts, client, writer, health, metrics, stop).await
            });
            let _ = done_tx.send(done);
        })
        .map_err(SourceThreadError::Thread)?;
    started.await.map_err(|_| SourceThreadError::Gone)??;
    Ok(SourceThread { done })
}

/// Probes the API server (`/version`) when the watches have been quiet long enough (see
/// [`ApiHealth`]); after a failed probe, again after [`ProbeConfig::retry`], doubling up to
/// the quiet period, until something answers.
async fn probe(client: Client, cfg: ProbeConfig, health: Arc<ApiHealth>, metrics: Arc<dyn SourceMetrics>, mut stop: watch::Receiver<bool>) {
    use tokio::time::Instant;
    let mut n: u64 = 0;
    let mut failed: u32 = 0;
    let mut last_attempt = Instant::now();
    loop {
        if !health.probe_failing() {
            failed = 0;
        }
        let due = if failed > 0 {
            let backoff = cfg.retry.saturating_mul(1 << (failed - 1).min(16)).min(cfg.quiet.max(cfg.retry));
            last_attempt + backoff
        } else {
            Instant::from_std(health.last_contact()) + cfg.quiet_before(n)
        };
        let now = Instant::now();
        // Not due yet, or a watch is failing (its retries are probes already): look again
        // at `due` or within a second, whichever comes first — proof may move `due`.
        if now < due || health.any_watch_failing() {
            let wake = if now < due { due.min(now + Duration::from_secs(1)) } else { now + cfg.retry.max(Duration::from_millis(10)) };
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {}
                _ = stop.changed() => return,
            }
            continue;
        }
        n += 1;
        last_attempt = now;
        let result = match tokio::time::timeout(cfg.timeout, client.apiserver_version()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(reflect::describe(&e)),
            Err(_) => Err(format!("no answer within {:?}", cfg.timeout)),
        };
        metrics.api_probe(result.is_ok());
        match result {
            Ok(()) => {
                failed = 0;
                if health.probe_ok() {
                    tracing::info!("API server reachable again; full resync");
                }
            }
            Err(e) => {
                if failed == 0 {
                    tracing::warn!(error = %e, "the API server does not answer while the watches are quiet");
                }
                failed = failed.saturating_add(1);
                health.probe_error(&e);
            }
        }
    }
}

/// A change of this node's Pods or of the PodSlices, through the merge of the two.
fn merged(m: &mut slices::PodMerge, s: &mut Snapshot, res: Resource, c: Change) {
    match c {
        Change::Relisted(objects) if res == Resource::PodSlices => {
            let all = objects
                .into_iter()
                .filter_map(|o| match o {
                    Object::Slice(name, pods) => Some((name, pods)),
                    _ => None,
                })
                .collect();
            m.slices_relisted(s, all);
        }
        Change::Relisted(objects) => {
            let pods = objects
                .into_iter()
                .filter_map(|o| match o {
                    Object::Pod(p) => Some(p),
                    _ => None,
                })
                .collect();
            m.local_relisted(s, pods);
        }
        Change::Apply(o) => match *o {
            Object::Slice(name, pods) => m.slice(s, &name, Some(pods)),
            Object::Pod(p) => m.local(s, Ok(p)),
            _ => {}
        },
        Change::Delete(Key::Slice(name)) => m.slice(s, &name, None),
        Change::Delete(Key::Pod(uid)) => m.local(s, Err(uid)),
        Change::Delete(_) => {}
    }
}

/// Whether `o` is already in the snapshot exactly as converted.
fn unchanged(s: &Snapshot, o: &Object) -> bool {
    match o {
        Object::Slice(..) => false,
        Object::Pod(p) => s.pod(&p.uid) == Some(p),
        Object::Namespace(n) => s.namespace(&n.name) == Some(n),
        Object::Policy(p) => s.policy(&p.key()) == Some(p),
        Object::Node(n) => s.node(&n.name) == Some(n),
        Object::ClusterPolicy(p) => s.cluster_policy(&p.name) == Some(p),
    }
}

fn upsert(s: &mut Snapshot, o: Object) {
    match o {
        Object::Pod(p) => s.upsert_pod(p),
        Object::Namespace(n) => s.upsert_namespace(n),
        Object::Policy(p) => s.upsert_policy(p),
        Object::Node(n) => s.upsert_node(n),
        Object::ClusterPolicy(p) => s.upsert_cluster_policy(p),
        // Slices go through the merge ([`merged`]), never here.
        Object::Slice(..) => {}
    }
}

fn delete(s: &mut Snapshot, k: &Key) {
    match k {
        Key::Pod(uid) => {
            s.remove_pod(uid);
        }
        Key::Namespace(n) => {
            s.remove_namespace(n);
        }
        Key::Policy(r) => {
            s.remove_policy(r);
        }
        Key::Node(n) => {
            s.remove_node(n);
        }
        Key::ClusterPolicy(n) => {
            s.remove_cluster_policy(n);
        }
        Key::Slice(_) => {}
    }
}

/// Replaces everything of one resource with a fresh list; returns how many objects the
/// snapshot had that the list no longer has.
fn replace(s: &mut Snapshot, res: Resource, objects: Vec<Object>) -> usize {
    let old: Vec<Key> = match res {
        Resource::Pods => s.pods().map(|p| Key::Pod(p.uid.clone())).collect(),
        Resource::Namespaces => s.namespaces().map(|n| Key::Namespace(n.name.clone())).collect(),
        Resource::NetworkPolicies => s.policies().map(|p| Key::Policy(p.key())).collect(),
        Resource::Nodes => s.nodes().map(|n| Key::Node(n.name.clone())).collect(),
        Resource::ClusterNetworkPolicies => s.cluster_policies().map(|p| Key::ClusterPolicy(p.name.clone())).collect(),
        Resource::PodSlices => Vec::new(),
    };
    for k in &old {
        delete(s, k);
    }
    for o in objects {
        upsert(s, o);
    }
    old.iter().filter(|k| !present(s, k)).count()
}

fn present(s: &Snapshot, k: &Key) -> bool {
    match k {
        Key::Pod(uid) => s.pod(uid).is_some(),
        Key::Namespace(n) => s.namespace(n).is_some(),
        Key::Policy(r) => s.policy(r).is_some(),
        Key::Node(n) => s.node(n).is_some(),
        Key::ClusterPolicy(n) => s.cluster_policy(n).is_some(),
        Key::Slice(_) => false,
    }
}
