//! The denial reader: the node's NFLOG group (where table `inet flock` logs what it denies,
//! rate-limited per pod and direction: `render::log`) read on a thread of its own inside the
//! node's network namespace; each record named ([`crate::nflog::denial`]) with the endpoints
//! as last translated and the current snapshot, then logged (target `flock::denied`, one
//! event per record: the kernel's rate limit bounds them), counted
//! (`flock_denied_packets_total{namespace, direction}`), and passed to listeners
//! ([`super::Agent::denials`]).
//!
//! Logging is observability, not enforcement: a group the agent cannot bind (another reader
//! holds it) is reported and retried, never fatal; the ruleset drops all the same.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::Shared;
use crate::netns::{self, Netns};
use crate::nflog::{Logged, NflogSocket, denial};

/// How long the reader waits for records before checking whether to stop.
const POLL: Duration = Duration::from_millis(200);
/// How long after a failure to bind the group the reader tries again.
const RETRY: Duration = Duration::from_secs(10);

enum Event {
    Records(Vec<Logged>),
    Unreadable(Vec<String>),
    Lost,
    Failed(String),
}

/// Reads `group` until `stop`.
pub(crate) async fn read(shared: Arc<Shared>, group: u16, mut stop: watch::Receiver<bool>) {
    let (tx, mut rx) = mpsc::channel(256);
    let stopping = Arc::new(AtomicBool::new(false));
    let netns = shared.config.netns.clone();
    let flag = stopping.clone();
    let reader = std::thread::Builder::new().name(format!("nflog-{group}")).spawn(move || reader_thread(&netns, group, &flag, &tx));
    if let Err(e) = &reader {
        tracing::error!(error = %e, group, "cannot start the denial reader: denials are dropped but not logged");
    }
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            event = rx.recv() => match event {
                Some(e) => handle(&shared, group, e),
                // The thread is gone (it only ends when told to): wait for the stop.
                None => {
                    let _ = stop.wait_for(|s| *s).await;
                    break;
                }
            },
        }
    }
    stopping.store(true, Ordering::Relaxed);
    if let Ok(thread) = reader {
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
}

fn reader_thread(netns: &Netns, group: u16, stopping: &AtomicBool, tx: &mpsc::Sender<Event>) {
    while !stopping.load(Ordering::Relaxed) {
        let socket =
            netns::run_in(netns, || NflogSocket::open(group, POLL)).map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.to_string()));
        let mut socket = match socket {
            Ok(s) => s,
            Err(e) => {
                if tx.blocking_send(Event::Failed(e)).is_err() {
                    return;
                }
                let mut waited = Duration::ZERO;
                while waited < RETRY && !stopping.load(Ordering::Relaxed) {
                    std::thread::sleep(POLL);
                    waited += POLL;
                }
                continue;
            }
        };
        while !stopping.load(Ordering::Relaxed) {
            let event = match socket.recv() {
                Ok(Some(crate::nflog::Received { records, unreadable: bad })) => {
                    if !bad.is_empty() && tx.blocking_send(Event::Unreadable(bad)).is_err() {
                        return;
                    }
                    if records.is_empty() {
                        continue;
                    }
                    Event::Records(records)
                }
                Ok(None) => Event::Lost,
                Err(e) => {
                    // Reopen: a socket that failed may have lost its binding.
                    let _ = tx.blocking_send(Event::Failed(e.to_string()));
                    break;
                }
            };
            if tx.blocking_send(event).is_err() {
                return;
            }
        }
    }
}

fn handle(shared: &Shared, group: u16, event: Event) {
    let metrics = &shared.config.metrics;
    match event {
        Event::Records(records) => {
            let endpoints = shared.deniers.borrow().clone();
            let (_, snapshot) = shared.source.snapshot();
            for logged in &records {
                let d = denial::denial(logged, &endpoints, &snapshot);
                tracing::info!(
                    target: "flock::denied",
                    audit = d.audit,
                    reason = d.reason.as_str(),
                    direction = d.direction_label(),
                    pod = d.pod.as_deref().unwrap_or(""),
                    from = %d.from,
                    to = %d.to,
                    protocol = %d.protocol,
                    port = d.port.unwrap_or(0),
                    policies = %d.policies.join(", "),
                    "{}",
                    match (d.reason, d.audit) {
                        (denial::Reason::Allowed, _) => "connection allowed (flock.dev/log-allowed)",
                        (denial::Reason::Revoked, _) => "packet of a revoked connection (a policy change denies it): dropped, TCP reset",
                        (_, true) => "packet would be denied (audit mode: accepted)",
                        (_, false) => "packet denied",
                    }
                );
                if d.reason == denial::Reason::Allowed {
                    metrics.allowed_logged(d.namespace.as_deref().unwrap_or(""), d.direction_label());
                } else if d.audit {
                    metrics.audit_denied(d.namespace.as_deref().unwrap_or(""), d.direction_label());
                } else {
                    metrics.denied(d.namespace.as_deref().unwrap_or(""), d.direction_label());
                }
                // No listener is fine.
                let _ = shared.denied.send(d);
            }
        }
        Event::Unreadable(bad) => {
            for b in bad {
                metrics.denial_record_unreadable();
                tracing::warn!(group, record = %b, "a denial record could not be decoded");
            }
        }
        Event::Lost => {
            metrics.denial_records_lost();
            tracing::warn!(group, "denial records were lost: the reader's socket was full");
        }
        Event::Failed(e) => {
            tracing::error!(group, error = %e, "cannot read denials from NFLOG (retrying); denied packets are dropped but not logged")
        }
    }
}
