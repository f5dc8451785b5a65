//! An agent's source reading PodSlices (`PodSource::Slices`), with flock-controller's writer
//! beside it, against the in-repo API server: other nodes' pods come from the slices and
//! this node's from a Pod watch that asks for this node's pods only; a local pod no slice
//! shows yet is no peer; a pod the writer has not batched yet is not in the snapshot; the
//! source is complete only once the slices have listed too.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/controller.rs"]
mod common;

use std::sync::Arc;
use std::time::Duration;

use flock::agent::metrics::Metrics;
use flock::controller::slices::{self, SliceOptions};
use flock::model::Snapshot;
use flock::source::kube::{ApiHealth, PodSource, SourceOptions, WriterLease};
use flock::source::{Source, SourceWriter};
use flock_test_apiserver::ApiServer;
use serde_json::{Value, json};
use tokio::sync::watch;

use common::{api_server, eventually};

fn pod(name: &str, node: &str, ip: &str, app: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"), "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {"phase": "Running", "podIPs": [{"ip": ip}]},
    })
}

struct Writer {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn writer(server: &ApiServer) -> Writer {
    let (stop, rx) = watch::channel(false);
    let opts = SliceOptions { window: Duration::from_millis(100), ..SliceOptions::default() };
    let task = tokio::spawn(slices::run(server.client(), opts, Arc::new(flock::controller::metrics::Metrics::new()), rx));
    Writer { stop, task }
}

impl Writer {
    async fn stop(self) {
        self.stop.send_replace(true);
        tokio::time::timeout(Duration::from_secs(5), self.task).await.unwrap().unwrap();
    }
}

/// (name, is a peer) of every pod the source's snapshot holds.
fn pods(source: &Source) -> Vec<(String, bool)> {
    let mut v: Vec<(String, bool)> = source.read().snapshot.pods().map(|p| (p.name.clone(), p.is_peer())).collect();
    v.sort();
    v
}

fn expect(want: &[(&str, bool)]) -> Vec<(String, bool)> {
    want.iter().map(|(n, p)| (n.to_string(), *p)).collect()
}

#[tokio::test]
async fn an_agent_reads_other_nodes_pods_from_slices_and_its_own_from_its_watch() {
    let server = api_server().await;
    for node in ["node-a", "node-b"] {
        server.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})).unwrap();
    }
    server.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})).unwrap();
    server.apply(pod("r1", "node-b", "198.18.1.2", "web")).unwrap();
    server.apply(pod("r2", "node-b", "198.18.1.3", "api")).unwrap();
    server.apply(pod("l1", "node-a", "198.18.0.2", "web")).unwrap();

    // The source starts before any slice exists: it is complete (the slices listed empty),
    // holding this node's pod, unpublished.
    let health = Arc::new(ApiHealth::new(Duration::from_millis(300), Duration::from_millis(1500)));
    let (w, source) = SourceWriter::new(Snapshot::new(), false);
    let (stop, rx) = watch::channel(false);
    let writer_lease = WriterLease { namespace: "flock-system".into(), name: "flock-controller".into(), every: Duration::from_millis(100) };
    let opts =
        SourceOptions { pods: PodSource::Slices { node: "node-a".into(), writer: writer_lease }, ..SourceOptions::for_node("node-a") };
    let metrics = Arc::new(Metrics::new());
    let task = tokio::spawn(flock::source::kube::run_with(opts, server.client(), w, health, metrics.clone(), rx));
    eventually(10, "the source complete", || source.is_complete().then_some(())).await;
    assert_eq!(pods(&source), expect(&[("l1", false)]));
    // No writer's Lease: its absence is reported; held (and fresh), its presence.
    let writer_up = || metrics.encode().lines().find(|l| l.starts_with("flock_pod_slice_writer_up ")).map(str::to_string);
    eventually(10, "the writer reported absent", || (writer_up().as_deref() == Some("flock_pod_slice_writer_up 0")).then_some(())).await;
    server.apply(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "flock-controller", "namespace": "flock-system"},
                        "spec": {"holderIdentity": "flock-controller-0", "leaseDurationSeconds": 15}})).unwrap();
    eventually(10, "the writer reported present", || (writer_up().as_deref() == Some("flock_pod_slice_writer_up 1")).then_some(())).await;

    let first = writer(&server);
    eventually(10, "every pod through the slices", || (pods(&source) == expect(&[("l1", true), ("r1", true), ("r2", true)])).then_some(()))
        .await;

    // Only this node's Pods are asked for; every pod list and watch says so.
    let pod_requests: Vec<String> = server.requests().into_iter().filter(|r| r.path == "/api/v1/pods").map(|r| r.query).collect();
    assert!(!pod_requests.is_empty());
    // The writer's own pod watch is all pods: tell the two apart by the selector.
    let agent_requests: Vec<&String> = pod_requests.iter().filter(|q| q.contains("fieldSelector")).collect();
    assert!(!agent_requests.is_empty(), "{pod_requests:?}");
    assert!(agent_requests.iter().all(|q| q.contains("spec.nodeName%3Dnode-a")), "{agent_requests:?}");

    // Without the writer: a new local pod is known but no peer; a new remote pod is unknown.
    first.stop().await;
    server.apply(pod("l2", "node-a", "198.18.0.3", "web")).unwrap();
    server.apply(pod("r3", "node-b", "198.18.1.4", "web")).unwrap();
    eventually(10, "l2 known", || pods(&source).iter().any(|(n, _)| n == "l2").then_some(())).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(pods(&source), expect(&[("l1", true), ("l2", false), ("r1", true), ("r2", true)]));

    // A remote pod's label changes reach the snapshot through its slice; a deleted one goes.
    let second = writer(&server);
    server.apply(pod("r1", "node-b", "198.18.1.2", "canary")).unwrap();
    server.delete("v1", "Pod", Some("shop"), "r2").unwrap();
    eventually(10, "the batches caught up", || {
        let labels = source.read().snapshot.pod("uid-r1").and_then(|p| p.labels.get("app").map(str::to_string));
        (pods(&source) == expect(&[("l1", true), ("l2", true), ("r1", true), ("r3", true)]) && labels.as_deref() == Some("canary"))
            .then_some(())
    })
    .await;

    // This node's watch decides its pods: deleted, gone at once, whatever a slice shows.
    second.stop().await;
    server.delete("v1", "Pod", Some("shop"), "l1").unwrap();
    eventually(10, "l1 gone", || (!pods(&source).iter().any(|(n, _)| n == "l1")).then_some(())).await;

    stop.send_replace(true);
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap().unwrap();
}
