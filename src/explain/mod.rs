//! `flockctl explain`: the verdict for one new flow and why, read from the translator's output
//! — the very [`NodePolicy`] the renderer writes into nft — so the explanation is of what is
//! enforced, not of a second reading of the API.
//!
//! A flow is judged twice, as in the data path: egress at the source pod's node, then ingress
//! at the destination pod's node. Each direction walks the tiers in the renderer's order
//! (`render::Renderer::endpoint_chains`): Admin ClusterNetworkPolicies by priority (first match
//! per policy; equal priorities: Deny over Pass over Accept), then NetworkPolicy when it
//! isolates the pod (any allow rule admits, else drop), else Baseline, else the default,
//! allow. An end that is not a pod flock enforces (an address outside the cluster, a
//! host-network pod) has no policy in that direction.
//!
//! [`live`] explains from a node's live table instead, through the packet tracer.
//!
//! Pure, like the translator: no I/O, clock or process.

pub mod live;
pub mod observed;
pub mod whatif;

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::net::IpAddr;

use serde::Serialize;

use crate::model::Family;
use crate::model::{LocalEndpoint, ObjectRef, Pod, Protocol, Snapshot};
use crate::translate::{
    self, Action, AllowRule, Direction, DirectionPolicy, EndpointPolicy, Isolation, NodePolicy, PeerMatch, PortMatch, PriorityGroup, Tier,
    TierRule,
};

/// One end of the flow to explain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// A pod, by `namespace/name`.
    Pod(ObjectRef),
    /// An address: a pod's (then it is that pod), a node's, or one outside the cluster.
    Address(IpAddr),
}

impl End {
    /// `namespace/name` is a pod, anything that parses as an address is an address.
    pub fn parse(s: &str) -> Result<Self, ExplainError> {
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Self::Address(ip));
        }
        ObjectRef::parse(s).map(Self::Pod).ok_or_else(|| ExplainError::BadEnd(s.to_string()))
    }
}

/// The flow: a new connection from `from` to `to` on `protocol`/`port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub from: End,
    pub to: End,
    pub protocol: Protocol,
    pub port: u16,
    /// The family of pod addresses to use (default: IPv4 when both ends have one, else
    /// IPv6). Ignored when an end is an address: its family is the flow's.
    pub family: Option<Family>,
}

/// Why a flow cannot be explained.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExplainError {
    #[error("{0:?} is neither namespace/pod nor an IP address")]
    BadEnd(String),
    #[error("pod {0} is not in the manifests")]
    NoPod(ObjectRef),
    #[error("pod {pod} has no {family} address")]
    NoAddress { pod: ObjectRef, family: &'static str },
    #[error("{from} and {to} have no address family in common")]
    NoCommonFamily { from: String, to: String },
    #[error("{0} is a pod and the source of the flow")]
    SamePod(ObjectRef),
}

/// Allowed or denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    Allow,
    Deny,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Allow => "Allow",
            Self::Deny => "Deny",
        })
    }
}

/// What decided a direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum Decider {
    /// An Admin-tier ClusterNetworkPolicy rule (Accept or Deny).
    AdminClusterNetworkPolicy,
    /// NetworkPolicy: the pod is isolated, and rules admitted the flow or none did.
    NetworkPolicy,
    /// A Baseline-tier ClusterNetworkPolicy rule (Accept or Deny).
    BaselineClusterNetworkPolicy,
    /// flock's own isolation: a pod flock does not know yet, a sandboxed run's pod without
    /// its policy.
    Flock,
    /// Nothing decided: allowed.
    Default,
    /// flock enforces nothing for this end (not a pod, or a host-network pod).
    NotEnforced,
}

impl fmt::Display for Decider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::AdminClusterNetworkPolicy => "Admin tier (ClusterNetworkPolicy)",
            Self::NetworkPolicy => "NetworkPolicy",
            Self::BaselineClusterNetworkPolicy => "Baseline tier (ClusterNetworkPolicy)",
            Self::Flock => "flock's own isolation",
            Self::Default => "default",
            Self::NotEnforced => "not enforced",
        })
    }
}

/// A policy (and rule) taking part in a decision.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct PolicyRef {
    /// `NetworkPolicy`, `ClusterNetworkPolicy`, or `flock` (its own isolation).
    pub(crate) kind: &'static str,
    /// Empty for a cluster-scoped object.
    pub(crate) namespace: String,
    pub name: String,
    /// Index of the rule in the policy's `ingress`/`egress` list; `None` when the policy
    /// decided by isolating the pod (no rule of it admitted the flow).
    pub(crate) rule: Option<usize>,
    /// The rule's `name` (ClusterNetworkPolicy rules may have one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rule_name: Option<String>,
    /// `Allow` (a NetworkPolicy rule), `Accept`, `Deny`, `Pass`; `Isolate` for a policy
    /// that isolates the pod.
    pub(crate) action: &'static str,
    /// Why the rule is not enforced as written (it failed closed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fail_closed: Option<String>,
}

impl fmt::Display for PolicyRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ", self.kind)?;
        if !self.namespace.is_empty() {
            write!(f, "{}/", self.namespace)?;
        }
        f.write_str(&self.name)?;
        if let Some(r) = self.rule {
            write!(f, " rule {r}")?;
        }
        if let Some(n) = &self.rule_name {
            write!(f, " ({n})")?;
        }
        write!(f, ": {}", self.action)?;
        if let Some(why) = &self.fail_closed {
            write!(f, " [fails closed: {why}]")?;
        }
        Ok(())
    }
}

/// One side of the flow, as flow and policy see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EndInfo {
    /// `namespace/name` when the end is a pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pod: Option<String>,
    pub address: IpAddr,
    /// The node enforcing this end's policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The host-side interface of the pod's endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) interface: Option<String>,
}

/// The verdict of one direction and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DirectionExplanation {
    pub verdict: Verdict,
    pub(crate) decided_by: Decider,
    /// What isolates the pod for this direction under NetworkPolicy (policies, or flock's
    /// own isolation); empty when nothing does.
    pub(crate) isolated_by: Vec<String>,
    /// The rules that decided (every one that admitted the flow, for NetworkPolicy), or the
    /// isolating policies when no rule admitted it.
    pub deciding: Vec<PolicyRef>,
    /// Admin-tier rules that matched with Pass, handing the flow to the next tier.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) passed: Vec<PolicyRef>,
    /// A sentence for people.
    pub(crate) reason: String,
    /// Audit mode, where audited policies apply: what this direction would decide with them
    /// enforced (they are logged, not enforced).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<Box<DirectionExplanation>>,
}

/// The explanation of one flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Explanation {
    pub verdict: Verdict,
    pub from: EndInfo,
    pub to: EndInfo,
    pub(crate) protocol: &'static str,
    pub(crate) port: u16,
    pub(crate) family: &'static str,
    /// At the source.
    pub egress: DirectionExplanation,
    /// At the destination.
    pub ingress: DirectionExplanation,
    /// Problems of the policies that apply to either end (what is enforced differently from
    /// the text: see `fail_closed`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) problems: Vec<String>,
}

/// Explains `query` on the cluster `snapshot` (with flock's default options).
pub fn explain(snapshot: &Snapshot, query: &Query) -> Result<Explanation, ExplainError> {
    Explainer::new(snapshot, translate::Options::default()).explain(query)
}

/// Explains flows on one cluster, translating each node once (as its agent would, from the
/// endpoints its pods would have).
pub struct Explainer<'a> {
    snapshot: &'a Snapshot,
    options: translate::Options,
    /// Each node's translation and where each of its pods' endpoints is in it.
    nodes: BTreeMap<String, (NodePolicy, BTreeMap<ObjectRef, usize>)>,
}

impl<'a> Explainer<'a> {
    /// `options`: those the agents run with.
    pub fn new(snapshot: &'a Snapshot, options: translate::Options) -> Self {
        Self { snapshot, options, nodes: BTreeMap::new() }
    }

    /// The verdict for `query` and why.
    pub fn explain(&mut self, query: &Query) -> Result<Explanation, ExplainError> {
        let snapshot = self.snapshot;
        let from = resolve(snapshot, &query.from)?;
        let to = resolve(snapshot, &query.to)?;
        if let (Some(a), Some(b)) = (from.pod, to.pod)
            && a.uid == b.uid
        {
            return Err(ExplainError::SamePod(a.key()));
        }
        let family = family(&from, &to, query.family)?;
        let (src, dst) = (from.address(family)?, to.address(family)?);
        let mut problems = Vec::new();
        let (from_info, egress) = self.side(&from, Direction::Egress, family, dst, query, &mut problems);
        let (to_info, ingress) = self.side(&to, Direction::Ingress, family, src, query, &mut problems);
        let verdict = if egress.verdict == Verdict::Allow && ingress.verdict == Verdict::Allow { Verdict::Allow } else { Verdict::Deny };
        Ok(Explanation {
            verdict,
            from: from_info,
            to: to_info,
            protocol: query.protocol.as_k8s(),
            port: query.port,
            family: family.as_str(),
            egress,
            ingress,
            problems,
        })
    }

    /// One end's information and its verdict in `dir` for a flow with `peer`.
    fn side(
        &mut self,
        end: &Resolved<'_>,
        dir: Direction,
        family: Family,
        peer: IpAddr,
        query: &Query,
        problems: &mut Vec<String>,
    ) -> (EndInfo, DirectionExplanation) {
        let address = end.address(family).unwrap_or(peer);
        let Some((pod, node)) = end.pod.and_then(|p| p.node.as_deref().filter(|_| p.is_peer()).map(|n| (p, n))) else {
            let info = EndInfo { pod: end.pod.map(|p| p.key().to_string()), address, node: None, interface: None };
            let why = match end.pod {
                Some(p) if p.host_network => format!("{} is a host-network pod: flock enforces no {dir} policy for it", p.key()),
                Some(p) => format!("{} has no endpoint on a node: flock enforces no {dir} policy for it", p.key()),
                None => format!("{address} is not a pod: no {dir} policy applies there"),
            };
            return (info, not_enforced(why));
        };
        let snapshot = self.snapshot;
        if dir == Direction::Ingress && snapshot.node(node).is_some_and(|n| n.addresses.contains(&peer) || n.internal_ips.contains(&peer)) {
            let info = EndInfo { pod: Some(pod.key().to_string()), address, node: Some(node.to_string()), interface: None };
            let why = format!(
                "{peer} is an address of {}'s own node {node}: what a node sends its pods (kubelet probes) is not policed",
                pod.key()
            );
            return (info, not_enforced(why));
        }
        let options = &self.options;
        let (np, index) = self.nodes.entry(node.to_string()).or_insert_with(|| {
            let np = translate::translate(snapshot, &snapshot.derived_endpoints(node), options);
            let mut index = BTreeMap::new();
            for (i, e) in np.endpoints.iter().enumerate() {
                index.entry(e.pod.clone()).or_insert(i);
            }
            (np, index)
        });
        let ep = index.get(&pod.key()).and_then(|i| np.endpoints.get(*i));
        let info = EndInfo {
            pod: Some(pod.key().to_string()),
            address,
            node: Some(node.to_string()),
            interface: Some(ep.map_or_else(|| LocalEndpoint::for_pod(pod).interface, |e| e.interface.clone())),
        };
        let Some(ep) = ep else {
            return (info, not_enforced(format!("{} has no endpoint on node {node}", pod.key())));
        };
        for p in &np.problems {
            let p = p.to_string();
            if !problems.contains(&p) {
                problems.push(p);
            }
        }
        (info, decide(np, ep, dir, peer, query.protocol, query.port))
    }
}

/// An end: the pod it is (if any) and, for an address, the address.
struct Resolved<'a> {
    pod: Option<&'a Pod>,
    address: Option<IpAddr>,
    /// A host-network pod is its node: the node's InternalIPs stand for the addresses its
    /// status does not give.
    node_ips: Vec<IpAddr>,
}

impl Resolved<'_> {
    fn address(&self, family: Family) -> Result<IpAddr, ExplainError> {
        if let Some(a) = self.address {
            return Ok(a);
        }
        let pod = self.pod.map_or_else(|| ObjectRef::new("", ""), Pod::key);
        let ips = self.pod.map(|p| p.ips.as_slice()).filter(|ips| !ips.is_empty()).unwrap_or(&self.node_ips);
        ips.iter().copied().find(|ip| Family::of(*ip) == family).ok_or(ExplainError::NoAddress { pod, family: family.as_str() })
    }

    fn describe(&self) -> String {
        match (self.pod, self.address) {
            (Some(p), _) => p.key().to_string(),
            (None, Some(a)) => a.to_string(),
            (None, None) => String::new(),
        }
    }
}

fn resolve<'a>(snapshot: &'a Snapshot, end: &End) -> Result<Resolved<'a>, ExplainError> {
    match end {
        End::Pod(key) => {
            let pod = snapshot.pod_by_name(key).ok_or(ExplainError::NoPod(key.clone()))?;
            let node_ips = match (pod.host_network, pod.node.as_deref().and_then(|n| snapshot.node(n))) {
                (true, Some(n)) => n.internal_ips.clone(),
                _ => Vec::new(),
            };
            Ok(Resolved { pod: Some(pod), address: None, node_ips })
        }
        // An address a live pod owns is that pod (of two claiming it, the newer: see
        // `translate::Addresses`).
        End::Address(ip) => Ok(Resolved { pod: snapshot.peer_owning(ip), address: Some(*ip), node_ips: Vec::new() }),
    }
}

fn family(from: &Resolved<'_>, to: &Resolved<'_>, wanted: Option<Family>) -> Result<Family, ExplainError> {
    if let Some(a) = from.address.or(to.address) {
        return Ok(Family::of(a));
    }
    let has = |r: &Resolved<'_>, f: Family| r.address(f).is_ok();
    if let Some(f) = wanted {
        return Ok(f);
    }
    [Family::V4, Family::V6]
        .into_iter()
        .find(|f| has(from, *f) && has(to, *f))
        .ok_or_else(|| ExplainError::NoCommonFamily { from: from.describe(), to: to.describe() })
}

fn not_enforced(reason: String) -> DirectionExplanation {
    DirectionExplanation {
        verdict: Verdict::Allow,
        decided_by: Decider::NotEnforced,
        isolated_by: Vec::new(),
        deciding: Vec::new(),
        passed: Vec::new(),
        reason,
        audit: None,
    }
}

/// What a flow carries, as policy sees it: a protocol with ports, or another one (ICMP, …)
/// that only rules without ports admit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Port(Protocol, u16),
    Other,
}

/// The verdict of `ep`'s policy in `dir` for a new flow with `peer` (the other end's
/// address), in the renderer's order of evaluation.
pub(crate) fn decide(
    np: &NodePolicy,
    ep: &EndpointPolicy,
    dir: Direction,
    peer: IpAddr,
    protocol: Protocol,
    port: u16,
) -> DirectionExplanation {
    decide_transport(np, ep, dir, peer, Transport::Port(protocol, port))
}

/// [`decide`] for a flow of any transport. Domain rules match nothing: which addresses they
/// admit is learned at run time ([`decide_flow`] for a flow known to be admitted by one).
pub(crate) fn decide_transport(
    np: &NodePolicy,
    ep: &EndpointPolicy,
    dir: Direction,
    peer: IpAddr,
    transport: Transport,
) -> DirectionExplanation {
    decide_flow(np, ep, dir, peer, transport, false)
}

/// [`decide_transport`], where `domain_admitted` says whether the peer's address is one the
/// domain rules admit (a connection a domain rule admitted: its ct mark says so,
/// `render::DOMAIN_MARK`): then a domain rule matches on its ports alone.
pub(crate) fn decide_flow(
    np: &NodePolicy,
    ep: &EndpointPolicy,
    dir: Direction,
    peer: IpAddr,
    transport: Transport,
    domain_admitted: bool,
) -> DirectionExplanation {
    let d = ep.direction(dir);
    let pod = ep.pod.to_string();
    let m = Matcher { np, peer, transport, domain_admitted };
    let mut out = decide_view(&m, &pod, dir, d);
    out.audit = d.audit.as_deref().map(|a| Box::new(decide_view(&m, &pod, dir, a)));
    out
}

/// Whether `ep`'s enforced policy in `dir` denies the flow: [`decide_transport`]'s verdict
/// without its explanation (nothing allocated: for judging many flows).
#[cfg(test)]
pub(crate) fn denies(np: &NodePolicy, ep: &EndpointPolicy, dir: Direction, peer: IpAddr, transport: Transport) -> bool {
    denies_flow(np, ep, dir, peer, transport, false)
}

/// [`denies`], with `domain_admitted` as [`decide_flow`] takes it.
pub(crate) fn denies_flow(
    np: &NodePolicy,
    ep: &EndpointPolicy,
    dir: Direction,
    peer: IpAddr,
    transport: Transport,
    domain_admitted: bool,
) -> bool {
    let d = ep.direction(dir);
    let m = Matcher { np, peer, transport, domain_admitted };
    for g in &d.admin {
        match m.group_action(g, Tier::Admin) {
            Some(Action::Deny) => return true,
            Some(Action::Accept) => return false,
            Some(Action::Pass) => break,
            None => {}
        }
    }
    if d.is_isolated() {
        return !d.rules.iter().any(|r| m.matches(&r.peer, &r.ports));
    }
    d.baseline.iter().find_map(|g| m.group_action(g, Tier::Baseline)) == Some(Action::Deny)
}

/// [`decide`] for one view of a direction (enforced, or audited).
fn decide_view(m: &Matcher<'_>, pod: &str, dir: Direction, d: &DirectionPolicy) -> DirectionExplanation {
    let isolated_by: Vec<String> = d.isolated_by.iter().map(ToString::to_string).collect();
    let out = |verdict, decided_by, deciding, passed, reason| DirectionExplanation {
        verdict,
        decided_by,
        isolated_by: isolated_by.clone(),
        deciding,
        passed,
        reason,
        audit: None,
    };

    let mut passed = Vec::new();
    for g in &d.admin {
        match m.group(g, Tier::Admin) {
            Some((Action::Deny, rules)) => {
                let reason = format!("{dir} of {pod} denied by the Admin tier: {}", list(&rules));
                return out(Verdict::Deny, Decider::AdminClusterNetworkPolicy, rules, passed, reason);
            }
            Some((Action::Accept, rules)) => {
                let reason = format!("{dir} of {pod} accepted by the Admin tier: {}", list(&rules));
                return out(Verdict::Allow, Decider::AdminClusterNetworkPolicy, rules, passed, reason);
            }
            Some((Action::Pass, rules)) => {
                passed = rules;
                break;
            }
            None => {}
        }
    }
    let after_pass = if passed.is_empty() { String::new() } else { format!(" (the Admin tier passed: {})", list(&passed)) };

    if d.is_isolated() {
        let admitted = m.allow_rules(&d.rules);
        if !admitted.is_empty() {
            let reason = format!("{dir} of {pod} allowed by NetworkPolicy{after_pass}: {}", list(&admitted));
            return out(Verdict::Allow, Decider::NetworkPolicy, admitted, passed, reason);
        }
        let deciding: Vec<PolicyRef> = d.isolated_by.iter().map(isolating).collect();
        let by_flock = d.isolated_by.iter().all(|i| !matches!(i, Isolation::Policy(_)));
        let reason = if d.isolated_by.contains(&Isolation::UnknownPod) {
            format!("{pod} is unknown to flock: closed until its Pod is seen")
        } else {
            format!("{dir} of {pod} denied{after_pass}: isolated by {}, and no rule of theirs admits the flow", isolated_by.join(", "))
        };
        let decider = if by_flock { Decider::Flock } else { Decider::NetworkPolicy };
        return out(Verdict::Deny, decider, deciding, passed, reason);
    }

    for g in &d.baseline {
        match m.group(g, Tier::Baseline) {
            Some((Action::Deny, rules)) => {
                let reason = format!("{dir} of {pod} denied by the Baseline tier{after_pass}: {}", list(&rules));
                return out(Verdict::Deny, Decider::BaselineClusterNetworkPolicy, rules, passed, reason);
            }
            Some((Action::Accept, rules)) => {
                let reason = format!("{dir} of {pod} accepted by the Baseline tier{after_pass}: {}", list(&rules));
                return out(Verdict::Allow, Decider::BaselineClusterNetworkPolicy, rules, passed, reason);
            }
            // A Baseline Pass hands the flow to the default.
            Some((Action::Pass, rules)) => {
                passed.extend(rules);
                let reason = format!("{dir} of {pod} allowed by default: the Baseline tier passed ({})", list(&passed));
                return out(Verdict::Allow, Decider::Default, Vec::new(), passed, reason);
            }
            None => {}
        }
    }
    let reason = if d.is_enforced() {
        format!("{dir} of {pod} allowed by default: no ClusterNetworkPolicy rule matched{after_pass} and no NetworkPolicy isolates it")
    } else {
        format!("{dir} of {pod} allowed: no policy selects {pod} for {dir}")
    };
    out(Verdict::Allow, Decider::Default, Vec::new(), passed, reason)
}

fn list(rules: &[PolicyRef]) -> String {
    let mut s = String::new();
    for (i, r) in rules.iter().enumerate() {
        if i > 0 {
            s.push_str("; ");
        }
        let _ = write!(s, "{r}");
    }
    s
}

fn isolating(i: &Isolation) -> PolicyRef {
    let (kind, namespace, name) = match i {
        Isolation::Policy(p) => ("NetworkPolicy", p.namespace.clone(), p.name.clone()),
        Isolation::UnknownPod => ("flock", String::new(), "unknown-pod".to_string()),
        Isolation::RunPod => ("flock", String::new(), "run-pod-egress".to_string()),
    };
    PolicyRef { kind, namespace, name, rule: None, rule_name: None, action: "Isolate", fail_closed: None }
}

/// Matches rules against one flow.
struct Matcher<'a> {
    np: &'a NodePolicy,
    peer: IpAddr,
    transport: Transport,
    /// The peer is an address domain rules admit (see [`decide_flow`]).
    domain_admitted: bool,
}

impl Matcher<'_> {
    fn matches(&self, peer: &PeerMatch, ports: &PortMatch) -> bool {
        match peer {
            PeerMatch::Any => self.ports(ports),
            PeerMatch::Addresses(def) => self.np.peer_sets.get(def).is_some_and(|s| s.contains(self.peer)) && self.ports(ports),
            PeerMatch::Domains(_) => self.domain_admitted && self.ports(ports),
            // The set holds (address, protocol, port): the rule's ports are in it.
            PeerMatch::NamedPort(def) => {
                let Transport::Port(protocol, port) = self.transport else { return false };
                self.np.port_sets.get(def).is_some_and(|s| match self.peer {
                    IpAddr::V4(a) => s.v4.contains_key(&(a, protocol, port)),
                    IpAddr::V6(a) => s.v6.contains_key(&(a, protocol, port)),
                })
            }
        }
    }

    fn ports(&self, ports: &PortMatch) -> bool {
        match ports {
            PortMatch::Any => true,
            PortMatch::Protocol(p, ranges) => matches!(self.transport, Transport::Port(q, n) if q == *p && ranges.contains(n)),
        }
    }

    /// The first matching rule of each policy of a priority group.
    fn firsts<'g>(&self, g: &'g PriorityGroup) -> impl Iterator<Item = &'g TierRule> + use<'g, '_> {
        g.policies.iter().filter_map(|p| p.rules.iter().find(|r| self.matches(&r.peer, &r.ports)))
    }

    /// The outcome of a priority group: Deny over Pass over Accept (Baseline: Deny over
    /// Accept over Pass). `None`: no rule of the group matched.
    fn group_action(&self, g: &PriorityGroup, tier: Tier) -> Option<Action> {
        let (mut deny, mut pass, mut accept) = (false, false, false);
        for r in self.firsts(g) {
            match r.action {
                Action::Deny => deny = true,
                Action::Pass => pass = true,
                Action::Accept => accept = true,
            }
        }
        match tier {
            _ if deny => Some(Action::Deny),
            Tier::Admin if pass => Some(Action::Pass),
            Tier::Baseline if accept => Some(Action::Accept),
            _ if pass => Some(Action::Pass),
            _ if accept => Some(Action::Accept),
            _ => None,
        }
    }

    /// Every NetworkPolicy rule admitting the flow.
    fn allow_rules(&self, rules: &[AllowRule]) -> Vec<PolicyRef> {
        let mut out: Vec<PolicyRef> = rules
            .iter()
            .filter(|r| self.matches(&r.peer, &r.ports))
            .flat_map(|r| &r.origins)
            .map(|o| PolicyRef {
                kind: "NetworkPolicy",
                namespace: o.policy.namespace.clone(),
                name: o.policy.name.clone(),
                rule: Some(o.index),
                rule_name: None,
                action: "Allow",
                fail_closed: None,
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The first matching rule of each policy of a priority group, and the group's outcome:
    /// Deny over Pass over Accept (Baseline: Pass and Accept both allow; Accept reported if
    /// any). `None`: no rule of the group matched.
    fn group(&self, g: &PriorityGroup, tier: Tier) -> Option<(Action, Vec<PolicyRef>)> {
        let action = self.group_action(g, tier)?;
        let rules = self
            .firsts(g)
            .filter(|r| r.action == action)
            .map(|r| PolicyRef {
                kind: "ClusterNetworkPolicy",
                namespace: String::new(),
                name: r.origin.policy.clone(),
                rule: Some(r.origin.index),
                rule_name: r.origin.name.clone(),
                action: match r.action {
                    Action::Accept => "Accept",
                    Action::Deny => "Deny",
                    Action::Pass => "Pass",
                },
                fail_closed: r.origin.fail_closed.clone(),
            })
            .collect();
        Some((action, rules))
    }
}

/// The explanation as text: the verdict, then each direction.
pub fn to_text(e: &Explanation) -> String {
    let end = |i: &EndInfo| {
        let mut s = i.pod.clone().map_or_else(|| i.address.to_string(), |p| format!("{p} ({})", i.address));
        if let Some(n) = &i.node {
            let _ = write!(s, " on node {n}");
        }
        s
    };
    let mut s = String::new();
    let _ = writeln!(s, "{} {}/{} {}: {} -> {}", e.verdict, e.protocol, e.port, e.family, end(&e.from), end(&e.to));
    for (name, d) in [("egress", &e.egress), ("ingress", &e.ingress)] {
        if d.decided_by == Decider::NotEnforced {
            let _ = writeln!(s, "  {name}: not enforced ({})", d.verdict);
        } else {
            let _ = writeln!(s, "  {name}: {} by {}", d.verdict, d.decided_by);
        }
        let _ = writeln!(s, "    {}", d.reason);
        if !d.isolated_by.is_empty() {
            let _ = writeln!(s, "    isolated by: {}", d.isolated_by.join(", "));
        }
        for r in &d.deciding {
            let _ = writeln!(s, "    decided by: {r}");
        }
        for r in &d.passed {
            let _ = writeln!(s, "    passed by: {r}");
        }
        if let Some(a) = &d.audit {
            let _ = writeln!(s, "    audit mode: with the audited policies enforced, {} by {}: {}", a.verdict, a.decided_by, a.reason);
            for r in &a.deciding {
                let _ = writeln!(s, "      would be decided by: {r}");
            }
        }
    }
    for p in &e.problems {
        let _ = writeln!(s, "  problem: {p}");
    }
    s
}

#[cfg(test)]
mod tests;
