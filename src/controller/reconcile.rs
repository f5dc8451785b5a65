//! One reconcile of a Run, as a chain of small steps (Oz's request controller, in Rust):
//!
//! 1. [`pin`] — the run's enforcement decision: the one in its status, else the
//!    controller's current one. Never changed once written.
//! 2. Not enforced → [`remove_policies`] (a stale `<run>-egress` the run owns), condition
//!    `Disabled`.
//! 3. [`cached_profile`] — from the RunProfile cache, never a live read; missing →
//!    condition `ProfileNotFound` (only once the cache holds a complete list: before that
//!    the reconcile waits).
//! 4. [`render::plan`], [`desired`] — render (pure); an invalid run or profile →
//!    `RunInvalid`/`ProfileInvalid`.
//! 5. [`apply`] — server-side apply with the fixed field manager, forced: whatever else
//!    changed in the fields the controller owns is reverted. An API error → `ApplyFailed`,
//!    requeued with backoff.
//! 6. [`record`] — compares the applied policy's uid with the one in the run's status: none
//!    recorded → the first creation; a different one → the policy had been applied and was
//!    deleted (withdrawn) and is now re-created; the same → an update or a no-op. A creation
//!    or re-creation is [`confirm`]ed against the run read afresh (the cache may not show
//!    the controller's own last status write yet).
//! 7. [`remove_policies`] of the other kind (a CiliumNetworkPolicy run never also has a
//!    NetworkPolicy).
//! 8. [`conditions`] from the outcome, then one status write, only when something changed.
//! 9. Withdrawn → exactly one Warning Event `NetworkPolicyWithdrawn`, after the status
//!    write: the new uid is recorded first, so a failed event cannot cause a second one
//!    (events fail open, like Paddock's audits), and a no-op pass never emits one.
//!
//! User errors (2, 3, 4) write their condition and wait for a change of the run or of its
//! profile (the controller watches profiles): no requeue, no hot loop; an earlier policy
//! stays in place. API errors requeue with a per-run exponential backoff ([`Backoffs`]:
//! forgotten on success, on the run's deletion, and when a relist no longer has the run).
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

use super::crd::{self, AppliedPolicy, Enforcement, Run, RunProfile, RunStatus};
use super::metrics::{ApplyResult, Metrics};
use super::probe::{Decision, PolicyKind};
use super::render::{self, ClusterConfig, RenderError};
use super::{FIELD_MANAGER, WITHDRAWN_REASON};

/// Condition types.
pub const NETWORK_POLICY_READY: &str = "NetworkPolicyReady";
pub const READY: &str = "Ready";

/// Reasons of `NetworkPolicyReady` (and of `Ready` when it is False).
pub mod reason {
    pub const APPLIED: &str = "Applied";
    pub const DISABLED: &str = "Disabled";
    pub const PROFILE_NOT_FOUND: &str = "ProfileNotFound";
    pub const PROFILE_INVALID: &str = "ProfileInvalid";
    pub const RUN_INVALID: &str = "RunInvalid";
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// `Ready` of a run whose enforcement is disabled: nothing to wait for.
    pub const ENFORCEMENT_DISABLED: &str = "EnforcementDisabled";
    /// RunProfile `Ready`.
    pub const VALID: &str = "Valid";
    pub const INVALID: &str = "Invalid";
}

/// Everything a reconcile needs.
pub struct Context {
    pub client: Client,
    /// The cluster configuration (the API server's addresses follow its EndpointSlices).
    pub cluster: watch::Receiver<ClusterConfig>,
    /// What new runs pin.
    pub decision: Decision,
    pub kind: PolicyKind,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// Requeue period of a run whose policy is applied (the owned-policy watch reacts at
    /// once; this is the safety net).
    pub resync: Duration,
    /// The caches the reconciles read.
    pub caches: Caches,
    /// Backoff of runs whose last reconcile failed.
    backoffs: Mutex<Backoffs>,
}

/// The controller's caches (reflector stores), fed by its watches.
#[derive(Clone)]
pub struct Caches {
    /// Every RunProfile: step 3 reads the run's profile here.
    pub profiles: Store<RunProfile>,
    /// Turns true once `profiles` holds a complete list, and stays true (a relist swaps
    /// its new list in whole). Not `Store::wait_until_ready`: that wakes one waiter only,
    /// and the profile controller waits on it too.
    pub profiles_complete: watch::Receiver<bool>,
    /// Every Run (the run controller's own cache): a failure is recorded only for a run that
    /// is still here.
    pub runs: Store<Run>,
}

impl Context {
    pub fn new(
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
            backoffs: Mutex::new(Backoffs::default()),
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
    pub fn observe_run(&self, event: &watcher::Event<Run>) {
        match event {
            watcher::Event::Delete(run) => self.change_backoffs(|b| b.forget(run)),
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
pub struct Backoffs {
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
pub enum ReconcileError {
    #[error("reading RunProfile {profile}: the RunProfile cache stopped before it was complete")]
    ProfileCache { profile: String },
    #[error("applying {kind} {namespace}/{name}: {error}")]
    Apply { kind: String, namespace: String, name: String, error: kube::Error },
    #[error("the API server returned {kind} {namespace}/{name} without a uid")]
    NoUid { kind: String, namespace: String, name: String },
    #[error("deleting stale {kind} {namespace}/{name}: {error}")]
    Delete { kind: String, namespace: String, name: String, error: kube::Error },
    #[error("reading Run {name}: {error}")]
    Run { name: String, error: kube::Error },
    #[error("writing the status of {kind} {name}: {error}")]
    Status { kind: &'static str, name: String, error: kube::Error },
    #[error("encoding {what}: {error}")]
    Encode { what: String, error: serde_json::Error },
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
pub enum Outcome {
    Applied {
        policy: AppliedPolicy,
        result: ApplyResult,
        previous: Option<AppliedPolicy>,
    },
    Disabled,
    /// The user's to fix: a condition says what, and nothing happens until a change.
    UserError {
        reason: &'static str,
        message: String,
    },
}

/// Now, as a condition timestamp (RFC 3339, seconds).
pub fn now() -> String {
    Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Step 1: the run's pinned decision, or `current` for a run that has none yet.
pub fn pin(status: &RunStatus, current: &Decision) -> Enforcement {
    status.enforcement.clone().unwrap_or_else(|| Enforcement {
        enabled: current.enabled,
        mode: current.mode.as_str().to_string(),
        reason: current.reason.clone(),
    })
}

/// Step 3: the run's profile from the RunProfile cache, `None` when it does not exist.
/// Waits until the cache holds a complete list: before that, a profile missing from it may
/// exist, and reporting `ProfileNotFound` would be false.
pub async fn cached_profile(caches: &Caches, name: &str) -> Result<Option<Arc<RunProfile>>, ReconcileError> {
    let mut complete = caches.profiles_complete.clone();
    complete.wait_for(|c| *c).await.map_err(|_| ReconcileError::ProfileCache { profile: name.to_string() })?;
    Ok(caches.profiles.get(&ObjectRef::new(name)))
}

/// Step 4 (pure): the object to apply for a run's plan (`render::plan`), of `kind`, as JSON.
pub fn desired(plan: &render::Plan, kind: &PolicyKind) -> Result<Value, serde_json::Error> {
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
pub async fn apply(client: &Client, kind: &PolicyKind, object: &Value) -> Result<AppliedPolicy, ReconcileError> {
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
pub fn record(previous: Option<&AppliedPolicy>, applied: &AppliedPolicy) -> ApplyResult {
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
pub async fn confirm(
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

/// Steps 2 and 7: deletes the run's policy of each of `kinds` when it exists and the run
/// controls it (a same-named object someone else made is left alone). Returns how many
/// were deleted.
pub async fn remove_policies(client: &Client, run: &Run, kinds: &[PolicyKind]) -> Result<usize, ReconcileError> {
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

/// Step 8 (pure): the conditions an outcome means.
pub fn conditions(status: &mut RunStatus, outcome: &Outcome, generation: Option<i64>, now: &str) {
    let (np_ok, np_reason, np_message, ready, ready_reason) = match outcome {
        Outcome::Applied { policy, .. } => {
            let msg = format!("{} {} applied (uid {})", policy.kind, policy.name, policy.uid);
            (true, reason::APPLIED, msg, true, reason::APPLIED)
        }
        Outcome::Disabled => {
            let why = status.enforcement.as_ref().map(|e| e.reason.clone()).unwrap_or_default();
            (false, reason::DISABLED, format!("policy enforcement is disabled for this run ({why})"), true, reason::ENFORCEMENT_DISABLED)
        }
        Outcome::UserError { reason, message } => {
            let kept = status
                .network_policy
                .as_ref()
                .map(|p| format!("; the last applied {} {} stays in place", p.kind, p.name))
                .unwrap_or_default();
            (false, *reason, format!("{message}{kept}"), false, *reason)
        }
    };
    crd::set_condition(&mut status.conditions, NETWORK_POLICY_READY, np_ok, np_reason, &np_message, generation, now);
    let ready_message = if ready { String::new() } else { np_message };
    crd::set_condition(&mut status.conditions, READY, ready, ready_reason, &ready_message, generation, now);
}

/// Step 8: writes `status` when it differs from `current` (merge patch: `networkPolicy`
/// is cleared with an explicit null).
pub async fn write_status(client: &Client, run: &Run, current: &RunStatus, status: &RunStatus) -> Result<bool, ReconcileError> {
    if current == status {
        return Ok(false);
    }
    let name = run.name_any();
    let namespace = run.namespace().unwrap_or_default();
    let patch = json!({"status": {
        "observedGeneration": status.observed_generation,
        "enforcement": status.enforcement,
        "networkPolicy": status.network_policy,
        "conditions": status.conditions,
    }});
    Api::<Run>::namespaced(client.clone(), &namespace)
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|error| ReconcileError::Status { kind: "Run", name: format!("{namespace}/{name}"), error })?;
    Ok(true)
}

/// Step 9: the Warning Event of a withdrawn policy (fails open: logged, never retried).
pub async fn withdrawn_event(recorder: &Recorder, run: &Run, previous: Option<&AppliedPolicy>, policy: &AppliedPolicy) {
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

/// Steps 2–7 of a run whose decision is `enforcement`; `status.networkPolicy` is updated.
async fn steps(run: &Run, ctx: &Context, enforcement: &Enforcement, status: &mut RunStatus) -> Result<Outcome, ReconcileError> {
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
    let Some(profile) = cached_profile(&ctx.caches, &run.spec.profile).await? else {
        return Ok(Outcome::UserError {
            reason: reason::PROFILE_NOT_FOUND,
            message: format!("RunProfile {} does not exist", run.spec.profile),
        });
    };
    let cluster = ctx.cluster.borrow().clone();
    let plan = match render::plan(run, &profile, &cluster) {
        Ok(p) => p,
        Err(e) => {
            let (reason, message) = user_error(&e);
            return Ok(Outcome::UserError { reason, message });
        }
    };
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
    Ok(Outcome::Applied { policy: applied, result, previous })
}

/// The requeue of an outcome.
pub fn action(outcome: &Outcome, resync: Duration) -> Action {
    match outcome {
        Outcome::Applied { .. } => Action::requeue(resync),
        Outcome::Disabled | Outcome::UserError { .. } => Action::await_change(),
    }
}

fn key(run: &Run) -> String {
    format!("{}/{}", run.namespace().unwrap_or_default(), run.name_any())
}

/// Reconciles one run (the chain in the module doc).
pub async fn reconcile_run(run: Arc<Run>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
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
    let generation = run.meta().generation;
    let now = now();
    let outcome = match steps(&run, &ctx, &enforcement, &mut status).await {
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
    conditions(&mut status, &outcome, generation, &now);
    write_status(&ctx.client, &run, &current, &status).await?;
    if let Outcome::Applied { policy, result: ApplyResult::Recreated, previous } = &outcome {
        withdrawn_event(&ctx.recorder, &run, previous.as_ref(), policy).await;
    }
    ctx.change_backoffs(|b| b.forget(&run));
    ctx.metrics.reconciled("Run", started.elapsed().as_secs_f64());
    tracing::debug!(run = %key(&run), outcome = ?outcome, seconds = started.elapsed().as_secs_f64(), "reconciled");
    Ok(action(&outcome, ctx.resync))
}

/// The backoff after `failures` consecutive failures: 1 s, doubling, at most 5 min.
pub fn backoff(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.saturating_sub(1).min(8)).min(Duration::from_secs(300))
}

/// Requeues a failed run with its backoff; a run deleted meanwhile is not retried (and
/// gets no backoff entry that nothing would remove).
pub fn run_error_policy(run: Arc<Run>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
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
pub async fn reconcile_profile(profile: Arc<RunProfile>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let current = profile.status.clone().unwrap_or_default();
    let mut status = current.clone();
    let generation = profile.meta().generation;
    status.observed_generation = generation;
    let problems = profile.spec.problems();
    let (ok, why, message) =
        if problems.is_empty() { (true, reason::VALID, String::new()) } else { (false, reason::INVALID, crd::describe(&problems)) };
    crd::set_condition(&mut status.conditions, READY, ok, why, &message, generation, &now());
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
pub fn profile_error_policy(profile: Arc<RunProfile>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    tracing::warn!(profile = %profile.name_any(), error = %error, "reconcile failed");
    ctx.metrics.reconcile_error("RunProfile");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::probe::EnforceMode;

    fn applied(uid: &str) -> AppliedPolicy {
        AppliedPolicy { api_version: "networking.k8s.io/v1".into(), kind: "NetworkPolicy".into(), name: "r-egress".into(), uid: uid.into(), generation: Some(1) }
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

    #[test]
    fn conditions_per_outcome() {
        let mut s = RunStatus::default();
        conditions(&mut s, &Outcome::Applied { policy: applied("u1"), result: ApplyResult::Created, previous: None }, Some(1), "t1");
        let np = crd::condition(&s.conditions, NETWORK_POLICY_READY).unwrap();
        assert_eq!((np.status.as_str(), np.reason.as_str()), ("True", "Applied"));
        assert_eq!(crd::condition(&s.conditions, READY).unwrap().status, "True");
        s.network_policy = Some(applied("u1"));
        conditions(
            &mut s,
            &Outcome::UserError { reason: reason::PROFILE_NOT_FOUND, message: "RunProfile p does not exist".into() },
            Some(2),
            "t2",
        );
        let np = crd::condition(&s.conditions, NETWORK_POLICY_READY).unwrap();
        assert_eq!((np.status.as_str(), np.reason.as_str(), np.last_transition_time.as_str()), ("False", "ProfileNotFound", "t2"));
        assert!(np.message.contains("stays in place"), "{}", np.message);
        let ready = crd::condition(&s.conditions, READY).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "ProfileNotFound"));
        conditions(&mut s, &Outcome::Disabled, Some(2), "t3");
        let ready = crd::condition(&s.conditions, READY).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", "EnforcementDisabled"));
        assert_eq!(crd::condition(&s.conditions, NETWORK_POLICY_READY).unwrap().reason, "Disabled");
        // Same outcome twice: equal status (so no write).
        let before = s.clone();
        conditions(&mut s, &Outcome::Disabled, Some(2), "t4");
        assert_eq!(s, before);
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
