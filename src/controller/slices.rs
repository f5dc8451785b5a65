//! flock-controller's PodSlice writer: the one writer of the compact pod identities agents
//! can read instead of watching every Pod ([`crate::crd::PodSlice`]; what goes in a slice
//! and where is [`crate::slices`]'s, pure).
//!
//! Level-triggered from two watches, Pods (all namespaces) and PodSlices: every change marks
//! its namespace dirty, and a flush plans the namespace's slices from what the caches hold
//! now, so a missed or doubled event costs nothing and the slices' own events (the
//! controller's writes coming back, or anyone else's edit) are planned like the rest.
//! Nothing is written until both watches have listed completely (a slice planned from a
//! partial list of pods would drop the rest), and a relist replaces a cache at once.
//!
//! Batching: a namespace's changes gather for the window (`--pod-slice-window`) from the
//! first one, so a burst (a Deployment's rollout) is a few writes, not one per pod event. A
//! pod that stops being a peer or changes its addresses (deleted, terminal, re-addressed)
//! is urgent: its namespace flushes within a twentieth of the window, because until the
//! slice drops it every agent still lets it through as that pod, and its address may be
//! handed to another pod. Writes take tokens from a bucket (`--pod-slice-writes-per-second`,
//! a burst of twice that): under a flood the flushes wait, the events gathering meanwhile
//! join the next plan, and the API server sees a bounded write rate. Every ten minutes every
//! namespace is planned again.
//!
//! Writes are creates, replaces carrying the cached resourceVersion, and deletes with the
//! cached uid and resourceVersion as preconditions: a conflict (someone else wrote first, or
//! the cache is behind) is counted and the namespace planned again after the window, from
//! the newer state the watch brings.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;

use super::FIELD_MANAGER;
use super::metrics::Metrics;
use crate::crd::{PodSlice, PodSliceSpec};
use crate::model::{clip, convert};
use crate::slices::{self, Member, Write};

/// How the writer batches and paces.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceOptions {
    /// Pods per slice (at most [`crate::crd::POD_SLICE_LIMIT`]).
    pub max_pods: usize,
    /// How long a namespace's changes gather before its slices are written.
    pub window: Duration,
    /// Writes per second (the bucket's refill; it holds twice as many).
    pub writes_per_second: u32,
    /// How often every namespace is planned again.
    pub resync: Duration,
}

impl Default for SliceOptions {
    fn default() -> Self {
        Self {
            max_pods: slices::DEFAULT_MAX_PODS,
            window: Duration::from_millis(500),
            writes_per_second: 50,
            resync: Duration::from_secs(600),
        }
    }
}

/// A slice as the cache holds it.
struct Held {
    spec: PodSliceSpec,
    uid: Option<String>,
    resource_version: Option<String>,
}

/// A cache filled by one watch: complete once its first list is in; a relist is gathered
/// apart and replaces it when its last page is in.
struct Cache<V> {
    items: BTreeMap<String, V>,
    relist: Option<BTreeMap<String, V>>,
    complete: bool,
}

impl<V> Default for Cache<V> {
    fn default() -> Self {
        Self { items: BTreeMap::new(), relist: None, complete: false }
    }
}

/// What the writer knows: pods' members by namespace and uid, the slices by name, and the
/// namespaces waiting for a flush.
#[derive(Default)]
struct State {
    /// A relist of the Pods being gathered: uid → (namespace, member).
    pods_relist: Option<BTreeMap<String, (String, Option<Member>)>>,
    /// Whether the Pods have been listed.
    pods_complete: bool,
    /// Namespace → uid → member, of the pods that are peers (all the writer keeps of pods).
    by_namespace: BTreeMap<String, BTreeMap<String, Member>>,
    /// How many members `by_namespace` holds.
    members: usize,
    slices: Cache<Held>,
    /// Namespace → the slices naming it.
    slices_of: BTreeMap<String, BTreeSet<String>>,
    /// Namespace → when its flush is due.
    due: BTreeMap<String, Instant>,
    /// Pods whose Pod object could not be read, by uid (left out: in no slice).
    unreadable: BTreeSet<String>,
}

impl State {
    fn mark(&mut self, namespace: &str, at: Instant) {
        let due = self.due.entry(namespace.to_string()).or_insert(at);
        *due = (*due).min(at);
    }

    /// A pod's new member (`None`: deleted, or no peer); marks its namespace when it changed.
    fn pod(&mut self, uid: &str, namespace: &str, new_member: Option<Member>, now: Instant, window: Duration) {
        // A pod's namespace never changes: its old member is in this namespace's map.
        let urgent = {
            let old_member = self.by_namespace.get(namespace).and_then(|m| m.get(uid));
            if old_member == new_member.as_ref() {
                return;
            }
            // Urgent: a peer that stops being one, or whose addresses change.
            old_member.is_some_and(|o| new_member.as_ref().is_none_or(|n| n.ips != o.ips))
        };
        let added = new_member.is_some();
        let members = self.by_namespace.entry(namespace.to_string()).or_default();
        let had = match new_member {
            Some(m) => members.insert(uid.to_string(), m),
            None => members.remove(uid),
        }
        .is_some();
        if members.is_empty() {
            self.by_namespace.remove(namespace);
        }
        match (had, added) {
            (false, true) => self.members += 1,
            (true, false) => self.members -= 1,
            _ => {}
        }
        self.mark(namespace, now + if urgent { window / 20 } else { window });
    }

    /// The pods' cache replaced by a relist: every namespace before or after is planned.
    fn pods_relisted(&mut self, items: BTreeMap<String, (String, Option<Member>)>, now: Instant) {
        let mut namespaces: BTreeSet<String> = self.by_namespace.keys().cloned().collect();
        self.by_namespace.clear();
        self.members = 0;
        self.unreadable.retain(|uid| items.contains_key(uid));
        for (uid, (ns, m)) in items {
            if let Some(m) = m {
                self.by_namespace.entry(ns.clone()).or_default().insert(uid, m);
                self.members += 1;
            }
            namespaces.insert(ns);
        }
        for ns in namespaces {
            self.mark(&ns, now);
        }
    }

    fn slice(&mut self, name: &str, held: Option<Held>, now: Instant, window: Duration) {
        let old = match held {
            Some(h) => {
                let ns = h.spec.namespace.clone();
                self.slices_of.entry(ns.clone()).or_default().insert(name.to_string());
                self.mark(&ns, now + window);
                self.slices.items.insert(name.to_string(), h)
            }
            None => self.slices.items.remove(name),
        };
        if let Some(old) = old {
            let ns = old.spec.namespace;
            let still = self.slices.items.get(name).is_some_and(|h| h.spec.namespace == ns);
            if !still && let Some(names) = self.slices_of.get_mut(&ns) {
                names.remove(name);
                if names.is_empty() {
                    self.slices_of.remove(&ns);
                }
            }
            self.mark(&ns, now + window);
        }
    }

    fn slices_relisted(&mut self, items: BTreeMap<String, Held>, now: Instant) {
        let mut namespaces: BTreeSet<String> = self.slices_of.keys().cloned().collect();
        self.slices_of.clear();
        for (name, h) in &items {
            namespaces.insert(h.spec.namespace.clone());
            self.slices_of.entry(h.spec.namespace.clone()).or_default().insert(name.clone());
        }
        self.slices.items = items;
        for ns in namespaces {
            self.mark(&ns, now);
        }
    }

    /// The writes that bring `namespace`'s slices to its pods now.
    fn plan(&self, namespace: &str, max_pods: usize) -> Vec<Write> {
        let current: BTreeMap<&str, &PodSliceSpec> = self
            .slices_of
            .get(namespace)
            .into_iter()
            .flatten()
            .filter_map(|n| self.slices.items.get(n).map(|h| (n.as_str(), &h.spec)))
            .collect();
        let empty = BTreeMap::new();
        let desired = self.by_namespace.get(namespace).unwrap_or(&empty);
        slices::plan(namespace, &current, desired, |n| self.slices.items.contains_key(n), max_pods)
    }
}

/// A token bucket: `rate` a second, holding up to `2 × rate`.
struct Bucket {
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: u32) -> Self {
        let rate = f64::from(rate.max(1));
        Self { rate, tokens: 2.0 * rate, at: Instant::now() }
    }

    async fn take(&mut self) {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate).min(2.0 * self.rate);
        self.at = now;
        if self.tokens < 1.0 {
            let wait = Duration::from_secs_f64((1.0 - self.tokens) / self.rate);
            tokio::time::sleep(wait).await;
            self.tokens = 1.0;
            self.at = Instant::now();
        }
        self.tokens -= 1.0;
    }
}

/// The writer, until `stop`.
pub async fn run(client: Client, opts: SliceOptions, metrics: Arc<Metrics>, stop: watch::Receiver<bool>) {
    let pods_api: Api<Pod> = Api::all(client.clone());
    let slices_api: Api<PodSlice> = Api::all(client);
    let pods = watcher(pods_api, watcher::Config::default().page_size(500)).default_backoff();
    let slices = watcher(slices_api.clone(), watcher::Config::default()).default_backoff();
    let mut pods = std::pin::pin!(pods);
    let mut slices = std::pin::pin!(slices);
    let mut stopping = std::pin::pin!(super::stopped(stop));
    let mut state = State::default();
    let mut bucket = Bucket::new(opts.writes_per_second);
    let mut resync = tokio::time::interval_at(Instant::now() + opts.resync, opts.resync);
    tracing::info!(
        max_pods = opts.max_pods,
        window_ms = opts.window.as_millis() as u64,
        writes_per_second = opts.writes_per_second,
        "PodSlice writer started"
    );
    loop {
        let next_due = state.due.values().min().copied().filter(|_| state.pods_complete && state.slices.complete);
        tokio::select! {
            biased;
            () = &mut stopping => break,
            e = pods.next() => match e {
                Some(Ok(e)) => on_pod(&mut state, e, &opts, &metrics),
                Some(Err(e)) => tracing::warn!(error = %e, "watching Pods (retrying)"),
                None => break,
            },
            e = slices.next() => match e {
                Some(Ok(e)) => on_slice(&mut state, e, &opts),
                Some(Err(e)) => tracing::warn!(error = %e, "watching PodSlices (retrying)"),
                None => break,
            },
            _ = resync.tick() => {
                let now = Instant::now();
                let all: BTreeSet<String> = state.by_namespace.keys().chain(state.slices_of.keys()).cloned().collect();
                for ns in all {
                    state.mark(&ns, now);
                }
            }
            _ = sleep_until(next_due) => {
                flush(&mut state, &slices_api, &opts, &metrics, &mut bucket).await;
            }
        }
    }
    tracing::info!("PodSlice writer stopped");
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn on_pod(state: &mut State, e: watcher::Event<Pod>, opts: &SliceOptions, metrics: &Metrics) {
    let now = Instant::now();
    match e {
        watcher::Event::Init => state.pods_relist = Some(BTreeMap::new()),
        watcher::Event::InitApply(p) => {
            if let Some((uid, ns, m)) = read_pod(state, &p)
                && let Some(relist) = state.pods_relist.as_mut()
            {
                relist.insert(uid, (ns, m));
            }
        }
        watcher::Event::InitDone => {
            let items = state.pods_relist.take().unwrap_or_default();
            let listed = items.len();
            state.pods_relisted(items, now);
            if !state.pods_complete {
                tracing::info!(pods = listed, peers = state.members, "Pods listed");
            }
            state.pods_complete = true;
        }
        watcher::Event::Apply(p) => {
            if let Some((uid, ns, m)) = read_pod(state, &p) {
                state.pod(&uid, &ns, m, now, opts.window);
            }
        }
        watcher::Event::Delete(p) => {
            if let Some(uid) = p.metadata.uid.as_deref() {
                state.unreadable.remove(uid);
                state.pod(uid, &p.namespace().unwrap_or_default(), None, now, opts.window);
            }
        }
    }
    metrics.slice_totals(state.slices.items.len(), state.members, state.unreadable.len());
}

/// A pod's uid, namespace and member; a Pod that cannot be read is no member (in no slice:
/// fail closed), logged by name when it first fails.
fn read_pod(state: &mut State, p: &Pod) -> Option<(String, String, Option<Member>)> {
    let uid = p.metadata.uid.clone()?;
    let namespace = p.namespace().unwrap_or_default();
    match convert::pod(p) {
        Ok(pod) => {
            state.unreadable.remove(&uid);
            Some((uid, namespace, Member::of(&pod)))
        }
        Err(e) => {
            if state.unreadable.insert(uid.clone()) {
                tracing::warn!(pod = %format!("{}/{}", clip(&namespace), clip(&p.name_any())), error = %e, "a Pod that cannot be read is left out of the PodSlices");
            }
            Some((uid, namespace, None))
        }
    }
}

fn held(s: &PodSlice) -> Held {
    Held { spec: s.spec.clone(), uid: s.metadata.uid.clone(), resource_version: s.metadata.resource_version.clone() }
}

fn on_slice(state: &mut State, e: watcher::Event<PodSlice>, opts: &SliceOptions) {
    let now = Instant::now();
    match e {
        watcher::Event::Init => state.slices.relist = Some(BTreeMap::new()),
        watcher::Event::InitApply(s) => {
            if let Some(relist) = state.slices.relist.as_mut() {
                relist.insert(s.name_any(), held(&s));
            }
        }
        watcher::Event::InitDone => {
            let items = state.slices.relist.take().unwrap_or_default();
            state.slices_relisted(items, now);
            state.slices.complete = true;
        }
        watcher::Event::Apply(s) => state.slice(&s.name_any(), Some(held(&s)), now, opts.window),
        watcher::Event::Delete(s) => state.slice(&s.name_any(), None, now, opts.window),
    }
}

/// Plans and writes every namespace that is due.
async fn flush(state: &mut State, api: &Api<PodSlice>, opts: &SliceOptions, metrics: &Metrics, bucket: &mut Bucket) {
    let now = Instant::now();
    let due: Vec<String> = state.due.iter().filter(|(_, at)| **at <= now).map(|(ns, _)| ns.clone()).collect();
    for ns in due {
        state.due.remove(&ns);
        for write in state.plan(&ns, opts.max_pods) {
            bucket.take().await;
            let (op, result) = match write_one(state, api, &write).await {
                Ok(()) => (op_of(&write), "ok"),
                Err(e) => {
                    let conflict = matches!(&e, kube::Error::Api(s) if s.code == 409 || s.code == 404);
                    if !conflict {
                        tracing::warn!(slice = %write.name(), namespace = %ns, error = %e, "writing a PodSlice failed; planning again");
                    }
                    // Planned again from what the watch brings next.
                    state.mark(&ns, Instant::now() + opts.window);
                    (op_of(&write), if conflict { "conflict" } else { "failed" })
                }
            };
            metrics.slice_write(op, result);
        }
    }
}

fn op_of(w: &Write) -> &'static str {
    match w {
        Write::Create { .. } => "create",
        Write::Update { .. } => "update",
        Write::Delete { .. } => "delete",
    }
}

async fn write_one(state: &State, api: &Api<PodSlice>, write: &Write) -> Result<(), kube::Error> {
    let pp = PostParams { dry_run: false, field_manager: Some(FIELD_MANAGER.into()) };
    let object = |name: &str, spec: &PodSliceSpec| {
        let mut s = PodSlice::new(name, spec.clone());
        s.metadata.labels = Some(BTreeMap::from([("app.kubernetes.io/managed-by".to_string(), FIELD_MANAGER.to_string())]));
        s
    };
    match write {
        Write::Create { name, spec } => api.create(&pp, &object(name, spec)).await.map(drop),
        Write::Update { name, spec } => {
            let mut s = object(name, spec);
            s.metadata.resource_version = state.slices.items.get(name).and_then(|h| h.resource_version.clone());
            api.replace(name, &pp, &s).await.map(drop)
        }
        Write::Delete { name } => {
            let held = state.slices.items.get(name);
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: held.and_then(|h| h.uid.clone()),
                    resource_version: held.and_then(|h| h.resource_version.clone()),
                }),
                ..DeleteParams::default()
            };
            api.delete(name, &dp).await.map(drop)
        }
    }
}
