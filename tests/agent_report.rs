//! Policy problems are reported once for the whole cluster: several flock-agents against one
//! test API server, one holding the reporter Lease, one `PolicyNotEnforceable` Event per
//! problem with a growing `series`, failover without re-publishing, nothing from agents that
//! do not hold the Lease, and exactly the RBAC the reporter uses; for ClusterNetworkPolicies
//! also flock's status condition, written by server-side apply only when it changes.
//!
//! The first test runs whole agents (`daemon::run`, real nft in a node namespace each: root);
//! the others run only what reports (the informers and [`Reporter`]), without the kernel.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/controller.rs"]
mod common;
use common::http_get;

use std::sync::Arc;
use std::time::{Duration, Instant};

use flock::agent::AgentConfig;
use flock::agent::metrics::Metrics;
use flock::daemon::{self, DaemonOptions};
use flock::lease::LeaseSettings;
use flock::model::Snapshot;
use flock::report::{ReportOptions, Reporter};
use flock::source::SourceWriter;
use flock::source::kube::{ApiHealth, SourceOptions};
use flock::testkit::kernel::{Node, TempDir, require_root};
use flock_test_apiserver::{ApiServer, FailRule, RequestRecord};
use serde_json::{Value, json};
use tokio::sync::watch;

const LEASE: &str = "flock-agent-reporter";

/// Fast timings: a 1 s heartbeat; a 4 s Lease renewed every 0.25 s (a loaded machine may
/// stall a renewal for a while: it must not lose the Lease then), candidates every
/// 0.3–0.45 s.
fn fast_report() -> ReportOptions {
    ReportOptions {
        lease: LeaseSettings {
            lease_duration: Duration::from_secs(4),
            renew_deadline: Duration::from_secs(3),
            renew_period: Duration::from_millis(250),
            candidate_period: Duration::from_millis(300),
            ..flock::report::reporter_lease()
        },
        heartbeat: Duration::from_secs(1),
        retry: Duration::from_millis(200),
        request_interval: Duration::from_millis(5),
        recompute_interval: Duration::from_millis(100),
    }
}

/// A policy flock cannot enforce as written (endPort below port).
fn broken(name: &str) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name, "namespace": "default"},
           "spec": {"podSelector": {"matchLabels": {"app": "a"}}, "ingress": [{"ports": [{"port": 80, "endPort": 70}]}]}})
}

/// The same policy, fixed.
fn fixed(name: &str) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name, "namespace": "default"},
           "spec": {"podSelector": {"matchLabels": {"app": "a"}}, "ingress": [{"ports": [{"port": 80, "endPort": 90}]}]}})
}

/// The PolicyNotEnforceable Events about `policy`.
fn events_about(server: &ApiServer, policy: &str) -> Vec<Value> {
    server
        .list("events.k8s.io/v1", "Event", Some("default"))
        .unwrap()
        .into_iter()
        .filter(|e| e["reason"] == "PolicyNotEnforceable" && e["regarding"]["name"] == policy)
        .collect()
}

fn series_count(e: &Value) -> i64 {
    e["series"]["count"].as_i64().unwrap_or(1)
}

fn holder(server: &ApiServer) -> Option<String> {
    let lease = server.get("coordination.k8s.io/v1", "Lease", Some("flock-system"), LEASE).unwrap()?;
    lease["spec"]["holderIdentity"].as_str().filter(|h| !h.is_empty()).map(str::to_owned)
}

/// Requests about Events with this method (GET, POST, PATCH).
fn event_requests(server: &ApiServer, method: &str) -> usize {
    server.requests().iter().filter(|r| r.method.as_str() == method && r.path.contains("/apis/events.k8s.io/")).count()
}

async fn eventually<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One whole flock-agent on its own node namespace.
struct NodeAgent {
    name: String,
    dir: TempDir,
    _node: Node,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeAgent {
    fn start(server: &ApiServer, i: u8) -> Self {
        let node_name = format!("n{i}");
        let cidr = format!("198.18.{}.0/24", 80 + i);
        server
            .apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name},
                          "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
                          "status": {"addresses": [{"type": "InternalIP", "address": format!("198.18.0.{}", 80 + i)}]}}))
            .unwrap();
        let node = Node::new(&format!("rep{i}"));
        let dir = TempDir::new(&format!("rep{i}"));
        let mut agent = AgentConfig::new(&node_name, node.ns.netns(), dir.join("cni.sock"), dir.join("pending-del"));
        agent.state_dir = Some(dir.join("state"));
        agent.routes = false;
        let opts = DaemonOptions { events: true, report: fast_report(), ..common::daemon_options(agent, &dir.path) };
        let (stop, rx) = watch::channel(false);
        let (client, informers) = (server.client(), server.client_builder());
        let task = tokio::spawn(async move { daemon::run(opts, client, informers, rx).await.unwrap() });
        Self { name: format!("flock-agent-{node_name}"), dir, _node: node, stop, task }
    }

    fn metric(&self, name: &str) -> Option<f64> {
        let (code, body) = http_get(&self.dir.join("metrics.sock"), "/metrics");
        if code != 200 {
            return None;
        }
        body.lines().find(|l| l.split_once(' ').is_some_and(|(n, _)| n == name)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }

    fn ready(&self) -> bool {
        http_get(&self.dir.join("metrics.sock"), "/readyz").0 == 200
    }

    async fn stop(self) {
        self.stop.send(true).unwrap();
        self.task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_agents_report_a_bad_policy_once_and_hand_over() {
    if !require_root("three_agents_report_a_bad_policy_once_and_hand_over") {
        return;
    }
    let server = ApiServer::start_temp().await.unwrap();
    server.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})).unwrap();
    let mut agents: Vec<NodeAgent> = (1..=3).map(|i| NodeAgent::start(&server, i)).collect();
    eventually("three ready agents", Duration::from_secs(30), || agents.iter().all(NodeAgent::ready).then_some(())).await;

    // A bad policy: one Event, from the one agent holding the Lease.
    server.apply(broken("broken")).unwrap();
    let first = eventually("the Event", Duration::from_secs(10), || events_about(&server, "broken").pop()).await;
    let lead = holder(&server).expect("a holder");
    assert_eq!(first["reportingInstance"], lead.as_str());
    assert_eq!(first["reportingController"], "flock-agent");
    assert_eq!(first["type"], "Warning");
    assert_eq!(first["regarding"]["kind"], "NetworkPolicy");
    assert!(first["note"].as_str().unwrap().contains("spec.ingress[0].ports[0]"), "{first}");
    // Every agent counts the problem; one is the reporter.
    eventually("the metric on every agent", Duration::from_secs(10), || {
        agents.iter().all(|a| a.metric("flock_policy_problems_cluster") == Some(1.0)).then_some(())
    })
    .await;
    let reporters: Vec<&str> = agents.iter().filter(|a| a.metric("flock_policy_reporter") == Some(1.0)).map(|a| a.name.as_str()).collect();
    assert_eq!(reporters, [lead.as_str()]);

    // Repeats grow the series of that one Event (one patch per 1 s heartbeat), no storm.
    let counted = eventually("the series to reach 3", Duration::from_secs(10), || {
        let e = events_about(&server, "broken");
        (e.len() == 1 && series_count(&e[0]) >= 3).then(|| e[0].clone())
    })
    .await;
    assert!(counted["series"]["lastObservedTime"].is_string(), "{counted}");
    let (posts, patches) = (event_requests(&server, "POST"), event_requests(&server, "PATCH"));
    assert_eq!(posts, 1, "one Event created, not one per agent");
    assert!(patches as i64 >= series_count(&counted) - 1 && patches <= 20, "{patches} patches");
    assert_eq!(event_requests(&server, "GET"), 1, "only the first holder's read, before creating");

    // The holder stops: another agent takes the Lease and continues the same series without
    // creating anything (one read to find it).
    let i = agents.iter().position(|a| a.name == lead).unwrap();
    let before = series_count(&events_about(&server, "broken")[0]);
    agents.remove(i).stop().await;
    let next = eventually("a new holder", Duration::from_secs(10), || holder(&server).filter(|h| *h != lead)).await;
    assert!(agents.iter().any(|a| a.name == next));
    eventually("the series continued", Duration::from_secs(10), || {
        let e = events_about(&server, "broken");
        (e.len() == 1 && series_count(&e[0]) > before).then_some(())
    })
    .await;
    assert_eq!(event_requests(&server, "POST"), 1, "the new holder re-published");
    assert_eq!(event_requests(&server, "GET"), 2);
    // A new problem is reported by the new holder.
    server.apply(broken("broken-too")).unwrap();
    let second = eventually("the second Event", Duration::from_secs(10), || events_about(&server, "broken-too").pop()).await;
    assert_eq!(second["reportingInstance"], next.as_str());

    // Fixed policies are no longer reported.
    server.apply(fixed("broken")).unwrap();
    server.apply(fixed("broken-too")).unwrap();
    eventually("no problem counted", Duration::from_secs(10), || {
        agents.iter().all(|a| a.metric("flock_policy_problems_cluster") == Some(0.0)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await; // the reporter's recompute interval, and then some
    let writes = event_requests(&server, "POST") + event_requests(&server, "PATCH");
    tokio::time::sleep(Duration::from_secs(3)).await; // three heartbeats
    assert_eq!(event_requests(&server, "POST") + event_requests(&server, "PATCH"), writes, "fixed policies still reported");
    assert_eq!(events_about(&server, "broken").len(), 1);

    for a in agents {
        a.stop().await;
    }
    // The last holder released the Lease on its way out.
    assert_eq!(holder(&server), None);
    server.shutdown().await;
}

/// What reports, without the node agent: the informers and the reporter, as one task to
/// abort (a crash: no release).
fn reporter(
    server: &ApiServer,
    name: &'static str,
    opts: ReportOptions,
) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>, Arc<Metrics>) {
    let client = server.client();
    let metrics = Arc::new(Metrics::new());
    let (stop, rx) = watch::channel(false);
    let r = Reporter::new(client.clone(), opts, name, true).unwrap();
    let (writer, source) = SourceWriter::new(Snapshot::new(), false);
    let health = Arc::new(ApiHealth::new(Duration::from_secs(5), Duration::from_secs(60)));
    let m = metrics.clone();
    let task = tokio::spawn(async move {
        let informers = flock::source::kube::run_with(SourceOptions::for_node(name), client, writer, health, m.clone(), rx.clone());
        let (informers, ()) = tokio::join!(informers, r.run(source, m, rx));
        informers.unwrap();
    });
    (stop, task, metrics)
}

async fn start_server() -> ApiServer {
    if let Ok(filter) = std::env::var("FLOCK_TEST_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
    }
    let server = ApiServer::start_temp().await.unwrap();
    server.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})).unwrap();
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_reporter_is_replaced_once_its_lease_expires() {
    let server = start_server().await;
    server.apply(broken("broken")).unwrap();
    let names = ["agent-a", "agent-b", "agent-c"];
    let mut running: Vec<_> = names.iter().map(|n| (*n, reporter(&server, n, fast_report()))).collect();
    let first = eventually("the Event", Duration::from_secs(10), || events_about(&server, "broken").pop()).await;
    let lead = holder(&server).unwrap();
    assert_eq!(first["reportingInstance"], lead.as_str());

    // The holder crashes: nothing releases the Lease; after its duration another agent
    // takes it, continues the series and reports what is new.
    let i = running.iter().position(|(n, _)| *n == lead).unwrap();
    let (_, (_stop, task, _)) = running.remove(i);
    task.abort();
    let crashed_at = Instant::now();
    let next = eventually("a new holder", Duration::from_secs(15), || holder(&server).filter(|h| *h != lead)).await;
    // Not before the lease duration after its last renewal (at most a renew period before
    // the crash).
    let o = fast_report();
    let earliest = o.lease.lease_duration - o.lease.renew_period;
    assert!(crashed_at.elapsed() >= earliest, "taken over {:?} after the crash", crashed_at.elapsed());
    server.apply(broken("broken-too")).unwrap();
    let second = eventually("the second Event", Duration::from_secs(10), || events_about(&server, "broken-too").pop()).await;
    assert_eq!(second["reportingInstance"], next.as_str());
    assert_eq!(events_about(&server, "broken").len(), 1);
    assert_eq!(event_requests(&server, "POST"), 2, "one create per problem");
    for (_, (stop, task, _)) in running {
        stop.send(true).unwrap();
        task.await.unwrap();
    }
    server.shutdown().await;
}

/// Whether any request about Events was made after `since`.
fn event_requests_since(server: &ApiServer, since: std::time::SystemTime) -> Vec<RequestRecord> {
    server.requests().into_iter().filter(|r| r.at >= since && r.path.contains("/apis/events.k8s.io/")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_loses_the_lease_stops_publishing() {
    let server = start_server().await;
    let names = ["agent-a", "agent-b"];
    let running: Vec<_> = names.iter().map(|n| reporter(&server, n, fast_report())).collect();
    let reporting = |m: &Metrics| m.encode().contains("flock_policy_reporter 1");
    eventually("a reporter", Duration::from_secs(10), || running.iter().any(|(_, _, m)| reporting(m)).then_some(())).await;

    // Renewals fail (the API server refuses Lease requests): by the renew deadline the
    // holder has stopped, and nobody publishes while the Lease cannot be taken.
    server.fail_requests(FailRule::new(usize::MAX, 500).path_contains("/leases/"));
    eventually("no reporter", Duration::from_secs(10), || running.iter().all(|(_, _, m)| !reporting(m)).then_some(())).await;
    let since = std::time::SystemTime::now();
    server.apply(broken("broken")).unwrap();
    eventually("every agent counting the problem", Duration::from_secs(10), || {
        running.iter().all(|(_, _, m)| m.encode().contains("flock_policy_problems_cluster 1")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(event_requests_since(&server, since).is_empty(), "{:#?}", event_requests_since(&server, since));

    // Another agent holds the Lease (for an hour; written before the API server answers
    // again, so none of ours can take the expired one first): still nobody publishes.
    server
        .apply(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": LEASE, "namespace": "flock-system"},
                      "spec": {"holderIdentity": "agent-elsewhere", "leaseDurationSeconds": 3600,
                               "renewTime": "2030-01-01T00:00:00.000000Z"}}))
        .unwrap();
    server.clear_failures();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(event_requests_since(&server, since).is_empty(), "{:#?}", event_requests_since(&server, since));
    assert_eq!(holder(&server).as_deref(), Some("agent-elsewhere"));

    // It releases the Lease: one of ours takes it and reports.
    server
        .apply(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": LEASE, "namespace": "flock-system"},
                      "spec": {"leaseDurationSeconds": 1}}))
        .unwrap();
    eventually("the Event", Duration::from_secs(10), || events_about(&server, "broken").pop()).await;
    assert!(names.contains(&holder(&server).unwrap().as_str()));
    for (stop, task, _) in running {
        stop.send(true).unwrap();
        task.await.unwrap();
    }
    server.shutdown().await;
}

/// Verbs a request needs: (namespace, "group/resource:verb", name).
fn needed(r: &RequestRecord) -> Option<(String, String, String)> {
    let parts: Vec<&str> = r.path.trim_start_matches('/').split('/').collect();
    // apis/{group}/{version}/namespaces/{ns}/{resource}[/{name}]
    let ["apis", group, _, "namespaces", ns, resource, rest @ ..] = parts.as_slice() else { return None };
    if !["events", "leases"].contains(resource) {
        return None;
    }
    let verb = match (r.method.as_str(), rest.is_empty()) {
        ("GET", false) => "get",
        ("POST", true) => "create",
        ("PUT", false) => "update",
        ("PATCH", false) => "patch",
        (m, _) => panic!("unexpected {m} {}", r.path),
    };
    Some((ns.to_string(), format!("{group}/{resource}:{verb}"), rest.first().map(ToString::to_string).unwrap_or_default()))
}

/// Every request the reporter makes — the Lease created, renewed, released and taken over;
/// Events read, created and patched — is granted by deploy/agent/rbac.yaml, and every Lease
/// and Event grant there is used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_grants_exactly_the_requests_the_reporter_makes() {
    let server = start_server().await;
    server.apply(broken("broken")).unwrap();
    let (stop, task, _) = reporter(&server, "agent-a", fast_report());
    eventually("a patched series", Duration::from_secs(10), || {
        events_about(&server, "broken").first().is_some_and(|e| series_count(e) >= 2).then_some(())
    })
    .await;
    stop.send(true).unwrap();
    task.await.unwrap();
    // The next holder finds the Lease there and the Event too.
    let (stop, task, _) = reporter(&server, "agent-b", fast_report());
    eventually("agent-b holding", Duration::from_secs(10), || (holder(&server).as_deref() == Some("agent-b")).then_some(())).await;
    eventually("the Event read", Duration::from_secs(10), || (event_requests(&server, "GET") >= 2).then_some(())).await;
    stop.send(true).unwrap();
    task.await.unwrap();

    let granted = common::grants("deploy/agent/rbac.yaml", &["ClusterRole", "Role"]);
    let mut used = std::collections::BTreeSet::new();
    let mut refused = Vec::new();
    for r in server.requests() {
        let Some((ns, what, name)) = needed(&r) else { continue };
        let candidates = [format!("{ns} {what}/{name}"), format!("{ns} {what}"), format!("cluster {what}")];
        match candidates.iter().find(|c| granted.contains(c)) {
            Some(c) => {
                used.insert(c.clone());
            }
            None => refused.push(format!("{} {} ({candidates:?})", r.method, r.path)),
        }
    }
    assert!(refused.is_empty(), "not granted:\n{}", refused.join("\n"));
    let unused: Vec<&String> =
        granted.iter().filter(|g| (g.contains("/events:") || g.contains("/leases:")) && !used.contains(*g)).collect();
    assert!(unused.is_empty(), "granted but never used: {unused:?}");
    server.shutdown().await;
}

#[path = "common/cnp.rs"]
mod cnp;

/// flock's condition (`flock.dev/Enforced`) in a ClusterNetworkPolicy's status.
fn flock_condition(server: &ApiServer, name: &str) -> Option<Value> {
    let obj = server.get(cnp::API_VERSION, cnp::KIND, None, name).unwrap()?;
    obj["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "flock.dev/Enforced").cloned()
}

/// Requests about ClusterNetworkPolicies with this method (GET, PATCH), other than the watch's.
fn cnp_requests(server: &ApiServer, method: &str) -> usize {
    server.requests().iter().filter(|r| r.method.as_str() == method && !r.watch && r.path.contains("/clusternetworkpolicies/")).count()
}

/// A ClusterNetworkPolicy flock cannot enforce as written gets a Warning Event (in `default`,
/// regarding the cluster-scoped object) and flock's status condition, False with the field;
/// one it can gets True; other implementations' conditions stay; only changes are written,
/// and a new holder writes nothing that is already there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_policies_get_events_and_a_status_condition_written_only_on_change() {
    let server = start_server().await;
    server.apply(cnp::crd()).unwrap();
    server.apply(cnp::cnp("bad", 10, "a", cnp::from_everyone("Allow"))).unwrap();
    let mut good = cnp::cnp("good", 20, "a", cnp::from_everyone("Deny"));
    good["status"] = json!({"conditions": [{"type": "other.dev/Accepted", "status": "True", "reason": "Programmed", "message": "",
                                            "lastTransitionTime": "2024-01-01T00:00:00Z"}]});
    server.apply(good).unwrap();
    let (stop, task, metrics) = reporter(&server, "agent-a", fast_report());

    let bad = eventually("the condition on bad", Duration::from_secs(10), || flock_condition(&server, "bad")).await;
    assert_eq!((bad["status"].as_str(), bad["reason"].as_str()), (Some("False"), Some("NotEnforceableAsWritten")), "{bad}");
    assert!(bad["message"].as_str().unwrap().contains("spec.ingress[0].action"), "{bad}");
    assert_eq!(bad["observedGeneration"], 1);
    assert!(bad["lastTransitionTime"].is_string());
    let ok = eventually("the condition on good", Duration::from_secs(10), || flock_condition(&server, "good")).await;
    assert_eq!((ok["status"].as_str(), ok["reason"].as_str()), (Some("True"), Some("EnforcedAsWritten")), "{ok}");
    // Another implementation's condition is left alone; flock's is flock's (server-side apply).
    let obj = server.get(cnp::API_VERSION, cnp::KIND, None, "good").unwrap().unwrap();
    assert!(obj["status"]["conditions"].as_array().unwrap().iter().any(|c| c["type"] == "other.dev/Accepted"), "{obj}");
    let managers: Vec<&str> = obj["metadata"]["managedFields"].as_array().unwrap().iter().filter_map(|m| m["manager"].as_str()).collect();
    assert_eq!(managers, ["flock"]);

    // The Event: in default, about the ClusterNetworkPolicy.
    let ev = eventually("the Event", Duration::from_secs(10), || events_about(&server, "bad").pop()).await;
    assert_eq!(ev["regarding"]["kind"], "ClusterNetworkPolicy");
    assert_eq!(ev["regarding"]["apiVersion"], cnp::API_VERSION);
    assert!(ev["regarding"]["namespace"].is_null(), "{ev}");
    assert!(ev["note"].as_str().unwrap().contains("spec.ingress[0].action"), "{ev}");
    eventually("the metric", Duration::from_secs(10), || {
        let text = metrics.encode();
        (text.contains("flock_cluster_policies_enforced{enforced=\"true\"} 1")
            && text.contains("flock_cluster_policies_enforced{enforced=\"false\"} 1"))
        .then_some(())
    })
    .await;

    // Only changes are written: a new policy gets its condition, the others nothing more,
    // however many recomputes and heartbeats pass (the transition time below relies on the
    // two seconds too: it has a resolution of one).
    assert_eq!(cnp_requests(&server, "PATCH"), 2);
    server.apply(cnp::cnp("pass-z", 30, "z", cnp::from_everyone("Pass"))).unwrap();
    eventually("the third condition", Duration::from_secs(10), || flock_condition(&server, "pass-z")).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(cnp_requests(&server, "PATCH"), 3, "conditions rewritten without a change");

    // Fixed: True, for the new generation, with a new transition time.
    server.apply(cnp::cnp("bad", 10, "a", cnp::from_everyone("Deny"))).unwrap();
    let fixed = eventually("the condition True", Duration::from_secs(10), || {
        flock_condition(&server, "bad").filter(|c| c["status"] == "True" && c["observedGeneration"] == 2)
    })
    .await;
    assert_eq!(fixed["reason"], "EnforcedAsWritten");
    assert_ne!(fixed["lastTransitionTime"], bad["lastTransitionTime"]);
    stop.send(true).unwrap();
    task.await.unwrap();

    // A new holder reads each policy once and writes nothing: it is all there already.
    let (patches, gets) = (cnp_requests(&server, "PATCH"), cnp_requests(&server, "GET"));
    let (stop, task, _) = reporter(&server, "agent-b", fast_report());
    eventually("agent-b holding", Duration::from_secs(10), || (holder(&server).as_deref() == Some("agent-b")).then_some(())).await;
    eventually("agent-b's reads", Duration::from_secs(10), || (cnp_requests(&server, "GET") >= gets + 3).then_some(())).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(cnp_requests(&server, "PATCH"), patches, "the new holder rewrote conditions that were up to date");
    stop.send(true).unwrap();
    task.await.unwrap();

    // Every such request is granted to the agent.
    let granted = common::grants("deploy/agent/rbac.yaml", &["ClusterRole", "Role"]);
    for g in [
        "cluster policy.networking.k8s.io/clusternetworkpolicies:get",
        "cluster policy.networking.k8s.io/clusternetworkpolicies/status:patch",
    ] {
        assert!(granted.contains(&g.to_string()), "{g} not granted");
    }
    for r in server.requests().iter().filter(|r| r.method.as_str() == "PATCH" && r.path.contains("/clusternetworkpolicies/")) {
        assert!(r.path.ends_with("/status"), "{} {}", r.method, r.path);
    }
    server.shutdown().await;
}
