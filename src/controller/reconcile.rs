//! One reconcile of a Run, as a chain of small steps (Oz's request controller, in Rust):
//!
//! 1. [`pin`] — the run's enforcement decision: the one in its status, else the
//!    controller's current one. Never changed once written.
//! 2. Not enforced → [`remove_policies`] (a stale `<run>-egress` the run owns), condition
//!    `Disabled`.
//! 3. [`cached_profile`] — from the RunProfile cache, never a live read; missing →
//!    condition `ProfileNotFound` (only once the cache holds a complete list: before that
//!    the reconcile waits) and a policy that allows nothing: grants come only from profiles
//!    that exist (deleting one revokes it). An expired run needs no profile.
//! 4. [`render::plan`], [`desired`] — render (pure); an invalid run → `RunInvalid` (the last
//!    applied policy stays), an invalid profile → `ProfileInvalid` and a policy that allows
//!    nothing. Past the run's deadline ([`expires_at`], read on the
//!    context's clock) the plan is withdrawn: the policy allows nothing — also when the
//!    profile is missing or invalid, and when the run itself is invalid (fail closed: it keeps
//!    `RunInvalid`, and the policy keeps selecting the pods it selected, [`live_selector`]).
//! 5. [`apply`] — server-side apply with the fixed field manager, forced: whatever else
//!    changed in the fields the controller owns is reverted. An API error → `ApplyFailed`,
//!    requeued with backoff.
//! 6. [`record`] — compares the applied policy's uid with the one in the run's status: none
//!    recorded → the first creation; a different one → the policy had been applied and was
//!    deleted (withdrawn) and is now re-created; the same → an update or a no-op. A creation
//!    or re-creation is [`confirm`]ed against the run read afresh (the cache may not show
//!    the controller's own last status write yet).
//! 7. [`remove_policies`] of the other kind (a CiliumNetworkPolicy run never also has a
//!    NetworkPolicy); then the audit trail ([`super::audit`]): a grant, change, withdrawal or
//!    expiry against the last recorded grant is written as an AuditEvent.
//! 8. `Enforced` from the nodes' FlockNodes ([`super::enforced`]), [`conditions`] from the
//!    outcome, then one status write, only when something changed.
//! 9. Withdrawn → exactly one Warning Event `NetworkPolicyWithdrawn`, after the status
//!    write: the new uid is recorded first, so a failed event cannot cause a second one
//!    (events fail open, like Paddock's audits), and a no-op pass never emits one. The
//!    audited changes' Events, and `EnforcementDelayed` once nodes lag past the timeout.
//!
//! User errors (2, 3, 4) write their condition and wait for a change of the run or of its
//! profile (the controller watches profiles) or for the run's deadline: no hot loop; an
//! invalid run's earlier policy stays in place until the deadline, a run whose profile is
//! missing or invalid has one that allows nothing. API errors requeue with a per-run
//! exponential backoff ([`Backoffs`]: forgotten on success, on the run's deletion, and when a
//! relist no longer has the run).
//! A RunProfile's reconcile only checks it and writes its `Ready` condition.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::watch;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::SignedDuration;

use super::audit::{self, AuditError, Change};
use super::enforced::{self, Judgement, Verify};
use super::metrics::{ApplyResult, Metrics};
use super::probe::{Decision, PolicyKind};
use super::render::{self, ClusterConfig, RenderError};
use super::{FIELD_MANAGER, WITHDRAWN_REASON};
use crate::crd::{
    self, AppliedPolicy, AuditAction, AuditPolicy, AuditProfile, Enforcement, FlockNode, Run, RunProfile, RunStatus, Selector,
};

/// Condition types.
pub const NETWORK_POLICY_READY: &str = "NetworkPolicyReady";
pub const READY: &str = "Ready";
pub const ENFORCED: &str = "Enforced";
pub const EXPIRED: &str = "Expired";

/// The reason of the Warning Event for a policy that nodes take too long to enforce.
pub(crate) const DELAYED_REASON: &str = "EnforcementDelayed";

/// The controller's clock (a fake one in tests): expiry and timestamps read it.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// The wall clock.
pub fn system_clock() -> Clock {
    Arc::new(Timestamp::now)
}

/// A timestamp as conditions and statuses write it (RFC 3339, seconds).
pub fn format_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Reasons of `NetworkPolicyReady` (and of `Ready` when it is False).
pub(crate) mod reason {
    pub(crate) const APPLIED: &str = "Applied";
    pub(crate) const DISABLED: &str = "Disabled";
    pub(crate) const PROFILE_NOT_FOUND: &str = "ProfileNotFound";
    pub(crate) const PROFILE_INVALID: &str = "ProfileInvalid";
    pub(crate) const RUN_INVALID: &str = "RunInvalid";
    pub(crate) const APPLY_FAILED: &str = "ApplyFailed";
    /// A policy of the run's policy name exists and the run does not control it.
    pub(crate) const POLICY_NAME_TAKEN: &str = "PolicyNameTaken";
    /// `Ready` of a run whose enforcement is disabled: nothing to wait for.
    pub(crate) const ENFORCEMENT_DISABLED: &str = "EnforcementDisabled";
    /// `Ready` of a run whose nodes do not all enforce its policy yet.
    pub(crate) const NOT_ENFORCED: &str = "NotEnforced";
    /// `Expired`, and `Ready` of an expired run.
    pub(crate) const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
    pub(crate) const ACTIVE: &str = "Active";
    pub(crate) const NO_DEADLINE: &str = "NoDeadline";
    /// RunProfile `Ready`.
    pub(crate) const VALID: &str = "Valid";
    pub(crate) const INVALID: &str = "Invalid";
}

/// Everything a reconcile needs.
pub(crate) struct Context {
    pub(crate) client: Client,
    /// The cluster configuration (the API server's addresses follow its EndpointSlices).
    pub(crate) cluster: watch::Receiver<ClusterConfig>,
    /// What new runs pin.
    pub(crate) decision: Decision,
    pub(crate) kind: PolicyKind,
    pub(crate) recorder: Recorder,
    pub(crate) metrics: Arc<Metrics>,
    /// Requeue period of a run whose policy is applied (the owned-policy watch reacts at
    /// once; this is the safety net).
    pub(crate) resync: Duration,
    /// The caches the reconciles read.
    pub(crate) caches: Caches,
    /// Whether `Enforced` can be verified here (flock-agent reports FlockNodes).
    pub(crate) verify: Verify,
    /// After this long with nodes still pending, a Warning Event `EnforcementDelayed`.
    pub(crate) enforced_timeout: Duration,
    pub(crate) clock: Clock,
    /// Backoff of runs whose last reconcile failed.
    backoffs: Mutex<Backoffs>,
    /// Runs whose nodes do not all enforce their policy yet, by run uid.
    delays: Mutex<HashMap<String, Delay>>,
}

/// Since when a run's policy generation has been pending on some node.
#[derive(Debug, Clone, Copy)]
struct Delay {
    generation: i64,
    since: Instant,
    reported: bool,
}

/// The controller's caches (reflector stores), fed by its watches.
#[derive(Clone)]
pub(crate) struct Caches {
    /// Every RunProfile: step 3 reads the run's profile here.
    pub(crate) profiles: Store<RunProfile>,
    /// Turns true once `profiles` holds a complete list, and stays true (a relist swaps
    /// its new list in whole). Not `Store::wait_until_ready`: that wakes one waiter only,
    /// and the profile controller waits on it too.
    pub(crate) profiles_complete: watch::Receiver<bool>,
    /// Every Run (the run controller's own cache): a failure is recorded only for a run that
    /// is still here.
    pub(crate) runs: Store<Run>,
    /// The pods labelled `flock.dev/run` (every run pod: see [`crd::requires_run_label`]),
    /// and every FlockNode: whether the run's nodes enforce its policy.
    pub(crate) pods: Store<Pod>,
    pub(crate) nodes: Store<FlockNode>,
    /// True once both hold a complete list.
    pub(crate) enforcement_complete: watch::Receiver<bool>,
}

impl Context {
    pub(crate) fn new(
        client: Client,
        cluster: watch::Receiver<ClusterConfig>,
        decision: Decision,
        kind: PolicyKind,
        recorder: Recorder,
        metrics: Arc<Metrics>,
        caches: Caches,
    ) -> Self {
        Self {
            client,
            cluster,
            decision,
            kind,
            recorder,
            metrics,
            resync: Duration::from_secs(600),
            caches,
            verify: Verify::Unknown { reason: enforced::reason::NOT_FLOCK, message: "not probed".into() },
            enforced_timeout: Duration::from_secs(60),
            clock: system_clock(),
            backoffs: Mutex::new(Backoffs::default()),
            delays: Mutex::new(HashMap::new()),
        }
    }

    fn delays(&self) -> MutexGuard<'_, HashMap<String, Delay>> {
        self.delays.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes a run's `Enforced` judgement for `generation`; `Some(wait)` while pending: the
    /// time left before `EnforcementDelayed` is due (zero: due now, and not reported yet).
    fn pending_for(&self, run: &Run, generation: i64, judgement: &Judgement) -> Option<Duration> {
        let uid = backoff_key(run);
        let mut delays = self.delays();
        if judgement.status != crd::FALSE {
            delays.remove(&uid);
            return None;
        }
        let d = delays.entry(uid).or_insert(Delay { generation, since: Instant::now(), reported: false });
        if d.generation != generation {
            *d = Delay { generation, since: Instant::now(), reported: false };
        }
        if d.reported {
            return None;
        }
        Some(self.enforced_timeout.saturating_sub(d.since.elapsed()))
    }

    fn delay_reported(&self, run: &Run) {
        if let Some(d) = self.delays().get_mut(&backoff_key(run)) {
            d.reported = true;
        }
    }

    fn backoffs(&self) -> MutexGuard<'_, Backoffs> {
        self.backoffs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes the backoffs under their lock, and publishes how many runs are in backoff.
    fn change_backoffs<T>(&self, change: impl FnOnce(&mut Backoffs) -> T) -> T {
        let mut b = self.backoffs();
        let out = change(&mut b);
        self.metrics.runs_in_backoff(b.entries.len());
        out
    }

    /// Follows the run watch (each event after the run cache has it): a deleted run's
    /// backoff goes, and after a (re)list — which reports no deletions of its own, so a run
    /// deleted while the watch was down leaves no event — every backoff of a run the cache
    /// no longer has goes too.
    pub(crate) fn observe_run(&self, event: &watcher::Event<Run>) {
        match event {
            watcher::Event::Delete(run) => {
                self.delays().remove(&backoff_key(run));
                self.change_backoffs(|b| b.forget(run))
            }
            watcher::Event::InitDone => self.change_backoffs(|b| {
                let present: std::collections::HashSet<String> = self.caches.runs.state().iter().map(|r| backoff_key(r)).collect();
                b.entries.retain(|k, _| present.contains(k));
            }),
            watcher::Event::Apply(_) | watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }
}

/// Consecutive failures of runs and when the last one was, by run uid (a run deleted and
/// created again under its name starts afresh). An entry lives only while its run fails and
/// exists: it goes on success and on the run's deletion ([`Context::observe_run`]).
#[derive(Debug, Default)]
pub(crate) struct Backoffs {
    entries: HashMap<String, (u32, Instant)>,
}

impl Backoffs {
    /// How long `run` still has to wait, if it is in backoff.
    fn remaining(&self, run: &Run) -> Option<Duration> {
        let (n, at) = self.entries.get(&backoff_key(run))?;
        backoff(*n).checked_sub(at.elapsed()).filter(|w| !w.is_zero())
    }

    /// Records a failure; the number of consecutive failures.
    fn failed(&mut self, run: &Run) -> u32 {
        let entry = self.entries.entry(backoff_key(run)).or_insert((0, Instant::now()));
        *entry = (entry.0.saturating_add(1), Instant::now());
        entry.0
    }

    fn forget(&mut self, run: &Run) {
        self.entries.remove(&backoff_key(run));
    }
}

/// A run's key in [`Backoffs`]: its uid (every run from the API server has one).
fn backoff_key(run: &Run) -> String {
    run.uid().unwrap_or_else(|| key(run))
}

/// A reconcile that must be retried (API errors; the run itself is fine).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReconcileError {
    #[error("reading RunProfile {profile}: the RunProfile cache stopped before it was complete")]
    ProfileCache { profile: String },
    #[error("applying {kind} {namespace}/{name}: {error}")]
    Apply { kind: String, namespace: String, name: String, error: kube::Error },
    #[error("the API server returned {kind} {namespace}/{name} without a uid")]
    NoUid { kind: String, namespace: String, name: String },
    #[error("deleting stale {kind} {namespace}/{name}: {error}")]
    Delete { kind: String, namespace: String, name: String, error: kube::Error },
    #[error("reading {kind} {namespace}/{name}: {error}")]
    Read { kind: String, namespace: String, name: String, error: kube::Error },
    #[error("reading Run {name}: {error}")]
    Run { name: String, error: kube::Error },
    #[error("writing the status of {kind} {name}: {error}")]
    Status { kind: &'static str, name: String, error: kube::Error },
    #[error("encoding {what}: {error}")]
    Encode { what: String, error: serde_json::Error },
    #[error(transparent)]
    Audit(#[from] AuditError),
    #[error("run {run}: the pod and FlockNode caches stopped before they were complete")]
    EnforcementCache { run: String },
}

impl ReconcileError {
    /// Whether the run's `NetworkPolicyReady` should say `ApplyFailed` (a write of its
    /// policy failed), rather than keep what it said (a transient read error).
    fn is_apply(&self) -> bool {
        matches!(self, Self::Apply { .. } | Self::NoUid { .. } | Self::Delete { .. } | Self::Encode { .. })
    }
}

/// How a pass ended (when no API error stopped it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Applied {
        policy: AppliedPolicy,
        result: ApplyResult,
        previous: Option<Box<AppliedPolicy>>,
        /// The run's deadline passed: the policy allows nothing.
        expired: bool,
        /// The AuditEvents written by this pass.
        recorded: Vec<Change>,
        /// The pods the policy selects.
        selector: Selector,
        /// The run is invalid, or its profile missing or invalid (condition reason and
        /// message): the policy applied allows nothing.
        invalid: Option<(&'static str, String)>,
    },
    Disabled,
    /// The user's to fix: a condition says what, and nothing happens until a change.
    UserError {
        reason: &'static str,
        message: String,
    },
}

/// When `run` expires: `spec.activeDeadlineSeconds` after its creation.
pub(crate) fn expires_at(run: &Run) -> Option<Timestamp> {
    let secs = run.spec.active_deadline_seconds?;
    let created = run.meta().creation_timestamp.as_ref()?.0;
    created.checked_add(SignedDuration::from_secs(secs)).ok()
}

/// Step 1: the run's pinned decision, or `current` for a run that has none yet.
pub(crate) fn pin(status: &RunStatus, current: &Decision) -> Enforcement {
    status.enforcement.clone().unwrap_or_else(|| Enforcement {
        enabled: current.enabled,
        mode: current.mode.as_str().to_string(),
        reason: current.reason.clone(),
    })
}

/// Step 3: the run's profile from the RunProfile cache, `None` when it does not exist.
/// Waits until the cache holds a complete list: before that, a profile missing from it may
/// exist, and reporting `ProfileNotFound` would be false.
pub(crate) async fn cached_profile(caches: &Caches, name: &str) -> Result<Option<Arc<RunProfile>>, ReconcileError> {
    let mut complete = caches.profiles_complete.clone();
    complete.wait_for(|c| *c).await.map_err(|_| ReconcileError::ProfileCache { profile: name.to_string() })?;
    Ok(caches.profiles.get(&ObjectRef::new(name)))
}

/// Step 4 (pure): the object to apply for a run's plan (`render::plan`), of `kind`, as JSON.
pub(crate) fn desired(plan: &render::Plan, kind: &PolicyKind) -> Result<Value, serde_json::Error> {
    match kind {
        PolicyKind::NetworkPolicy => serde_json::to_value(render::network_policy(plan)),
        PolicyKind::Cilium(_) => Ok(render::cilium_network_policy(plan)),
    }
}

/// The run's user error, as a condition reason and message.
pub fn user_error(e: &RenderError) -> (&'static str, String) {
    match e {
        RenderError::Profile { .. } => (reason::PROFILE_INVALID, e.to_string()),
        RenderError::Run { .. } | RenderError::Incomplete { .. } => (reason::RUN_INVALID, e.to_string()),
    }
}

fn policy_api(client: &Client, namespace: &str, kind: &PolicyKind) -> Api<DynamicObject> {
    match kind {
        PolicyKind::NetworkPolicy => Api::namespaced_with(client.clone(), namespace, &kube::api::ApiResource::erase::<NetworkPolicy>(&())),
        PolicyKind::Cilium(ar) => Api::namespaced_with(client.clone(), namespace, ar),
    }
}

/// Step 5: server-side apply of `object` (forced, field manager `flock-controller`); the
/// applied policy as the API server stored it.
pub(crate) async fn apply(client: &Client, kind: &PolicyKind, object: &Value) -> Result<AppliedPolicy, ReconcileError> {
    let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default().to_string();
    let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let api = policy_api(client, &namespace, kind);
    let written = api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(object)).await.map_err(|error| {
        ReconcileError::Apply { kind: kind.kind().to_string(), namespace: namespace.clone(), name: name.clone(), error }
    })?;
    let uid = written.uid().ok_or_else(|| ReconcileError::NoUid { kind: kind.kind().to_string(), namespace, name: name.clone() })?;
    let generation = written.metadata.generation;
    Ok(AppliedPolicy { api_version: kind.api_version().to_string(), kind: kind.kind().to_string(), name, uid, generation })
}

/// Step 6 (pure): what the apply was, judged by the uid recorded in the run's status.
pub(crate) fn record(previous: Option<&AppliedPolicy>, applied: &AppliedPolicy) -> ApplyResult {
    match previous {
        None => ApplyResult::Created,
        // Recorded for another kind or name (the controller's configuration changed): a
        // first creation of this one, not a withdrawal.
        Some(p) if p.kind != applied.kind || p.name != applied.name => ApplyResult::Created,
        Some(p) if p.uid != applied.uid => ApplyResult::Recreated,
        Some(_) => ApplyResult::Applied,
    }
}

/// Step 6, confirmed: a creation or re-creation is judged again against the run's status
/// as the API server has it now. The controller's cache may not show yet the status its
/// previous pass wrote (each pass's own writes trigger the next one), and judging from it
/// would count one creation twice or report a withdrawal that never happened. Returns the
/// result and the policy recorded before.
pub(crate) async fn confirm(
    client: &Client,
    run: &Run,
    applied: &AppliedPolicy,
    cached: Option<AppliedPolicy>,
) -> Result<(ApplyResult, Option<AppliedPolicy>), ReconcileError> {
    let result = record(cached.as_ref(), applied);
    if result == ApplyResult::Applied {
        return Ok((result, cached));
    }
    let fresh = Api::<Run>::namespaced(client.clone(), &run.namespace().unwrap_or_default())
        .get_opt(&run.name_any())
        .await
        .map_err(|error| ReconcileError::Run { name: key(run), error })?;
    let recorded = fresh.and_then(|r| r.status?.network_policy);
    Ok((record(recorded.as_ref(), applied), recorded))
}

/// Whether `obj` is controlled by the object with uid `owner`.
fn owned_by(obj: &DynamicObject, owner: &str) -> bool {
    obj.owner_references().iter().any(|o| o.uid == owner && o.controller == Some(true))
}

/// Step 5's guard: who holds the run's policy name of `kind` when the run does not control
/// the object there (`None`: no object, or the run's own).
pub(crate) async fn foreign_policy(client: &Client, run: &Run, kind: &PolicyKind) -> Result<Option<String>, ReconcileError> {
    let (Some(namespace), Some(run_uid)) = (run.namespace(), run.uid()) else { return Ok(None) };
    let name = render::policy_name(&run.name_any());
    let api = policy_api(client, &namespace, kind);
    let live = api.get_opt(&name).await.map_err(|error| ReconcileError::Read { kind: kind.kind().to_string(), namespace, name, error })?;
    Ok(live.filter(|obj| !owned_by(obj, &run_uid)).map(|obj| match obj.owner_references().iter().find(|o| o.controller == Some(true)) {
        Some(o) => format!("controlled by {} {} uid {}", o.kind, o.name, o.uid),
        None => "controlled by no one: made by hand or by another tool".to_string(),
    }))
}

/// Step 4, for an invalid run past its deadline: the pod selector of the run's policy of
/// `kind` as it is, when the run controls one (not empty: that would select the whole
/// namespace). Those pods had its egress, so its withdrawal keeps selecting them, whatever
/// the run's selector says now.
pub(crate) async fn live_selector(client: &Client, run: &Run, kind: &PolicyKind) -> Result<Option<Selector>, ReconcileError> {
    let (Some(namespace), Some(run_uid)) = (run.namespace(), run.uid()) else { return Ok(None) };
    let name = render::policy_name(&run.name_any());
    let api = policy_api(client, &namespace, kind);
    let live = api.get_opt(&name).await.map_err(|error| ReconcileError::Read { kind: kind.kind().to_string(), namespace, name, error })?;
    let field = match kind {
        PolicyKind::NetworkPolicy => "podSelector",
        PolicyKind::Cilium(_) => "endpointSelector",
    };
    Ok(live
        .filter(|o| owned_by(o, &run_uid))
        .and_then(|o| serde_json::from_value::<Selector>(o.data["spec"][field].clone()).ok())
        .filter(|s| !s.is_empty()))
}

/// Steps 2 and 7: deletes the run's policy of each of `kinds` when it exists and the run
/// controls it (a same-named object someone else made is left alone). Returns how many
/// were deleted.
pub(crate) async fn remove_policies(client: &Client, run: &Run, kinds: &[PolicyKind]) -> Result<usize, ReconcileError> {
    let (Some(namespace), Some(run_uid)) = (run.namespace(), run.uid()) else { return Ok(0) };
    let name = render::policy_name(&run.name_any());
    let mut deleted = 0;
    for kind in kinds {
        let api = policy_api(client, &namespace, kind);
        let err = |error| ReconcileError::Delete { kind: kind.kind().to_string(), namespace: namespace.clone(), name: name.clone(), error };
        let Some(obj) = api.get_opt(&name).await.map_err(err)? else { continue };
        if !owned_by(&obj, &run_uid) {
            continue;
        }
        let dp = DeleteParams { preconditions: Some(Preconditions { uid: obj.uid(), resource_version: None }), ..DeleteParams::default() };
        match api.delete(&name, &dp).await {
            Ok(_) => deleted += 1,
            // Gone already, or replaced meanwhile by an object that is not this one.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(err(e)),
        }
    }
    Ok(deleted)
}

/// Step 8 (pure): the conditions of an outcome, the run's expiry and the `Enforced`
/// judgement.
pub(crate) fn conditions(status: &mut RunStatus, outcome: &Outcome, enforced: &Judgement, generation: Option<i64>, now: &str) {
    let (np_ok, np_reason, np_message) = match outcome {
        Outcome::Applied { policy, invalid: Some((reason, message)), expired, .. } => (
            false,
            *reason,
            format!(
                "{message}; {}{} {} allows nothing (uid {}, generation {})",
                if *expired { "past the run's deadline " } else { "" },
                policy.kind,
                policy.name,
                policy.uid,
                policy.generation.unwrap_or(0)
            ),
        ),
        Outcome::Applied { policy, .. } => (
            true,
            reason::APPLIED,
            format!("{} {} applied (uid {}, generation {})", policy.kind, policy.name, policy.uid, policy.generation.unwrap_or(0)),
        ),
        Outcome::Disabled => {
            let why = status.enforcement.as_ref().map(|e| e.reason.clone()).unwrap_or_default();
            (false, reason::DISABLED, format!("policy enforcement is disabled for this run ({why})"))
        }
        Outcome::UserError { reason, message } => {
            let kept = status
                .network_policy
                .as_ref()
                .map(|p| format!("; the last applied {} {} stays in place", p.kind, p.name))
                .unwrap_or_default();
            (false, *reason, format!("{message}{kept}"))
        }
    };
    crd::set_condition(&mut status.conditions, NETWORK_POLICY_READY, np_ok, np_reason, &np_message, generation, now);
    let expired = matches!(outcome, Outcome::Applied { expired: true, .. });
    let (expired_reason, expired_message) = match (&status.expires_at, expired) {
        (Some(at), true) => (reason::DEADLINE_EXCEEDED, format!("the run's deadline passed at {at}: its policy allows nothing")),
        (Some(at), false) => (reason::ACTIVE, format!("the run's egress expires at {at}")),
        (None, _) => (reason::NO_DEADLINE, String::new()),
    };
    crd::set_condition(&mut status.conditions, EXPIRED, expired, expired_reason, &expired_message, generation, now);
    crd::set_condition_status(&mut status.conditions, ENFORCED, enforced.status, enforced.reason, &enforced.message, generation, now);
    let (ready, ready_reason, ready_message) = match outcome {
        Outcome::Disabled => (true, reason::ENFORCEMENT_DISABLED, String::new()),
        Outcome::UserError { .. } | Outcome::Applied { invalid: Some(_), .. } => (false, np_reason, np_message),
        Outcome::Applied { .. } if expired => (false, reason::DEADLINE_EXCEEDED, expired_message),
        // Unknown: an enforcer that does not report (Ready keeps its meaning: applied).
        Outcome::Applied { .. } if enforced.status == crd::FALSE => (false, reason::NOT_ENFORCED, enforced.message.clone()),
        Outcome::Applied { .. } => (true, reason::APPLIED, String::new()),
    };
    crd::set_condition(&mut status.conditions, READY, ready, ready_reason, &ready_message, generation, now);
}

/// Step 8: writes `status` when it differs from `current` (merge patch: `networkPolicy`
/// is cleared with an explicit null).
pub(crate) async fn write_status(client: &Client, run: &Run, current: &RunStatus, status: &RunStatus) -> Result<bool, ReconcileError> {
    if current == status {
        return Ok(false);
    }
    let name = run.name_any();
    let namespace = run.namespace().unwrap_or_default();
    let patch = status_patch(current, status);
    Api::<Run>::namespaced(client.clone(), &namespace)
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|error| ReconcileError::Status { kind: "Run", name: format!("{namespace}/{name}"), error })?;
    Ok(true)
}

/// The merge patch of `status` over `current` (the cached status the pass started from).
fn status_patch(current: &RunStatus, status: &RunStatus) -> serde_json::Value {
    let mut patch = json!({"status": {
        "observedGeneration": status.observed_generation,
        "enforcement": status.enforcement,
        "networkPolicy": status.network_policy,
        "expiresAt": status.expires_at,
        "conditions": status.conditions,
    }});
    // The grant only when this pass moved it: `current` comes from the cache, which may not
    // show the last pass's grant yet, and writing that older one back would give the next
    // AuditEvent a sequence number already taken (lost as a duplicate).
    if status.grant != current.grant {
        patch["status"]["grant"] = json!(status.grant);
    }
    patch
}

/// Step 9: the Warning Event of a withdrawn policy (fails open: logged, never retried).
pub(crate) async fn withdrawn_event(recorder: &Recorder, run: &Run, previous: Option<&AppliedPolicy>, policy: &AppliedPolicy) {
    let note = format!(
        "{} {}/{} had been applied (uid {}) and was found deleted; re-created (uid {})",
        policy.kind,
        run.namespace().unwrap_or_default(),
        policy.name,
        previous.map(|p| p.uid.as_str()).unwrap_or("?"),
        policy.uid
    );
    tracing::warn!(run = %format!("{}/{}", run.namespace().unwrap_or_default(), run.name_any()), "{note}");
    let related = ObjectReference {
        api_version: Some(policy.api_version.clone()),
        kind: Some(policy.kind.clone()),
        name: Some(policy.name.clone()),
        namespace: run.namespace(),
        uid: Some(policy.uid.clone()),
        ..ObjectReference::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: WITHDRAWN_REASON.into(),
        note: Some(note),
        action: "Recreate".into(),
        secondary: Some(related),
    };
    if let Err(e) = recorder.publish(&event, &run.object_ref(&())).await {
        tracing::warn!(error = %e, "publishing the NetworkPolicyWithdrawn event");
    }
}

/// Steps 2–7 of a run whose decision is `enforcement`; `status.networkPolicy` and
/// `status.grant` are updated. An expired run gets a policy that allows nothing, whatever
/// its profile says (also when the profile is gone or invalid, or the run is).
/// `now` is the pass's one reading of the clock; `expires` the run's deadline.
async fn steps(
    run: &Run,
    ctx: &Context,
    enforcement: &Enforcement,
    status: &mut RunStatus,
    now: Timestamp,
    expires: Option<Timestamp>,
) -> Result<Outcome, ReconcileError> {
    let others: Vec<PolicyKind> = match &ctx.kind {
        PolicyKind::NetworkPolicy => Vec::new(),
        PolicyKind::Cilium(_) => vec![PolicyKind::NetworkPolicy],
    };
    if !enforcement.enabled {
        let mut kinds = vec![ctx.kind.clone()];
        kinds.extend(others);
        let n = remove_policies(&ctx.client, run, &kinds).await?;
        for _ in 0..n {
            ctx.metrics.deleted();
        }
        status.network_policy = None;
        return Ok(Outcome::Disabled);
    }
    let expired = expires.is_some_and(|t| now >= t);
    let expires_text = expires.map(format_time);
    let cached = cached_profile(&ctx.caches, &run.spec.profile).await?;
    let withdrawn = || RunProfile::new(&run.spec.profile, crd::RunProfileSpec::withdrawn());
    let mut invalid = None;
    let profile = match (&cached, expired) {
        (Some(p), _) => p.clone(),
        // Expired: nothing of the profile is used.
        (None, true) => Arc::new(withdrawn()),
        // Fail closed: a grant comes from a profile that exists. One deleted (the way an
        // administrator revokes it) or never there leaves the run a policy that allows
        // nothing, not the last one applied.
        (None, false) => {
            invalid = Some((reason::PROFILE_NOT_FOUND, format!("RunProfile {} does not exist", run.spec.profile)));
            Arc::new(withdrawn())
        }
    };
    let cluster = ctx.cluster.borrow().clone();
    let planned = match render::plan(run, &profile, &cluster) {
        Err(RenderError::Profile { .. }) if expired => render::plan(run, &withdrawn(), &cluster),
        // An invalid profile grants nothing either (its administrator's edit may have meant
        // to narrow it).
        Err(e @ RenderError::Profile { .. }) => {
            invalid = Some(user_error(&e));
            render::plan(run, &withdrawn(), &cluster)
        }
        other => other,
    };
    let planned = match planned {
        // Fail closed: an invalid run must not keep the egress it was granted past its
        // deadline, nor once its profile is gone or invalid (a run made invalid first would
        // otherwise keep a revoked grant). The pods its policy selects keep being selected;
        // without a policy, the run's own selector when that part is valid, else its default
        // one. The profile's problem, when there is one, stays the reason.
        Err(e @ RenderError::Run { .. }) if expired || invalid.is_some() => {
            let (run_reason, run_message) = user_error(&e);
            invalid = Some(match invalid.take() {
                Some((reason, message)) => (reason, format!("{message}; {run_message}")),
                None => (run_reason, run_message),
            });
            let selector = match live_selector(&ctx.client, run, &ctx.kind).await? {
                Some(s) => s,
                None => render::own_selector(run).unwrap_or_else(|| render::default_selector(run)),
            };
            render::plan_with_selector(run, selector, &withdrawn(), &cluster)
        }
        other => other,
    };
    let mut plan = match planned {
        Ok(p) => p,
        Err(e) => {
            let (reason, message) = user_error(&e);
            return Ok(Outcome::UserError { reason, message });
        }
    };
    if expired {
        plan.withdraw(expires_text.as_deref().unwrap_or_default());
    }
    // The apply is forced (it reverts edits of the run's policy), so it must never reach a
    // same-named object the run does not control: a Run named `default-deny` would otherwise
    // replace an administrator's `default-deny-egress`, and its deletion collect it.
    if let Some(holder) = foreign_policy(&ctx.client, run, &ctx.kind).await? {
        return Ok(Outcome::UserError {
            reason: reason::POLICY_NAME_TAKEN,
            message: format!(
                "{} {}/{} exists and is not this run's ({holder}): it is left alone, and the run gets no policy until it is gone; rename the run",
                ctx.kind.kind(),
                plan.namespace,
                plan.name
            ),
        });
    }
    let destinations = plan.destinations();
    let object = desired(&plan, &ctx.kind)
        .map_err(|error| ReconcileError::Encode { what: format!("{} {}/{}", ctx.kind.kind(), plan.namespace, plan.name), error })?;
    let applied = match apply(&ctx.client, &ctx.kind, &object).await {
        Ok(a) => a,
        Err(e) => {
            ctx.metrics.applied(ApplyResult::Failed);
            return Err(e);
        }
    };
    let (result, previous) = confirm(&ctx.client, run, &applied, status.network_policy.clone()).await?;
    ctx.metrics.applied(result);
    status.network_policy = Some(applied.clone());
    let n = remove_policies(&ctx.client, run, &others).await?;
    for _ in 0..n {
        ctx.metrics.deleted();
    }

    // The audit trail, after the policy is in place and before `status.grant` moves on.
    // Judged against the grant the API server holds: the cache may not show the previous
    // pass's status write yet, and a change judged against an older grant would take the
    // sequence number of one already written (and be lost as a duplicate).
    if result == ApplyResult::Recreated || audit::decide(status.grant.as_ref(), &destinations, expired, expires_text.as_deref()).is_some() {
        status.grant = Api::<Run>::namespaced(ctx.client.clone(), &run.namespace().unwrap_or_default())
            .get_opt(&run.name_any())
            .await
            .map_err(|error| ReconcileError::Run { name: key(run), error })?
            .and_then(|r| r.status?.grant);
    }
    let mut changes = Vec::new();
    if result == ApplyResult::Recreated {
        changes.push((
            Change { action: AuditAction::Withdrawn, reason: audit::reason::WITHDRAWN, added: Vec::new(), removed: Vec::new() },
            format!(
                "{} {} had been applied (uid {}) and was found deleted; re-created (uid {})",
                applied.kind,
                applied.name,
                previous.as_ref().map_or("?", |p| p.uid.as_str()),
                applied.uid
            ),
        ));
    }
    // A grant taken away because the profile is gone or invalid says so, not "changed".
    let profile_problem = invalid.as_ref().filter(|(r, _)| [reason::PROFILE_NOT_FOUND, reason::PROFILE_INVALID].contains(r));
    if let Some(mut change) = audit::decide(status.grant.as_ref(), &destinations, expired, expires_text.as_deref()) {
        if let (AuditAction::Changed, Some((why, _))) = (change.action, profile_problem) {
            change.reason = why;
        }
        let profile_note = cached.as_ref().map_or_else(
            || format!("RunProfile {} (gone)", run.spec.profile),
            |p| format!("RunProfile {} generation {}", run.spec.profile, p.metadata.generation.unwrap_or(0)),
        );
        let message = match change.action {
            AuditAction::Expired => format!("the run's deadline passed at {}", expires_text.as_deref().unwrap_or("?")),
            AuditAction::Extended => format!("the deadline was raised to {}; {profile_note}", expires_text.as_deref().unwrap_or("none")),
            _ => match profile_problem {
                Some((_, why)) => format!("{why}: nothing is granted until it is valid; {profile_note}"),
                None => profile_note,
            },
        };
        changes.push((change, message));
    }
    let mut sequence = status.grant.as_ref().map_or(0, |g| g.sequence);
    let mut recorded = Vec::new();
    for (change, message) in changes {
        sequence += 1;
        let record = audit::Record {
            run,
            profile: AuditProfile { name: run.spec.profile.clone(), generation: cached.as_ref().and_then(|p| p.metadata.generation) },
            policy: AuditPolicy { kind: applied.kind.clone(), name: applied.name.clone(), generation: applied.generation },
            sequence,
            message,
            expires_at: expires_text.clone(),
            time: format_time(now),
        };
        audit::write(&ctx.client, &audit::event(&record, &change)).await?;
        ctx.metrics.audited(change.action.as_str());
        recorded.push(change);
    }
    if !recorded.is_empty() {
        status.grant = Some(audit::next_grant(sequence, &destinations, expired, expires_text.as_deref()));
    }
    Ok(Outcome::Applied { policy: applied, result, previous: previous.map(Box::new), expired, recorded, selector: plan.selector, invalid })
}

/// Step 8: the `Enforced` judgement of an outcome.
async fn judge_enforced(run: &Run, ctx: &Context, outcome: &Outcome, status: &RunStatus) -> Result<Judgement, ReconcileError> {
    if matches!(outcome, Outcome::Disabled) {
        return Ok(Judgement::unknown(enforced::reason::DISABLED, "policy enforcement is disabled for this run".into()));
    }
    if let Verify::Unknown { reason, message } = &ctx.verify {
        return Ok(Judgement::unknown(reason, message.clone()));
    }
    let Some(policy) = &status.network_policy else {
        return Ok(Judgement {
            status: crd::FALSE,
            reason: enforced::reason::NO_POLICY,
            message: "no policy has been applied for the run".into(),
            pending: Vec::new(),
        });
    };
    let mut complete = ctx.caches.enforcement_complete.clone();
    complete.wait_for(|c| *c).await.map_err(|_| ReconcileError::EnforcementCache { run: key(run) })?;
    let namespace = run.namespace().unwrap_or_default();
    let selector = match outcome {
        Outcome::Applied { selector, .. } => Some(selector.clone()),
        _ => render::run_selector(run).ok(),
    };
    let Some(selector) = selector.as_ref().and_then(enforced::compile) else {
        return Ok(Judgement::unknown(enforced::reason::NO_POLICY, "the run's pod selector is invalid".into()));
    };
    let pods = ctx.caches.pods.state();
    let nodes = enforced::nodes(&selector, pods.iter().map(|p| &**p).filter(|p| p.namespace().as_deref() == Some(namespace.as_str())));
    let reports = nodes
        .iter()
        .filter_map(|n| {
            let node = ctx.caches.nodes.get(&ObjectRef::new(n))?;
            Some((n.clone(), node.status.clone().unwrap_or_default()))
        })
        .collect();
    Ok(enforced::judge(&format!("{namespace}/{}", policy.name), policy.generation.unwrap_or(0), &nodes, &reports))
}

/// The requeue of an outcome: applied runs at the resync period, or sooner when their
/// deadline comes first or an `EnforcementDelayed` Event will be due.
pub(crate) fn action(outcome: &Outcome, resync: Duration, until_expiry: Option<Duration>, until_delayed: Option<Duration>) -> Action {
    match outcome {
        Outcome::Applied { .. } => {
            let wait = [Some(resync), until_expiry, until_delayed].into_iter().flatten().min().unwrap_or(resync);
            Action::requeue(wait.max(Duration::from_millis(100)))
        }
        Outcome::Disabled => Action::await_change(),
        // A run kept from its policy by a user error still expires on time (checked again at
        // the resync period too: the clock is not the only thing that moves a deadline).
        Outcome::UserError { .. } => match until_expiry {
            Some(wait) => Action::requeue(wait.min(resync).max(Duration::from_millis(100))),
            None => Action::await_change(),
        },
    }
}

fn key(run: &Run) -> String {
    format!("{}/{}", run.namespace().unwrap_or_default(), run.name_any())
}

/// Reconciles one run (the chain in the module doc).
pub(crate) async fn reconcile_run(run: Arc<Run>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    if run.meta().deletion_timestamp.is_some() {
        // Garbage collection removes the policy through its ownerReference.
        return Ok(Action::await_change());
    }
    // A run in backoff waits it out whatever woke it (its own ApplyFailed status write, a
    // policy event): the failure is the API server's, and retrying early would defeat it.
    let wait = ctx.backoffs().remaining(&run);
    if let Some(wait) = wait {
        return Ok(Action::requeue(wait));
    }
    let current = run.status.clone().unwrap_or_default();
    let mut status = current.clone();
    let enforcement = pin(&current, &ctx.decision);
    status.enforcement = Some(enforcement.clone());
    status.observed_generation = run.meta().generation;
    // One reading of the clock per pass: whether the run expired and when to come back
    // agree (read twice, a deadline passing in between would wait for the resync).
    let clock_now = (ctx.clock)();
    let expires = expires_at(&run);
    status.expires_at = expires.map(format_time);
    let generation = run.meta().generation;
    let now = format_time(clock_now);
    let outcome = match steps(&run, &ctx, &enforcement, &mut status, clock_now, expires).await {
        Ok(o) => o,
        Err(e) => {
            if e.is_apply() {
                let message = e.to_string();
                crd::set_condition(&mut status.conditions, NETWORK_POLICY_READY, false, reason::APPLY_FAILED, &message, generation, &now);
                crd::set_condition(&mut status.conditions, READY, false, reason::APPLY_FAILED, &message, generation, &now);
                if let Err(se) = write_status(&ctx.client, &run, &current, &status).await {
                    tracing::debug!(error = %se, "writing the ApplyFailed condition");
                }
            }
            return Err(e);
        }
    };
    let judgement = judge_enforced(&run, &ctx, &outcome, &status).await?;
    conditions(&mut status, &outcome, &judgement, generation, &now);
    write_status(&ctx.client, &run, &current, &status).await?;
    let mut until_delayed = None;
    if let Outcome::Applied { policy, result, previous, recorded, .. } = &outcome {
        if *result == ApplyResult::Recreated {
            withdrawn_event(&ctx.recorder, &run, previous.as_deref(), policy).await;
        }
        for change in recorded.iter().filter(|c| c.action != AuditAction::Withdrawn) {
            audit_event(&ctx.recorder, &run, change).await;
        }
        match ctx.pending_for(&run, policy.generation.unwrap_or(0), &judgement) {
            Some(left) if left.is_zero() => {
                delayed_event(&ctx.recorder, &run, ctx.enforced_timeout, &judgement).await;
                ctx.delay_reported(&run);
            }
            left => until_delayed = left,
        }
    }
    ctx.change_backoffs(|b| b.forget(&run));
    ctx.metrics.reconciled("Run", started.elapsed().as_secs_f64());
    tracing::debug!(run = %key(&run), outcome = ?outcome, seconds = started.elapsed().as_secs_f64(), "reconciled");
    let until_expiry = expires
        .map(|t| t.duration_since(clock_now))
        .filter(|d| d.is_positive())
        .and_then(|d| Duration::try_from(d).ok())
        // Past the deadline by the clock's second: at most one more pass.
        .map(|d| d + Duration::from_millis(10));
    Ok(action(&outcome, ctx.resync, until_expiry, until_delayed))
}

/// The Kubernetes Event of an audited change (beside the AuditEvent; fails open).
async fn audit_event(recorder: &Recorder, run: &Run, change: &Change) {
    let (type_, reason) = match change.action {
        AuditAction::Granted => (EventType::Normal, "EgressGranted"),
        AuditAction::Changed => (EventType::Normal, "EgressChanged"),
        AuditAction::Extended => (EventType::Normal, "EgressExtended"),
        AuditAction::Expired => (EventType::Warning, "EgressExpired"),
        AuditAction::Withdrawn => (EventType::Warning, WITHDRAWN_REASON),
    };
    let note = format!("{} ({}): +{} -{} destinations", change.action.as_str(), change.reason, change.added.len(), change.removed.len());
    let event = Event { type_, reason: reason.into(), note: Some(note), action: "Audit".into(), secondary: None };
    if let Err(e) = recorder.publish(&event, &run.object_ref(&())).await {
        tracing::warn!(error = %e, run = %key(run), "publishing the {reason} event");
    }
}

/// The Warning Event of a policy nodes take too long to enforce (fails open).
async fn delayed_event(recorder: &Recorder, run: &Run, after: Duration, judgement: &Judgement) {
    tracing::warn!(run = %key(run), pending = ?judgement.pending, "nodes do not enforce the run's policy after {after:?}");
    let event = Event {
        type_: EventType::Warning,
        reason: DELAYED_REASON.into(),
        note: Some(format!("after {}s: {}", after.as_secs(), judgement.message)),
        action: "Verify".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &run.object_ref(&())).await {
        tracing::warn!(error = %e, "publishing the {DELAYED_REASON} event");
    }
}

/// The backoff after `failures` consecutive failures: 1 s, doubling, at most 5 min.
pub(crate) fn backoff(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.saturating_sub(1).min(8)).min(Duration::from_secs(300))
}

/// Requeues a failed run with its backoff; a run deleted meanwhile is not retried (and
/// gets no backoff entry that nothing would remove).
pub(crate) fn run_error_policy(run: Arc<Run>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_error("Run");
    let n = ctx.change_backoffs(|b| {
        // Checked under the lock [`Context::observe_run`] takes after the cache has dropped a
        // deleted run: either the run is still cached here, and its deletion will remove the
        // entry, or it is gone and none is made.
        let cached = ctx.caches.runs.get(&ObjectRef::from_obj(&*run)).is_some_and(|r| r.uid() == run.uid());
        cached.then(|| b.failed(&run))
    });
    let Some(n) = n else {
        tracing::info!(run = %key(&run), error = %error, "reconcile failed for a run that is gone; not retried");
        return Action::await_change();
    };
    let delay = backoff(n);
    tracing::warn!(run = %key(&run), error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Checks a profile and writes its `Ready` condition.
pub(crate) async fn reconcile_profile(profile: Arc<RunProfile>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let current = profile.status.clone().unwrap_or_default();
    let mut status = current.clone();
    let generation = profile.meta().generation;
    status.observed_generation = generation;
    let problems = profile.spec.problems();
    let (ok, why, message) =
        if problems.is_empty() { (true, reason::VALID, String::new()) } else { (false, reason::INVALID, crd::describe(&problems)) };
    crd::set_condition(&mut status.conditions, READY, ok, why, &message, generation, &format_time((ctx.clock)()));
    if status != current {
        let name = profile.name_any();
        let patch = json!({"status": {"observedGeneration": status.observed_generation, "conditions": status.conditions}});
        Api::<RunProfile>::all(ctx.client.clone())
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|error| ReconcileError::Status { kind: "RunProfile", name, error })?;
    }
    ctx.metrics.reconciled("RunProfile", started.elapsed().as_secs_f64());
    Ok(Action::await_change())
}

/// Requeues a failed profile reconcile.
pub(crate) fn profile_error_policy(profile: Arc<RunProfile>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    tracing::warn!(profile = %profile.name_any(), error = %error, "reconcile failed");
    ctx.metrics.reconcile_error("RunProfile");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::probe::EnforceMode;

    fn applied(uid: &str) -> AppliedPolicy {
        AppliedPolicy {
            api_version: "networking.k8s.io/v1".into(),
            kind: "NetworkPolicy".into(),
            name: "r-egress".into(),
            uid: uid.into(),
            generation: Some(1),
        }
    }

    #[test]
    fn the_status_patch_writes_the_grant_only_when_the_pass_moved_it() {
        let grant = |sequence| crd::Grant { sequence, destinations: vec!["dns".into()], expired: false, expires_at: None };
        // The cache shows grant 3 while the server holds 4 (the last pass's write not seen
        // yet): a pass recording nothing must not write 3 back.
        let current = RunStatus { grant: Some(grant(3)), ..RunStatus::default() };
        let mut status = current.clone();
        status.observed_generation = Some(2);
        let patch = status_patch(&current, &status);
        assert!(patch["status"].get("grant").is_none(), "{patch}");
        assert_eq!(patch["status"]["observedGeneration"], 2);
        // A pass that recorded an AuditEvent writes its grant.
        status.grant = Some(grant(5));
        assert_eq!(status_patch(&current, &status)["status"]["grant"]["sequence"], 5);
    }

    #[test]
    fn the_pin_holds_whatever_the_current_mode() {
        let on = Decision { mode: EnforceMode::On, enabled: true, reason: "--enforce=on".into() };
        let off = Decision { mode: EnforceMode::Off, enabled: false, reason: "--enforce=off".into() };
        let mut status = RunStatus::default();
        let pinned = pin(&status, &on);
        assert!(pinned.enabled);
        status.enforcement = Some(pinned.clone());
        assert_eq!(pin(&status, &off), pinned);
        assert!(!pin(&RunStatus::default(), &off).enabled);
    }

    #[test]
    fn withdrawal_is_a_changed_uid_of_a_recorded_policy() {
        assert_eq!(record(None, &applied("u1")), ApplyResult::Created);
        assert_eq!(record(Some(&applied("u1")), &applied("u1")), ApplyResult::Applied);
        assert_eq!(record(Some(&applied("u1")), &applied("u2")), ApplyResult::Recreated);
        let mut cnp = applied("u1");
        cnp.kind = "CiliumNetworkPolicy".into();
        assert_eq!(record(Some(&cnp), &applied("u2")), ApplyResult::Created);
    }

    fn applied_outcome(expired: bool) -> Outcome {
        Outcome::Applied {
            policy: applied("u1"),
            result: ApplyResult::Created,
            previous: None,
            expired,
            recorded: Vec::new(),
            selector: Selector::default(),
            invalid: None,
        }
    }

    /// A missing profile: the policy applied allows nothing, and the conditions say so
    /// (not as a deadline: the run has none).
    #[test]
    fn a_missing_profile_s_policy_allows_nothing_and_says_so() {
        let mut s = RunStatus::default();
        let Outcome::Applied { policy, result, previous, expired, recorded, selector, .. } = applied_outcome(false) else {
            unreachable!("applied_outcome is Applied")
        };
        let invalid = Some((reason::PROFILE_NOT_FOUND, "RunProfile p does not exist".to_string()));
        let outcome = Outcome::Applied { policy, result, previous, expired, recorded, selector, invalid };
        conditions(&mut s, &outcome, &judged("True"), Some(1), "t1");
        let np = crd::condition(&s.conditions, NETWORK_POLICY_READY).unwrap();
        assert_eq!((np.status.as_str(), np.reason.as_str()), ("False", "ProfileNotFound"));
        assert!(
            np.message.starts_with("RunProfile p does not exist; NetworkPolicy ") && np.message.contains("allows nothing"),
            "{}",
            np.message
        );
        assert!(!np.message.contains("deadline"), "{}", np.message);
        let ready = crd::condition(&s.conditions, READY).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "ProfileNotFound"));
    }

    fn judged(status: &'static str) -> Judgement {
        Judgement { status, reason: "R", message: format!("judged {status}"), pending: Vec::new() }
    }

    #[test]
    fn conditions_per_outcome() {
        let mut s = RunStatus::default();
        let yes = judged("True");
        conditions(&mut s, &applied_outcome(false), &yes, Some(1), "t1");
        let np = crd::condition(&s.conditions, NETWORK_POLICY_READY).unwrap();
        assert_eq!((np.status.as_str(), np.reason.as_str()), ("True", "Applied"));
        assert_eq!(crd::condition(&s.conditions, READY).unwrap().status, "True");
        assert_eq!(crd::condition(&s.conditions, EXPIRED).unwrap().reason, reason::NO_DEADLINE);
        s.network_policy = Some(applied("u1"));
        conditions(
            &mut s,
            &Outcome::UserError { reason: reason::RUN_INVALID, message: "run a/r is invalid: spec.profile: required".into() },
            &yes,
            Some(2),
            "t2",
        );
        let np = crd::condition(&s.conditions, NETWORK_POLICY_READY).unwrap();
        assert_eq!((np.status.as_str(), np.reason.as_str(), np.last_transition_time.as_str()), ("False", "RunInvalid", "t2"));
        assert!(np.message.contains("stays in place"), "{}", np.message);
        let ready = crd::condition(&s.conditions, READY).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "RunInvalid"));
        let unknown = judged("Unknown");
        conditions(&mut s, &Outcome::Disabled, &unknown, Some(2), "t3");
        let ready = crd::condition(&s.conditions, READY).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", "EnforcementDisabled"));
        assert_eq!(crd::condition(&s.conditions, NETWORK_POLICY_READY).unwrap().reason, "Disabled");
        assert_eq!(crd::condition(&s.conditions, ENFORCED).unwrap().status, "Unknown");
        // Same outcome twice: equal status (so no write).
        let before = s.clone();
        conditions(&mut s, &Outcome::Disabled, &unknown, Some(2), "t4");
        assert_eq!(s, before);
        // Ready needs Enforced (Unknown keeps today's meaning) and no expiry.
        conditions(&mut s, &applied_outcome(false), &judged("False"), Some(3), "t5");
        let ready = crd::condition(&s.conditions, READY).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str(), ready.message.as_str()), ("False", reason::NOT_ENFORCED, "judged False"));
        conditions(&mut s, &applied_outcome(false), &unknown, Some(3), "t6");
        assert_eq!(crd::condition(&s.conditions, READY).unwrap().status, "True");
        s.expires_at = Some("2026-11-26T10:00:00Z".into());
        conditions(&mut s, &applied_outcome(true), &yes, Some(3), "t7");
        let expired = crd::condition(&s.conditions, EXPIRED).unwrap();
        assert_eq!((expired.status.as_str(), expired.reason.as_str()), ("True", reason::DEADLINE_EXCEEDED));
        let ready = crd::condition(&s.conditions, READY).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", reason::DEADLINE_EXCEEDED));
    }

    #[test]
    fn an_invalid_expired_run_is_withdrawn_and_stays_invalid() {
        let mut s = RunStatus { expires_at: Some("2026-11-26T10:00:00Z".into()), ..RunStatus::default() };
        let outcome = Outcome::Applied {
            policy: applied("u1"),
            result: ApplyResult::Applied,
            previous: None,
            expired: true,
            recorded: Vec::new(),
            selector: Selector::default(),
            invalid: Some((
                reason::RUN_INVALID,
                "run a/r is invalid: spec.activeDeadlineSeconds: 0 is not a positive number of seconds".into(),
            )),
        };
        conditions(&mut s, &outcome, &judged("True"), Some(2), "t1");
        let np = crd::condition(&s.conditions, NETWORK_POLICY_READY).unwrap();
        assert_eq!((np.status.as_str(), np.reason.as_str()), ("False", reason::RUN_INVALID));
        assert!(np.message.contains("activeDeadlineSeconds") && np.message.contains("r-egress allows nothing"), "{}", np.message);
        let expired = crd::condition(&s.conditions, EXPIRED).unwrap();
        assert_eq!((expired.status.as_str(), expired.reason.as_str()), ("True", reason::DEADLINE_EXCEEDED));
        let ready = crd::condition(&s.conditions, READY).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", reason::RUN_INVALID));
        // Requeued like any applied run (a raised deadline or a fix is a change of the run).
        let resync = Duration::from_secs(600);
        assert_eq!(format!("{:?}", action(&outcome, resync, None, None)), format!("{:?}", Action::requeue(resync)));
    }

    #[test]
    fn a_deadline_of_zero_or_less_is_run_invalid_and_already_past() {
        let cluster = ClusterConfig {
            pod_cidrs: Vec::new(),
            service_cidrs: Vec::new(),
            dns: render::DnsConfig::default(),
            api_server: Default::default(),
        };
        let created: Timestamp = "2026-11-26T10:00:00Z".parse().unwrap();
        for secs in [0, -5] {
            let mut run = run_with_uid("u1");
            run.spec.active_deadline_seconds = Some(secs);
            run.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(created));
            let problems = run.spec.problems();
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert_eq!(problems[0].field, "spec.activeDeadlineSeconds");
            let profile = RunProfile::new("p", serde_json::from_value(json!({"internet": {"ports": [{"port": 443}]}})).unwrap());
            let e = render::plan(&run, &profile, &cluster).unwrap_err();
            assert_eq!(user_error(&e).0, reason::RUN_INVALID, "{e}");
            // Past its deadline at creation: the controller withdraws (steps), and the
            // withdrawal can select the run's pods (the selector is not what is wrong).
            assert!(expires_at(&run).is_some_and(|t| t <= created));
            let selector = render::own_selector(&run).unwrap();
            assert_eq!(selector, render::default_selector(&run));
            let mut plan =
                render::plan_with_selector(&run, selector, &RunProfile::new("p", crd::RunProfileSpec::withdrawn()), &cluster).unwrap();
            plan.withdraw("2026-11-26T10:00:00Z");
            assert!(plan.egress.is_empty() && plan.destinations().is_empty());
            assert_eq!(plan.ingress, Some(Vec::new()));
        }
        // A selector that is itself invalid is not used for the withdrawal.
        let mut run = run_with_uid("u1");
        run.spec.pod_selector = Some(serde_json::from_value(json!({"matchLabels": {"app": "agent"}})).unwrap());
        assert_eq!(render::own_selector(&run), None);
    }

    #[test]
    fn requeue_before_the_deadline_and_the_delay_event() {
        let resync = Duration::from_secs(600);
        let wait = |a: Action| format!("{a:?}");
        assert_eq!(wait(action(&applied_outcome(false), resync, None, None)), wait(Action::requeue(resync)));
        let soon = Duration::from_secs(5);
        assert_eq!(wait(action(&applied_outcome(false), resync, Some(soon), None)), wait(Action::requeue(soon)));
        assert_eq!(wait(action(&applied_outcome(false), resync, Some(resync), Some(soon))), wait(Action::requeue(soon)));
        let user = Outcome::UserError { reason: reason::PROFILE_NOT_FOUND, message: String::new() };
        assert_eq!(wait(action(&user, resync, None, None)), wait(Action::await_change()));
        assert_eq!(wait(action(&user, resync, Some(soon), None)), wait(Action::requeue(soon)), "a user error does not stop expiry");
    }

    fn run_with_uid(uid: &str) -> Run {
        serde_json::from_value(
            json!({"apiVersion": "flock.dev/v1alpha1", "kind": "Run", "metadata": {"name": "r", "namespace": "a", "uid": uid}, "spec": {"profile": "p"}}),
        )
        .unwrap()
    }

    #[test]
    fn backoff_is_per_run_uid_and_forgotten() {
        let mut b = Backoffs::default();
        let first = run_with_uid("u1");
        assert!(b.remaining(&first).is_none());
        assert_eq!(b.failed(&first), 1);
        assert_eq!(b.failed(&first), 2);
        assert!(b.remaining(&first).is_some_and(|w| w <= backoff(2)));
        // The same name created again is a new run: no inherited backoff.
        assert!(b.remaining(&run_with_uid("u2")).is_none());
        b.forget(&first);
        assert!(b.remaining(&first).is_none());
        assert!(b.entries.is_empty());
    }

    #[test]
    fn backoff_doubles_to_a_cap() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(2), Duration::from_secs(2));
        assert_eq!(backoff(5), Duration::from_secs(16));
        assert_eq!(backoff(40), Duration::from_secs(256));
        assert!(backoff(u32::MAX) <= Duration::from_secs(300));
    }
}
