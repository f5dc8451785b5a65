//! FlockNode: a whole flock-agent (`daemon::run`, real nft in a node namespace: root) against
//! the in-repo test API server keeps its node's FlockNode current — created once the Node
//! exists, owned by it; the status after a commit (version, API state, ruleset hash and size,
//! the NetworkPolicies of the node's run pods with their generations, a failed sync's error);
//! written only on change and never twice within the interval; created again when deleted;
//! an existing one without its Node as owner (or with a stale Node uid) adopted; every request
//! granted by deploy/agent/rbac.yaml. And the opt-in admission policy that
//! restricts each agent to its own node's FlockNode, read for what can be checked without a
//! CEL evaluator.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/controller.rs"]
mod common;
use common::{eventually, http_get};

use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime};

use flock::agent::AgentConfig;
use flock::crd::AgentPod;
use flock::daemon::{self, DaemonOptions};
use flock::report::node::NodeStatusOptions;
use flock::testkit::kernel::{Node, Pod, TempDir, require_root};
use flock_cni::protocol::{self, AddRequest, PodIdentity, Request};
use flock_test_apiserver::ApiServer;
use serde_json::{Value, json};
use tokio::sync::watch;

const NODE: &str = "fn1";
const NS: &str = "runs";
const API: &str = "flock.dev/v1alpha1";
/// The test's write interval (the default is 10 s).
const INTERVAL: Duration = Duration::from_secs(1);

fn node_json() -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE},
           "spec": {"podCIDR": "198.18.84.0/24", "podCIDRs": ["198.18.84.0/24"]},
           "status": {"addresses": [{"type": "InternalIP", "address": "198.18.0.84"}]}})
}

fn pod_json(name: &str, node: &str, ip: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": NS, "labels": labels},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
           "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})
}

/// An egress policy for the pods `selector` selects: TCP `port` anywhere.
fn policy(name: &str, selector: Value, port: u16) -> Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name, "namespace": NS},
           "spec": {"podSelector": {"matchLabels": selector}, "policyTypes": ["Egress"],
                    "egress": [{"ports": [{"port": port, "protocol": "TCP"}]}]}})
}

fn r1_egress(port: u16) -> Value {
    policy("r1-egress", json!({"flock.dev/run": "r1"}), port)
}

fn flocknode(server: &ApiServer) -> Option<Value> {
    server.get(API, "FlockNode", None, NODE).unwrap()
}

/// `runPolicies` as (name, generation).
fn run_policies(fnode: &Value) -> Vec<(String, i64)> {
    fnode["status"]["runPolicies"]
        .as_array()
        .map(|a| a.iter().map(|p| (p["name"].as_str().unwrap().to_string(), p["generation"].as_i64().unwrap())).collect())
        .unwrap_or_default()
}

/// When each status write arrived.
fn status_writes(server: &ApiServer) -> Vec<SystemTime> {
    let path = format!("/apis/flock.dev/v1alpha1/flocknodes/{NODE}/status");
    server.requests().into_iter().filter(|r| r.method.as_str() == "PATCH" && r.path == path).map(|r| r.at).collect()
}

fn metric(dir: &TempDir, name: &str) -> Option<f64> {
    let (code, body) = http_get(&dir.join("metrics.sock"), "/metrics");
    if code != 200 {
        return None;
    }
    body.lines().find(|l| l.split_once(' ').is_some_and(|(n, _)| n == name)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// An `nft` that fails every transaction while `fail` exists (the agent's start check, `-c`,
/// goes through).
fn failing_nft(dir: &TempDir) -> (std::path::PathBuf, std::path::PathBuf) {
    let (script, fail) = (dir.join("nft"), dir.join("fail"));
    let text = format!(
        "#!/bin/sh\ncase \" $* \" in *' -f '*) case \" $* \" in *' -c '*) ;; *) [ -e {fail} ] && {{ echo injected failure >&2; exit 1; }};; esac;; esac\nexec nft \"$@\"\n",
        fail = fail.display()
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (script, fail)
}

/// Registers `name`'s endpoint over the CNI socket, as flock-cni would after wiring it.
async fn cni_add(node: &Node, dir: &TempDir, name: &str, ip: &str) -> Pod {
    let cid = format!("cid-{name}");
    let iface = flock_cni::host_interface_name(&cid, "eth0");
    let addr: IpAddr = ip.parse().unwrap();
    let pod = node.add_pod(name, &iface, &[addr]);
    let req = Request::Add(AddRequest {
        container_id: cid,
        ifname: "eth0".into(),
        netns: String::new(),
        host_interface: iface,
        pod: PodIdentity { namespace: NS.into(), name: name.into(), uid: None },
        ips: vec![addr],
    });
    let socket = dir.join("cni.sock");
    tokio::task::spawn_blocking(move || protocol::call(&socket, req, Duration::from_secs(20))).await.unwrap().unwrap();
    pod
}

/// The daemon of `agent`, its endpoints under `dir`, writing its FlockNode every [`INTERVAL`].
fn daemon_options(agent: AgentConfig, dir: &TempDir) -> DaemonOptions {
    DaemonOptions {
        node_status: Some(NodeStatusOptions {
            agent_pod: Some(AgentPod { name: "flock-system/flock-agent-x1".into(), uid: "uid-agent".into() }),
            interval: INTERVAL,
            retry: Duration::from_millis(200),
            max_retry: Duration::from_secs(1),
        }),
        ..common::daemon_options(agent, &dir.path)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_keeps_its_flocknode_current() {
    if !require_root("the_agent_keeps_its_flocknode_current") {
        return;
    }
    if let Ok(filter) = std::env::var("FLOCK_TEST_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
    }
    let node = Node::new("fnode");
    let dir = TempDir::new("fnode");
    let server = common::api_server().await;
    server.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})).unwrap();
    // A run pod here (its policy is reported), a pod here that is not a run's and a run pod on
    // another node (their policies are not).
    server.apply(pod_json("job", NODE, "198.18.84.10", json!({"flock.dev/run": "r1"}))).unwrap();
    server.apply(pod_json("plain", NODE, "198.18.84.11", json!({"app": "plain"}))).unwrap();
    server.apply(pod_json("far", "fn2", "198.18.85.10", json!({"flock.dev/run": "r2"}))).unwrap();
    server.apply(r1_egress(443)).unwrap();
    server.apply(policy("plain-only", json!({"app": "plain"}), 80)).unwrap();
    server.apply(policy("r2-egress", json!({"flock.dev/run": "r2"}), 443)).unwrap();

    let (nft, fail) = failing_nft(&dir);
    let mut agent = AgentConfig::new(NODE, node.ns.netns(), dir.join("cni.sock"), dir.join("pending-del"));
    agent.state_dir = Some(dir.join("state"));
    agent.routes = false;
    agent.nft = nft;
    // Through the failing nft (netlink batches would not fail).
    agent.nft_transactions = true;
    let opts = daemon_options(agent, &dir);
    let (stop, rx) = watch::channel(false);
    let (client, informers) = (server.client(), server.client_builder());
    let task = tokio::spawn(async move { daemon::run(opts, client, informers, rx).await.unwrap() });
    eventually(30, "the agent ready", || (http_get(&dir.join("metrics.sock"), "/readyz").0 == 200).then_some(())).await;
    let _job = cni_add(&node, &dir, "job", "198.18.84.10").await;

    // No Node yet: nothing is created (an owner-less FlockNode would outlive its node), the
    // attempts fail and are retried.
    eventually(10, "a failed attempt", || metric(&dir, "flock_node_status_writes_total{result=\"failed\"}").filter(|n| *n >= 2.0)).await;
    assert!(flocknode(&server).is_none());
    assert!(!server.requests().iter().any(|r| r.method.as_str() == "POST" && r.path.contains("/flocknodes")));

    // The Node appears: the FlockNode is created, owned by it, with the status of the commit.
    let node_obj = server.apply(node_json()).unwrap();
    let fnode =
        eventually(10, "the FlockNode with its status", || flocknode(&server).filter(|f| f["status"]["ruleset"]["localEndpoints"] == 1))
            .await;
    let owners = fnode["metadata"]["ownerReferences"].as_array().unwrap();
    assert_eq!(owners.len(), 1, "{fnode}");
    assert_eq!(owners[0]["apiVersion"], "v1");
    assert_eq!(owners[0]["kind"], "Node");
    assert_eq!(owners[0]["name"], NODE);
    assert_eq!(owners[0]["uid"], node_obj["metadata"]["uid"]);
    assert!(owners[0]["uid"].as_str().is_some_and(|u| !u.is_empty()));
    let status = &fnode["status"];
    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"));
    // Who wrote it: flockctl status compares it with the agent pod running there.
    assert_eq!(status["agentPod"], json!({"name": "flock-system/flock-agent-x1", "uid": "uid-agent"}));
    assert_eq!(status["api"], "Connected");
    let hash = status["ruleset"]["hash"].as_str().unwrap().to_string();
    assert!(hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{hash}");
    assert!(status["ruleset"]["rules"].as_i64().unwrap() > 10, "{status}");
    assert!(status["ruleset"]["setElements"].as_i64().unwrap() >= 1, "{status}");
    assert!(status["lastError"].is_null(), "{status}");
    assert_eq!(run_policies(&fnode), [("runs/r1-egress".to_string(), 1)]);
    assert_eq!(metric(&dir, "flock_node_status_writes_total{result=\"ok\"}"), Some(1.0));
    assert!(metric(&dir, "flock_node_status_last_write_timestamp_seconds").is_some_and(|t| t > 1.6e9));

    // The run's policy changes (generation 2): the status follows, with another ruleset.
    server.apply(r1_egress(8443)).unwrap();
    let fnode =
        eventually(10, "generation 2", || flocknode(&server).filter(|f| run_policies(f) == [("runs/r1-egress".to_string(), 2)])).await;
    assert_ne!(fnode["status"]["ruleset"]["hash"].as_str().unwrap(), hash);

    // A label-only edit keeps the generation: nothing is written.
    let writes = status_writes(&server).len();
    let mut labelled = r1_egress(8443);
    labelled["metadata"]["labels"] = json!({"team": "a"});
    let stored = server.apply(labelled).unwrap();
    assert_eq!(stored["metadata"]["generation"], 2);
    tokio::time::sleep(INTERVAL * 5 / 2).await;
    assert_eq!(status_writes(&server).len(), writes, "a status without a change was written");

    // A burst of changes: the last one is shown, with writes at least the interval apart.
    for port in 9001..=9005 {
        server.apply(r1_egress(port)).unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    eventually(10, "generation 7", || flocknode(&server).filter(|f| run_policies(f) == [("runs/r1-egress".to_string(), 7)])).await;

    // A failed sync shows its error; the last commit's policies stay. Fixed, it clears.
    std::fs::write(&fail, b"").unwrap();
    server.apply(r1_egress(9100)).unwrap();
    let fnode = eventually(10, "the error", || {
        flocknode(&server).filter(|f| f["status"]["lastError"].as_str().is_some_and(|e| e.contains("injected failure")))
    })
    .await;
    assert_eq!(run_policies(&fnode), [("runs/r1-egress".to_string(), 7)]);
    std::fs::remove_file(&fail).unwrap();
    eventually(15, "the error cleared and generation 8", || {
        flocknode(&server).filter(|f| f["status"]["lastError"].is_null() && run_policies(f) == [("runs/r1-egress".to_string(), 8)])
    })
    .await;

    // Deleted by someone: created again (owned by the Node) with the current status.
    server.delete(API, "FlockNode", None, NODE).unwrap().unwrap();
    server.apply(r1_egress(9200)).unwrap();
    let fnode =
        eventually(10, "the FlockNode again", || flocknode(&server).filter(|f| run_policies(f) == [("runs/r1-egress".to_string(), 9)]))
            .await;
    assert_eq!(fnode["metadata"]["ownerReferences"][0]["uid"], node_obj["metadata"]["uid"]);

    stop.send(true).unwrap();
    task.await.unwrap();

    // Never two status writes within the interval.
    let writes = status_writes(&server);
    assert!(writes.len() >= 6, "{} writes", writes.len());
    for pair in writes.windows(2) {
        let gap = pair[1].duration_since(pair[0]).unwrap();
        assert!(gap >= INTERVAL, "two status writes {gap:?} apart");
    }

    // Every request about FlockNodes, and the Node read, is granted to the agent; every
    // FlockNode grant is used (patch, the owner fix-up, by
    // an_existing_flocknode_gets_its_node_as_owner: this one never needs it).
    let used = flocknode_grants_used(&server);
    assert!(!used.contains("cluster flock.dev/flocknodes:patch"));
    for g in common::grants("deploy/agent/rbac.yaml", &["ClusterRole", "Role"]).iter().filter(|g| g.contains("flocknodes")) {
        assert!(used.contains(g.as_str()) || g.ends_with("flocknodes:patch"), "{g} granted but never used");
    }
    server.shutdown().await;
}

/// The grants of deploy/agent/rbac.yaml used by the requests about this node's FlockNode
/// and its Node read; each is asserted granted, and any other request on FlockNodes fails.
fn flocknode_grants_used(server: &ApiServer) -> std::collections::BTreeSet<&'static str> {
    let granted = common::grants("deploy/agent/rbac.yaml", &["ClusterRole", "Role"]);
    let mut used = std::collections::BTreeSet::new();
    for r in server.requests().iter().filter(|r| !r.watch) {
        let grant = match (r.method.as_str(), r.path.as_str()) {
            ("GET", p) if p == format!("/api/v1/nodes/{NODE}") => "cluster /nodes:get",
            ("GET", p) if p == format!("/apis/flock.dev/v1alpha1/flocknodes/{NODE}") => "cluster flock.dev/flocknodes:get",
            ("POST", "/apis/flock.dev/v1alpha1/flocknodes") => "cluster flock.dev/flocknodes:create",
            ("PATCH", p) if p == format!("/apis/flock.dev/v1alpha1/flocknodes/{NODE}") => "cluster flock.dev/flocknodes:patch",
            ("PATCH", p) if p == format!("/apis/flock.dev/v1alpha1/flocknodes/{NODE}/status") => {
                "cluster flock.dev/flocknodes/status:patch"
            }
            (m, p) if p.contains("/flocknodes") => panic!("unexpected request {m} {p}"),
            _ => continue,
        };
        assert!(granted.contains(&grant.to_string()), "{grant} not granted");
        used.insert(grant);
    }
    used
}

/// The status writer alone (no daemon, no root) for `NODE`, with one committed sync to
/// report: its stop, the sync channel's sender (the writer stops when it goes) and its task.
fn start_status_writer(server: &ApiServer) -> (watch::Sender<bool>, watch::Sender<flock::agent::SyncStatus>, tokio::task::JoinHandle<()>) {
    use flock::agent::{RulesetDigest, SyncStatus};
    use flock::report::node::NodeStatusWriter;
    use std::sync::Arc;
    let digest = RulesetDigest {
        generation: 1,
        sha256: "ab".repeat(32),
        stats: flock::render::Stats { chains: 3, rules: 12, sets: 2, elements: 7 },
        endpoints: 1,
    };
    let sync = SyncStatus { ready: true, committed: 1, last_applied: 1, ruleset_digest: Some(digest), ..SyncStatus::default() };
    let (sync_tx, sync_rx) = watch::channel(sync);
    let (stop, stop_rx) = watch::channel(false);
    let opts =
        NodeStatusOptions { agent_pod: None, interval: INTERVAL, retry: Duration::from_millis(200), max_retry: Duration::from_secs(1) };
    let writer = NodeStatusWriter::new(server.client(), NODE, opts, Arc::new(flock::agent::metrics::Metrics::new()));
    let health = Arc::new(flock::source::kube::ApiHealth::new(Duration::from_secs(5), Duration::from_secs(60)));
    (stop, sync_tx, tokio::spawn(writer.run(sync_rx, health, stop_rx)))
}

/// A FlockNode that exists without its Node as owner (made by hand, or by an agent before the
/// fix-up) is adopted before its status is written: no Node, no writes; once the Node exists
/// the agent sets the ownerReference (a merge patch of the object), then the status. One with
/// a stale Node uid (the Node created again) gets the current uid; other owners stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_flocknode_gets_its_node_as_owner() {
    let server = common::api_server().await;
    server.apply(json!({"apiVersion": API, "kind": "FlockNode", "metadata": {"name": NODE}, "spec": {}})).unwrap();
    let (stop, sync, task) = start_status_writer(&server);

    // No Node: neither the owner nor the status is written (retried every 200 ms).
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!server.requests().iter().any(|r| r.method.as_str() == "PATCH"), "a write without a Node");
    assert!(flocknode(&server).unwrap()["metadata"]["ownerReferences"].is_null());

    // The Node appears: owned by it, then the status.
    let uid = server.apply(node_json()).unwrap()["metadata"]["uid"].as_str().unwrap().to_string();
    let fnode = eventually(10, "the status", || flocknode(&server).filter(|f| f["status"]["ruleset"]["rules"] == 12)).await;
    assert_eq!(fnode["metadata"]["ownerReferences"], json!([{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": uid}]));
    let patches: Vec<String> = server.requests().into_iter().filter(|r| r.method.as_str() == "PATCH").map(|r| r.path).collect();
    assert_eq!(
        patches,
        [format!("/apis/flock.dev/v1alpha1/flocknodes/{NODE}"), format!("/apis/flock.dev/v1alpha1/flocknodes/{NODE}/status")],
        "the owner first, then the status"
    );
    stop.send(true).unwrap();
    task.await.unwrap();
    drop(sync);

    // A stale Node uid beside another owner, found by a restarted agent: the Node reference
    // is replaced, the other owner kept, and the status (already current) left alone.
    let fleet = json!({"apiVersion": "example.dev/v1", "kind": "Fleet", "name": "f", "uid": "fleet-uid"});
    let mut stale = flocknode(&server).unwrap();
    stale["metadata"]["ownerReferences"] = json!([fleet, {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "stale-uid"}]);
    server.apply(stale).unwrap();
    let writes = status_writes(&server).len();
    let (stop, sync, task) = start_status_writer(&server);
    let fnode = eventually(10, "the current uid", || {
        flocknode(&server).filter(|f| f["metadata"]["ownerReferences"].as_array().is_some_and(|o| o.iter().any(|o| o["uid"] == uid)))
    })
    .await;
    assert_eq!(fnode["metadata"]["ownerReferences"], json!([fleet, {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": uid}]));
    tokio::time::sleep(INTERVAL).await;
    assert_eq!(status_writes(&server).len(), writes, "the status was current");
    stop.send(true).unwrap();
    task.await.unwrap();
    drop(sync);

    let used = flocknode_grants_used(&server);
    assert!(used.contains("cluster flock.dev/flocknodes:patch"), "{used:?}");
    server.shutdown().await;
}

/// The admission example: what can be checked without evaluating its CEL. Its expressions'
/// meaning (the agent's own node only, no node in the credentials denied) is not checked here.
#[test]
fn the_admission_example_binds_a_deny_policy_on_flocknodes_for_the_agent() {
    let path = common::root().join("deploy/agent/flocknode-admission.yaml");
    let docs = common::yaml_docs(&path);
    assert_eq!(docs.len(), 2);
    let policy = docs.iter().find(|d| d["kind"] == "ValidatingAdmissionPolicy").expect("the policy");
    let binding = docs.iter().find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding").expect("the binding");
    for d in [policy, binding] {
        assert_eq!(d["apiVersion"], "admissionregistration.k8s.io/v1");
    }
    let spec = &policy["spec"];
    assert_eq!(spec["failurePolicy"], "Fail");
    // Creates and updates (a status patch is an update of the subresource) of FlockNodes.
    let rules = spec["matchConstraints"]["resourceRules"].as_array().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0]["apiGroups"], json!(["flock.dev"]));
    assert_eq!(rules[0]["operations"], json!(["CREATE", "UPDATE"]));
    assert_eq!(rules[0]["resources"], json!(["flocknodes", "flocknodes/status"]));
    // Only the agent's ServiceAccount, the one rbac.yaml binds.
    let sa = common::yaml_docs(&common::root().join("deploy/agent/rbac.yaml")).into_iter().find(|d| d["kind"] == "ServiceAccount").unwrap();
    let username =
        format!("system:serviceaccount:{}:{}", sa["metadata"]["namespace"].as_str().unwrap(), sa["metadata"]["name"].as_str().unwrap());
    let conditions = spec["matchConditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0]["expression"], format!("request.userInfo.username == '{username}'"));
    // The node comes from the credentials, and is compared with the object's name.
    let all_cel: String = spec["variables"]
        .as_array()
        .unwrap()
        .iter()
        .chain(spec["validations"].as_array().unwrap())
        .map(|v| v["expression"].as_str().unwrap().to_string())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(all_cel.contains("request.userInfo.extra['authentication.kubernetes.io/node-name']"), "{all_cel}");
    assert!(all_cel.contains("object.metadata.name == variables.nodeName"), "{all_cel}");
    assert!(!all_cel.contains("request.object") && !all_cel.contains("oldObject"), "{all_cel}");
    assert_eq!(spec["validations"].as_array().unwrap().len(), 1);
    assert_eq!(spec["validations"][0]["reason"], "Forbidden");
    // The binding enforces it (Deny, not only Warn or Audit), everywhere.
    assert_eq!(binding["spec"]["policyName"], policy["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert!(binding["spec"]["matchResources"].is_null());
    // Opt-in: not installed by the kustomization.
    let k = &common::yaml_docs(&common::root().join("deploy/agent/kustomization.yaml"))[0];
    assert!(!k["resources"].as_array().unwrap().iter().any(|r| r == "flocknode-admission.yaml"));
}

/// The whole loop: flock-controller applies a run's policy, the node's flock-agent enforces
/// it and reports the generation in its FlockNode, and the Run turns `Enforced` and `Ready`;
/// when the run expires (the controller's fake clock) the withdrawing policy is a new
/// generation, pending until the agent reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_enforced_condition_follows_its_nodes_agent() {
    use flock::controller::probe::EnforceMode;
    use flock::controller::render::{ClusterConfig, DnsConfig};
    use flock::controller::{self, Options};
    use flock::crd::{self, Run};
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    use std::sync::{Arc, Mutex};

    if !require_root("a_runs_enforced_condition_follows_its_nodes_agent") {
        return;
    }
    let node = Node::new("fnode2");
    let dir = TempDir::new("fnode2");
    let server = common::api_server().await;
    server.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})).unwrap();
    server.apply(node_json()).unwrap();
    server.apply(pod_json("job", NODE, "198.18.84.20", json!({"flock.dev/run": "r3"}))).unwrap();
    server.apply(json!({"apiVersion": API, "kind": "RunProfile", "metadata": {"name": "web"}, "spec": {"cidrs": [{"cidr": "198.19.0.0/16", "ports": [{"port": 443}]}]}})).unwrap();

    let mut agent = AgentConfig::new(NODE, node.ns.netns(), dir.join("cni.sock"), dir.join("pending-del"));
    agent.routes = false;
    let opts = daemon_options(agent, &dir);
    let (stop, rx) = watch::channel(false);
    let (client, informers) = (server.client(), server.client_builder());
    let agent_task = tokio::spawn(async move { daemon::run(opts, client, informers, rx.clone()).await.unwrap() });
    eventually(30, "the agent ready", || (http_get(&dir.join("metrics.sock"), "/readyz").0 == 200).then_some(())).await;
    let _job = cni_add(&node, &dir, "job", "198.18.84.20").await;

    let now = Arc::new(Mutex::new(Timestamp::now()));
    let clock = now.clone();
    let cluster = ClusterConfig {
        pod_cidrs: vec!["198.18.0.0/16".parse().unwrap()],
        service_cidrs: vec!["198.19.240.0/20".parse().unwrap()],
        dns: DnsConfig::default(),
        api_server: Default::default(),
    };
    let ctl_opts = Options {
        api_server_url: Some("https://198.19.240.1:443".into()),
        resync: Duration::from_millis(300),
        clock: Arc::new(move || *clock.lock().unwrap()),
        ..Options::new(EnforceMode::On, cluster)
    };
    let client = server.client();
    let startup = controller::start(&client, &ctl_opts).await.unwrap();
    assert_eq!(startup.verify, flock::controller::enforced::Verify::Flock);
    let (ctl_stop, ctl_rx) = watch::channel(false);
    let ctl_task = tokio::spawn(async move {
        controller::run(client, startup, &ctl_opts, Arc::new(flock::controller::metrics::Metrics::new()), ctl_rx).await
    });

    server
        .apply(json!({"apiVersion": API, "kind": "Run", "metadata": {"name": "r3", "namespace": NS}, "spec": {"profile": "web", "activeDeadlineSeconds": 600}}))
        .unwrap();
    let condition = |type_: &str| -> Option<(String, String)> {
        let run: Run = server.get_resource(Some(NS), "r3").unwrap()?;
        crd::condition(&run.status?.conditions, type_).map(|c| (c.status.clone(), c.reason.clone()))
    };
    let t0 = Instant::now();
    eventually(20, "Enforced by the node's agent", || (condition("Enforced")? == ("True".into(), "AllNodesEnforce".into())).then_some(()))
        .await;
    eprintln!("Run created → Enforced (real agent, status interval {INTERVAL:?}): {:.0} ms", t0.elapsed().as_secs_f64() * 1e3);
    assert_eq!(condition("Ready"), Some(("True".into(), "Applied".into())));
    assert!(run_policies(&flocknode(&server).unwrap()).contains(&("runs/r3-egress".to_string(), 1)));

    // Expired: generation 2 (allows nothing), enforced once the agent reports it.
    *now.lock().unwrap() += SignedDuration::from_secs(601);
    eventually(20, "expired", || (condition("Expired")?.0 == "True").then_some(())).await;
    eventually(20, "generation 2 reported", || {
        run_policies(&flocknode(&server)?).contains(&("runs/r3-egress".to_string(), 2)).then_some(())
    })
    .await;
    eventually(20, "generation 2 enforced", || {
        let run: Run = server.get_resource(Some(NS), "r3").unwrap()?;
        let st = run.status?;
        let enforced = crd::condition(&st.conditions, "Enforced")?;
        (enforced.status == "True" && st.network_policy?.generation == Some(2)).then_some(())
    })
    .await;
    assert_eq!(condition("Ready"), Some(("False".into(), "DeadlineExceeded".into())));

    ctl_stop.send(true).unwrap();
    ctl_task.await.unwrap();
    stop.send(true).unwrap();
    agent_task.await.unwrap();
    server.shutdown().await;
}
