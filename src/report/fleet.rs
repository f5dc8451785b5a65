//! `flockctl status`: what every node's flock-agent reports, judged — one row per Node from
//! its FlockNode, and for each sandboxed run whether every node hosting its pods enforces its
//! policy (the controller's own judgement, [`crate::controller::enforced::judge`], recomputed
//! here so the answer does not depend on the controller being up).
//!
//! A FlockNode carries no timestamps (it is written only when it changes), so whether it is
//! current is read from who keeps it so: the Node must be Ready (its kubelet reports) and a
//! Ready flock-agent pod must run there (readiness is the agent's `/readyz`, its liveness
//! probe restarts an agent whose syncs stall). Otherwise the row is marked stale: what it says
//! was true when last written, and nobody is updating it now. This costs the API nothing
//! extra: no heartbeat writes.
//!
//! [`read`] lists (Nodes, FlockNodes, the agent pods, Runs and run pods); [`judge`] is pure.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use crate::controller::{enforced, render};
use crate::crd::{AgentPod, FlockNode, FlockNodeStatus, Run};

/// Where the agents run: their namespace and pod label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agents {
    pub namespace: String,
    pub selector: String,
    /// Only the Nodes this label selector selects (those the agent's DaemonSet runs on);
    /// empty: every Node.
    pub nodes: String,
}

impl Default for Agents {
    fn default() -> Self {
        Self { namespace: "flock-system".into(), selector: "app.kubernetes.io/name=flock-agent".into(), nodes: String::new() }
    }
}

/// What `flockctl status` reads.
#[derive(Debug, Clone, Default)]
pub struct Fleet {
    nodes: Vec<Node>,
    flock_nodes: Vec<FlockNode>,
    agent_pods: Vec<Pod>,
    /// Runs (none when the Run CRD is not installed).
    runs: Vec<Run>,
    /// The pods labelled `flock.dev/run`, every namespace.
    run_pods: Vec<Pod>,
    agents: Agents,
}

/// Why the fleet could not be read; names the resource.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("cannot list {resource}: the API server refused (RBAC: the user needs the `list` verb on {resource}): {message}")]
    Forbidden { resource: String, message: String },
    #[error("cannot list {resource}: the API server does not know these credentials (401): {message}")]
    Unauthorized { resource: String, message: String },
    #[error("cannot list {resource}: the API server does not serve it ({why})")]
    NotServed { resource: &'static str, why: &'static str },
    #[error("cannot list {resource}: {source}")]
    Api {
        resource: String,
        #[source]
        source: kube::Error,
    },
}

impl FleetError {
    fn new(resource: impl Into<String>, e: kube::Error) -> Self {
        let resource = resource.into();
        match e {
            kube::Error::Api(s) if s.code == 403 => Self::Forbidden { resource, message: s.message },
            kube::Error::Api(s) if s.code == 401 => Self::Unauthorized { resource, message: s.message },
            source => Self::Api { resource, source },
        }
    }
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Lists what [`judge`] needs. FlockNodes must be served (the flock-agent CRDs installed);
/// Runs are optional (flock-controller may not be installed).
pub async fn read(client: &Client, agents: Agents) -> Result<Fleet, FleetError> {
    let all = ListParams::default();
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(&agents.nodes))
        .await
        .map_err(|e| FleetError::new("nodes", e))?
        .items;
    let flock_nodes = match Api::<FlockNode>::all(client.clone()).list(&all).await {
        Ok(l) => l.items,
        Err(e) if not_found(&e) => {
            return Err(FleetError::NotServed {
                resource: "flocknodes.flock.dev",
                why: "the FlockNode CRD is not installed: is flock-agent deployed? (deploy/agent/crds)",
            });
        }
        Err(e) => return Err(FleetError::new("flocknodes.flock.dev", e)),
    };
    let agent_pods = Api::<Pod>::namespaced(client.clone(), &agents.namespace)
        .list(&ListParams::default().labels(&agents.selector))
        .await
        .map_err(|e| FleetError::new(format!("pods in namespace {} ({})", agents.namespace, agents.selector), e))?
        .items;
    let runs = match Api::<Run>::all(client.clone()).list(&all).await {
        Ok(l) => l.items,
        Err(e) if not_found(&e) => Vec::new(),
        Err(e) => return Err(FleetError::new("runs.flock.dev", e)),
    };
    let run_pods = if runs.is_empty() {
        Vec::new()
    } else {
        Api::<Pod>::all(client.clone())
            .list(&ListParams::default().labels(crate::model::RUN_LABEL))
            .await
            .map_err(|e| FleetError::new("pods in all namespaces (labelled flock.dev/run)", e))?
            .items
    };
    Ok(Fleet { nodes, flock_nodes, agent_pods, runs, run_pods, agents })
}

/// The fleet, judged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetStatus {
    pub nodes: Vec<NodeRow>,
    pub runs: Vec<RunRow>,
    /// FlockNodes whose Node does not exist (the garbage collector removes them with their
    /// owner; one without an owner stays).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub leftovers: Vec<String>,
}

impl FleetStatus {
    /// Whether every node is ok and every run enforced.
    pub fn ok(&self) -> bool {
        self.nodes.iter().all(|n| n.ok) && self.runs.iter().all(|r| r.enforced)
    }
}

/// One Node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRow {
    pub name: String,
    pub ok: bool,
    /// Why not ok, each a sentence naming what to look at.
    pub reasons: Vec<String>,
    /// Worth knowing, not a failure (a version other than flockctl's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// What the FlockNode says may no longer be true: nobody keeps it current.
    pub stale: bool,
    /// The agent's version (from its FlockNode).
    pub version: Option<String>,
    /// `agent X, flockctl Y` when they differ.
    pub skew: Option<String>,
    /// The API server as the agent last reported it.
    pub api: Option<String>,
    pub endpoints: Option<i64>,
    pub rules: Option<i64>,
    pub elements: Option<i64>,
    pub hash: Option<String>,
    pub last_error: Option<String>,
    /// The flock-agent pod on the node (`namespace/name`).
    pub agent_pod: Option<String>,
}

/// One run whose policy flock-agent enforces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRow {
    /// `namespace/name`.
    pub name: String,
    /// `namespace/name` of its NetworkPolicy.
    pub policy: String,
    pub generation: i64,
    pub enforced: bool,
    /// The nodes hosting its pods that do not enforce that generation.
    pub pending: Vec<String>,
    pub message: String,
}

fn condition_true(conditions: Option<&Vec<k8s_openapi::api::core::v1::NodeCondition>>, kind: &str) -> Option<bool> {
    conditions?.iter().find(|c| c.type_ == kind).map(|c| c.status == "True")
}

fn pod_ready(p: &Pod) -> bool {
    let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Why an agent pod is not ready, from what kubelet reports (a waiting reason, restarts).
fn pod_trouble(p: &Pod) -> String {
    let statuses = p.status.as_ref().and_then(|s| s.container_statuses.as_deref()).unwrap_or_default();
    let mut out = Vec::new();
    for c in statuses {
        if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref()) {
            out.push(format!("{}: {w}", c.name));
        }
        if c.restart_count > 0 {
            out.push(format!("{} restarted {} times", c.name, c.restart_count));
        }
    }
    if out.is_empty() {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("unknown phase");
        out.push(phase.to_string());
    }
    out.join(", ")
}

/// The agent pod that speaks for a node: the FlockNode's writer if it is there and not
/// terminating, else a Ready one that is not terminating, else any.
fn pick<'a>(pods: &[&'a Pod], writer: Option<&AgentPod>) -> Option<&'a Pod> {
    let terminating = |p: &Pod| p.metadata.deletion_timestamp.is_some();
    let rank = |p: &Pod| {
        let wrote = writer.is_some_and(|w| p.uid().as_deref() == Some(w.uid.as_str()));
        (!terminating(p) && wrote, !terminating(p) && pod_ready(p), !terminating(p))
    };
    pods.iter().copied().max_by_key(|p| rank(p))
}

/// The fleet's state as `client_version` (flockctl's) sees it.
pub fn judge(fleet: &Fleet, client_version: &str) -> FleetStatus {
    let reports: BTreeMap<String, &FlockNode> = fleet.flock_nodes.iter().map(|f| (f.name_any(), f)).collect();
    // Where a node has several agent pods (a rollout): the one that wrote its FlockNode if it
    // is still there and not terminating, else a Ready one that is not terminating.
    let mut agents: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
    for p in &fleet.agent_pods {
        if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            agents.entry(node).or_default().push(p);
        }
    }
    let statuses: BTreeMap<String, FlockNodeStatus> =
        reports.iter().filter_map(|(n, f)| f.status.clone().map(|s| (n.clone(), s))).collect();
    let (runs, run_reasons) = judge_runs(fleet, &statuses);
    let mut rows = Vec::new();
    for node in &fleet.nodes {
        let name = node.name_any();
        let mut row = NodeRow {
            name: name.clone(),
            ok: true,
            reasons: Vec::new(),
            notes: Vec::new(),
            stale: false,
            version: None,
            skew: None,
            api: None,
            endpoints: None,
            rules: None,
            elements: None,
            hash: None,
            last_error: None,
            agent_pod: None,
        };
        match condition_true(node.status.as_ref().and_then(|s| s.conditions.as_ref()), "Ready") {
            Some(true) => {}
            ready => {
                row.stale = true;
                let what = if ready.is_none() { "reports no Ready condition" } else { "is not Ready" };
                row.reasons.push(format!("node {what} (its kubelet is not reporting?): its FlockNode may be stale"));
            }
        }
        let writer = reports.get(&name).and_then(|f| f.status.as_ref()).and_then(|s| s.agent_pod.as_ref());
        match agents.get(name.as_str()).and_then(|pods| pick(pods, writer)) {
            None => {
                row.stale = true;
                row.reasons.push(format!(
                    "no flock-agent pod on this node (namespace {}, selector {}): nothing enforces policy here or keeps its FlockNode current",
                    fleet.agents.namespace, fleet.agents.selector
                ));
            }
            Some(p) => {
                let pod = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
                if !pod_ready(p) {
                    row.stale = true;
                    row.reasons.push(format!("flock-agent pod {pod} is not ready ({}): its FlockNode may be stale", pod_trouble(p)));
                } else if let Some(w) = writer
                    && p.uid().as_deref() != Some(w.uid.as_str())
                {
                    row.stale = true;
                    row.reasons.push(format!(
                        "its FlockNode was written by flock-agent pod {} (uid {}), not by {pod}, which runs there now: that agent has not written it (RBAC or admission refusing it? --node-status=false?)",
                        w.name, w.uid
                    ));
                }
                row.agent_pod = Some(pod);
            }
        }
        match reports.get(&name).map(|f| f.status.as_ref()) {
            None => row
                .reasons
                .push("no FlockNode: flock-agent has not committed a ruleset on this node (or runs with --node-status=false)".into()),
            Some(None) => row.reasons.push("its FlockNode has no status yet: no ruleset committed".into()),
            Some(Some(s)) => {
                row.version = Some(s.version.clone());
                if s.version != client_version {
                    row.skew = Some(format!("agent {}, flockctl {client_version}", s.version));
                    row.notes.push(format!("flock-agent {} runs here; this flockctl is {client_version}", s.version));
                }
                row.api = Some(s.api.clone());
                if s.api != "Connected" {
                    row.reasons.push(format!("flock-agent sees the API server as {} (enforcing the last-known state)", s.api));
                }
                match &s.ruleset {
                    Some(r) => {
                        row.endpoints = Some(r.local_endpoints);
                        row.rules = Some(r.rules);
                        row.elements = Some(r.set_elements);
                        row.hash = Some(r.hash.clone());
                    }
                    None => row.reasons.push("no ruleset committed yet".into()),
                }
                if !s.last_error.is_empty() {
                    row.reasons.push(format!("the last sync failed (the last committed ruleset stays): {}", s.last_error));
                    row.last_error = Some(s.last_error.clone());
                }
            }
        }
        if let Some(why) = run_reasons.get(&name) {
            row.reasons.extend(why.iter().cloned());
        }
        row.ok = row.reasons.is_empty();
        rows.push(row);
    }
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    let known: BTreeSet<String> = fleet.nodes.iter().map(ResourceExt::name_any).collect();
    let leftovers = reports.keys().filter(|n| !known.contains(*n)).cloned().collect();
    FleetStatus { nodes: rows, runs, leftovers }
}

/// Each run flock-agent enforces, and per node the runs it does not enforce (yet).
fn judge_runs(fleet: &Fleet, statuses: &BTreeMap<String, FlockNodeStatus>) -> (Vec<RunRow>, BTreeMap<String, Vec<String>>) {
    let mut rows = Vec::new();
    let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for run in &fleet.runs {
        let status = run.status.as_ref();
        // Only runs whose policy is applied and is a NetworkPolicy: the ones flock-agent reports.
        let enabled = status.and_then(|s| s.enforcement.as_ref()).is_some_and(|e| e.enabled);
        let Some(policy) = status.and_then(|s| s.network_policy.as_ref()).filter(|p| enabled && p.kind == "NetworkPolicy") else {
            continue;
        };
        let namespace = run.namespace().unwrap_or_default();
        let name = format!("{namespace}/{}", run.name_any());
        let policy_name = format!("{namespace}/{}", policy.name);
        let generation = policy.generation.unwrap_or(0);
        // The controller's choice for an invalid run too (its own selector when that part is
        // valid, else the default one): its pods stay isolated either way.
        let selector =
            render::run_selector(run).ok().or_else(|| render::own_selector(run)).unwrap_or_else(|| render::default_selector(run));
        let Some(selector) = enforced::compile(&selector) else {
            rows.push(RunRow {
                name,
                policy: policy_name,
                generation,
                enforced: false,
                pending: Vec::new(),
                message: "the run's pod selector is invalid".into(),
            });
            continue;
        };
        let pods = fleet.run_pods.iter().filter(|p| p.namespace().as_deref() == Some(namespace.as_str()));
        let nodes = enforced::nodes(&selector, pods);
        let j = enforced::judge(&policy_name, generation, &nodes, statuses);
        for node in &j.pending {
            let seen = statuses.get(node).and_then(|s| s.run_policies.iter().find(|p| p.name == policy_name)).map(|p| p.generation);
            let what = match seen {
                Some(g) => format!("enforces generation {g}"),
                None => "does not enforce it".into(),
            };
            by_node.entry(node.clone()).or_default().push(format!(
                "run {name}: NetworkPolicy {policy_name} generation {generation} is not enforced here yet (the node {what})"
            ));
        }
        rows.push(RunRow { name, policy: policy_name, generation, enforced: j.pending.is_empty(), pending: j.pending, message: j.message });
    }
    (rows, by_node)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(name: &str, ready: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name}, "status": {"conditions": [{"type": "Ready", "status": ready}]}})).unwrap()
    }

    fn agent(node: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("flock-agent-{node}"), "namespace": "flock-system", "uid": format!("uid-{node}-{ready}")},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}],
                       "containerStatuses": [{"name": "agent", "ready": ready, "restartCount": if ready {0} else {4}, "image": "", "imageID": "",
                                              "state": if ready {json!({"running": {}})} else {json!({"waiting": {"reason": "CrashLoopBackOff"}})}}]}
        }))
        .unwrap()
    }

    fn flock_node(name: &str, status: serde_json::Value) -> FlockNode {
        serde_json::from_value(
            json!({"apiVersion": "flock.dev/v1alpha1", "kind": "FlockNode", "metadata": {"name": name}, "spec": {}, "status": status}),
        )
        .unwrap()
    }

    fn healthy(version: &str) -> serde_json::Value {
        json!({"version": version, "api": "Connected", "ruleset": {"hash": "abc", "rules": 10, "setElements": 4, "localEndpoints": 2}})
    }

    fn run(name: &str, generation: i64) -> Run {
        serde_json::from_value(json!({
            "apiVersion": "flock.dev/v1alpha1", "kind": "Run",
            "metadata": {"name": name, "namespace": "ci"},
            "spec": {"profile": "p"},
            "status": {"enforcement": {"enabled": true, "mode": "on", "reason": "on"},
                       "networkPolicy": {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "name": format!("flock-run-{name}"), "uid": "u", "generation": generation}}
        }))
        .unwrap()
    }

    fn run_pod(run: &str, node: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("{run}-pod"), "namespace": "ci", "labels": {"flock.dev/run": run}},
            "spec": {"nodeName": node, "containers": []}, "status": {"phase": "Running"}
        }))
        .unwrap()
    }

    fn row<'a>(s: &'a FleetStatus, name: &str) -> &'a NodeRow {
        s.nodes.iter().find(|n| n.name == name).unwrap()
    }

    #[test]
    fn a_healthy_node_is_ok_and_every_failure_is_named() {
        let mut bad = healthy("0.1.0");
        bad["api"] = "Degraded".into();
        bad["lastError"] = "nft: Error: Could not process rule".into();
        let fleet = Fleet {
            nodes: vec![node("a", "True"), node("b", "True"), node("c", "False"), node("d", "True"), node("e", "True")],
            flock_nodes: vec![
                flock_node("a", healthy("0.1.0")),
                flock_node("b", bad),
                flock_node("c", healthy("0.1.0")),
                flock_node("d", healthy("0.0.9")),
                flock_node("gone", healthy("0.1.0")),
            ],
            agent_pods: vec![agent("a", true), agent("b", true), agent("c", true), agent("d", false)],
            agents: Agents::default(),
            ..Fleet::default()
        };
        let s = judge(&fleet, "0.1.0");
        assert!(!s.ok());
        let a = row(&s, "a");
        assert!(a.ok && a.reasons.is_empty() && !a.stale && a.skew.is_none(), "{a:#?}");
        assert_eq!((a.endpoints, a.rules, a.elements, a.hash.as_deref()), (Some(2), Some(10), Some(4), Some("abc")));
        assert_eq!(a.agent_pod.as_deref(), Some("flock-system/flock-agent-a"));
        let b = row(&s, "b");
        assert!(!b.ok && !b.stale);
        assert!(
            b.reasons.iter().any(|r| r.contains("Degraded")) && b.reasons.iter().any(|r| r.contains("Could not process rule")),
            "{b:#?}"
        );
        let c = row(&s, "c");
        assert!(!c.ok && c.stale && c.reasons[0].contains("not Ready"), "{c:#?}");
        let d = row(&s, "d");
        assert!(!d.ok && d.stale && d.reasons[0].contains("CrashLoopBackOff") && d.reasons[0].contains("restarted 4 times"), "{d:#?}");
        assert_eq!(d.skew.as_deref(), Some("agent 0.0.9, flockctl 0.1.0"));
        let e = row(&s, "e");
        assert!(
            !e.ok
                && e.stale
                && e.reasons.len() == 2
                && e.reasons[0].contains("no flock-agent pod")
                && e.reasons[1].contains("no FlockNode"),
            "{e:#?}"
        );
        assert_eq!(s.leftovers, ["gone"]);
    }

    #[test]
    fn a_node_not_enforcing_a_runs_policy_is_not_ok() {
        let mut current = healthy("0.1.0");
        current["runPolicies"] = json!([{"name": "ci/flock-run-r", "generation": 3}]);
        let mut behind = healthy("0.1.0");
        behind["runPolicies"] = json!([{"name": "ci/flock-run-r", "generation": 2}]);
        let mut fleet = Fleet {
            nodes: vec![node("a", "True"), node("b", "True"), node("c", "True")],
            flock_nodes: vec![flock_node("a", current), flock_node("b", behind), flock_node("c", healthy("0.1.0"))],
            agent_pods: vec![agent("a", true), agent("b", true), agent("c", true)],
            runs: vec![run("r", 3)],
            run_pods: vec![run_pod("r", "a"), run_pod("r", "b")],
            agents: Agents::default(),
        };
        let s = judge(&fleet, "0.1.0");
        assert_eq!(s.runs.len(), 1);
        assert!(!s.runs[0].enforced && s.runs[0].pending == ["b"], "{:#?}", s.runs);
        assert!(row(&s, "a").ok && row(&s, "c").ok);
        let b = row(&s, "b");
        assert!(
            !b.ok
                && b.reasons
                    == ["run ci/r: NetworkPolicy ci/flock-run-r generation 3 is not enforced here yet (the node enforces generation 2)"],
            "{b:#?}"
        );
        // Once b catches up, everything is ok.
        fleet.flock_nodes[1] = flock_node("b", {
            let mut s = healthy("0.1.0");
            s["runPolicies"] = json!([{"name": "ci/flock-run-r", "generation": 3}]);
            s
        });
        let s = judge(&fleet, "0.1.0");
        assert!(s.ok() && s.runs[0].enforced, "{s:#?}");
    }

    #[test]
    fn a_ready_agent_pod_is_preferred_during_a_rollout_whatever_the_order() {
        for pods in [vec![agent("a", false), agent("a", true)], vec![agent("a", true), agent("a", false)]] {
            let fleet = Fleet {
                nodes: vec![node("a", "True")],
                flock_nodes: vec![flock_node("a", healthy("0.1.0"))],
                agent_pods: pods,
                ..Fleet::default()
            };
            assert!(judge(&fleet, "0.1.0").ok());
        }
    }

    /// A status written by another agent pod than the one running now is stale: the running
    /// one has not written (RBAC, admission, --node-status=false).
    #[test]
    fn a_status_written_by_another_agent_pod_is_stale() {
        let mut status = healthy("0.1.0");
        status["agentPod"] = json!({"name": "flock-system/flock-agent-old", "uid": "uid-old"});
        let mut fleet = Fleet {
            nodes: vec![node("a", "True")],
            flock_nodes: vec![flock_node("a", status.clone())],
            agent_pods: vec![agent("a", true)],
            ..Fleet::default()
        };
        let s = judge(&fleet, "0.1.0");
        let a = row(&s, "a");
        assert!(!a.ok && a.stale && a.reasons[0].contains("written by flock-agent pod flock-system/flock-agent-old"), "{a:#?}");
        // The writer itself, terminating, beside its Ready successor that has not written:
        // still stale (the successor speaks for the node).
        let mut old = agent("a", true);
        old.metadata.uid = Some("uid-old".into());
        old.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        fleet.agent_pods = vec![old.clone(), agent("a", true)];
        assert!(row(&judge(&fleet, "0.1.0"), "a").stale);
        // Written by the pod running now: ok.
        status["agentPod"]["uid"] = "uid-a-true".into();
        fleet.flock_nodes = vec![flock_node("a", status)];
        fleet.agent_pods = vec![old, agent("a", true)];
        assert!(judge(&fleet, "0.1.0").ok());
    }

    /// An invalid run keeps its pods isolated: its nodes are still judged (by its own
    /// selector or the default one), and a run not enforced fails the status.
    #[test]
    fn an_invalid_run_is_still_judged_and_counts() {
        let mut r = run("r", 3);
        r.spec.profile = String::new();
        let fleet = Fleet {
            nodes: vec![node("a", "True")],
            flock_nodes: vec![flock_node("a", healthy("0.1.0"))],
            agent_pods: vec![agent("a", true)],
            runs: vec![r],
            run_pods: vec![run_pod("r", "a"), run_pod("r", "gone")],
            agents: Agents::default(),
        };
        let s = judge(&fleet, "0.1.0");
        assert_eq!(s.runs[0].pending, ["a", "gone"], "{s:#?}");
        assert!(!s.ok());
    }
}
