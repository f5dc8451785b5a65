//! flock-controller's PodSlice writer against the in-repo API server: the slices show every
//! peer pod (and nothing else) and read back as the pods; a burst of changes within the
//! window is a few writes, not one per pod; a pod that ends leaves its slice within a
//! fraction of the window; an emptied slice is deleted and one deleted by someone else comes
//! back; and nothing is written while the Pods have not been listed completely (a slice
//! planned from a partial list would drop the rest).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/controller.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flock::controller::metrics::Metrics;
use flock::controller::slices::{self, SliceOptions};
use flock::crd::PodSlice;
use flock_test_apiserver::{ApiServer, FailRule};
use serde_json::{Value, json};
use tokio::sync::watch;

use common::{api_server, eventually};

// Long enough that an urgent flush (a twentieth of it) is told from a batched one under load.
const WINDOW: Duration = Duration::from_millis(1000);

fn pod(ns: &str, name: &str, i: u32, app: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"), "labels": {"app": app},
                     "creationTimestamp": "2026-12-01T00:00:00Z"},
        "spec": {"nodeName": format!("node-{}", i % 2),
                 "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}, {"containerPort": 9090}]}]},
        "status": {"phase": "Running", "podIPs": [{"ip": format!("198.18.{}.{}", i / 250, i % 250 + 1)}]},
    })
}

/// The slices the server holds: name → spec.
fn held(server: &ApiServer) -> BTreeMap<String, flock::crd::PodSliceSpec> {
    server.list_resources::<PodSlice>(None).unwrap().into_iter().map(|s| (s.metadata.name.clone().unwrap(), s.spec)).collect()
}

/// namespace/name of every pod the slices show, decoded as an agent would.
fn shown(server: &ApiServer) -> Vec<String> {
    let mut out: Vec<String> = held(server)
        .iter()
        .flat_map(|(name, spec)| {
            let (pods, problems) = flock::slices::decode(name, spec);
            assert!(problems.is_empty(), "{problems:?}");
            pods.into_iter().map(|p| format!("{}/{}", p.namespace, p.name))
        })
        .collect();
    out.sort();
    out
}

struct Writer {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    metrics: Arc<Metrics>,
}

impl Writer {
    fn start(server: &ApiServer) -> Self {
        let metrics = Arc::new(Metrics::new());
        let (stop, rx) = watch::channel(false);
        let opts = SliceOptions { max_pods: 100, window: WINDOW, writes_per_second: 1000, ..SliceOptions::default() };
        let task = tokio::spawn(slices::run(server.client(), opts, metrics.clone(), rx));
        Self { stop, task, metrics }
    }

    fn writes(&self) -> u64 {
        ["create", "update", "delete"].iter().map(|op| self.metrics.slice_write_count(op, "ok")).sum()
    }

    async fn stop(self) {
        self.stop.send_replace(true);
        tokio::time::timeout(Duration::from_secs(5), self.task).await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn slices_show_the_peers_batched_and_follow_their_changes() {
    let server = api_server().await;
    for i in 0..250 {
        server.apply(pod("shop", &format!("web-{i:03}"), i, if i % 2 == 0 { "web" } else { "api" })).unwrap();
    }
    for i in 0..3 {
        server.apply(pod("blog", &format!("b-{i}"), 300 + i, "blog")).unwrap();
    }
    // No peers: host-networked, without an address, finished.
    let mut host = pod("blog", "host", 400, "x");
    host["spec"]["hostNetwork"] = json!(true);
    let mut pending = pod("blog", "pending", 401, "x");
    pending["status"] = json!({"phase": "Pending"});
    let mut done = pod("blog", "done", 402, "x");
    done["status"]["phase"] = json!("Succeeded");
    for p in [host, pending, done] {
        server.apply(p).unwrap();
    }

    let writer = Writer::start(&server);
    let mut want: Vec<String> = (0..250).map(|i| format!("shop/web-{i:03}")).chain((0..3).map(|i| format!("blog/b-{i}"))).collect();
    want.sort();
    eventually(10, "every peer in a slice", || (shown(&server) == want).then_some(())).await;
    let slices = held(&server);
    assert_eq!(slices.keys().collect::<Vec<_>>(), ["blog-0", "shop-0", "shop-1", "shop-2"]);
    assert_eq!(slices["shop-0"].pods.len(), 100);
    assert_eq!(slices["shop-0"].label_sets.len(), 2, "pods of a workload share one label set");
    assert_eq!(slices["shop-0"].pods[0].ports.len(), 1, "named ports only");
    // Settled: nothing more is written.
    tokio::time::sleep(WINDOW * 3).await;
    let settled = writer.writes();
    assert_eq!(settled, 4, "one create per slice");

    // A burst: 100 pods relabelled at once are one write per slice they touch.
    for i in 0..100 {
        server.apply(pod("shop", &format!("web-{i:03}"), i, "canary")).unwrap();
    }
    eventually(10, "the relabelled pods", || {
        let s = held(&server);
        (s["shop-0"].label_sets == [BTreeMap::from([("app".to_string(), "canary".to_string())])]).then_some(())
    })
    .await;
    tokio::time::sleep(WINDOW * 3).await;
    let burst = writer.writes() - settled;
    assert!(burst <= 3, "100 relabelled pods took {burst} writes");

    // A status-only update changes nothing a slice shows: no write.
    let before = writer.writes();
    let mut p = pod("shop", "web-200", 200, "web");
    p["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
    server.apply(p).unwrap();
    tokio::time::sleep(WINDOW * 3).await;
    assert_eq!(writer.writes(), before);

    // A pod that ends is urgent: it leaves its slice well within the window.
    let t = Instant::now();
    server.delete("v1", "Pod", Some("shop"), "web-150").unwrap();
    eventually(5, "web-150 gone", || (!shown(&server).contains(&"shop/web-150".to_string())).then_some(())).await;
    let urgent = t.elapsed();
    assert!(urgent < WINDOW, "a deleted pod left its slice after {urgent:?}");

    // The blog's pods go: its slice is deleted. A slice deleted by someone else comes back.
    for i in 0..3 {
        server.delete("v1", "Pod", Some("blog"), &format!("b-{i}")).unwrap();
    }
    eventually(5, "blog-0 deleted", || (!held(&server).contains_key("blog-0")).then_some(())).await;
    server.delete("flock.dev/v1alpha1", "PodSlice", None, "shop-2").unwrap();
    // Its pods are placed again: one into the room web-150 left in shop-1, the rest into a new
    // shop-2.
    eventually(5, "shop-2's pods back", || (shown(&server).len() == 249).then_some(())).await;
    let slices = held(&server);
    assert_eq!(slices.values().map(|s| s.pods.len()).collect::<Vec<_>>(), [100, 100, 49]);
    writer.stop().await;
}

/// Until the Pods are listed completely, nothing is written: the slices a previous leader
/// wrote stay as they are while the list fails, and are kept, unchanged, once it succeeds.
#[tokio::test]
async fn nothing_is_written_before_the_pods_are_listed() {
    let server = api_server().await;
    for i in 0..5 {
        server.apply(pod("shop", &format!("web-{i}"), i, "web")).unwrap();
    }
    let first = Writer::start(&server);
    eventually(10, "the first leader's slice", || (shown(&server).len() == 5).then_some(())).await;
    first.stop().await;
    let rv_before = server.get("flock.dev/v1alpha1", "PodSlice", None, "shop-0").unwrap().unwrap()["metadata"]["resourceVersion"].clone();

    server.fail_requests(FailRule::new(20, 503).method(hyper::Method::GET).path_contains("/api/v1/pods").watch(false));
    let second = Writer::start(&server);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(second.writes(), 0, "wrote while the Pods were not listed");
    assert_eq!(shown(&server).len(), 5);
    server.clear_failures();
    eventually(30, "the Pods listed", || {
        server.requests().iter().any(|r| r.path.starts_with("/api/v1/pods") && !r.watch && r.status == 200).then_some(())
    })
    .await;
    tokio::time::sleep(WINDOW * 3).await;
    assert_eq!(second.writes(), 0, "an unchanged slice was rewritten");
    let rv_after = server.get("flock.dev/v1alpha1", "PodSlice", None, "shop-0").unwrap().unwrap()["metadata"]["resourceVersion"].clone();
    assert_eq!(rv_before, rv_after);
    second.stop().await;
}
