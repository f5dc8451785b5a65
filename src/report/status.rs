//! flock's condition in each ClusterNetworkPolicy's `status.conditions`, written by the
//! reporter (the Lease holder) only.
//!
//! v1alpha2 defines `status.conditions` as a list of `metav1.Condition` (a list-map keyed by
//! `type`) and leaves their meaning to each implementation. flock writes one, of type
//! [`CONDITION_TYPE`] (domain-qualified, as `metav1.Condition` allows for types not defined
//! by the API): `True` (reason `EnforcedAsWritten`) or `False` (reason
//! `NotEnforceableAsWritten`, the message naming each field and what flock does instead), with
//! `observedGeneration`. It is written by server-side apply on the `status` subresource under
//! field manager [`FIELD_MANAGER`]: the API server merges the list by `type`, so other
//! implementations' conditions are left alone.
//!
//! Only changes are written. A new holder first reads each policy (one GET, paced) to learn
//! what is there, and writes nothing if flock's condition already says the same;
//! `lastTransitionTime` changes only when the status does. Enforcement never waits for these
//! writes; a failed one is retried after `retry`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::{Pacer, Problems, wait_due};
use crate::agent::metrics::Metrics;
use crate::model::cnp;

/// flock's condition type.
pub(crate) const CONDITION_TYPE: &str = "flock.dev/Enforced";
/// The server-side apply field manager of the condition.
pub(crate) const FIELD_MANAGER: &str = "flock";
pub(crate) const REASON_ENFORCED: &str = "EnforcedAsWritten";
pub(crate) const REASON_NOT_ENFORCED: &str = "NotEnforceableAsWritten";
/// `metav1.Condition`'s limit on `message`.
const MAX_MESSAGE: usize = 32_768;

/// What flock's condition on one policy should say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Desired {
    /// The object it belongs on (a policy deleted and created again is another object).
    pub(crate) uid: Option<String>,
    pub(crate) enforced: bool,
    pub(crate) message: String,
    pub(crate) observed_generation: Option<i64>,
}

impl Desired {
    /// The condition for a policy with these problems (`field: message` each).
    pub(crate) fn new(policy: &cnp::ClusterNetworkPolicy, problems: &[String]) -> Self {
        let message = if problems.is_empty() {
            "flock enforces this policy as written".to_string()
        } else {
            let text = format!("flock cannot enforce this policy as written and fails closed: {}", problems.join("; "));
            super::truncate(&text, MAX_MESSAGE).to_string()
        };
        Self { uid: policy.uid.clone(), enforced: problems.is_empty(), message, observed_generation: policy.generation }
    }

    fn reason(&self) -> &'static str {
        if self.enforced { REASON_ENFORCED } else { REASON_NOT_ENFORCED }
    }

    fn status(&self) -> &'static str {
        if self.enforced { "True" } else { "False" }
    }

    /// Whether `c` (flock's condition as found on the server) says this.
    fn is_written(&self, c: &Condition) -> bool {
        c.status == self.status()
            && c.reason == self.reason()
            && c.message == self.message
            && c.observed_generation == self.observed_generation
    }

    /// The condition to apply, given what the server has (its transition time is kept while
    /// the status stays).
    pub(crate) fn condition(&self, found: Option<&Condition>, now: Timestamp) -> Condition {
        let last_transition_time = match found {
            Some(c) if c.status == self.status() => c.last_transition_time.clone(),
            _ => Time(now),
        };
        Condition {
            type_: CONDITION_TYPE.into(),
            status: self.status().into(),
            reason: self.reason().into(),
            message: self.message.clone(),
            observed_generation: self.observed_generation,
            last_transition_time,
        }
    }
}

/// flock's condition in an object's status, if there and readable.
pub(crate) fn find_condition(object: &Value) -> Option<Condition> {
    let list = object.pointer("/status/conditions")?.as_array()?;
    let entry = list.iter().find(|c| c.get("type").and_then(Value::as_str) == Some(CONDITION_TYPE))?;
    serde_json::from_value(entry.clone()).ok()
}

/// What the holder knows of one policy's condition.
#[derive(Debug)]
struct Entry {
    desired: Desired,
    /// flock's condition on the server: `None` until read in this tenure; `Some(None)`: none.
    found: Option<Option<Condition>>,
    /// Nothing to do until the desired condition changes.
    settled: bool,
    due: Instant,
}

/// Folds the desired conditions in: new and changed ones are due now, gone ones forgotten.
fn observe(entries: &mut BTreeMap<String, Entry>, desired: &BTreeMap<String, Desired>) {
    let now = Instant::now();
    entries.retain(|name, _| desired.contains_key(name));
    for (name, d) in desired {
        match entries.get_mut(name) {
            Some(e) if e.desired == *d => {}
            // Another object of that name: what is known of the old one does not hold.
            Some(e) if e.desired.uid == d.uid => {
                e.desired = d.clone();
                e.settled = false;
                e.due = now;
            }
            _ => {
                entries.insert(name.clone(), Entry { desired: d.clone(), found: None, settled: false, due: now });
            }
        }
    }
}

/// The holder's side: writes the conditions.
pub(super) struct StatusWriter {
    pub(crate) client: Client,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) retry: Duration,
    pub(crate) request_interval: Duration,
}

impl StatusWriter {
    fn api(&self) -> Api<DynamicObject> {
        let ar = ApiResource {
            group: cnp::GROUP.into(),
            version: cnp::VERSION.into(),
            api_version: cnp::API_VERSION.into(),
            kind: cnp::KIND.into(),
            plural: cnp::PLURAL.into(),
        };
        Api::all_with(self.client.clone(), &ar)
    }

    /// Writes the conditions as they change, until the sender is dropped.
    pub(crate) async fn publish(&self, findings: &mut watch::Receiver<Problems>) {
        let api = self.api();
        let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
        let mut pacer = Pacer { interval: self.request_interval, next: Instant::now() };
        let mut changed = true;
        loop {
            if std::mem::take(&mut changed) || findings.has_changed().unwrap_or(false) {
                let current = findings.borrow_and_update().clone();
                if let Some(current) = current {
                    observe(&mut entries, &current.conditions);
                }
            }
            let now = Instant::now();
            let next = entries.iter().filter(|(_, e)| !e.settled).min_by_key(|(_, e)| e.due).map(|(n, e)| (n.clone(), e.due));
            let wake = match next {
                Some((name, due)) if due <= now => {
                    if let Some(e) = entries.get_mut(&name) {
                        self.step(&api, &name, e, &mut pacer).await;
                    }
                    continue;
                }
                Some((_, due)) => Some(due),
                None => None,
            };
            let Some(moved) = wait_due(wake, findings).await else { return };
            changed = moved;
        }
    }

    /// One request for a due entry: read what is there, or write what should be.
    async fn step(&self, api: &Api<DynamicObject>, name: &str, e: &mut Entry, pacer: &mut Pacer) {
        pacer.wait().await;
        let result = match &e.found {
            None => {
                let got = api.get_opt(name).await;
                self.metrics.status_request("get", got.is_ok());
                got.map(|o| match o {
                    // Gone (the watch will say so): nothing to write.
                    None => e.settled = true,
                    Some(o) => {
                        let found = serde_json::to_value(&o).ok().and_then(|v| find_condition(&v));
                        e.settled = found.as_ref().is_some_and(|c| e.desired.is_written(c));
                        if e.settled {
                            tracing::debug!(policy = name, "flock's status condition is already up to date");
                        }
                        e.found = Some(found);
                    }
                })
            }
            Some(found) => {
                let condition = e.desired.condition(found.as_ref(), Timestamp::now());
                let body = json!({
                    "apiVersion": cnp::API_VERSION, "kind": cnp::KIND, "metadata": {"name": name},
                    "status": {"conditions": [condition]},
                });
                let pp = PatchParams::apply(FIELD_MANAGER).force();
                let patched = api.patch_status(name, &pp, &Patch::Apply(&body)).await;
                self.metrics.status_request("apply", patched.is_ok());
                match patched {
                    Ok(_) => {
                        tracing::info!(policy = name, enforced = e.desired.enforced, message = %e.desired.message, "ClusterNetworkPolicy status condition written");
                        e.found = Some(Some(condition));
                        e.settled = true;
                        Ok(())
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        e.settled = true;
                        Ok(())
                    }
                    Err(err) => Err(err),
                }
            }
        };
        if let Err(err) = result {
            tracing::warn!(policy = name, error = %err, retry = ?self.retry, "cannot write the ClusterNetworkPolicy status condition");
            e.due = Instant::now() + self.retry;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(generation: i64) -> cnp::ClusterNetworkPolicy {
        cnp::ClusterNetworkPolicy { name: "p".into(), generation: Some(generation), uid: Some("u".into()), ..Default::default() }
    }

    #[test]
    fn the_condition_type_and_reasons_are_valid_for_metav1_condition() {
        // metav1.Condition: type `([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.…)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])`,
        // reason `[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?`.
        let (prefix, name) = CONDITION_TYPE.split_once('/').unwrap();
        assert!(prefix.split('.').all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')));
        assert!(name.bytes().all(|b| b.is_ascii_alphanumeric()) && CONDITION_TYPE.len() <= 316);
        for r in [REASON_ENFORCED, REASON_NOT_ENFORCED] {
            assert!(r.bytes().all(|b| b.is_ascii_alphanumeric()) && r.as_bytes()[0].is_ascii_alphabetic());
        }
    }

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let t0 = Timestamp::from_second(1_700_000_000).unwrap();
        let t1 = Timestamp::from_second(1_700_000_100).unwrap();
        let ok = Desired::new(&policy(1), &[]);
        let first = ok.condition(None, t0);
        assert_eq!((first.status.as_str(), first.reason.as_str(), first.observed_generation), ("True", REASON_ENFORCED, Some(1)));
        assert!(ok.is_written(&first));
        // A new generation, still enforced: same transition time, not written yet.
        let ok2 = Desired::new(&policy(2), &[]);
        assert!(!ok2.is_written(&first));
        assert_eq!(ok2.condition(Some(&first), t1).last_transition_time, Time(t0));
        // Not enforceable: a transition.
        let bad = Desired::new(&policy(3), &["spec.ingress[0].action: unknown action \"Allow\"".into()]);
        let c = bad.condition(Some(&first), t1);
        assert_eq!((c.status.as_str(), c.reason.as_str(), c.last_transition_time), ("False", REASON_NOT_ENFORCED, Time(t1)));
        assert!(c.message.contains("spec.ingress[0].action"), "{}", c.message);
        // A huge message is cut to the API's limit.
        let many: Vec<String> = (0..5000).map(|i| format!("spec.egress[{i}].to[0]: unreadable")).collect();
        assert!(Desired::new(&policy(1), &many).message.len() <= MAX_MESSAGE);
    }

    #[test]
    fn found_conditions_are_read_by_type() {
        let obj = json!({"status": {"conditions": [
            {"type": "other.dev/Accepted", "status": "True", "reason": "X", "message": "", "lastTransitionTime": "2024-01-01T00:00:00Z"},
            {"type": CONDITION_TYPE, "status": "False", "reason": REASON_NOT_ENFORCED, "message": "m", "observedGeneration": 4,
             "lastTransitionTime": "2024-01-01T00:00:00Z"}]}});
        let c = find_condition(&obj).unwrap();
        assert_eq!((c.status.as_str(), c.observed_generation), ("False", Some(4)));
        assert!(find_condition(&json!({"status": {}})).is_none());
    }

    #[test]
    fn changed_and_recreated_policies_are_due_again() {
        let mut entries = BTreeMap::new();
        let d = |g: i64, uid: &str| Desired { uid: Some(uid.into()), ..Desired::new(&policy(g), &[]) };
        observe(&mut entries, &BTreeMap::from([("p".to_string(), d(1, "u"))]));
        let e = entries.get_mut("p").unwrap();
        e.found = Some(None);
        e.settled = true;
        // Unchanged: stays settled.
        observe(&mut entries, &BTreeMap::from([("p".to_string(), d(1, "u"))]));
        assert!(entries["p"].settled);
        // A new generation: due, what was found still known.
        observe(&mut entries, &BTreeMap::from([("p".to_string(), d(2, "u"))]));
        assert!(!entries["p"].settled && entries["p"].found.is_some());
        // Another object of that name: read again.
        observe(&mut entries, &BTreeMap::from([("p".to_string(), d(2, "v"))]));
        assert!(!entries["p"].settled && entries["p"].found.is_none());
        // Gone: forgotten.
        observe(&mut entries, &BTreeMap::new());
        assert!(entries.is_empty());
    }
}
