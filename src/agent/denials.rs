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
                log(&d);
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

/// One record as a log event (target `flock::denied`). `flockctl whatif --flows` reads these
/// lines back (`crate::explain::observed`): the test below holds the two to one format.
fn log(d: &denial::Denial) {
    tracing::info!(
        target: "flock::denied",
        audit = d.audit,
        reason = d.reason.as_str(),
        direction = d.direction_label(),
        pod = d.pod.as_deref().unwrap_or(""),
        from = %d.from,
        to = %d.to,
        protocol = %d.protocol,
        family = d.family,
        port = d.port.unwrap_or(0),
        policies = %d.policies.join(", "),
        prefix = d.prefix.as_deref().unwrap_or(""),
        "{}",
        match (d.reason, d.audit) {
            (denial::Reason::Allowed, _) => "connection allowed (flock.dev/log-allowed)",
            (denial::Reason::Revoked, _) => "packet of a revoked connection (a policy change denies it): dropped, TCP reset",
            (_, true) => "packet would be denied (audit mode: accepted)",
            (_, false) => "packet denied",
        }
    );
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::explain::observed::{self, Flow};
    use crate::model::{Family, Protocol};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the agent logs with `--log-format json` is what `whatif --flows` reads.
    #[test]
    fn logged_records_read_back_as_flows() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = crate::process::json_subscriber("info", move || writer.clone());
        let record = |reason, audit, from: &str, to: &str, port| denial::Denial {
            reason,
            direction: Some("ingress"),
            pod: Some(to.into()),
            namespace: Some("y".into()),
            from: from.into(),
            to: to.into(),
            protocol: "TCP".into(),
            family: "IPv4",
            port,
            policies: vec!["networkpolicy y/deny".into()],
            audit,
            prefix: None,
        };
        tracing::subscriber::with_default(subscriber, || {
            log(&record(denial::Reason::Policy, false, "x/a", "y/b", Some(80)));
            log(&record(denial::Reason::Policy, true, "198.18.0.7", "y/b", Some(8080)));
            log(&record(denial::Reason::Allowed, false, "x/b", "y/b", Some(80)));
            log(&record(denial::Reason::SpoofedSource, false, "198.18.0.9", "y/b", Some(80)));
            // Another table's drop logged to the group: no flock verdict.
            let mut other = record(denial::Reason::Policy, false, "x/c", "y/b", Some(80));
            other.prefix = Some("other-table: ".into());
            log(&other);
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let log = observed::parse(&text);
        assert_eq!((log.records, log.not_policy, log.unreadable_count, log.other_lines), (3, 2, 0, 0), "{text}");
        let flow = |from: &str, port| Flow { from: from.into(), to: "y/b".into(), protocol: Protocol::Tcp, port, family: Some(Family::V4) };
        assert_eq!(log.flows[&flow("x/a", 80)].denied, 1);
        assert_eq!(log.flows[&flow("198.18.0.7", 8080)].audit, 1);
        assert_eq!(log.flows[&flow("x/b", 80)].allowed, 1);
    }
}
