//! flock-controller against the in-repo API server (a unix socket; the CRDs are the
//! committed ones from deploy/controller/crds): create → policy and conditions; edit →
//! reverted; delete → re-created with exactly one NetworkPolicyWithdrawn event; first
//! create → none; profile missing → condition False and no hot loop; enforce off → no
//! policy and stale ones removed; the pin holds when the mode flips; API errors → requeued
//! with backoff; CiliumNetworkPolicy where served, never both; start-up refuses without
//! an API server address; start-up waits for a control plane that is down or answers 503;
//! a run never takes over a same-named policy it does not control;
//! the auto probe; leader election; API server address changes.
//! Profiles are read from one watch's cache (no read per reconcile), and only once it holds
//! a complete list; the per-run backoff forgets runs that succeed or are deleted; every
//! metric is `flock_*`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flock::controller::enforced::Verify;
use flock::controller::metrics::{ApplyResult, Metrics};
use flock::controller::probe::{AgentRef, EnforceMode};
use flock::controller::reconcile::{NETWORK_POLICY_READY, READY};
use flock::controller::render::{self, ClusterConfig, DnsConfig};
use flock::controller::{self, Options};
use flock::crd::{self, Run, RunProfile};
use flock::lease::{self, Elector, LeaseSettings};
use flock_test_apiserver::{ApiServer, FailRule};
use hyper::Method;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::watch;

#[path = "common/controller.rs"]
mod common;
use common::{Running, endpoint_slice, eventually};

const NS: &str = "agents";

fn cluster() -> ClusterConfig {
    ClusterConfig {
        pod_cidrs: vec!["198.18.0.0/20".parse().unwrap()],
        service_cidrs: vec!["198.18.240.0/20".parse().unwrap()],
        dns: DnsConfig::default(),
        api_server: Default::default(),
    }
}

fn options(enforce: EnforceMode) -> Options {
    Options {
        enforce,
        agent: AgentRef::default(),
        cluster: cluster(),
        api_server_url: Some("https://198.18.240.1:443".into()),
        resync: Duration::from_secs(600),
        instance: "flock-controller-test".into(),
        ..Options::new(enforce, cluster())
    }
}

async fn server() -> ApiServer {
    common::api_server().await
}

async fn create_profile(server: &ApiServer, name: &str, spec: Value) {
    let p: RunProfile =
        serde_json::from_value(json!({"apiVersion": "flock.dev/v1alpha1", "kind": "RunProfile", "metadata": {"name": name}, "spec": spec}))
            .unwrap();
    Api::<RunProfile>::all(server.client()).create(&PostParams::default(), &p).await.unwrap();
}

async fn create_run(server: &ApiServer, name: &str, profile: &str) -> Run {
    let r: Run = serde_json::from_value(json!({"apiVersion": "flock.dev/v1alpha1", "kind": "Run", "metadata": {"name": name, "namespace": NS}, "spec": {"profile": profile}})).unwrap();
    Api::<Run>::namespaced(server.client(), NS).create(&PostParams::default(), &r).await.unwrap()
}

fn profile_spec() -> Value {
    json!({"internet": {"ports": [{"port": 443}]}, "apiServer": true})
}

fn policy(server: &ApiServer, name: &str) -> Option<NetworkPolicy> {
    server.get_resource::<NetworkPolicy>(Some(NS), name).unwrap()
}

fn run_of(server: &ApiServer, name: &str) -> Run {
    server.get_resource::<Run>(Some(NS), name).unwrap().unwrap()
}

fn condition(server: &ApiServer, run: &str, type_: &str) -> Option<(String, String)> {
    let r = run_of(server, run);
    let st = r.status?;
    crd::condition(&st.conditions, type_).map(|c| (c.status.clone(), c.reason.clone()))
}

fn events(server: &ApiServer, reason: &str) -> Vec<Value> {
    server.list("events.k8s.io/v1", "Event", None).unwrap().into_iter().filter(|e| e["reason"] == reason).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_edit_delete_and_first_create() {
    let server = server().await;
    let ctl = Running::start(&server, options(EnforceMode::On)).await;
    create_profile(&server, "web", profile_spec()).await;

    // create → policy + conditions.
    let t0 = Instant::now();
    let run = create_run(&server, "job-1", "web").await;
    let np = eventually(10, "the policy", || policy(&server, "job-1-egress")).await;
    let to_policy = t0.elapsed();
    eventually(10, "NetworkPolicyReady", || {
        (condition(&server, "job-1", NETWORK_POLICY_READY)? == ("True".into(), "Applied".into())).then_some(())
    })
    .await;
    let to_ready = t0.elapsed();
    eprintln!("create → policy {:.1} ms, → NetworkPolicyReady {:.1} ms", to_policy.as_secs_f64() * 1e3, to_ready.as_secs_f64() * 1e3);
    assert_eq!(condition(&server, "job-1", READY), Some(("True".into(), "Applied".into())));
    let owner = &np.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller, owner.block_owner_deletion),
        ("Run", "job-1", Some(true), Some(true))
    );
    assert_eq!(Some(&owner.uid), run.metadata.uid.as_ref());
    assert_eq!(np.labels()["app.kubernetes.io/managed-by"], "flock-controller");
    let st = run_of(&server, "job-1").status.unwrap();
    assert_eq!(st.network_policy.as_ref().map(|p| p.uid.clone()), np.metadata.uid.clone());
    assert!(st.enforcement.as_ref().unwrap().enabled);
    assert_eq!(st.observed_generation, Some(1));
    // What was applied is exactly what render says, API server rules included: the
    // Service address from the client configuration and the EndpointSlice's endpoint.
    let mut want_cluster = cluster();
    want_cluster.api_server = [("198.18.240.1", 443), ("198.18.250.2", 6443)]
        .into_iter()
        .map(|(a, port)| render::ApiEndpoint { addr: a.parse().unwrap(), port })
        .collect();
    let profile = server.get_resource::<RunProfile>(None, "web").unwrap().unwrap();
    let want = render::render(&run_of(&server, "job-1"), &profile, &want_cluster).unwrap();
    assert_eq!(np.spec, want.spec);
    // Server-side apply, forced, with the fixed field manager.
    let applies: Vec<_> =
        server.requests().into_iter().filter(|r| r.method == Method::PATCH && r.path.contains("/networkpolicies/job-1-egress")).collect();
    assert!(!applies.is_empty());
    assert!(applies.iter().all(|r| r.query.contains("fieldManager=flock-controller") && r.query.contains("force=true")), "{applies:?}");
    // First creation: no Withdrawn event.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(events(&server, "NetworkPolicyWithdrawn").is_empty());
    assert_eq!(ctl.metrics.applied_count(ApplyResult::Created), 1);

    // edit → reverted.
    let nps = Api::<NetworkPolicy>::namespaced(server.client(), NS);
    let mut edited = np.clone();
    edited.spec.as_mut().unwrap().egress = Some(vec![Default::default()]);
    edited.spec.as_mut().unwrap().policy_types = Some(vec!["Ingress".into()]);
    let t0 = Instant::now();
    nps.replace("job-1-egress", &PostParams { field_manager: Some("kubectl-edit".into()), ..PostParams::default() }, &edited)
        .await
        .unwrap();
    eventually(10, "the edit reverted", || (policy(&server, "job-1-egress")?.spec == want.spec).then_some(())).await;
    eprintln!("edit → reverted {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
    assert!(events(&server, "NetworkPolicyWithdrawn").is_empty(), "an edit is not a withdrawal");

    // delete → re-created at once, exactly one Withdrawn event.
    let old_uid = policy(&server, "job-1-egress").unwrap().metadata.uid.unwrap();
    let t0 = Instant::now();
    nps.delete("job-1-egress", &DeleteParams::default()).await.unwrap();
    let again =
        eventually(10, "the policy re-created", || policy(&server, "job-1-egress").filter(|p| p.metadata.uid.as_ref() != Some(&old_uid)))
            .await;
    eprintln!("delete → re-created {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
    assert_eq!(again.spec, want.spec);
    eventually(10, "the new uid recorded", || {
        (run_of(&server, "job-1").status?.network_policy?.uid == *again.metadata.uid.as_ref()?).then_some(())
    })
    .await;
    let withdrawn =
        eventually(10, "the Withdrawn event", || Some(events(&server, "NetworkPolicyWithdrawn")).filter(|e| !e.is_empty())).await;
    assert_eq!(withdrawn.len(), 1);
    let ev = &withdrawn[0];
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["regarding"]["name"], "job-1");
    assert_eq!(ev["regarding"]["kind"], "Run");
    assert_eq!(ev["related"]["uid"], json!(again.metadata.uid));
    assert!(ev["note"].as_str().unwrap().contains(&old_uid), "{ev}");

    // No-op passes (the run touched, a resync of everything) emit nothing more.
    let runs = Api::<Run>::namespaced(server.client(), NS);
    runs.patch("job-1", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"touched": "1"}}}))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(events(&server, "NetworkPolicyWithdrawn").len(), 1);
    assert_eq!(ctl.metrics.withdrawn_count(), 1);
    assert_eq!(policy(&server, "job-1-egress").unwrap().metadata.uid, again.metadata.uid);
    // Every pass read the profile from the cache: no GET of a RunProfile, and one watch of
    // them (one list) for both controllers.
    let requests = server.requests();
    let gets: Vec<_> = requests.iter().filter(|r| r.method == Method::GET && r.path.contains("/runprofiles/")).collect();
    assert!(gets.is_empty(), "RunProfiles read per reconcile: {gets:?}");
    let lists = requests.iter().filter(|r| r.method == Method::GET && !r.watch && r.path.ends_with("/runprofiles")).count();
    assert_eq!(lists, 1, "one RunProfile watch");
    assert_flock_metric_names(&metrics_text(&ctl.metrics).await);
    ctl.stop().await;
}

/// `/metrics` as the controller serves it.
async fn metrics_text(metrics: &Arc<Metrics>) -> String {
    use http_body_util::BodyExt;
    let response = controller::handler(Arc::new(controller::Health::default()), metrics.clone())("/metrics");
    assert_eq!(response.status(), 200);
    String::from_utf8(response.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

/// Every metric in an exposition (sample lines and `# TYPE`/`# HELP` lines) is `flock_*`,
/// and `flock_build_info` is there.
fn assert_flock_metric_names(text: &str) {
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines().filter(|l| !l.is_empty() && *l != "# EOF") {
        let name = match line.strip_prefix("# ") {
            Some(meta) => meta.split_whitespace().nth(1).unwrap(),
            None => line.split(['{', ' ']).next().unwrap(),
        };
        names.insert(name.to_string());
    }
    let foreign: Vec<_> = names.iter().filter(|n| !n.starts_with("flock_")).collect();
    assert!(foreign.is_empty(), "metrics not named flock_*: {foreign:?}\n{text}");
    let info = format!("flock_build_info{{version=\"{}\",commit=\"{}\"}} 1", flock::process::VERSION, flock::process::COMMIT);
    assert!(text.lines().any(|l| l == info), "{info} missing in\n{text}");
}

/// A run is not judged against an incomplete profile cache: while the controller's first
/// lists of RunProfiles fail, a run whose profile exists waits (it is never reported
/// ProfileNotFound), and is applied once the list succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_wait_for_a_complete_profile_cache() {
    let server = server().await;
    create_profile(&server, "web", profile_spec()).await;
    create_run(&server, "job-w", "web").await;
    server.fail_requests(FailRule::new(2, 503).method(Method::GET).path_contains("/apis/flock.dev/v1alpha1/runprofiles"));
    let ctl = Running::start(&server, options(EnforceMode::On)).await;
    let mut seen = std::collections::BTreeSet::new();
    eventually(20, "Applied", || {
        let (_, reason) = condition(&server, "job-w", NETWORK_POLICY_READY)?;
        seen.insert(reason.clone());
        (reason == "Applied").then_some(())
    })
    .await;
    assert!(!seen.contains("ProfileNotFound"), "judged against an incomplete cache: {seen:?}");
    let failed = server.requests().iter().filter(|r| r.path.ends_with("/runprofiles") && r.status == 503).count();
    assert_eq!(failed, 2, "the first two lists of RunProfiles failed");
    ctl.stop().await;
}

/// The per-run backoff holds only runs that are failing and exist: a run's entry goes when
/// it succeeds, when it is deleted, and when a relist (after a watch gap in which it was
/// deleted: no deletion event) no longer has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backoff_entries_go_with_success_deletion_and_relist() {
    let server = server().await;
    create_profile(&server, "web", profile_spec()).await;
    let ctl = Running::start(&server, options(EnforceMode::On)).await;
    let in_backoff = |n: i64| (ctl.metrics.runs_in_backoff_count() == n).then_some(());
    let failing =
        |run: &str, times: usize| FailRule::new(times, 500).method(Method::PATCH).path_contains(format!("/networkpolicies/{run}-egress"));

    // Two failed applies, then success.
    server.fail_requests(failing("job-s", 2));
    create_run(&server, "job-s", "web").await;
    eventually(10, "job-s in backoff", || in_backoff(1)).await;
    eventually(15, "job-s applied", || (condition(&server, "job-s", NETWORK_POLICY_READY)?.1 == "Applied").then_some(())).await;
    eventually(5, "job-s's backoff gone on success", || in_backoff(0)).await;

    // Deleted while failing.
    server.fail_requests(failing("job-d", 100_000));
    create_run(&server, "job-d", "web").await;
    eventually(10, "job-d in backoff", || in_backoff(1)).await;
    Api::<Run>::namespaced(server.client(), NS).delete("job-d", &DeleteParams::default()).await.unwrap();
    eventually(5, "job-d's backoff gone with the run", || in_backoff(0)).await;

    // Deleted while the controller's watches were down, with the history expired: the
    // relist reports no deletion.
    server.fail_requests(failing("job-g", 100_000));
    create_run(&server, "job-g", "web").await;
    eventually(10, "job-g in backoff", || in_backoff(1)).await;
    server.unavailable(true);
    server.delete("flock.dev/v1alpha1", "Run", Some(NS), "job-g").unwrap();
    server.expire_history();
    server.unavailable(false);
    eventually(20, "job-g's backoff gone after the relist", || in_backoff(0)).await;
    assert!(ctl.metrics.applied_count(ApplyResult::Failed) >= 4);
    assert_flock_metric_names(&metrics_text(&ctl.metrics).await);
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_profile_sets_a_condition_and_waits_without_a_hot_loop() {
    let server = server().await;
    let ctl = Running::start(&server, options(EnforceMode::On)).await;
    create_run(&server, "job-2", "later").await;
    eventually(10, "ProfileNotFound", || {
        (condition(&server, "job-2", NETWORK_POLICY_READY)? == ("False".into(), "ProfileNotFound".into())).then_some(())
    })
    .await;
    assert_eq!(condition(&server, "job-2", READY), Some(("False".into(), "ProfileNotFound".into())));
    // The run's pods get a policy that allows nothing, both ways.
    let spec = policy(&server, "job-2-egress").expect("a policy that allows nothing").spec.unwrap();
    assert_eq!(spec.policy_types.as_deref(), Some(&["Ingress".to_string(), "Egress".to_string()][..]), "{spec:?}");
    assert!(spec.egress.as_ref().is_none_or(Vec::is_empty) && spec.ingress.as_ref().is_none_or(Vec::is_empty), "{spec:?}");
    // Settled (the pass that follows its own status write is a no-op): over the next
    // 1.5 s, no more reads of the profile, no status writes.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    server.clear_requests();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let busy: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| !r.watch && (r.path.contains("runprofiles/later") || r.path.contains("runs/job-2")))
        .collect();
    assert!(busy.is_empty(), "hot loop: {busy:?}");
    // The profile appears: the watch brings the run back at once.
    let t0 = Instant::now();
    create_profile(&server, "later", json!({})).await;
    eventually(10, "the policy after the profile appeared", || policy(&server, "job-2-egress")).await;
    eventually(10, "Applied", || (condition(&server, "job-2", NETWORK_POLICY_READY)?.1 == "Applied").then_some(())).await;
    eprintln!("profile created → policy {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);

    // An invalid profile: ProfileInvalid, and the run's policy (the same object) allows
    // nothing (fail closed: the edit may have meant to narrow it); the profile's Ready
    // condition says why.
    let uid = policy(&server, "job-2-egress").unwrap().metadata.uid;
    Api::<RunProfile>::all(server.client())
        .patch("later", &PatchParams::default(), &Patch::Merge(json!({"spec": {"cidrs": [{"cidr": "198.51.100.1/24"}]}})))
        .await
        .unwrap();
    eventually(10, "ProfileInvalid", || (condition(&server, "job-2", NETWORK_POLICY_READY)?.1 == "ProfileInvalid").then_some(())).await;
    let p = server.get_resource::<RunProfile>(None, "later").unwrap().unwrap();
    let ready = eventually(10, "the profile's Ready", || {
        server
            .get_resource::<RunProfile>(None, "later")
            .unwrap()?
            .status
            .and_then(|s| crd::condition(&s.conditions, READY).cloned())
            .filter(|c| c.status == "False")
    })
    .await;
    assert_eq!(ready.reason, "Invalid");
    assert!(ready.message.contains("spec.cidrs[0].cidr"), "{}", ready.message);
    assert!(p.metadata.generation.is_some());
    let np = policy(&server, "job-2-egress").unwrap();
    assert_eq!(np.metadata.uid, uid, "the same policy");
    let spec = np.spec.unwrap();
    assert!(spec.egress.as_ref().is_none_or(Vec::is_empty) && spec.ingress.as_ref().is_none_or(Vec::is_empty), "{spec:?}");
    let msg = run_of(&server, "job-2").status.unwrap();
    let np_ready = crd::condition(&msg.conditions, NETWORK_POLICY_READY).unwrap().message.clone();
    assert!(np_ready.contains("RunProfile later is invalid") && np_ready.contains("allows nothing"), "{np_ready}");
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enforcement_off_applies_nothing_and_removes_stale_policies() {
    let server = server().await;
    create_profile(&server, "web", profile_spec()).await;
    let run = create_run(&server, "job-3", "web").await;
    let uid = run.metadata.uid.clone().unwrap();
    // A stale policy the run owns (e.g. its status was lost in a restore), and a policy of
    // the same name in another namespace that it does not own.
    let stale = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "job-3-egress", "namespace": NS,
                     "ownerReferences": [{"apiVersion": "flock.dev/v1alpha1", "kind": "Run", "name": "job-3", "uid": uid, "controller": true}]},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"]},
    });
    server.apply(stale).unwrap();
    let foreign = json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "job-4-egress", "namespace": NS},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"]},
    });
    server.apply(foreign).unwrap();
    create_run(&server, "job-4", "web").await;

    let ctl = Running::start(&server, options(EnforceMode::Off)).await;
    eventually(10, "the stale policy removed", || policy(&server, "job-3-egress").is_none().then_some(())).await;
    eventually(10, "Disabled", || {
        (condition(&server, "job-3", NETWORK_POLICY_READY)? == ("False".into(), "Disabled".into())).then_some(())
    })
    .await;
    assert_eq!(condition(&server, "job-3", READY), Some(("True".into(), "EnforcementDisabled".into())));
    let st = run_of(&server, "job-3").status.unwrap();
    assert!(!st.enforcement.unwrap().enabled);
    assert!(st.network_policy.is_none());
    eventually(10, "job-4 Disabled", || (condition(&server, "job-4", NETWORK_POLICY_READY)?.1 == "Disabled").then_some(())).await;
    assert!(policy(&server, "job-4-egress").is_some(), "a policy the run does not own is left alone");
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pin_holds_when_the_mode_flips() {
    let server = server().await;
    create_profile(&server, "web", profile_spec()).await;
    let ctl = Running::start(&server, options(EnforceMode::On)).await;
    create_run(&server, "old", "web").await;
    eventually(10, "old applied", || (condition(&server, "old", NETWORK_POLICY_READY)?.1 == "Applied").then_some(())).await;
    ctl.stop().await;

    // The controller comes back with --enforce=off.
    let ctl = Running::start(&server, options(EnforceMode::Off)).await;
    create_run(&server, "new", "web").await;
    eventually(10, "new Disabled", || (condition(&server, "new", NETWORK_POLICY_READY)?.1 == "Disabled").then_some(())).await;
    assert!(policy(&server, "new-egress").is_none());
    let old = run_of(&server, "old").status.unwrap();
    assert!(old.enforcement.as_ref().unwrap().enabled, "the pinned decision did not flip");
    assert_eq!(old.enforcement.as_ref().unwrap().mode, "on");
    assert!(policy(&server, "old-egress").is_some());
    // The old run is still enforced: its policy deleted is re-created.
    let uid = policy(&server, "old-egress").unwrap().metadata.uid;
    Api::<NetworkPolicy>::namespaced(server.client(), NS).delete("old-egress", &DeleteParams::default()).await.unwrap();
    eventually(10, "old re-created", || policy(&server, "old-egress").filter(|p| p.metadata.uid != uid)).await;
    assert!(!run_of(&server, "new").status.unwrap().enforcement.unwrap().enabled);
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_are_requeued_with_backoff() {
    let server = server().await;
    create_profile(&server, "web", profile_spec()).await;
    let ctl = Running::start(&server, options(EnforceMode::On)).await;
    server.fail_requests(FailRule::new(2, 500).method(Method::PATCH).path_contains("/networkpolicies/job-5-egress"));
    let t0 = Instant::now();
    create_run(&server, "job-5", "web").await;
    eventually(10, "ApplyFailed", || (condition(&server, "job-5", NETWORK_POLICY_READY)?.1 == "ApplyFailed").then_some(())).await;
    let msg = run_of(&server, "job-5").status.unwrap();
    assert!(crd::condition(&msg.conditions, NETWORK_POLICY_READY).unwrap().message.contains("applying NetworkPolicy agents/job-5-egress"));
    eventually(15, "the policy after the errors", || policy(&server, "job-5-egress")).await;
    let took = t0.elapsed();
    eventually(10, "Applied", || (condition(&server, "job-5", NETWORK_POLICY_READY)?.1 == "Applied").then_some(())).await;
    // Two failures: retried after 1 s, then 2 s.
    eprintln!("two API errors → applied after {:.2} s", took.as_secs_f64());
    assert!(took >= Duration::from_millis(2900), "{took:?}: no backoff");
    assert_eq!(ctl.metrics.applied_count(ApplyResult::Failed), 2);
    let failed: Vec<_> =
        server.requests().into_iter().filter(|r| r.path.contains("/networkpolicies/job-5-egress") && r.status == 500).collect();
    assert_eq!(failed.len(), 2);
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cilium_network_policies_where_served_and_never_both() {
    let server = server().await;
    server.register("cilium.io", "v2", "CiliumNetworkPolicy", "ciliumnetworkpolicies", true);
    create_profile(&server, "web", profile_spec()).await;
    let run = create_run(&server, "job-6", "web").await;
    // A NetworkPolicy left from before Cilium was installed.
    server
        .apply(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "job-6-egress", "namespace": NS, "labels": {"app.kubernetes.io/managed-by": "flock-controller"},
                         "ownerReferences": [{"apiVersion": "flock.dev/v1alpha1", "kind": "Run", "name": "job-6", "uid": run.metadata.uid, "controller": true}]},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"]},
        }))
        .unwrap();
    let ctl = Running::start(&server, options(EnforceMode::On)).await;
    let cnp =
        eventually(10, "the CiliumNetworkPolicy", || server.get("cilium.io/v2", "CiliumNetworkPolicy", Some(NS), "job-6-egress").unwrap())
            .await;
    assert_eq!(cnp["spec"]["endpointSelector"]["matchLabels"]["flock.dev/run"], "job-6");
    assert!(cnp["spec"]["egress"].as_array().unwrap().iter().any(|r| r["toEntities"] == json!(["kube-apiserver"])));
    eventually(10, "the NetworkPolicy removed", || policy(&server, "job-6-egress").is_none().then_some(())).await;
    eventually(10, "the CiliumNetworkPolicy recorded", || {
        (run_of(&server, "job-6").status?.network_policy?.kind == "CiliumNetworkPolicy").then_some(())
    })
    .await;
    // Cilium does not report what each node enforces: Enforced is Unknown, Ready as before.
    eventually(10, "Enforced Unknown", || {
        (condition(&server, "job-6", "Enforced")? == ("Unknown".into(), "NotEnforcedByFlock".into())).then_some(())
    })
    .await;
    assert_eq!(condition(&server, "job-6", READY), Some(("True".into(), "Applied".into())));
    // Deleted → re-created (the owned watch is on CiliumNetworkPolicies).
    let uid = cnp["metadata"]["uid"].clone();
    server.delete("cilium.io/v2", "CiliumNetworkPolicy", Some(NS), "job-6-egress").unwrap();
    eventually(10, "the CNP re-created", || {
        server.get("cilium.io/v2", "CiliumNetworkPolicy", Some(NS), "job-6-egress").unwrap().filter(|c| c["metadata"]["uid"] != uid)
    })
    .await;
    eventually(10, "one Withdrawn event", || (events(&server, "NetworkPolicyWithdrawn").len() == 1).then_some(())).await;
    assert!(policy(&server, "job-6-egress").is_none(), "never both");
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_addresses_follow_the_endpoint_slices() {
    let server = server().await;
    create_profile(&server, "api", json!({"dns": false, "apiServer": true})).await;
    let ctl = Running::start(&server, options(EnforceMode::On)).await;
    create_run(&server, "job-7", "api").await;
    let cidrs = |np: &NetworkPolicy| -> Vec<String> {
        np.spec
            .as_ref()
            .unwrap()
            .egress
            .iter()
            .flatten()
            .flat_map(|r| r.to.iter().flatten())
            .filter_map(|p| Some(p.ip_block.clone()?.cidr))
            .collect()
    };
    let np = eventually(10, "the policy", || policy(&server, "job-7-egress")).await;
    assert_eq!(cidrs(&np), ["198.18.240.1/32", "198.18.250.2/32"]);
    // The control plane moves.
    let t0 = Instant::now();
    server.apply(endpoint_slice("198.18.250.9")).unwrap();
    eventually(10, "the new endpoint", || {
        (cidrs(&policy(&server, "job-7-egress")?) == ["198.18.240.1/32", "198.18.250.9/32"]).then_some(())
    })
    .await;
    eprintln!("EndpointSlice change → policy {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_api_server_address_refuses_to_start() {
    let server = ApiServer::start_temp().await.unwrap();
    let mut opts = options(EnforceMode::On);
    opts.api_server_url = None;
    let e = controller::start(&server.client(), &opts).await.unwrap_err();
    assert!(e.to_string().contains("refusing to start"), "{e}");
    // An address from the client configuration alone is enough.
    opts.api_server_url = Some("https://[2001:db8::1]:6443".into());
    let s = controller::start(&server.client(), &opts).await.unwrap();
    assert_eq!(s.cluster.api_server.len(), 1);
    // A cluster CIDR of /0 would except the whole internet.
    opts.cluster.pod_cidrs = vec!["0.0.0.0/0".parse().unwrap()];
    assert!(controller::start(&server.client(), &opts).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auto_probe() {
    let server = server().await;
    let client = server.client();
    // Nothing enforces: off.
    let s = controller::start(&client, &options(EnforceMode::Auto)).await.unwrap();
    assert!(!s.decision.enabled, "{}", s.decision.reason);
    assert!(s.decision.reason.contains("no DaemonSet flock-system/flock-agent"), "{}", s.decision.reason);
    // Another enforcer's pods.
    server
        .apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "calico-node-x", "namespace": "kube-system", "labels": {"k8s-app": "calico-node"}}, "spec": {"containers": []}}))
        .unwrap();
    let s = controller::start(&client, &options(EnforceMode::Auto)).await.unwrap();
    assert!(s.decision.enabled && s.decision.reason.contains("calico"), "{}", s.decision.reason);
    assert!(matches!(&s.verify, Verify::Unknown { message, .. } if message.contains("not flock-agent")), "{:?}", s.verify);
    // flock-agent ready.
    server
        .apply(json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "flock-agent", "namespace": "flock-system"},
                      "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": []}}},
                      "status": {"numberReady": 2, "desiredNumberScheduled": 2, "currentNumberScheduled": 2, "numberMisscheduled": 0}}))
        .unwrap();
    let s = controller::start(&client, &options(EnforceMode::Auto)).await.unwrap();
    assert!(s.decision.enabled && s.decision.reason.contains("2/2 pods ready"), "{}", s.decision.reason);
    assert_eq!(s.verify, Verify::Flock, "flock-agent found and the FlockNode API served");
    assert_eq!(controller::start(&client, &options(EnforceMode::On)).await.unwrap().verify, Verify::Flock);
    assert!(matches!(controller::start(&client, &options(EnforceMode::Off)).await.unwrap().verify, Verify::Unknown { .. }));
    // --enforce=off wins.
    assert!(!controller::start(&client, &options(EnforceMode::Off)).await.unwrap().decision.enabled);
    // A probe error: off, and a Warning Event about the Deployment.
    server.fail_requests(FailRule::new(1, 403).path_contains("/daemonsets/flock-agent"));
    let s = controller::start(&client, &options(EnforceMode::Auto)).await.unwrap();
    assert!(!s.decision.enabled && s.decision.reason.contains("probe failed"), "{}", s.decision.reason);
    let ev = eventually(5, "the EnforcerProbeFailed event", || events(&server, "EnforcerProbeFailed").pop()).await;
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["regarding"]["kind"], "Deployment");
    assert_eq!(ev["regarding"]["name"], "flock-controller");
}

/// A Run never takes over a same-named policy it does not control (the apply is forced):
/// an administrator's `default-deny-egress` keeps its spec and owners beside a Run named
/// `default-deny`, the run says why by name, and deleting the run leaves the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_never_takes_over_a_policy_it_does_not_control() {
    let server = server().await;
    create_profile(&server, "web", profile_spec()).await;
    let admins = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "default-deny-egress", "namespace": NS}, "spec": {"podSelector": {}, "policyTypes": ["Egress"]}});
    server.apply(admins).unwrap();
    let before = policy(&server, "default-deny-egress").unwrap();
    let ctl = Running::start(&server, options(EnforceMode::On)).await;
    create_run(&server, "default-deny", "web").await;
    eventually(10, "NetworkPolicyReady PolicyNameTaken", || {
        (condition(&server, "default-deny", NETWORK_POLICY_READY)? == ("False".into(), "PolicyNameTaken".into())).then_some(())
    })
    .await;
    let st = run_of(&server, "default-deny").status.unwrap();
    let message = &crd::condition(&st.conditions, NETWORK_POLICY_READY).unwrap().message;
    assert!(message.contains("NetworkPolicy agents/default-deny-egress exists and is not this run's"), "{message}");
    assert!(message.contains("controlled by no one"), "{message}");
    assert!(st.network_policy.is_none(), "{:?}", st.network_policy);
    let after = policy(&server, "default-deny-egress").unwrap();
    assert_eq!(serde_json::to_value(&after.spec).unwrap(), serde_json::to_value(&before.spec).unwrap(), "the administrator's spec");
    assert!(after.metadata.owner_references.unwrap_or_default().is_empty(), "no owner added");
    assert!(
        !server.requests().iter().any(|r| r.method == Method::PATCH && r.path.contains("/networkpolicies/default-deny-egress")),
        "the policy was written to"
    );
    // The run goes; the policy stays.
    Api::<Run>::namespaced(server.client(), NS).delete("default-deny", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(policy(&server, "default-deny-egress").unwrap().metadata.uid, before.metadata.uid);
    ctl.stop().await;
}

/// A control plane that is not there yet, or answers 503, is waited for: the start is
/// retried (never "enforcement off" from a blip), a stop ends the wait, and what cannot
/// get better (a /0 cluster CIDR) fails at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_waits_for_the_control_plane() {
    let (_tx, no_stop) = watch::channel(false);
    // The probe's first two reads fail with 503: retried, and the decision is the real one.
    let server = server().await;
    server.fail_requests(FailRule::new(2, 503).path_contains("/daemonsets/flock-agent"));
    let s = controller::start_until_ready(&server.client(), &options(EnforceMode::Auto), no_stop.clone()).await.unwrap().unwrap();
    assert!(!s.decision.reason.contains("probe failed"), "{}", s.decision.reason);
    assert!(s.decision.reason.contains("no DaemonSet flock-system/flock-agent"), "{}", s.decision.reason);
    assert!(events(&server, "EnforcerProbeFailed").is_empty(), "a 503 is not a probe verdict");
    // The EndpointSlice list fails twice with 503: retried.
    server.fail_requests(FailRule::new(2, 503).method(Method::GET).path_contains("/endpointslices"));
    let s = controller::start_until_ready(&server.client(), &options(EnforceMode::On), no_stop.clone()).await.unwrap().unwrap();
    assert!(s.cluster.api_server.iter().any(|n| n.to_string().starts_with("198.18.250.2")), "{:?}", s.cluster.api_server);
    let slice_lists = server.requests().iter().filter(|r| r.path.contains("/endpointslices")).count();
    assert!(slice_lists >= 3, "two failures and a success: {slice_lists}");

    // No API server at all yet: the client's connections are refused until it starts.
    let dir = std::env::temp_dir().join(format!("flock-controller-wait-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("apiserver.sock");
    let client = flock_test_apiserver::client_for_socket(&socket);
    let late = {
        let socket = socket.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(700)).await;
            let server = ApiServer::start(&socket).await.unwrap();
            common::seed(&server);
            server
        })
    };
    let t0 = Instant::now();
    let s = controller::start_until_ready(&client, &options(EnforceMode::Auto), no_stop.clone()).await.unwrap().unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(700), "started before the API server existed");
    assert!(s.decision.reason.contains("no DaemonSet"), "{}", s.decision.reason);
    let late = late.await.unwrap();

    // A stop ends the wait.
    let gone = dir.join("never.sock");
    let (tx, stop) = watch::channel(false);
    let waiting = tokio::spawn({
        let client = flock_test_apiserver::client_for_socket(&gone);
        async move { controller::start_until_ready(&client, &options(EnforceMode::On), stop).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "nothing to start against: still waiting");
    tx.send(true).unwrap();
    let r = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("the stop ends the wait").unwrap();
    assert!(matches!(r, Ok(None)), "{r:?}");

    // Permanent: a /0 cluster CIDR is an error at once, not a retry.
    let mut opts = options(EnforceMode::On);
    opts.cluster.pod_cidrs = vec!["0.0.0.0/0".parse().unwrap()];
    let t0 = Instant::now();
    let e = controller::start_until_ready(&late.client(), &opts, no_stop).await.unwrap_err();
    assert!(!e.retryable() && t0.elapsed() < Duration::from_secs(2), "{e}");
    drop(late);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn start_backoff_doubles_to_thirty_seconds() {
    let waits: Vec<u64> = (0..10).map(|a| controller::start_backoff(a).as_millis() as u64).collect();
    assert_eq!(waits, [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]);
    assert_eq!(controller::start_backoff(u32::MAX), Duration::from_secs(30));
}

/// Two candidates on one Lease: at most one leads at any time (sampled every 5 ms), a
/// clean stop hands over within a retry period, and a leader cut off from the API server
/// steps down before the other takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_election_never_has_two_leaders() {
    let server = ApiServer::start_temp().await.unwrap();
    let leading = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
    let overlaps = Arc::new(AtomicUsize::new(0));
    let cfg = || LeaseSettings {
        lease_duration: Duration::from_millis(1500),
        renew_deadline: Duration::from_millis(1000),
        renew_period: Duration::from_millis(100),
        candidate_period: Duration::from_millis(100),
        ..LeaseSettings::new("flock-system", "flock-controller")
    };
    let spawn = |i: usize| {
        let (tx, rx) = watch::channel(false);
        let (client, leading, id) = (server.client(), leading.clone(), format!("replica-{i}"));
        let task = tokio::spawn(async move {
            let l = leading.clone();
            lease::lead(
                Elector::new(client, cfg(), &id, "the leader").unwrap(),
                rx,
                |_| {},
                move |mut stop| async move {
                    l[i].store(true, Ordering::SeqCst);
                    let _ = stop.wait_for(|s| *s).await;
                    l[i].store(false, Ordering::SeqCst);
                },
            )
            .await
        });
        (tx, task)
    };
    let sampler = {
        let (leading, overlaps) = (leading.clone(), overlaps.clone());
        tokio::spawn(async move {
            loop {
                if leading[0].load(Ordering::SeqCst) && leading[1].load(Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let any = |leading: &[AtomicBool; 2]| leading.iter().position(|l| l.load(Ordering::SeqCst));
    let (stop0, task0) = spawn(0);
    let (stop1, task1) = spawn(1);
    let first = eventually(5, "a leader", || any(&leading)).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(any(&leading), Some(first), "leadership is stable");
    let (other, stop_first, first_task, stop_other, other_task) =
        if first == 0 { (1, stop0, task0, stop1, task1) } else { (0, stop1, task1, stop0, task0) };

    // A clean stop releases the Lease: the other takes over in about a retry period.
    let t0 = Instant::now();
    stop_first.send(true).unwrap();
    first_task.await.unwrap().unwrap();
    eventually(5, "the hand-over", || leading[other].load(Ordering::SeqCst).then_some(())).await;
    let handover = t0.elapsed();
    eprintln!("clean hand-over {:.0} ms", handover.as_secs_f64() * 1e3);
    assert!(handover < Duration::from_millis(1500), "{handover:?}: waited for expiry");

    // The leader loses the API server: it steps down (an error: the process exits).
    let (stop_again, rx) = watch::channel(false);
    let (client, l, id) = (server.client(), leading.clone(), format!("replica-{first}"));
    let again = tokio::spawn(async move {
        let l2 = l.clone();
        lease::lead(
            Elector::new(client, cfg(), &id, "the leader").unwrap(),
            rx,
            |_| {},
            move |mut stop| async move {
                l2[first].store(true, Ordering::SeqCst);
                let _ = stop.wait_for(|s| *s).await;
                l2[first].store(false, Ordering::SeqCst);
            },
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.unavailable(true);
    let lost = tokio::time::timeout(Duration::from_secs(5), other_task).await.unwrap().unwrap();
    assert!(lost.is_err(), "the leader stepped down: {lost:?}");
    assert!(!leading[other].load(Ordering::SeqCst));
    server.unavailable(false);
    eventually(10, "the waiting candidate takes over after expiry", || leading[first].load(Ordering::SeqCst).then_some(())).await;
    stop_again.send(true).unwrap();
    again.await.unwrap().unwrap();
    drop(stop_other);
    sampler.abort();
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two leaders at once");
}

#[tokio::test]
async fn health_and_metrics_endpoints() {
    let health = Arc::new(controller::Health::default());
    let metrics = Arc::new(Metrics::new());
    metrics.enforcement(true);
    let h = controller::handler(health.clone(), metrics.clone());
    assert_eq!(h("/healthz").status(), 200);
    assert_eq!(h("/readyz").status(), 503);
    health.started.store(true, Ordering::SeqCst);
    assert_eq!(h("/readyz").status(), 200);
    assert_eq!(h("/metrics").status(), 200);
    assert_eq!(h("/nope").status(), 404);
    assert_flock_metric_names(&metrics_text(&metrics).await);
}

/// The grant a request needs, as in `common::grants` (`None` for discovery). A server-side
/// apply that creates its object needs `create` as well as `patch`.
fn needed(r: &flock_test_apiserver::RequestRecord) -> Vec<(Option<String>, String, Option<String>)> {
    let segs: Vec<&str> = r.path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match segs.first() {
        Some(&"api") if segs.len() > 2 => ("", &segs[2..]),
        Some(&"apis") if segs.len() > 3 => (segs[1], &segs[3..]),
        _ => return Vec::new(),
    };
    let (ns, rest) = if rest.len() >= 3 && rest[0] == "namespaces" { (Some(rest[1].to_string()), &rest[2..]) } else { (None, rest) };
    let resource = match rest.get(2) {
        Some(sub) => format!("{}/{sub}", rest[0]),
        None => rest[0].to_string(),
    };
    let name = rest.get(1).map(|n| n.to_string());
    let verbs: &[&str] = match (r.method.as_str(), &name) {
        ("GET", Some(_)) => &["get"],
        ("GET", None) if r.watch => &["watch"],
        ("GET", None) => &["list"],
        ("POST", _) => &["create"],
        ("PUT", _) => &["update"],
        ("PATCH", _) if r.status == 201 => &["patch", "create"],
        ("PATCH", _) => &["patch"],
        ("DELETE", _) => &["delete"],
        _ => &[],
    };
    verbs.iter().map(|v| (ns.clone(), format!("{group}/{resource}:{v}"), name.clone())).collect()
}

/// Every request flock-controller makes — start-up probe, leader election, both
/// controllers, in NetworkPolicy mode and then in CiliumNetworkPolicy mode, stale removals,
/// a withdrawal event — is granted by deploy/controller/rbac.yaml, and every grant there is
/// used. (The test acts on the cluster only through the server's direct handle, so the
/// request log is the controller's alone.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_grants_exactly_the_requests_the_controller_makes() {
    let server = server().await;
    let owner =
        |run: &str, uid: &str| json!([{"apiVersion": "flock.dev/v1alpha1", "kind": "Run", "name": run, "uid": uid, "controller": true}]);
    let direct = |v: Value| {
        server.apply(v).unwrap();
    };
    direct(
        json!({"apiVersion": "flock.dev/v1alpha1", "kind": "RunProfile", "metadata": {"name": "web", "generation": 1}, "spec": profile_spec()}),
    );
    direct(
        json!({"apiVersion": "flock.dev/v1alpha1", "kind": "Run", "metadata": {"name": "a", "namespace": NS, "uid": "uid-a", "generation": 1}, "spec": {"profile": "web"}}),
    );
    // A run pinned to "not enforced".
    direct(
        json!({"apiVersion": "flock.dev/v1alpha1", "kind": "Run", "metadata": {"name": "d", "namespace": NS, "uid": "uid-d", "generation": 1}, "spec": {"profile": "web"},
                  "status": {"enforcement": {"enabled": false, "mode": "off", "reason": "test"}}}),
    );
    // An AuditEvent past its retention.
    direct(json!({"apiVersion": "flock.dev/v1alpha1", "kind": "AuditEvent", "metadata": {"name": "old-1", "namespace": NS},
                  "spec": {"run": {"name": "gone", "uid": "uid-gone"}, "profile": {"name": "web"}, "policy": {"kind": "NetworkPolicy", "name": "gone-egress"},
                           "sequence": 1, "action": "Granted", "reason": "RunStarted", "time": "2020-01-01T00:00:00Z"}}));
    server.clear_requests();

    // As the binary runs it: start-up (auto: the probe), then the controllers while leading.
    let phase = |server: ApiServer| async move {
        let mut opts = options(EnforceMode::Auto);
        opts.retention.interval = Duration::from_millis(100);
        let client = server.client();
        let mut startup = controller::start(&client, &opts).await.unwrap();
        startup.decision.enabled = true; // nothing enforces in this cluster; enforce anyway
        startup.verify = flock::controller::enforced::Verify::Flock; // and as if flock-agent reported
        let (stop, rx) = watch::channel(false);
        let settings = LeaseSettings {
            renew_period: Duration::from_millis(200),
            candidate_period: Duration::from_millis(200),
            ..LeaseSettings::new("flock-system", "flock-controller")
        };
        let elector = Elector::new(client.clone(), settings, "replica-0", "the leader").unwrap();
        let metrics = Arc::new(Metrics::new());
        let task = tokio::spawn(async move {
            lease::lead(
                elector,
                rx,
                |_| {},
                move |work_stop| async move { controller::run(client, startup, &opts, metrics, work_stop).await },
            )
            .await
            .unwrap();
        });
        (stop, task)
    };
    let cnp = |name: &str| server.get("cilium.io/v2", "CiliumNetworkPolicy", Some(NS), name).unwrap();

    // NetworkPolicy mode.
    let (stop, task) = phase(server.clone()).await;
    eventually(10, "a's policy", || policy(&server, "a-egress")).await;
    eventually(10, "a applied", || (condition(&server, "a", NETWORK_POLICY_READY)?.1 == "Applied").then_some(())).await;
    eventually(10, "d disabled", || (condition(&server, "d", NETWORK_POLICY_READY)?.1 == "Disabled").then_some(())).await;
    eventually(10, "the profile's status", || server.get_resource::<RunProfile>(None, "web").unwrap()?.status).await;
    eventually(10, "the old AuditEvent collected", || {
        server.get("flock.dev/v1alpha1", "AuditEvent", Some(NS), "old-1").unwrap().is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await; // a lease renewal
    stop.send(true).unwrap();
    task.await.unwrap();

    // Cilium arrives; d has a stale policy.
    server.register("cilium.io", "v2", "CiliumNetworkPolicy", "ciliumnetworkpolicies", true);
    direct(
        json!({"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy", "metadata": {"name": "d-egress", "namespace": NS, "ownerReferences": owner("d", "uid-d")}, "spec": {}}),
    );
    let (stop, task) = phase(server.clone()).await;
    eventually(10, "a's CiliumNetworkPolicy", || cnp("a-egress")).await;
    eventually(10, "a's NetworkPolicy removed", || policy(&server, "a-egress").is_none().then_some(())).await;
    eventually(10, "d's stale policy removed", || cnp("d-egress").is_none().then_some(())).await;
    let uid = cnp("a-egress").unwrap()["metadata"]["uid"].clone();
    eventually(10, "the uid recorded", || (run_of(&server, "a").status?.network_policy?.uid == uid.as_str()?).then_some(())).await;
    server.delete("cilium.io/v2", "CiliumNetworkPolicy", Some(NS), "a-egress").unwrap();
    eventually(10, "the Withdrawn event", || events(&server, "NetworkPolicyWithdrawn").pop()).await;
    stop.send(true).unwrap();
    task.await.unwrap();

    let granted = common::grants("deploy/controller/rbac.yaml", &["ClusterRole", "Role"]);
    let mut used = std::collections::BTreeSet::new();
    let mut refused = Vec::new();
    for r in server.requests() {
        for (ns, what, name) in needed(&r) {
            let mut candidates = Vec::new();
            if let Some(ns) = &ns {
                candidates.extend(name.iter().map(|n| format!("{ns} {what}/{n}")));
                candidates.push(format!("{ns} {what}"));
            }
            candidates.push(format!("cluster {what}"));
            match candidates.iter().find(|c| granted.contains(c)) {
                Some(c) => {
                    used.insert(c.clone());
                }
                None => refused.push(format!("{} {} ({candidates:?})", r.method, r.path)),
            }
        }
    }
    assert!(refused.is_empty(), "not granted:\n{}", refused.join("\n"));
    let unused: Vec<&String> = granted.iter().filter(|g| !used.contains(*g)).collect();
    assert!(unused.is_empty(), "granted but never used: {unused:?}");
}
