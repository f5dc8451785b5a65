//! Election on a `coordination.k8s.io/v1` Lease: flock-controller's leader (two replicas
//! never reconcile at once) and flock-agent's reporter (one agent in the cluster publishes
//! the cluster-wide reports) are both this [`Elector`], with their own [`LeaseSettings`].
//!
//! The algorithm is client-go's: a candidate takes the Lease when it has no holder, or when
//! its record has not changed for the lease duration *as measured by the candidate's own
//! clock* since it last saw it change — never by comparing the record's timestamps with its
//! clock, so clock skew between nodes does not matter. Every write is a replace carrying the
//! resourceVersion read (optimistic concurrency): of two racing candidates exactly one wins,
//! the other gets 409 Conflict. The holder renews every renew period and gives up when it has
//! not renewed for the renew deadline, counted from when its last successful write was
//! *sent*; the deadline is shorter than the lease duration, which the others count from when
//! they *saw* that write, so the holder has stopped before anyone may take over. A holder
//! that stops cleanly releases the Lease (no holder, 1 s), so a candidate takes over within
//! its candidate period instead of a lease duration.
//!
//! Candidates poll every candidate period (plus up to half as much, at random) and read from
//! the API server's cache (`resourceVersion=0`): with a candidate on every node, 5,000 agents
//! reading with quorum every 2 s would be 2,500 etcd reads a second; every 60 s from the
//! cache is about 80 cached reads a second. A stale cached read is harmless: the replace that
//! follows fails with 409. The holder renews with quorum reads.

use std::future::Future;
use std::hash::BuildHasher;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{GetParams, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;

/// Where the Lease is and how it is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    /// How long a Lease not renewed stays with its holder.
    pub lease_duration: Duration,
    /// How long the holder keeps working without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the holder renews.
    pub renew_period: Duration,
    /// How often a candidate looks at the Lease (plus up to half as much, at random, so many
    /// candidates spread out).
    pub candidate_period: Duration,
}

impl LeaseSettings {
    /// client-go's timings: a 15 s Lease, a 10 s renew deadline, renewals and candidates
    /// every 2 s.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            renew_period: Duration::from_secs(2),
            candidate_period: Duration::from_secs(2),
        }
    }
}

/// Why the Lease cannot be used, or was lost.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error(
        "invalid settings for the Lease {namespace}/{name}: the renew period ({renew:?}) must be shorter than the renew deadline ({deadline:?}), the renew deadline shorter than the lease duration ({lease:?}), and the candidate period ({candidate:?}) not zero"
    )]
    Settings { namespace: String, name: String, renew: Duration, deadline: Duration, lease: Duration, candidate: Duration },
    #[error("lost the Lease {namespace}/{name}: {why}")]
    Lost { namespace: String, name: String, why: String },
}

/// What one attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Attempt {
    /// This candidate holds the Lease (taken or renewed).
    Held,
    /// Another holds it (its identity).
    Other(String),
}

/// What identifies one state of the Lease: holder, renew time, transitions.
type Record = (Option<String>, Option<MicroTime>, Option<i32>);

/// One candidate.
pub struct Elector {
    api: Api<Lease>,
    cfg: LeaseSettings,
    identity: String,
    /// What holding the Lease makes this process, for the logs ("the leader", "the reporter").
    role: &'static str,
    /// The last record seen and when it was first seen.
    observed: Option<(Record, Instant)>,
    /// When the last successful write of this candidate's claim was sent.
    renewed: Instant,
}

impl Elector {
    /// A candidate `identity` (its pod's name) for the Lease of `cfg`; holding it makes it
    /// `role`.
    pub fn new(client: Client, cfg: LeaseSettings, identity: &str, role: &'static str) -> Result<Self, LeaseError> {
        if cfg.renew_period >= cfg.renew_deadline || cfg.renew_deadline >= cfg.lease_duration || cfg.candidate_period.is_zero() {
            return Err(LeaseError::Settings {
                namespace: cfg.namespace,
                name: cfg.name,
                renew: cfg.renew_period,
                deadline: cfg.renew_deadline,
                lease: cfg.lease_duration,
                candidate: cfg.candidate_period,
            });
        }
        let api = Api::namespaced(client, &cfg.namespace);
        Ok(Self { api, cfg, identity: identity.into(), role, observed: None, renewed: Instant::now() })
    }

    fn lease(&self) -> String {
        format!("{}/{}", self.cfg.namespace, self.cfg.name)
    }

    fn lost(&self, why: impl Into<String>) -> LeaseError {
        LeaseError::Lost { namespace: self.cfg.namespace.clone(), name: self.cfg.name.clone(), why: why.into() }
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.cfg.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// One read and, when allowed, one write. API errors are returned to the caller, which
    /// retries. Candidates read from the API server's cache.
    async fn attempt(&mut self, candidate: bool) -> Result<Attempt, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let read = if candidate { GetParams::any() } else { GetParams::default() };
        let lease = match self.api.get_with(&self.cfg.name, &read).await {
            Ok(lease) => lease,
            Err(kube::Error::Api(s)) if s.is_not_found() => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.cfg.name.clone()),
                        namespace: Some(self.cfg.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(self.duration_seconds()),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                let sent = Instant::now();
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => {
                        self.renewed = sent;
                        Ok(Attempt::Held)
                    }
                    Err(kube::Error::Api(s)) if s.is_already_exists() || s.is_conflict() => Ok(Attempt::Other(String::new())),
                    Err(e) => Err(e),
                };
            }
            Err(e) => return Err(e),
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let record = (spec.holder_identity.clone(), spec.renew_time.clone(), spec.lease_transitions);
        if self.observed.as_ref().is_none_or(|(r, _)| *r != record) {
            self.observed = Some((record, Instant::now()));
        }
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let mine = holder.as_deref() == Some(self.identity.as_str());
        if let Some(other) = holder.as_ref().filter(|_| !mine) {
            let duration =
                spec.lease_duration_seconds.and_then(|s| u64::try_from(s).ok()).map_or(self.cfg.lease_duration, Duration::from_secs);
            let seen_at = self.observed.as_ref().map_or_else(Instant::now, |(_, t)| *t);
            if seen_at.elapsed() < duration {
                return Ok(Attempt::Other(other.clone()));
            }
            tracing::info!(lease = %self.lease(), previous = %other, "the Lease expired; taking it");
        }
        let mut next = lease;
        next.spec = Some(LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration_seconds()),
            acquire_time: if mine { spec.acquire_time.clone() } else { Some(now.clone()) },
            renew_time: Some(now),
            lease_transitions: Some(spec.lease_transitions.unwrap_or(0) + i32::from(!mine)),
            ..spec
        });
        // `next` keeps the resourceVersion read above: a concurrent write makes this fail.
        let sent = Instant::now();
        match self.api.replace(&self.cfg.name, &PostParams::default(), &next).await {
            Ok(written) => {
                self.renewed = sent;
                let s = written.spec.unwrap_or_default();
                self.observed = Some(((s.holder_identity, s.renew_time, s.lease_transitions), Instant::now()));
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(Attempt::Other(holder.unwrap_or_default())),
            Err(e) => Err(e),
        }
    }

    /// Waits until this candidate holds the Lease; `false` when `stop` came first.
    pub(crate) async fn acquire(&mut self, stop: &mut watch::Receiver<bool>) -> bool {
        let mut last_holder = None;
        loop {
            if *stop.borrow() {
                return false;
            }
            match self.attempt(true).await {
                Ok(Attempt::Held) => {
                    tracing::info!(lease = %self.lease(), identity = %self.identity, "holding the Lease: this process is now {}", self.role);
                    return true;
                }
                Ok(Attempt::Other(h)) => {
                    if last_holder.as_ref() != Some(&h) {
                        tracing::info!(lease = %self.lease(), holder = %h, "another process is {}; waiting", self.role);
                        last_holder = Some(h);
                    }
                }
                Err(e) => tracing::warn!(lease = %self.lease(), error = %e, "cannot read the Lease"),
            }
            let wait = self.cfg.candidate_period + jitter(self.cfg.candidate_period / 2);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return false,
            }
        }
    }

    /// Renews until `stop` (then `Ok`) or until the Lease is lost: another holder, or no
    /// successful renewal for the renew deadline. Returns by that deadline at the latest, so a
    /// caller that stops its work on return has stopped before anyone else may take over.
    pub(crate) async fn hold(&mut self, stop: &mut watch::Receiver<bool>) -> Result<(), LeaseError> {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.cfg.renew_period) => {}
                _ = stop.wait_for(|s| *s) => return Ok(()),
            }
            // A renewal that hangs must not outlive the deadline.
            let left = self.cfg.renew_deadline.saturating_sub(self.renewed.elapsed());
            match tokio::time::timeout(left, self.attempt(false)).await {
                Ok(Ok(Attempt::Held)) => {}
                Ok(Ok(Attempt::Other(h))) => return Err(self.lost(format!("now held by {h:?}"))),
                Ok(Err(e)) => tracing::warn!(lease = %self.lease(), error = %e, "cannot renew the Lease"),
                Err(_) => {}
            }
            if self.renewed.elapsed() >= self.cfg.renew_deadline {
                return Err(self.lost(format!("not renewed for {:?}", self.cfg.renew_deadline)));
            }
        }
    }

    /// Gives the Lease up (when this candidate holds it), so another need not wait out the
    /// lease duration.
    pub(crate) async fn release(&mut self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.cfg.name).await else { return };
        let Some(spec) = lease.spec.as_mut() else { return };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await {
            Ok(_) => tracing::info!(lease = %self.lease(), "released the Lease"),
            Err(e) => tracing::warn!(lease = %self.lease(), error = %e, "cannot release the Lease"),
        }
    }
}

/// Runs `work` while holding the Lease: waits for it, starts `work` with a stop signal of
/// its own, renews, and when `stop` turns true or the Lease is lost, stops `work`, waits for
/// it to end and (on `stop`) releases the Lease. `on_change` is told when holding starts and
/// ends. A lost Lease is an error: the process should exit (and be restarted as a
/// candidate), as client-go's users do.
pub async fn lead<W, F>(elector: Elector, mut stop: watch::Receiver<bool>, on_change: impl Fn(bool), work: W) -> Result<(), LeaseError>
where
    W: FnOnce(watch::Receiver<bool>) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let mut elector = elector;
    if !elector.acquire(&mut stop).await {
        return Ok(());
    }
    on_change(true);
    let (work_stop_tx, work_stop) = watch::channel(false);
    let task = tokio::spawn(work(work_stop));
    let held = elector.hold(&mut stop).await;
    let _ = work_stop_tx.send(true);
    if let Err(e) = task.await {
        tracing::error!(error = %e, "the work under the Lease panicked");
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

/// A random duration in `[0, max)`.
fn jitter(max: Duration) -> Duration {
    // A fresh RandomState is randomly keyed: enough randomness to spread polls, no crate.
    let r = std::collections::hash_map::RandomState::new().hash_one(0u8);
    max.mul_f64((r >> 11) as f64 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_below_its_bound_and_varies() {
        let max = Duration::from_secs(30);
        let draws: Vec<Duration> = (0..64).map(|_| jitter(max)).collect();
        assert!(draws.iter().all(|d| *d < max));
        assert!(draws.iter().any(|d| *d != draws[0]), "{draws:?}");
    }
}
