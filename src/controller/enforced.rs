//! Whether every node that hosts one of a run's pods enforces the run's policy: the
//! `Enforced` condition, from the nodes' `FlockNode` status (written by each node's
//! flock-agent: the NetworkPolicies selecting its run pods, each with the generation its last
//! committed sync enforces).
//!
//! [`judge`] is pure. The run's pods come from a cache of the pods labelled `flock.dev/run`
//! (a run's custom selector must require that label, so this holds every run pod); a pod
//! counts on its node once scheduled and until it finished, unless it uses the host's network
//! (flock enforces nothing for those, and its agent leaves them out of `runPolicies`: waiting
//! for their node would never end). A node whose agent reports a
//! generation at least the applied one enforces it; a node with no FlockNode, or an older
//! generation, is pending. Only flock-agent reports: on other enforcers (`--enforce off`, the
//! Cilium variant, an enforcer the probe found that is not flock) `Enforced` is `Unknown`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::crd::{FlockNodeStatus, Selector};
use crate::model::Labels;
use crate::model::{LabelSelector, LabelSelectorRequirement};
use crate::translate::selector::Selector as Compiled;

/// Whether the controller can verify enforcement on this cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verify {
    /// flock-agent enforces NetworkPolicies and reports FlockNodes.
    Flock,
    /// Something else enforces (or nothing does): why `Enforced` is Unknown.
    Unknown { reason: &'static str, message: String },
}

/// Reasons of `Enforced`.
pub(crate) mod reason {
    pub(crate) const ENFORCED: &str = "AllNodesEnforce";
    pub(crate) const NO_PODS: &str = "NoPodsScheduled";
    pub(crate) const PENDING: &str = "NodesPending";
    pub(crate) const NO_POLICY: &str = "NoPolicyApplied";
    pub(crate) const NOT_FLOCK: &str = "NotEnforcedByFlock";
    pub(crate) const DISABLED: &str = "EnforcementDisabled";
}

/// The `Enforced` condition of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Judgement {
    /// `True`, `False` or `Unknown`.
    pub(crate) status: &'static str,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
    /// The nodes that do not enforce the policy yet (sorted).
    pub(crate) pending: Vec<String>,
}

impl Judgement {
    #[cfg(test)]
    pub(crate) fn is_true(&self) -> bool {
        self.status == crate::crd::TRUE
    }

    pub(crate) fn unknown(reason: &'static str, message: String) -> Self {
        Self { status: crate::crd::UNKNOWN, reason, message, pending: Vec::new() }
    }
}

/// The node whose agent enforces the run's policy for `pod`: scheduled, not finished, not
/// being deleted past its grace (a terminating pod still has its endpoint until its DEL), not
/// host-networked (as [`crate::agent::run_policies::is_local_run_pod`] decides).
pub(crate) fn node_of(pod: &Pod) -> Option<&str> {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    if spec.host_network == Some(true) {
        return None;
    }
    spec.node_name.as_deref().filter(|n| !n.is_empty())
}

/// `sel` compiled for matching (a selector the run's checks accepted compiles; one that does
/// not matches nothing).
pub(crate) fn compile(sel: &Selector) -> Option<Compiled> {
    Compiled::compile(&LabelSelector {
        match_labels: sel.match_labels.clone(),
        match_expressions: sel
            .match_expressions
            .iter()
            .map(|e| LabelSelectorRequirement { key: e.key.clone(), operator: e.operator.as_str().into(), values: e.values.clone() })
            .collect(),
    })
    .ok()
}

/// Whether `pod` (in the run's namespace) is one of the run's.
pub(crate) fn selects(sel: &Compiled, pod: &Pod) -> bool {
    let labels: Labels = pod.labels().clone().into();
    sel.matches(&labels)
}

/// The nodes hosting the run's pods: `pods` are the candidates (the run's namespace).
pub(crate) fn nodes<'a>(sel: &Compiled, pods: impl IntoIterator<Item = &'a Pod>) -> BTreeSet<String> {
    pods.into_iter().filter(|p| selects(sel, p)).filter_map(node_of).map(str::to_string).collect()
}

/// The `Enforced` condition: `policy` is `namespace/name` and the generation applied,
/// `nodes` those hosting the run's pods, `reports` the FlockNode status of each node that
/// has one.
pub(crate) fn judge(policy: &str, generation: i64, nodes: &BTreeSet<String>, reports: &BTreeMap<String, FlockNodeStatus>) -> Judgement {
    if nodes.is_empty() {
        return Judgement {
            status: crate::crd::TRUE,
            reason: reason::NO_PODS,
            message: format!(
                "no pod of the run is scheduled yet (flock-agent isolates flock.dev/run pods until they are: NetworkPolicy {policy} generation {generation})"
            ),
            pending: Vec::new(),
        };
    }
    let mut pending = Vec::new();
    let mut why = Vec::new();
    for node in nodes {
        let seen = reports.get(node).map(|s| s.run_policies.iter().find(|p| p.name == policy).map(|p| p.generation));
        match seen {
            Some(Some(g)) if g >= generation => continue,
            Some(Some(g)) => why.push(format!("{node} (generation {g})")),
            Some(None) => why.push(format!("{node} (not yet)")),
            None => why.push(format!("{node} (no FlockNode: is flock-agent running there?)")),
        }
        pending.push(node.clone());
    }
    if pending.is_empty() {
        return Judgement {
            status: crate::crd::TRUE,
            reason: reason::ENFORCED,
            message: format!("{} node(s) enforce NetworkPolicy {policy} generation {generation}", nodes.len()),
            pending,
        };
    }
    // A long list is cut: the condition is for people, the count says the rest.
    const SHOWN: usize = 20;
    let more = why.len().saturating_sub(SHOWN);
    why.truncate(SHOWN);
    let tail = if more > 0 { format!(" and {more} more") } else { String::new() };
    Judgement {
        status: crate::crd::FALSE,
        reason: reason::PENDING,
        message: format!(
            "{} of {} node(s) do not enforce NetworkPolicy {policy} generation {generation} yet: {}{tail}",
            pending.len(),
            nodes.len(),
            why.join(", ")
        ),
        pending,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::EnforcedPolicy;

    fn report(entries: &[(&str, i64)]) -> FlockNodeStatus {
        FlockNodeStatus {
            run_policies: entries.iter().map(|(n, g)| EnforcedPolicy { name: n.to_string(), generation: *g }).collect(),
            ..FlockNodeStatus::default()
        }
    }

    #[test]
    fn every_node_must_report_the_generation() {
        let nodes: BTreeSet<String> = ["n1", "n2"].into_iter().map(String::from).collect();
        let mut reports = BTreeMap::from([("n1".to_string(), report(&[("a/r-egress", 2)]))]);
        let j = judge("a/r-egress", 2, &nodes, &reports);
        assert_eq!((j.status, j.reason, j.pending.clone()), ("False", reason::PENDING, vec!["n2".to_string()]));
        assert!(j.message.contains("n2 (no FlockNode"), "{}", j.message);
        reports.insert("n2".into(), report(&[("a/r-egress", 1), ("a/other", 9)]));
        let j = judge("a/r-egress", 2, &nodes, &reports);
        assert!(j.message.contains("n2 (generation 1)"), "{}", j.message);
        reports.insert("n2".into(), report(&[("a/r-egress", 3)]));
        let j = judge("a/r-egress", 2, &nodes, &reports);
        assert!(j.is_true() && j.reason == reason::ENFORCED, "{j:?}");
        let j = judge("a/r-egress", 2, &BTreeSet::new(), &reports);
        assert_eq!((j.status, j.reason), ("True", reason::NO_PODS));
    }

    #[test]
    fn only_scheduled_unfinished_selected_pods_count() {
        let pod = |name: &str, run: &str, node: Option<&str>, phase: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "a", "labels": {"flock.dev/run": run}},
                "spec": {"containers": [], "nodeName": node},
                "status": {"phase": phase}
            }))
            .unwrap()
        };
        let sel =
            compile(&Selector { match_labels: BTreeMap::from([("flock.dev/run".to_string(), "r".to_string())]), ..Selector::default() })
                .unwrap();
        let pods = [
            pod("p1", "r", Some("n1"), "Running"),
            pod("p2", "r", None, "Pending"),
            pod("p3", "r", Some("n2"), "Succeeded"),
            pod("p4", "other", Some("n3"), "Running"),
            pod("p5", "r", Some("n4"), "Pending"),
        ];
        let got: Vec<String> = nodes(&sel, &pods).into_iter().collect();
        assert_eq!(got, ["n1", "n4"]);
    }

    #[test]
    fn host_network_pods_are_left_out_as_the_agent_does() {
        let pod = |host_network: Option<bool>| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "a", "labels": {"flock.dev/run": "r"}},
                "spec": {"containers": [], "nodeName": "n1", "hostNetwork": host_network},
                "status": {"phase": "Running"}
            }))
            .unwrap()
        };
        assert_eq!(node_of(&pod(Some(true))), None);
        assert_eq!(node_of(&pod(Some(false))), Some("n1"));
        assert_eq!(node_of(&pod(None)), Some("n1"));
        // The agent's side of the same rule: such a pod is not one of its run pods.
        let model = |host_network: Option<bool>| crate::model::convert::pod(&pod(host_network)).unwrap();
        assert!(!crate::agent::run_policies::is_local_run_pod(&model(Some(true)), "n1"));
        assert!(crate::agent::run_policies::is_local_run_pod(&model(None), "n1"));
        // A host-network pod beside a normal one: only the normal one's node is waited for.
        let sel =
            compile(&Selector { match_labels: BTreeMap::from([("flock.dev/run".to_string(), "r".to_string())]), ..Selector::default() })
                .unwrap();
        let mut other = pod(None);
        other.spec.as_mut().unwrap().node_name = Some("n2".into());
        let got: Vec<String> = nodes(&sel, &[pod(Some(true)), other]).into_iter().collect();
        assert_eq!(got, ["n2"]);
    }
}
