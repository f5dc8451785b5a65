//! flock-controller: the companion controller that turns each sandboxed [`Run`] into
//! its own egress policy, `<run>-egress`, which flock-agent enforces.
//!
//! ```text
//!  RunProfile (cluster, template) ─┐
//!  Run (namespace, request) ───────┼─► reconcile ─► render (pure) ─► server-side apply ─► NetworkPolicy
//!  ClusterConfig (flags, API       │    (chain of                       (field manager       or CiliumNetworkPolicy
//!   server addresses) ─────────────┘     small steps)                   flock-controller)    owned by the Run
//!  run pods, FlockNodes ──► Enforced condition        AuditEvents (durable, per change) ◄─┘
//! ```
//!
//! The API types, their CRDs and checks are [`crate::crd`]'s. Modules: [`render`] (pure: run, profile,
//! cluster → policy), [`reconcile`] (one pass, as steps), [`audit`] (the AuditEvent trail and
//! its retention), [`enforced`] (whether the run's nodes enforce its policy), [`probe`] (the enforcement decision
//! and the policy kind, decided at start), [`apiserver`] (where the API server is),
//! [`metrics`]; leader election is [`crate::lease`]'s. This file wires them: [`start`]
//! makes the start-up decisions (and refuses to start without an API server address),
//! [`run`] runs the Run and RunProfile controllers until stopped: reconciles read
//! RunProfiles from a cache that one watch fills (never a live read per reconcile), and
//! only once that cache holds a complete list. The binary
//! (`src/bin/flock-controller`) parses flags, serves `/healthz`, `/readyz`, `/metrics` and
//! elects a leader around [`run`].

pub(crate) mod apiserver;
pub mod audit;
pub mod enforced;
pub mod metrics;
pub mod probe;
pub mod reconcile;
pub mod render;
pub mod slices;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::DynamicObject;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::{mpsc, watch};

use crate::agent::http::{Handler, json_response, metrics_response};
use crate::crd::{FlockNode, Run, RunProfile};
use enforced::Verify;
use k8s_openapi::api::core::v1::Pod;
use metrics::Metrics;
use probe::{AgentRef, Decision, EnforceMode, PolicyKind};
use render::{ApiEndpoint, ClusterConfig};

/// The field manager of every write, and the `app.kubernetes.io/managed-by` label value.
pub(crate) const FIELD_MANAGER: &str = "flock-controller";
/// The annotation naming the profile a policy was rendered from.
pub(crate) const PROFILE_ANNOTATION: &str = "flock.dev/profile";
/// The reason of the Warning Event for a policy found deleted after it had been applied.
pub(crate) const WITHDRAWN_REASON: &str = "NetworkPolicyWithdrawn";
/// The reason of the Warning Event for a failed enforcer probe.
pub(crate) const PROBE_FAILED_REASON: &str = "EnforcerProbeFailed";
pub(crate) const CILIUM_GROUP: &str = "cilium.io";
pub(crate) const CILIUM_VERSION: &str = "v2";
pub(crate) const CILIUM_API_VERSION: &str = "cilium.io/v2";
pub(crate) const CILIUM_KIND: &str = "CiliumNetworkPolicy";

/// How the controller runs (the flags of `flock-controller`).
#[derive(Clone)]
pub struct Options {
    pub enforce: EnforceMode,
    /// The flock-agent DaemonSet the `auto` probe looks for.
    pub agent: AgentRef,
    /// The cluster's CIDRs and DNS pods (the API server's addresses are found at start).
    pub cluster: ClusterConfig,
    /// The API server URL of the client configuration, when there is one.
    pub api_server_url: Option<String>,
    /// Requeue period of applied runs.
    pub resync: Duration,
    /// This replica (Events' reporting instance).
    pub instance: String,
    /// The controller's namespace (start-up Events are about its Deployment there).
    pub namespace: String,
    /// After this long with nodes not enforcing a run's policy, an `EnforcementDelayed` Event.
    pub enforced_timeout: Duration,
    /// Retention of AuditEvents.
    pub retention: audit::Retention,
    /// The clock of expiry and timestamps (a fake one in tests).
    pub clock: reconcile::Clock,
    /// The PodSlice writer's settings, when it runs (`--pod-slices`).
    pub slices: Option<slices::SliceOptions>,
}

impl Options {
    /// Defaults with `enforce` and the cluster's configuration.
    pub fn new(enforce: EnforceMode, cluster: ClusterConfig) -> Self {
        Self {
            enforce,
            agent: AgentRef::default(),
            cluster,
            api_server_url: None,
            resync: Duration::from_secs(600),
            instance: FIELD_MANAGER.into(),
            namespace: "flock-system".into(),
            enforced_timeout: Duration::from_secs(60),
            retention: audit::Retention::default(),
            clock: reconcile::system_clock(),
            slices: None,
        }
    }
}

/// Why the controller cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    ApiServer(#[from] apiserver::ApiServerError),
    #[error("the cluster {what} {cidr} is invalid: {why}")]
    Cidr { what: &'static str, cidr: String, why: &'static str },
    /// The enforcer probe could not reach the API server: deciding "off" from a network
    /// blip would leave every new run unenforced until the next restart.
    #[error("the enforcer probe could not reach the API server: {0}")]
    ProbeUnreachable(probe::ProbeError),
}

impl StartError {
    /// Whether starting again later can succeed: the API server unreachable, overloaded
    /// or still without its endpoints. A bad flag, URL or CIDR, or an API answer that
    /// refuses (401, 403, 404), is permanent: the process exits and says why.
    pub fn retryable(&self) -> bool {
        use apiserver::ApiServerError as A;
        match self {
            Self::ApiServer(A::Resolve { .. } | A::NoAddress { .. }) | Self::ProbeUnreachable(_) => true,
            Self::ApiServer(A::List(e)) => transient(e),
            Self::ApiServer(A::NoHost { .. } | A::BadPort { .. }) | Self::Cidr { .. } => false,
        }
    }
}

/// A kube error that a later attempt may not see: no connection, a timeout, or the API
/// server's own "try again" answers (429 and 5xx).
pub(crate) fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => status.code == 429 || (500..=599).contains(&status.code),
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => true,
        _ => false,
    }
}

/// The waits between start attempts: 250 ms doubling to 30 s.
pub fn start_backoff(attempt: u32) -> Duration {
    Duration::from_millis(250u64.saturating_mul(1u64 << attempt.min(7))).min(Duration::from_secs(30))
}

/// [`start`] until it succeeds, fails for good ([`StartError::retryable`] false) or `stop`
/// turns true (`Ok(None)`). Every failed attempt is logged by name with the next wait, so an
/// operator sees why the controller is not Ready yet. A controller started beside a control
/// plane that is restarting (or before its endpoints exist) waits for it instead of exiting.
pub async fn start_until_ready(client: &Client, opts: &Options, mut stop: watch::Receiver<bool>) -> Result<Option<Startup>, StartError> {
    let mut attempt = 0u32;
    loop {
        if *stop.borrow() {
            return Ok(None);
        }
        match start(client, opts).await {
            Ok(s) => return Ok(Some(s)),
            Err(e) if e.retryable() => {
                let wait = start_backoff(attempt);
                tracing::warn!(error = %e, attempt = attempt + 1, retry_in_ms = wait.as_millis() as u64, "cannot start yet; retrying");
                attempt = attempt.saturating_add(1);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.wait_for(|s| *s) => return Ok(None),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// The start-up decisions.
#[derive(Debug, Clone)]
pub struct Startup {
    /// What new runs pin.
    pub decision: Decision,
    pub(crate) kind: PolicyKind,
    pub cluster: ClusterConfig,
    /// The API server addresses of the client configuration (kept when the EndpointSlices
    /// change).
    pub(crate) fixed_endpoints: BTreeSet<ApiEndpoint>,
    /// Whether runs' `Enforced` can be verified (flock-agent enforces and reports).
    pub verify: Verify,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("enforce", &self.enforce)
            .field("agent", &self.agent)
            .field("cluster", &self.cluster)
            .field("resync", &self.resync)
            .field("enforced_timeout", &self.enforced_timeout)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

/// Start-up: checks the configuration, finds the API server (none → error), decides
/// enforcement (probing in `auto`; a failed probe is an Event and means off) and the
/// policy kind.
pub async fn start(client: &Client, opts: &Options) -> Result<Startup, StartError> {
    for (what, cidrs) in [("pod CIDR", &opts.cluster.pod_cidrs), ("service CIDR", &opts.cluster.service_cidrs)] {
        for c in cidrs {
            if c.prefix_len() == 0 {
                return Err(StartError::Cidr { what, cidr: c.to_string(), why: "it would except the whole internet" });
            }
            if c.trunc() != *c {
                return Err(StartError::Cidr { what, cidr: c.to_string(), why: "host bits are set" });
            }
        }
    }
    let fixed_endpoints = match &opts.api_server_url {
        Some(url) => apiserver::from_url(url).await?,
        None => BTreeSet::new(),
    };
    let api_server = apiserver::discover(client, &fixed_endpoints, opts.api_server_url.as_deref()).await?;
    tracing::info!(addresses = %apiserver::describe(&api_server), "API server addresses");

    let probe_result = match opts.enforce {
        EnforceMode::Auto => Some(probe::probe(client, &opts.agent).await),
        _ => None,
    };
    let probe_result = match probe_result {
        Some(Err(e)) if transient(e.kube_error()) => return Err(StartError::ProbeUnreachable(e)),
        other => other,
    };
    if let Some(Err(e)) = &probe_result {
        tracing::error!(error = %e, "the enforcer probe failed: policies of new runs will not be enforced");
        let recorder = Recorder::new(client.clone(), reporter(&opts.instance));
        let deployment = ObjectReference {
            api_version: Some("apps/v1".into()),
            kind: Some("Deployment".into()),
            name: Some(FIELD_MANAGER.into()),
            namespace: Some(opts.namespace.clone()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: PROBE_FAILED_REASON.into(),
            note: Some(format!(
                "{e}: policies of new runs will not be enforced (restart flock-controller to probe again, or set --enforce=on)"
            )),
            action: "Probe".into(),
            secondary: None,
        };
        if let Err(pe) = recorder.publish(&event, &deployment).await {
            tracing::warn!(error = %pe, "publishing the EnforcerProbeFailed event");
        }
    }
    let decision = probe::decide(opts.enforce, probe_result.as_ref());
    tracing::info!(mode = opts.enforce.as_str(), enabled = decision.enabled, reason = %decision.reason, "enforcement decision for new runs");
    let kind = probe::policy_kind(client).await;
    tracing::info!(kind = kind.kind(), "policy kind");
    let verify = probe::verification(client, &decision, &kind, probe_result.as_ref().and_then(|r| r.as_ref().ok())).await;
    match &verify {
        Verify::Flock => tracing::info!("flock-agent enforces: runs' Enforced condition follows the nodes' FlockNodes"),
        Verify::Unknown { message, .. } => tracing::info!(why = %message, "runs' Enforced condition is Unknown"),
    }
    let mut cluster = opts.cluster.clone();
    cluster.api_server = api_server;
    Ok(Startup { decision, kind, cluster, fixed_endpoints, verify })
}

/// The reporter of the controller's Events.
pub(crate) fn reporter(instance: &str) -> Reporter {
    Reporter { controller: FIELD_MANAGER.into(), instance: Some(instance.to_string()) }
}

/// A future that ends when `stop` turns true (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Runs the Run and RunProfile controllers (and the API server address follower) until
/// `stop`. The metrics are the caller's (its `/metrics`, and tests, read them).
pub async fn run(client: Client, startup: Startup, opts: &Options, metrics: Arc<Metrics>, stop: watch::Receiver<bool>) {
    // API server addresses follow the EndpointSlices; every run is re-rendered on a change.
    let (cluster_tx, cluster_rx) = watch::channel(startup.cluster.clone());
    let follower = tokio::spawn(apiserver::follow(client.clone(), startup.fixed_endpoints.clone(), cluster_tx));
    let reconcile_all = futures::stream::unfold(cluster_rx.clone(), |mut rx| async move {
        rx.changed().await.ok()?;
        Some(((), rx))
    });

    metrics.enforcement(startup.decision.enabled);
    let (profile_feed, [profiles_for_runs, profiles_for_profiles]) =
        Feed::<RunProfile>::new(Api::all(client.clone()), watcher::Config::default(), true);
    let (run_store, run_writer) = reflector::store::<Run>();
    // Run pods and FlockNodes: whether each run's nodes enforce its policy. Only pods
    // labelled flock.dev/run (every run's pods carry it), and only while flock reports.
    let verifying = startup.verify == Verify::Flock;
    let (pods, [pod_events]) =
        Feed::<Pod>::new(Api::all(client.clone()), watcher::Config::default().labels(crate::model::RUN_LABEL), verifying);
    let (nodes, [node_events]) = Feed::<FlockNode>::new(Api::all(client.clone()), watcher::Config::default(), verifying);
    let (complete_tx, enforcement_complete) = watch::channel(!verifying);
    let caches = reconcile::Caches {
        profiles: profile_feed.store.clone(),
        profiles_complete: profile_feed.complete.clone(),
        runs: run_store.clone(),
        pods: pods.store.clone(),
        nodes: nodes.store.clone(),
        enforcement_complete,
    };
    let mut ctx = reconcile::Context::new(
        client.clone(),
        cluster_rx,
        startup.decision.clone(),
        startup.kind.clone(),
        Recorder::new(client.clone(), reporter(&opts.instance)),
        metrics.clone(),
        caches,
    );
    ctx.resync = opts.resync;
    ctx.verify = startup.verify.clone();
    ctx.enforced_timeout = opts.enforced_timeout;
    ctx.clock = opts.clock.clone();
    let ctx = Arc::new(ctx);
    {
        let (mut a, mut b) = (pods.complete.clone(), nodes.complete.clone());
        tokio::spawn(async move {
            if a.wait_for(|c| *c).await.is_ok() && b.wait_for(|c| *c).await.is_ok() {
                complete_tx.send_replace(true);
            }
        });
    }

    // The run controller's own watch, reflected here (as `Controller::new` would) so that
    // the backoff of a deleted run can be forgotten: each event after the cache has it.
    let observer = ctx.clone();
    let run_events = watcher(Api::<Run>::all(client.clone()), watcher::Config::default())
        .reflect(run_writer)
        .inspect(move |event| {
            if let Ok(event) = event {
                observer.observe_run(event);
            }
        })
        .applied_objects();
    let owned = watcher::Config::default().labels(&render::managed_selector());
    let runs = Controller::for_stream(run_events, run_store.clone());
    let runs = match &startup.kind {
        PolicyKind::NetworkPolicy => runs.owns(Api::<NetworkPolicy>::all(client.clone()), owned),
        PolicyKind::Cilium(ar) => runs.owns_with(Api::<DynamicObject>::all_with(client.clone(), ar), ar.clone(), owned),
    };
    let runs = runs
        .watches_stream(profiles_for_runs, {
            let run_store = run_store.clone();
            move |profile: RunProfile| {
                // A profile change (creation, deletion) re-renders the runs that use it.
                let name = profile.name_any();
                run_store.state().into_iter().filter(|r| r.spec.profile == name).map(|r| ObjectRef::from_obj(&*r)).collect::<Vec<_>>()
            }
        })
        .watches_stream(pod_events, {
            let run_store = run_store.clone();
            // A run pod scheduled, finished or gone: its runs' nodes changed.
            move |pod: Pod| runs_of_pod(&run_store, &pod)
        })
        .watches_stream(node_events, {
            let run_store = run_store.clone();
            // A node's report changed: the runs whose policies it lists (a run whose pods
            // are there but whose policy it does not list yet stays pending until it does;
            // pods leaving a node are pod events).
            move |node: FlockNode| runs_of_report(&run_store, &node)
        })
        .reconcile_all_on(reconcile_all)
        .graceful_shutdown_on(stopped(stop.clone()))
        .run(reconcile::reconcile_run, reconcile::run_error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "run controller");
            }
        });
    let profiles = Controller::for_stream(profiles_for_profiles, profile_feed.store)
        .graceful_shutdown_on(stopped(stop.clone()))
        .run(reconcile::reconcile_profile, reconcile::profile_error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "profile controller");
            }
        });
    let collector = tokio::spawn(collect_audit_events(client.clone(), opts.retention, opts.clock.clone(), metrics.clone()));
    // The PodSlice writer, leader-only like the rest: two writers would fight over placement.
    let slice_writer = opts.slices.clone().map(|o| tokio::spawn(slices::run(client.clone(), o, metrics.clone(), stop.clone())));
    tracing::info!("controllers running");
    // Stopping lets reconciles in flight finish, but not forever: a request the API server
    // never answers must not keep a replica that lost its Lease, or got SIGTERM, working.
    let bounded_stop = async {
        stopped(stop).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        _ = async { futures::join!(runs, profiles) } => tracing::info!("controllers stopped"),
        () = profile_feed.feed => tracing::error!("the RunProfile watch ended"),
        () = pods.feed => tracing::error!("the run pod watch ended"),
        () = nodes.feed => tracing::error!("the FlockNode watch ended"),
        () = bounded_stop => tracing::warn!(grace = ?SHUTDOWN_GRACE, "reconciles still in flight after the grace period; stopping anyway"),
    }
    follower.abort();
    collector.abort();
    if let Some(w) = slice_writer {
        w.abort();
    }
}

/// How many changes may wait for each consumer of a [`Feed`] (the feed waits when one is
/// behind; nothing is dropped).
const FEED_BUFFER: usize = 64;

/// The runs (in the pod's namespace) whose selector selects `pod`.
fn runs_of_pod(runs: &Store<Run>, pod: &Pod) -> Vec<ObjectRef<Run>> {
    let namespace = pod.namespace();
    runs.state()
        .into_iter()
        .filter(|r| r.namespace() == namespace)
        .filter(|r| render::run_selector(r).ok().as_ref().and_then(enforced::compile).is_some_and(|s| enforced::selects(&s, pod)))
        .map(|r| ObjectRef::from_obj(&*r))
        .collect()
}

/// The runs whose policies a FlockNode lists (`namespace/<run>-egress`).
fn runs_of_report(runs: &Store<Run>, node: &FlockNode) -> Vec<ObjectRef<Run>> {
    let listed = node.status.iter().flat_map(|s| &s.run_policies);
    let mut out = Vec::new();
    for entry in listed {
        let Some((namespace, policy)) = entry.name.split_once('/') else { continue };
        // The policy's name is the run's plus a suffix, except for very long names (hashed):
        // those are found by a scan of the namespace's runs.
        let direct = policy
            .strip_suffix(render::POLICY_SUFFIX)
            .and_then(|run| runs.get(&ObjectRef::new(run).within(namespace)))
            .filter(|r| render::policy_name(&r.name_any()) == policy);
        let found: Vec<Arc<Run>> = match direct {
            Some(r) => vec![r],
            None => runs
                .state()
                .into_iter()
                .filter(|r| r.namespace().as_deref() == Some(namespace) && render::policy_name(&r.name_any()) == policy)
                .collect(),
        };
        for r in found {
            let r = ObjectRef::from_obj(&*r);
            if !out.contains(&r) {
                out.push(r);
            }
        }
    }
    out
}

/// One watch that fills a cache and triggers its consumers, each change only after the cache
/// has it (deletions included: the runs of a deleted profile learn it is gone). Two watches,
/// one for the cache and one for the triggers, could wake a reconcile before its cache showed
/// the change, and it would then wait for a change that had come. RunProfiles feed both
/// controllers — the profile controller (`Ready` conditions) and the run controller (the runs
/// using a changed profile); run pods and FlockNodes feed the run controller (`Enforced`).
/// `enabled` false: an empty cache, no watch, never complete.
struct Feed<K: kube::Resource + Clone + 'static>
where
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    store: Store<K>,
    /// True once `store` holds a complete list (until then, reconciles that need it wait).
    complete: watch::Receiver<bool>,
    /// Drives the watch; runs for as long as the controllers do.
    feed: futures::future::BoxFuture<'static, ()>,
}

/// The changes a [`Feed`] sends one consumer.
type Changes<K> = futures::stream::BoxStream<'static, Result<K, watcher::Error>>;

impl<K> Feed<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default + Send + Sync,
{
    /// The feed and the changes for each of its `N` consumers.
    fn new<const N: usize>(api: Api<K>, config: watcher::Config, enabled: bool) -> (Self, [Changes<K>; N]) {
        let (store, writer) = reflector::store::<K>();
        let (complete_tx, complete) = watch::channel(false);
        let mut senders = Vec::with_capacity(N);
        let events = std::array::from_fn(|_| {
            let (tx, rx) = mpsc::channel(FEED_BUFFER);
            senders.push(tx);
            receiver_stream(rx)
        });
        let kind = K::kind(&K::DynamicType::default()).to_string();
        let feed = async move {
            if !enabled {
                return std::future::pending().await;
            }
            let events = watcher(api, config).default_backoff().reflect(writer);
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                let object = match event {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o) | watcher::Event::Delete(o)) => o,
                    Ok(watcher::Event::InitDone) => {
                        complete_tx.send_replace(true);
                        continue;
                    }
                    Ok(watcher::Event::Init) => continue,
                    // The watcher retries (with backoff).
                    Err(e) => {
                        tracing::warn!(error = %e, "watching {kind}s");
                        continue;
                    }
                };
                // A send fails only once that consumer has stopped.
                for tx in &senders {
                    let _ = tx.send(object.clone()).await;
                }
            }
        };
        (Self { store, complete, feed: Box::pin(feed) }, events)
    }
}

/// Applies AuditEvent retention every `retention.interval` (while this replica leads).
async fn collect_audit_events(client: Client, retention: audit::Retention, clock: reconcile::Clock, metrics: Arc<Metrics>) {
    let mut tick = tokio::time::interval(retention.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match audit::collect(&client, clock(), &retention).await {
            Ok(0) => {}
            Ok(n) => {
                metrics.audit_collected(n);
                tracing::info!(deleted = n, "AuditEvents past their retention deleted");
            }
            Err(e) => {
                metrics.audit_collection_failed();
                tracing::warn!(error = %e, "AuditEvent retention failed; the next pass tries again");
            }
        }
    }
}

fn receiver_stream<T: Send + 'static>(rx: mpsc::Receiver<T>) -> futures::stream::BoxStream<'static, Result<T, watcher::Error>> {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (Ok(item), rx)) }).boxed()
}

/// How long stopping waits for reconciles in flight. With client-go's lease timing (renew
/// deadline 10 s, lease 15 s) a leader that lost its Lease stops within 13 s of its last
/// renewal, before a follower may take over.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_secs(3);

/// What `/healthz` and `/readyz` report.
#[derive(Debug, Default)]
pub struct Health {
    /// Start-up finished (API server found, decisions made).
    pub started: AtomicBool,
    /// This replica leads.
    pub leading: AtomicBool,
}

/// The HTTP endpoints: `/healthz` (the process serves; leadership and start-up state in
/// the body), `/readyz` (start-up finished: followers are ready too, so a rolling update
/// proceeds), `/metrics`.
pub fn handler(health: Arc<Health>, metrics: Arc<Metrics>) -> Handler {
    Arc::new(move |path: &str| {
        let started = health.started.load(Ordering::SeqCst);
        let leading = health.leading.load(Ordering::SeqCst);
        match path {
            "/healthz" => json_response(hyper::StatusCode::OK, json!({"status": "ok", "started": started, "leader": leading})),
            "/readyz" => json_response(
                if started { hyper::StatusCode::OK } else { hyper::StatusCode::SERVICE_UNAVAILABLE },
                json!({"ready": started, "leader": leading}),
            ),
            "/metrics" => metrics_response(metrics.encode()),
            _ => json_response(hyper::StatusCode::NOT_FOUND, json!({"error": "not found", "paths": ["/healthz", "/readyz", "/metrics"]})),
        }
    })
}
