//! The Kubernetes informer source: kube-runtime watchers for Pods, Namespaces,
//! NetworkPolicies and Nodes (all namespaces), written into the snapshot as events arrive.
//!
//! - Only the snapshot's fields are kept: each object is converted on arrival
//!   (`model::convert`) and the API object dropped, so memory per pod stays small.
//! - A watch's initial list is buffered and swapped in at `InitDone` (objects not re-listed
//!   are gone). The source becomes complete — and the agent may program nft — only once all
//!   four watches have finished their first list.
//! - Pods are keyed by uid; a Delete removes the pod at once, and terminal pods stop being
//!   peers in the translator.
//! - Watch errors never stop the loop (kube-runtime re-lists with backoff); they drive the
//!   API health state machine ([`ApiHealth`]): Connected → Degraded (a watch has failed for
//!   `degraded_after`) → Disconnected (failing for `disconnected_after`); last-known rules
//!   stay in force throughout, and recovery bumps a resync counter the agent turns into a
//!   full sync.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1 as net;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;

use super::SourceWriter;
use crate::agent::metrics::Metrics;
use crate::model::{Namespace, NetworkPolicy, Node, ObjectRef, Pod, Snapshot, convert, derived_uid};

/// The watched resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    Pods,
    Namespaces,
    NetworkPolicies,
    Nodes,
}

impl Resource {
    pub const ALL: [Resource; 4] = [Resource::Pods, Resource::Namespaces, Resource::NetworkPolicies, Resource::Nodes];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pods => "pods",
            Self::Namespaces => "namespaces",
            Self::NetworkPolicies => "networkpolicies",
            Self::Nodes => "nodes",
        }
    }
}

/// The API server's health as the agent sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthState {
    Connected,
    Degraded,
    Disconnected,
}

impl HealthState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connected => "Connected",
            Self::Degraded => "Degraded",
            Self::Disconnected => "Disconnected",
        }
    }
}

#[derive(Debug, Default)]
struct HealthInner {
    /// Since when the API has been failing (no clean probe since the first error).
    failing_since: Option<Instant>,
    /// Errors (watch or probe) since the last probe.
    errors_since_probe: u64,
    last_error: Option<String>,
    /// Per watch: whether its last item was an error.
    watch_failing: BTreeMap<Resource, bool>,
}

/// Health of the API server as the agent sees it, shared with `/healthz`, `/metrics` and
/// the agent.
///
/// kube-runtime's watchers report errors but not quiet successes (a resumed watch or a
/// bookmark yields no event), so successes come from a probe: every `probe_interval` a
/// request to `/version`. A probe that succeeds with no watch error since the previous one
/// ends a failure; the failure's duration against the thresholds gives the state. A `410
/// Expired` is a normal re-list, not an error.
#[derive(Debug)]
pub struct ApiHealth {
    degraded_after: Duration,
    disconnected_after: Duration,
    inner: Mutex<HealthInner>,
    /// Bumped when the API comes back after failing: the agent does a full sync.
    resync: watch::Sender<u64>,
}

impl ApiHealth {
    pub fn new(degraded_after: Duration, disconnected_after: Duration) -> Self {
        Self { degraded_after, disconnected_after, inner: Mutex::new(HealthInner::default()), resync: watch::channel(0).0 }
    }

    fn with<T>(&self, f: impl FnOnce(&mut HealthInner) -> T) -> T {
        match self.inner.lock() {
            Ok(mut g) => f(&mut g),
            Err(p) => f(&mut p.into_inner()),
        }
    }

    /// A watch delivered an item.
    pub fn watch_ok(&self, r: Resource) {
        self.with(|h| {
            h.watch_failing.insert(r, false);
        });
    }

    /// A watch error. Returns whether this starts a failure.
    pub fn watch_error(&self, r: Resource, e: &str) -> bool {
        self.with(|h| {
            h.watch_failing.insert(r, true);
            h.errors_since_probe += 1;
            h.last_error = Some(format!("{}: {e}", r.as_str()));
            let started = h.failing_since.is_none();
            h.failing_since.get_or_insert_with(Instant::now);
            started
        })
    }

    /// A probe of the API server answered. Returns whether a failure ended (a recovery,
    /// which also triggers the agent's full resync).
    pub fn probe_ok(&self) -> bool {
        let recovered = self.with(|h| {
            let clean = h.errors_since_probe == 0;
            h.errors_since_probe = 0;
            if !clean {
                return false;
            }
            for v in h.watch_failing.values_mut() {
                *v = false;
            }
            h.last_error = None;
            h.failing_since.take().is_some()
        });
        if recovered {
            self.resync.send_modify(|n| *n += 1);
        }
        recovered
    }

    /// A probe failed.
    pub fn probe_error(&self, e: &str) {
        self.with(|h| {
            h.errors_since_probe += 1;
            h.last_error = Some(format!("probe: {e}"));
            h.failing_since.get_or_insert_with(Instant::now);
        });
    }

    /// The state now.
    pub fn state(&self) -> HealthState {
        let failing = self.with(|h| h.failing_since.map(|t| t.elapsed()));
        match failing {
            Some(d) if d >= self.disconnected_after => HealthState::Disconnected,
            Some(d) if d >= self.degraded_after => HealthState::Degraded,
            _ => HealthState::Connected,
        }
    }

    /// Whether `r`'s last watch item was an error.
    pub fn watch_failing(&self, r: Resource) -> bool {
        self.with(|h| h.watch_failing.get(&r).copied().unwrap_or(false))
    }

    /// The last error while failing.
    pub fn last_error(&self) -> Option<String> {
        self.with(|h| h.last_error.clone())
    }

    /// Recoveries so far (the agent subscribes and does a full sync on each).
    pub fn resyncs(&self) -> watch::Receiver<u64> {
        self.resync.subscribe()
    }
}

/// What one watch event becomes.
enum Change {
    Init,
    InitObject(Object),
    InitDone,
    Apply(Object),
    Delete(Key),
}

enum Object {
    Pod(Pod),
    Namespace(Namespace),
    Policy(NetworkPolicy),
    Node(Node),
}

enum Key {
    Pod(String),
    Namespace(String),
    Policy(ObjectRef),
    Node(String),
}

/// A watch error: a `410 Expired` (the watcher re-lists; normal) or anything else.
enum WatchErr {
    Expired,
    Other(String),
}

impl From<watcher::Error> for WatchErr {
    fn from(e: watcher::Error) -> Self {
        match &e {
            watcher::Error::WatchError(s) if s.code == 410 => WatchErr::Expired,
            _ => WatchErr::Other(e.to_string()),
        }
    }
}

type Item = (Resource, Result<Option<Change>, WatchErr>);

fn pod_key(p: &core::Pod) -> Key {
    let ns = p.metadata.namespace.clone().unwrap_or_else(|| convert::DEFAULT_NAMESPACE.into());
    let name = p.metadata.name.clone().unwrap_or_default();
    Key::Pod(p.metadata.uid.clone().filter(|u| !u.is_empty()).unwrap_or_else(|| derived_uid(&ns, &name)))
}

/// Maps a watcher event of one kind to a [`Change`], converting the object (and logging,
/// then skipping, an object the API server should never have stored).
fn change<K>(ev: Event<K>, convert: impl Fn(&K) -> Result<Object, String>, key: impl Fn(&K) -> Key) -> Option<Change> {
    let conv = |o: &K| match convert(o) {
        Ok(x) => Some(x),
        Err(e) => {
            tracing::warn!(error = %e, "skipping an object that cannot be converted");
            None
        }
    };
    match ev {
        Event::Init => Some(Change::Init),
        Event::InitApply(o) => conv(&o).map(Change::InitObject),
        Event::InitDone => Some(Change::InitDone),
        Event::Apply(o) => conv(&o).map(Change::Apply),
        Event::Delete(o) => Some(Change::Delete(key(&o))),
    }
}

/// Runs the four watches into `writer` until `stop`. Never returns early on errors.
pub async fn run(
    client: Client,
    writer: SourceWriter,
    health: std::sync::Arc<ApiHealth>,
    metrics: std::sync::Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let cfg = watcher::Config::default();
    let probe_client = client.clone();
    let pods = watcher::watcher(Api::<core::Pod>::all(client.clone()), cfg.clone()).default_backoff().map(|r| -> Item {
        (
            Resource::Pods,
            r.map(|e| change(e, |p| convert::pod(p).map(Object::Pod).map_err(|e| format!("pod {:?}: {e}", p.metadata.name)), pod_key))
                .map_err(WatchErr::from),
        )
    });
    let namespaces = watcher::watcher(Api::<core::Namespace>::all(client.clone()), cfg.clone()).default_backoff().map(|r| -> Item {
        (
            Resource::Namespaces,
            r.map(|e| {
                change(
                    e,
                    |n| convert::namespace(n).map(Object::Namespace).map_err(|e| e.to_string()),
                    |n| Key::Namespace(n.metadata.name.clone().unwrap_or_default()),
                )
            })
            .map_err(WatchErr::from),
        )
    });
    let policies = watcher::watcher(Api::<net::NetworkPolicy>::all(client.clone()), cfg.clone()).default_backoff().map(|r| -> Item {
        (
            Resource::NetworkPolicies,
            r.map(|e| {
                change(
                    e,
                    |p| convert::network_policy(p).map(Object::Policy).map_err(|e| e.to_string()),
                    |p| {
                        Key::Policy(ObjectRef::new(
                            p.metadata.namespace.clone().unwrap_or_default(),
                            p.metadata.name.clone().unwrap_or_default(),
                        ))
                    },
                )
            })
            .map_err(WatchErr::from),
        )
    });
    let nodes = watcher::watcher(Api::<core::Node>::all(client), cfg).default_backoff().map(|r| -> Item {
        (
            Resource::Nodes,
            r.map(|e| {
                change(
                    e,
                    |n| convert::node(n).map(Object::Node).map_err(|e| e.to_string()),
                    |n| Key::Node(n.metadata.name.clone().unwrap_or_default()),
                )
            })
            .map_err(WatchErr::from),
        )
    });
    let prober = tokio::spawn(probe(probe_client, health.clone(), metrics.clone(), stop.clone()));
    let mut events = stream::select_all([pods.boxed(), namespaces.boxed(), policies.boxed(), nodes.boxed()]).ready_chunks(1024);

    let mut buffers: BTreeMap<Resource, Vec<Object>> = BTreeMap::new();
    let mut listed: BTreeMap<Resource, bool> = BTreeMap::new();
    let mut complete = false;
    loop {
        let chunk = tokio::select! {
            c = events.next() => match c {
                Some(c) => c,
                None => break,
            },
            _ = stop.changed() => break,
        };
        let mut changes: Vec<(Resource, Change)> = Vec::new();
        for (res, item) in chunk {
            match item {
                Ok(c) => {
                    if health.watch_failing(res) {
                        metrics.watch_reconnected(res.as_str());
                    }
                    health.watch_ok(res);
                    metrics.watch(res.as_str(), true);
                    if let Some(c) = c {
                        changes.push((res, c));
                    }
                }
                // A re-list, not a failure.
                Err(WatchErr::Expired) => {}
                Err(WatchErr::Other(e)) => {
                    if !health.watch_failing(res) {
                        tracing::warn!(resource = res.as_str(), error = %e, "watch failed; last-known rules stay in force");
                        metrics.watch_reconnected(res.as_str());
                    }
                    health.watch_error(res, &e);
                    metrics.watch_error(res.as_str());
                    metrics.watch(res.as_str(), false);
                }
            }
        }
        // Most updates of a watched object (a pod's conditions, a heartbeat, a new
        // resourceVersion) change nothing flock keeps: they must not cost a sync.
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
                match c {
                    Change::Init => {
                        buffers.insert(res, Vec::new());
                    }
                    Change::InitObject(o) => buffers.entry(res).or_default().push(o),
                    Change::InitDone => {
                        replace(s, res, buffers.remove(&res).unwrap_or_default());
                        listed.insert(res, true);
                    }
                    Change::Apply(o) => upsert(s, o),
                    Change::Delete(k) => delete(s, k),
                }
            }
        });
        if !complete && Resource::ALL.iter().all(|r| listed.get(r).copied().unwrap_or(false)) {
            complete = true;
            let s = writer.reader();
            let (pods, policies) = {
                let r = s.read();
                (r.snapshot.pod_count(), r.snapshot.policy_count())
            };
            tracing::info!(pods, policies, "every watch finished its initial list: the source is complete");
            writer.set_complete();
        }
    }
    prober.abort();
}

/// Period of the API probe.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Probes the API server (`/version`) every [`PROBE_INTERVAL`]; see [`ApiHealth`].
async fn probe(client: Client, health: std::sync::Arc<ApiHealth>, metrics: std::sync::Arc<Metrics>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(PROBE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        match tokio::time::timeout(Duration::from_secs(2), client.apiserver_version()).await {
            Ok(Ok(_)) => {
                if health.probe_ok() {
                    tracing::info!("API server reachable again; full resync");
                    for r in Resource::ALL {
                        metrics.watch(r.as_str(), true);
                    }
                }
            }
            Ok(Err(e)) => health.probe_error(&e.to_string()),
            Err(_) => health.probe_error("no answer within 2s"),
        }
    }
}

/// Whether `o` is already in the snapshot exactly as converted.
fn unchanged(s: &Snapshot, o: &Object) -> bool {
    match o {
        Object::Pod(p) => s.pod(&p.uid) == Some(p),
        Object::Namespace(n) => s.namespace(&n.name) == Some(n),
        Object::Policy(p) => s.policy(&p.key()) == Some(p),
        Object::Node(n) => s.node(&n.name) == Some(n),
    }
}

fn upsert(s: &mut Snapshot, o: Object) {
    match o {
        Object::Pod(p) => s.upsert_pod(p),
        Object::Namespace(n) => s.upsert_namespace(n),
        Object::Policy(p) => s.upsert_policy(p),
        Object::Node(n) => s.upsert_node(n),
    }
}

fn delete(s: &mut Snapshot, k: Key) {
    match k {
        Key::Pod(uid) => {
            s.remove_pod(&uid);
        }
        Key::Namespace(n) => {
            s.remove_namespace(&n);
        }
        Key::Policy(r) => {
            s.remove_policy(&r);
        }
        Key::Node(n) => {
            s.remove_node(&n);
        }
    }
}

/// Replaces everything of one resource with a fresh list.
fn replace(s: &mut Snapshot, res: Resource, objects: Vec<Object>) {
    match res {
        Resource::Pods => {
            let stale: Vec<String> = s.pods().map(|p| p.uid.clone()).collect();
            for uid in stale {
                s.remove_pod(&uid);
            }
        }
        Resource::Namespaces => {
            let stale: Vec<String> = s.namespaces().map(|n| n.name.clone()).collect();
            for n in stale {
                s.remove_namespace(&n);
            }
        }
        Resource::NetworkPolicies => {
            let stale: Vec<ObjectRef> = s.policies().map(NetworkPolicy::key).collect();
            for k in stale {
                s.remove_policy(&k);
            }
        }
        Resource::Nodes => {
            let stale: Vec<String> = s.nodes().map(|n| n.name.clone()).collect();
            for n in stale {
                s.remove_node(&n);
            }
        }
    }
    for o in objects {
        upsert(s, o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_state_machine() {
        let h = ApiHealth::new(Duration::from_millis(50), Duration::from_millis(150));
        assert_eq!(h.state(), HealthState::Connected);
        h.probe_error("connection refused");
        assert_eq!(h.state(), HealthState::Connected, "a blip is not degraded yet");
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(h.state(), HealthState::Degraded);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(h.state(), HealthState::Disconnected);
        assert!(h.last_error().unwrap().contains("connection refused"));
        let resyncs = h.resyncs();
        // A probe right after an error does not end the failure; a clean one does.
        assert!(!h.probe_ok());
        assert!(h.probe_ok(), "recovery is reported");
        assert_eq!(*resyncs.borrow(), 1);
        assert_eq!(h.state(), HealthState::Connected);
        assert!(!h.probe_ok());
        // Watch errors between probes keep the failure going.
        assert!(h.watch_error(Resource::Pods, "garbage"));
        assert!(h.watch_failing(Resource::Pods));
        assert!(!h.probe_ok());
        h.watch_error(Resource::Pods, "garbage");
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(h.state(), HealthState::Degraded);
        assert!(!h.probe_ok());
        assert!(h.probe_ok());
        assert!(!h.watch_failing(Resource::Pods));
    }
}
