//! Runs' lifecycle in flock-controller, against the in-repo API server: expiry on a fake
//! clock (the policy rewritten to allow nothing, `Expired`, re-granted when the deadline is
//! raised, also without a profile), the durable audit trail (one AuditEvent per grant,
//! change, withdrawal and expiry, never duplicated, retention by age and count), `Enforced`
//! from two simulated nodes' FlockNodes (one lagging; `EnforcementDelayed` once), `Unknown`
//! where flock does not report, custom pod selectors without `flock.dev/run` refused, an
//! invalid run's egress withdrawn at its deadline all the same (fail closed), deadlines of
//! zero or less refused without granting anything, and egress by domain name (the policy's
//! annotation, the audit trail, `ProfileInvalid` without DNS or for an invalid name).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use flock::controller::Options;
use flock::controller::audit::{self, Retention};
use flock::controller::probe::EnforceMode;
use flock::controller::reconcile::{ENFORCED, EXPIRED, NETWORK_POLICY_READY, READY};
use flock::controller::render::{ClusterConfig, DnsConfig};
use flock::crd::{self, AuditEvent, Run, RunProfile};
use flock::model::EGRESS_DOMAINS_ANNOTATION;
use flock_test_apiserver::ApiServer;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

#[path = "common/controller.rs"]
mod common;
use common::{Running, eventually};

const NS: &str = "jobs";

/// A clock the test moves.
#[derive(Clone)]
struct FakeClock(Arc<Mutex<Timestamp>>);

impl FakeClock {
    fn new() -> Self {
        Self(Arc::new(Mutex::new(Timestamp::now())))
    }
    fn advance(&self, secs: i64) {
        let mut t = self.0.lock().unwrap();
        *t += SignedDuration::from_secs(secs);
    }
    /// Brings the clock up to the wall clock if it is behind: what the API server stamped
    /// (creation, in whole seconds, by the wall clock) is then never in the clock's future.
    fn catch_up(&self) {
        let mut t = self.0.lock().unwrap();
        *t = (*t).max(Timestamp::now());
    }
    fn clock(&self) -> flock::controller::reconcile::Clock {
        let me = self.0.clone();
        Arc::new(move || *me.lock().unwrap())
    }
}

fn options(enforce: EnforceMode, clock: &FakeClock) -> Options {
    let cluster = ClusterConfig {
        pod_cidrs: vec!["198.18.0.0/20".parse().unwrap()],
        service_cidrs: vec!["198.18.240.0/20".parse().unwrap()],
        dns: DnsConfig::default(),
        api_server: Default::default(),
    };
    Options {
        api_server_url: Some("https://198.18.240.1:443".into()),
        // Short: the test moves the fake clock, and each pass reads it.
        resync: Duration::from_millis(200),
        enforced_timeout: Duration::from_secs(1),
        clock: clock.clock(),
        ..Options::new(enforce, cluster)
    }
}

fn profile(server: &ApiServer, name: &str, spec: Value) {
    server.apply(json!({"apiVersion": "flock.dev/v1alpha1", "kind": "RunProfile", "metadata": {"name": name}, "spec": spec})).unwrap();
}

async fn create_run(server: &ApiServer, name: &str, spec: Value) -> Run {
    let r: Run = serde_json::from_value(
        json!({"apiVersion": "flock.dev/v1alpha1", "kind": "Run", "metadata": {"name": name, "namespace": NS}, "spec": spec}),
    )
    .unwrap();
    Api::<Run>::namespaced(server.client(), NS).create(&PostParams::default(), &r).await.unwrap()
}

fn run_of(server: &ApiServer, name: &str) -> Run {
    server.get_resource::<Run>(Some(NS), name).unwrap().unwrap()
}

fn condition(server: &ApiServer, run: &str, type_: &str) -> Option<(String, String, String)> {
    let st = run_of(server, run).status?;
    crd::condition(&st.conditions, type_).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn wait_condition(server: &ApiServer, run: &str, type_: &str, status: &str, reason: &str) -> String {
    eventually(10, &format!("{run} {type_}={status} ({reason})"), || {
        let (s, r, m) = condition(server, run, type_)?;
        (s == status && r == reason).then_some(m)
    })
    .await
}

fn policy(server: &ApiServer, name: &str) -> Option<NetworkPolicy> {
    server.get_resource::<NetworkPolicy>(Some(NS), name).unwrap()
}

/// The run's AuditEvents, by sequence.
fn audits(server: &ApiServer, run: &str) -> Vec<AuditEvent> {
    let mut out: Vec<AuditEvent> =
        server.list_resources::<AuditEvent>(Some(NS)).unwrap().into_iter().filter(|e| e.spec.run.name == run).collect();
    out.sort_by_key(|e| e.spec.sequence);
    out
}

async fn wait_audits(server: &ApiServer, run: &str, n: usize) -> Vec<AuditEvent> {
    let got = eventually(10, &format!("{n} AuditEvents of {run}"), || Some(audits(server, run)).filter(|a| a.len() >= n)).await;
    assert_eq!(got.len(), n, "{got:#?}");
    got
}

fn events(server: &ApiServer, reason: &str) -> Vec<Value> {
    server.list("events.k8s.io/v1", "Event", None).unwrap().into_iter().filter(|e| e["reason"] == reason).collect()
}

fn egress_rules(np: &NetworkPolicy) -> usize {
    np.spec.as_ref().and_then(|s| s.egress.as_ref()).map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_withdraws_egress_and_a_raised_deadline_grants_it_again() {
    let server = common::api_server().await;
    let clock = FakeClock::new();
    let ctl = Running::start(&server, options(EnforceMode::On, &clock)).await;
    profile(&server, "web", json!({"internet": {"ports": [{"port": 443}]}}));
    let run = create_run(&server, "job-1", json!({"profile": "web", "activeDeadlineSeconds": 3600})).await;
    let created = run.metadata.creation_timestamp.clone().unwrap().0;

    // Granted: the profile's egress, Expired False with the expiry, one AuditEvent.
    let np = eventually(10, "the policy", || policy(&server, "job-1-egress")).await;
    assert_eq!(egress_rules(&np), 2, "DNS and internet");
    let msg = wait_condition(&server, "job-1", EXPIRED, "False", "Active").await;
    let expires = flock::controller::reconcile::format_time(created + SignedDuration::from_secs(3600));
    assert!(msg.contains(&expires), "{msg}");
    assert_eq!(run_of(&server, "job-1").status.unwrap().expires_at.as_deref(), Some(expires.as_str()));
    wait_condition(&server, "job-1", READY, "True", "Applied").await;
    let a = wait_audits(&server, "job-1", 1).await;
    let granted = &a[0].spec;
    assert_eq!((granted.action, granted.sequence, granted.reason.as_str()), (crd::AuditAction::Granted, 1, "RunStarted"));
    assert_eq!(granted.run.uid, run.metadata.uid.clone().unwrap());
    assert_eq!((granted.profile.name.as_str(), granted.profile.generation), ("web", Some(1)));
    assert_eq!(granted.policy.generation, np.metadata.generation);
    assert!(granted.added.iter().any(|d| d.starts_with("internet: 0.0.0.0/0")), "{:?}", granted.added);
    assert_eq!(granted.expires_at.as_deref(), Some(expires.as_str()));
    // Not owned by the run: it outlives it.
    assert!(a[0].metadata.owner_references.as_ref().is_none_or(Vec::is_empty));

    // An hour later: the policy stays and allows nothing, Expired, Ready False, recorded.
    clock.advance(3601);
    let np = eventually(10, "the policy withdrawn", || policy(&server, "job-1-egress").filter(|p| egress_rules(p) == 0)).await;
    let spec = np.spec.clone().unwrap();
    assert_eq!(spec.policy_types.as_deref(), Some(&["Ingress".to_string(), "Egress".to_string()][..]));
    assert!(spec.ingress.is_none_or(|i| i.is_empty()));
    assert_eq!(np.metadata.annotations.as_ref().unwrap()["flock.dev/expired"], expires);
    wait_condition(&server, "job-1", EXPIRED, "True", "DeadlineExceeded").await;
    wait_condition(&server, "job-1", READY, "False", "DeadlineExceeded").await;
    assert_eq!(condition(&server, "job-1", NETWORK_POLICY_READY).unwrap().0, "True", "the withdrawing policy is applied");
    let a = wait_audits(&server, "job-1", 2).await;
    assert_eq!((a[1].spec.action, a[1].spec.sequence), (crd::AuditAction::Expired, 2));
    assert_eq!(a[1].spec.removed, granted.added, "everything granted is taken away");
    assert!(a[1].spec.added.is_empty());
    eventually(10, "the EgressExpired event", || events(&server, "EgressExpired").pop()).await;

    // Raising the deadline after expiry grants the egress again.
    let runs = Api::<Run>::namespaced(server.client(), NS);
    runs.patch("job-1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"activeDeadlineSeconds": 7200}}))).await.unwrap();
    eventually(10, "the egress back", || policy(&server, "job-1-egress").filter(|p| egress_rules(p) == 2)).await;
    wait_condition(&server, "job-1", EXPIRED, "False", "Active").await;
    wait_condition(&server, "job-1", READY, "True", "Applied").await;
    let a = wait_audits(&server, "job-1", 3).await;
    assert_eq!((a[2].spec.action, a[2].spec.reason.as_str()), (crd::AuditAction::Extended, "DeadlineExtended"));
    assert_eq!(a[2].spec.added, granted.added, "{:#?}", a);

    // A profile change is recorded with what it adds.
    profile(
        &server,
        "web",
        json!({"internet": {"ports": [{"port": 443}]}, "cidrs": [{"cidr": "198.51.100.0/24", "ports": [{"port": 5432}]}]}),
    );
    let a = wait_audits(&server, "job-1", 4).await;
    assert_eq!(a[3].spec.action, crd::AuditAction::Changed);
    assert_eq!(a[3].spec.added, ["cidr: 198.51.100.0/24 on TCP/5432"]);
    assert!(a[3].spec.removed.is_empty());
    assert_eq!(a[3].spec.profile.generation, Some(2));

    // Deleting the profile revokes it (fail closed): the policy allows nothing at once, and the
    // trail says why, with everything it took away.
    server.delete("flock.dev/v1alpha1", "RunProfile", None, "web").unwrap();
    wait_condition(&server, "job-1", NETWORK_POLICY_READY, "False", "ProfileNotFound").await;
    eventually(10, "the policy withdrawn with its profile", || policy(&server, "job-1-egress").filter(|p| egress_rules(p) == 0)).await;
    let a = wait_audits(&server, "job-1", 5).await;
    assert_eq!((a[4].spec.action, a[4].spec.reason.as_str()), (crd::AuditAction::Changed, "ProfileNotFound"));
    assert_eq!(a[4].spec.removed.len(), 4, "DNS, internet (two families) and the CIDR");
    assert!(a[4].spec.message.contains("RunProfile web does not exist"), "{}", a[4].spec.message);
    // Expiry needs no profile: the deadline passes, and that is recorded too (nothing left to
    // take away).
    clock.advance(3600);
    wait_condition(&server, "job-1", EXPIRED, "True", "DeadlineExceeded").await;
    let a = wait_audits(&server, "job-1", 6).await;
    assert_eq!(a[5].spec.action, crd::AuditAction::Expired);
    assert!(a[5].spec.removed.is_empty(), "{:?}", a[5].spec.removed);
    assert_eq!(egress_rules(&policy(&server, "job-1-egress").unwrap()), 0);

    // Passes that change nothing record nothing (no duplicates: names are per sequence).
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(audits(&server, "job-1").len(), 6);
    let st = run_of(&server, "job-1").status.unwrap();
    assert_eq!(st.grant.as_ref().map(|g| (g.sequence, g.expired)), Some((6, true)));
    // A withdrawal (the policy deleted behind the controller's back) is recorded too.
    let uid = policy(&server, "job-1-egress").unwrap().metadata.uid.unwrap();
    server.delete("networking.k8s.io/v1", "NetworkPolicy", Some(NS), "job-1-egress").unwrap();
    let a = wait_audits(&server, "job-1", 7).await;
    assert_eq!((a[6].spec.action, a[6].spec.reason.as_str()), (crd::AuditAction::Withdrawn, "NetworkPolicyWithdrawn"));
    assert!(a[6].spec.message.contains(&uid), "{}", a[6].spec.message);
    eventually(10, "the policy re-created", || policy(&server, "job-1-egress").filter(|p| p.metadata.uid.as_ref() != Some(&uid))).await;
    let text = ctl.metrics.encode();
    assert!(text.contains("flock_controller_audit_events_written_total{action=\"Expired\"} 2"), "{text}");
    ctl.stop().await;
}

/// A FlockNode as a node's agent writes it.
fn flock_node(server: &ApiServer, node: &str, policies: &[(&str, i64)]) {
    let run_policies: Vec<Value> = policies.iter().map(|(n, g)| json!({"name": n, "generation": g})).collect();
    server
        .apply(json!({"apiVersion": "flock.dev/v1alpha1", "kind": "FlockNode", "metadata": {"name": node}, "spec": {},
                      "status": {"version": "test", "api": "Connected", "runPolicies": run_policies}}))
        .unwrap();
}

fn run_pod(server: &ApiServer, name: &str, run: &str, node: &str) {
    server
        .apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {"flock.dev/run": run}},
                      "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}, "status": {"phase": "Running"}}))
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enforced_follows_what_every_node_of_the_run_reports() {
    let server = common::api_server().await;
    let clock = FakeClock::new();
    // No periodic pass to paper over a missing trigger: pod and FlockNode events must do.
    let opts = Options { resync: Duration::from_secs(600), ..options(EnforceMode::On, &clock) };
    let ctl = Running::start(&server, opts).await;
    profile(&server, "web", json!({"internet": {"ports": [{"port": 443}]}}));
    run_pod(&server, "p1", "job-2", "node-a");
    run_pod(&server, "p2", "job-2", "node-b");
    // Not the run's: another run's pod, and an unscheduled one.
    run_pod(&server, "other", "job-x", "node-c");
    server
        .apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p3", "namespace": NS, "labels": {"flock.dev/run": "job-2"}},
                      "spec": {"containers": [{"name": "c", "image": "x"}]}}))
        .unwrap();
    create_run(&server, "job-2", json!({"profile": "web"})).await;
    let np = eventually(10, "the policy", || policy(&server, "job-2-egress")).await;
    let policy_name = format!("{NS}/job-2-egress");
    assert_eq!(np.metadata.generation, Some(1));

    // No node reports yet.
    let msg = wait_condition(&server, "job-2", ENFORCED, "False", "NodesPending").await;
    assert!(msg.contains("2 of 2") && msg.contains("node-a (no FlockNode") && msg.contains("node-b"), "{msg}");
    assert!(!msg.contains("node-c"), "{msg}");
    wait_condition(&server, "job-2", READY, "False", "NotEnforced").await;

    // node-a enforces generation 1; node-b lags.
    flock_node(&server, "node-a", &[(&policy_name, 1)]);
    flock_node(&server, "node-b", &[]);
    let msg = eventually(10, "only node-b pending", || {
        let (_, _, m) = condition(&server, "job-2", ENFORCED)?;
        m.contains("1 of 2").then_some(m)
    })
    .await;
    assert!(msg.contains("node-b (not yet)"), "{msg}");
    // After the timeout, one EnforcementDelayed event naming the lagging node.
    let delayed = eventually(10, "EnforcementDelayed", || events(&server, "EnforcementDelayed").pop()).await;
    assert!(delayed["note"].as_str().unwrap().contains("node-b"), "{delayed}");
    flock_node(&server, "node-b", &[(&policy_name, 1)]);
    wait_condition(&server, "job-2", ENFORCED, "True", "AllNodesEnforce").await;
    wait_condition(&server, "job-2", READY, "True", "Applied").await;
    assert_eq!(events(&server, "EnforcementDelayed").len(), 1, "one event per pending spell");

    // A profile change: generation 2, both nodes lag until they report it.
    profile(&server, "web", json!({"internet": {"ports": [{"port": 443}, {"port": 80}]}}));
    eventually(10, "generation 2", || policy(&server, "job-2-egress").filter(|p| p.metadata.generation == Some(2))).await;
    let msg = wait_condition(&server, "job-2", ENFORCED, "False", "NodesPending").await;
    assert!(msg.contains("generation 2") && msg.contains("node-a (generation 1)"), "{msg}");
    flock_node(&server, "node-a", &[(&policy_name, 2)]);
    flock_node(&server, "node-b", &[(&policy_name, 2), ("jobs/unrelated", 5)]);
    wait_condition(&server, "job-2", ENFORCED, "True", "AllNodesEnforce").await;

    // node-b lags again for generation 3, then its pod finishes: node-b no longer counts.
    profile(&server, "web", json!({"internet": {"ports": [{"port": 443}]}}));
    eventually(10, "generation 3", || policy(&server, "job-2-egress").filter(|p| p.metadata.generation == Some(3))).await;
    flock_node(&server, "node-a", &[(&policy_name, 3)]);
    wait_condition(&server, "job-2", ENFORCED, "False", "NodesPending").await;
    server.delete("v1", "Pod", Some(NS), "p2").unwrap();
    wait_condition(&server, "job-2", ENFORCED, "True", "AllNodesEnforce").await;
    let st = run_of(&server, "job-2").status.unwrap();
    assert_eq!(st.network_policy.unwrap().generation, Some(3));
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enforced_is_unknown_where_flock_does_not_report() {
    // No FlockNode API: flock-agent is not installed.
    let server = common::api_server().await;
    server.delete("apiextensions.k8s.io/v1", "CustomResourceDefinition", None, "flocknodes.flock.dev").unwrap();
    let clock = FakeClock::new();
    let ctl = Running::start(&server, options(EnforceMode::On, &clock)).await;
    profile(&server, "web", json!({}));
    run_pod(&server, "p1", "job-3", "node-a");
    create_run(&server, "job-3", json!({"profile": "web"})).await;
    let msg = wait_condition(&server, "job-3", ENFORCED, "Unknown", "NotEnforcedByFlock").await;
    assert!(msg.contains("FlockNode"), "{msg}");
    wait_condition(&server, "job-3", READY, "True", "Applied").await;
    // No watch of pods or FlockNodes when nothing reports.
    assert!(!server.requests().iter().any(|r| r.path.contains("/pods") || r.path.contains("flocknodes")));
    ctl.stop().await;

    // Enforcement off: Unknown, and Ready as before.
    let server = common::api_server().await;
    let ctl = Running::start(&server, options(EnforceMode::Off, &clock)).await;
    profile(&server, "web", json!({}));
    create_run(&server, "job-4", json!({"profile": "web"})).await;
    wait_condition(&server, "job-4", ENFORCED, "Unknown", "EnforcementDisabled").await;
    wait_condition(&server, "job-4", READY, "True", "EnforcementDisabled").await;
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_profile_or_an_unlabelled_selector_grants_nothing() {
    let server = common::api_server().await;
    let clock = FakeClock::new();
    let ctl = Running::start(&server, options(EnforceMode::On, &clock)).await;
    create_run(&server, "job-5", json!({"profile": "nope"})).await;
    wait_condition(&server, "job-5", NETWORK_POLICY_READY, "False", "ProfileNotFound").await;
    wait_condition(&server, "job-5", READY, "False", "ProfileNotFound").await;
    // Fail closed: the run's pods get a policy that allows nothing both ways (their
    // isolation does not wait for the profile).
    let np = eventually(10, "a policy that allows nothing", || policy(&server, "job-5-egress")).await;
    let spec = np.spec.clone().unwrap();
    assert_eq!(spec.policy_types.as_deref(), Some(&["Ingress".to_string(), "Egress".to_string()][..]), "{spec:?}");
    assert_eq!(egress_rules(&np), 0);
    assert!(spec.ingress.is_none_or(|i| i.is_empty()), "{:?}", np.spec);
    wait_condition(&server, "job-5", ENFORCED, "True", "NoPodsScheduled").await;
    let msg = wait_condition(&server, "job-5", NETWORK_POLICY_READY, "False", "ProfileNotFound").await;
    assert!(msg.contains("RunProfile nope does not exist") && msg.contains("allows nothing"), "{msg}");
    let a = wait_audits(&server, "job-5", 1).await;
    assert!(a[0].spec.added.is_empty() && a[0].spec.removed.is_empty(), "nothing granted: {:?}", a[0].spec);

    // The CRD's CEL rule refuses this on a real API server; the controller checks again.
    profile(&server, "web", json!({}));
    create_run(&server, "job-6", json!({"profile": "web", "podSelector": {"matchLabels": {"app": "agent"}}})).await;
    let msg = wait_condition(&server, "job-6", NETWORK_POLICY_READY, "False", "RunInvalid").await;
    assert!(msg.contains("must require the flock.dev/run label"), "{msg}");
    assert!(policy(&server, "job-6-egress").is_none());
    ctl.stop().await;
}

/// A run made invalid first (its earlier policy stays, as for any invalid run), then its
/// profile deleted: the grant is revoked all the same, for the pods that had it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_profile_is_revoked_from_an_invalid_run_too() {
    let server = common::api_server().await;
    let clock = FakeClock::new();
    let ctl = Running::start(&server, options(EnforceMode::On, &clock)).await;
    profile(&server, "web", json!({"internet": {"ports": [{"port": 443}]}}));
    let selector = json!({"matchLabels": {"flock.dev/run": "job-r", "app": "agent"}});
    create_run(&server, "job-r", json!({"profile": "web", "podSelector": selector})).await;
    eventually(10, "the grant", || policy(&server, "job-r-egress").filter(|p| egress_rules(p) == 2)).await;
    let runs = Api::<Run>::namespaced(server.client(), NS);
    let unlabelled = json!({"spec": {"podSelector": {"matchLabels": {"flock.dev/run": null, "app": "agent"}}}});
    runs.patch("job-r", &PatchParams::default(), &Patch::Merge(unlabelled)).await.unwrap();
    wait_condition(&server, "job-r", NETWORK_POLICY_READY, "False", "RunInvalid").await;
    assert_eq!(egress_rules(&policy(&server, "job-r-egress").unwrap()), 2, "an invalid run's policy stays until its deadline");

    server.delete("flock.dev/v1alpha1", "RunProfile", None, "web").unwrap();
    let np = eventually(10, "the grant revoked", || policy(&server, "job-r-egress").filter(|p| egress_rules(p) == 0)).await;
    assert_eq!(pod_selector(&np), selector, "the pods that had the grant");
    let msg = wait_condition(&server, "job-r", NETWORK_POLICY_READY, "False", "ProfileNotFound").await;
    assert!(msg.contains("RunProfile web does not exist") && msg.contains("must require the flock.dev/run label"), "{msg}");
    let a = wait_audits(&server, "job-r", 2).await;
    assert_eq!((a[1].spec.action, a[1].spec.reason.as_str()), (crd::AuditAction::Changed, "ProfileNotFound"));
    assert_eq!(a[1].spec.removed.len(), 3, "DNS and the internet, both families: {:?}", a[1].spec.removed);
    ctl.stop().await;
}

fn pod_selector(np: &NetworkPolicy) -> Value {
    serde_json::to_value(&np.spec.as_ref().unwrap().pod_selector).unwrap()
}

/// A run granted egress, then made invalid (a real API server's CEL rule would refuse the
/// edit; the controller checks again): the earlier policy stays until the deadline, and then
/// is withdrawn all the same — allowing nothing, still selecting the pods that had the
/// egress — with `Expired` True, `RunInvalid` kept, and the expiry recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_run_loses_its_egress_at_its_deadline() {
    let server = common::api_server().await;
    let clock = FakeClock::new();
    let ctl = Running::start(&server, options(EnforceMode::On, &clock)).await;
    profile(&server, "web", json!({"internet": {"ports": [{"port": 443}]}}));
    let selector = json!({"matchLabels": {"flock.dev/run": "job-7", "app": "agent"}});
    create_run(&server, "job-7", json!({"profile": "web", "activeDeadlineSeconds": 3600, "podSelector": selector})).await;
    let np = eventually(10, "the policy", || policy(&server, "job-7-egress")).await;
    assert_eq!(egress_rules(&np), 2);
    assert_eq!(pod_selector(&np), selector);
    let granted = wait_audits(&server, "job-7", 1).await.remove(0).spec;

    // Invalid: the earlier policy stays in place until the deadline.
    let runs = Api::<Run>::namespaced(server.client(), NS);
    let unlabelled = json!({"spec": {"podSelector": {"matchLabels": {"flock.dev/run": null, "app": "agent"}}}});
    runs.patch("job-7", &PatchParams::default(), &Patch::Merge(unlabelled)).await.unwrap();
    let msg = wait_condition(&server, "job-7", NETWORK_POLICY_READY, "False", "RunInvalid").await;
    assert!(msg.contains("must require the flock.dev/run label") && msg.contains("stays in place"), "{msg}");
    wait_condition(&server, "job-7", EXPIRED, "False", "Active").await;
    assert_eq!(egress_rules(&policy(&server, "job-7-egress").unwrap()), 2);

    // Past the deadline: withdrawn, for the pods it selected.
    clock.advance(3601);
    let np = eventually(10, "the policy withdrawn", || policy(&server, "job-7-egress").filter(|p| egress_rules(p) == 0)).await;
    let spec = np.spec.clone().unwrap();
    assert_eq!(spec.policy_types.as_deref(), Some(&["Ingress".to_string(), "Egress".to_string()][..]));
    assert!(spec.ingress.is_none_or(|i| i.is_empty()));
    assert_eq!(pod_selector(&np), selector, "the pods that had the egress");
    assert!(np.metadata.annotations.as_ref().unwrap().contains_key("flock.dev/expired"));
    wait_condition(&server, "job-7", EXPIRED, "True", "DeadlineExceeded").await;
    let msg = wait_condition(&server, "job-7", NETWORK_POLICY_READY, "False", "RunInvalid").await;
    assert!(msg.contains("allows nothing"), "{msg}");
    wait_condition(&server, "job-7", READY, "False", "RunInvalid").await;
    let a = wait_audits(&server, "job-7", 2).await;
    assert_eq!((a[1].spec.action, a[1].spec.sequence), (crd::AuditAction::Expired, 2));
    assert_eq!(a[1].spec.removed, granted.added, "everything granted is taken away");
    let st = run_of(&server, "job-7").status.unwrap();
    assert_eq!(st.grant.as_ref().map(|g| (g.sequence, g.expired, g.destinations.is_empty())), Some((2, true, true)));
    assert_eq!(st.network_policy.unwrap().generation, np.metadata.generation);
    ctl.stop().await;
}

/// `activeDeadlineSeconds` of 0 or less: the CRD's `minimum: 1` refuses it on a real API
/// server; the controller's own check says `RunInvalid`, and nothing is granted — the run is
/// past its deadline from its creation, so its policy allows nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_of_zero_or_less_is_invalid_and_grants_nothing() {
    let server = common::api_server().await;
    let clock = FakeClock::new();
    let ctl = Running::start(&server, options(EnforceMode::On, &clock)).await;
    profile(&server, "web", json!({"internet": {"ports": [{"port": 443}]}}));
    for (name, secs) in [("job-z", 0), ("job-n", -5)] {
        create_run(&server, name, json!({"profile": "web", "activeDeadlineSeconds": secs})).await;
        // The fake clock started before the run was created: a deadline of 0 s is past only
        // once it reads the creation time (a pass after this one sees it).
        clock.catch_up();
        let msg = wait_condition(&server, name, NETWORK_POLICY_READY, "False", "RunInvalid").await;
        assert!(msg.contains(&format!("spec.activeDeadlineSeconds: {secs} is not a positive number of seconds")), "{msg}");
        wait_condition(&server, name, READY, "False", "RunInvalid").await;
        wait_condition(&server, name, EXPIRED, "True", "DeadlineExceeded").await;
        let np = policy(&server, &format!("{name}-egress")).unwrap();
        assert_eq!(egress_rules(&np), 0, "{name}: no egress");
        assert!(np.spec.unwrap().ingress.is_none_or(|i| i.is_empty()));
        // Nothing was ever granted: the trail says so.
        let a = wait_audits(&server, name, 1).await;
        assert_eq!(a[0].spec.action, crd::AuditAction::Expired);
        assert!(a[0].spec.added.is_empty() && a[0].spec.removed.is_empty(), "{:?}", a[0].spec);
        assert!(run_of(&server, name).status.unwrap().grant.unwrap().destinations.is_empty());
    }
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_retention_keeps_the_newest_per_run_and_drops_the_old() {
    let server = common::api_server().await;
    let now: Timestamp = "2026-11-26T12:00:00Z".parse().unwrap();
    let event = |name: &str, run_uid: &str, seq: i64, days_ago: i64| {
        let time = flock::controller::reconcile::format_time(now - SignedDuration::from_hours(24 * days_ago));
        server
            .apply(json!({"apiVersion": "flock.dev/v1alpha1", "kind": "AuditEvent",
                          "metadata": {"name": name, "namespace": NS, "labels": {audit::RUN_UID_LABEL: run_uid}},
                          "spec": {"run": {"name": "r", "uid": run_uid}, "profile": {"name": "p"}, "policy": {"kind": "NetworkPolicy", "name": "r-egress"},
                                   "sequence": seq, "action": "Changed", "reason": "EgressChanged", "time": time}}))
            .unwrap();
    };
    event("a-1", "ua", 1, 100);
    for seq in 2..=6 {
        event(&format!("a-{seq}"), "ua", seq, 10 - seq);
    }
    event("b-1", "ub", 1, 95);
    event("b-2", "ub", 2, 1);
    let retention = Retention { max_age: Duration::from_secs(90 * 24 * 3600), max_per_run: 3, interval: Duration::from_secs(60) };
    let deleted = audit::collect(&server.client(), now, &retention).await.unwrap();
    let mut left: Vec<String> =
        server.list_resources::<AuditEvent>(Some(NS)).unwrap().iter().map(|e| e.metadata.name.clone().unwrap()).collect();
    left.sort();
    assert_eq!(left, ["a-4", "a-5", "a-6", "b-2"]);
    assert_eq!(deleted, 4);
    // Idempotent.
    assert_eq!(audit::collect(&server.client(), now, &retention).await.unwrap(), 0);
}

fn domains_annotation(np: &NetworkPolicy) -> Option<String> {
    np.metadata.annotations.as_ref().and_then(|a| a.get(EGRESS_DOMAINS_ANNOTATION).cloned())
}

/// Egress by name: the run's policy carries the profile's names as the annotation flock-agent
/// reads (exact JSON), the audit trail records each name added and removed, a profile whose
/// names cannot be enforced (no DNS, an invalid name) is `ProfileInvalid` and grants nothing
/// (recorded as such), and names dropped from the profile leave the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domains_reach_the_policy_annotation_and_the_audit_trail() {
    let server = common::api_server().await;
    let clock = FakeClock::new();
    let ctl = Running::start(&server, options(EnforceMode::On, &clock)).await;
    let github = json!({"name": "github.com", "ports": [{"port": 443}]});
    profile(&server, "fetch", json!({"domains": [github]}));
    create_run(&server, "job-d", json!({"profile": "fetch"})).await;
    let np = eventually(10, "the policy", || policy(&server, "job-d-egress")).await;
    assert_eq!(domains_annotation(&np).as_deref(), Some(r#"[{"name":"github.com","ports":[{"protocol":"TCP","port":443}]}]"#));
    assert_eq!(egress_rules(&np), 1, "DNS only: names are no NetworkPolicy rule");
    let a = wait_audits(&server, "job-d", 1).await;
    assert!(a[0].spec.added.contains(&"domain: github.com on TCP/443".to_string()), "{:?}", a[0].spec.added);

    // A name added (written any case, trailing dot), then another removed: each recorded.
    profile(&server, "fetch", json!({"domains": [github, {"name": "*.PyPI.org.", "ports": [{"port": 443}]}]}));
    let a = wait_audits(&server, "job-d", 2).await;
    assert_eq!(a[1].spec.action, crd::AuditAction::Changed);
    assert_eq!(a[1].spec.added, ["domain: *.pypi.org on TCP/443"]);
    assert!(a[1].spec.removed.is_empty());
    let both =
        r#"[{"name":"*.pypi.org","ports":[{"protocol":"TCP","port":443}]},{"name":"github.com","ports":[{"protocol":"TCP","port":443}]}]"#;
    eventually(10, "both names", || policy(&server, "job-d-egress").filter(|p| domains_annotation(p).as_deref() == Some(both))).await;
    profile(&server, "fetch", json!({"domains": [{"name": "*.pypi.org", "ports": [{"port": 443}]}]}));
    let a = wait_audits(&server, "job-d", 3).await;
    assert_eq!(a[2].spec.action, crd::AuditAction::Changed);
    assert_eq!(a[2].spec.removed, ["domain: github.com on TCP/443"]);
    assert!(a[2].spec.added.is_empty());
    let pypi = r#"[{"name":"*.pypi.org","ports":[{"protocol":"TCP","port":443}]}]"#;
    eventually(10, "one name", || policy(&server, "job-d-egress").filter(|p| domains_annotation(p).as_deref() == Some(pypi))).await;

    // Names without DNS (a real API server's CEL rule refuses it; the controller checks
    // again): ProfileInvalid, on the run and the profile.
    profile(&server, "fetch", json!({"dns": false, "domains": [{"name": "*.pypi.org", "ports": [{"port": 443}]}]}));
    let msg = wait_condition(&server, "job-d", NETWORK_POLICY_READY, "False", "ProfileInvalid").await;
    assert!(msg.contains("spec.domains: domains need dns"), "{msg}");
    let ready = |server: &ApiServer| {
        let p = server.get_resource::<RunProfile>(None, "fetch").unwrap()?;
        crd::condition(&p.status?.conditions, READY).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    eventually(10, "the profile Invalid", || {
        ready(&server).filter(|(s, r, m)| s == "False" && r == "Invalid" && m.contains("domains need dns"))
    })
    .await;
    // An invalid name (the CRD's pattern refuses it on a real API server).
    profile(&server, "fetch", json!({"domains": [{"name": "pypi.*.org", "ports": [{"port": 443}]}]}));
    let msg = eventually(10, "ProfileInvalid for the name", || {
        let (s, r, m) = condition(&server, "job-d", NETWORK_POLICY_READY)?;
        (s == "False" && r == "ProfileInvalid" && m.contains("spec.domains[0].name")).then_some(m)
    })
    .await;
    assert!(msg.contains("\"pypi.*.org\" is not a domain name: '*' may only be the first label"), "{msg}");
    // Fail closed: an invalid profile grants nothing (its administrator's edit may have meant
    // to narrow it), and the trail records what was taken away, and why.
    let np = eventually(10, "the names withdrawn", || policy(&server, "job-d-egress").filter(|p| domains_annotation(p).is_none())).await;
    assert_eq!(egress_rules(&np), 0, "not even DNS");
    let a = wait_audits(&server, "job-d", 4).await;
    assert_eq!((a[3].spec.action, a[3].spec.reason.as_str()), (crd::AuditAction::Changed, "ProfileInvalid"));
    assert!(a[3].spec.removed.contains(&"domain: *.pypi.org on TCP/443".to_string()), "{:?}", a[3].spec.removed);

    // Valid again, without names: DNS is granted back, and no annotation (server-side apply
    // drops what the controller no longer writes).
    profile(&server, "fetch", json!({}));
    eventually(10, "DNS granted again", || policy(&server, "job-d-egress").filter(|p| egress_rules(p) == 1)).await;
    assert!(domains_annotation(&policy(&server, "job-d-egress").unwrap()).is_none());
    let a = wait_audits(&server, "job-d", 5).await;
    assert_eq!((a[4].spec.action, a[4].spec.reason.as_str()), (crd::AuditAction::Changed, "EgressChanged"));
    assert!(a[4].spec.removed.is_empty() && !a[4].spec.added.is_empty(), "{:?}", a[4].spec);
    wait_condition(&server, "job-d", READY, "True", "Applied").await;
    ctl.stop().await;
}
