//! The snapshot: flock's plain-data view of the cluster, the only shape the later stages see.
//!
//! Kubernetes objects become these types in exactly one place per source ([`manifest`] for
//! files; the informer source for a live cluster), keeping only what policy needs: namespace
//! labels; per pod its key, uid, labels, node, phase, addresses, `hostNetwork` and container
//! ports; NetworkPolicies; Nodes (pod CIDRs, InternalIPs) for routing; and this node's local
//! endpoints (pod → host interface, addresses), which come from the CNI plugin.
//!
//! NetworkPolicies are kept *as written* (strings for protocols, CIDRs and operators) because
//! a policy the API server would reject must still be representable: the translator isolates
//! its pods and reports the problem instead of guessing. Everything is ordered (`BTreeMap`) so
//! no hash order can leak into rendered output.

mod clip;
pub mod cnp;
pub mod convert;
pub(crate) mod labels;
pub mod manifest;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use sha2::{Digest, Sha256};

#[cfg(test)]
pub(crate) use clip::MAX_CLIP;
pub(crate) use clip::clip;
pub use labels::Labels;

/// `namespace/name` of a namespaced object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ObjectRef {
    pub(crate) namespace: String,
    pub name: String,
}

impl ObjectRef {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }

    /// The object's namespace (empty for a cluster-scoped one).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `namespace/name`, both parts non-empty and one `/`.
    pub fn parse(s: &str) -> Option<Self> {
        let (ns, name) = s.split_once('/')?;
        (!ns.is_empty() && !name.is_empty() && !name.contains('/')).then(|| Self::new(ns, name))
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// An IP family: of an address, a probe, a set or a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Self::V4 } else { Self::V6 }
    }

    /// `IPv4`, `IPv6`: as the case format, reports and comments spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }

    /// `IPv4`/`ipv4`/`4`, `IPv6`/`ipv6`/`6`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "IPv4" | "ipv4" | "4" => Some(Self::V4),
            "IPv6" | "ipv6" | "6" => Some(Self::V6),
            _ => None,
        }
    }

    /// `v4`, `v6`: the suffix of per-family object names.
    pub(crate) fn tag(self) -> &'static str {
        match self {
            Self::V4 => "v4",
            Self::V6 => "v6",
        }
    }

    /// 0 and 1: an index into per-family pairs.
    pub(crate) fn index(self) -> usize {
        match self {
            Self::V4 => 0,
            Self::V6 => 1,
        }
    }
}

/// The label that marks a pod of a sandboxed run: egress-isolated even while no policy
/// selects it (`translate::Options::isolate_run_pods`); flock-controller writes its policies
/// with it too.
pub const RUN_LABEL: &str = "flock.dev/run";

/// The annotation that puts a NetworkPolicy, a namespace's NetworkPolicies or a
/// ClusterNetworkPolicy in audit mode: exactly `audit` (anything else enforces), and only
/// where the agent runs with `--allow-audit-mode`.
pub(crate) const ENFORCEMENT_ANNOTATION: &str = "flock.dev/enforcement";
/// The namespace annotation that logs allowed new connections of its pods: exactly `true`.
pub(crate) const LOG_ALLOWED_ANNOTATION: &str = "flock.dev/log-allowed";
/// The NetworkPolicy annotation with a policy's egress by domain name (NPEP-133), which
/// flock-controller writes from a RunProfile's `domains` and flock-agent enforces. Its value
/// is JSON, sorted by name, each entry's ports sorted:
/// `[{"name":"github.com","ports":[{"protocol":"TCP","port":443},{"protocol":"UDP","port":5000,"endPort":5010}]}]`
/// — names lowercase without a trailing dot (`*.` leading a wildcard), `protocol` `TCP`,
/// `UDP` or `SCTP`, `endPort` only for a range. Absent: no egress by name. flock-agent
/// honours it on any NetworkPolicy (written by hand too: `ports` empty or absent then means
/// every port, `protocol` defaults to TCP); other enforcers ignore it, which only allows less.
pub const EGRESS_DOMAINS_ANNOTATION: &str = "flock.dev/egress-domains";

/// A namespace: its name and labels, and what its annotations ask of flock.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Namespace {
    pub name: String,
    pub labels: Labels,
    /// Annotated `flock.dev/enforcement: audit`: its NetworkPolicies are audited.
    pub audit: bool,
    /// Annotated `flock.dev/log-allowed: "true"`.
    pub log_allowed: bool,
}

/// The phase of a pod (`status.phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum PodPhase {
    #[default]
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl PodPhase {
    /// Parses `status.phase`; anything unrecognised is `Unknown` (still a live pod).
    pub(crate) fn parse(phase: &str) -> Self {
        match phase {
            "Pending" => Self::Pending,
            "Running" => Self::Running,
            "Succeeded" => Self::Succeeded,
            "Failed" => Self::Failed,
            _ => Self::Unknown,
        }
    }

    /// Succeeded and Failed pods have released their sandbox; their IP may already belong to
    /// another pod.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// A transport protocol NetworkPolicy can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub(crate) const ALL: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

    /// Parses the Kubernetes spelling (`TCP`, `UDP`, `SCTP`; case-sensitive like the API).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }

    /// The Kubernetes spelling.
    pub fn as_k8s(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }

    /// The nft keyword (`tcp`, `udp`, `sctp`).
    pub(crate) fn as_nft(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_k8s())
    }
}

/// A container port declared by a pod (`spec.containers[].ports[]`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ContainerPort {
    /// Interned ([`labels::intern`]): a few names (`http`, `metrics`) repeat on most pods.
    pub name: Option<Arc<str>>,
    pub port: u16,
    pub protocol: Protocol,
}

/// A pod, reduced to what policy needs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub labels: Labels,
    /// `spec.nodeName`; `None` while unscheduled.
    pub node: Option<String>,
    pub phase: PodPhase,
    /// `status.podIPs`, IPv4 and IPv6 (dual-stack pods have both).
    pub ips: Vec<IpAddr>,
    pub host_network: bool,
    pub ports: Vec<ContainerPort>,
    /// `metadata.creationTimestamp`, seconds since the Unix epoch (`None` when unknown, as
    /// in a manifest). Of two live pods reporting one address, the newer owns it: the older
    /// one's sandbox is gone and its status has not caught up yet.
    pub created: Option<i64>,
    /// Known only from this node's own watch, not from the cluster's source of pod
    /// identity (an agent reading PodSlices, before a slice shows the pod): its own chains
    /// follow it, but it is no policy peer anywhere until a slice shows it (fail closed).
    pub unpublished: bool,
}

impl Pod {
    pub fn key(&self) -> ObjectRef {
        ObjectRef::new(self.namespace.clone(), self.name.clone())
    }

    /// Whether this pod can be a policy peer: NetworkPolicy peers are pods with addresses that
    /// are not terminal (their IPs may already be reused) and not host-networked (their
    /// address is the node's, which upstream leaves undefined; flock never treats a node
    /// address as a pod), and published ([`Pod::unpublished`]).
    pub fn is_peer(&self) -> bool {
        !self.phase.is_terminal() && !self.host_network && !self.ips.is_empty() && !self.unpublished
    }
}

/// A uid for a pod from a manifest that has none: deterministic in `namespace/name`, shaped
/// like a Kubernetes uid so it can stand in for one everywhere (interface naming included).
pub fn derived_uid(namespace: &str, name: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"flock-derived-uid/")
        .chain_update(namespace.as_bytes())
        .chain_update(b"\0")
        .chain_update(name.as_bytes())
        .finalize();
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

/// A `LabelSelector` as written (`matchLabels` and `matchExpressions`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` entry as written; the operator is validated by the translator.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: String,
    pub values: Vec<String>,
}

/// `port` of a NetworkPolicyPort: a number or a container port name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum PortRef {
    Number(i32),
    Name(String),
}

/// One entry of a rule's `ports`, as written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct PolicyPort {
    pub protocol: Option<String>,
    pub port: Option<PortRef>,
    pub end_port: Option<i32>,
}

/// `ipBlock` as written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct IpBlock {
    pub cidr: String,
    pub except: Vec<String>,
}

/// One entry of `from`/`to`, as written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct PolicyPeer {
    pub pod_selector: Option<LabelSelector>,
    pub namespace_selector: Option<LabelSelector>,
    pub ip_block: Option<IpBlock>,
}

/// One ingress or egress rule. An empty or missing `peers` list means every peer; an empty
/// or missing `ports` list means every port of every protocol.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct PolicyRule {
    pub peers: Vec<PolicyPeer>,
    pub ports: Vec<PolicyPort>,
}

/// A NetworkPolicy, kept as written (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct NetworkPolicy {
    /// Annotated `flock.dev/enforcement: audit` (and not a sandboxed run's policy, labelled
    /// `flock.dev/run`, which is always enforced).
    pub audit: bool,
    pub namespace: String,
    pub name: String,
    pub pod_selector: LabelSelector,
    /// `spec.policyTypes`; empty means "default from the rules" (the API omits empty lists).
    pub policy_types: Vec<String>,
    pub ingress: Vec<PolicyRule>,
    pub egress: Vec<PolicyRule>,
    /// `metadata.generation` (set by the API server; `None` in manifests). Not enforcement:
    /// the translator ignores it; the agent reports which generation it enforces.
    pub generation: Option<i64>,
    /// The `flock.dev/egress-domains` annotation as written ([`EGRESS_DOMAINS_ANNOTATION`]).
    pub egress_domains: Option<String>,
}

impl NetworkPolicy {
    pub fn key(&self) -> ObjectRef {
        ObjectRef::new(self.namespace.clone(), self.name.clone())
    }
}

/// A node: where its pods' addresses are routed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct Node {
    pub name: String,
    /// `spec.podCIDRs` (or `spec.podCIDR`).
    #[cfg_attr(feature = "arbitrary", arbitrary(with = arbitrary_nets))]
    pub pod_cidrs: Vec<IpNet>,
    /// `status.addresses` of type InternalIP.
    pub internal_ips: Vec<IpAddr>,
    /// Every IP address in `status.addresses` (InternalIP, ExternalIP, …): what a
    /// ClusterNetworkPolicy `nodes` peer matches.
    pub addresses: Vec<IpAddr>,
    pub labels: Labels,
}

/// `ipnet` has no `Arbitrary`: networks from an arbitrary address and prefix length.
#[cfg(feature = "arbitrary")]
fn arbitrary_nets(u: &mut arbitrary::Unstructured<'_>) -> arbitrary::Result<Vec<IpNet>> {
    u.arbitrary_iter::<(IpAddr, u8)>()?
        .map(|r| {
            r.map(|(addr, len)| {
                IpNet::new(addr, len % (if addr.is_ipv4() { 33 } else { 129 })).map_or_else(|_| IpNet::from(addr), |n| n.trunc())
            })
        })
        .collect()
}

/// A pod attachment on this node, as the CNI plugin reported it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct LocalEndpoint {
    /// Host-side interface (`flk` + 12 hex digits, from `flock_cni::host_interface_name`).
    pub interface: String,
    /// The sandbox's container id, or the pod uid where none is known (offline render).
    pub container_id: String,
    pub pod: ObjectRef,
    /// The pod uid the runtime passed (`K8S_POD_UID`), if any.
    pub pod_uid: Option<String>,
    pub addrs: Vec<IpAddr>,
}

impl LocalEndpoint {
    /// The endpoint a runtime would create for `pod` on its node, where no container id is
    /// known (offline render, simulations from manifests): the pod uid stands in for the
    /// container id, and the interface is `eth0`.
    pub fn for_pod(pod: &Pod) -> Self {
        Self {
            interface: flock_cni::host_interface_name(&pod.uid, "eth0"),
            container_id: pod.uid.clone(),
            pod: pod.key(),
            pod_uid: Some(pod.uid.clone()),
            addrs: pod.ips.clone(),
        }
    }
}

/// The whole cluster state the pipeline works from. Pods are keyed by uid (two pods may
/// briefly share a namespace/name across a delete and re-create); an index by namespace keeps
/// selector evaluation proportional to the namespaces a selector can reach. Both maps hold
/// the same shared pod, so walking a namespace's pods costs no lookup per pod (at 150,000
/// pods those lookups were most of the translator's time) and cloning a snapshot copies no
/// pod. A third index by address answers "who reports this IP" without a scan.
/// A shared pod ordered, compared and looked up by its uid.
#[derive(Debug, Clone)]
struct ByUid(Arc<Pod>);

impl PartialEq for ByUid {
    fn eq(&self, other: &Self) -> bool {
        self.0.uid == other.0.uid
    }
}

impl Eq for ByUid {}

impl PartialOrd for ByUid {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByUid {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.uid.cmp(&other.0.uid)
    }
}

impl std::borrow::Borrow<str> for ByUid {
    fn borrow(&self) -> &str {
        &self.0.uid
    }
}

/// An object added, changed or removed in a [`Snapshot`] that records its changes
/// ([`Snapshot::record_changes`]): what the incremental translator
/// (`crate::translate::Incremental`) needs to know to update only what depends on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A pod, by uid. `old_ips`: the addresses it reported before the change (none if new).
    Pod { uid: String, old_ips: Vec<IpAddr> },
    /// A Namespace, by name.
    Namespace(String),
    /// A NetworkPolicy.
    Policy(ObjectRef),
    /// A ClusterNetworkPolicy, by name.
    ClusterPolicy(String),
    /// A Node, by name.
    Node(String),
}

impl Change {
    /// The change of the pod `uid`, to be taken *before* the snapshot changes it.
    pub fn pod_before(snapshot: &Snapshot, uid: &str) -> Self {
        Self::Pod { uid: uid.to_string(), old_ips: snapshot.pod(uid).map(|p| p.ips.clone()).unwrap_or_default() }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    namespaces: BTreeMap<String, Namespace>,
    /// Keyed by the pod's own uid ([`ByUid`]): a separate key string per index cost more
    /// memory than most of a pod's fields.
    pods: BTreeSet<ByUid>,
    pods_by_namespace: BTreeMap<String, BTreeSet<ByUid>>,
    /// Usually one pod per address; more while a reused address's old pod is still listed.
    pods_by_ip: BTreeMap<IpAddr, Vec<Arc<Pod>>>,
    /// The addresses more than one pod reports (rare; the translator checks these only).
    contested: BTreeSet<IpAddr>,
    policies: BTreeMap<ObjectRef, NetworkPolicy>,
    /// ClusterNetworkPolicies by name (cluster-scoped).
    cluster_policies: BTreeMap<String, cnp::ClusterNetworkPolicy>,
    nodes: BTreeMap<String, Node>,
    /// The changes since [`Self::take_changes`], when recorded.
    changes: ChangeLog,
}

/// A snapshot's recorded changes (`None`: not recording). A clone does not record: a
/// recording snapshot replaced wholesale by another (`*snapshot = other`) thus stops
/// recording, which tells its owner that everything may have changed
/// ([`crate::source::SourceWriter::update`]).
#[derive(Debug, Default)]
struct ChangeLog(Option<Vec<Change>>);

impl Clone for ChangeLog {
    fn clone(&self) -> Self {
        Self(None)
    }
}

/// `sorted` with each run of items that are `same` reduced to its last item (after a stable
/// sort by key: "the later one wins", as for a map).
pub(crate) fn keep_last<T>(sorted: Vec<T>, same: impl Fn(&T, &T) -> bool) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(sorted.len());
    for item in sorted {
        match out.last_mut() {
            Some(last) if same(last, &item) => *last = item,
            _ => out.push(item),
        }
    }
    out
}

/// `pods` (in uid order, one per uid) by namespace.
fn namespace_index(pods: &[Arc<Pod>]) -> BTreeMap<String, BTreeSet<ByUid>> {
    // Stable: each namespace's pods stay in uid order.
    let mut by_namespace: Vec<&Arc<Pod>> = pods.iter().collect();
    by_namespace.sort_by(|a, b| a.namespace.cmp(&b.namespace));
    by_namespace
        .chunk_by(|a, b| a.namespace == b.namespace)
        .map(|run| (run[0].namespace.clone(), run.iter().map(|p| ByUid(Arc::clone(p))).collect()))
        .collect()
}

/// `pods` (one per uid) by address, and the addresses more than one reports.
fn address_index(pods: &[Arc<Pod>]) -> (BTreeMap<IpAddr, Vec<Arc<Pod>>>, BTreeSet<IpAddr>) {
    let mut by_ip: Vec<(IpAddr, &Arc<Pod>)> = pods.iter().flat_map(|p| p.ips.iter().map(move |ip| (*ip, p))).collect();
    by_ip.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.uid.cmp(&b.1.uid)));
    by_ip.dedup_by(|a, b| a.0 == b.0 && a.1.uid == b.1.uid);
    let mut contested = BTreeSet::new();
    let index = by_ip
        .chunk_by(|a, b| a.0 == b.0)
        .map(|run| {
            if run.len() > 1 {
                contested.insert(run[0].0);
            }
            (run[0].0, run.iter().map(|(_, p)| Arc::clone(p)).collect())
        })
        .collect();
    (index, contested)
}

impl Snapshot {
    pub fn new() -> Self {
        Self::default()
    }

    /// From now on, every change is recorded until taken ([`Self::take_changes`]).
    pub fn record_changes(&mut self) {
        if self.changes.0.is_none() {
            self.changes.0 = Some(Vec::new());
        }
    }

    /// Whether changes are recorded (a clone of a recording snapshot is not).
    pub(crate) fn is_recording(&self) -> bool {
        self.changes.0.is_some()
    }

    /// The changes recorded since the last call (none when not recording).
    pub fn take_changes(&mut self) -> Vec<Change> {
        self.changes.0.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn record(&mut self, change: impl FnOnce() -> Change) {
        if let Some(changes) = &mut self.changes.0 {
            changes.push(change());
        }
    }

    pub fn upsert_namespace(&mut self, ns: Namespace) {
        self.record(|| Change::Namespace(ns.name.clone()));
        self.namespaces.insert(ns.name.clone(), ns);
    }

    pub(crate) fn remove_namespace(&mut self, name: &str) -> Option<Namespace> {
        self.record(|| Change::Namespace(name.to_string()));
        self.namespaces.remove(name)
    }

    /// A snapshot of many pods at once, as [`Self::upsert_pod`] for each in turn would make it
    /// (of two with one uid, the later stays) but built in bulk: sorted runs instead of one
    /// tree walk per pod and index, several times faster for a whole cluster.
    pub(crate) fn with_pods(pods: impl IntoIterator<Item = Pod>) -> Self {
        let mut all: Vec<Arc<Pod>> = pods.into_iter().map(Arc::new).collect();
        // Stable: of equal uids the later stays last, and is the one kept.
        all.sort_by(|a, b| a.uid.cmp(&b.uid));
        let unique = keep_last(all, |a, b| a.uid == b.uid);
        // The two indexes are independent: a large cluster builds them side by side.
        let (pods_by_namespace, (pods_by_ip, contested)) = if unique.len() < 4096 {
            (namespace_index(&unique), address_index(&unique))
        } else {
            std::thread::scope(|scope| {
                let by_namespace = scope.spawn(|| namespace_index(&unique));
                let by_address = address_index(&unique);
                (by_namespace.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)), by_address)
            })
        };
        let pods: BTreeSet<ByUid> = unique.into_iter().map(ByUid).collect();
        Self { pods, pods_by_namespace, pods_by_ip, contested, ..Self::default() }
    }

    /// Inserts or replaces the pod with this uid.
    pub fn upsert_pod(&mut self, pod: Pod) {
        let pod = Arc::new(pod);
        let old = self.pods.replace(ByUid(Arc::clone(&pod)));
        self.record(|| Change::Pod { uid: pod.uid.clone(), old_ips: old.as_ref().map(|o| o.0.ips.clone()).unwrap_or_default() });
        if let Some(ByUid(old)) = old {
            if old.namespace != pod.namespace {
                self.unindex(&old.namespace, &old.uid);
            }
            self.unindex_ips(&old);
        }
        for ip in &pod.ips {
            let pods = self.pods_by_ip.entry(*ip).or_default();
            pods.push(Arc::clone(&pod));
            if pods.len() > 1 {
                self.contested.insert(*ip);
            }
        }
        // The namespace's set usually exists: no key copy for it.
        match self.pods_by_namespace.get_mut(pod.namespace.as_str()) {
            Some(pods) => {
                pods.replace(ByUid(pod));
            }
            None => {
                self.pods_by_namespace.insert(pod.namespace.clone(), BTreeSet::from([ByUid(pod)]));
            }
        }
    }

    pub fn remove_pod(&mut self, uid: &str) -> Option<Pod> {
        let ByUid(pod) = self.pods.take(uid)?;
        self.record(|| Change::Pod { uid: uid.to_string(), old_ips: pod.ips.clone() });
        self.unindex(&pod.namespace, uid);
        self.unindex_ips(&pod);
        // Unshared now, unless a clone of the snapshot still holds it.
        Some(Arc::try_unwrap(pod).unwrap_or_else(|shared| (*shared).clone()))
    }

    fn unindex(&mut self, namespace: &str, uid: &str) {
        if let Some(pods) = self.pods_by_namespace.get_mut(namespace) {
            pods.remove(uid);
            if pods.is_empty() {
                self.pods_by_namespace.remove(namespace);
            }
        }
    }

    fn unindex_ips(&mut self, pod: &Pod) {
        for ip in &pod.ips {
            if let Some(pods) = self.pods_by_ip.get_mut(ip) {
                pods.retain(|p| p.uid != pod.uid);
                if pods.len() < 2 {
                    self.contested.remove(ip);
                }
                if pods.is_empty() {
                    self.pods_by_ip.remove(ip);
                }
            }
        }
    }

    pub fn upsert_policy(&mut self, policy: NetworkPolicy) {
        self.record(|| Change::Policy(policy.key()));
        self.policies.insert(policy.key(), policy);
    }

    pub fn remove_policy(&mut self, key: &ObjectRef) -> Option<NetworkPolicy> {
        self.record(|| Change::Policy(key.clone()));
        self.policies.remove(key)
    }

    pub fn upsert_cluster_policy(&mut self, policy: cnp::ClusterNetworkPolicy) {
        self.record(|| Change::ClusterPolicy(policy.name.clone()));
        self.cluster_policies.insert(policy.name.clone(), policy);
    }

    pub fn remove_cluster_policy(&mut self, name: &str) -> Option<cnp::ClusterNetworkPolicy> {
        self.record(|| Change::ClusterPolicy(name.to_string()));
        self.cluster_policies.remove(name)
    }

    /// ClusterNetworkPolicies, in name order.
    pub fn cluster_policies(&self) -> impl Iterator<Item = &cnp::ClusterNetworkPolicy> {
        self.cluster_policies.values()
    }

    pub fn cluster_policy(&self, name: &str) -> Option<&cnp::ClusterNetworkPolicy> {
        self.cluster_policies.get(name)
    }

    pub fn upsert_node(&mut self, node: Node) {
        self.record(|| Change::Node(node.name.clone()));
        self.nodes.insert(node.name.clone(), node);
    }

    pub(crate) fn remove_node(&mut self, name: &str) -> Option<Node> {
        self.record(|| Change::Node(name.to_string()));
        self.nodes.remove(name)
    }

    pub fn namespace(&self, name: &str) -> Option<&Namespace> {
        self.namespaces.get(name)
    }

    pub fn namespaces(&self) -> impl Iterator<Item = &Namespace> {
        self.namespaces.values()
    }

    pub fn pod(&self, uid: &str) -> Option<&Pod> {
        self.pods.get(uid).map(|p| &*p.0)
    }

    /// All pods, in uid order.
    pub fn pods(&self) -> impl Iterator<Item = &Pod> {
        self.pods.iter().map(|p| &*p.0)
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// How many pods `namespace` holds.
    pub(crate) fn pod_count_in(&self, namespace: &str) -> usize {
        self.pods_by_namespace.get(namespace).map_or(0, BTreeSet::len)
    }

    /// The namespaces that have pods (whether or not their Namespace object is known).
    pub(crate) fn namespaces_with_pods(&self) -> impl Iterator<Item = &str> {
        self.pods_by_namespace.keys().map(String::as_str)
    }

    /// Pods of one namespace, in uid order.
    pub(crate) fn pods_in(&self, namespace: &str) -> impl Iterator<Item = &Pod> {
        self.pods_by_namespace.get(namespace).into_iter().flat_map(|pods| pods.iter().map(|p| &*p.0))
    }

    /// Every address some pod's status reports within `from..=to`, in order.
    pub(crate) fn reported_ips(&self, from: IpAddr, to: IpAddr) -> impl Iterator<Item = &IpAddr> {
        self.pods_by_ip.range(from..=to).map(|(ip, _)| ip)
    }

    /// Every pod whose status reports `ip`, whatever its phase, in no particular order.
    pub(crate) fn pods_with_ip(&self, ip: &IpAddr) -> impl Iterator<Item = &Pod> {
        self.pods_by_ip.get(ip).into_iter().flat_map(|pods| pods.iter().map(|p| &**p))
    }

    /// The pod `ip` belongs to as a policy peer: of the peers reporting it, the newest (the
    /// older one's sandbox is gone and its status has not caught up yet).
    pub fn peer_owning(&self, ip: &IpAddr) -> Option<&Pod> {
        self.pods_with_ip(ip).filter(|p| p.is_peer()).max_by(|a, b| (a.created, &a.uid).cmp(&(b.created, &b.uid)))
    }

    /// Whether more than one pod (of any phase) reports `ip`.
    pub(crate) fn is_contested(&self, ip: &IpAddr) -> bool {
        !self.contested.is_empty() && self.contested.contains(ip)
    }

    /// The live pod named `namespace/name`. Where a terminal and a live pod share the name
    /// (a re-created pod), the live one wins; among equals, the lowest uid.
    pub fn pod_by_name(&self, key: &ObjectRef) -> Option<&Pod> {
        let mut found: Option<&Pod> = None;
        for pod in self.pods_in(&key.namespace).filter(|p| p.name == key.name) {
            match found {
                Some(f) if !f.phase.is_terminal() || pod.phase.is_terminal() => {}
                _ => found = Some(pod),
            }
        }
        found
    }

    pub fn policies(&self) -> impl Iterator<Item = &NetworkPolicy> {
        self.policies.values()
    }

    pub fn policy(&self, key: &ObjectRef) -> Option<&NetworkPolicy> {
        self.policies.get(key)
    }

    pub fn policy_count(&self) -> usize {
        self.policies.len()
    }

    /// Policies of one namespace, in name order.
    pub fn policies_in<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = &'a NetworkPolicy> + 'a {
        let start = ObjectRef::new(namespace, "");
        self.policies.range(start..).take_while(move |(k, _)| k.namespace == namespace).map(|(_, p)| p)
    }

    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.get(name)
    }

    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    /// The endpoints a runtime would have created on `node` for the pods scheduled there
    /// (live, not host-networked, with addresses), for offline render and simulation.
    pub fn derived_endpoints(&self, node: &str) -> Vec<LocalEndpoint> {
        let mut eps: Vec<LocalEndpoint> =
            self.pods().filter(|p| p.node.as_deref() == Some(node) && p.is_peer()).map(LocalEndpoint::for_pod).collect();
        eps.sort();
        eps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, uid: &str, phase: PodPhase) -> Pod {
        Pod {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
            labels: Labels::new(),
            node: Some("n1".into()),
            phase,
            ips: vec!["198.18.1.1".parse().unwrap()],
            host_network: false,
            ports: vec![],
            created: None,
            unpublished: false,
        }
    }

    #[test]
    fn derived_uid_is_stable_and_uid_shaped() {
        let a = derived_uid("x", "a");
        assert_eq!(a, derived_uid("x", "a"));
        assert_ne!(a, derived_uid("x", "b"));
        assert_ne!(derived_uid("x", "a/b"), derived_uid("x/a", "b"));
        assert_eq!(a.len(), 36);
        assert_eq!(a.matches('-').count(), 4);
    }

    #[test]
    fn index_follows_upserts_and_removals() {
        let mut s = Snapshot::new();
        s.upsert_pod(pod("x", "a", "u1", PodPhase::Running));
        s.upsert_pod(pod("y", "b", "u2", PodPhase::Running));
        assert_eq!(s.pods_in("x").count(), 1);
        // Same uid moving namespace (impossible in Kubernetes, possible in a bad manifest).
        s.upsert_pod(pod("y", "a", "u1", PodPhase::Running));
        assert_eq!(s.pods_in("x").count(), 0);
        assert_eq!(s.pods_in("y").count(), 2);
        s.remove_pod("u1");
        s.remove_pod("u2");
        assert_eq!(s.pods_in("y").count(), 0);
        assert_eq!(s.pod_count(), 0);
        assert!(s.pods_by_ip.is_empty());
    }

    #[test]
    fn a_bulk_built_snapshot_equals_one_built_pod_by_pod() {
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let mut pods = Vec::new();
        for (ns, name, uid, addr) in [
            ("x", "a", "u3", "198.18.1.1"),
            ("y", "b", "u1", "198.18.1.1"),
            ("x", "c", "u2", "198.18.1.2"),
            ("y", "b2", "u1", "198.18.1.3"),
        ] {
            let mut p = pod(ns, name, uid, PodPhase::Running);
            p.ips = vec![ip(addr), ip("2001:db8::1")];
            pods.push(p);
        }
        let mut one_by_one = Snapshot::new();
        for p in pods.clone() {
            one_by_one.upsert_pod(p);
        }
        let bulk = Snapshot::with_pods(pods);
        let names = |s: &Snapshot| s.pods().map(|p| format!("{}/{}/{}", p.uid, p.namespace, p.name)).collect::<Vec<_>>();
        assert_eq!(names(&bulk), names(&one_by_one));
        assert_eq!(names(&bulk), ["u1/y/b2", "u2/x/c", "u3/x/a"], "the later of two with one uid stays");
        for ns in ["x", "y"] {
            let uids = |s: &Snapshot| s.pods_in(ns).map(|p| p.uid.clone()).collect::<Vec<_>>();
            assert_eq!(uids(&bulk), uids(&one_by_one));
        }
        for addr in ["198.18.1.1", "198.18.1.2", "198.18.1.3", "2001:db8::1"] {
            let uids = |s: &Snapshot| {
                let mut v: Vec<String> = s.pods_with_ip(&ip(addr)).map(|p| p.uid.clone()).collect();
                v.sort();
                v
            };
            assert_eq!(uids(&bulk), uids(&one_by_one), "{addr}");
            assert_eq!(bulk.is_contested(&ip(addr)), one_by_one.is_contested(&ip(addr)), "{addr}");
        }
        assert!(bulk.is_contested(&ip("2001:db8::1")) && !bulk.is_contested(&ip("198.18.1.1")));
        assert_eq!(bulk.pods_by_ip.len(), one_by_one.pods_by_ip.len());
    }

    #[test]
    fn address_index_follows_address_changes() {
        let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
        let uids = |s: &Snapshot, a: &str| -> Vec<String> {
            let mut v: Vec<String> = s.pods_with_ip(&ip(a)).map(|p| p.uid.clone()).collect();
            v.sort();
            v
        };
        let mut s = Snapshot::new();
        s.upsert_pod(pod("x", "a", "u1", PodPhase::Running));
        s.upsert_pod(pod("x", "b", "u2", PodPhase::Running));
        assert_eq!(uids(&s, "198.18.1.1"), ["u1", "u2"]);
        let mut moved = pod("x", "b", "u2", PodPhase::Running);
        moved.ips = vec![ip("198.18.1.2"), ip("2001:db8::2")];
        s.upsert_pod(moved);
        assert_eq!(uids(&s, "198.18.1.1"), ["u1"]);
        assert_eq!(uids(&s, "2001:db8::2"), ["u2"]);
        s.remove_pod("u2");
        assert!(uids(&s, "198.18.1.2").is_empty() && uids(&s, "2001:db8::2").is_empty());
        assert_eq!(s.pods_by_ip.len(), 1);
    }

    #[test]
    fn live_pod_wins_name_lookup_over_terminal_one() {
        let mut s = Snapshot::new();
        s.upsert_pod(pod("x", "a", "u1", PodPhase::Succeeded));
        s.upsert_pod(pod("x", "a", "u2", PodPhase::Running));
        assert_eq!(s.pod_by_name(&ObjectRef::new("x", "a")).unwrap().uid, "u2");
        s.remove_pod("u2");
        assert_eq!(s.pod_by_name(&ObjectRef::new("x", "a")).unwrap().uid, "u1");
    }

    #[test]
    fn terminal_hostnetwork_and_addressless_pods_are_not_peers() {
        let mut p = pod("x", "a", "u", PodPhase::Running);
        assert!(p.is_peer());
        p.phase = PodPhase::Failed;
        assert!(!p.is_peer());
        p.phase = PodPhase::Running;
        p.host_network = true;
        assert!(!p.is_peer());
        p.host_network = false;
        p.ips.clear();
        assert!(!p.is_peer());
    }

    #[test]
    fn policies_in_namespace_range() {
        let mut s = Snapshot::new();
        for (ns, name) in [("x", "p1"), ("x", "p2"), ("xa", "p"), ("w", "p")] {
            s.upsert_policy(NetworkPolicy { namespace: ns.into(), name: name.into(), ..Default::default() });
        }
        let names: Vec<_> = s.policies_in("x").map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["p1", "p2"]);
    }
}
