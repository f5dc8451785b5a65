//! Stage 2, pure: NetworkPolicy v1 semantics → per-endpoint allow rules ([`NodePolicy`]).
//!
//! A pure function of (snapshot, this node's endpoints, options): no I/O, no clock, no
//! process, no async runtime, and only ordered collections, so equal input gives equal output.
//! The `purity` test keeps it that way.
//!
//! Semantics (Kubernetes NetworkPolicy v1, exactly):
//! - A pod is isolated for a direction iff some policy selecting it has that direction in its
//!   `policyTypes` (defaulted: Ingress always; Egress iff `egress` is non-empty). What an
//!   isolated pod allows is the union of the rules of every policy selecting it.
//! - Empty `from`/`to` means every peer; empty `ports` means every port of every protocol.
//! - Peers: `podSelector` (the policy's namespace), `namespaceSelector`, both (AND), or
//!   `ipBlock` with `except` (which matches pod addresses too).
//! - Ports: protocol defaults to TCP; `endPort` ranges; named ports resolve on the
//!   *destination* pod's container ports by name and protocol: for ingress the local pod, for
//!   egress each peer pod (so egress named ports become (address, protocol, port) sets).
//! - Peers are pods that have an address, are not terminal and are not host-networked
//!   ([`Pod::is_peer`]). Host-networked pods are never isolated by flock either: they have no
//!   flock endpoint (the runtime does not call CNI for them).
//! - A connection is allowed iff the source's egress allows it and the destination's ingress
//!   allows it; each node enforces the directions of its own pods.
//!
//! Policies the API server would reject are handled as [`compile`] describes.

pub mod compile;
pub mod ir;
pub mod selector;

use std::collections::BTreeMap;

pub use compile::{CompiledPolicy, PolicyProblem, PortSpec};
pub use ir::*;

use crate::model::{LocalEndpoint, ObjectRef, Pod, Snapshot};

/// The label that marks a pod of a sandboxed run (see [`Options::isolate_run_pods`]).
pub const RUN_LABEL: &str = "flock.dev/run";

/// Translator switches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Pods labelled [`RUN_LABEL`] are egress-isolated even while no policy selects them, so
    /// a run's pod that starts before its per-run policy exists is closed, not open.
    pub isolate_run_pods: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self { isolate_run_pods: true }
    }
}

/// Translates the snapshot into what this node enforces for `endpoints`.
pub fn translate(snapshot: &Snapshot, endpoints: &[LocalEndpoint], options: &Options) -> NodePolicy {
    let mut tr = Translator { snapshot, out: NodePolicy::default(), compiled: BTreeMap::new() };

    // Only policies in namespaces with a local pod can select one.
    let mut problems = Vec::new();
    for ep in endpoints {
        let ns = ep.pod.namespace.as_str();
        if !tr.compiled.contains_key(ns) {
            let policies: Vec<CompiledPolicy> = snapshot.policies_in(ns).map(|p| compile::compile(p, &mut problems)).collect();
            tr.compiled.insert(ns.to_string(), policies);
        }
    }
    problems.sort();
    problems.dedup();
    tr.out.problems = problems;

    let mut eps: Vec<&LocalEndpoint> = endpoints.iter().collect();
    eps.sort_by(|a, b| a.interface.cmp(&b.interface));
    eps.dedup_by(|a, b| a.interface == b.interface);
    for ep in eps {
        let policy = tr.endpoint(ep, options);
        tr.out.endpoints.push(policy);
    }
    tr.out
}

/// Validates every policy in the snapshot (for tools that report on all of them).
pub fn validate_all(snapshot: &Snapshot) -> Vec<PolicyProblem> {
    let mut problems = Vec::new();
    for p in snapshot.policies() {
        compile::compile(p, &mut problems);
    }
    problems
}

struct Translator<'a> {
    snapshot: &'a Snapshot,
    out: NodePolicy,
    compiled: BTreeMap<String, Vec<CompiledPolicy>>,
}

impl Translator<'_> {
    /// The pod an endpoint belongs to: by uid when the runtime gave one (and it agrees on the
    /// name), else the live pod with that namespace/name.
    fn pod_of(&self, ep: &LocalEndpoint) -> Option<&Pod> {
        match &ep.pod_uid {
            Some(uid) => self.snapshot.pod(uid).filter(|p| p.namespace == ep.pod.namespace && p.name == ep.pod.name),
            None => self.snapshot.pod_by_name(&ep.pod),
        }
    }

    fn endpoint(&mut self, ep: &LocalEndpoint, options: &Options) -> EndpointPolicy {
        let mut policy = EndpointPolicy {
            interface: ep.interface.clone(),
            pod: ep.pod.clone(),
            addrs: ep.addrs.clone(),
            ingress: DirectionPolicy::default(),
            egress: DirectionPolicy::default(),
        };
        let Some(pod) = self.pod_of(ep).cloned() else {
            policy.ingress.isolated_by.push(Isolation::UnknownPod);
            policy.egress.isolated_by.push(Isolation::UnknownPod);
            return policy;
        };
        if options.isolate_run_pods && pod.labels.contains_key(RUN_LABEL) {
            policy.egress.isolated_by.push(Isolation::RunPod);
        }
        let selecting: Vec<CompiledPolicy> =
            self.compiled.get(&pod.namespace).into_iter().flatten().filter(|c| c.selector.matches(&pod.labels)).cloned().collect();
        for dir in [Direction::Ingress, Direction::Egress] {
            let mut rules = RuleList::default();
            let mut isolated_by = Vec::new();
            for c in selecting.iter().filter(|c| c.affects(dir)) {
                isolated_by.push(Isolation::Policy(c.key.clone()));
                for rule in c.rules(dir) {
                    self.rule(&pod, &c.key, dir, rule, &mut rules);
                }
            }
            let slot = match dir {
                Direction::Ingress => &mut policy.ingress,
                Direction::Egress => &mut policy.egress,
            };
            slot.isolated_by.extend(isolated_by);
            slot.rules = rules.rules;
        }
        policy
    }

    /// Expands one policy rule into allow rules for `pod` (the local pod).
    fn rule(&mut self, pod: &Pod, policy: &ObjectRef, dir: Direction, rule: &compile::CompiledRule, out: &mut RuleList) {
        let origin = RuleOrigin { policy: policy.clone(), direction: dir, index: rule.index };
        let peers: Vec<Option<&PeerDef>> = match &rule.peers {
            None => vec![None],
            Some(defs) => defs.iter().map(Some).collect(),
        };
        for peer in peers {
            let Some(specs) = &rule.ports else {
                let m = self.peer_match(peer);
                out.push(m, PortMatch::Any, &origin);
                continue;
            };
            let mut by_protocol: BTreeMap<crate::model::Protocol, Vec<(u16, u16)>> = BTreeMap::new();
            let mut all_of = Vec::new();
            for spec in specs {
                match spec {
                    PortSpec::AllOf(p) => all_of.push(*p),
                    PortSpec::Range(p, s, e) => by_protocol.entry(*p).or_default().push((*s, *e)),
                    PortSpec::Named(p, name) => match dir {
                        // Ingress: the destination is the local pod.
                        Direction::Ingress => {
                            for cp in pod.ports.iter().filter(|cp| cp.protocol == *p && cp.name.as_deref() == Some(name.as_str())) {
                                by_protocol.entry(*p).or_default().push((cp.port, cp.port));
                            }
                        }
                        // Egress: each destination pod has its own number for the name.
                        Direction::Egress => {
                            let def = NamedPortDef { dest: peer.cloned(), protocol: *p, name: name.clone() };
                            self.named_port_set(&def);
                            out.push(PeerMatch::NamedPort(def), PortMatch::Any, &origin);
                        }
                    },
                }
            }
            for p in &all_of {
                by_protocol.insert(*p, vec![(1, u16::MAX)]);
            }
            for (p, ranges) in by_protocol {
                let m = self.peer_match(peer);
                out.push(m, PortMatch::Protocol(p, PortRanges::from_ranges(ranges)), &origin);
            }
        }
    }

    fn peer_match(&mut self, peer: Option<&PeerDef>) -> PeerMatch {
        match peer {
            None => PeerMatch::Any,
            Some(def) => {
                self.peer_set(def);
                PeerMatch::Addresses(def.clone())
            }
        }
    }

    /// Computes (once) the addresses of `def`.
    fn peer_set(&mut self, def: &PeerDef) {
        if self.out.peer_sets.contains_key(def) {
            return;
        }
        let mut set = AddressSet::default();
        match def {
            PeerDef::Block(b) => {
                let comment = format!("ipBlock {}", b.cidr);
                for net in b.prefixes() {
                    set.insert(net, &comment);
                }
            }
            PeerDef::Pods { .. } => {
                for pod in pods_of(self.snapshot, def) {
                    let name = format!("{}/{}", pod.namespace, pod.name);
                    for ip in &pod.ips {
                        set.insert(ipnet::IpNet::from(*ip), &name);
                    }
                }
            }
        }
        self.out.peer_sets.insert(def.clone(), set);
    }

    /// Computes (once) the (address, protocol, port) triples of `def`.
    fn named_port_set(&mut self, def: &NamedPortDef) {
        if self.out.port_sets.contains_key(def) {
            return;
        }
        let mut set = PortAddressSet::default();
        let candidates: Vec<&Pod> = match &def.dest {
            None => self.snapshot.pods().filter(|p| p.is_peer()).collect(),
            Some(dest) => pods_of(self.snapshot, dest),
        };
        for pod in candidates {
            let name = format!("{}/{}", pod.namespace, pod.name);
            for cp in pod.ports.iter().filter(|cp| cp.protocol == def.protocol && cp.name.as_deref() == Some(def.name.as_str())) {
                for ip in &pod.ips {
                    if let Some(PeerDef::Block(b)) = &def.dest
                        && !b.contains(*ip)
                    {
                        continue;
                    }
                    set.insert(*ip, cp.protocol, cp.port, &name);
                }
            }
        }
        self.out.port_sets.insert(def.clone(), set);
    }
}

/// The peer pods a definition selects. For an ipBlock: the pods with an address inside it.
fn pods_of<'s>(snapshot: &'s Snapshot, def: &PeerDef) -> Vec<&'s Pod> {
    match def {
        PeerDef::Block(b) => snapshot.pods().filter(|p| p.is_peer() && p.ips.iter().any(|ip| b.contains(*ip))).collect(),
        PeerDef::Pods { namespaces, pods } => {
            let matches = |p: &Pod| p.is_peer() && pods.as_ref().is_none_or(|s| s.matches(&p.labels));
            match namespaces {
                NsScope::Named(ns) => snapshot.pods_in(ns).filter(|p| matches(p)).collect(),
                NsScope::Matching(sel) => snapshot
                    .namespaces()
                    .filter(|ns| sel.matches(&ns.labels))
                    .flat_map(|ns| snapshot.pods_in(&ns.name))
                    .filter(|p| matches(p))
                    .collect(),
            }
        }
    }
}

/// Allow rules of one direction, de-duplicated: an identical rule from another policy only
/// adds its origin.
#[derive(Default)]
struct RuleList {
    rules: Vec<AllowRule>,
    index: BTreeMap<(PeerMatch, PortMatch), usize>,
}

impl RuleList {
    fn push(&mut self, peer: PeerMatch, ports: PortMatch, origin: &RuleOrigin) {
        let key = (peer, ports);
        if let Some(&i) = self.index.get(&key) {
            if !self.rules[i].origins.contains(origin) {
                self.rules[i].origins.push(origin.clone());
            }
            return;
        }
        self.index.insert(key.clone(), self.rules.len());
        self.rules.push(AllowRule { peer: key.0, ports: key.1, origins: vec![origin.clone()] });
    }
}

#[cfg(test)]
mod tests;
