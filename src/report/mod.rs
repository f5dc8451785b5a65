//! What flock-agent reports to the API server: each node's FlockNode, written by that node's
//! agent ([`node`]), and, below, the cluster-wide reports of policies (NetworkPolicies,
//! ClusterNetworkPolicies) flock cannot enforce as written: one writer for the whole cluster.
//!
//! Every agent watches every policy, so every agent knows every policy's problems
//! (`translate::validate_all` over its snapshot) and exports their number,
//! `flock_policy_problems_cluster`. Only the agent holding the reporter Lease ([`crate::lease`])
//! publishes them as Events; when every agent published its own, one bad policy made one
//! Event per node — a storm at scale. (flock-controller is optional, so it cannot be the
//! reporter.) Non-holders send no request about Events at all.
//!
//! Each (policy, problem) is one Warning Event `PolicyNotEnforceable` regarding the policy
//! (a ClusterNetworkPolicy's, being cluster-scoped, in namespace `default`, as for other
//! cluster-scoped objects), continued with the events API's `series`:
//! - The first observation creates the Event. Its name is a function of the policy and the
//!   problem (`<policy>.<hash>`), so any agent can find it again: a new holder after a
//!   failover reads each current problem's Event (one GET each) and continues its series,
//!   writing nothing before that series' next heartbeat — a failover re-publishes nothing.
//! - While the problem lasts, one merge patch of `series` (count + 1, lastObservedTime) per
//!   heartbeat, 30 min by default: client-go's events library refreshes its series every
//!   30 min too. Its other figure, the 6-min isolation after which a quiet series is finished,
//!   is for discrete occurrences; a policy problem is a standing condition, seen continuously,
//!   so the heartbeat is the interval that matters. 30 min is also under the API server's
//!   default event TTL (1 h): the Event stays visible while the problem does, at one write per
//!   problem per half hour. The count is thus the first observation, plus one per heartbeat
//!   the problem lasted, plus one per time it came back.
//! - A problem that goes away (policy fixed or deleted) is no longer written; its Event ages
//!   out with the TTL. If it comes back, that is one more occurrence of the same series,
//!   written with the series' next heartbeat.
//! - Requests are paced (`request_interval`); a failed one is retried after `retry`.
//!
//! kube-runtime's `events::Recorder` aggregates into `series` too, but not in a way that fits:
//! its key leaves out the note (two problems of one policy would share one series, showing
//! the first one's note), it writes on every call, and its Event names carry a timestamp, so
//! a new holder could neither find nor continue its predecessor's series.
//!
//! Every ClusterNetworkPolicy also gets flock's condition in its status ([`status`]), written by
//! the holder too; every agent exports how many are enforced as written
//! (`flock_cluster_policies_enforced`).

#[cfg(feature = "tool")]
pub mod fleet;
pub mod node;
pub(crate) mod status;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::agent::metrics::Metrics;
use crate::lease::{Elector, LeaseError, LeaseSettings};
use crate::model::Snapshot;
use crate::source::Source;
use crate::translate::ir::PolicyKind;
use crate::translate::{self, PolicyProblem};

/// The Events' reason.
pub(crate) const REASON: &str = "PolicyNotEnforceable";
/// The Events' reporting controller.
pub(crate) const CONTROLLER: &str = "flock-agent";
/// Where Events about cluster-scoped objects go.
pub(crate) const CLUSTER_EVENT_NAMESPACE: &str = "default";

/// The reporter Lease: `flock-system/flock-agent-reporter`, client-go's timings for the
/// holder, and candidates every 60–90 s (every node runs one: see [`crate::lease`]).
pub fn reporter_lease() -> LeaseSettings {
    LeaseSettings { candidate_period: Duration::from_secs(60), ..LeaseSettings::new("flock-system", "flock-agent-reporter") }
}

/// How policy problems are reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportOptions {
    /// The reporter Lease.
    pub lease: LeaseSettings,
    /// While a problem lasts, its Event is written once per this period.
    pub heartbeat: Duration,
    /// A failed request is retried this much later.
    pub retry: Duration,
    /// At least this long between two requests about Events.
    pub request_interval: Duration,
    /// The problems are recomputed at most this often (when the snapshot changed).
    pub recompute_interval: Duration,
}

impl Default for ReportOptions {
    fn default() -> Self {
        Self {
            lease: reporter_lease(),
            heartbeat: Duration::from_secs(30 * 60),
            retry: Duration::from_secs(30),
            // 20 a second: a failover with thousands of bad policies reads their Events
            // without a burst.
            request_interval: Duration::from_millis(50),
            // Problems change only with policies, but the snapshot changes with every pod:
            // validating 10,000 policies takes ~12 ms (release build, the 2-core test
            // machine), so at most every 2 s, not per pod event.
            recompute_interval: Duration::from_secs(2),
        }
    }
}

/// What the reporter publishes, from one snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Findings {
    /// The problems of every policy.
    pub(crate) problems: BTreeSet<PolicyProblem>,
    /// flock's condition for each ClusterNetworkPolicy, by name.
    pub(crate) conditions: BTreeMap<String, status::Desired>,
}

impl Findings {
    /// The findings of a snapshot (validating every policy: thousands take a while).
    pub(crate) fn of(snapshot: &Snapshot) -> Self {
        let problems: BTreeSet<PolicyProblem> = translate::validate_all(snapshot).into_iter().collect();
        let mut by_cnp: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for p in problems.iter().filter(|p| p.kind == PolicyKind::ClusterNetworkPolicy) {
            by_cnp.entry(p.policy.name.as_str()).or_default().push(format!("{}: {}", p.field, p.message));
        }
        let conditions = snapshot
            .cluster_policies()
            .map(|c| (c.name.clone(), status::Desired::new(c, by_cnp.get(c.name.as_str()).map_or(&[][..], Vec::as_slice))))
            .collect();
        Self { problems, conditions }
    }
}

/// The current findings; `None` until the snapshot is complete.
type Problems = Option<Arc<Findings>>;

/// One agent's reporting: the metric always, the Events while it holds the Lease.
pub struct Reporter {
    opts: ReportOptions,
    client: Client,
    /// This agent (its pod name): the Lease's holder identity, the Events' reporting instance.
    instance: String,
    /// `None`: Events are off; only the metric is kept.
    elector: Option<Elector>,
}

impl Reporter {
    /// `publish`: take part in the election and publish Events while holding the Lease.
    pub fn new(client: Client, opts: ReportOptions, instance: &str, publish: bool) -> Result<Self, LeaseError> {
        let elector = if publish {
            Some(Elector::new(client.clone(), opts.lease.clone(), instance, "the reporter of policy problems")?)
        } else {
            None
        };
        Ok(Self { opts, client, instance: instance.into(), elector })
    }

    /// Runs until `stop` turns true, then releases the Lease if it holds it. One future with no
    /// tasks of its own: dropping it stops everything (no release then).
    pub async fn run(self, source: Source, metrics: Arc<Metrics>, stop: watch::Receiver<bool>) {
        let (tx, rx) = watch::channel(None);
        let track = track(source, metrics.clone(), tx, self.opts.recompute_interval, stop.clone());
        let Some(elector) = self.elector else { return track.await };
        let publisher = Publisher { opts: self.opts, client: self.client, instance: self.instance, metrics: metrics.clone() };
        tokio::join!(track, lead(elector, publisher, rx, metrics, stop));
    }
}

/// Recomputes every policy's problems when the snapshot changes (at most once per `every`),
/// sets the metric, and publishes the set when it differs.
async fn track(source: Source, metrics: Arc<Metrics>, tx: watch::Sender<Problems>, every: Duration, mut stop: watch::Receiver<bool>) {
    let mut versions = source.versions();
    let mut last = None;
    loop {
        let current = *versions.borrow_and_update();
        if current.is_some() && current != last {
            let (version, snapshot) = source.snapshot();
            last = Some(version);
            // Off the async workers: thousands of policies take a while to compile.
            match tokio::task::spawn_blocking(move || Findings::of(&snapshot)).await {
                Ok(found) => {
                    tracing::debug!(version, problems = found.problems.len(), "validated every policy");
                    metrics.cluster_problems(found.problems.len());
                    let enforced = found.conditions.values().filter(|c| c.enforced).count();
                    metrics.cluster_policies_enforced(enforced, found.conditions.len() - enforced);
                    tx.send_if_modified(|old| {
                        let changed = old.as_deref() != Some(&found);
                        if changed {
                            *old = Some(Arc::new(found));
                        }
                        changed
                    });
                }
                Err(e) => tracing::error!(error = %e, "validating every policy failed; policy problems not updated"),
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            continue;
        }
        tokio::select! {
            r = versions.changed() => if r.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Campaigns for the Lease and publishes while holding it, until `stop`.
async fn lead(
    mut elector: Elector,
    publisher: Publisher,
    mut problems: watch::Receiver<Problems>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        if !elector.acquire(&mut stop).await {
            return;
        }
        metrics.reporter(true);
        // `hold` returns by the renew deadline when renewals fail, before another agent may
        // take the Lease; the publisher (and any request of it in flight) is dropped then.
        let statuses = status::StatusWriter {
            client: publisher.client.clone(),
            metrics: metrics.clone(),
            retry: publisher.opts.retry,
            request_interval: publisher.opts.request_interval,
        };
        let mut for_status = problems.clone();
        let held = tokio::select! {
            held = elector.hold(&mut stop) => held,
            // Ends only when the problems' sender is gone, i.e. on stop.
            _ = async { tokio::join!(publisher.publish(&mut problems), statuses.publish(&mut for_status)) } => Ok(()),
        };
        metrics.reporter(false);
        match held {
            Ok(()) => {
                elector.release().await;
                return;
            }
            Err(e) => tracing::warn!(error = %e, "no longer reporting policy problems; another agent will"),
        }
    }
}

/// One problem's Event, as the reporter knows it.
#[derive(Debug)]
struct Series {
    /// The Event's name (in the policy's namespace).
    name: String,
    /// Observations so far: the first, one per heartbeat it lasted, one per return.
    count: i32,
    /// The count the Event on the server has; `None` until read or written in this tenure.
    written: Option<i32>,
    /// When the next request for it is due (a heartbeat, a retry, or now).
    due: Instant,
    /// Since when the problem is gone (not reported; forgotten after a while).
    resolved: Option<Instant>,
}

/// Spaces requests out.
struct Pacer {
    interval: Duration,
    next: Instant,
}

impl Pacer {
    async fn wait(&mut self) {
        tokio::time::sleep_until(self.next.into()).await;
        self.next = Instant::now() + self.interval;
    }
}

/// The holder's side: writes the Events.
struct Publisher {
    opts: ReportOptions,
    client: Client,
    instance: String,
    metrics: Arc<Metrics>,
}

/// Waits until `due` (without one, for ever) or until `changes` moves. `None`: its sender is
/// gone; `Some(true)`: it moved (and is marked seen).
async fn wait_due(due: Option<Instant>, changes: &mut watch::Receiver<Problems>) -> Option<bool> {
    let sleep = async {
        match due {
            Some(t) => tokio::time::sleep_until(t.into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = sleep => Some(false),
        r = changes.changed() => r.ok().map(|()| true),
    }
}

impl Publisher {
    /// Reports the problems as they come, until the sender is dropped. Starts from nothing
    /// known: each problem's Event is read (or created) first.
    async fn publish(&self, problems: &mut watch::Receiver<Problems>) {
        let mut series: BTreeMap<PolicyProblem, Series> = BTreeMap::new();
        let mut pacer = Pacer { interval: self.opts.request_interval, next: Instant::now() };
        // A gone problem's state is kept over two heartbeats, so one that comes back soon
        // continues its series without a read; the Event has expired by then (1 h TTL).
        let forget = self.opts.heartbeat * 2;
        // (`changed()` marks the value seen: remember that it fired.)
        let mut changed = true;
        loop {
            if std::mem::take(&mut changed) || problems.has_changed().unwrap_or(false) {
                let current = problems.borrow_and_update().clone();
                if let Some(current) = current {
                    observe(&mut series, &current.problems);
                }
            }
            let now = Instant::now();
            series.retain(|_, s| s.resolved.is_none_or(|t| now.duration_since(t) < forget));
            let next = series.iter().filter(|(_, s)| s.resolved.is_none()).min_by_key(|(_, s)| s.due).map(|(p, s)| (p.clone(), s.due));
            let wake = match next {
                Some((p, due)) if due <= now => {
                    if let Some(s) = series.get_mut(&p) {
                        self.write(&p, s, &mut pacer).await;
                    }
                    continue;
                }
                Some((_, due)) => Some(due),
                None => None,
            };
            let Some(moved) = wait_due(wake, problems).await else { return };
            changed = moved;
        }
    }

    /// The request a due series needs: read or create its Event, or a heartbeat.
    async fn write(&self, p: &PolicyProblem, s: &mut Series, pacer: &mut Pacer) {
        let api: Api<Event> = Api::namespaced(self.client.clone(), event_namespace(p));
        let result = match s.written {
            None => self.open(&api, p, s, pacer).await,
            Some(written) => {
                if s.count == written {
                    // No occurrence pending: this heartbeat is one.
                    s.count = s.count.saturating_add(1);
                }
                self.patch(&api, p, s, pacer).await
            }
        };
        if let Err(e) = result {
            tracing::warn!(policy = %p.policy, event = %s.name, error = %e, retry = ?self.opts.retry, "cannot report a policy problem");
            s.due = Instant::now() + self.opts.retry;
        }
    }

    /// Continues the series of the problem's Event if it exists (nothing is written before
    /// its next heartbeat), else creates it.
    async fn open(&self, api: &Api<Event>, p: &PolicyProblem, s: &mut Series, pacer: &mut Pacer) -> Result<(), kube::Error> {
        pacer.wait().await;
        let found = api.get_opt(&s.name).await;
        self.metrics.event_request("get", found.is_ok());
        let Some(ev) = found? else { return self.create(api, p, s, pacer).await };
        let (count, last) = match &ev.series {
            Some(series) => (series.count.max(1), Some(series.last_observed_time.0)),
            None => (1, ev.event_time.as_ref().map(|t| t.0)),
        };
        // Occurrences seen here before the read (returns) are added to the server's.
        s.count = count.saturating_add(s.count - 1);
        s.written = Some(count);
        // The heartbeat counts from the last write, by whoever made it (wall clocks: a skew
        // between nodes moves one heartbeat by as much, no more).
        let age = last.map_or(Duration::ZERO, |t| Duration::try_from(Timestamp::now().duration_since(t)).unwrap_or(Duration::ZERO));
        s.due = Instant::now() + self.opts.heartbeat.saturating_sub(age);
        tracing::debug!(policy = %p.policy, event = %s.name, count, "continuing the series of an existing Event");
        Ok(())
    }

    async fn create(&self, api: &Api<Event>, p: &PolicyProblem, s: &mut Series, pacer: &mut Pacer) -> Result<(), kube::Error> {
        pacer.wait().await;
        let created = api.create(&PostParams::default(), &event(p, &s.name, &self.instance, Timestamp::now())).await;
        self.metrics.event_request("create", created.is_ok());
        match created {
            Ok(_) => {
                tracing::info!(policy = %p.policy, field = %p.field, problem = %p.message, event = %s.name, "reported a policy problem");
                s.count = 1;
                s.written = Some(1);
                s.due = Instant::now() + self.opts.heartbeat;
                Ok(())
            }
            // Created since it was read: read it again (at once).
            Err(kube::Error::Api(st)) if st.is_already_exists() => {
                s.written = None;
                s.due = Instant::now();
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn patch(&self, api: &Api<Event>, p: &PolicyProblem, s: &mut Series, pacer: &mut Pacer) -> Result<(), kube::Error> {
        pacer.wait().await;
        // Only `series` may change on an events.k8s.io/v1 Event.
        let body = serde_json::json!({"series": {"count": s.count, "lastObservedTime": MicroTime(Timestamp::now())}});
        let patched = api.patch(&s.name, &PatchParams::default(), &Patch::Merge(&body)).await;
        self.metrics.event_request("patch", patched.is_ok());
        match patched {
            Ok(_) => {
                tracing::debug!(policy = %p.policy, event = %s.name, count = s.count, "policy problem still there");
                s.written = Some(s.count);
                s.due = Instant::now() + self.opts.heartbeat;
                Ok(())
            }
            // Expired (the event TTL) or deleted: a new Event.
            Err(kube::Error::Api(st)) if st.is_not_found() => self.create(api, p, s, pacer).await,
            Err(e) => Err(e),
        }
    }
}

/// Folds the current problems into the series: new ones are due now, gone ones stop, ones
/// that came back count one more occurrence.
fn observe(series: &mut BTreeMap<PolicyProblem, Series>, current: &BTreeSet<PolicyProblem>) {
    let now = Instant::now();
    for (p, s) in series.iter_mut() {
        if s.resolved.is_none() && !current.contains(p) {
            tracing::info!(policy = %p.policy, field = %p.field, problem = %p.message, "policy problem gone; no longer reported");
            s.resolved = Some(now);
        }
    }
    for p in current {
        match series.get_mut(p) {
            None => {
                let s = Series { name: event_name(p), count: 1, written: None, due: now, resolved: None };
                series.insert(p.clone(), s);
            }
            Some(s) if s.resolved.is_some() => {
                s.resolved = None;
                s.count = s.count.saturating_add(1);
            }
            Some(_) => {}
        }
    }
}

/// The Event's name: the policy's name (shortened to fit) and a hash of everything that
/// identifies the problem. A valid DNS subdomain when the policy's name is one.
pub(crate) fn event_name(p: &PolicyProblem) -> String {
    let mut h = Sha256::new();
    for part in [REASON, &p.policy.namespace, &p.policy.name, &p.field, &p.message] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    let hash: String = h.finalize()[..8].iter().map(|b| format!("{b:02x}")).collect();
    // 253 bytes at most; each dot-separated label must end with a letter or digit.
    let prefix = truncate(&p.policy.name, 253 - 1 - hash.len()).trim_end_matches(['.', '-']);
    if prefix.is_empty() { hash } else { format!("{prefix}.{hash}") }
}

/// The namespace of a problem's Event: the policy's, or `default` for a cluster-scoped one.
pub(crate) fn event_namespace(p: &PolicyProblem) -> &str {
    match p.kind {
        PolicyKind::NetworkPolicy => &p.policy.namespace,
        PolicyKind::ClusterNetworkPolicy => CLUSTER_EVENT_NAMESPACE,
    }
}

/// The Event for a problem, as created.
pub(crate) fn event(p: &PolicyProblem, name: &str, instance: &str, now: Timestamp) -> Event {
    // The message says what flock does instead (fail closed): e.g. "this rule allows nothing".
    let note = format!("{}: {}", p.field, p.message);
    Event {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some(event_namespace(p).into()), ..ObjectMeta::default() },
        event_time: Some(MicroTime(now)),
        type_: Some("Warning".into()),
        reason: Some(REASON.into()),
        action: Some("Enforce".into()),
        // The API's limits: 1 kB of note, 128 bytes of reporting instance.
        note: Some(truncate(&note, 1024).into()),
        regarding: Some(match p.kind {
            PolicyKind::NetworkPolicy => ObjectReference {
                api_version: Some("networking.k8s.io/v1".into()),
                kind: Some("NetworkPolicy".into()),
                namespace: Some(p.policy.namespace.clone()),
                name: Some(p.policy.name.clone()),
                ..ObjectReference::default()
            },
            PolicyKind::ClusterNetworkPolicy => ObjectReference {
                api_version: Some(crate::model::cnp::API_VERSION.into()),
                kind: Some(crate::model::cnp::KIND.into()),
                name: Some(p.policy.name.clone()),
                ..ObjectReference::default()
            },
        }),
        reporting_controller: Some(CONTROLLER.into()),
        reporting_instance: Some(truncate(instance, 128).into()),
        ..Event::default()
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ObjectRef;

    fn problem(name: &str, field: &str) -> PolicyProblem {
        PolicyProblem {
            kind: Default::default(),
            policy: ObjectRef::new("shop", name),
            field: field.into(),
            message: "endPort 70 is below port 80".into(),
        }
    }

    #[test]
    fn event_names_are_stable_distinct_and_valid() {
        let a = event_name(&problem("web", "spec.ingress[0].ports[0]"));
        assert_eq!(a, event_name(&problem("web", "spec.ingress[0].ports[0]")));
        assert!(a.starts_with("web.") && a.len() == "web.".len() + 16, "{a}");
        assert_ne!(a, event_name(&problem("web", "spec.ingress[0].ports[1]")));
        assert_ne!(a, event_name(&problem("web2", "spec.ingress[0].ports[0]")));
        // A long name is shortened to 253 bytes, its last label still ending in a letter.
        let long = format!("{}-{}", "a".repeat(235), "b".repeat(17));
        let n = event_name(&problem(&long, "spec"));
        assert!(n.len() <= 253, "{}", n.len());
        assert!(n.starts_with(&"a".repeat(235)) && !n.contains("-."), "{n}");
        // Two long names that share the kept prefix still get different Events.
        assert_ne!(n, event_name(&problem(&format!("{}-{}", "a".repeat(235), "c".repeat(17)), "spec")));
    }

    #[test]
    fn events_respect_the_api_limits() {
        let mut p = problem("web", "spec.ingress[0]");
        p.message = "é".repeat(2000);
        let ev = event(&p, "web.x", &"i".repeat(300), Timestamp::UNIX_EPOCH);
        assert!(ev.note.as_ref().unwrap().len() <= 1024);
        assert_eq!(ev.reporting_instance.as_ref().unwrap().len(), 128);
        assert_eq!(ev.regarding.as_ref().unwrap().namespace.as_deref(), Some("shop"));
        assert_eq!(ev.metadata.namespace.as_deref(), Some("shop"));
        assert!(ev.series.is_none() && ev.deprecated_count.is_none());
    }

    #[test]
    fn a_cluster_policys_event_goes_to_default_regarding_the_cluster_scoped_object() {
        let p = PolicyProblem {
            kind: PolicyKind::ClusterNetworkPolicy,
            policy: ObjectRef::new("", "deny-all"),
            field: "spec.ingress[0].action".into(),
            message: "unknown action \"Allow\"".into(),
        };
        let ev = event(&p, &event_name(&p), "i", Timestamp::UNIX_EPOCH);
        assert_eq!(ev.metadata.namespace.as_deref(), Some("default"));
        let r = ev.regarding.unwrap();
        assert_eq!(r.api_version.as_deref(), Some("policy.networking.k8s.io/v1alpha2"));
        assert_eq!((r.kind.as_deref(), r.name.as_deref(), r.namespace.as_deref()), (Some("ClusterNetworkPolicy"), Some("deny-all"), None));
        // Not the Event of a NetworkPolicy default/deny-all with the same problem.
        let np = PolicyProblem { kind: PolicyKind::NetworkPolicy, policy: ObjectRef::new("default", "deny-all"), ..p.clone() };
        assert_ne!(event_name(&p), event_name(&np));
    }

    #[test]
    fn problems_that_go_stop_and_ones_that_return_count_again() {
        let (a, b) = (problem("a", "spec"), problem("b", "spec"));
        let mut series = BTreeMap::new();
        observe(&mut series, &BTreeSet::from([a.clone(), b.clone()]));
        assert_eq!(series.len(), 2);
        assert!(series.values().all(|s| s.count == 1 && s.written.is_none() && s.resolved.is_none()));
        observe(&mut series, &BTreeSet::from([a.clone()]));
        assert!(series[&b].resolved.is_some());
        observe(&mut series, &BTreeSet::from([a.clone(), b.clone()]));
        assert!(series[&b].resolved.is_none());
        assert_eq!(series[&b].count, 2);
        assert_eq!(series[&a].count, 1);
    }
}
