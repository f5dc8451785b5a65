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
//! - An address belongs to one live pod ([`Addresses`]). This node's endpoints, as flock-cni
//!   reported them, are authoritative for their pods' addresses (the API's `podIPs` lag
//!   behind the sandbox); elsewhere, of two live pods reporting one address, the newer owns
//!   it (the older one's sandbox is gone: its address was released and reused).
//! - A connection is allowed iff the source's egress allows it and the destination's ingress
//!   allows it; each node enforces the directions of its own pods.
//!
//! Policies the API server would reject are handled as [`compile`] describes.

pub(crate) mod cluster;
pub mod compile;
pub mod incremental;
pub(crate) mod ir;
pub(crate) mod par;
pub mod selector;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub(crate) use compile::{CompiledPolicy, PortSpec};
pub use incremental::{Change, Changed, Incremental};
pub use ir::*;

use crate::model::{LocalEndpoint, ObjectRef, Pod, RUN_LABEL, Snapshot, clip};

/// Translator switches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Pods labelled [`RUN_LABEL`] are egress-isolated even while no policy selects them, so
    /// a run's pod that starts before its per-run policy exists is closed, not open.
    pub isolate_run_pods: bool,
    /// Policies annotated `flock.dev/enforcement: audit` (or in a namespace so annotated)
    /// are evaluated but not enforced: each direction they apply to gets, beside what is
    /// enforced, what would be with them ([`DirectionPolicy::audit`]). Off: every policy is
    /// enforced, annotated or not (audit means open; the agent's `--allow-audit-mode`).
    pub audit_mode: bool,
    /// Which pods are the trusted DNS resolvers (their addresses become
    /// [`NodePolicy::dns_resolvers`]); `None`: none but what the agent is given.
    pub dns_resolvers: Option<ResolverPods>,
    /// The VXLAN overlay's UDP port, when the node takes overlay traffic
    /// ([`NodePolicy::overlay`]).
    pub overlay_port: Option<u16>,
    /// This node's name, under the overlay: its InternalIPs are the addresses VXLAN must be
    /// sent to ([`OverlayGuard::local`]).
    pub overlay_node: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self { isolate_run_pods: true, audit_mode: false, dns_resolvers: None, overlay_port: None, overlay_node: None }
    }
}

/// As `--dns-resolver-pods` takes it: `namespace/label=value[,label=value]`, `*` for every
/// namespace.
impl std::fmt::Display for ResolverPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/", self.namespace.as_deref().unwrap_or("*"))?;
        for (i, (k, v)) in self.labels.iter().enumerate() {
            write!(f, "{}{k}={v}", if i == 0 { "" } else { "," })?;
        }
        Ok(())
    }
}

/// The pods whose DNS answers teach domain rules: the cluster DNS Service's endpoints, which
/// in most clusters are the pods of `kube-system` labelled `k8s-app: kube-dns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolverPods {
    /// `None`: every namespace (each sync then looks at every pod: for tests and simulations).
    pub namespace: Option<String>,
    /// Labels the pods carry (all of them).
    pub labels: BTreeMap<String, String>,
}

impl ResolverPods {
    /// The cluster DNS Service's endpoints in most clusters: `kube-system/k8s-app=kube-dns`.
    pub fn cluster_dns() -> Self {
        Self { namespace: Some("kube-system".into()), labels: [("k8s-app".to_string(), "kube-dns".to_string())].into() }
    }

    /// The addresses of the live pods selected, sorted.
    pub(crate) fn addresses(&self, snapshot: &Snapshot) -> Vec<IpAddr> {
        let selected = |p: &&Pod| !p.phase.is_terminal() && self.labels.iter().all(|(k, v)| p.labels.get(k) == Some(v.as_str()));
        let mut out: Vec<IpAddr> = match &self.namespace {
            Some(ns) => snapshot.pods_in(ns).filter(selected).flat_map(|p| p.ips.iter().copied()).collect(),
            None => snapshot.pods().filter(selected).flat_map(|p| p.ips.iter().copied()).collect(),
        };
        out.sort();
        out.dedup();
        out
    }
}

/// The endpoints sorted, one per interface. Two endpoints claiming one interface (a stale
/// report next to a new one) resolve by the endpoints' full order, not by the order they came
/// in, so the output does not depend on it.
fn one_per_interface(endpoints: &[LocalEndpoint]) -> Vec<&LocalEndpoint> {
    let mut eps: Vec<&LocalEndpoint> = endpoints.iter().collect();
    eps.sort();
    eps.dedup_by(|a, b| a.interface == b.interface);
    eps
}

/// Translates the snapshot into what this node enforces for `endpoints`.
pub fn translate(snapshot: &Snapshot, endpoints: &[LocalEndpoint], options: &Options) -> NodePolicy {
    let eps = one_per_interface(endpoints);
    let addresses = Addresses::new(snapshot, &eps);
    let mut out = NodePolicy::default();
    let mut tr = Translator { snapshot, addresses, out: &mut out, added: None, pending: Default::default() };

    // Only policies in namespaces with a local pod can select one.
    let mut problems = Vec::new();
    let mut compiled: BTreeMap<&str, Vec<CompiledPolicy>> = BTreeMap::new();
    for ep in endpoints {
        let ns = ep.pod.namespace.as_str();
        if !compiled.contains_key(ns) {
            let policies: Vec<CompiledPolicy> = snapshot.policies_in(ns).map(|p| compile::compile(p, &mut problems)).collect();
            compiled.insert(ns, policies);
        }
    }
    // ClusterNetworkPolicies are cluster-scoped: any of them may select a local pod. Their
    // problems are reported when one does.
    let mut cnp_problems = Vec::new();
    let cluster: Vec<cluster::CompiledCnp> = snapshot
        .cluster_policies()
        .map(|p| {
            let mut own = Vec::new();
            let c = cluster::compile(p, &mut own);
            cnp_problems.push(own);
            c
        })
        .collect();
    let cluster: Vec<&cluster::CompiledCnp> = cluster.iter().collect();
    let mut selects_a_local_pod = vec![false; cluster.len()];

    for ep in eps {
        let policies: Vec<&CompiledPolicy> = compiled.get(ep.pod.namespace.as_str()).into_iter().flatten().collect();
        let policy = tr.endpoint(ep, &policies, &cluster, &mut selects_a_local_pod, options);
        tr.out.endpoints.push(policy);
    }
    tr.finish_sets();
    for (own, used) in cnp_problems.into_iter().zip(selects_a_local_pod) {
        if used {
            problems.extend(own);
        }
    }
    problems.append(&mut out.problems);
    problems.sort();
    problems.dedup();
    out.problems = problems;
    out.dns_resolvers = options.dns_resolvers.as_ref().map(|r| r.addresses(snapshot)).unwrap_or_default();
    out.overlay = options.overlay_port.map(|port| OverlayGuard::of(snapshot, port, options.overlay_node.as_deref()));
    out
}

/// Validates every policy in the snapshot (for tools that report on all of them).
pub fn validate_all(snapshot: &Snapshot) -> Vec<PolicyProblem> {
    let mut problems = Vec::new();
    for p in snapshot.policies() {
        compile::compile(p, &mut problems);
    }
    for p in snapshot.cluster_policies() {
        cluster::compile(p, &mut problems);
    }
    problems
}

/// The pod an endpoint belongs to: by uid when the runtime gave one (and it agrees on the
/// name), else the live pod with that namespace/name.
fn pod_of<'s>(snapshot: &'s Snapshot, ep: &LocalEndpoint) -> Option<&'s Pod> {
    match &ep.pod_uid {
        Some(uid) => snapshot.pod(uid).filter(|p| p.namespace == ep.pod.namespace && p.name == ep.pod.name),
        None => snapshot.pod_by_name(&ep.pod),
    }
}

/// What [`Addresses`] needs of a local endpoint's pod: its uid and node.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PodIdent<'a> {
    pub(crate) uid: &'a str,
    pub(crate) node: Option<&'a str>,
}

impl<'a> PodIdent<'a> {
    pub(crate) fn of(pod: &'a Pod) -> Self {
        Self { uid: &pod.uid, node: pod.node.as_deref() }
    }
}

/// Who owns an address, for peer sets.
///
/// - An address of one of this node's endpoints belongs to that endpoint's pod, and a local
///   pod's addresses are its endpoint's (flock-cni's ADD is authoritative here; the API's
///   `podIPs` may still be empty or stale). An endpoint whose pod is not in the snapshot yet
///   still holds its addresses: no other pod gets them.
/// - Any other address belongs to the newest live (not terminal, not host-networked) pod
///   reporting it, by `creationTimestamp`, then uid; an address is never in two pods' names.
pub(crate) struct Addresses<'a> {
    snapshot: &'a Snapshot,
    /// Local pod uid → its endpoint's addresses.
    local_pods: BTreeMap<&'a str, &'a [IpAddr]>,
    /// Local endpoint address → its pod's uid (`None`: a pod not in the snapshot yet).
    local_addrs: BTreeMap<IpAddr, Option<&'a str>>,
    /// The `spec.nodeName`s of the local pods (one, normally): a pod on another node is not
    /// local, known without a uid lookup (peer sets ask it of every pod of the cluster).
    local_nodes: Vec<Option<&'a str>>,
    /// The lowest and highest local address per family, as integers: an address outside
    /// is not local, known without a lookup (asked of every peer address of the cluster).
    local_span: [Option<(u128, u128)>; 2],
}

impl<'a> Addresses<'a> {
    /// `endpoints` de-duplicated by interface, in order (the first claim of an address wins).
    pub(crate) fn new(snapshot: &'a Snapshot, endpoints: &[&'a LocalEndpoint]) -> Self {
        let pods: Vec<Option<PodIdent<'a>>> = endpoints.iter().map(|ep| pod_of(snapshot, ep).map(PodIdent::of)).collect();
        Self::of_pods(snapshot, endpoints, &pods)
    }

    /// [`Self::new`] with each endpoint's pod already known (`pods[i]` is `endpoints[i]`'s):
    /// a lookup among all the cluster's pods is not repeated.
    pub(crate) fn of_pods(snapshot: &'a Snapshot, endpoints: &[&'a LocalEndpoint], pods: &[Option<PodIdent<'a>>]) -> Self {
        let mut local_pods = BTreeMap::new();
        let mut local_addrs = BTreeMap::new();
        let mut local_nodes = Vec::new();
        for (ep, pod) in endpoints.iter().zip(pods) {
            let uid = pod.map(|p| p.uid);
            if let Some(pod) = pod {
                local_pods.entry(pod.uid).or_insert(ep.addrs.as_slice());
                if !local_nodes.contains(&pod.node) {
                    local_nodes.push(pod.node);
                }
            }
            for ip in &ep.addrs {
                local_addrs.entry(*ip).or_insert(uid);
            }
        }
        let span = |v6: bool| {
            let mut ips = local_addrs.keys().filter(|ip| ip.is_ipv6() == v6);
            let first = ips.next().copied()?;
            Some((addr_int(first), addr_int(ips.next_back().copied().unwrap_or(first))))
        };
        let local_span = [span(false), span(true)];
        Self { snapshot, local_pods, local_addrs, local_nodes, local_span }
    }

    /// The addresses `pod` reports: its endpoint's on this node, else its `podIPs`.
    fn reported(&self, pod: &'a Pod) -> &'a [IpAddr] {
        if !self.local_nodes.contains(&pod.node.as_deref()) {
            return &pod.ips;
        }
        self.local_pods.get(pod.uid.as_str()).copied().unwrap_or(&pod.ips)
    }

    /// The local pod holding endpoint address `ip` (`Some(None)`: an endpoint whose pod is
    /// not in the snapshot yet), if `ip` is a local endpoint's.
    fn local_owner(&self, ip: &IpAddr) -> Option<Option<&'a str>> {
        let (lo, hi) = self.local_span[usize::from(ip.is_ipv6())]?;
        if !(lo..=hi).contains(&addr_int(*ip)) {
            return None;
        }
        self.local_addrs.get(ip).copied()
    }

    /// Whether `pod` owns `ip` (see the type's doc).
    fn owns(&self, pod: &Pod, ip: &IpAddr) -> bool {
        if let Some(owner) = self.local_owner(ip) {
            return owner == Some(pod.uid.as_str());
        }
        if !self.snapshot.is_contested(ip) {
            return true;
        }
        // Rivals: other live pods whose reported addresses include `ip`. A local pod's
        // addresses are its endpoint's, and this one is not among them.
        let newer_rival = self.snapshot.pods_with_ip(ip).any(|other| {
            other.uid != pod.uid
                && !other.phase.is_terminal()
                && !other.host_network
                && !self.local_pods.contains_key(other.uid.as_str())
                && (other.created, &other.uid) > (pod.created, &pod.uid)
        });
        !newer_rival
    }

    /// The addresses of `pod` as a peer: those it reports and owns (none if it cannot be a
    /// peer at all).
    pub(crate) fn of(&self, pod: &'a Pod) -> impl Iterator<Item = IpAddr> + '_ {
        let live = !pod.phase.is_terminal() && !pod.host_network && !pod.unpublished;
        self.reported(pod).iter().filter(move |ip| live && self.owns(pod, ip)).copied()
    }

    /// Whether `pod` is a peer: live, not host-networked, with an address it owns.
    pub(crate) fn is_peer(&self, pod: &'a Pod) -> bool {
        self.of(pod).next().is_some()
    }
}

/// An address as an integer (IPv4 in the low 32 bits), for comparisons within one family.
pub(crate) fn addr_int(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The first and last address of `n` as integers ([`addr_int`]).
pub(crate) fn net_ints(n: &ipnet::IpNet) -> (u128, u128) {
    (addr_int(n.network()), addr_int(n.broadcast()))
}

/// Where "every pod" is a range, not each pod's address: the Nodes' `podCIDRs`, merged, less
/// the nodes' own addresses inside them (a node is no pod, whatever its address).
///
/// A set of every pod in every namespace (`namespaceSelector: {}`, `namespaces: {}`) holds
/// these ranges and, one by one, the live pods' addresses outside them (IPAM from another
/// pool). An address in a range no live pod holds is unused, or a pod the snapshot does not
/// know yet (a pod all the same); the set stays the same as pods come and go. A range wider
/// than /16 (IPv4) or /48 (IPv6) is not taken: nobody's pod CIDR, its pods go one by one.
pub(crate) struct PodRanges {
    v4: Vec<(ipnet::Ipv4Net, String)>,
    v6: Vec<(ipnet::Ipv6Net, String)>,
    /// The same ranges as (first, last) address per family, for [`Self::contains`].
    spans: [Vec<(u128, u128)>; 2],
}

impl PodRanges {
    const WIDEST_V4: u8 = 16;
    const WIDEST_V6: u8 = 48;

    pub(crate) fn of(snapshot: &Snapshot) -> Self {
        use ipnet::IpNet;
        let mut nets: Vec<(IpNet, &str)> = snapshot
            .nodes()
            .flat_map(|n| n.pod_cidrs.iter().map(move |c| (c.trunc(), n.name.as_str())))
            .filter(|(c, _)| c.prefix_len() >= if c.addr().is_ipv4() { Self::WIDEST_V4 } else { Self::WIDEST_V6 })
            .collect();
        // By network, then length: a range inside another comes after it and is dropped.
        // Those kept are disjoint, so only the last one kept can hold the next.
        nets.sort();
        let mut merged: Vec<(IpNet, &str)> = Vec::with_capacity(nets.len());
        for (net, node) in nets {
            if !merged.last().is_some_and(|(m, _)| m.contains(&net)) {
                merged.push((net, node));
            }
        }
        let mut node_addrs: Vec<IpNet> =
            snapshot.nodes().flat_map(|n| n.internal_ips.iter().chain(&n.addresses)).map(|a| IpNet::from(*a)).collect();
        node_addrs.sort();
        node_addrs.dedup();
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for (cidr, node) in merged {
            // The node addresses inside are a run of the sorted list (host prefixes order by
            // address): found by search, not by testing every node's against every range.
            let from = node_addrs.partition_point(|a| *a < cidr);
            let except: Vec<IpNet> = node_addrs[from..].iter().take_while(|a| cidr.contains(*a)).copied().collect();
            let comment = format!("pod CIDR of node {}", clip(node));
            for net in (IpBlockDef { cidr, except }).prefixes() {
                match net {
                    IpNet::V4(n) => v4.push((n, comment.clone())),
                    IpNet::V6(n) => v6.push((n, comment.clone())),
                }
            }
        }
        v4.sort();
        v6.sort();
        let spans =
            [v4.iter().map(|(n, _)| net_ints(&IpNet::V4(*n))).collect(), v6.iter().map(|(n, _)| net_ints(&IpNet::V6(*n))).collect()];
        Self { v4, v6, spans }
    }

    /// The address intervals between the ranges (and before and after them), per family.
    fn gaps(&self) -> Vec<(IpAddr, IpAddr)> {
        let mut out = Vec::new();
        for (i, spans) in self.spans.iter().enumerate() {
            let (max, addr): (u128, fn(u128) -> IpAddr) = if i == 0 {
                (u128::from(u32::MAX), |a| IpAddr::from(std::net::Ipv4Addr::from(u32::try_from(a).unwrap_or(u32::MAX))))
            } else {
                (u128::MAX, |a| IpAddr::from(std::net::Ipv6Addr::from(a)))
            };
            let mut next = Some(0u128);
            for (first, last) in spans {
                if let Some(start) = next
                    && start < *first
                {
                    out.push((addr(start), addr(first - 1)));
                }
                next = last.checked_add(1);
            }
            if let Some(start) = next.filter(|s| *s <= max) {
                out.push((addr(start), addr(max)));
            }
        }
        out
    }

    /// Whether a range holds `ip` (the ranges are disjoint and sorted).
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        let (spans, key) = (&self.spans[usize::from(ip.is_ipv6())], addr_int(ip));
        let i = spans.partition_point(|(first, _)| *first <= key);
        i > 0 && spans[i - 1].1 >= key
    }

    /// Whether `def` is every pod in every namespace.
    pub(crate) fn serve(def: &PeerDef) -> bool {
        matches!(def, PeerDef::Pods { namespaces: NsScope::Matching(s), pods: None } if s.is_everything())
    }
}

/// Translates endpoints into `out`, computing each peer and named-port set the rules refer to
/// unless `out` already has it (the incremental path keeps sets up to date itself).
struct Translator<'a, 'o> {
    snapshot: &'a Snapshot,
    addresses: Addresses<'a>,
    out: &'o mut NodePolicy,
    /// When kept: the sets computed (what the incremental path reports as new).
    added: Option<Vec<PeerMatch>>,
    /// Peer sets named but not computed yet ([`Self::finish_sets`]).
    pending: std::collections::BTreeSet<PeerDef>,
}

impl<'a> Translator<'a, '_> {
    fn pod_of(&self, ep: &LocalEndpoint) -> Option<&'a Pod> {
        pod_of(self.snapshot, ep)
    }

    fn endpoint(
        &mut self,
        ep: &LocalEndpoint,
        policies: &[&CompiledPolicy],
        cluster: &[&cluster::CompiledCnp],
        selects_a_local_pod: &mut [bool],
        options: &Options,
    ) -> EndpointPolicy {
        let mut policy = EndpointPolicy {
            interface: ep.interface.clone(),
            pod: ep.pod.clone(),
            addrs: ep.addrs.clone(),
            ingress: DirectionPolicy::default(),
            egress: DirectionPolicy::default(),
            log_allowed: false,
        };
        let Some(pod) = self.pod_of(ep) else {
            policy.ingress.isolated_by.push(Isolation::UnknownPod);
            policy.egress.isolated_by.push(Isolation::UnknownPod);
            return policy;
        };
        policy.log_allowed = self.snapshot.namespace(&pod.namespace).is_some_and(|n| n.log_allowed);
        // Audited policies are left out of what is enforced. Never for a sandboxed run's
        // pod: flock's own isolation of runs does not open for an audit.
        let auditing = options.audit_mode && !pod.labels.contains_key(RUN_LABEL);
        let ns_audit = self.snapshot.namespace(&pod.namespace).is_some_and(|n| n.audit);
        let audited = |c: &CompiledPolicy| auditing && (c.audit || ns_audit);
        let audited_cnp = |c: &cluster::CompiledCnp| auditing && c.audit;
        self.directions(pod, &mut policy, policies, cluster, selects_a_local_pod, options, &|c| !audited(c), &|c| !audited_cnp(c));
        let ns_labels = self.snapshot.namespace(&pod.namespace).map(|n| &n.labels);
        let audit_applies = policies.iter().any(|c| audited(c) && c.selector.matches(&pod.labels))
            || cluster.iter().any(|c| audited_cnp(c) && c.subject.matches(ns_labels, &pod.labels));
        if audit_applies {
            let mut all = EndpointPolicy { ingress: DirectionPolicy::default(), egress: DirectionPolicy::default(), ..policy.clone() };
            self.directions(pod, &mut all, policies, cluster, selects_a_local_pod, options, &|_| true, &|_| true);
            for (enforced, with_audit) in [(&mut policy.ingress, all.ingress), (&mut policy.egress, all.egress)] {
                if *enforced != with_audit {
                    enforced.audit = Some(Box::new(with_audit));
                }
            }
        }
        policy
    }

    /// Both directions of `policy` (for the local `pod`) from the NetworkPolicies and
    /// ClusterNetworkPolicies `include` and `include_cnp` keep.
    #[allow(clippy::too_many_arguments)]
    fn directions(
        &mut self,
        pod: &'a Pod,
        policy: &mut EndpointPolicy,
        policies: &[&CompiledPolicy],
        cluster: &[&cluster::CompiledCnp],
        selects_a_local_pod: &mut [bool],
        options: &Options,
        include: &dyn Fn(&CompiledPolicy) -> bool,
        include_cnp: &dyn Fn(&cluster::CompiledCnp) -> bool,
    ) {
        if options.isolate_run_pods && pod.labels.contains_key(RUN_LABEL) {
            policy.egress.isolated_by.push(Isolation::RunPod);
        }
        // The endpoint's own namespace is the pod's (`pod_of` checks it).
        let selecting: Vec<&CompiledPolicy> = policies.iter().copied().filter(|c| include(c) && c.selector.matches(&pod.labels)).collect();
        for dir in [Direction::Ingress, Direction::Egress] {
            let mut rules = RuleList::default();
            let mut isolated_by = Vec::new();
            for c in selecting.iter().filter(|c| c.affects(dir)) {
                isolated_by.push(Isolation::Policy(c.key.clone()));
                for rule in c.rules(dir) {
                    self.rule(pod, &c.key, dir, rule, &mut rules);
                }
                if dir == Direction::Egress {
                    for d in &c.egress_domains {
                        let origin = RuleOrigin { policy: c.key.clone(), direction: dir, index: d.index, domains: true };
                        Self::domain_allows(d, &origin, &mut rules);
                    }
                }
            }
            let slot = match dir {
                Direction::Ingress => &mut policy.ingress,
                Direction::Egress => &mut policy.egress,
            };
            slot.isolated_by.extend(isolated_by);
            slot.rules = rules.rules;
        }
        // The tiers. flock's own isolation of a run pod whose policy does not exist yet is
        // above all of them: no Admin Accept opens it.
        let ns_labels = self.snapshot.namespace(&pod.namespace).map(|n| &n.labels);
        for dir in [Direction::Ingress, Direction::Egress] {
            let slot = match dir {
                Direction::Ingress => &mut policy.ingress,
                Direction::Egress => &mut policy.egress,
            };
            if slot.isolated_by == [Isolation::RunPod] {
                continue;
            }
            let (mut admin, mut baseline): (ByPriority, ByPriority) = (BTreeMap::new(), BTreeMap::new());
            for (i, c) in cluster.iter().enumerate() {
                if !c.subject.matches(ns_labels, &pod.labels) {
                    continue;
                }
                selects_a_local_pod[i] = true;
                if !include_cnp(c) {
                    continue;
                }
                if c.rules(dir).is_empty() {
                    continue;
                }
                let rules = self.tier_rules(pod, c, dir);
                let group = match c.tier {
                    Tier::Admin => admin.entry(c.priority).or_default(),
                    Tier::Baseline => baseline.entry(c.priority).or_default(),
                };
                group.push(TierPolicy { name: c.name.clone(), rules });
            }
            let groups = |m: ByPriority| -> Vec<PriorityGroup> {
                m.into_iter().map(|(priority, policies)| PriorityGroup { priority, policies }).collect()
            };
            let (admin, baseline) = (groups(admin), groups(baseline));
            for g in admin.iter().chain(&baseline).filter(|g| g.policies.len() > 1 && g.priority.is_some()) {
                let names: Vec<&str> = g.policies.iter().map(|p| p.name.as_str()).collect();
                for p in &g.policies {
                    self.out.problems.push(PolicyProblem {
                        kind: PolicyKind::ClusterNetworkPolicy,
                        policy: ObjectRef::new("", p.name.clone()),
                        field: "spec.priority".into(),
                        message: format!(
                            "the same priority as {} in the same tier, selecting the same pods for {dir}: the API leaves their order undefined; flock takes Deny over Pass over Accept",
                            names.iter().filter(|n| **n != p.name).map(|n| clip(n).to_string()).collect::<Vec<_>>().join(", "),
                        ),
                    });
                }
            }
            slot.admin = admin;
            slot.baseline = baseline;
        }
    }

    /// One ClusterNetworkPolicy's rules of `dir` for the local `pod`, in order.
    fn tier_rules(&mut self, pod: &Pod, c: &cluster::CompiledCnp, dir: Direction) -> Vec<TierRule> {
        let mut out = Vec::new();
        for rule in c.rules(dir) {
            let origin = CnpOrigin {
                policy: c.name.clone(),
                direction: dir,
                index: rule.index,
                name: rule.name.clone(),
                fail_closed: rule.fail_closed.clone(),
            };
            let (peers, specs) = match &rule.matches {
                cluster::RuleMatch::Everything => {
                    out.push(TierRule { action: rule.action, peer: PeerMatch::Any, ports: PortMatch::Any, origin });
                    continue;
                }
                cluster::RuleMatch::Peers { peers, ports } => (peers, ports),
            };
            for peer in peers {
                let def = match peer {
                    cluster::CnpPeerDef::Domains(domains) => {
                        Self::domain_rules(rule.action, domains, specs.as_deref(), &origin, &mut out);
                        continue;
                    }
                    cluster::CnpPeerDef::Pods(def) | cluster::CnpPeerDef::Network(def) => def,
                };
                let Some(specs) = specs else {
                    let m = self.peer_match(Some(def));
                    out.push(TierRule { action: rule.action, peer: m, ports: PortMatch::Any, origin: origin.clone() });
                    continue;
                };
                let mut by_protocol: BTreeMap<crate::model::Protocol, Vec<(u16, u16)>> = BTreeMap::new();
                for spec in specs {
                    match spec {
                        cluster::CnpPortSpec::Range(p, s, e) => by_protocol.entry(*p).or_default().push((*s, *e)),
                        // A named port is the container port's protocol and number, on the
                        // destination: the local pod for ingress, each peer pod for egress.
                        cluster::CnpPortSpec::Named(name) => match dir {
                            Direction::Ingress => {
                                for cp in pod.ports.iter().filter(|cp| cp.name.as_deref() == Some(name.as_str())) {
                                    by_protocol.entry(cp.protocol).or_default().push((cp.port, cp.port));
                                }
                            }
                            Direction::Egress => {
                                for protocol in crate::model::Protocol::ALL {
                                    let npd = NamedPortDef { dest: Some(def.clone()), protocol, name: name.clone() };
                                    self.named_port_set(&npd);
                                    out.push(TierRule {
                                        action: rule.action,
                                        peer: PeerMatch::NamedPort(npd),
                                        ports: PortMatch::Any,
                                        origin: origin.clone(),
                                    });
                                }
                            }
                        },
                    }
                }
                for (p, ranges) in by_protocol {
                    let m = self.peer_match(Some(def));
                    out.push(TierRule {
                        action: rule.action,
                        peer: m,
                        ports: PortMatch::Protocol(p, PortRanges::from_ranges(ranges)),
                        origin: origin.clone(),
                    });
                }
            }
        }
        out
    }

    /// The matchers of a `domainNames` peer: one per protocol of the rule's ports (named
    /// ports never go with one: `cluster::compile` refuses them).
    fn domain_rules(
        action: Action,
        domains: &DomainDef,
        specs: Option<&[cluster::CnpPortSpec]>,
        origin: &CnpOrigin,
        out: &mut Vec<TierRule>,
    ) {
        let peer = PeerMatch::Domains(domains.clone());
        let Some(specs) = specs else {
            out.push(TierRule { action, peer, ports: PortMatch::Any, origin: origin.clone() });
            return;
        };
        let mut by_protocol: BTreeMap<crate::model::Protocol, Vec<(u16, u16)>> = BTreeMap::new();
        for spec in specs {
            if let cluster::CnpPortSpec::Range(p, s, e) = spec {
                by_protocol.entry(*p).or_default().push((*s, *e));
            }
        }
        for (p, ranges) in by_protocol {
            out.push(TierRule {
                action,
                peer: peer.clone(),
                ports: PortMatch::Protocol(p, PortRanges::from_ranges(ranges)),
                origin: origin.clone(),
            });
        }
    }

    /// The allow rules of an entry of a policy's `flock.dev/egress-domains` annotation: one per
    /// protocol of its ports.
    fn domain_allows(d: &compile::CompiledDomains, origin: &RuleOrigin, out: &mut RuleList) {
        let peer = PeerMatch::Domains(d.domains.clone());
        let Some(specs) = &d.ports else {
            out.push(peer, PortMatch::Any, origin);
            return;
        };
        let mut by_protocol: BTreeMap<crate::model::Protocol, Vec<(u16, u16)>> = BTreeMap::new();
        for spec in specs {
            if let PortSpec::Range(p, s, e) = spec {
                by_protocol.entry(*p).or_default().push((*s, *e));
            }
        }
        for (p, ranges) in by_protocol {
            out.push(peer.clone(), PortMatch::Protocol(p, PortRanges::from_ranges(ranges)), origin);
        }
    }

    /// Expands one policy rule into allow rules for `pod` (the local pod).
    fn rule(&mut self, pod: &Pod, policy: &ObjectRef, dir: Direction, rule: &compile::CompiledRule, out: &mut RuleList) {
        let origin = RuleOrigin { policy: policy.clone(), direction: dir, index: rule.index, domains: false };
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

    /// Notes that the addresses of `def` are needed: computed by [`Self::finish_sets`].
    fn peer_set(&mut self, def: &PeerDef) {
        if self.out.peer_sets.contains_key(def) || self.pending.contains(def) {
            return;
        }
        self.pending.insert(def.clone());
        if let Some(added) = &mut self.added {
            added.push(PeerMatch::Addresses(def.clone()));
        }
    }

    /// Computes the peer sets noted since the last call into the output. They are computed
    /// apart from the rules that name them (no rule reads a set's addresses) and, for a
    /// large cluster, side by side ([`par::map`]): a set of many pods is bound by the reads
    /// of pods far apart in memory, which cores do in parallel.
    fn finish_sets(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        // One set (a pod's change) is computed here whatever it weighs: not weighed.
        let weigh = pending.len() > 1;
        let defs: Vec<(usize, PeerDef)> = pending.into_iter().map(|d| (if weigh { self.scope_size(&d) } else { 0 }, d)).collect();
        let sets = par::map(&defs, |d| self.address_set(d));
        for ((_, def), set) in defs.into_iter().zip(sets) {
            self.out.peer_sets.insert(def, std::sync::Arc::new(set));
        }
    }

    /// About how many pods computing the set of `def` visits (to share the work out).
    fn scope_size(&self, def: &PeerDef) -> usize {
        match def {
            PeerDef::Block(_) | PeerDef::Nodes(_) => 1,
            PeerDef::Pods { namespaces: NsScope::Named(ns), .. } => self.snapshot.pod_count_in(ns),
            PeerDef::Pods { namespaces: NsScope::Matching(sel), pods: None } if sel.is_everything() => 1,
            PeerDef::Pods { namespaces: NsScope::Matching(sel), .. } => {
                self.snapshot.namespaces().filter(|ns| sel.matches(&ns.labels)).map(|ns| self.snapshot.pod_count_in(&ns.name)).sum()
            }
        }
    }

    /// The addresses of `def`, each with its source's name.
    fn address_set(&self, def: &PeerDef) -> AddressSet {
        let mut set = AddressSet::default();
        match def {
            PeerDef::Block(b) => {
                let comment = format!("ipBlock {}", b.cidr);
                for net in b.prefixes() {
                    set.insert(net, &comment);
                }
            }
            PeerDef::Nodes(sel) => {
                for node in self.snapshot.nodes().filter(|n| sel.matches(&n.labels)) {
                    let name = format!("node {}", node.name);
                    for ip in &node.addresses {
                        set.insert(ipnet::IpNet::from(*ip), &name);
                    }
                }
            }
            PeerDef::Pods { namespaces: NsScope::Matching(sel), pods: None } if sel.is_everything() => {
                let ranges = PodRanges::of(self.snapshot);
                let mut entries: Vec<(ipnet::IpNet, String)> = Vec::new();
                entries.extend(ranges.v4.iter().map(|(n, c)| (ipnet::IpNet::V4(*n), c.clone())));
                entries.extend(ranges.v6.iter().map(|(n, c)| (ipnet::IpNet::V6(*n), c.clone())));
                // The pods with an address outside the ranges, found without visiting the
                // others: those whose status reports one (the snapshot's index of reported
                // addresses, between the ranges), and the local pods (they report their
                // endpoints' addresses).
                let snapshot = self.snapshot;
                let mut outside: BTreeMap<&str, &Pod> = BTreeMap::new();
                for (from, to) in ranges.gaps() {
                    for ip in snapshot.reported_ips(from, to) {
                        outside.extend(snapshot.pods_with_ip(ip).map(|p| (p.uid.as_str(), p)));
                    }
                }
                outside.extend(self.addresses.local_pods.keys().filter_map(|uid| snapshot.pod(uid)).map(|p| (p.uid.as_str(), p)));
                for pod in outside.into_values() {
                    if snapshot.namespace(&pod.namespace).is_some_and(|ns| sel.matches(&ns.labels)) {
                        self.pod_entries(&pod.namespace, pod, |ip| !ranges.contains(ip), &mut entries);
                    }
                }
                set = AddressSet::from_entries(entries);
            }
            PeerDef::Pods { namespaces, pods } => {
                // In passes, each with a small body, so that the reads of many pods are in
                // flight at once (a cluster's pods are far apart in memory): the addresses
                // and where the names are first, then, in address order, the comments
                // (allocated in the order the set holds them, which is the order the renderer
                // reads them in).
                let mut names: Vec<&str> = Vec::new();
                let (mut v4, mut v6) = (Vec::new(), Vec::new());
                for (ns, pod) in scoped_pods(self.snapshot, namespaces, pods.as_ref()) {
                    // The namespace's name is one string for all its pods.
                    if !names.last().is_some_and(|last| std::ptr::eq(*last, ns)) {
                        names.push(ns);
                    }
                    let at = names.len() - 1;
                    for ip in self.addresses.of(pod) {
                        match ip {
                            IpAddr::V4(a) => v4.push((u32::from(a), at, pod.name.as_str())),
                            IpAddr::V6(a) => v6.push((u128::from(a), at, pod.name.as_str())),
                        }
                    }
                }
                // Maps from sorted input: built without a search per entry.
                let name = |at: usize, pod: &str| pod_name(names[at], pod);
                set = AddressSet {
                    v4: by_address(v4).map(|(a, at, pod)| (ipnet::Ipv4Net::from(Ipv4Addr::from(a)), name(at, pod))).collect(),
                    v6: by_address(v6).map(|(a, at, pod)| (ipnet::Ipv6Net::from(Ipv6Addr::from(a)), name(at, pod))).collect(),
                };
            }
        }
        set
    }

    /// `pod`'s peer addresses that `keep` keeps, each with the pod's name, onto `out`
    /// (`namespace`: the pod's).
    fn pod_entries(&self, namespace: &str, pod: &'a Pod, keep: impl Fn(IpAddr) -> bool, out: &mut Vec<(ipnet::IpNet, String)>) {
        let mut ips = self.addresses.of(pod).filter(|ip| keep(*ip)).peekable();
        if ips.peek().is_none() {
            return;
        }
        let mut name = pod_name(namespace, &pod.name);
        while let Some(ip) = ips.next() {
            let comment = if ips.peek().is_some() { name.clone() } else { std::mem::take(&mut name) };
            out.push((ipnet::IpNet::from(ip), comment));
        }
    }

    /// Computes (once) the (address, protocol, port) triples of `def`.
    fn named_port_set(&mut self, def: &NamedPortDef) {
        if self.out.port_sets.contains_key(def) {
            return;
        }
        let mut set = PortAddressSet::default();
        let named = |cp: &&crate::model::ContainerPort| cp.protocol == def.protocol && cp.name.as_deref() == Some(def.name.as_str());
        let candidates: Vec<&Pod> = match &def.dest {
            // Every pod: those with the port first, the cheaper test.
            None => self.snapshot.pods().filter(|p| p.ports.iter().any(|cp| named(&cp)) && self.addresses.is_peer(p)).collect(),
            Some(dest) => self.pods_of(dest),
        };
        for pod in candidates {
            let name = format!("{}/{}", pod.namespace, pod.name);
            for cp in pod.ports.iter().filter(named) {
                for ip in self.addresses.of(pod) {
                    if let Some(PeerDef::Block(b)) = &def.dest
                        && !b.contains(ip)
                    {
                        continue;
                    }
                    set.insert(ip, cp.protocol, cp.port, &name);
                }
            }
        }
        self.out.port_sets.insert(def.clone(), std::sync::Arc::new(set));
        if let Some(added) = &mut self.added {
            added.push(PeerMatch::NamedPort(def.clone()));
        }
    }

    /// The peer pods a definition selects. For an ipBlock: the pods with an address inside it.
    fn pods_of(&self, def: &PeerDef) -> Vec<&'a Pod> {
        let (snapshot, addresses) = (self.snapshot, &self.addresses);
        match def {
            // Node addresses are not pods' (named ports never go with a nodes peer).
            PeerDef::Nodes(_) => Vec::new(),
            PeerDef::Block(b) => snapshot
                .pods()
                .filter(|p| addresses.reported(p).iter().any(|ip| b.contains(*ip)) && addresses.of(p).any(|ip| b.contains(ip)))
                .collect(),
            PeerDef::Pods { namespaces, pods } => {
                scoped_pods(snapshot, namespaces, pods.as_ref()).map(|(_, p)| p).filter(|p| addresses.is_peer(p)).collect()
            }
        }
    }
}

/// `found` in address order, an address listed twice once: with its first listing (a
/// stable sort), as [`AddressSet::insert`] keeps the first comment. Sorted as integers,
/// which compare faster than addresses.
fn by_address<K: Ord + Copy, T>(mut found: Vec<(K, usize, T)>) -> impl Iterator<Item = (K, usize, T)> {
    ir::first_by_key(&mut found, |f| f.0);
    found.into_iter()
}

/// `namespace/name` of `pod` (`namespace`: the pod's), without the formatting machinery:
/// once per pod of the cluster.
fn pod_name(namespace: &str, pod: &str) -> String {
    let mut name = String::with_capacity(namespace.len() + 1 + pod.len());
    name.push_str(namespace);
    name.push('/');
    name.push_str(pod);
    name
}

/// The pods of the namespaces of `namespaces` whose labels `pods` selects (`None`: all),
/// peers or not, namespace by namespace, each with its namespace's name as the snapshot's
/// index holds it (read once per namespace, where each pod's own copy is a cache miss).
fn scoped_pods<'a: 's, 's>(
    snapshot: &'a Snapshot,
    namespaces: &'s NsScope,
    pods: Option<&'s selector::Selector>,
) -> Box<dyn Iterator<Item = (&'s str, &'a Pod)> + 's> {
    let names: Box<dyn Iterator<Item = &'s str> + 's> = match namespaces {
        NsScope::Named(ns) => Box::new(std::iter::once(ns.as_str())),
        NsScope::Matching(sel) => Box::new(snapshot.namespaces().filter(move |ns| sel.matches(&ns.labels)).map(|ns| ns.name.as_str())),
    };
    Box::new(
        names
            .flat_map(move |ns| snapshot.pods_in(ns).map(move |p| (ns, p)))
            .filter(move |(_, p)| pods.is_none_or(|s| s.matches(&p.labels))),
    )
}

/// One tier's policies selecting a pod, by priority (`None`, unplaceable, first).
type ByPriority = BTreeMap<Option<i64>, Vec<TierPolicy>>;

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
