//! The reference evaluator: the verdict for one flow, read straight from the API text.
//!
//! NetworkPolicy v1 (`k8s.io/api/networking/v1/types.go` and the NetworkPolicy concept page)
//! and ClusterNetworkPolicy v1alpha2 (network-policy-api `clusternetworkpolicy_types.go`),
//! plus flock's documented readings where the API leaves a choice or says nothing (docs/policy.md,
//! "Fail closed" and "ClusterNetworkPolicy"): what an invalid object means, the tie-break of
//! equal priorities, run pods without a policy. It walks every policy for every flow — no
//! sets, no indexes, no canonical forms — and shares no code with `translate/` or `render/`
//! (only the model types), so the differential test and fuzz target that compare it with the
//! rendered ruleset (through the packet tracer) check the pipeline against an independent
//! reading of the specification. Its validation of selectors, CIDRs and ports is therefore
//! written again here, from the API server's rules, on purpose.
//!
//! Test support only (feature `testkit`): O(policies × pods) per flow.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::cnp::{ClusterNetworkPolicy, CnpPeer, CnpPods, CnpPort, CnpProtocol, CnpRule, CnpSubject};
use crate::model::{
    Family, LabelSelector, Labels, NetworkPolicy, ObjectRef, Pod, PolicyPeer, PolicyPort, PolicyRule, PortRef, Protocol, RUN_LABEL,
    Snapshot,
};

/// One end of a flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// A pod, by `namespace/name`: its address of the flow's family.
    Pod(ObjectRef),
    /// An address (a node, a network outside the cluster, an address no live pod owns).
    Address(IpAddr),
}

/// A new connection: source, destination, transport and destination port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    pub from: End,
    pub to: End,
    pub protocol: Protocol,
    pub port: u16,
    pub family: Family,
}

/// The verdict and, per direction, what decided it (`None`: nothing enforces that end).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    pub egress: Option<(bool, String)>,
    pub ingress: Option<(bool, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    Ingress,
    Egress,
}

/// The verdict for `flow`. `Err` when the flow names a pod that does not exist or has no
/// address of the family.
pub fn evaluate(s: &Snapshot, flow: &Flow) -> Result<Verdict, String> {
    Evaluator::new(s).evaluate(flow)
}

/// Evaluates flows on one snapshot. The API server's rules (which policy, rule and selector
/// is valid) are checked once per policy here, by the same functions, and their answers
/// kept: they are what every flow asks first, and they do not depend on the flow.
pub(crate) struct Evaluator<'s> {
    s: &'s Snapshot,
    valid: Validity<'s>,
}

/// Whether a policy's selector (podSelector, subject) is valid, and each of its ingress and
/// egress rules.
type PolicyValidity = (bool, Vec<bool>, Vec<bool>);

/// What the API server's rules say of each policy of a snapshot.
struct Validity<'s> {
    /// NetworkPolicies by namespace and name.
    np: BTreeMap<(&'s str, &'s str), PolicyValidity>,
    /// ClusterNetworkPolicies by name (a rule is judged as a rule of its direction).
    cnp: BTreeMap<&'s str, PolicyValidity>,
}

impl<'s> Evaluator<'s> {
    pub(crate) fn new(s: &'s Snapshot) -> Self {
        let np = s
            .policies()
            .map(|p| {
                let rules = |rs: &[PolicyRule]| rs.iter().map(np_rule_valid).collect();
                ((p.namespace.as_str(), p.name.as_str()), (selector_valid(&p.pod_selector), rules(&p.ingress), rules(&p.egress)))
            })
            .collect();
        let cnp = s
            .cluster_policies()
            .map(|c| {
                let rules = |rs: &[CnpRule], dir| rs.iter().map(|r| cnp_rule_valid(r, dir, &c.tier)).collect();
                (c.name.as_str(), (subject_valid(&c.subject), rules(&c.ingress, Dir::Ingress), rules(&c.egress, Dir::Egress)))
            })
            .collect();
        Self { s, valid: Validity { np, cnp } }
    }

    /// The verdict for `flow` (see [`evaluate`]).
    pub(crate) fn evaluate(&self, flow: &Flow) -> Result<Verdict, String> {
        let s = self.s;
        let (src_addr, src_pod) = resolve(s, &flow.from, flow.family)?;
        let (dst_addr, dst_pod) = resolve(s, &flow.to, flow.family)?;
        let f = Transport { protocol: flow.protocol, port: flow.port };
        // Each end that is a pod flock enforces applies its own direction; the other end is
        // the peer, known by its address (and the pod that owns it, if any).
        let egress = src_pod.filter(|p| enforced(p)).map(|p| self.direction(p, Dir::Egress, dst_addr, owner(s, dst_addr), f));
        // What a pod's own node sends it (kubelet probes) is not policed (docs/policy.md, "Traffic
        // to the node and host-network pods"): the Kubernetes documentation's limit, and flock's.
        let from_own_node = |p: &Pod| {
            p.node.as_deref().and_then(|n| s.node(n)).is_some_and(|n| n.addresses.contains(&src_addr) || n.internal_ips.contains(&src_addr))
        };
        let ingress =
            dst_pod.filter(|p| enforced(p) && !from_own_node(p)).map(|p| self.direction(p, Dir::Ingress, src_addr, owner(s, src_addr), f));
        let allowed = egress.as_ref().is_none_or(|e| e.0) && ingress.as_ref().is_none_or(|i| i.0);
        Ok(Verdict { allowed, egress, ingress })
    }
}

#[derive(Debug, Clone, Copy)]
struct Transport {
    protocol: Protocol,
    port: u16,
}

fn resolve<'s>(s: &'s Snapshot, end: &End, family: Family) -> Result<(IpAddr, Option<&'s Pod>), String> {
    match end {
        End::Address(a) => Ok((*a, owner(s, *a))),
        End::Pod(key) => {
            let pod =
                s.pods().find(|p| p.namespace == key.namespace && p.name == key.name && live(p)).ok_or(format!("no live pod {key}"))?;
            // A host-network pod is its node: its addresses are the node's.
            let node_ips = || pod.node.as_deref().and_then(|n| s.node(n)).map(|n| n.internal_ips.clone()).unwrap_or_default();
            let ips = if pod.host_network && pod.ips.is_empty() { node_ips() } else { pod.ips.clone() };
            let addr =
                ips.iter().copied().find(|ip| Family::of(*ip) == family).ok_or(format!("{key} has no {} address", family.as_str()))?;
            Ok((addr, Some(pod)))
        }
    }
}

/// Running or about to: not Succeeded or Failed.
fn live(p: &Pod) -> bool {
    !p.phase.is_terminal()
}

/// A pod NetworkPolicy can name as a peer: live, on the pod network, with an address.
fn eligible(p: &Pod) -> bool {
    live(p) && !p.host_network && !p.ips.is_empty()
}

/// A pod flock enforces: an eligible pod scheduled on a node (the runtime called flock-cni).
fn enforced(p: &Pod) -> bool {
    eligible(p) && p.node.is_some()
}

/// The pod an address belongs to: the eligible pod reporting it; of several, the newest.
fn owner(s: &Snapshot, addr: IpAddr) -> Option<&Pod> {
    s.pods().filter(|p| eligible(p) && p.ips.contains(&addr)).max_by(|a, b| (a.created, &a.uid).cmp(&(b.created, &b.uid)))
}

impl Evaluator<'_> {
    /// What `pod` decides in `dir` about the peer at `addr` (owned by `peer`).
    fn direction(&self, pod: &Pod, dir: Dir, addr: IpAddr, peer: Option<&Pod>, f: Transport) -> (bool, String) {
        let s = self.s;
        let ctx = Ctx { s, valid: &self.valid, pod, dir, addr, peer, f };
        // NetworkPolicies of the pod's namespace that select it and have this direction.
        let isolating: Vec<&NetworkPolicy> =
            s.policies().filter(|p| p.namespace == pod.namespace && ctx.np_selects(p) && np_has_direction(p, dir)).collect();
        if dir == Dir::Egress && pod.labels.contains_key(RUN_LABEL) && isolating.is_empty() {
            return (false, "run pod without an egress NetworkPolicy (flock's own isolation)".into());
        }
        match ctx.tier("Admin") {
            Some((Action::Accept, why)) => return (true, why),
            Some((Action::Deny, why)) => return (false, why),
            Some((Action::Pass, _)) | None => {}
        }
        if !isolating.is_empty() {
            for p in &isolating {
                if let Some(i) = ctx.np_allows(p) {
                    return (true, format!("NetworkPolicy {}/{} rule {i}", p.namespace, p.name));
                }
            }
            let names: Vec<String> = isolating.iter().map(|p| format!("{}/{}", p.namespace, p.name)).collect();
            return (false, format!("isolated by {} and no rule allows it", names.join(", ")));
        }
        match ctx.tier("Baseline") {
            Some((Action::Deny, why)) => (false, why),
            Some((_, why)) => (true, why),
            None => (true, "default: not isolated".into()),
        }
    }
}

// --- NetworkPolicy ---------------------------------------------------------------------------

/// `policyTypes`: absent means Ingress, plus Egress when there are egress rules; an entry
/// that is neither Ingress nor Egress isolates both directions.
fn np_has_direction(p: &NetworkPolicy, dir: Dir) -> bool {
    if p.policy_types.is_empty() {
        return dir == Dir::Ingress || !p.egress.is_empty();
    }
    p.policy_types.iter().any(|t| match t.as_str() {
        "Ingress" => dir == Dir::Ingress,
        "Egress" => dir == Dir::Egress,
        _ => true,
    })
}

fn np_rule_valid(r: &PolicyRule) -> bool {
    r.peers.iter().all(np_peer_valid) && r.ports.iter().all(np_port_valid)
}

fn np_peer_valid(p: &PolicyPeer) -> bool {
    match (&p.pod_selector, &p.namespace_selector, &p.ip_block) {
        (None, None, None) => false,
        (None, None, Some(b)) => match cidr(&b.cidr) {
            Some(net) => b.except.iter().all(|e| cidr(e).is_some_and(|x| net.contains(&x) && x.prefix_len() > net.prefix_len())),
            None => false,
        },
        (_, _, Some(_)) => false,
        (pods, namespaces, None) => pods.as_ref().is_none_or(selector_valid) && namespaces.as_ref().is_none_or(selector_valid),
    }
}

fn np_port_valid(p: &PolicyPort) -> bool {
    let protocol_ok = p.protocol.as_deref().is_none_or(|s| protocol(s).is_some());
    let port_ok = match (&p.port, p.end_port) {
        (None, None) => true,
        (None, Some(_)) => false,
        (Some(PortRef::Number(n)), end) => (1..=65535).contains(n) && end.is_none_or(|e| e >= *n && e <= 65535),
        (Some(PortRef::Name(name)), None) => port_name_valid(name),
        (Some(PortRef::Name(_)), Some(_)) => false,
    };
    protocol_ok && port_ok
}

fn protocol(s: &str) -> Option<Protocol> {
    match s {
        "TCP" => Some(Protocol::Tcp),
        "UDP" => Some(Protocol::Udp),
        "SCTP" => Some(Protocol::Sctp),
        _ => None,
    }
}

struct Ctx<'a> {
    s: &'a Snapshot,
    valid: &'a Validity<'a>,
    pod: &'a Pod,
    dir: Dir,
    addr: IpAddr,
    peer: Option<&'a Pod>,
    f: Transport,
}

impl<'a> Ctx<'a> {
    /// `p`'s validity: its podSelector's, and its rules' in this direction.
    fn np_valid(&self, p: &'a NetworkPolicy) -> (bool, &'a [bool]) {
        match self.valid.np.get(&(p.namespace.as_str(), p.name.as_str())) {
            Some((selector, ingress, egress)) => (*selector, if self.dir == Dir::Ingress { ingress } else { egress }),
            None => (false, &[]),
        }
    }

    /// An invalid `podSelector` selects every pod of the namespace (and the policy allows
    /// nothing: see [`Self::np_allows`]).
    fn np_selects(&self, p: &'a NetworkPolicy) -> bool {
        !self.np_valid(p).0 || selector_matches(&p.pod_selector, &self.pod.labels)
    }

    /// The index of the first rule of `p` that admits the flow. A policy with an invalid
    /// `podSelector` admits nothing; an invalid rule admits nothing.
    fn np_allows(&self, p: &'a NetworkPolicy) -> Option<usize> {
        let (selector, valid) = self.np_valid(p);
        if !selector {
            return None;
        }
        let rules = match self.dir {
            Dir::Ingress => &p.ingress,
            Dir::Egress => &p.egress,
        };
        rules.iter().enumerate().position(|(i, r)| valid.get(i).copied().unwrap_or(false) && self.np_rule_matches(p, r))
    }

    /// `c`'s validity: its subject's, and its rules' in this direction.
    fn cnp_valid(&self, c: &'a ClusterNetworkPolicy) -> (bool, &'a [bool]) {
        match self.valid.cnp.get(c.name.as_str()) {
            Some((subject, ingress, egress)) => (*subject, if self.dir == Dir::Ingress { ingress } else { egress }),
            None => (false, &[]),
        }
    }

    fn np_rule_matches(&self, p: &NetworkPolicy, r: &PolicyRule) -> bool {
        let peer_ok = r.peers.is_empty() || r.peers.iter().any(|peer| self.np_peer_matches(p, peer));
        let port_ok = r.ports.is_empty() || r.ports.iter().any(|port| self.np_port_matches(port));
        peer_ok && port_ok
    }

    fn np_peer_matches(&self, p: &NetworkPolicy, peer: &PolicyPeer) -> bool {
        if let Some(b) = &peer.ip_block {
            let Some(net) = cidr(&b.cidr) else { return false };
            return net.contains(&self.addr) && !b.except.iter().filter_map(|e| cidr(e)).any(|x| x.contains(&self.addr));
        }
        if peer.namespace_selector.as_ref().is_some_and(empty) && peer.pod_selector.as_ref().is_none_or(empty) && self.in_pod_range() {
            return true;
        }
        let Some(q) = self.peer else { return false };
        let ns_ok = match &peer.namespace_selector {
            None => q.namespace == p.namespace,
            Some(sel) => self.s.namespace(&q.namespace).is_some_and(|ns| selector_matches(sel, &ns.labels)),
        };
        ns_ok && peer.pod_selector.as_ref().is_none_or(|sel| selector_matches(sel, &q.labels))
    }

    fn np_port_matches(&self, port: &PolicyPort) -> bool {
        let proto = port.protocol.as_deref().and_then(protocol).unwrap_or(Protocol::Tcp);
        if proto != self.f.protocol {
            return false;
        }
        match &port.port {
            None => true,
            Some(PortRef::Number(n)) => {
                let end = port.end_port.unwrap_or(*n);
                (*n..=end).contains(&i32::from(self.f.port))
            }
            Some(PortRef::Name(name)) => self.named_port(name),
        }
    }

    /// Whether the destination pod (ingress: this pod; egress: the peer, which must be a pod)
    /// declares a container port named `name` with the flow's protocol and port.
    fn named_port(&self, name: &str) -> bool {
        let dest = match self.dir {
            Dir::Ingress => Some(self.pod),
            Dir::Egress => self.peer,
        };
        dest.is_some_and(|d| {
            d.ports.iter().any(|cp| cp.name.as_deref() == Some(name) && cp.protocol == self.f.protocol && cp.port == self.f.port)
        })
    }

    // --- ClusterNetworkPolicy ----------------------------------------------------------------

    /// The decision of one tier (`Admin` or `Baseline`): priorities ascending (a policy
    /// flock cannot place first in Admin); within a policy, its first matching rule; among
    /// policies of equal priority, Deny over Pass over Accept. `None`: no rule matched.
    fn tier(&self, tier: &str) -> Option<(Action, String)> {
        let mut candidates: Vec<(Option<i64>, &ClusterNetworkPolicy, bool)> = Vec::new();
        for c in self.s.cluster_policies() {
            let placed = matches!(c.tier.as_str(), "Admin" | "Baseline") && c.priority.is_some_and(|p| (0..=1000).contains(&p));
            let subject_ok = self.cnp_valid(c).0;
            let degraded = !placed || !subject_ok;
            let (its_tier, priority) = if placed { (c.tier.as_str(), c.priority) } else { ("Admin", None) };
            if its_tier != tier {
                continue;
            }
            // An unreadable subject selects every pod.
            if subject_ok && !self.subject_selects(&c.subject) {
                continue;
            }
            candidates.push((priority, c, degraded));
        }
        candidates.sort_by_key(|(p, _, _)| *p);
        let mut i = 0;
        while i < candidates.len() {
            let priority = candidates[i].0;
            let group: Vec<_> = candidates[i..].iter().take_while(|(p, _, _)| *p == priority).collect();
            i += group.len();
            let mut best: Option<(Action, String)> = None;
            for (_, c, degraded) in group {
                if let Some((action, why)) = self.first_match(c, *degraded) {
                    let rank = |a: Action| match a {
                        Action::Deny => 0,
                        Action::Pass => 1,
                        Action::Accept => 2,
                    };
                    if best.as_ref().is_none_or(|(b, _)| rank(action) < rank(*b)) {
                        best = Some((action, why));
                    }
                }
            }
            if best.is_some() {
                return best;
            }
        }
        None
    }

    /// The action of the first rule of `c` (this direction) that matches the flow, as flock
    /// reads it: a rule it cannot read matches nothing if it accepts and everything, as a
    /// Deny, if it denies or passes (the API's words for peers, extended to every field);
    /// in a policy that cannot be placed or whose subject is unreadable, Accept matches
    /// nothing and Pass denies.
    fn first_match(&self, c: &ClusterNetworkPolicy, degraded: bool) -> Option<(Action, String)> {
        let rules = match self.dir {
            Dir::Ingress => &c.ingress,
            Dir::Egress => &c.egress,
        };
        let valid = self.cnp_valid(c).1;
        for (i, r) in rules.iter().enumerate() {
            let why = |a: Action| format!("ClusterNetworkPolicy {} ({}) rule {i}: {a:?}", c.name, c.tier);
            let action = match r.action.as_str() {
                "Accept" => Action::Accept,
                "Deny" => Action::Deny,
                "Pass" => Action::Pass,
                _ => return Some((Action::Deny, why(Action::Deny))),
            };
            let readable = valid.get(i).copied().unwrap_or(false);
            let effective = match (action, degraded) {
                (Action::Accept, true) => continue,
                (Action::Pass, true) => Action::Deny,
                (a, _) => a,
            };
            if !readable {
                if effective == Action::Accept {
                    continue;
                }
                return Some((Action::Deny, why(Action::Deny)));
            }
            if self.cnp_rule_matches(r) {
                return Some((effective, why(effective)));
            }
        }
        None
    }

    fn subject_selects(&self, subject: &CnpSubject) -> bool {
        // A pod whose Namespace object is unknown has no namespace labels to match.
        let Some(ns) = self.s.namespace(&self.pod.namespace) else { return false };
        match subject {
            CnpSubject::Namespaces(sel) => selector_matches(sel, &ns.labels),
            CnpSubject::Pods(p) => {
                p.namespace_selector.as_ref().is_none_or(|n| selector_matches(n, &ns.labels))
                    && selector_matches(&p.pod_selector, &self.pod.labels)
            }
            CnpSubject::Invalid(_) => true,
        }
    }

    fn cnp_rule_matches(&self, r: &CnpRule) -> bool {
        let peer_ok = r.peers.iter().any(|p| self.cnp_peer_matches(p));
        let port_ok = match &r.protocols {
            None => true,
            Some(list) => list.iter().any(|p| {
                let (proto, port) = match p {
                    CnpProtocol::Tcp(port) => (Protocol::Tcp, port),
                    CnpProtocol::Udp(port) => (Protocol::Udp, port),
                    CnpProtocol::Sctp(port) => (Protocol::Sctp, port),
                    CnpProtocol::NamedPort(name) => return self.named_port(name),
                    CnpProtocol::Invalid(_) => return false,
                };
                proto == self.f.protocol && port_range(port).is_some_and(|(s, e)| (s..=e).contains(&self.f.port))
            }),
        };
        peer_ok && port_ok
    }

    fn cnp_peer_matches(&self, p: &CnpPeer) -> bool {
        match p {
            CnpPeer::Namespaces(sel) if empty(sel) && self.in_pod_range() => true,
            CnpPeer::Pods(pods)
                if pods.namespace_selector.as_ref().is_none_or(empty) && empty(&pods.pod_selector) && self.in_pod_range() =>
            {
                true
            }
            CnpPeer::Namespaces(sel) => self.peer_namespace().is_some_and(|(_, ns)| selector_matches(sel, ns)),
            CnpPeer::Pods(pods) => self.peer_namespace().is_some_and(|(q, ns)| {
                pods.namespace_selector.as_ref().is_none_or(|n| selector_matches(n, ns)) && selector_matches(&pods.pod_selector, &q.labels)
            }),
            CnpPeer::Networks(nets) => nets.iter().filter_map(|n| cidr(n)).any(|n| n.contains(&self.addr)),
            CnpPeer::Nodes(sel) => self.s.nodes().any(|n| selector_matches(sel, &n.labels) && n.addresses.contains(&self.addr)),
            // The addresses a domain name stands for come from DNS answers at run time: none
            // here (the ruleset's sets start empty too).
            CnpPeer::DomainNames(_) | CnpPeer::Invalid(_) => false,
        }
    }

    /// flock's reading of a peer of every pod in every namespace (docs/policy.md, "Every
    /// pod"): it also holds each address inside a Node's pod CIDR (one of at least /16 in
    /// IPv4, /48 in IPv6) that is no node's, whether a live pod holds it or not.
    fn in_pod_range(&self) -> bool {
        let narrow_enough = |c: &IpNet| c.prefix_len() >= if c.addr().is_ipv4() { 16 } else { 48 };
        self.s.nodes().any(|n| n.pod_cidrs.iter().any(|c| narrow_enough(c) && c.contains(&self.addr)))
            && !self.s.nodes().any(|n| n.internal_ips.contains(&self.addr) || n.addresses.contains(&self.addr))
    }

    /// The peer pod and its namespace's labels (a pod whose Namespace is unknown matches no
    /// namespace selector).
    fn peer_namespace(&self) -> Option<(&Pod, &Labels)> {
        let q = self.peer?;
        let ns = self.s.namespace(&q.namespace)?;
        Some((q, &ns.labels))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Accept,
    Deny,
    Pass,
}

/// Whether a ClusterNetworkPolicy rule of direction `dir`, in a policy of tier `tier`, is
/// one flock can read.
fn cnp_rule_valid(r: &CnpRule, dir: Dir, tier: &str) -> bool {
    if r.peers.is_empty() {
        return false;
    }
    let mut addresses_only = false;
    for p in &r.peers {
        let ok = match p {
            CnpPeer::Namespaces(sel) => selector_valid(sel),
            CnpPeer::Pods(p) => pods_valid(p),
            CnpPeer::Networks(nets) => {
                addresses_only = true;
                dir == Dir::Egress && !nets.is_empty() && nets.iter().all(|n| cidr(n).is_some())
            }
            CnpPeer::Nodes(sel) => {
                addresses_only = true;
                dir == Dir::Egress && selector_valid(sel)
            }
            // NPEP-133: egress only; flock reads them in Accept rules of the Admin tier
            // alone (docs/policy.md, "Egress by domain name"), anything else fails closed.
            CnpPeer::DomainNames(names) => {
                addresses_only = true;
                dir == Dir::Egress && tier == "Admin" && r.action == "Accept" && !names.is_empty() && names.iter().all(|n| domain_name(n))
            }
            CnpPeer::Invalid(_) => false,
        };
        if !ok {
            return false;
        }
    }
    match &r.protocols {
        None => true,
        Some(list) => {
            !list.is_empty()
                && list.iter().all(|p| match p {
                    CnpProtocol::Tcp(port) | CnpProtocol::Udp(port) | CnpProtocol::Sctp(port) => port_range(port).is_some(),
                    CnpProtocol::NamedPort(name) => !addresses_only && port_name_valid(name),
                    CnpProtocol::Invalid(_) => false,
                })
        }
    }
}

fn subject_valid(s: &CnpSubject) -> bool {
    match s {
        CnpSubject::Namespaces(sel) => selector_valid(sel),
        CnpSubject::Pods(p) => pods_valid(p),
        CnpSubject::Invalid(_) => false,
    }
}

fn pods_valid(p: &CnpPods) -> bool {
    p.namespace_selector.as_ref().is_none_or(selector_valid) && selector_valid(&p.pod_selector)
}

/// `destinationPort`: a number, or a range with start < end (the API's CEL rule), 1–65535.
fn port_range(p: &CnpPort) -> Option<(u16, u16)> {
    let port = |n: i64| u16::try_from(n).ok().filter(|n| *n > 0);
    match p {
        CnpPort::Number(n) => port(*n).map(|n| (n, n)),
        CnpPort::Range { start, end } => {
            let (s, e) = (port(*start)?, port(*end)?);
            (s < e).then_some((s, e))
        }
        CnpPort::Invalid(_) => None,
    }
}

// --- The API server's field rules ------------------------------------------------------------

/// A CIDR as the API server accepts one (`net.ParseCIDR`: host bits allowed); an IPv4-mapped
/// IPv6 CIDR is rejected (strict CIDR validation).
fn cidr(s: &str) -> Option<IpNet> {
    let (addr, len) = s.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    let len: u8 = len.parse().ok().filter(|_| !len.starts_with('+'))?;
    if let IpAddr::V6(v6) = addr
        && v6.to_ipv4_mapped().is_some()
    {
        return None;
    }
    IpNet::new(addr, len).ok()
}

/// network-policy-api's `DomainName`:
/// `^(\*\.)?([a-zA-z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.)+[a-zA-z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.?$`
/// (at most 253 characters; each label at most 63, as DNS has them).
fn domain_name(s: &str) -> bool {
    let rest = s.strip_prefix("*.").unwrap_or(s);
    let rest = rest.strip_suffix('.').unwrap_or(rest);
    let label = |l: &str| {
        let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        (1..=63).contains(&l.len())
            && alnum(l.chars().next())
            && alnum(l.chars().last())
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    let labels: Vec<&str> = rest.split('.').collect();
    s.len() <= 253 && labels.len() >= 2 && labels.iter().all(|l| label(l))
}

/// `IsValidPortName`: an IANA service name.
fn port_name_valid(name: &str) -> bool {
    let ok_chars = name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    (1..=15).contains(&name.len())
        && ok_chars
        && name.chars().any(|c| c.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

/// `ValidateLabelSelector`: keys are qualified names, values label values; `In`/`NotIn`
/// need values, `Exists`/`DoesNotExist` must have none.
fn selector_valid(sel: &LabelSelector) -> bool {
    sel.match_labels.iter().all(|(k, v)| qualified_name(k) && label_value(v))
        && sel.match_expressions.iter().all(|e| {
            qualified_name(&e.key)
                && match e.operator.as_str() {
                    "In" | "NotIn" => !e.values.is_empty() && e.values.iter().all(|v| label_value(v)),
                    "Exists" | "DoesNotExist" => e.values.is_empty(),
                    _ => false,
                }
        })
}

/// A valid selector's verdict on `labels` (the caller checks validity).
/// A selector of everything: no labels, no expressions.
fn empty(sel: &LabelSelector) -> bool {
    sel.match_labels.is_empty() && sel.match_expressions.is_empty()
}

fn selector_matches(sel: &LabelSelector, labels: &Labels) -> bool {
    sel.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v.as_str()))
        && sel.match_expressions.iter().all(|e| match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| e.values.iter().any(|x| x == v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| e.values.iter().all(|x| x != v)),
            "Exists" => labels.get(&e.key).is_some(),
            "DoesNotExist" => labels.get(&e.key).is_none(),
            _ => false,
        })
}

/// `IsQualifiedName`: `[prefix/]name`, the prefix a DNS-1123 subdomain (at most 253
/// characters), the name at most 63 characters of `[A-Za-z0-9_.-]`, alphanumeric at both ends.
fn qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    prefix.is_none_or(dns_subdomain) && name_part(name)
}

fn name_part(s: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    (1..=63).contains(&s.len())
        && alnum(s.chars().next())
        && alnum(s.chars().last())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// `IsValidLabelValue`: empty, or a name part.
fn label_value(s: &str) -> bool {
    s.is_empty() || name_part(s)
}

/// `IsDNS1123Subdomain`: `[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*`, at
/// most 253 characters. (Each dot-separated part has no length limit of its own here.)
fn dns_subdomain(s: &str) -> bool {
    let part = |p: &str| {
        let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        alnum(p.chars().next()) && alnum(p.chars().last()) && p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    (1..=253).contains(&s.len()) && s.split('.').all(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_field_rules() {
        assert!(qualified_name("app") && qualified_name("example.com/app") && qualified_name("a.b-c/x_y.z"));
        assert!(qualified_name(&format!("{}.example.com/app", "a".repeat(70))), "no per-part limit in a subdomain");
        assert!(!qualified_name("/app") && !qualified_name("Example.com/app") && !qualified_name("a/b/c") && !qualified_name("app-"));
        assert!(!qualified_name(&format!("{}/app", "a".repeat(254))));
        assert!(label_value("") && label_value("web") && !label_value("web-") && !label_value(&"a".repeat(64)));
        assert!(port_name_valid("http") && port_name_valid("serve-80-tcp") && !port_name_valid("80") && !port_name_valid("a--b"));
        assert_eq!(cidr("198.18.1.7/24"), Some("198.18.1.7/24".parse().unwrap()));
        assert!(cidr("198.18.1.0").is_none() && cidr("::ffff:198.18.0.0/112").is_none() && cidr("198.18.0.0/33").is_none());
        assert!(domain_name("example.com") && domain_name("*.Example.com.") && domain_name("a_b.example.com"));
        assert!(!domain_name("com") && !domain_name("*.*.example.com") && !domain_name("-a.example.com") && !domain_name("*.com."));
    }
}
