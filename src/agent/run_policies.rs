//! Which NetworkPolicies, at which `metadata.generation`, a commit enforces for the sandboxed
//! runs' pods of this node (FlockNode's `runPolicies`).
//!
//! Every pod of the snapshot scheduled on this node, labelled [`RUN_LABEL`], not terminal and
//! not host-networked (flock enforces nothing for those), with every NetworkPolicy of its
//! namespace whose `podSelector` selects it (an invalid selector: skipped; the translator
//! isolates with it, but no rule of the policy as written is enforced). From the very snapshot
//! a sync translates, so a commit vouches for it: such a pod either has its endpoint in that
//! commit or gets it from a later one (a CNI ADD waits for a sync that includes it), with a
//! snapshot at least as new.
//!
//! Kept from one sync to the next, like the translation: the source's journal says which pods
//! and policies changed, and only those are looked at again — never every pod of the cluster,
//! except on a full translation (the first sync, a relist, a gap in the journal).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::model::RUN_LABEL;
use crate::model::{Change, ObjectRef, Pod, Snapshot};
use crate::translate::selector::Selector;

/// `namespace/name` → generation (0 when the policy has none, as in a manifest).
pub(crate) type RunPolicyMap = BTreeMap<Arc<str>, i64>;

/// What is kept of a policy of a namespace with run pods.
#[derive(Debug)]
struct Policy {
    /// `None`: invalid (it selects nothing here).
    selector: Option<Selector>,
    generation: i64,
    /// `namespace/name`, made once (the map is made again on every change).
    key: Arc<str>,
}

impl Policy {
    fn of(p: &crate::model::NetworkPolicy) -> Self {
        Self {
            selector: Selector::compile(&p.pod_selector).ok(),
            generation: p.generation.unwrap_or(0),
            key: format!("{}/{}", p.namespace, p.name).into(),
        }
    }
}

/// One namespace with run pods on this node.
#[derive(Debug, Default)]
struct Namespace {
    /// Its policies, by name.
    policies: BTreeMap<String, Policy>,
    /// Its run pods on this node, by uid, with the policies selecting each.
    pods: BTreeMap<String, BTreeSet<String>>,
}

impl Namespace {
    fn load(snapshot: &Snapshot, namespace: &str) -> Self {
        let policies = snapshot.policies_in(namespace).map(|p| (p.name.clone(), Policy::of(p))).collect();
        Self { policies, pods: BTreeMap::new() }
    }

    fn selecting(&self, pod: &Pod) -> BTreeSet<String> {
        self.policies
            .iter()
            .filter(|(_, p)| p.selector.as_ref().is_some_and(|s| s.matches(&pod.labels)))
            .map(|(name, _)| name.clone())
            .collect()
    }
}

/// Whether `pod` is a run pod this node enforces policy for.
pub(crate) fn is_local_run_pod(pod: &Pod, node: &str) -> bool {
    pod.node.as_deref() == Some(node) && !pod.phase.is_terminal() && !pod.host_network && pod.labels.contains_key(RUN_LABEL)
}

/// The run policies of one node, kept up to date by the source's journal.
#[derive(Debug)]
pub struct RunPolicies {
    node: String,
    /// The source version last synced (`None`: nothing yet).
    version: Option<u64>,
    namespaces: BTreeMap<String, Namespace>,
    /// Each run pod's namespace, by uid.
    pods: BTreeMap<String, String>,
    /// The map as of the last sync (shared with the published status).
    current: Arc<RunPolicyMap>,
}

impl RunPolicies {
    pub fn new(node: &str) -> Self {
        Self { node: node.into(), version: None, namespaces: BTreeMap::new(), pods: BTreeMap::new(), current: Arc::default() }
    }

    /// The source version last synced.
    pub(crate) fn version(&self) -> Option<u64> {
        self.version
    }

    /// Brings the map to `snapshot` (source version `version`). `changes`: every object
    /// changed since [`Self::version`] (`None`: unknown, look at every pod). `check`: also
    /// compute it from scratch and compare, as the translation is checked (a difference is
    /// logged and repaired).
    pub fn sync(&mut self, snapshot: &Snapshot, version: u64, changes: Option<&[Change]>, check: bool) -> Arc<RunPolicyMap> {
        let mut dirty = match changes.filter(|_| self.version.is_some()) {
            None => {
                self.rebuild(snapshot);
                true
            }
            Some(changes) => self.update(snapshot, changes),
        };
        self.version = Some(version);
        if check && !dirty {
            let full = of(snapshot, &self.node);
            if full != *self.current {
                tracing::error!(kept = ?self.current, full = ?full, "the run policies kept differ from a fresh computation; using it");
                self.rebuild(snapshot);
                dirty = true;
            }
        }
        if dirty {
            let mut map = RunPolicyMap::new();
            for ns in self.namespaces.values() {
                for p in ns.pods.values().flatten().filter_map(|name| ns.policies.get(name)) {
                    map.insert(Arc::clone(&p.key), p.generation);
                }
            }
            if map != *self.current {
                self.current = Arc::new(map);
            }
        }
        Arc::clone(&self.current)
    }

    fn rebuild(&mut self, snapshot: &Snapshot) {
        self.namespaces.clear();
        self.pods.clear();
        let node = std::mem::take(&mut self.node);
        for pod in snapshot.pods().filter(|p| is_local_run_pod(p, &node)) {
            self.add_pod(snapshot, pod);
        }
        self.node = node;
    }

    /// Folds the changes in; returns whether the map may have changed.
    fn update(&mut self, snapshot: &Snapshot, changes: &[Change]) -> bool {
        let mut dirty = false;
        for change in changes {
            match change {
                Change::Pod { uid, .. } => {
                    let was = self.remove_pod(uid);
                    let now = snapshot.pod(uid).filter(|p| is_local_run_pod(p, &self.node));
                    if let Some(pod) = now {
                        self.add_pod(snapshot, pod);
                    }
                    dirty |= was || now.is_some();
                }
                Change::Policy(key) => dirty |= self.policy_changed(snapshot, key),
                Change::Namespace(_) | Change::ClusterPolicy(_) | Change::Node(_) => {}
            }
        }
        dirty
    }

    fn add_pod(&mut self, snapshot: &Snapshot, pod: &Pod) {
        let ns = self.namespaces.entry(pod.namespace.clone()).or_insert_with(|| Namespace::load(snapshot, &pod.namespace));
        let selecting = ns.selecting(pod);
        ns.pods.insert(pod.uid.clone(), selecting);
        self.pods.insert(pod.uid.clone(), pod.namespace.clone());
    }

    /// Forgets a run pod; returns whether it was one.
    fn remove_pod(&mut self, uid: &str) -> bool {
        let Some(namespace) = self.pods.remove(uid) else { return false };
        if let Some(ns) = self.namespaces.get_mut(&namespace) {
            ns.pods.remove(uid);
            // No run pod left: its policies need not be followed any more.
            if ns.pods.is_empty() {
                self.namespaces.remove(&namespace);
            }
        }
        true
    }

    /// A policy changed: only namespaces with run pods here care. Returns whether one did.
    fn policy_changed(&mut self, snapshot: &Snapshot, key: &ObjectRef) -> bool {
        let Some(ns) = self.namespaces.get_mut(&key.namespace) else { return false };
        let policy = snapshot.policy(key);
        match policy {
            Some(p) => {
                ns.policies.insert(key.name.clone(), Policy::of(p));
            }
            None => {
                ns.policies.remove(&key.name);
            }
        }
        let selector = ns.policies.get(&key.name).and_then(|p| p.selector.as_ref());
        for (uid, selecting) in &mut ns.pods {
            let selects = selector.is_some_and(|s| snapshot.pod(uid).is_some_and(|pod| s.matches(&pod.labels)));
            if selects {
                selecting.insert(key.name.clone());
            } else {
                selecting.remove(&key.name);
            }
        }
        true
    }
}

/// The run policies of `node` in `snapshot`, from scratch (the reference the kept state must
/// equal).
pub fn of(snapshot: &Snapshot, node: &str) -> RunPolicyMap {
    let mut map = RunPolicyMap::new();
    for pod in snapshot.pods().filter(|p| is_local_run_pod(p, node)) {
        for p in snapshot.policies_in(&pod.namespace) {
            if Selector::compile(&p.pod_selector).is_ok_and(|s| s.matches(&pod.labels)) {
                map.insert(format!("{}/{}", p.namespace, p.name).into(), p.generation.unwrap_or(0));
            }
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LabelSelector, Labels, NetworkPolicy, PodPhase};

    fn pod(ns: &str, name: &str, node: &str, labels: &[(&str, &str)]) -> Pod {
        Pod {
            namespace: ns.into(),
            name: name.into(),
            uid: format!("uid-{ns}-{name}"),
            labels: labels.iter().copied().collect::<Labels>(),
            node: Some(node.into()),
            phase: PodPhase::Running,
            ips: vec!["198.18.1.1".parse().unwrap()],
            host_network: false,
            ports: vec![],
            created: None,
            unpublished: false,
        }
    }

    fn policy(ns: &str, name: &str, selector: &[(&str, &str)], generation: i64) -> NetworkPolicy {
        NetworkPolicy {
            namespace: ns.into(),
            name: name.into(),
            pod_selector: LabelSelector {
                match_labels: selector.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                ..Default::default()
            },
            generation: Some(generation),
            ..Default::default()
        }
    }

    fn map(entries: &[(&str, i64)]) -> RunPolicyMap {
        entries.iter().map(|(k, g)| (Arc::from(*k), *g)).collect()
    }

    /// Syncs `rp` through the changes `f` makes to `s`, and checks it against [`of`].
    fn step(rp: &mut RunPolicies, s: &mut Snapshot, version: &mut u64, f: impl FnOnce(&mut Snapshot)) -> RunPolicyMap {
        s.record_changes();
        s.take_changes();
        f(s);
        let changes = s.take_changes();
        *version += 1;
        let got = rp.sync(s, *version, Some(&changes), false);
        assert_eq!(*got, of(s, "n1"), "the kept state differs from a fresh computation");
        (*got).clone()
    }

    #[test]
    fn run_pods_on_this_node_and_the_policies_selecting_them() {
        let mut s = Snapshot::new();
        s.upsert_pod(pod("a", "run", "n1", &[(RUN_LABEL, "r1"), ("app", "x")]));
        s.upsert_pod(pod("a", "plain", "n1", &[("app", "y")]));
        s.upsert_pod(pod("a", "elsewhere", "n2", &[(RUN_LABEL, "r2"), ("app", "z")]));
        s.upsert_policy(policy("a", "r1-egress", &[(RUN_LABEL, "r1")], 3));
        s.upsert_policy(policy("a", "all", &[], 1));
        s.upsert_policy(policy("a", "only-plain", &[("app", "y")], 1));
        s.upsert_policy(policy("a", "only-elsewhere", &[("app", "z")], 1));
        s.upsert_policy(policy("a", "broken", &[("app", "x-")], 1));
        s.upsert_policy(policy("b", "r1-egress", &[], 1));
        let mut rp = RunPolicies::new("n1");
        let got = rp.sync(&s, 1, None, false);
        assert_eq!(*got, map(&[("a/all", 1), ("a/r1-egress", 3)]));
        assert_eq!(*got, of(&s, "n1"));
    }

    #[test]
    fn the_kept_state_follows_every_kind_of_change() {
        let mut s = Snapshot::new();
        let mut v = 1;
        let mut rp = RunPolicies::new("n1");
        s.upsert_policy(policy("a", "p", &[(RUN_LABEL, "r1")], 1));
        assert!(rp.sync(&s, v, None, false).is_empty());
        // A run pod arrives; its policy changes generation; another policy appears.
        let got = step(&mut rp, &mut s, &mut v, |s| s.upsert_pod(pod("a", "run", "n1", &[(RUN_LABEL, "r1")])));
        assert_eq!(got, map(&[("a/p", 1)]));
        let got = step(&mut rp, &mut s, &mut v, |s| s.upsert_policy(policy("a", "p", &[(RUN_LABEL, "r1")], 2)));
        assert_eq!(got["a/p"], 2);
        step(&mut rp, &mut s, &mut v, |s| s.upsert_policy(policy("a", "q", &[], 5)));
        // A policy's selector stops matching; becomes invalid; is removed.
        let got = step(&mut rp, &mut s, &mut v, |s| s.upsert_policy(policy("a", "q", &[("app", "none")], 6)));
        assert!(!got.contains_key("a/q"));
        step(&mut rp, &mut s, &mut v, |s| s.upsert_policy(policy("a", "q", &[], 7)));
        step(&mut rp, &mut s, &mut v, |s| s.upsert_policy(policy("a", "q", &[("app", "x-")], 8)));
        step(&mut rp, &mut s, &mut v, |s| {
            s.remove_policy(&ObjectRef::new("a", "q"));
        });
        // The pod is relabelled out of the runs, back in, finishes, is host-networked, moves.
        let got = step(&mut rp, &mut s, &mut v, |s| s.upsert_pod(pod("a", "run", "n1", &[("app", "x")])));
        assert!(got.is_empty());
        step(&mut rp, &mut s, &mut v, |s| s.upsert_pod(pod("a", "run", "n1", &[(RUN_LABEL, "r1")])));
        let got = step(&mut rp, &mut s, &mut v, |s| {
            let mut p = pod("a", "run", "n1", &[(RUN_LABEL, "r1")]);
            p.phase = PodPhase::Succeeded;
            s.upsert_pod(p);
        });
        assert!(got.is_empty());
        let got = step(&mut rp, &mut s, &mut v, |s| {
            let mut p = pod("a", "run", "n1", &[(RUN_LABEL, "r1")]);
            p.host_network = true;
            s.upsert_pod(p);
        });
        assert!(got.is_empty());
        step(&mut rp, &mut s, &mut v, |s| s.upsert_pod(pod("a", "run", "n1", &[(RUN_LABEL, "r1")])));
        let got = step(&mut rp, &mut s, &mut v, |s| s.upsert_pod(pod("a", "run", "n2", &[(RUN_LABEL, "r1")])));
        assert!(got.is_empty());
        // Policies of a namespace without run pods here are not followed, then are once a run
        // pod arrives.
        step(&mut rp, &mut s, &mut v, |s| s.upsert_policy(policy("b", "p", &[], 1)));
        assert!(rp.namespaces.is_empty());
        let got = step(&mut rp, &mut s, &mut v, |s| s.upsert_pod(pod("b", "run", "n1", &[(RUN_LABEL, "r2")])));
        assert_eq!(got, map(&[("b/p", 1)]));
        step(&mut rp, &mut s, &mut v, |s| {
            s.remove_pod("uid-b-run");
        });
        assert!(rp.namespaces.is_empty() && rp.pods.is_empty());
    }

    #[test]
    fn an_unchanged_map_is_the_same_allocation() {
        let mut s = Snapshot::new();
        s.upsert_pod(pod("a", "run", "n1", &[(RUN_LABEL, "r1")]));
        s.upsert_policy(policy("a", "p", &[], 1));
        let mut rp = RunPolicies::new("n1");
        let first = rp.sync(&s, 1, None, false);
        let again = rp.sync(&s, 2, Some(&[Change::Policy(ObjectRef::new("a", "p"))]), false);
        assert!(Arc::ptr_eq(&first, &again));
    }

    #[test]
    fn the_check_repairs_a_missed_change() {
        let mut s = Snapshot::new();
        s.upsert_policy(policy("a", "p", &[], 1));
        let mut rp = RunPolicies::new("n1");
        assert!(rp.sync(&s, 1, None, false).is_empty());
        // A pod the journal did not mention: only the check finds it.
        s.upsert_pod(pod("a", "run", "n1", &[(RUN_LABEL, "r1")]));
        assert!(rp.sync(&s, 2, Some(&[]), false).is_empty());
        assert_eq!(*rp.sync(&s, 3, Some(&[]), true), map(&[("a/p", 1)]));
    }
}
