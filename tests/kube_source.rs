//! The Kubernetes informer source (`flock::source::kube`) against the in-repo test API server,
//! without nft: what the snapshot holds after the API server loses state (an etcd restore:
//! 504 "Too large resource version", 410 Expired, a list from a resourceVersion the server
//! has not reached), how health follows the watches, and when `/version` is probed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use flock::agent::metrics::Metrics;
use flock::model::Snapshot;
use flock::source::kube::{ApiHealth, HealthState, ProbeConfig, SourceFailed, SourceMetrics, SourceOptions, WatchOptions};
use flock::source::{Source, SourceWriter};
use flock_test_apiserver::{ApiServer, Config, FailRule, RequestRecord};
use serde_json::{Value, json};
use tokio::sync::watch;

fn policy(name: &str) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name, "namespace": "default"},
           "spec": {"podSelector": {"matchLabels": {"app": name}}, "policyTypes": ["Ingress"]}})
}

fn pod(name: &str, ip: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "labels": {"app": name}},
           "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]},
           "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})
}

/// Fast options for tests: short backoffs, no probe jitter.
fn options(tweak: impl FnOnce(&mut SourceOptions)) -> SourceOptions {
    let mut o = SourceOptions {
        watch: WatchOptions {
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_millis(400),
            settle: Duration::from_millis(200),
            ..WatchOptions::default()
        },
        probe: ProbeConfig {
            quiet: Duration::from_secs(30),
            jitter: Duration::ZERO,
            retry: Duration::from_millis(100),
            ..ProbeConfig::default()
        },
        ..SourceOptions::default()
    };
    tweak(&mut o);
    o
}

/// A node, a namespace, pod `a` and policy `kept`.
fn seed(server: &ApiServer) {
    server.apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})).unwrap();
    server.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})).unwrap();
    server.apply(pod("a", "198.18.0.10")).unwrap();
    server.apply(policy("kept")).unwrap();
}

struct Rig {
    server: ApiServer,
    source: Source,
    health: Arc<ApiHealth>,
    metrics: Arc<Metrics>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), SourceFailed>>,
}

impl Rig {
    /// A server with a node, a namespace, pod `a` and policy `kept`, and the source on it,
    /// complete.
    async fn start(config: Config, opts: SourceOptions) -> Self {
        if let Ok(filter) = std::env::var("FLOCK_TEST_LOG") {
            let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
        }
        let server = ApiServer::start_temp_with(config).await.unwrap();
        seed(&server);
        let health = Arc::new(ApiHealth::new(Duration::from_millis(300), Duration::from_millis(1500)));
        let metrics = Arc::new(Metrics::new());
        let (writer, source) = SourceWriter::new(Snapshot::new(), false);
        let (stop, rx) = watch::channel(false);
        let task = tokio::spawn(flock::source::kube::run_with(opts, server.client(), writer, health.clone(), metrics.clone(), rx));
        let rig = Self { server, source, health, metrics, stop, task };
        rig.wait("the source complete", || rig.source.is_complete()).await;
        rig.server.wait_for_watches(4, Duration::from_secs(10)).await.unwrap();
        rig
    }

    fn policies(&self) -> Vec<String> {
        self.source.read().snapshot.policies().map(|p| p.key().name).collect()
    }

    fn pods(&self) -> Vec<String> {
        self.source.read().snapshot.pods().map(|p| p.name.clone()).collect()
    }

    fn server_policies(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .server
            .list("networking.k8s.io/v1", "NetworkPolicy", None)
            .unwrap()
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    }

    fn metric(&self, name: &str) -> f64 {
        self.health.export(self.metrics.as_ref());
        let text = self.metrics.encode();
        text.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
    }

    fn requests(&self, f: impl Fn(&RequestRecord) -> bool) -> Vec<RequestRecord> {
        self.server.requests().into_iter().filter(|r| f(r)).collect()
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

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// The writes after a backup that a restore undoes: a policy and a pod created, policy
/// `deleted-later` deleted (it was in the backup).
async fn diverge_after_backup(rig: &Rig) -> flock_test_apiserver::Backup {
    rig.server.apply(policy("deleted-later")).unwrap();
    rig.wait("deleted-later", || rig.policies().contains(&"deleted-later".to_string())).await;
    let backup = rig.server.backup();
    rig.server.apply(policy("created-later")).unwrap();
    rig.server.apply(pod("b", "198.18.0.11")).unwrap();
    rig.server.delete("networking.k8s.io/v1", "NetworkPolicy", Some("default"), "deleted-later").unwrap();
    rig.wait("the writes after the backup", || sorted(rig.policies()) == ["created-later", "kept"] && rig.pods().len() == 2).await;
    backup
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restore_the_snapshot_is_the_servers_state_again() {
    let rig = Rig::start(Config::default(), options(|_| {})).await;
    let backup = diverge_after_backup(&rig).await;
    rig.server.clear_requests();

    // The API server goes back to the backup: its resourceVersion is now behind what every
    // watch holds, so each re-watch gets 504 Too large; no DELETE is ever sent.
    rig.server.restore(&backup);
    rig.wait("the snapshot equal to the server's state", || sorted(rig.policies()) == ["deleted-later", "kept"] && rig.pods() == ["a"])
        .await;
    assert_eq!(sorted(rig.policies()), rig.server_policies());
    // Through a consistent relist after the 504, not a guess.
    let log = rig.server.requests();
    let too_large = log.iter().position(|r| r.watch && r.path.contains("networkpolicies")).unwrap();
    let relist = log.iter().skip(too_large).find(|r| !r.watch && r.path.ends_with("/networkpolicies")).unwrap();
    assert!(!relist.query.contains("resourceVersion="), "the relist after 504 must be a consistent read: {}", relist.query);
    assert_eq!(rig.metric("flock_watch_relists_total{resource=\"networkpolicies\",reason=\"too_large\"}"), 1.0);
    // Losing state is not an outage: the watches never failed, and the reason is on record.
    assert_eq!(rig.health.state(), HealthState::Connected);
    assert!(rig.health.last_error().unwrap().contains("Too large resource version"), "{:?}", rig.health.last_error());
    assert_eq!(rig.metric("flock_watch_errors_total"), 0.0);

    // And the watches follow changes again, from the restored resourceVersions.
    rig.server.apply(policy("after-restore")).unwrap();
    rig.wait("a change after the restore", || rig.policies().contains(&"after-restore".to_string())).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bumped_restore_expires_the_watches_and_the_relist_drops_vanished_objects() {
    let rig = Rig::start(Config::default(), options(|_| {})).await;
    let backup = diverge_after_backup(&rig).await;
    rig.server.restore_bumped(&backup, 1000);
    rig.wait("the snapshot equal to the server's state", || sorted(rig.policies()) == ["deleted-later", "kept"] && rig.pods() == ["a"])
        .await;
    // 410: relisted from the last resourceVersion (NotOlderThan), which the server has passed.
    assert_eq!(rig.metric("flock_watch_relists_total{resource=\"networkpolicies\",reason=\"expired\"}"), 1.0);
    let relist = rig.requests(|r| !r.watch && r.path.ends_with("/networkpolicies") && r.query.contains("NotOlderThan"));
    assert_eq!(relist.iter().map(|r| r.status).collect::<Vec<_>>(), [200]);
    assert_eq!(rig.health.state(), HealthState::Connected);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_keeps_failing_relists_and_a_list_from_the_future_falls_back_to_the_latest() {
    let rig = Rig::start(Config::default(), options(|o| o.watch.relist_after = 3)).await;
    let backup = diverge_after_backup(&rig).await;
    // The policies' watches fail three times in a row; meanwhile the server lost state.
    rig.server.fail_requests(FailRule::new(3, 500).watch(true).path_contains("/networkpolicies"));
    rig.server.restore(&backup);
    rig.wait("the snapshot equal to the server's state", || sorted(rig.policies()) == ["deleted-later", "kept"]).await;
    let lists = rig.requests(|r| !r.watch && r.path.ends_with("/networkpolicies"));
    let statuses: Vec<(u16, bool)> = lists.iter().map(|r| (r.status, r.query.contains("resourceVersionMatch=NotOlderThan"))).collect();
    // The initial list, the relist from the last resourceVersion (504: the server is behind
    // it), then a consistent one.
    assert_eq!(statuses, [(200, false), (504, true), (200, false)], "{lists:#?}");
    assert_eq!(rig.metric("flock_watch_relists_total{resource=\"networkpolicies\",reason=\"too_large\"}"), 1.0);
    assert_eq!(rig.metric("flock_watch_errors_total{resource=\"networkpolicies\"}"), 3.0);
    rig.wait("health back", || rig.health.state() == HealthState::Connected && !rig.health.any_watch_failing()).await;
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_a_failing_watch_and_shows_its_error() {
    let rig = Rig::start(Config::default(), options(|_| {})).await;
    let resyncs = rig.health.resyncs();
    // Every request for policies fails; the others are fine.
    rig.server.fail_requests(FailRule::new(usize::MAX, 500).path_contains("/networkpolicies"));
    rig.server.drop_watches();
    rig.wait("Degraded", || rig.health.state() == HealthState::Degraded).await;
    let report = rig.health.report();
    let (error, _) = report.last_error.clone().unwrap();
    assert!(error.starts_with("networkpolicies: ") && error.contains("500"), "{error}");
    assert_eq!(report.watches.iter().filter(|(_, ok)| !ok).map(|(r, _)| r.as_str()).collect::<Vec<_>>(), ["networkpolicies"]);
    assert_eq!(rig.metric("flock_watch_connected{resource=\"networkpolicies\"}"), 0.0);
    assert_eq!(rig.metric("flock_watch_connected{resource=\"pods\"}"), 1.0);
    // It stays unhealthy as long as the watch fails, however far apart the retries are and
    // however well the other watches do; the metrics agree at every look.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        assert_ne!(rig.health.state(), HealthState::Connected, "Connected while the policies' watch fails");
        assert_eq!(rig.metric("flock_api_health_state{state=\"Connected\"}"), 0.0);
        assert_eq!(rig.metric("flock_watch_connected{resource=\"networkpolicies\"}"), 0.0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(rig.health.state(), HealthState::Disconnected);
    assert_eq!(*resyncs.borrow(), 0);

    // A change made meanwhile arrives once the watch recovers; recovery asks for a full sync.
    rig.server.apply(policy("while-failing")).unwrap();
    rig.server.clear_failures();
    rig.wait("Connected", || rig.health.state() == HealthState::Connected).await;
    rig.wait("the change", || rig.policies().contains(&"while-failing".to_string())).await;
    assert_eq!(*resyncs.borrow(), 1);
    assert_eq!(rig.metric("flock_watch_connected{resource=\"networkpolicies\"}"), 1.0);
    assert!(rig.metric("flock_watch_reconnects_total{resource=\"networkpolicies\"}") >= 1.0);
    rig.stop().await;
}

fn probes(server: &ApiServer) -> usize {
    server.requests().iter().filter(|r| r.path == "/version").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_watches_need_no_probes() {
    // The server bookmarks every watch each second: the watches are never quiet for the
    // probe's 1.5 s.
    let rig = Rig::start(Config::default(), options(|o| o.probe.quiet = Duration::from_millis(1500))).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(probes(&rig.server), 0, "/version probed while the watches were healthy");
    assert_eq!(rig.metric("flock_api_probes_total"), 0.0);
    assert_eq!(rig.health.state(), HealthState::Connected);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_watches_are_probed_and_a_failing_probe_degrades_health() {
    // No bookmarks and no changes: the watches are quiet.
    let config = Config { bookmark_interval: None, ..Config::default() };
    let rig = Rig::start(config, options(|o| o.probe.quiet = Duration::from_millis(300))).await;
    rig.wait("a few probes", || probes(&rig.server) >= 3).await;
    let at: Vec<_> = rig.server.requests().iter().filter(|r| r.path == "/version").map(|r| r.at).collect();
    for pair in at.windows(2) {
        let gap = pair[1].duration_since(pair[0]).unwrap();
        assert!(gap >= Duration::from_millis(250), "probes {gap:?} apart with a 300 ms quiet period");
    }
    assert_eq!(rig.health.state(), HealthState::Connected);

    // The API server stops answering while the watches stay open: only the probe can tell.
    rig.server.fail_requests(FailRule::new(usize::MAX, 503).path_contains("/version"));
    rig.wait("Degraded", || rig.health.state() == HealthState::Degraded).await;
    assert!(rig.health.last_error().unwrap().starts_with("probe: 503"), "{:?}", rig.health.last_error());
    assert!(rig.metric("flock_api_probes_total{result=\"failed\"}") >= 1.0);
    rig.server.clear_failures();
    rig.wait("Connected", || rig.health.state() == HealthState::Connected).await;
    // A change on a watch is proof too, and postpones the next probe.
    let before = probes(&rig.server);
    for i in 0..10 {
        rig.server.apply(policy(&format!("busy-{i}"))).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(probes(&rig.server) <= before + 1, "probed while the watches delivered events");
    rig.stop().await;
}

/// A pod update flock cannot read (an address the API server would never store) removes the
/// pod's earlier version instead of leaving it in force: its old labels and address must not
/// keep matching selectors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_pod_update_removes_the_earlier_version() {
    let rig = Rig::start(Config::default(), options(|_| {})).await;
    assert_eq!(rig.pods(), ["a"]);
    rig.server.apply(pod("a", "not-an-address")).unwrap();
    rig.wait("the unreadable pod gone", || rig.pods().is_empty()).await;
    // Readable again: back.
    rig.server.apply(pod("a", "198.18.0.11")).unwrap();
    rig.wait("the pod back", || rig.pods() == ["a"]).await;
    rig.stop.send(true).unwrap();
}

/// On a thread of their own (as flock-agent runs them), the informers need nothing of the
/// caller's runtime: with its only thread blocked, the source still lists to complete. The
/// thread ends with `stop`; a client that cannot be built is an error, not a silent source.
#[test]
fn the_informers_thread_lists_while_the_callers_runtime_is_blocked() {
    // The API server on a runtime of its own, which nothing here blocks.
    let server_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let server = server_rt.block_on(ApiServer::start_temp_with(Config::default())).unwrap();
    seed(&server);

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let health = Arc::new(ApiHealth::new(Duration::from_millis(300), Duration::from_millis(1500)));
    let metrics = Arc::new(Metrics::new());
    let (writer, source) = SourceWriter::new(Snapshot::new(), false);
    let (stop, rx) = watch::channel(false);
    let informers = rt
        .block_on(flock::source::kube::spawn_thread(options(|_| {}), server.client_builder(), writer, health.clone(), metrics.clone(), rx))
        .unwrap();
    // This runtime's one thread is blocked from here until the source is complete.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !source.is_complete() {
        assert!(Instant::now() < deadline, "the informers' thread did not list while the caller's runtime was blocked");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(source.read().snapshot.pods().map(|p| p.name.clone()).collect::<Vec<_>>(), ["a"]);
    stop.send_replace(true);
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), informers.finished()).await })
        .expect("the thread did not end with stop")
        .expect("the watches failed");

    // A client that cannot be built: the thread reports it and ends.
    let (writer, source) = SourceWriter::new(Snapshot::new(), false);
    let (_stop, rx) = watch::channel(false);
    let err = rt
        .block_on(flock::source::kube::spawn_thread(options(|_| {}), || Err(kube::Error::TlsRequired), writer, health, metrics, rx))
        .unwrap_err();
    assert_eq!(err.to_string(), "cannot build the informers' API client: TLS required but no TLS stack selected");
    assert!(!source.is_complete());
    let _in_its_runtime = server_rt.enter();
    drop(server);
}

/// The agent's metrics, but the first list of pods panics: a bug in the pods' watch, as a
/// test can cause one from outside.
struct PanicsOnPods(Metrics);

impl SourceMetrics for PanicsOnPods {
    fn watch(&self, resource: &str, connected: bool) {
        self.0.watch(resource, connected);
    }
    fn watch_error(&self, resource: &str) {
        self.0.watch_error(resource);
    }
    fn watch_reconnected(&self, resource: &str) {
        self.0.watch_reconnected(resource);
    }
    fn watch_relisted(&self, resource: &str, reason: &str) {
        if resource == "pods" {
            panic!("a bug in the pods' watch");
        }
        self.0.watch_relisted(resource, reason);
    }
    fn api_probe(&self, ok: bool) {
        self.0.api_probe(ok);
    }
    fn health(&self, state: &str) {
        self.0.health(state);
    }
    fn resource_served(&self, resource: &str, served: bool) {
        self.0.resource_served(resource, served);
    }
}

/// A watch whose task ends (here a panic) leaves its resource unfollowed: the informers end
/// with an error naming it — flock-agent turns that into a crash and a restart
/// (`daemon::run`) instead of enforcing an ever older snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_panics_ends_the_informers_with_an_error_naming_it() {
    let server = ApiServer::start_temp_with(Config::default()).await.unwrap();
    seed(&server);
    let health = Arc::new(ApiHealth::new(Duration::from_millis(300), Duration::from_millis(1500)));
    let (writer, _source) = SourceWriter::new(Snapshot::new(), false);
    let (_stop, rx) = watch::channel(false);
    let metrics = Arc::new(PanicsOnPods(Metrics::new()));
    let informers = flock::source::kube::spawn_thread(options(|_| {}), server.client_builder(), writer, health, metrics, rx).await.unwrap();
    let ended =
        tokio::time::timeout(Duration::from_secs(10), informers.finished()).await.expect("the informers went on without their pods' watch");
    let err = ended.expect_err("a panicked watch ended the informers without an error");
    assert!(matches!(err, SourceFailed::Panicked { .. }), "{err:?}");
    assert_eq!(err.to_string(), "the pods watch panicked: a bug in the pods' watch");
}
