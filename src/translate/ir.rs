//! The translator's output: per local endpoint and direction, whether it is isolated and the
//! allow rules that apply, with peers as shared, de-duplicated address sets.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::selector::Selector;
use crate::dns::DomainPattern;
use crate::model::{ObjectRef, Protocol};

/// Traffic direction, from the point of view of the local pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    /// The field name in a NetworkPolicy spec.
    pub(crate) fn as_field(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_field())
    }
}

/// Which namespaces a pod peer reaches.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NsScope {
    /// The policy's own namespace (a `podSelector` without `namespaceSelector`).
    Named(String),
    /// Namespaces whose labels match.
    Matching(Selector),
}

/// A validated `ipBlock`: host bits cleared, `except` sorted.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IpBlockDef {
    pub(crate) cidr: IpNet,
    pub(crate) except: Vec<IpNet>,
}

impl IpBlockDef {
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        self.cidr.contains(&ip) && !self.except.iter().any(|e| e.contains(&ip))
    }

    /// `cidr` minus every `except`, as disjoint prefixes in address order.
    pub(crate) fn prefixes(&self) -> Vec<IpNet> {
        let mut out = vec![self.cidr];
        for e in &self.except {
            out = out.into_iter().flat_map(|p| subtract(p, *e)).collect();
        }
        out.sort();
        out
    }
}

/// `p` minus `e` as disjoint prefixes.
fn subtract(p: IpNet, e: IpNet) -> Vec<IpNet> {
    if e.contains(&p) {
        return Vec::new();
    }
    if !p.contains(&e) {
        return vec![p];
    }
    let mut out = Vec::new();
    let mut cur = p;
    while cur.prefix_len() < e.prefix_len() {
        let Ok(halves) = cur.subnets(cur.prefix_len() + 1) else { break };
        for half in halves {
            if half.contains(&e) {
                cur = half;
            } else {
                out.push(half);
            }
        }
    }
    out
}

/// A peer definition: the key of a shared address set. Two rules with equal definitions
/// (in any policy, for any pod) share one nft set.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PeerDef {
    /// Pods selected by `pods` (`None`: all) in the namespaces of `namespaces`.
    Pods { namespaces: NsScope, pods: Option<Selector> },
    /// Addresses in an ipBlock (pod addresses included).
    Block(IpBlockDef),
    /// The addresses of the Nodes whose labels match (a ClusterNetworkPolicy `nodes` peer).
    Nodes(Selector),
}

impl PeerDef {
    /// A short, readable summary for object names (`x/pod=a`, `ns-team=a/all`, `10.0.0.0/8`).
    pub(crate) fn short(&self) -> String {
        match self {
            Self::Pods { namespaces, pods } => {
                let ns = match namespaces {
                    NsScope::Named(n) => n.clone(),
                    NsScope::Matching(s) if s.is_everything() => "all-ns".to_string(),
                    NsScope::Matching(s) => format!("ns-{s}"),
                };
                let pods = pods.as_ref().map_or_else(|| "all".to_string(), ToString::to_string);
                format!("{ns}/{pods}")
            }
            Self::Block(b) => b.cidr.to_string(),
            Self::Nodes(s) if s.is_everything() => "nodes".to_string(),
            Self::Nodes(s) => format!("nodes-{s}"),
        }
    }
}

/// Human description, used in nft comments.
impl fmt::Display for PeerDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pods { namespaces, pods } => {
                match pods {
                    None => f.write_str("all pods")?,
                    Some(s) => write!(f, "pods {s}")?,
                }
                match namespaces {
                    NsScope::Named(n) => write!(f, " in namespace {n}"),
                    NsScope::Matching(s) if s.is_everything() => f.write_str(" in all namespaces"),
                    NsScope::Matching(s) => write!(f, " in namespaces {s}"),
                }
            }
            Self::Nodes(s) if s.is_everything() => f.write_str("all nodes"),
            Self::Nodes(s) => write!(f, "nodes {s}"),
            Self::Block(b) => {
                write!(f, "ipBlock {}", b.cidr)?;
                if !b.except.is_empty() {
                    let ex: Vec<String> = b.except.iter().map(ToString::to_string).collect();
                    write!(f, " except {}", ex.join(","))?;
                }
                Ok(())
            }
        }
    }
}

/// Destinations of an egress rule with a named port: the port number depends on each
/// destination pod, so the set holds (address, protocol, port) triples.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedPortDef {
    /// `None`: every pod (the rule has no `to`).
    pub(crate) dest: Option<PeerDef>,
    pub(crate) protocol: Protocol,
    pub(crate) name: String,
}

impl NamedPortDef {
    pub(crate) fn short(&self) -> String {
        let dest = self.dest.as_ref().map_or_else(|| "all".to_string(), PeerDef::short);
        format!("{}/{}/{dest}", self.name, self.protocol.as_nft())
    }
}

impl fmt::Display for NamedPortDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "port {} ({}) of ", self.name, self.protocol)?;
        match &self.dest {
            None => f.write_str("all pods"),
            Some(d) => write!(f, "{d}"),
        }
    }
}

/// The addresses of a [`PeerDef`], per family, each with a comment naming its source
/// (`namespace/pod`, or the ipBlock it belongs to).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AddressSet {
    pub v4: BTreeMap<Ipv4Net, String>,
    pub v6: BTreeMap<Ipv6Net, String>,
}

impl AddressSet {
    pub(crate) fn insert(&mut self, net: IpNet, comment: &str) {
        match net {
            // Keys without host bits: `contains` looks prefixes up by their network.
            IpNet::V4(n) => {
                self.v4.entry(n.trunc()).or_insert_with(|| comment.to_string());
            }
            IpNet::V6(n) => {
                self.v6.entry(n.trunc()).or_insert_with(|| comment.to_string());
            }
        }
    }

    /// The set of `entries`, where an address listed twice keeps its first comment (as
    /// [`Self::insert`] does). Built from sorted runs, not one insertion per entry: pod sets
    /// hold up to a cluster's pods.
    pub(crate) fn from_entries(entries: Vec<(IpNet, String)>) -> Self {
        fn build<K: Ord + Copy>(mut v: Vec<(K, String)>) -> BTreeMap<K, String> {
            first_by_key(&mut v, |e| e.0);
            v.into_iter().collect()
        }
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for (net, comment) in entries {
            match net {
                IpNet::V4(n) => v4.push((n.trunc(), comment)),
                IpNet::V6(n) => v6.push((n.trunc(), comment)),
            }
        }
        Self { v4: build(v4), v6: build(v6) }
    }

    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        // A large set (pod addresses) is looked up by every prefix that could hold the
        // address, longest first; a small one scanned.
        const SCAN: usize = 64;
        match ip {
            IpAddr::V4(a) if self.v4.len() <= SCAN => self.v4.keys().any(|n| n.contains(&a)),
            IpAddr::V4(a) => (0..=32).rev().any(|len| Ipv4Net::new(a, len).is_ok_and(|n| self.v4.contains_key(&n.trunc()))),
            IpAddr::V6(a) if self.v6.len() <= SCAN => self.v6.keys().any(|n| n.contains(&a)),
            IpAddr::V6(a) => (0..=128).rev().any(|len| Ipv6Net::new(a, len).is_ok_and(|n| self.v6.contains_key(&n.trunc()))),
        }
    }
}

/// Sorts `v` by `key` and keeps, of entries with equal keys, the first listed (a stable
/// sort keeps it first, `dedup` keeps the first): what [`AddressSet::insert`] does with a
/// second comment for an address, for a whole list at once.
pub(crate) fn first_by_key<T, K: Ord>(v: &mut Vec<T>, key: impl Fn(&T) -> K) {
    v.sort_by_key(&key);
    v.dedup_by(|b, a| key(a) == key(b));
}

/// The (address, protocol, port) triples of a [`NamedPortDef`], per family.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PortAddressSet {
    pub(crate) v4: BTreeMap<(Ipv4Addr, Protocol, u16), String>,
    pub(crate) v6: BTreeMap<(Ipv6Addr, Protocol, u16), String>,
}

impl PortAddressSet {
    pub(crate) fn insert(&mut self, ip: IpAddr, protocol: Protocol, port: u16, comment: &str) {
        match ip {
            IpAddr::V4(a) => {
                self.v4.entry((a, protocol, port)).or_insert_with(|| comment.to_string());
            }
            IpAddr::V6(a) => {
                self.v6.entry((a, protocol, port)).or_insert_with(|| comment.to_string());
            }
        }
    }
}

/// Destinations named by domain (a ClusterNetworkPolicy `domainNames` peer, NPEP-133): the
/// addresses trusted resolvers recently gave for names these patterns match. What they are is
/// learned at run time (the agent's DNS proxy writes them, each with its TTL, into the
/// definition's timed sets); the translation only names the patterns. Two rules with equal
/// patterns share the sets: an address learned for one admits the other too, which is what
/// both rules say.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DomainDef {
    /// Sorted, without duplicates.
    pub(crate) patterns: Vec<DomainPattern>,
}

impl DomainDef {
    pub(crate) fn new(mut patterns: Vec<DomainPattern>) -> Self {
        patterns.sort();
        patterns.dedup();
        Self { patterns }
    }

    /// `github.com,*.pypi.org`, for object names.
    pub(crate) fn short(&self) -> String {
        self.patterns.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
    }
}

impl fmt::Display for DomainDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "domains {}", self.short())
    }
}

/// Which peers a rule admits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum PeerMatch {
    /// Every address.
    Any,
    /// The addresses of a shared set.
    Addresses(PeerDef),
    /// (address, protocol, port) of a shared named-port set; the rule's ports are in the set.
    NamedPort(NamedPortDef),
    /// The addresses learned for some domain names (egress only), until their TTL expires.
    Domains(DomainDef),
}

/// Ports of one protocol.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum PortRanges {
    All,
    /// Sorted, merged, non-overlapping inclusive ranges.
    Ranges(Vec<(u16, u16)>),
}

impl PortRanges {
    /// Sorts and merges `ranges` (overlapping or adjacent ones become one).
    pub(crate) fn from_ranges(mut ranges: Vec<(u16, u16)>) -> Self {
        ranges.sort_unstable();
        let mut merged: Vec<(u16, u16)> = Vec::with_capacity(ranges.len());
        for (s, e) in ranges {
            match merged.last_mut() {
                Some(last) if u32::from(s) <= u32::from(last.1) + 1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        if merged == [(1, u16::MAX)] { Self::All } else { Self::Ranges(merged) }
    }

    pub(crate) fn contains(&self, port: u16) -> bool {
        match self {
            Self::All => true,
            Self::Ranges(r) => r.iter().any(|(s, e)| (*s..=*e).contains(&port)),
        }
    }
}

/// Which traffic a rule admits, besides the peer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum PortMatch {
    /// Every protocol and port (ICMP included).
    Any,
    /// One transport protocol, some or all of its ports.
    Protocol(Protocol, PortRanges),
}

/// Where an allow rule comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct RuleOrigin {
    pub(crate) policy: ObjectRef,
    pub(crate) direction: Direction,
    pub(crate) index: usize,
    /// The rule is entry `index` of the policy's `flock.dev/egress-domains` annotation, not
    /// of its spec.
    pub(crate) domains: bool,
}

impl fmt::Display for RuleOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.domains {
            return write!(f, "{} {}[{}]", self.policy, crate::model::EGRESS_DOMAINS_ANNOTATION, self.index);
        }
        write!(f, "{} {}[{}]", self.policy, self.direction, self.index)
    }
}

/// One allow rule: admitted if both the peer and the ports match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowRule {
    pub(crate) peer: PeerMatch,
    pub(crate) ports: PortMatch,
    /// Every policy rule that produced this exact rule, first one first.
    pub(crate) origins: Vec<RuleOrigin>,
}

/// Why a direction of an endpoint is isolated.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isolation {
    /// A policy selects the pod for this direction.
    Policy(ObjectRef),
    /// The endpoint's pod is not in the snapshot (yet): nothing is known about it, so it is
    /// closed in both directions until it is.
    UnknownPod,
    /// The pod carries the `flock.dev/run` label: sandboxed runs are egress-isolated even
    /// before their per-run policy exists.
    RunPod,
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Policy(p) => write!(f, "policy {p}"),
            Self::UnknownPod => f.write_str("unknown pod"),
            Self::RunPod => f.write_str("run pod"),
        }
    }
}

/// A tier of ClusterNetworkPolicy: Admin before NetworkPolicy, Baseline after.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Tier {
    Admin,
    Baseline,
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Admin => "Admin",
            Self::Baseline => "Baseline",
        })
    }
}

/// What a ClusterNetworkPolicy rule does with the traffic it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Action {
    /// Allowed in this direction; no further rule of this direction is evaluated.
    Accept,
    /// Dropped.
    Deny,
    /// The rest of this tier is skipped: the next tier decides (after Admin: NetworkPolicy,
    /// then Baseline; after Baseline: the default, allow).
    Pass,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Accept => "Accept",
            Self::Deny => "Deny",
            Self::Pass => "Pass",
        })
    }
}

/// Where a tier rule comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct CnpOrigin {
    pub(crate) policy: String,
    pub(crate) direction: Direction,
    pub(crate) index: usize,
    /// The rule's `name`, if it has one.
    pub(crate) name: Option<String>,
    /// Why the rule is not enforced as written (it failed closed), if it is not.
    pub(crate) fail_closed: Option<String>,
}

impl fmt::Display for CnpOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}[{}]", self.policy, self.direction, self.index)?;
        if let Some(n) = &self.name {
            write!(f, " {n}")?;
        }
        if self.fail_closed.is_some() {
            f.write_str(" (fail closed)")?;
        }
        Ok(())
    }
}

/// One matcher of a ClusterNetworkPolicy rule, as it applies to one endpoint: the rule
/// matches when any of its matchers does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TierRule {
    pub(crate) action: Action,
    pub(crate) peer: PeerMatch,
    pub(crate) ports: PortMatch,
    pub(crate) origin: CnpOrigin,
}

/// One ClusterNetworkPolicy's rules for one endpoint and direction, in the policy's order
/// (first match decides).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TierPolicy {
    pub(crate) name: String,
    pub(crate) rules: Vec<TierRule>,
}

/// The policies of one tier with one priority, in name order. Within each policy the first
/// matching rule decides; across policies of equal priority (which the API leaves
/// undefined) flock takes the safest outcome: Deny over Pass over Accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorityGroup {
    /// The priority (`None`: a policy flock cannot place, evaluated first: see
    /// `translate::cluster`).
    pub(crate) priority: Option<i64>,
    pub(crate) policies: Vec<TierPolicy>,
}

/// One direction of one endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DirectionPolicy {
    /// Empty: not isolated by NetworkPolicy (or flock's own isolation).
    pub isolated_by: Vec<Isolation>,
    /// The union of what the selecting policies allow (only meaningful when isolated).
    pub rules: Vec<AllowRule>,
    /// Admin-tier ClusterNetworkPolicies selecting the pod, by priority.
    pub admin: Vec<PriorityGroup>,
    /// Baseline-tier ClusterNetworkPolicies selecting the pod, by priority.
    pub baseline: Vec<PriorityGroup>,
    /// In audit mode, where an audited policy applies and changes it: this direction as it
    /// would be with the audited policies enforced. What it would deny and the enforced
    /// direction allows is logged (as audit) and accepted.
    pub audit: Option<Box<DirectionPolicy>>,
}

impl DirectionPolicy {
    /// Isolated by NetworkPolicy (or flock's own isolation): only allow rules admit.
    pub fn is_isolated(&self) -> bool {
        !self.isolated_by.is_empty()
    }

    /// Whether anything restricts this direction (else: every packet is allowed).
    pub(crate) fn is_enforced(&self) -> bool {
        self.is_isolated() || !self.admin.is_empty() || !self.baseline.is_empty()
    }

    /// Every peer a rule of this direction matches, the audited view's included.
    pub(crate) fn peers(&self) -> Vec<&PeerMatch> {
        let mut out: Vec<&PeerMatch> = self.rules.iter().map(|r| &r.peer).collect();
        out.extend(self.admin.iter().chain(&self.baseline).flat_map(|g| &g.policies).flat_map(|p| &p.rules).map(|r| &r.peer));
        if let Some(a) = &self.audit {
            out.extend(a.peers());
        }
        out
    }
}

/// A local endpoint and its policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointPolicy {
    /// Host-side interface name.
    pub(crate) interface: String,
    pub pod: ObjectRef,
    /// The endpoint's own addresses (its traffic may only come from these).
    pub(crate) addrs: Vec<IpAddr>,
    pub(crate) ingress: DirectionPolicy,
    pub egress: DirectionPolicy,
    /// Its namespace is annotated `flock.dev/log-allowed: "true"`: new connections its policy
    /// allows are logged too (rate-limited).
    pub(crate) log_allowed: bool,
}

impl EndpointPolicy {
    pub fn direction(&self, dir: Direction) -> &DirectionPolicy {
        match dir {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }

    pub(crate) fn has_v4(&self) -> bool {
        self.addrs.iter().any(IpAddr::is_ipv4)
    }

    pub(crate) fn has_v6(&self) -> bool {
        self.addrs.iter().any(IpAddr::is_ipv6)
    }
}

/// The kinds of policy flock enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) enum PolicyKind {
    #[default]
    NetworkPolicy,
    ClusterNetworkPolicy,
}

impl PolicyKind {}

/// Something in a policy the API server would have rejected, or flock cannot enforce as
/// written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PolicyProblem {
    pub(crate) kind: PolicyKind,
    /// `namespace/name`; a cluster-scoped policy has an empty namespace.
    pub(crate) policy: ObjectRef,
    /// Field path inside the object, e.g. `spec.ingress[0].from[1].ipBlock.except[0]`.
    pub field: String,
    pub message: String,
}

/// The policy's name is [`clip`](crate::model::clip)ped (the field and message quote API
/// strings clipped already).
impl fmt::Display for PolicyProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (namespace, name) = (crate::model::clip(&self.policy.namespace), crate::model::clip(&self.policy.name));
        match self.kind {
            PolicyKind::NetworkPolicy => write!(f, "NetworkPolicy {namespace}/{name}: {}: {}", self.field, self.message),
            PolicyKind::ClusterNetworkPolicy => write!(f, "ClusterNetworkPolicy {name}: {}: {}", self.field, self.message),
        }
    }
}

/// Everything one node enforces.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodePolicy {
    /// In interface-name order.
    pub endpoints: Vec<EndpointPolicy>,
    /// Every address set a rule refers to (shared: a copy of the policy copies only the sets
    /// that change after it).
    pub peer_sets: BTreeMap<PeerDef, Arc<AddressSet>>,
    /// Every named-port set a rule refers to.
    pub port_sets: BTreeMap<NamedPortDef, Arc<PortAddressSet>>,
    /// Problems in the policies that apply to this node's pods.
    pub problems: Vec<PolicyProblem>,
    /// The trusted DNS resolvers' addresses, sorted (`Options::dns_resolvers`).
    pub dns_resolvers: Vec<IpAddr>,
    /// Who may send this node VXLAN (`Options::overlay_port`); `None`: no overlay.
    pub overlay: Option<OverlayGuard>,
}

/// The overlay's senders: VXLAN to `port` is taken only from the nodes' InternalIPs (a pod,
/// or any other host, could otherwise inject frames the node decapsulates as another node's
/// pods' packets), and only carrying a packet from the sending node's pods or addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayGuard {
    pub port: u16,
    /// Every address of every node (`status.addresses`, InternalIPs included), sorted: where
    /// a pod's VXLAN is dropped.
    pub nodes: Vec<IpAddr>,
    /// Per node, in name order: what its VXLAN may carry.
    pub senders: Vec<OverlaySender>,
    /// Addresses left out because they are ambiguous, by node (each names the node and the
    /// address): the guard takes less, never more.
    pub problems: Vec<String>,
    /// Every node's pod CIDRs, merged (none inside another), sorted: a pod's UDP to the VXLAN
    /// port goes only to these (pod to pod), never anywhere else.
    pub pod_cidrs: Vec<IpNet>,
    /// The addresses this node's VXLAN devices send and receive on — its first InternalIP of
    /// each family, as the routes make them — sorted; VXLAN to any other address of the node
    /// is not the overlay. Empty when the node is unknown: no VXLAN is taken.
    pub local: Vec<IpAddr>,
}

/// One node as a VXLAN sender: the underlay addresses it sends from and the inner sources
/// its frames may carry (its pod CIDRs and its own addresses, which the host's own packets
/// to other nodes' pods leave with).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlaySender {
    pub node: String,
    /// Its InternalIPs no other node claims, sorted.
    pub underlay: Vec<IpAddr>,
    /// Its pod CIDRs and those InternalIPs (host prefixes) not inside any node's pod CIDR,
    /// sorted, none inside another (an interval set takes no overlap).
    pub inner: Vec<IpNet>,
}

impl OverlayGuard {
    /// The guard for `port` from the nodes of `snapshot`. A node's `status.addresses` are
    /// its kubelet's word: an InternalIP two nodes claim is taken from neither, and one inside
    /// a pod CIDR is no node's inner source (a node could otherwise speak for other pods).
    pub fn of(snapshot: &crate::model::Snapshot, port: u16, node: Option<&str>) -> Self {
        use std::collections::{BTreeMap, BTreeSet};
        let nodes: BTreeSet<IpAddr> = snapshot.nodes().flat_map(|n| n.internal_ips.iter().chain(&n.addresses).copied()).collect();
        let mut claims: BTreeMap<IpAddr, BTreeSet<&str>> = BTreeMap::new();
        for n in snapshot.nodes() {
            for ip in &n.internal_ips {
                claims.entry(*ip).or_default().insert(n.name.as_str());
            }
        }
        let pod_cidrs: Vec<IpNet> = snapshot.nodes().flat_map(|n| n.pod_cidrs.iter().map(IpNet::trunc)).collect();
        let mut problems = Vec::new();
        let mut senders: Vec<OverlaySender> = Vec::new();
        for n in snapshot.nodes() {
            let node = crate::model::clip(&n.name);
            let mut underlay = BTreeSet::new();
            let mut inner: BTreeSet<IpNet> = n.pod_cidrs.iter().map(IpNet::trunc).collect();
            for ip in &n.internal_ips {
                let owners = claims.get(ip).map_or(0, BTreeSet::len);
                if owners > 1 {
                    problems.push(format!("node {node}: InternalIP {ip} is claimed by {owners} nodes: no VXLAN is taken from it"));
                    continue;
                }
                underlay.insert(*ip);
                if pod_cidrs.iter().any(|c| c.contains(ip)) {
                    problems.push(format!("node {node}: InternalIP {ip} lies in a pod CIDR: not taken as a source inside its VXLAN"));
                } else {
                    inner.insert(IpNet::from(*ip));
                }
            }
            if underlay.is_empty() {
                continue;
            }
            // Sorted by network then length: a prefix inside another comes after it.
            let mut merged: Vec<IpNet> = Vec::with_capacity(inner.len());
            for net in inner {
                if !merged.iter().any(|m| m.contains(&net)) {
                    merged.push(net);
                }
            }
            senders.push(OverlaySender { node: n.name.clone(), underlay: underlay.into_iter().collect(), inner: merged });
        }
        senders.sort_by(|a, b| a.node.cmp(&b.node));
        problems.sort();
        let all_cidrs: BTreeSet<IpNet> = pod_cidrs.iter().copied().collect();
        let mut merged_cidrs: Vec<IpNet> = Vec::with_capacity(all_cidrs.len());
        for net in all_cidrs {
            if !merged_cidrs.iter().any(|m| m.contains(&net)) {
                merged_cidrs.push(net);
            }
        }
        // As `routes::plan` picks the local address: the first InternalIP of each family.
        let mut local: Vec<IpAddr> = snapshot
            .nodes()
            .filter(|n| Some(n.name.as_str()) == node)
            .flat_map(|n| [false, true].into_iter().filter_map(|v6| n.internal_ips.iter().copied().find(|a| a.is_ipv6() == v6)))
            .collect();
        local.sort();
        local.dedup();
        Self { port, nodes: nodes.into_iter().collect(), senders, problems, pod_cidrs: merged_cidrs, local }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn large_address_sets_find_what_a_scan_finds() {
        let mut set = AddressSet::default();
        for i in 0..200u32 {
            set.insert(IpNet::from(IpAddr::from(std::net::Ipv4Addr::from(0xc612_0000 + i * 7))), "pod");
            set.insert(IpNet::from(IpAddr::from(std::net::Ipv6Addr::from((0x2001_0db8_u128 << 96) | (u128::from(i) * 5)))), "pod");
        }
        for n in ["198.18.128.0/17", "10.0.0.0/8", "2001:db8:0:1::/64", "198.18.3.128/25"] {
            set.insert(net(n), "block");
        }
        assert!(set.v4.len() > 64 && set.v6.len() > 64);
        let scan = |ip: IpAddr| match ip {
            IpAddr::V4(a) => set.v4.keys().any(|n| n.contains(&a)),
            IpAddr::V6(a) => set.v6.keys().any(|n| n.contains(&a)),
        };
        for i in 0..3000u32 {
            let v4 = IpAddr::from(std::net::Ipv4Addr::from(0xc612_0000 + i * 3));
            let v6 = IpAddr::from(std::net::Ipv6Addr::from((0x2001_0db8_u128 << 96) + u128::from(i) * 3 + (u128::from(i % 2) << 64)));
            assert_eq!(set.contains(v4), scan(v4), "{v4}");
            assert_eq!(set.contains(v6), scan(v6), "{v6}");
        }
        assert!(set.contains("10.1.2.3".parse().unwrap()));
        assert!(set.contains("198.18.200.1".parse().unwrap()));
        assert!(!set.contains("198.19.200.1".parse().unwrap()));
    }

    #[test]
    fn a_list_keeps_the_first_entry_of_a_key_as_insert_keeps_the_first_comment() {
        let entries =
            [("198.18.0.9/32", "b"), ("198.18.0.1/32", "a"), ("198.18.0.9/32", "c"), ("2001:db8::1/128", "d"), ("198.18.0.1/32", "e")];
        let mut one_by_one = AddressSet::default();
        for (n, c) in entries {
            one_by_one.insert(net(n), c);
        }
        let at_once = AddressSet::from_entries(entries.iter().map(|(n, c)| (net(n), c.to_string())).collect());
        assert_eq!(at_once, one_by_one);
        assert_eq!(at_once.v4.values().collect::<Vec<_>>(), ["a", "b"]);
        let mut v = vec![(3, 'x'), (1, 'y'), (3, 'z'), (1, 'w'), (2, 'v')];
        first_by_key(&mut v, |e| e.0);
        assert_eq!(v, [(1, 'y'), (2, 'v'), (3, 'x')]);
    }

    #[test]
    fn ip_block_minus_excepts_is_exact() {
        let b = IpBlockDef { cidr: net("0.0.0.0/0"), except: vec![net("10.0.0.0/8"), net("198.18.0.0/15")] };
        let p = b.prefixes();
        for ip in ["10.1.2.3", "198.18.5.5", "198.19.255.255"] {
            assert!(!p.iter().any(|n| n.contains(&ip.parse::<IpAddr>().unwrap())), "{ip}");
            assert!(!b.contains(ip.parse().unwrap()));
        }
        for ip in ["0.0.0.0", "9.255.255.255", "11.0.0.0", "198.17.255.255", "198.20.0.0", "255.255.255.255"] {
            assert_eq!(p.iter().filter(|n| n.contains(&ip.parse::<IpAddr>().unwrap())).count(), 1, "{ip}");
            assert!(b.contains(ip.parse().unwrap()));
        }
        // Disjoint and sorted.
        for w in p.windows(2) {
            assert!(w[0] < w[1] && !w[0].contains(&w[1]) && !w[1].contains(&w[0]));
        }
        let b = IpBlockDef { cidr: net("2001:db8::/32"), except: vec![net("2001:db8::/33"), net("2001:db8:8000::/33")] };
        assert!(b.prefixes().is_empty());
    }

    #[test]
    fn port_ranges_merge() {
        assert_eq!(PortRanges::from_ranges(vec![(81, 81), (80, 80), (90, 100), (95, 120)]), PortRanges::Ranges(vec![(80, 81), (90, 120)]));
        assert_eq!(PortRanges::from_ranges(vec![(1, 100), (101, 65535)]), PortRanges::All);
    }

    #[test]
    fn descriptions() {
        let d = PeerDef::Pods { namespaces: NsScope::Named("x".into()), pods: None };
        assert_eq!(d.to_string(), "all pods in namespace x");
        assert_eq!(d.short(), "x/all");
        let b = PeerDef::Block(IpBlockDef { cidr: net("0.0.0.0/0"), except: vec![net("10.0.0.0/8")] });
        assert_eq!(b.to_string(), "ipBlock 0.0.0.0/0 except 10.0.0.0/8");
    }
}
