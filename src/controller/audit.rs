//! The durable audit trail of runs' egress: one [`AuditEvent`] per grant, change,
//! withdrawal and expiry, written by the controller into the run's namespace. AuditEvents are
//! not owned by their Run (they outlive it) and are immutable (a CEL rule); only
//! [`collect`]'s retention removes them: older than `max_age`, or beyond the newest
//! `max_per_run` of a run.
//!
//! [`decide`] (pure) compares the run's egress now with the last one recorded
//! (`status.grant`); a change is written *after* the policy is applied (the event then
//! carries the policy's generation) and *before* `status.grant` moves on, so a failed write is
//! retried by the next reconcile. Retries cannot duplicate: an event's name is a function of
//! the run's uid and its sequence number, and a create that finds it there (409) is done.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};
use sha2::{Digest, Sha256};

use super::FIELD_MANAGER;
use super::render::run_label_value;
use crate::crd::{AuditAction, AuditEvent, AuditEventSpec, AuditPolicy, AuditProfile, AuditRun, Grant, Run};
use crate::model::RUN_LABEL;

/// The label holding an AuditEvent's run uid (its retention groups by it).
pub const RUN_UID_LABEL: &str = "flock.dev/run-uid";

/// Retention of AuditEvents (`--audit-max-age`, `--audit-max-per-run`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub max_age: Duration,
    pub max_per_run: usize,
    /// How often [`collect`] runs.
    pub interval: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self { max_age: Duration::from_secs(90 * 24 * 3600), max_per_run: 100, interval: Duration::from_secs(600) }
    }
}

/// A change of a run's egress to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub(crate) action: AuditAction,
    pub(crate) reason: &'static str,
    pub(crate) added: Vec<String>,
    pub(crate) removed: Vec<String>,
}

/// Reasons of AuditEvents.
pub(crate) mod reason {
    pub(crate) const GRANTED: &str = "RunStarted";
    pub(crate) const EGRESS_CHANGED: &str = "EgressChanged";
    pub(crate) const DEADLINE_CHANGED: &str = "DeadlineChanged";
    pub(crate) const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
    pub(crate) const DEADLINE_EXTENDED: &str = "DeadlineExtended";
    pub(crate) const WITHDRAWN: &str = "NetworkPolicyWithdrawn";
}

/// What the egress now (`destinations`, none when `expired`) is, against the last recorded
/// grant; `None` when nothing changed.
pub(crate) fn decide(prev: Option<&Grant>, destinations: &[String], expired: bool, expires_at: Option<&str>) -> Option<Change> {
    let now: BTreeSet<&String> = if expired { BTreeSet::new() } else { destinations.iter().collect() };
    let Some(prev) = prev else {
        return Some(if expired {
            Change { action: AuditAction::Expired, reason: reason::DEADLINE_EXCEEDED, added: Vec::new(), removed: Vec::new() }
        } else {
            Change { action: AuditAction::Granted, reason: reason::GRANTED, added: destinations.to_vec(), removed: Vec::new() }
        });
    };
    let before: BTreeSet<&String> = prev.destinations.iter().collect();
    let added: Vec<String> = now.difference(&before).map(|s| (*s).clone()).collect();
    let removed: Vec<String> = before.difference(&now).map(|s| (*s).clone()).collect();
    let (action, reason) = match (prev.expired, expired) {
        (false, true) => (AuditAction::Expired, reason::DEADLINE_EXCEEDED),
        (true, false) => (AuditAction::Extended, reason::DEADLINE_EXTENDED),
        // Still expired: nothing is granted, whatever the profile or deadline say now.
        (true, true) => return None,
        (false, false) if !added.is_empty() || !removed.is_empty() => (AuditAction::Changed, reason::EGRESS_CHANGED),
        (false, false) if prev.expires_at.as_deref() != expires_at => (AuditAction::Changed, reason::DEADLINE_CHANGED),
        (false, false) => return None,
    };
    Some(Change { action, reason, added, removed })
}

/// The grant recorded once `change` is written as event `sequence`.
pub(crate) fn next_grant(sequence: i64, destinations: &[String], expired: bool, expires_at: Option<&str>) -> Grant {
    Grant {
        sequence,
        destinations: if expired { Vec::new() } else { destinations.to_vec() },
        expired,
        expires_at: expires_at.map(str::to_string),
    }
}

/// The name of a run's `sequence`th AuditEvent: the run's name (shortened), a hash of its
/// uid (a run created again under its name starts a new trail) and the sequence.
pub(crate) fn event_name(run: &str, uid: &str, sequence: i64) -> String {
    let hash: String = Sha256::digest(uid.as_bytes()).iter().take(4).map(|b| format!("{b:02x}")).collect();
    let cut = run.get(..run.len().min(200)).unwrap_or(run).trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{cut}-{hash}-{sequence}")
}

/// Everything an AuditEvent says besides the change.
#[derive(Debug, Clone)]
pub(crate) struct Record<'a> {
    pub(crate) run: &'a Run,
    pub(crate) profile: AuditProfile,
    pub(crate) policy: AuditPolicy,
    pub(crate) sequence: i64,
    pub(crate) message: String,
    pub(crate) expires_at: Option<String>,
    pub(crate) time: String,
}

/// The AuditEvent of `change` (pure).
pub(crate) fn event(record: &Record<'_>, change: &Change) -> AuditEvent {
    let run_name = record.run.name_any();
    let uid = record.run.uid().unwrap_or_default();
    let labels = BTreeMap::from([
        ("app.kubernetes.io/managed-by".to_string(), FIELD_MANAGER.to_string()),
        (RUN_LABEL.to_string(), run_label_value(&run_name)),
        (RUN_UID_LABEL.to_string(), uid.clone()),
    ]);
    AuditEvent {
        metadata: ObjectMeta {
            name: Some(event_name(&run_name, &uid, record.sequence)),
            namespace: record.run.namespace(),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: AuditEventSpec {
            run: AuditRun { name: run_name, uid },
            profile: record.profile.clone(),
            policy: record.policy.clone(),
            sequence: record.sequence,
            action: change.action,
            reason: change.reason.to_string(),
            message: record.message.clone(),
            added: change.added.clone(),
            removed: change.removed.clone(),
            expires_at: record.expires_at.clone(),
            time: record.time.clone(),
        },
    }
}

/// Why an AuditEvent could not be written or collected.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("writing AuditEvent {namespace}/{name}: {error}")]
    Write { namespace: String, name: String, error: kube::Error },
    #[error("listing AuditEvents: {0}")]
    List(kube::Error),
    #[error("deleting AuditEvent {namespace}/{name}: {error}")]
    Delete { namespace: String, name: String, error: kube::Error },
}

/// Creates `event`; one already there under its name (a retry) counts as written.
pub(crate) async fn write(client: &Client, event: &AuditEvent) -> Result<(), AuditError> {
    let namespace = event.namespace().unwrap_or_default();
    match Api::<AuditEvent>::namespaced(client.clone(), &namespace).create(&PostParams::default(), event).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(error) => Err(AuditError::Write { namespace, name: event.name_any(), error }),
    }
}

/// One AuditEvent as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Kept {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) run_uid: String,
    pub(crate) sequence: i64,
    /// `None`: unreadable (kept: retention never deletes what it cannot date).
    pub(crate) time: Option<Timestamp>,
}

/// Which events retention removes (pure): those older than `max_age` at `now`, and per run
/// all but the newest `max_per_run` (by sequence).
pub(crate) fn to_remove(events: &[Kept], now: Timestamp, retention: &Retention) -> Vec<(String, String)> {
    let max_age = SignedDuration::try_from(retention.max_age).unwrap_or(SignedDuration::MAX);
    let mut out: BTreeSet<(String, String)> = BTreeSet::new();
    let mut by_run: BTreeMap<&str, Vec<&Kept>> = BTreeMap::new();
    for e in events {
        if e.time.is_some_and(|t| now.duration_since(t) > max_age) {
            out.insert((e.namespace.clone(), e.name.clone()));
        }
        by_run.entry(e.run_uid.as_str()).or_default().push(e);
    }
    for (_, mut list) in by_run {
        list.sort_by_key(|e| std::cmp::Reverse(e.sequence));
        for e in list.into_iter().skip(retention.max_per_run) {
            out.insert((e.namespace.clone(), e.name.clone()));
        }
    }
    out.into_iter().collect()
}

/// Applies retention once: lists every AuditEvent (in pages) and deletes what
/// [`to_remove`] says. The number deleted.
pub async fn collect(client: &Client, now: Timestamp, retention: &Retention) -> Result<usize, AuditError> {
    let api = Api::<AuditEvent>::all(client.clone());
    let mut events = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.map_err(AuditError::List)?;
        for e in &page.items {
            events.push(Kept {
                namespace: e.namespace().unwrap_or_default(),
                name: e.name_any(),
                run_uid: e.spec.run.uid.clone(),
                sequence: e.spec.sequence,
                time: e.spec.time.parse().ok(),
            });
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    let remove = to_remove(&events, now, retention);
    for (namespace, name) in &remove {
        match Api::<AuditEvent>::namespaced(client.clone(), namespace).delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(error) => return Err(AuditError::Delete { namespace: namespace.clone(), name: name.clone(), error }),
        }
    }
    Ok(remove.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_defaults_to_90_days_and_100_per_run() {
        let r = Retention::default();
        assert_eq!((r.max_age, r.max_per_run, r.interval), (Duration::from_secs(90 * 24 * 3600), 100, Duration::from_secs(600)));
    }

    fn grant(destinations: &[&str], expired: bool, expires_at: Option<&str>) -> Grant {
        Grant {
            sequence: 1,
            destinations: destinations.iter().map(|s| s.to_string()).collect(),
            expired,
            expires_at: expires_at.map(str::to_string),
        }
    }

    fn d(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn changes_against_the_last_grant() {
        let g = decide(None, &d(&["a", "b"]), false, None).unwrap();
        assert_eq!((g.action, g.added.len(), g.removed.len()), (AuditAction::Granted, 2, 0));
        let e = decide(None, &d(&["a"]), true, Some("t")).unwrap();
        assert_eq!((e.action, e.added.len()), (AuditAction::Expired, 0));
        let prev = grant(&["a", "b"], false, None);
        assert_eq!(decide(Some(&prev), &d(&["a", "b"]), false, None), None);
        let c = decide(Some(&prev), &d(&["a", "c"]), false, None).unwrap();
        assert_eq!((c.action, c.added, c.removed), (AuditAction::Changed, d(&["c"]), d(&["b"])));
        let c = decide(Some(&prev), &d(&["a", "b"]), false, Some("t2")).unwrap();
        assert_eq!((c.action, c.reason), (AuditAction::Changed, reason::DEADLINE_CHANGED));
        let x = decide(Some(&prev), &d(&["a", "b"]), true, Some("t")).unwrap();
        assert_eq!((x.action, x.added.len(), x.removed), (AuditAction::Expired, 0, d(&["a", "b"])));
        let expired = grant(&[], true, Some("t"));
        assert_eq!(decide(Some(&expired), &d(&["a"]), true, Some("t")), None);
        assert_eq!(decide(Some(&expired), &d(&["a"]), true, Some("t-later")), None, "still expired: nothing granted");
        let x = decide(Some(&expired), &d(&["a"]), false, Some("t3")).unwrap();
        assert_eq!((x.action, x.added), (AuditAction::Extended, d(&["a"])));
        assert!(next_grant(2, &d(&["a"]), true, Some("t")).destinations.is_empty());
    }

    #[test]
    fn names_are_stable_per_uid_and_sequence() {
        let a = event_name("job-1", "u1", 1);
        assert_eq!(a, event_name("job-1", "u1", 1));
        assert_ne!(a, event_name("job-1", "u2", 1));
        assert_ne!(a, event_name("job-1", "u1", 2));
        let long = event_name(&"r".repeat(253), "u1", 100);
        assert!(long.len() <= 253, "{}", long.len());
    }

    #[test]
    fn retention_by_age_and_count() {
        let now: Timestamp = "2026-11-26T00:00:00Z".parse().unwrap();
        let at = |days: i64| Some(now - SignedDuration::from_hours(24 * days));
        let kept = |name: &str, run: &str, seq: i64, time| Kept {
            namespace: "a".into(),
            name: name.into(),
            run_uid: run.into(),
            sequence: seq,
            time,
        };
        let events = vec![
            kept("old", "u1", 1, at(91)),
            kept("r1-2", "u1", 2, at(10)),
            kept("r1-3", "u1", 3, at(5)),
            kept("r1-4", "u1", 4, at(1)),
            kept("undated", "u2", 1, None),
            kept("r2-2", "u2", 2, at(1)),
        ];
        let r = Retention { max_age: Duration::from_secs(90 * 24 * 3600), max_per_run: 2, interval: Duration::from_secs(1) };
        let got: Vec<String> = to_remove(&events, now, &r).into_iter().map(|(_, n)| n).collect();
        assert_eq!(got, ["old", "r1-2"]);
        let r = Retention { max_per_run: 1, ..r };
        let got: Vec<String> = to_remove(&events, now, &r).into_iter().map(|(_, n)| n).collect();
        assert_eq!(got, ["old", "r1-2", "r1-3", "undated"]);
    }
}
