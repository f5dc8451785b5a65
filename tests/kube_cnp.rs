//! ClusterNetworkPolicies through the Kubernetes informer source (`flock::source::kube`)
//! against the in-repo test API server, without nft: an absent CRD is normal (the source is
//! complete, one log line, discovery asked again at a calm pace), a CRD installed later is
//! watched, changes and the CRD's removal reach the snapshot, the initial list of an installed
//! CRD gates completeness, and a policy flock cannot read stays in the snapshot to fail closed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/cnp.rs"]
mod cnp;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flock::agent::metrics::Metrics;
use flock::model::Snapshot;
use flock::model::cnp::{CnpPeer, CnpSubject};
use flock::source::kube::{ApiHealth, HealthState, ProbeConfig, SourceOptions, WatchOptions};
use flock::source::{Source, SourceWriter};
use flock_test_apiserver::{ApiServer, FailRule};
use serde_json::json;
use tokio::sync::watch;

/// Fast options: short backoffs, discovery asked again every 150–300 ms.
fn options() -> SourceOptions {
    SourceOptions {
        watch: WatchOptions {
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_millis(400),
            settle: Duration::from_millis(200),
            discovery_interval: Duration::from_millis(150),
            ..WatchOptions::default()
        },
        probe: ProbeConfig { jitter: Duration::ZERO, ..ProbeConfig::default() },
        ..SourceOptions::default()
    }
}

struct Rig {
    server: ApiServer,
    source: Source,
    health: Arc<ApiHealth>,
    metrics: Arc<Metrics>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), flock::source::kube::SourceFailed>>,
}

impl Rig {
    /// The source on a server with a node and a namespace (and whatever `seed` adds first).
    async fn start(seed: impl FnOnce(&ApiServer)) -> Self {
        let server = ApiServer::start_temp().await.unwrap();
        server.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})).unwrap();
        server.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})).unwrap();
        seed(&server);
        let health = Arc::new(ApiHealth::new(Duration::from_millis(300), Duration::from_millis(1500)));
        let metrics = Arc::new(Metrics::new());
        let (writer, source) = SourceWriter::new(Snapshot::new(), false);
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(flock::source::kube::run_with(options(), server.client(), writer, health.clone(), metrics.clone(), rx));
        Self { server, source, health, metrics, stop, task }
    }

    fn cluster_policies(&self) -> Vec<String> {
        self.source.read().snapshot.cluster_policies().map(|p| p.name.clone()).collect()
    }

    fn metric(&self, name: &str) -> f64 {
        self.health.export(self.metrics.as_ref());
        let text = self.metrics.encode();
        text.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
    }

    /// Requests for the resource itself (lists, watches, gets), not discovery.
    fn cnp_requests(&self) -> usize {
        self.server.requests().iter().filter(|r| r.path.contains("/clusternetworkpolicies")).count()
    }

    fn discoveries(&self) -> Vec<std::time::SystemTime> {
        self.server.requests().iter().filter(|r| r.path == "/apis/policy.networking.k8s.io/v1alpha2").map(|r| r.at).collect()
    }

    async fn wait(&self, what: &str, f: impl Fn() -> bool) {
        let start = Instant::now();
        while !f() {
            assert!(start.elapsed() < Duration::from_secs(20), "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn stop(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), self.task).await.unwrap().unwrap().unwrap();
    }
}

/// Log lines written on one thread: the test's own, whose current-thread runtime runs every
/// task of that test (the other tests' tasks run on their runtimes' worker threads).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>, Option<String>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.1.is_some() && std::thread::current().name() == self.1.as_deref() {
            self.0.lock().unwrap().extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn count(&self, needle: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap()).matches(needle).count()
    }
}

#[tokio::test]
async fn an_absent_crd_is_normal_logged_once_and_watched_once_installed() {
    // A global subscriber (a thread-local one loses events to callsite caching when other
    // threads log first), keeping only this thread's lines.
    let logs = Logs(Arc::default(), std::thread::current().name().map(str::to_owned));
    let writer = logs.clone();
    let subscriber =
        tracing_subscriber::fmt().with_ansi(false).with_max_level(tracing::Level::INFO).with_writer(move || writer.clone()).finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let rig = Rig::start(|_| {}).await;
    rig.wait("the source complete without the CRD", || rig.source.is_complete()).await;
    // Discovery is asked again and again, at the configured pace, and nothing else is.
    rig.wait("four discovery requests", || rig.discoveries().len() >= 4).await;
    let at = rig.discoveries();
    for pair in at.windows(2) {
        let gap = pair[1].duration_since(pair[0]).unwrap();
        assert!(gap >= Duration::from_millis(140), "discovery asked again after {gap:?} (a 150 ms interval)");
    }
    assert_eq!(rig.cnp_requests(), 0, "the absent resource was requested");
    assert_eq!(logs.count("the ClusterNetworkPolicy CRD is not installed"), 1, "logged more than once");
    // Absence is no failure.
    assert_eq!(rig.health.state(), HealthState::Connected);
    assert_eq!(rig.metric("flock_watch_connected{resource=\"clusternetworkpolicies\"}"), 1.0);
    assert_eq!(rig.metric("flock_watch_errors_total"), 0.0);
    assert_eq!(rig.metric("flock_api_resource_served{resource=\"clusternetworkpolicies\"}"), 0.0);

    // Installed later: picked up at the next look, with the policies already there.
    rig.server.apply(cnp::crd()).unwrap();
    rig.server.apply(cnp::cnp("deny-b", 10, "b", cnp::from_everyone("Deny"))).unwrap();
    rig.wait("the policy in the snapshot", || rig.cluster_policies() == ["deny-b"]).await;
    assert_eq!(logs.count("the ClusterNetworkPolicy CRD is installed: watching"), 1);
    assert_eq!(rig.metric("flock_api_resource_served{resource=\"clusternetworkpolicies\"}"), 1.0);
    assert_eq!(rig.metric("flock_watch_relists_total{resource=\"clusternetworkpolicies\",reason=\"initial\"}"), 1.0);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_and_the_crds_removal_reach_the_snapshot() {
    let rig = Rig::start(|s| {
        s.apply(cnp::crd()).unwrap();
        s.apply(cnp::cnp("deny-b", 10, "b", cnp::from_everyone("Deny"))).unwrap();
    })
    .await;
    rig.wait("complete with the policy", || rig.source.is_complete() && rig.cluster_policies() == ["deny-b"]).await;
    let generation = |name: &str| rig.source.read().snapshot.cluster_policy(name).and_then(|p| p.generation);
    assert_eq!(generation("deny-b"), Some(1));

    // Add, modify, delete.
    rig.server.apply(cnp::cnp("pass-c", 20, "c", cnp::from_everyone("Pass"))).unwrap();
    rig.wait("the second policy", || rig.cluster_policies() == ["deny-b", "pass-c"]).await;
    rig.server.apply(cnp::cnp("pass-c", 20, "c", cnp::from_everyone("Accept"))).unwrap();
    rig.wait("the modification", || {
        rig.source.read().snapshot.cluster_policy("pass-c").is_some_and(|p| p.ingress[0].action == "Accept" && p.generation == Some(2))
    })
    .await;
    rig.server.delete(cnp::API_VERSION, cnp::KIND, None, "pass-c").unwrap();
    rig.wait("the deletion", || rig.cluster_policies() == ["deny-b"]).await;

    // A status write (another implementation's condition) changes nothing flock keeps.
    let version = rig.source.snapshot().0;
    let mut with_status = rig.server.get(cnp::API_VERSION, cnp::KIND, None, "deny-b").unwrap().unwrap();
    with_status["status"] = json!({"conditions": [{"type": "other.dev/Accepted", "status": "True"}]});
    rig.server.apply(with_status).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rig.source.snapshot().0, version, "a status change made a new snapshot");

    // The CRD goes: its policies go with it.
    rig.server.delete("apiextensions.k8s.io/v1", "CustomResourceDefinition", None, cnp::CRD_NAME).unwrap();
    rig.wait("no policy left", || rig.cluster_policies().is_empty()).await;
    rig.wait("not served", || rig.metric("flock_api_resource_served{resource=\"clusternetworkpolicies\"}") == 0.0).await;
    assert_eq!(rig.health.state(), HealthState::Connected);
    // And back: watched again.
    rig.server.apply(cnp::crd()).unwrap();
    rig.server.apply(cnp::cnp("back", 5, "b", cnp::from_everyone("Deny"))).unwrap();
    rig.wait("the policy of the reinstalled CRD", || rig.cluster_policies() == ["back"]).await;
    rig.stop().await;
}

/// Removing the CRD while the agent cannot see it (its watch failing: no DELETED event
/// arrives) keeps the last-known policies while flock cannot tell, then still empties the
/// snapshot: the 404 leads to discovery, which says the resource is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_removed_unseen_still_takes_its_policies() {
    let rig = Rig::start(|s| {
        s.apply(cnp::crd()).unwrap();
        s.apply(cnp::cnp("deny-b", 10, "b", cnp::from_everyone("Deny"))).unwrap();
    })
    .await;
    rig.wait("complete with the policy", || rig.source.is_complete() && rig.cluster_policies() == ["deny-b"]).await;
    // The watch must be open before the faults: a watch request still in flight could pass the
    // fault check and then meet the deleted CRD (a 404, which discovery would explain).
    rig.wait("the policies watched", || rig.server.open_watches_of("clusternetworkpolicies") == 1).await;
    rig.server.fail_requests(FailRule::new(usize::MAX, 500).path_contains("/clusternetworkpolicies"));
    rig.server.drop_watches();
    rig.server.delete("apiextensions.k8s.io/v1", "CustomResourceDefinition", None, cnp::CRD_NAME).unwrap();
    rig.wait("the watch failing", || rig.health.watch_failing(flock::source::kube::Resource::ClusterNetworkPolicies)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rig.cluster_policies(), ["deny-b"], "last-known policies dropped while flock could not tell");
    rig.server.clear_failures();
    rig.wait("no policy left", || rig.cluster_policies().is_empty()).await;
    rig.wait("healthy", || !rig.health.any_watch_failing()).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_initial_list_of_an_installed_crd_gates_completeness() {
    let rig = Rig::start(|s| {
        s.apply(cnp::crd()).unwrap();
        s.apply(cnp::cnp("deny-b", 10, "b", cnp::from_everyone("Deny"))).unwrap();
        s.fail_requests(FailRule::new(usize::MAX, 500).path_contains("/clusternetworkpolicies"));
    })
    .await;
    // Everything else is listed; the policies' list keeps failing: not complete (nft must
    // not be programmed without them).
    rig.wait("the CNP list failing", || rig.health.watch_failing(flock::source::kube::Resource::ClusterNetworkPolicies)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!rig.source.is_complete(), "complete before the ClusterNetworkPolicies were listed");
    rig.server.clear_failures();
    rig.wait("complete", || rig.source.is_complete()).await;
    // Complete means with the policies.
    let first = *rig.source.versions().borrow();
    assert!(first.is_some());
    assert_eq!(rig.cluster_policies(), ["deny-b"]);
    rig.wait("healthy", || rig.health.state() == HealthState::Connected && !rig.health.any_watch_failing()).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_discovery_is_a_watch_failure_and_blocks_completeness() {
    let rig = Rig::start(|s| s.fail_requests(FailRule::new(usize::MAX, 503).path_contains("/apis/policy.networking.k8s.io"))).await;
    rig.wait("Degraded", || rig.health.state() == HealthState::Degraded).await;
    assert!(rig.health.last_error().unwrap().starts_with("clusternetworkpolicies: discovery"), "{:?}", rig.health.last_error());
    assert!(!rig.source.is_complete(), "complete without knowing whether ClusterNetworkPolicies exist");
    rig.server.clear_failures();
    rig.wait("complete", || rig.source.is_complete()).await;
    rig.wait("Connected", || rig.health.state() == HealthState::Connected).await;
    rig.stop().await;
}

/// What flock cannot read reaches the snapshot as written (an unknown action, an unknown peer
/// type as `Invalid`), is reported by name, and is enforced fail closed by the translator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_policy_reaches_the_snapshot_and_fails_closed() {
    let rig = Rig::start(|s| {
        s.apply(cnp::crd()).unwrap();
    })
    .await;
    rig.wait("complete", || rig.source.is_complete()).await;
    rig.server.apply(cnp::cnp("allow-b", 10, "b", json!([{"action": "Allow", "from": [{"namespaces": {}}]}]))).unwrap();
    rig.server.apply(cnp::cnp("services", 11, "b", json!([{"action": "Accept", "from": [{"services": {"name": "x"}}]}]))).unwrap();
    let mut bad_subject = cnp::cnp("no-subject", 12, "b", cnp::from_everyone("Deny"));
    bad_subject["spec"]["subject"] = json!({"namespaces": {}, "pods": {"podSelector": {}}});
    rig.server.apply(bad_subject).unwrap();
    rig.wait("three policies", || rig.cluster_policies().len() == 3).await;
    let snapshot = rig.source.snapshot().1;
    assert_eq!(snapshot.cluster_policy("allow-b").unwrap().ingress[0].action, "Allow");
    assert!(
        matches!(&snapshot.cluster_policy("services").unwrap().ingress[0].peers[..], [CnpPeer::Invalid(why)] if why.contains("services"))
    );
    assert!(matches!(&snapshot.cluster_policy("no-subject").unwrap().subject, CnpSubject::Invalid(_)));
    let problems = flock::translate::validate_all(&snapshot);
    let named: Vec<String> = problems.iter().map(ToString::to_string).collect();
    for (policy, field) in [("allow-b", "spec.ingress[0].action"), ("services", "spec.ingress[0]"), ("no-subject", "spec.subject")] {
        assert!(
            named.iter().any(|p| p.starts_with(&format!("ClusterNetworkPolicy {policy}: {field}"))),
            "{policy} {field} not reported: {named:#?}"
        );
    }
    rig.stop().await;
}
