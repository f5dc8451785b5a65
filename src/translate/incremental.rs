//! Incremental translation: [`translate`](super::translate)'s result kept up to date by the
//! changes since the last step, recomputing only what depends on them.
//!
//! The full translation stays the reference: [`Incremental::policy`] equals
//! `translate(snapshot, endpoints, options)` after every [`Incremental::update`] (a property
//! test and the `incremental` fuzz target check it; the agent's periodic full translation
//! checks it in production and repairs a disagreement). What is kept:
//!
//! - NetworkPolicies of the endpoints' namespaces and every ClusterNetworkPolicy, compiled,
//!   each with its problems; a changed policy is compiled again, alone.
//! - Each endpoint's policy. It depends on its pod, its namespace's labels and policies, and
//!   the ClusterNetworkPolicies, so only endpoints one of those changed for are translated
//!   again (every one when a ClusterNetworkPolicy changes: they are few).
//! - Each peer and named-port set. An address belongs to at most one pod ([`Addresses`]), and
//!   who owns an address depends only on the pods reporting it and the local endpoints. So a
//!   changed pod touches only the addresses it reports before and after the change: every
//!   pod-made set drops its entries for those addresses and gets them again from the pods
//!   reporting them — O(sets × addresses touched), whatever the cluster's size. A namespace
//!   relabel does the same for the addresses of that namespace's pods; a Node change
//!   recomputes the (few) node sets. Sets no rule refers to any more are dropped; sets a rule
//!   newly refers to are computed in full.
//!
//! Every step also says what changed ([`Changed`]), so the renderer redoes only that part.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::cluster::{self, CompiledCnp};
use super::compile::{self, CompiledPolicy};
use super::{
    Addresses, Direction, EndpointPolicy, NamedPortDef, NodePolicy, NsScope, Options, PeerDef, PeerMatch, PodIdent, PodRanges,
    PolicyProblem, Translator,
};
pub use crate::model::Change;
use crate::model::{LocalEndpoint, ObjectRef, Pod, Protocol, Snapshot};

/// What the last step changed in [`Incremental::policy`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Changed {
    /// Everything (a full translation): nothing from before can be reused.
    pub(crate) all: bool,
    /// Endpoints (by interface) added, removed or with a different policy.
    pub(crate) endpoints: BTreeSet<String>,
    /// Peer sets added, removed or with different content.
    pub(crate) peer_sets: BTreeSet<PeerDef>,
    /// Named-port sets added, removed or with different content.
    pub(crate) port_sets: BTreeSet<NamedPortDef>,
}

impl Changed {}

/// What an endpoint's translation left besides its policy.
#[derive(Debug, Clone, Default)]
struct EndpointExtra {
    /// The uid of the pod the endpoint resolved to.
    pod: Option<String>,
    /// Problems found while translating it (ClusterNetworkPolicy priority ties).
    problems: Vec<PolicyProblem>,
    /// The ClusterNetworkPolicies selecting its pod (their problems are reported).
    cluster_policies: BTreeSet<String>,
}

/// The translation of one node, kept up to date by [`Self::update`].
pub struct Incremental {
    options: Options,
    /// The endpoints as `translate` uses them: sorted, one per interface.
    eps: Vec<LocalEndpoint>,
    /// The namespaces of all endpoints given: their NetworkPolicies are compiled.
    namespaces: BTreeSet<String>,
    policies: BTreeMap<ObjectRef, (CompiledPolicy, Vec<PolicyProblem>)>,
    cluster: BTreeMap<String, (CompiledCnp, Vec<PolicyProblem>)>,
    /// Per endpoint interface.
    extra: BTreeMap<String, EndpointExtra>,
    /// Per endpoint interface, its pod's uid and node as the last step found them.
    idents: BTreeMap<String, Option<(String, Option<String>)>>,
    /// Shared with readers of a committed translation (the agent's revocation sweep): a
    /// step copies it only while one still holds it.
    np: Arc<NodePolicy>,
    changed: Changed,
}

impl Incremental {
    /// A full translation, to be updated from.
    pub fn new(snapshot: &Snapshot, endpoints: &[LocalEndpoint], options: &Options) -> Self {
        let mut inc = Self::empty(options.clone());
        inc.rebuild(snapshot, endpoints);
        inc
    }

    /// Nothing translated yet.
    fn empty(options: Options) -> Self {
        Self {
            options,
            eps: Vec::new(),
            namespaces: BTreeSet::new(),
            policies: BTreeMap::new(),
            cluster: BTreeMap::new(),
            extra: BTreeMap::new(),
            idents: BTreeMap::new(),
            np: Arc::new(NodePolicy::default()),
            changed: Changed::default(),
        }
    }

    /// The current translation: equal to `translate(snapshot, endpoints, options)` of the last
    /// step's inputs.
    pub fn policy(&self) -> &NodePolicy {
        &self.np
    }

    /// The current translation, shared: it stays as it is while the translation steps on.
    pub(crate) fn shared_policy(&self) -> Arc<NodePolicy> {
        Arc::clone(&self.np)
    }

    /// What the last step changed.
    pub fn changed(&self) -> &Changed {
        &self.changed
    }

    /// Translates everything again (what `new` does), dropping what was kept.
    pub(crate) fn rebuild(&mut self, snapshot: &Snapshot, endpoints: &[LocalEndpoint]) -> &Changed {
        *self = Self::empty(self.options.clone());
        for p in snapshot.cluster_policies() {
            self.compile_cluster_policy(snapshot, &p.name);
        }
        self.step(snapshot, endpoints, &[], true);
        self.changed.all = true;
        &self.changed
    }

    /// Brings the translation up to date with `snapshot` and `endpoints` (the full current
    /// list), given every object that changed since the last step.
    pub fn update(&mut self, snapshot: &Snapshot, endpoints: &[LocalEndpoint], changes: &[Change]) -> &Changed {
        self.step(snapshot, endpoints, changes, false);
        &self.changed
    }

    fn compile_policy(&mut self, snapshot: &Snapshot, key: &ObjectRef) {
        match snapshot.policy(key) {
            Some(p) => {
                let mut problems = Vec::new();
                let c = compile::compile(p, &mut problems);
                self.policies.insert(key.clone(), (c, problems));
            }
            None => {
                self.policies.remove(key);
            }
        }
    }

    fn compile_cluster_policy(&mut self, snapshot: &Snapshot, name: &str) {
        match snapshot.cluster_policy(name) {
            Some(p) => {
                let mut problems = Vec::new();
                let c = cluster::compile(p, &mut problems);
                self.cluster.insert(name.to_string(), (c, problems));
            }
            None => {
                self.cluster.remove(name);
            }
        }
    }

    fn step(&mut self, snapshot: &Snapshot, endpoints: &[LocalEndpoint], changes: &[Change], all: bool) {
        let mut changed = Changed::default();
        let eps: Vec<LocalEndpoint> = super::one_per_interface(endpoints).into_iter().cloned().collect();
        let ep_refs: Vec<&LocalEndpoint> = eps.iter().collect();
        // Each endpoint's pod (uid and node). A lookup among all the cluster's pods costs
        // microseconds: an unchanged endpoint naming its pod's uid keeps the last step's
        // answer unless the journal says that pod changed (every upsert and removal is in it).
        let old_eps: BTreeMap<&str, &LocalEndpoint> = self.eps.iter().map(|e| (e.interface.as_str(), e)).collect();
        let changed_pods: BTreeSet<&str> =
            changes.iter().filter_map(|c| if let Change::Pod { uid, .. } = c { Some(uid.as_str()) } else { None }).collect();
        let idents: Vec<Option<(String, Option<String>)>> = eps
            .iter()
            .map(|ep| {
                let kept = ep
                    .pod_uid
                    .as_deref()
                    .filter(|uid| !all && !changed_pods.contains(uid) && old_eps.get(ep.interface.as_str()) == Some(&ep))
                    .and_then(|_| self.idents.get(&ep.interface));
                match kept {
                    Some(ident) => ident.clone(),
                    None => super::pod_of(snapshot, ep).map(|p| (p.uid.clone(), p.node.clone())),
                }
            })
            .collect();
        let pods: Vec<Option<PodIdent<'_>>> =
            idents.iter().map(|i| i.as_ref().map(|(uid, node)| PodIdent { uid, node: node.as_deref() })).collect();
        let addresses = Addresses::of_pods(snapshot, &ep_refs, &pods);

        // Addresses whose owner may have changed, and pods whose membership may have.
        let mut touched_ips: BTreeSet<IpAddr> = BTreeSet::new();
        let mut touched_pods: BTreeSet<String> = BTreeSet::new();
        let mut dirty: BTreeSet<String> = BTreeSet::new();
        let mut nodes_changed = false;

        // Endpoints: added, removed, changed or resolving to another pod.
        let mut resolved: BTreeMap<String, Option<String>> = BTreeMap::new();
        for (ep, pod) in eps.iter().zip(&pods) {
            let uid = pod.map(|p| p.uid.to_string());
            let old = self.extra.get(&ep.interface).map(|x| &x.pod);
            if all || old_eps.get(ep.interface.as_str()) != Some(&ep) || old != Some(&uid) {
                dirty.insert(ep.interface.clone());
            }
            resolved.insert(ep.interface.clone(), uid);
        }
        for ep in &self.eps {
            if !resolved.contains_key(&ep.interface) {
                dirty.insert(ep.interface.clone());
            }
        }
        for iface in &dirty {
            for ep in [old_eps.get(iface.as_str()).copied(), eps.iter().find(|e| e.interface == *iface)].into_iter().flatten() {
                touched_ips.extend(ep.addrs.iter().copied());
            }
            let uids = [self.extra.get(iface).and_then(|x| x.pod.clone()), resolved.get(iface).cloned().flatten()];
            touched_pods.extend(uids.into_iter().flatten());
        }

        // Namespaces whose policies apply: those of every endpoint given.
        let namespaces: BTreeSet<String> = endpoints.iter().map(|e| e.pod.namespace.clone()).collect();
        if namespaces != self.namespaces {
            self.policies.retain(|k, _| namespaces.contains(&k.namespace));
            let added: Vec<&String> = namespaces.difference(&self.namespaces).collect();
            let keys: Vec<ObjectRef> = added.iter().flat_map(|ns| snapshot.policies_in(ns)).map(|p| p.key()).collect();
            {
                for k in keys {
                    self.compile_policy(snapshot, &k);
                }
            }
            self.namespaces = namespaces;
        }

        let mut cluster_changed = false;
        for change in changes {
            match change {
                Change::Pod { uid, old_ips } => {
                    touched_ips.extend(old_ips.iter().copied());
                    touched_pods.insert(uid.clone());
                    for (iface, extra) in &self.extra {
                        if extra.pod.as_deref() == Some(uid) {
                            dirty.insert(iface.clone());
                        }
                    }
                    for (iface, uid_now) in &resolved {
                        if uid_now.as_deref() == Some(uid) {
                            dirty.insert(iface.clone());
                        }
                    }
                }
                Change::Namespace(name) => {
                    for ep in eps.iter().filter(|e| e.pod.namespace == *name) {
                        dirty.insert(ep.interface.clone());
                    }
                    touched_pods.extend(snapshot.pods_in(name).map(|p| p.uid.clone()));
                }
                Change::Policy(key) => {
                    if self.namespaces.contains(&key.namespace) {
                        self.compile_policy(snapshot, key);
                        for ep in eps.iter().filter(|e| e.pod.namespace == key.namespace) {
                            dirty.insert(ep.interface.clone());
                        }
                    }
                }
                Change::ClusterPolicy(name) => {
                    self.compile_cluster_policy(snapshot, name);
                    cluster_changed = true;
                }
                Change::Node(_) => nodes_changed = true,
            }
        }
        if cluster_changed {
            dirty.extend(eps.iter().map(|e| e.interface.clone()));
        }
        // The addresses of the touched pods: those any endpoint of theirs has, before and now
        // (a pod's addresses are its first endpoint's: a new endpoint sorting first takes
        // over from one that did not change), and those the API reports now (the old ones
        // are above).
        for ep in &self.eps {
            if self.extra.get(&ep.interface).and_then(|x| x.pod.as_ref()).is_some_and(|uid| touched_pods.contains(uid)) {
                touched_ips.extend(ep.addrs.iter().copied());
            }
        }
        for ep in &eps {
            if resolved.get(&ep.interface).and_then(Option::as_ref).is_some_and(|uid| touched_pods.contains(uid)) {
                touched_ips.extend(ep.addrs.iter().copied());
            }
        }
        for uid in &touched_pods {
            if let Some(pod) = snapshot.pod(uid) {
                touched_ips.extend(pod.ips.iter().copied());
                touched_ips.extend(addresses.reported(pod).iter().copied());
            }
        }

        // Copied here if a reader still holds the last translation.
        let np = Arc::make_mut(&mut self.np);
        // The dirty endpoints, translated again; the others kept.
        let mut old_policies: BTreeMap<String, EndpointPolicy> =
            std::mem::take(&mut np.endpoints).into_iter().map(|p| (p.interface.clone(), p)).collect();
        // Filled per endpoint below (`Translator::endpoint` reports there).
        np.problems.clear();
        let cluster: Vec<&CompiledCnp> = self.cluster.values().map(|(c, _)| c).collect();
        self.extra.retain(|iface, _| resolved.contains_key(iface));
        let mut tr = Translator { snapshot, addresses, out: &mut *np, added: Some(Vec::new()), pending: Default::default() };
        for ep in &eps {
            let old = old_policies.remove(&ep.interface);
            let policy = match old {
                Some(p) if !dirty.contains(&ep.interface) => p,
                old => {
                    let policies: Vec<&CompiledPolicy> = self
                        .policies
                        .range(ObjectRef::new(ep.pod.namespace.clone(), "")..)
                        .take_while(|(k, _)| k.namespace == ep.pod.namespace)
                        .map(|(_, (c, _))| c)
                        .collect();
                    let mut selects = vec![false; cluster.len()];
                    let policy = tr.endpoint(ep, &policies, &cluster, &mut selects, &self.options);
                    let cluster_policies = cluster.iter().zip(&selects).filter(|(_, s)| **s).map(|(c, _)| c.name.clone()).collect();
                    let x = EndpointExtra {
                        pod: resolved.get(&ep.interface).cloned().flatten(),
                        problems: std::mem::take(&mut tr.out.problems),
                        cluster_policies,
                    };
                    self.extra.insert(ep.interface.clone(), x);
                    if old.as_ref() != Some(&policy) {
                        changed.endpoints.insert(ep.interface.clone());
                    }
                    policy
                }
            };
            tr.out.endpoints.push(policy);
        }
        // Endpoints that are gone.
        changed.endpoints.extend(old_policies.into_keys());

        tr.finish_sets();
        let added = tr.added.replace(Vec::new()).unwrap_or_default();
        // Node sets and the sets of every pod (whose ranges are the Nodes' pod CIDRs):
        // computed again (Nodes are few).
        if nodes_changed {
            let node_defs: Vec<PeerDef> =
                tr.out.peer_sets.keys().filter(|d| matches!(d, PeerDef::Nodes(_)) || PodRanges::serve(d)).cloned().collect();
            let before: Vec<_> = node_defs.iter().map(|def| tr.out.peer_sets.remove(def)).collect();
            for def in &node_defs {
                tr.peer_set(def);
            }
            tr.finish_sets();
            for (def, before) in node_defs.into_iter().zip(before) {
                if before.as_ref() != tr.out.peer_sets.get(&def) {
                    changed.peer_sets.insert(def);
                }
            }
        }
        for m in added {
            match m {
                PeerMatch::Addresses(d) => {
                    changed.peer_sets.insert(d);
                }
                PeerMatch::NamedPort(d) => {
                    changed.port_sets.insert(d);
                }
                PeerMatch::Any | PeerMatch::Domains(_) => {}
            }
        }
        if !touched_ips.is_empty() || !touched_pods.is_empty() {
            repair(snapshot, &tr.addresses, tr.out, &touched_ips, &touched_pods, &mut changed);
        }

        // Sets no rule refers to any more go (only a changed endpoint can stop referring to one).
        if !changed.endpoints.is_empty() {
            let (peer_refs, port_refs) = references(np);
            let (peer_refs, port_refs): (BTreeSet<PeerDef>, BTreeSet<NamedPortDef>) = (
                np.peer_sets.keys().filter(|d| !peer_refs.contains(d)).cloned().collect(),
                np.port_sets.keys().filter(|d| !port_refs.contains(d)).cloned().collect(),
            );
            for d in peer_refs {
                np.peer_sets.remove(&d);
                changed.peer_sets.insert(d);
            }
            for d in port_refs {
                np.port_sets.remove(&d);
                changed.port_sets.insert(d);
            }
        }

        // Problems: of the compiled NetworkPolicies (all in the endpoints' namespaces), of the
        // ClusterNetworkPolicies selecting a local pod, and the endpoints' own.
        let mut problems: Vec<PolicyProblem> = self.policies.values().flat_map(|(_, p)| p.iter().cloned()).collect();
        let selecting: BTreeSet<&String> = self.extra.values().flat_map(|x| &x.cluster_policies).collect();
        for name in selecting {
            if let Some((_, p)) = self.cluster.get(name) {
                problems.extend(p.iter().cloned());
            }
        }
        problems.extend(self.extra.values().flat_map(|x| x.problems.iter().cloned()));
        problems.sort();
        problems.dedup();
        np.problems = problems;
        // Few pods (a namespace's), looked at every time: resolvers come and go with pods.
        np.dns_resolvers = self.options.dns_resolvers.as_ref().map(|r| r.addresses(snapshot)).unwrap_or_default();
        np.overlay = self.options.overlay_port.map(|port| super::OverlayGuard::of(snapshot, port, self.options.overlay_node.as_deref()));

        self.idents = eps.iter().map(|e| e.interface.clone()).zip(idents).collect();
        self.eps = eps;
        self.changed = changed;
    }
}

/// The peer and named-port definitions the endpoints' rules refer to.
fn references<'a>(np: &'a NodePolicy) -> (BTreeSet<&'a PeerDef>, BTreeSet<&'a NamedPortDef>) {
    let (mut peers, mut ports): (BTreeSet<&'a PeerDef>, BTreeSet<&'a NamedPortDef>) = (BTreeSet::new(), BTreeSet::new());
    let mut note = |m: &'a PeerMatch| match m {
        PeerMatch::Any | PeerMatch::Domains(_) => {}
        PeerMatch::Addresses(d) => {
            peers.insert(d);
        }
        PeerMatch::NamedPort(d) => {
            ports.insert(d);
        }
    };
    for ep in &np.endpoints {
        for dir in [Direction::Ingress, Direction::Egress] {
            for m in ep.direction(dir).peers() {
                note(m);
            }
        }
    }
    (peers, ports)
}

/// Every pod-made set's entries for `ips` computed again from the pods reporting them (and
/// the `pods` whose membership may have changed). Correct because an address has at most one
/// owner and only the owners of `ips` can have changed.
fn repair(
    snapshot: &Snapshot,
    addresses: &Addresses<'_>,
    np: &mut NodePolicy,
    ips: &BTreeSet<IpAddr>,
    pods: &BTreeSet<String>,
    changed: &mut Changed,
) {
    // The pods that may own one of `ips`: those reporting it (a local pod reports its
    // endpoint's addresses), and the touched ones.
    let mut candidates: BTreeMap<&str, &Pod> = BTreeMap::new();
    for ip in ips {
        for p in snapshot.pods_with_ip(ip) {
            candidates.insert(&p.uid, p);
        }
        if let Some(Some(uid)) = addresses.local_owner(ip)
            && let Some(p) = snapshot.pod(uid)
        {
            candidates.insert(&p.uid, p);
        }
    }
    for uid in pods {
        if let Some(p) = snapshot.pod(uid) {
            candidates.insert(&p.uid, p);
        }
    }
    // Each candidate's owned addresses among `ips`.
    let owned: Vec<(&Pod, Vec<IpAddr>)> = candidates
        .into_values()
        .map(|p| (p, addresses.of(p).filter(|ip| ips.contains(ip)).collect::<Vec<_>>()))
        .filter(|(_, o)| !o.is_empty())
        .collect();

    // The set of every pod holds each address outside the pod ranges only (the ranges do
    // not change with pods).
    let ranges = np.peer_sets.keys().any(PodRanges::serve).then(|| PodRanges::of(snapshot));
    // A set is copied (it may be shared with a reader of an earlier translation) only when
    // it changes.
    for (def, set) in np.peer_sets.iter_mut() {
        if !matches!(def, PeerDef::Pods { .. }) {
            continue;
        }
        let ranges = ranges.as_ref().filter(|_| PodRanges::serve(def));
        let mut before: Vec<(IpNet, String)> = Vec::new();
        for ip in ips.iter().filter(|ip| !ranges.is_some_and(|r| r.contains(**ip))) {
            let net = IpNet::from(*ip);
            let held = match net {
                IpNet::V4(n) => set.v4.get(&n),
                IpNet::V6(n) => set.v6.get(&n),
            };
            if let Some(c) = held {
                before.push((net, c.clone()));
            }
        }
        let mut after: Vec<(IpNet, String)> = Vec::new();
        for (pod, own) in &owned {
            if selects(snapshot, def, pod) {
                let name = format!("{}/{}", pod.namespace, pod.name);
                for ip in own.iter().filter(|ip| !ranges.is_some_and(|r| r.contains(**ip))) {
                    after.push((IpNet::from(*ip), name.clone()));
                }
            }
        }
        after.sort();
        after.dedup_by(|a, b| a.0 == b.0);
        if before != after {
            let set = Arc::make_mut(set);
            for (net, _) in &before {
                match net {
                    IpNet::V4(n) => set.v4.remove(n),
                    IpNet::V6(n) => set.v6.remove(n),
                };
            }
            for (net, c) in &after {
                set.insert(*net, c);
            }
            changed.peer_sets.insert(def.clone());
        }
    }

    let (lo, hi) = (Protocol::ALL.iter().min().copied(), Protocol::ALL.iter().max().copied());
    let (Some(lo), Some(hi)) = (lo, hi) else { return };
    for (def, set) in np.port_sets.iter_mut() {
        let mut before: Vec<(IpAddr, Protocol, u16, String)> = Vec::new();
        for ip in ips {
            match ip {
                IpAddr::V4(a) => {
                    before.extend(set.v4.range((*a, lo, 0)..=(*a, hi, u16::MAX)).map(|(k, c)| (IpAddr::V4(k.0), k.1, k.2, c.clone())));
                }
                IpAddr::V6(a) => {
                    before.extend(set.v6.range((*a, lo, 0)..=(*a, hi, u16::MAX)).map(|(k, c)| (IpAddr::V6(k.0), k.1, k.2, c.clone())));
                }
            }
        }
        let mut after: Vec<(IpAddr, Protocol, u16, String)> = Vec::new();
        for (pod, own) in &owned {
            let member = match &def.dest {
                None => true,
                Some(PeerDef::Block(_)) => true,
                Some(PeerDef::Nodes(_)) => false,
                Some(d) => selects(snapshot, d, pod),
            };
            if !member {
                continue;
            }
            let name = format!("{}/{}", pod.namespace, pod.name);
            for cp in pod.ports.iter().filter(|cp| cp.protocol == def.protocol && cp.name.as_deref() == Some(def.name.as_str())) {
                for ip in own {
                    if let Some(PeerDef::Block(b)) = &def.dest
                        && !b.contains(*ip)
                    {
                        continue;
                    }
                    after.push((*ip, cp.protocol, cp.port, name.clone()));
                }
            }
        }
        after.sort();
        after.dedup_by(|a, b| (a.0, a.1, a.2) == (b.0, b.1, b.2));
        before.sort();
        if before != after {
            let set = Arc::make_mut(set);
            for (ip, p, port, _) in &before {
                match ip {
                    IpAddr::V4(a) => set.v4.remove(&(*a, *p, *port)),
                    IpAddr::V6(a) => set.v6.remove(&(*a, *p, *port)),
                };
            }
            for (ip, p, port, c) in &after {
                set.insert(*ip, *p, *port, c);
            }
            changed.port_sets.insert(def.clone());
        }
    }
}

/// Whether a pod peer definition selects `pod` (its addresses aside).
fn selects(snapshot: &Snapshot, def: &PeerDef, pod: &Pod) -> bool {
    let PeerDef::Pods { namespaces, pods } = def else { return false };
    let in_scope = match namespaces {
        NsScope::Named(n) => pod.namespace == *n,
        NsScope::Matching(sel) => snapshot.namespace(&pod.namespace).is_some_and(|ns| sel.matches(&ns.labels)),
    };
    in_scope && pods.as_ref().is_none_or(|s| s.matches(&pod.labels))
}
