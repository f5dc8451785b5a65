//! The agent's logs carry the right span: a sync's lines (its translation, transaction and
//! outcome) are inside its `sync` span, and nothing else is — the CNI handler's lines among
//! them, though they run on the same threads while a sync waits for its blocking work.
//! Real nft in a network namespace (root). Its own test binary: it installs the process's
//! global subscriber.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/agent.rs"]
mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flock::agent::{Agent, AgentConfig};
use flock::model::Snapshot;
use flock::source::StaticSource;
use flock::testkit::kernel::{NetnsGuard, TempDir, require_root};
use flock_cni::protocol;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use common::{add, pod};

/// An event's message and the names of the spans it was logged in.
type Logged = (String, Vec<String>);

/// Each event of the agent.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Logged>>>);

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Recorder {
    fn on_event(&self, event: &tracing::Event<'_>, ctx: Context<'_, S>) {
        if !event.metadata().target().starts_with("flock::agent") {
            return;
        }
        let mut m = Message(String::new());
        event.record(&mut m);
        let spans = ctx.event_scope(event).map(|s| s.map(|span| span.name().to_string()).collect()).unwrap_or_default();
        self.0.lock().unwrap().push((m.0, spans));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_logs_in_its_span_and_nothing_else_does() {
    if !require_root("a_sync_logs_in_its_span_and_nothing_else_does") {
        return;
    }
    let recorder = Recorder::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(recorder.clone())).unwrap();

    let (node, dir) = (NetnsGuard::new("spans"), TempDir::new("spans"));
    let names: Vec<(String, String)> = (0..12).map(|i| (format!("p{i}"), format!("198.18.71.{}", i + 10))).collect();
    let mut snapshot = Snapshot::new();
    snapshot.upsert_namespace(flock::model::convert::implicit_namespace("default"));
    for (name, ip) in &names {
        snapshot.upsert_pod(pod(name, ip));
    }
    let source = StaticSource::new(snapshot);
    let mut cfg = AgentConfig::new("n1", node.netns(), dir.join("cni.sock"), dir.join("pending-del"));
    cfg.state_dir = Some(dir.join("state"));
    cfg.routes = false;
    let agent = Agent::start(cfg, source.subscribe()).await.unwrap();
    let socket = dir.join("cni.sock");
    // Three at a time: handlers run while syncs wait for their blocking work.
    for chunk in names.chunks(3) {
        let calls: Vec<_> = chunk
            .iter()
            .map(|(name, ip)| {
                let (socket, req) = (socket.clone(), add(name, ip));
                tokio::task::spawn_blocking(move || protocol::call(&socket, req, Duration::from_secs(10)))
            })
            .collect();
        for c in calls {
            c.await.unwrap().unwrap();
        }
    }
    agent.shutdown().await;

    let events = recorder.0.lock().unwrap().clone();
    let committed: Vec<_> = events.iter().filter(|(m, _)| m == "sync committed").collect();
    assert!(!committed.is_empty(), "no sync committed: {events:?}");
    for (m, spans) in &committed {
        assert_eq!(spans.iter().filter(|s| *s == "sync").count(), 1, "{m} in {spans:?}");
    }
    let programmed: Vec<_> = events.iter().filter(|(m, _)| m == "endpoint programmed").collect();
    assert_eq!(programmed.len(), names.len(), "{events:?}");
    for (m, spans) in programmed {
        assert!(!spans.iter().any(|s| s == "sync"), "{m} logged inside a sync's span: {spans:?}");
    }
}
