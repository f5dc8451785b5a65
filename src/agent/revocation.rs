//! Cutting the connections a change denies: after a sync commits a changed table (and on
//! the periodic tick, and after the agent's first commit), the node's conntrack table is
//! listed inside the node's network namespace, each connection judged against the policy
//! just committed ([`crate::revoke`]), and the denied ones marked (a bit of their ct mark:
//! [`crate::conntrack`]), which the table's first rule stops — TCP with a reset. Marked
//! connections the policy admits again are unmarked.
//!
//! One log line per sweep that revoked anything (target `flock::revoked`: how many, the pods,
//! and what denies them), a debug line per connection, and
//! `flock_revoked_connections_total`.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::conntrack::{Changed, ConntrackError, ConntrackSocket, Entry};
use crate::netns::{self, Netns, NetnsError};
use crate::revoke::{Judge, Revocation, by_cause};
use crate::translate::NodePolicy;

use super::metrics::Metrics;

/// Why a sweep did not run to the end (what it marked before stays marked).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SweepError {
    #[error("entering the node's network namespace: {0}")]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Conntrack(#[from] ConntrackError),
    #[error("listing the node's addresses: {0}")]
    Addresses(#[source] nix::Error),
}

/// What one sweep found and did.
#[derive(Debug, Default)]
pub(crate) struct Swept {
    /// Entries in the table.
    pub(crate) listed: usize,
    /// The connections the policy denies, revoked (marked; or ended meanwhile).
    pub(crate) revoked: Vec<Revocation>,
    /// Denied connections the kernel refused to mark, with why.
    pub(crate) refused: Vec<(Revocation, String)>,
    /// Revoked connections the policy admits again, unmarked; and those the kernel refused
    /// to unmark.
    pub(crate) restored: usize,
    pub(crate) unrestored: usize,
    /// Entries that could not be decoded (left alone).
    pub(crate) unreadable: Vec<String>,
    /// A newer commit came while judging: nothing was changed (the next sweep judges).
    pub(crate) stale: bool,
}

/// Judges every connection of `netns` against `np`, marks the denied ones with `bit` and
/// unmarks the admitted ones — unless `current` says by then that `np` is no longer what the
/// table enforces (a newer commit: its own sweep follows), when nothing is changed.
pub(crate) fn sweep(netns: &Netns, np: &NodePolicy, bit: u32, current: &(dyn Fn() -> bool + Sync)) -> Result<Swept, SweepError> {
    netns::run_in(netns, || {
        let node = node_addresses().map_err(SweepError::Addresses)?;
        let mut socket = ConntrackSocket::open()?;
        let dump = socket.dump()?;
        let judge = Judge::new(np, &node);
        let found = judge.sweep(&dump.entries, bit);
        if !current() {
            return Ok(Swept { listed: dump.entries.len(), stale: true, ..Swept::default() });
        }
        let doomed: Vec<&Entry> = found.revoke.iter().map(|(e, _)| *e).collect();
        let marked = if doomed.is_empty() { Changed::default() } else { socket.set_mark(&doomed, bit, true)? };
        let restored = if found.restore.is_empty() { Changed::default() } else { socket.set_mark(&found.restore, bit, false)? };
        let mut swept = Swept {
            listed: dump.entries.len(),
            unreadable: dump.unreadable,
            restored: restored.changed,
            unrestored: restored.failed.len(),
            ..Swept::default()
        };
        for (e, r) in found.revoke {
            match marked.failed.iter().find(|(t, _)| *t == e.orig) {
                Some((_, why)) => swept.refused.push((r, why.clone())),
                None => swept.revoked.push(r),
            }
        }
        for (t, why) in &restored.failed {
            tracing::warn!(target: "flock::revoked", connection = %t, error = %why, "cannot unmark a connection the policy admits again; the next sweep tries again");
        }
        Ok(swept)
    })?
}

/// The addresses of the calling thread's network namespace, on every interface: the node's
/// own (what it sends is not policed; what a pod sends them meets hook `input`).
pub fn node_addresses() -> nix::Result<BTreeSet<IpAddr>> {
    let addrs = nix::ifaddrs::getifaddrs()?;
    Ok(addrs
        .filter_map(|i| i.address)
        .filter_map(|a| a.as_sockaddr_in().map(|s| IpAddr::V4(s.ip())).or_else(|| a.as_sockaddr_in6().map(|s| IpAddr::V6(s.ip()))))
        .collect())
}

/// Logs and counts what a sweep did.
pub(crate) fn report(metrics: &Metrics, swept: &Swept, seconds: f64) {
    if swept.stale {
        tracing::debug!(listed = swept.listed, seconds, "revocation sweep outdated by a newer commit; judging again");
        return;
    }
    metrics.revocation_sweep(Some((swept.listed, seconds)));
    for why in &swept.unreadable {
        tracing::warn!(target: "flock::revoked", error = %why, "a conntrack entry could not be decoded; left alone");
    }
    for (r, why) in &swept.refused {
        tracing::error!(target: "flock::revoked", connection = %r.flow, pod = %r.why.pod, error = %why, "the kernel refused to mark a denied connection; the next sweep tries again");
    }
    if swept.restored > 0 {
        tracing::info!(target: "flock::revoked", connections = swept.restored, "revoked connections the policy admits again were restored");
    }
    if swept.revoked.is_empty() {
        tracing::debug!(listed = swept.listed, seconds, "no established connection is denied by the policy in force");
        return;
    }
    for r in &swept.revoked {
        metrics.revoked(&r.why.namespace, r.why.direction.as_field());
        tracing::debug!(target: "flock::revoked", connection = %r.flow, pod = %r.why.pod, direction = r.why.direction.as_field(), reason = %r.why.reason, "connection cut");
    }
    let causes: Vec<String> = by_cause(&swept.revoked).into_iter().map(|(cause, n)| format!("{cause} ({n})")).collect();
    let mut pods: Vec<&str> = swept.revoked.iter().map(|r| r.why.pod.as_str()).collect();
    pods.sort_unstable();
    pods.dedup();
    tracing::info!(
        target: "flock::revoked",
        connections = swept.revoked.len(),
        refused = swept.refused.len(),
        listed = swept.listed,
        pods = %pods.join(", "),
        denied_by = %causes.join("; "),
        "cut established connections the policy in force denies"
    );
}
