//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas never reconcile at
//! once (they would apply the same policies and fight over status).
//!
//! The algorithm is client-go's: a candidate takes the Lease when it is free (no holder) or
//! when the record has not changed for `lease_duration` *as measured by the candidate's own
//! clock* since it last saw it change — never by comparing the record's timestamps with its
//! clock, so clock skew between nodes does not matter. Every write is a replace carrying the
//! resourceVersion that was read (optimistic concurrency): of two candidates racing for a
//! free Lease, the API server lets exactly one through and the other gets 409 Conflict.
//!
//! The leader renews every `retry_period`. If it has not renewed successfully for
//! `renew_deadline` (shorter than `lease_duration`), or sees another holder, it stops its
//! work before anyone else may take over: a follower waits `lease_duration` from when it
//! *observed* the last renewal, which is after the leader made it, so the leader's deadline
//! always passes first. A leader that stops cleanly releases the Lease (no holder, 1 s
//! duration), so a successor takes over within a retry period instead of a lease duration.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;

/// Where and how to elect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    /// This replica (its pod name).
    pub identity: String,
    /// How long a Lease not renewed stays with its holder.
    pub lease_duration: Duration,
    /// How long the leader keeps working without a successful renewal.
    pub renew_deadline: Duration,
    /// How often to renew, or to retry taking the Lease.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's defaults: 15 s, 10 s, 2 s.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Why leading ended other than by `stop`.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lost the Lease {namespace}/{name}: {why}")]
    Lost { namespace: String, name: String, why: String },
    #[error(
        "invalid leader election settings: renew deadline {renew:?} must be shorter than the lease duration {lease:?}, and the retry period {retry:?} shorter than the renew deadline"
    )]
    Settings { lease: Duration, renew: Duration, retry: Duration },
}

/// What one attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Attempt {
    /// This replica holds the Lease (taken or renewed).
    Held,
    /// Another replica holds it (its identity).
    Other(String),
}

/// What identifies one state of the Lease: holder, renew time, transitions.
type Record = (Option<String>, Option<MicroTime>, Option<i32>);

/// A candidate.
pub struct Elector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    /// The last record seen and when it was first seen.
    observed: Option<(Record, Instant)>,
}

impl Elector {
    pub fn new(client: Client, cfg: LeaseConfig) -> Result<Self, LeaderError> {
        if cfg.renew_deadline >= cfg.lease_duration || cfg.retry_period >= cfg.renew_deadline {
            return Err(LeaderError::Settings { lease: cfg.lease_duration, renew: cfg.renew_deadline, retry: cfg.retry_period });
        }
        Ok(Self { api: Api::namespaced(client, &cfg.namespace), cfg, observed: None })
    }

    fn lost(&self, why: impl Into<String>) -> LeaderError {
        LeaderError::Lost { namespace: self.cfg.namespace.clone(), name: self.cfg.name.clone(), why: why.into() }
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.cfg.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// One read and, when allowed, one write. API errors are returned to the caller, which
    /// retries.
    async fn attempt(&mut self) -> Result<Attempt, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let Some(lease) = self.api.get_opt(&self.cfg.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.cfg.identity.clone()),
                    lease_duration_seconds: Some(self.duration_seconds()),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Held),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Other(String::new())),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let record = (spec.holder_identity.clone(), spec.renew_time.clone(), spec.lease_transitions);
        if self.observed.as_ref().is_none_or(|(r, _)| *r != record) {
            self.observed = Some((record, Instant::now()));
        }
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let mine = holder.as_deref() == Some(self.cfg.identity.as_str());
        if let Some(other) = holder.as_ref().filter(|_| !mine) {
            let duration =
                spec.lease_duration_seconds.and_then(|s| u64::try_from(s).ok()).map_or(self.cfg.lease_duration, Duration::from_secs);
            let seen_at = self.observed.as_ref().map_or_else(Instant::now, |(_, t)| *t);
            if seen_at.elapsed() < duration {
                return Ok(Attempt::Other(other.clone()));
            }
            tracing::info!(previous = %other, "the Lease expired; taking it");
        }
        let mut next = lease;
        next.spec = Some(LeaseSpec {
            holder_identity: Some(self.cfg.identity.clone()),
            lease_duration_seconds: Some(self.duration_seconds()),
            acquire_time: if mine { spec.acquire_time.clone() } else { Some(now.clone()) },
            renew_time: Some(now),
            lease_transitions: Some(spec.lease_transitions.unwrap_or(0) + i32::from(!mine)),
            ..spec
        });
        // `next` keeps the resourceVersion read above: a concurrent write makes this fail.
        match self.api.replace(&self.cfg.name, &PostParams::default(), &next).await {
            Ok(written) => {
                let s = written.spec.unwrap_or_default();
                self.observed = Some(((s.holder_identity, s.renew_time, s.lease_transitions), Instant::now()));
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Other(holder.unwrap_or_default())),
            Err(e) => Err(e),
        }
    }

    /// Waits until this replica holds the Lease; `false` when `stop` came first.
    pub async fn acquire(&mut self, stop: &mut watch::Receiver<bool>) -> bool {
        let mut last_holder = None;
        loop {
            if *stop.borrow() {
                return false;
            }
            match self.attempt().await {
                Ok(Attempt::Held) => {
                    tracing::info!(lease = %format!("{}/{}", self.cfg.namespace, self.cfg.name), identity = %self.cfg.identity, "became the leader");
                    return true;
                }
                Ok(Attempt::Other(h)) => {
                    if last_holder.as_ref() != Some(&h) {
                        tracing::info!(leader = %h, "another replica leads; waiting");
                        last_holder = Some(h);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reading the leader Lease"),
            }
            tokio::select! {
                _ = tokio::time::sleep(self.cfg.retry_period) => {}
                _ = stop.wait_for(|s| *s) => return false,
            }
        }
    }

    /// Renews until `stop` (then `Ok`) or until the Lease is lost.
    pub async fn hold(&mut self, stop: &mut watch::Receiver<bool>) -> Result<(), LeaderError> {
        let mut renewed = Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.cfg.retry_period) => {}
                _ = stop.wait_for(|s| *s) => return Ok(()),
            }
            // A renewal that hangs must not outlive the deadline.
            let left = self.cfg.renew_deadline.saturating_sub(renewed.elapsed());
            match tokio::time::timeout(left, self.attempt()).await {
                Ok(Ok(Attempt::Held)) => renewed = Instant::now(),
                Ok(Ok(Attempt::Other(h))) => return Err(self.lost(format!("now held by {h:?}"))),
                Ok(Err(e)) => tracing::warn!(error = %e, "renewing the leader Lease"),
                Err(_) => {}
            }
            if renewed.elapsed() >= self.cfg.renew_deadline {
                return Err(self.lost(format!("not renewed for {:?}", self.cfg.renew_deadline)));
            }
        }
    }

    /// Gives the Lease up (when this replica holds it), so a successor need not wait.
    pub async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.cfg.name).await else { return };
        let Some(spec) = lease.spec.as_mut() else { return };
        if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await {
            Ok(_) => tracing::info!("released the leader Lease"),
            Err(e) => tracing::warn!(error = %e, "releasing the leader Lease"),
        }
    }
}

/// Runs `work` while this replica leads: waits for the Lease, starts `work` with a stop
/// signal of its own, renews, and when `stop` turns true or the Lease is lost, stops `work`,
/// waits for it to end and (on `stop`) releases the Lease. `on_change` is told when
/// leadership starts and ends. A lost Lease is an error: the process should exit (and be
/// restarted as a candidate), as client-go's users do.
pub async fn lead<W, F>(
    client: Client,
    cfg: LeaseConfig,
    mut stop: watch::Receiver<bool>,
    on_change: impl Fn(bool),
    work: W,
) -> Result<(), LeaderError>
where
    W: FnOnce(watch::Receiver<bool>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let mut elector = Elector::new(client, cfg)?;
    if !elector.acquire(&mut stop).await {
        return Ok(());
    }
    on_change(true);
    let (work_stop_tx, work_stop) = watch::channel(false);
    let task = tokio::spawn(work(work_stop));
    let held = elector.hold(&mut stop).await;
    let _ = work_stop_tx.send(true);
    if let Err(e) = task.await {
        tracing::error!(error = %e, "the leader's work panicked");
    }
    on_change(false);
    match held {
        Ok(()) => {
            elector.release().await;
            Ok(())
        }
        Err(e) => Err(e),
    }
}
