//! The SHA-256 of the committed ruleset (FlockNode's `ruleset.hash`), computed beside the sync
//! loop: never on a pod's path. After each commit that changed the table (and after the
//! first commit, which may change nothing after a restart), the loop leaves the ruleset here;
//! one task hashes the newest one left, at most once per [`INTERVAL`] (a large ruleset takes
//! tens of milliseconds to hash, and commits can come every few), and publishes it in
//! [`super::SyncStatus::ruleset_digest`]. Rulesets replaced before their turn are never
//! hashed, so the digest may trail the last commit by up to [`INTERVAL`].

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use super::Shared;
use crate::render::{Ruleset, Stats};

/// The shortest time between the starts of two hashes.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);

/// A committed ruleset's digest, with what else FlockNode reports of that ruleset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RulesetDigest {
    /// The input generation of the commit.
    pub generation: u64,
    /// 64 lowercase hex digits ([`crate::render::digest::sha256`]).
    pub sha256: String,
    pub stats: Stats,
    /// Local endpoints that commit covered.
    pub endpoints: usize,
}

/// A committed ruleset waiting to be hashed.
pub(crate) struct Job {
    pub(crate) generation: u64,
    pub(crate) ruleset: Ruleset,
    pub(crate) endpoints: usize,
}

/// Where the loop leaves rulesets for the hasher: the newest wins.
#[derive(Default)]
pub(crate) struct Slot {
    job: Mutex<Option<Job>>,
    wake: Notify,
}

impl Slot {
    pub(crate) fn submit(&self, job: Job) {
        *self.job.lock().unwrap_or_else(PoisonError::into_inner) = Some(job);
        self.wake.notify_one();
    }

    fn take(&self) -> Option<Job> {
        self.job.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// Hashes what the loop leaves, until `stop`.
pub(crate) async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = shared.digests.wake.notified() => {}
            _ = stop.changed() => return,
        }
        let Some(job) = shared.digests.take() else { continue };
        let (generation, endpoints) = (job.generation, job.endpoints);
        let hashed = tokio::task::spawn_blocking(move || {
            let stats = job.ruleset.stats();
            (crate::render::digest::sha256(&job.ruleset), stats)
        });
        let (sha256, stats) = match hashed.await {
            Ok(d) => d,
            Err(e) => {
                shared.crash(format!("hashing the ruleset panicked: {e}"));
                return;
            }
        };
        tracing::debug!(generation, %sha256, "ruleset hashed");
        shared.status.send_if_modified(|s| {
            // A newer digest is never replaced by an older one.
            if s.ruleset_digest.as_ref().is_some_and(|d| d.generation >= generation) {
                return false;
            }
            s.ruleset_digest = Some(RulesetDigest { generation, sha256, stats, endpoints });
            true
        });
        tokio::select! {
            () = tokio::time::sleep(INTERVAL) => {}
            _ = stop.changed() => return,
        }
    }
}
