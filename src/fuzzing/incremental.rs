//! Target `incremental`: the incremental translator ([`Incremental`]) and render cache
//! ([`RenderCache`]) against the full translation and render, step by step.
//!
//! An input builds a small cluster — a base (one of [`differential::generate`]'s random
//! clusters, the conformance cluster, the quickstart, or nothing) and a few more objects —,
//! picks a node, its endpoints (derived from the snapshot, plus a few of any shape), the
//! translator's options and the render's shape (`peer_classes_from` 0 to 10, so both shapes
//! are exercised), then runs up to 16 steps of one to four mutations each ([`Mutation`]):
//! pods created (also under the name of a pod that exists: a re-created pod), relabelled,
//! readdressed (fresh addresses, another pod's — contested —, a node's, none), made
//! terminal, pending, host-networked, given other container ports, moved, removed;
//! namespaces relabelled and removed; NetworkPolicies and ClusterNetworkPolicies created,
//! changed and removed; Nodes relabelled, readdressed, removed; endpoints added (CNI ADD,
//! also before their pod exists, or a second one for a pod), readdressed, reordered and
//! removed (CNI DEL). Each mutation records the [`Change`] the agent would pass
//! ([`Change::pod_before`] before a pod changes). After each step the [`Harness`] checks:
//!
//! - the incremental policy equals [`translate::translate`] of the same snapshot and
//!   endpoints;
//! - its [`Changed`] names every endpoint, peer set and named-port set that differs from the
//!   previous step's policy (unless it says `all`);
//! - [`RenderCache::render`] of it equals [`render::render_with`] of the full policy, as
//!   objects and as text, byte for byte.
//!
//! A mismatch panics with the step, its changes, every mutation so far and the first
//! difference (not the whole policy). Most choices come from small pools shared with the
//! bases (namespaces `x`/`y`/`z`, labels `pod=a`, `app=b`, addresses 198.18.1.11, …) so that
//! objects meet: selectors match, pods share addresses, endpoints arrive before their pods.
//! Some mutations take an `Arbitrary` object through the module's taming instead (invalid
//! selectors, CIDRs, ports). Translation and render only — no nft — so an execution is quick.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use arbitrary::{Arbitrary, Unstructured};

use super::{Base, EndpointInput, differential};
use crate::model::cnp::{ClusterNetworkPolicy, CnpPeer, CnpPods, CnpPort, CnpProtocol, CnpRule, CnpSubject};
use crate::model::{
    ContainerPort, IpBlock, LabelSelector, LabelSelectorRequirement, Labels, LocalEndpoint, Namespace, NetworkPolicy, Node, ObjectRef, Pod,
    PodPhase, PolicyPeer, PolicyPort, PolicyRule, PortRef, Protocol, Snapshot,
};
use crate::render::{self, Object as RsObject, RenderCache, RenderOptions, Ruleset};
use crate::translate::{self, Change, Changed, DirectionPolicy, EndpointPolicy, Incremental, NodePolicy, Options};

type R<T> = arbitrary::Result<T>;

/// At most this many steps per input.
const MAX_STEPS: u8 = 16;
/// At most this many mutations per step.
const MAX_MUTATIONS: u8 = 4;

// ---------------------------------------------------------------------------------------------
// The harness

/// One change to the cluster or to the node's endpoints.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// Creates or replaces the pod with this uid.
    UpsertPod(Pod),
    RemovePod(String),
    UpsertNamespace(Namespace),
    RemoveNamespace(String),
    UpsertPolicy(NetworkPolicy),
    RemovePolicy(ObjectRef),
    UpsertClusterPolicy(ClusterNetworkPolicy),
    RemoveClusterPolicy(String),
    UpsertNode(Node),
    RemoveNode(String),
    /// CNI ADD: one more endpoint.
    AddEndpoint(LocalEndpoint),
    /// CNI DEL: the endpoints of this interface go.
    RemoveEndpoint(String),
    /// The whole endpoint list replaced (readdressed, reordered, resynchronised).
    SetEndpoints(Vec<LocalEndpoint>),
}

impl Mutation {
    /// The change the agent passes for it (none for endpoints: `update` takes them whole).
    /// Call before applying it.
    fn change(&self, snapshot: &Snapshot) -> Option<Change> {
        Some(match self {
            Self::UpsertPod(p) => Change::pod_before(snapshot, &p.uid),
            Self::RemovePod(uid) => Change::pod_before(snapshot, uid),
            Self::UpsertNamespace(ns) => Change::Namespace(ns.name.clone()),
            Self::RemoveNamespace(name) => Change::Namespace(name.clone()),
            Self::UpsertPolicy(p) => Change::Policy(p.key()),
            Self::RemovePolicy(key) => Change::Policy(key.clone()),
            Self::UpsertClusterPolicy(p) => Change::ClusterPolicy(p.name.clone()),
            Self::RemoveClusterPolicy(name) => Change::ClusterPolicy(name.clone()),
            Self::UpsertNode(n) => Change::Node(n.name.clone()),
            Self::RemoveNode(name) => Change::Node(name.clone()),
            Self::AddEndpoint(_) | Self::RemoveEndpoint(_) | Self::SetEndpoints(_) => return None,
        })
    }

    fn apply_to(self, snapshot: &mut Snapshot, endpoints: &mut Vec<LocalEndpoint>) {
        match self {
            Self::UpsertPod(p) => snapshot.upsert_pod(p),
            Self::RemovePod(uid) => {
                snapshot.remove_pod(&uid);
            }
            Self::UpsertNamespace(ns) => snapshot.upsert_namespace(ns),
            Self::RemoveNamespace(name) => {
                snapshot.remove_namespace(&name);
            }
            Self::UpsertPolicy(p) => snapshot.upsert_policy(p),
            Self::RemovePolicy(key) => {
                snapshot.remove_policy(&key);
            }
            Self::UpsertClusterPolicy(p) => snapshot.upsert_cluster_policy(p),
            Self::RemoveClusterPolicy(name) => {
                snapshot.remove_cluster_policy(&name);
            }
            Self::UpsertNode(n) => snapshot.upsert_node(n),
            Self::RemoveNode(name) => {
                snapshot.remove_node(&name);
            }
            Self::AddEndpoint(ep) => endpoints.push(ep),
            Self::RemoveEndpoint(interface) => endpoints.retain(|e| e.interface != interface),
            Self::SetEndpoints(eps) => *endpoints = eps,
        }
    }
}

/// One line per mutation, for failure messages.
impl fmt::Display for Mutation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UpsertPod(p) => write!(f, "upsert pod {}", describe_pod(p)),
            Self::RemovePod(uid) => write!(f, "remove pod uid {uid}"),
            Self::UpsertNamespace(ns) => write!(f, "upsert namespace {} labels {:?}", ns.name, ns.labels),
            Self::RemoveNamespace(name) => write!(f, "remove namespace {name}"),
            Self::UpsertPolicy(p) => write!(f, "upsert NetworkPolicy {p:?}"),
            Self::RemovePolicy(key) => write!(f, "remove NetworkPolicy {key}"),
            Self::UpsertClusterPolicy(p) => write!(f, "upsert ClusterNetworkPolicy {p:?}"),
            Self::RemoveClusterPolicy(name) => write!(f, "remove ClusterNetworkPolicy {name}"),
            Self::UpsertNode(n) => write!(
                f,
                "upsert node {} labels {:?} internal {:?} addresses {:?} podCIDRs {:?}",
                n.name, n.labels, n.internal_ips, n.addresses, n.pod_cidrs
            ),
            Self::RemoveNode(name) => write!(f, "remove node {name}"),
            Self::AddEndpoint(ep) => write!(f, "CNI ADD {}", describe_endpoint(ep)),
            Self::RemoveEndpoint(interface) => write!(f, "CNI DEL {interface}"),
            Self::SetEndpoints(eps) => {
                let eps: Vec<String> = eps.iter().map(describe_endpoint).collect();
                write!(f, "endpoints now [{}]", eps.join("; "))
            }
        }
    }
}

fn describe_pod(p: &Pod) -> String {
    let ports: Vec<String> =
        p.ports.iter().map(|c| format!("{}={}/{}", c.name.as_deref().unwrap_or("-"), c.port, c.protocol.as_nft())).collect();
    format!(
        "{}/{} uid {} labels {:?} ips {:?} {:?}{} node {:?} ports [{}] created {:?}",
        p.namespace,
        p.name,
        p.uid,
        p.labels,
        p.ips,
        p.phase,
        if p.host_network { " hostNetwork" } else { "" },
        p.node,
        ports.join(","),
        p.created
    )
}

fn describe_endpoint(ep: &LocalEndpoint) -> String {
    format!("{} ctr {} pod {} uid {:?} addrs {:?}", ep.interface, ep.container_id, ep.pod, ep.pod_uid, ep.addrs)
}

/// An incremental translator and render cache next to the full pipeline, over a snapshot
/// and endpoints that change by [`Mutation`]s: [`Harness::apply`] records the change the
/// agent would pass, [`Harness::step`] hands the recorded changes over and compares.
pub struct Harness {
    snapshot: Snapshot,
    endpoints: Vec<LocalEndpoint>,
    options: Options,
    render_options: RenderOptions,
    inc: Incremental,
    cache: RenderCache,
    /// The changes since the last step.
    pending: Vec<Change>,
    /// The full translation the last check agreed on.
    previous: NodePolicy,
    /// Every mutation so far, by step.
    log: Vec<String>,
    steps: usize,
    /// The text of the last render checked.
    rendered: String,
}

impl Harness {
    /// A harness over `snapshot` and `endpoints`; checks the initial translation and render.
    pub fn new(snapshot: Snapshot, endpoints: Vec<LocalEndpoint>, options: Options, render_options: RenderOptions) -> Result<Self, String> {
        let inc = Incremental::new(&snapshot, &endpoints, &options);
        let mut h = Self {
            cache: RenderCache::new(render_options.clone()),
            inc,
            snapshot,
            endpoints,
            options,
            render_options,
            pending: Vec::new(),
            previous: NodePolicy::default(),
            log: Vec::new(),
            steps: 0,
            rendered: String::new(),
        };
        let full = translate::translate(&h.snapshot, &h.endpoints, &h.options);
        h.check(&[], full, false)?;
        Ok(h)
    }

    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    pub fn endpoints(&self) -> &[LocalEndpoint] {
        &self.endpoints
    }

    /// The text of the last render checked (the initial one before any step).
    pub fn rendered(&self) -> &str {
        &self.rendered
    }

    /// The incremental translator's current policy.
    pub fn policy(&self) -> &NodePolicy {
        self.inc.policy()
    }

    /// The snapshot, to change without recording a change: only for showing that the harness
    /// notices a change the incremental translator was not told about.
    pub fn snapshot_unrecorded(&mut self) -> &mut Snapshot {
        &mut self.snapshot
    }

    /// Applies `m`, recording its change for the next step.
    pub fn apply(&mut self, m: Mutation) {
        self.log.push(format!("step {}: {m}", self.steps + 1));
        if let Some(c) = m.change(&self.snapshot) {
            self.pending.push(c);
        }
        m.apply_to(&mut self.snapshot, &mut self.endpoints);
    }

    /// Hands the changes since the last step to the incremental translator, then compares its
    /// policy, its `Changed` and the cache's render with the full pipeline's. Returns the
    /// rendered text; `Err` describes the first difference.
    pub fn step(&mut self) -> Result<String, String> {
        self.steps += 1;
        let changes = std::mem::take(&mut self.pending);
        self.inc.update(&self.snapshot, &self.endpoints, &changes);
        let full = translate::translate(&self.snapshot, &self.endpoints, &self.options);
        self.check(&changes, full, true)
    }

    fn check(&mut self, changes: &[Change], full: NodePolicy, check_changed: bool) -> Result<String, String> {
        if self.inc.policy() != &full {
            return Err(self.report(
                changes,
                "the incremental translation differs from the full one",
                &policy_difference(self.inc.policy(), &full),
            ));
        }
        if check_changed && let Err(e) = changed_covers(&self.previous, &full, self.inc.changed()) {
            return Err(self.report(changes, "`Changed` misses a difference from the previous step", &e));
        }
        let expected = render::render_with(&full, &self.render_options);
        let got = self.cache.render(self.inc.policy(), self.inc.changed());
        if got != expected {
            return Err(self.report(changes, "the cached render differs from the full one", &ruleset_difference(&got, &expected)));
        }
        let (text, expected_text) = (got.to_text(), expected.to_text());
        if text != expected_text {
            return Err(self.report(
                changes,
                "the cached render's text differs from the full one's (the rulesets are equal)",
                &text_difference(&text, &expected_text),
            ));
        }
        self.previous = full;
        self.rendered.clone_from(&text);
        Ok(text)
    }

    fn report(&self, changes: &[Change], what: &str, difference: &str) -> String {
        let mut out = format!("after step {}: {what}\n{difference}\n\nchanges passed in this step:\n", self.steps);
        for c in changes {
            let _ = writeln!(out, "  {c:?}");
        }
        let _ = writeln!(out, "\noptions {:?}, render {:?}\nendpoints:", self.options, self.render_options);
        for ep in &self.endpoints {
            let _ = writeln!(out, "  {}", describe_endpoint(ep));
        }
        out.push_str("\nmutations so far:\n");
        for line in &self.log {
            let _ = writeln!(out, "  {line}");
        }
        out
    }
}

/// The first difference between the incremental policy and the full one, readably.
pub(crate) fn policy_difference(inc: &NodePolicy, full: &NodePolicy) -> String {
    let interfaces = |np: &NodePolicy| -> Vec<String> { np.endpoints.iter().map(|e| format!("{} ({})", e.interface, e.pod)).collect() };
    let (a, b) = (interfaces(inc), interfaces(full));
    if a != b {
        return format!("endpoints:\n  incremental {a:?}\n  full        {b:?}");
    }
    for (i, f) in inc.endpoints.iter().zip(&full.endpoints) {
        if i != f {
            return endpoint_difference(i, f);
        }
    }
    if let Some(d) = map_difference("peer set", &inc.peer_sets, &full.peer_sets, |s| {
        let v4 = s.v4.iter().map(|(n, c)| format!("{n} ({c})"));
        v4.chain(s.v6.iter().map(|(n, c)| format!("{n} ({c})"))).collect()
    }) {
        return d;
    }
    if let Some(d) = map_difference("named-port set", &inc.port_sets, &full.port_sets, |s| {
        let v4 = s.v4.iter().map(|((a, p, n), c)| format!("{a} {} {n} ({c})", p.as_nft()));
        v4.chain(s.v6.iter().map(|((a, p, n), c)| format!("{a} {} {n} ({c})", p.as_nft()))).collect()
    }) {
        return d;
    }
    if inc.problems != full.problems {
        let only = |a: &[translate::PolicyProblem], b: &[translate::PolicyProblem]| -> Vec<String> {
            a.iter().filter(|p| !b.contains(p)).map(ToString::to_string).collect()
        };
        return format!(
            "problems:\n  only incremental: {:?}\n  only full: {:?}",
            only(&inc.problems, &full.problems),
            only(&full.problems, &inc.problems)
        );
    }
    "no difference found (the policies differ in order only?)".into()
}

fn endpoint_difference(inc: &EndpointPolicy, full: &EndpointPolicy) -> String {
    let head = format!("endpoint {} ({})", full.interface, full.pod);
    if inc.addrs != full.addrs {
        return format!("{head} addrs: incremental {:?}, full {:?}", inc.addrs, full.addrs);
    }
    for (name, i, f) in [("ingress", &inc.ingress, &full.ingress), ("egress", &inc.egress, &full.egress)] {
        if i != f {
            return format!("{head} {name}: {}", direction_difference(i, f));
        }
    }
    format!("{head}: incremental {inc:?}\nfull {full:?}")
}

fn direction_difference(inc: &DirectionPolicy, full: &DirectionPolicy) -> String {
    if inc.isolated_by != full.isolated_by {
        return format!("isolated_by: incremental {:?}, full {:?}", inc.isolated_by, full.isolated_by);
    }
    if inc.rules != full.rules {
        let n = inc.rules.iter().zip(&full.rules).take_while(|(a, b)| a == b).count();
        return format!(
            "rules ({} incremental, {} full), first difference at [{n}]:\n  incremental {:?}\n  full        {:?}",
            inc.rules.len(),
            full.rules.len(),
            inc.rules.get(n),
            full.rules.get(n)
        );
    }
    for (tier, i, f) in [("admin", &inc.admin, &full.admin), ("baseline", &inc.baseline, &full.baseline)] {
        if i != f {
            let n = i.iter().zip(f).take_while(|(a, b)| a == b).count();
            return format!(
                "{tier} tier ({} groups incremental, {} full), first difference at [{n}]:\n  incremental {:?}\n  full        {:?}",
                i.len(),
                f.len(),
                i.get(n),
                f.get(n)
            );
        }
    }
    "equal?".into()
}

/// The first key whose entry differs between two maps of sets: missing on one side, or the
/// elements only one side has.
fn map_difference<K: Ord + fmt::Display, V: PartialEq>(
    what: &str,
    inc: &BTreeMap<K, V>,
    full: &BTreeMap<K, V>,
    elements: impl Fn(&V) -> Vec<String>,
) -> Option<String> {
    let keys: BTreeSet<&K> = inc.keys().chain(full.keys()).collect();
    for k in keys {
        match (inc.get(k), full.get(k)) {
            (Some(_), None) => return Some(format!("{what} `{k}`: only the incremental policy has it")),
            (None, Some(_)) => return Some(format!("{what} `{k}`: only the full policy has it")),
            (Some(a), Some(b)) if a != b => {
                let (ea, eb) = (elements(a), elements(b));
                let only = |x: &[String], y: &[String]| -> Vec<String> { x.iter().filter(|e| !y.contains(e)).cloned().collect() };
                return Some(format!("{what} `{k}`:\n  only incremental: {:?}\n  only full: {:?}", only(&ea, &eb), only(&eb, &ea)));
            }
            _ => {}
        }
    }
    None
}

/// Whether `changed` names everything that differs between two consecutive full
/// translations: each endpoint (by interface), peer set and named-port set.
pub(crate) fn changed_covers(before: &NodePolicy, after: &NodePolicy, changed: &Changed) -> Result<(), String> {
    if changed.all {
        return Ok(());
    }
    fn by_interface(np: &NodePolicy) -> BTreeMap<&str, &EndpointPolicy> {
        np.endpoints.iter().map(|e| (e.interface.as_str(), e)).collect()
    }
    let (b, a) = (by_interface(before), by_interface(after));
    let interfaces: BTreeSet<&str> = b.keys().chain(a.keys()).copied().collect();
    for i in interfaces {
        if b.get(i) != a.get(i) && !changed.endpoints.contains(i) {
            return Err(format!("endpoint {i} changed, `Changed::endpoints` ({:?}) does not name it", changed.endpoints));
        }
    }
    let defs: BTreeSet<&translate::PeerDef> = before.peer_sets.keys().chain(after.peer_sets.keys()).collect();
    for d in defs {
        if before.peer_sets.get(d) != after.peer_sets.get(d) && !changed.peer_sets.contains(d) {
            return Err(format!("peer set `{d}` changed, `Changed::peer_sets` does not name it"));
        }
    }
    let defs: BTreeSet<&translate::NamedPortDef> = before.port_sets.keys().chain(after.port_sets.keys()).collect();
    for d in defs {
        if before.port_sets.get(d) != after.port_sets.get(d) && !changed.port_sets.contains(d) {
            return Err(format!("named-port set `{d}` changed, `Changed::port_sets` does not name it"));
        }
    }
    Ok(())
}

/// The first object that differs between two rulesets (by name, in writing order).
fn ruleset_difference(cached: &Ruleset, full: &Ruleset) -> String {
    if cached.comment != full.comment {
        return format!("comment: cached {:?}, full {:?}", cached.comment, full.comment);
    }
    let names = |r: &Ruleset| -> Vec<String> { r.objects.iter().map(|o| o.name().to_string()).collect() };
    let (a, b) = (names(cached), names(full));
    if a != b {
        let only = |x: &[String], y: &[String]| -> Vec<String> { x.iter().filter(|e| !y.contains(e)).cloned().collect() };
        return format!(
            "objects differ: only cached {:?}, only full {:?}{}",
            only(&a, &b),
            only(&b, &a),
            if only(&a, &b).is_empty() && only(&b, &a).is_empty() { " (same objects, another order)" } else { "" }
        );
    }
    for (x, y) in cached.objects.iter().zip(&full.objects) {
        if x != y {
            let text = |o: &RsObject| Ruleset { comment: String::new(), objects: vec![o.clone()] }.to_text();
            return format!("object {}:\n{}", x.name(), text_difference(&text(x), &text(y)));
        }
    }
    "no difference found".into()
}

/// The first differing line of two texts, with a little context.
fn text_difference(cached: &str, full: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (cached.lines().collect(), full.lines().collect());
    let n = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let from = n.saturating_sub(3);
    let lines = |t: &[&str]| t.iter().skip(from).take(n - from + 4).copied().collect::<Vec<_>>().join("\n");
    format!("first difference at line {}:\n--- cached:\n{}\n--- full:\n{}", n + 1, lines(&a), lines(&b))
}

// ---------------------------------------------------------------------------------------------
// The target

/// Target `incremental`: see the module doc.
#[allow(clippy::panic)]
pub fn incremental(data: &[u8]) -> Vec<String> {
    let mut u = Unstructured::new(data);
    let Ok((mut g, snapshot, endpoints, options, render_options)) = Gen::setup(&mut u) else { return Vec::new() };
    let mut h = match Harness::new(snapshot, endpoints, options, render_options) {
        Ok(h) => h,
        Err(e) => panic!("{e}"),
    };
    let mut texts: Vec<String> = vec![h.rendered().to_string()];
    let steps = g.u.int_in_range(0..=MAX_STEPS).unwrap_or(0);
    for _ in 0..steps {
        let Ok(n) = g.u.int_in_range(1..=MAX_MUTATIONS) else { break };
        for _ in 0..n {
            match g.mutation(&h.snapshot, &h.endpoints) {
                Ok(m) => h.apply(m),
                Err(_) => break,
            }
        }
        match h.step() {
            Ok(text) => {
                if texts.last() != Some(&text) {
                    texts.push(text);
                }
            }
            Err(e) => panic!("{e}"),
        }
        if g.u.is_empty() {
            break;
        }
    }
    texts
}

// ---------------------------------------------------------------------------------------------
// The generator

const NAMESPACES: [&str; 5] = ["x", "y", "z", "w", "shop"];
const POD_NAMES: [&str; 4] = ["a", "b", "c", "web"];
/// New pods' uids come from a pool of this size: a uid met again is the same pod.
const UIDS: u8 = 12;
const POD_KEYS: [&str; 3] = ["pod", "app", "tier"];
/// A relabel may also make a pod a run's pod ([`translate::Options::isolate_run_pods`]).
const POD_RELABEL_KEYS: [&str; 4] = ["pod", "app", "tier", crate::model::RUN_LABEL];
const NS_KEYS: [&str; 3] = ["ns", "team", "kubernetes.io/metadata.name"];
const NODE_KEYS: [&str; 3] = ["role", "zone", "kubernetes.io/hostname"];
const VALUES: [&str; 5] = ["a", "b", "c", "x", "y"];
const NODES: [&str; 3] = ["node-1", "node-2", "node-3"];
const POLICY_NAMES: [&str; 3] = ["np0", "np1", "np2"];
const CNP_NAMES: [&str; 3] = ["cnp0", "cnp1", "cnp2"];
/// Container port names, each with its usual protocol.
const PORT_NAMES: [(&str, Protocol); 5] = [
    ("serve-80-tcp", Protocol::Tcp),
    ("serve-81-udp", Protocol::Udp),
    ("http", Protocol::Tcp),
    ("dns", Protocol::Udp),
    ("metrics", Protocol::Sctp),
];
const PORTS: [u16; 5] = [53, 80, 81, 443, 8080];
/// Pod address hosts (with 198.18.<node>.<host>): those of the conformance cluster's pods and
/// the differential clusters' first pods.
const HOSTS: [u8; 10] = [10, 11, 12, 13, 21, 22, 23, 31, 32, 33];
const CIDRS: [&str; 10] = [
    "0.0.0.0/0",
    "198.18.0.0/15",
    "198.18.1.0/24",
    "198.18.1.8/29",
    "198.18.2.0/24",
    "198.19.0.0/16",
    "::/0",
    "2001:db8::/32",
    "2001:db8:1::/64",
    "2001:db8:1::8/125",
];

struct Gen<'u, 'd> {
    u: &'u mut Unstructured<'d>,
    /// This node.
    node: String,
    /// uid → namespace/name of every uid met (pods, endpoints reported before their pod): a
    /// uid keeps its name.
    names: BTreeMap<String, ObjectRef>,
    /// The last creation time handed out (new pods are mostly newer than every other).
    created: i64,
}

type Setup<'u, 'd> = (Gen<'u, 'd>, Snapshot, Vec<LocalEndpoint>, Options, RenderOptions);

impl<'u, 'd> Gen<'u, 'd> {
    /// The cluster, node, endpoints and options an input starts from.
    fn setup(u: &'u mut Unstructured<'d>) -> R<Setup<'u, 'd>> {
        let mut snapshot = match u.int_in_range(0..=3u8)? {
            0 => differential::snapshot(&differential::generate(u)?),
            1 => super::base_snapshot(Base::Conformance),
            2 => super::base_snapshot(Base::Quickstart),
            _ => super::base_snapshot(Base::Empty),
        };
        let names = snapshot.pods().map(|p| (p.uid.clone(), p.key())).collect();
        let mut nodes: Vec<String> = super::node_names(&snapshot);
        nodes.extend(NODES.iter().map(ToString::to_string));
        nodes.sort();
        nodes.dedup();
        let node = u.choose(&nodes)?.clone();
        let mut g = Gen { u, node, names, created: 1000 };
        let mut endpoints = Vec::new();
        for _ in 0..g.u.int_in_range(0..=4u8)? {
            g.mutation(&snapshot, &endpoints)?.apply_to(&mut snapshot, &mut endpoints);
        }
        endpoints = snapshot.derived_endpoints(&g.node);
        for _ in 0..g.u.int_in_range(0..=2u8)? {
            let m = g.endpoint_mutation(&snapshot, &endpoints)?;
            m.apply_to(&mut snapshot, &mut endpoints);
        }
        let options = Options {
            isolate_run_pods: g.u.arbitrary()?,
            audit_mode: g.u.arbitrary()?,
            dns_resolvers: None,
            overlay_port: g.u.arbitrary::<bool>()?.then_some(4789),
            overlay_node: Some(g.node.clone()),
        };
        let render_options = RenderOptions { peer_classes_from: g.u.int_in_range(0..=10)?, ..RenderOptions::DEFAULT };
        Ok((g, snapshot, endpoints, options, render_options))
    }

    fn chance(&mut self, percent: u8) -> R<bool> {
        Ok(self.u.int_in_range(0..=99u8)? >= 100 - percent)
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> R<T> {
        Ok(self.u.choose(items)?.clone())
    }

    fn string(&mut self, items: &[&str]) -> R<String> {
        Ok(self.u.choose(items)?.to_string())
    }

    fn mutation(&mut self, s: &Snapshot, eps: &[LocalEndpoint]) -> R<Mutation> {
        let existing: Vec<&Pod> = s.pods().collect();
        let kind = self.u.int_in_range(0..=31u8)?;
        if (3..=12).contains(&kind) && !existing.is_empty() {
            let mut p = (*self.u.choose(&existing)?).clone();
            match kind {
                3 | 4 => p.labels = self.relabel(&p.labels, &POD_RELABEL_KEYS)?,
                5 | 6 => p.ips = self.addresses(s)?,
                7 => p.phase = self.phase()?,
                8 => {
                    p.host_network = !p.host_network;
                    if p.host_network && self.chance(50)? {
                        p.ips = self.node_addresses(s)?;
                    }
                }
                9 => p.ports = self.container_ports()?,
                10 => p.node = self.pod_node()?,
                11 => return Ok(Mutation::RemovePod(p.uid)),
                _ => {
                    // Several fields at once.
                    p.labels = self.relabel(&p.labels, &POD_KEYS)?;
                    p.ips = self.addresses(s)?;
                    p.phase = self.phase()?;
                }
            }
            return Ok(Mutation::UpsertPod(p));
        }
        Ok(match kind {
            0..=12 => Mutation::UpsertPod(self.new_pod(s)?),
            13 => {
                let mut p = super::tame_pod(Pod::arbitrary(self.u)?);
                // A uid keeps its name: an arbitrary pod with a known uid under another name
                // becomes a new pod.
                while self.names.get(&p.uid).is_some_and(|key| *key != p.key()) {
                    p.uid.push_str("-2");
                }
                self.names.insert(p.uid.clone(), p.key());
                Mutation::UpsertPod(p)
            }
            14 | 15 => Mutation::UpsertNamespace(self.namespace(s)?),
            16 => {
                let names: Vec<String> = s.namespaces().map(|n| n.name.clone()).collect();
                let name = if names.is_empty() { self.string(&NAMESPACES)? } else { self.pick(&names)? };
                Mutation::RemoveNamespace(name)
            }
            17 => Mutation::UpsertNamespace(super::tame_namespace(Namespace::arbitrary(self.u)?)),
            18..=20 => Mutation::UpsertPolicy(self.network_policy()?),
            21 => {
                let mut p = super::tame_policy(NetworkPolicy::arbitrary(self.u)?);
                p.name = self.string(&POLICY_NAMES)?;
                Mutation::UpsertPolicy(p)
            }
            22 => {
                let keys: Vec<ObjectRef> = s.policies().map(NetworkPolicy::key).collect();
                if keys.is_empty() { Mutation::UpsertPolicy(self.network_policy()?) } else { Mutation::RemovePolicy(self.pick(&keys)?) }
            }
            23 | 24 => Mutation::UpsertClusterPolicy(self.cluster_policy()?),
            25 => {
                let mut p = ClusterNetworkPolicy::arbitrary(self.u)?;
                self.tame_cluster_policy(&mut p)?;
                Mutation::UpsertClusterPolicy(p)
            }
            26 => {
                let names: Vec<String> = s.cluster_policies().map(|p| p.name.clone()).collect();
                if names.is_empty() {
                    Mutation::UpsertClusterPolicy(self.cluster_policy()?)
                } else {
                    Mutation::RemoveClusterPolicy(self.pick(&names)?)
                }
            }
            27 => Mutation::UpsertNode(self.node_object(s)?),
            28 => {
                if self.chance(50)? {
                    let mut n = super::tame_node(Node::arbitrary(self.u)?);
                    n.internal_ips = n.internal_ips.into_iter().map(super::tame_ip).collect();
                    n.addresses = n.addresses.into_iter().map(super::tame_ip).collect();
                    Mutation::UpsertNode(n)
                } else {
                    let names: Vec<String> = s.nodes().map(|n| n.name.clone()).collect();
                    if names.is_empty() { Mutation::UpsertNode(self.node_object(s)?) } else { Mutation::RemoveNode(self.pick(&names)?) }
                }
            }
            _ => self.endpoint_mutation(s, eps)?,
        })
    }

    fn endpoint_mutation(&mut self, s: &Snapshot, eps: &[LocalEndpoint]) -> R<Mutation> {
        let pods: Vec<&Pod> = s.pods().collect();
        Ok(match self.u.int_in_range(0..=9u8)? {
            // CNI ADD for a pod of the snapshot (any: also one the API places elsewhere).
            0..=2 if !pods.is_empty() => {
                let pod = *self.u.choose(&pods)?;
                let mut ep = LocalEndpoint::for_pod(pod);
                if self.chance(30)? {
                    // Another sandbox of the pod (a restart: a stale endpoint next to the new one).
                    ep.container_id = format!("ctr-{}-{}", self.u.int_in_range(0..=1u8)?, pod.uid);
                    ep.interface = flock_cni::host_interface_name(&ep.container_id, "eth0");
                }
                if self.chance(20)? {
                    // CNI's addresses, not (yet) the API's.
                    ep.addrs = self.addresses(s)?;
                }
                if self.chance(10)? {
                    ep.pod_uid = None;
                }
                Mutation::AddEndpoint(ep)
            }
            // CNI ADD before the pod is in the snapshot.
            0..=3 => {
                let uid = self.uid()?;
                let pod = self.name_of(&uid)?;
                let addrs = self.addresses(s)?;
                Mutation::AddEndpoint(LocalEndpoint {
                    interface: flock_cni::host_interface_name(&uid, "eth0"),
                    container_id: uid.clone(),
                    pod,
                    pod_uid: Some(uid),
                    addrs,
                })
            }
            4 | 5 if !eps.is_empty() => Mutation::RemoveEndpoint(self.u.choose(eps)?.interface.clone()),
            6 if !eps.is_empty() => {
                let mut eps = eps.to_vec();
                let i = self.u.choose_index(eps.len())?;
                eps[i].addrs = self.addresses(s)?;
                Mutation::SetEndpoints(eps)
            }
            7 => {
                let mut eps = eps.to_vec();
                eps.reverse();
                Mutation::SetEndpoints(eps)
            }
            8 => Mutation::SetEndpoints(s.derived_endpoints(&self.node)),
            _ => Mutation::AddEndpoint(super::tame_endpoint(EndpointInput::arbitrary(self.u)?)),
        })
    }

    fn uid(&mut self) -> R<String> {
        Ok(format!("uid-{}", self.u.int_in_range(0..=UIDS - 1)?))
    }

    /// The name `uid` has, or a new one for it.
    fn name_of(&mut self, uid: &str) -> R<ObjectRef> {
        if let Some(key) = self.names.get(uid) {
            return Ok(key.clone());
        }
        let key = ObjectRef::new(self.string(&NAMESPACES[..4])?, self.string(&POD_NAMES)?);
        self.names.insert(uid.to_string(), key.clone());
        Ok(key)
    }

    /// A pod with a uid of the pool: a new pod (perhaps with the name of one that exists: a
    /// re-created pod), or every field of the pod with that uid anew.
    fn new_pod(&mut self, s: &Snapshot) -> R<Pod> {
        let uid = self.uid()?;
        let key = self.name_of(&uid)?;
        let created = match s.pod(&uid) {
            Some(p) => p.created,
            None => match self.u.int_in_range(0..=9u8)? {
                0 => None,
                1 => Some(i64::from(self.u.int_in_range(0..=3u8)?)),
                _ => {
                    self.created += 1;
                    Some(self.created)
                }
            },
        };
        let phase = self.phase()?;
        let host_network = self.chance(5)?;
        let ips = if host_network && self.chance(60)? { self.node_addresses(s)? } else { self.addresses(s)? };
        Ok(Pod {
            namespace: key.namespace,
            name: key.name,
            uid,
            labels: self.labels(&POD_KEYS)?,
            node: self.pod_node()?,
            phase,
            ips,
            host_network,
            ports: self.container_ports()?,
            created,
            unpublished: false,
        })
    }

    fn phase(&mut self) -> R<PodPhase> {
        Ok(match self.u.int_in_range(0..=19u8)? {
            0 | 1 => PodPhase::Pending,
            2 => PodPhase::Succeeded,
            3 => PodPhase::Failed,
            4 => PodPhase::Unknown,
            _ => PodPhase::Running,
        })
    }

    /// Mostly this node.
    fn pod_node(&mut self) -> R<Option<String>> {
        Ok(match self.u.int_in_range(0..=9u8)? {
            0 => None,
            1..=3 => Some(self.string(&NODES)?),
            _ => Some(self.node.clone()),
        })
    }

    fn labels(&mut self, keys: &[&str]) -> R<Labels> {
        let mut l = Labels::new();
        for key in keys {
            if self.chance(50)? {
                l.insert(key, self.string(&VALUES)?);
            }
        }
        Ok(l)
    }

    /// One label set, changed or removed; or new labels.
    fn relabel(&mut self, labels: &Labels, keys: &[&str]) -> R<Labels> {
        let mut l = labels.clone();
        let key = self.string(keys)?;
        match self.u.int_in_range(0..=3u8)? {
            0 => {
                l.remove(&key);
            }
            1 => return self.labels(keys),
            _ => {
                l.insert(&key, self.string(&VALUES)?);
            }
        }
        Ok(l)
    }

    /// A pod's addresses: fresh from the pool, another pod's (contested), one of each, a
    /// node's, or none.
    fn addresses(&mut self, s: &Snapshot) -> R<Vec<IpAddr>> {
        let others: Vec<IpAddr> = s.pods().flat_map(|p| p.ips.iter().copied()).collect();
        Ok(match self.u.int_in_range(0..=11u8)? {
            0 => Vec::new(),
            1 | 2 if !others.is_empty() => vec![self.pick(&others)?],
            3 if !others.is_empty() => {
                let mut ips = vec![self.pick(&others)?];
                ips.push(self.fresh(!ips[0].is_ipv4())?);
                ips
            }
            4 => self.node_addresses(s)?,
            _ => match self.u.int_in_range(0..=3u8)? {
                0 | 1 => vec![self.fresh(false)?],
                2 => vec![self.fresh(true)?],
                _ => vec![self.fresh(false)?, self.fresh(true)?],
            },
        })
    }

    fn fresh(&mut self, v6: bool) -> R<IpAddr> {
        let n = self.u.int_in_range(1..=3u8)?;
        let host = self.pick(&HOSTS)?;
        Ok(if v6 {
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, u16::from(n), 0, 0, 0, 0, u16::from(host)))
        } else {
            IpAddr::V4(Ipv4Addr::new(198, 18, n, host))
        })
    }

    /// A node's addresses (a host-networked pod's).
    fn node_addresses(&mut self, s: &Snapshot) -> R<Vec<IpAddr>> {
        let nodes: Vec<&Node> = s.nodes().filter(|n| !n.addresses.is_empty()).collect();
        if nodes.is_empty() {
            return Ok(vec![IpAddr::V4(Ipv4Addr::new(198, 18, 0, self.u.int_in_range(1..=3)?))]);
        }
        Ok(self.u.choose(&nodes)?.addresses.clone())
    }

    fn container_ports(&mut self) -> R<Vec<ContainerPort>> {
        let mut ports = Vec::new();
        for (name, protocol) in PORT_NAMES {
            if self.chance(40)? {
                let protocol = if self.chance(10)? { self.pick(&Protocol::ALL)? } else { protocol };
                ports.push(ContainerPort { name: Some(name.into()), port: self.pick(&PORTS)?, protocol });
            }
        }
        if self.chance(10)? {
            ports.push(ContainerPort { name: None, port: self.pick(&PORTS)?, protocol: Protocol::Tcp });
        }
        Ok(ports)
    }

    fn namespace(&mut self, s: &Snapshot) -> R<Namespace> {
        let mut names: Vec<String> = s.namespaces_with_pods().map(ToString::to_string).collect();
        names.extend(NAMESPACES.iter().map(ToString::to_string));
        let name = self.pick(&names)?;
        let mut labels = self.labels(&NS_KEYS[..2])?;
        if !self.chance(10)? {
            labels.insert("kubernetes.io/metadata.name", &name);
        }
        Ok(Namespace { name, labels, audit: self.u.ratio(1, 4)?, log_allowed: self.u.ratio(1, 4)? })
    }

    fn node_object(&mut self, s: &Snapshot) -> R<Node> {
        let mut names: Vec<String> = s.nodes().map(|n| n.name.clone()).collect();
        names.extend(NODES.iter().map(ToString::to_string));
        let name = self.pick(&names)?;
        let n = self.u.int_in_range(1..=3u8)?;
        let mut internal_ips = Vec::new();
        let mut pod_cidrs = Vec::new();
        let family = self.u.int_in_range(0..=3u8)?;
        if family != 2 {
            internal_ips.push(IpAddr::V4(Ipv4Addr::new(198, 18, 0, n)));
            pod_cidrs.push(ipnet::IpNet::V4(
                ipnet::Ipv4Net::new(Ipv4Addr::new(198, 18, n, 0), 24).map_err(|_| arbitrary::Error::IncorrectFormat)?,
            ));
        }
        if family >= 2 {
            internal_ips.push(IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, u16::from(n))));
        }
        let mut addresses = internal_ips.clone();
        if self.chance(30)? {
            addresses.push(IpAddr::V4(Ipv4Addr::new(198, 19, 1, n)));
        }
        if self.chance(10)? {
            // An address a pod reports too.
            addresses.push(self.fresh(false)?);
        }
        let mut labels = self.labels(&NODE_KEYS[..2])?;
        if self.chance(80)? {
            labels.insert("kubernetes.io/hostname", &name);
        }
        Ok(Node { name, pod_cidrs, internal_ips, addresses, labels })
    }

    /// A label selector over `keys`: mostly valid, 0–2 requirements; now and then one the API
    /// server rejects.
    fn selector(&mut self, keys: &[&str]) -> R<LabelSelector> {
        let mut sel = LabelSelector::default();
        for _ in 0..self.u.int_in_range(0..=2u8)? {
            let key = self.string(keys)?;
            let op = self.u.int_in_range(0..=4u8)?;
            let mut values = vec![self.string(&VALUES)?];
            if self.chance(30)? {
                values.push(self.string(&VALUES)?);
            }
            let expr =
                |operator: &str, values: Vec<String>| LabelSelectorRequirement { key: key.clone(), operator: operator.into(), values };
            match op {
                0 => {
                    sel.match_labels.insert(key.clone(), values.swap_remove(0));
                }
                1 => sel.match_expressions.push(expr("In", values)),
                2 => sel.match_expressions.push(expr("NotIn", values)),
                3 => sel.match_expressions.push(expr("Exists", vec![])),
                _ => sel.match_expressions.push(expr("DoesNotExist", vec![])),
            }
        }
        if self.chance(3)? {
            sel.match_labels.insert("app".into(), "web-".into());
        }
        Ok(sel)
    }

    fn np_peer(&mut self) -> R<PolicyPeer> {
        Ok(match self.u.int_in_range(0..=4u8)? {
            0 => PolicyPeer { pod_selector: Some(self.selector(&POD_KEYS)?), ..Default::default() },
            1 => PolicyPeer { namespace_selector: Some(self.selector(&NS_KEYS)?), ..Default::default() },
            2 => PolicyPeer {
                pod_selector: Some(self.selector(&POD_KEYS)?),
                namespace_selector: Some(self.selector(&NS_KEYS)?),
                ip_block: None,
            },
            3 => {
                let cidr = self.string(&CIDRS)?;
                let except = if self.chance(40)? { vec![self.string(&CIDRS)?] } else { Vec::new() };
                PolicyPeer { ip_block: Some(IpBlock { cidr, except }), ..Default::default() }
            }
            _ => PolicyPeer { pod_selector: Some(LabelSelector::default()), ..Default::default() },
        })
    }

    fn np_port(&mut self) -> R<PolicyPort> {
        let protocol = if self.chance(70)? { Some(self.pick(&Protocol::ALL)?.as_k8s().to_string()) } else { None };
        let port = i32::from(self.pick(&PORTS)?);
        Ok(match self.u.int_in_range(0..=4u8)? {
            0 => PolicyPort { protocol, port: Some(PortRef::Number(port)), end_port: None },
            1 => PolicyPort { protocol, port: Some(PortRef::Number(port)), end_port: Some(i32::from(self.pick(&PORTS)?)) },
            2 | 3 => {
                let (name, usual) = self.pick(&PORT_NAMES)?;
                let protocol = if self.chance(70)? { Some(usual.as_k8s().to_string()) } else { protocol };
                PolicyPort { protocol, port: Some(PortRef::Name(name.to_string())), end_port: None }
            }
            _ => PolicyPort { protocol, port: None, end_port: None },
        })
    }

    fn np_rule(&mut self) -> R<PolicyRule> {
        let mut rule = PolicyRule::default();
        for _ in 0..self.u.int_in_range(0..=2u8)? {
            rule.peers.push(self.np_peer()?);
        }
        for _ in 0..self.u.int_in_range(0..=2u8)? {
            rule.ports.push(self.np_port()?);
        }
        Ok(rule)
    }

    fn network_policy(&mut self) -> R<NetworkPolicy> {
        let namespace = self.string(&NAMESPACES)?;
        let name = self.string(&POLICY_NAMES)?;
        let pod_selector = self.selector(&POD_KEYS)?;
        let policy_types = match self.u.int_in_range(0..=4u8)? {
            0 | 1 => vec![],
            2 => vec!["Ingress".into()],
            3 => vec!["Egress".into()],
            _ => vec!["Ingress".into(), "Egress".into()],
        };
        let audit = self.u.ratio(1, 4)?;
        let mut p = NetworkPolicy {
            audit,
            namespace,
            name,
            pod_selector,
            policy_types,
            ingress: Vec::new(),
            egress: Vec::new(),
            generation: None,
            egress_domains: None,
        };
        for _ in 0..self.u.int_in_range(0..=2u8)? {
            p.ingress.push(self.np_rule()?);
        }
        for _ in 0..self.u.int_in_range(0..=2u8)? {
            p.egress.push(self.np_rule()?);
        }
        Ok(p)
    }

    fn cnp_pods(&mut self) -> R<CnpPods> {
        let namespace_selector = if self.chance(50)? { Some(self.selector(&NS_KEYS)?) } else { None };
        Ok(CnpPods { namespace_selector, pod_selector: self.selector(&POD_KEYS)? })
    }

    fn cnp_peer(&mut self, egress: bool) -> R<CnpPeer> {
        Ok(match self.u.int_in_range(0..=4u8)? {
            0 => CnpPeer::Namespaces(self.selector(&NS_KEYS)?),
            1 | 2 => CnpPeer::Pods(self.cnp_pods()?),
            3 if egress => CnpPeer::Networks(vec![self.string(&CIDRS)?]),
            _ if egress => CnpPeer::Nodes(self.selector(&NODE_KEYS)?),
            _ => CnpPeer::Pods(self.cnp_pods()?),
        })
    }

    fn cnp_rule(&mut self, egress: bool) -> R<CnpRule> {
        let action = self.string(&["Accept", "Deny", "Pass"])?;
        let mut peers = vec![self.cnp_peer(egress)?];
        if self.chance(30)? {
            peers.push(self.cnp_peer(egress)?);
        }
        let protocols = if self.chance(50)? {
            let port = CnpPort::Number(i64::from(self.pick(&PORTS)?));
            Some(vec![match self.u.int_in_range(0..=3u8)? {
                0 => CnpProtocol::Tcp(port),
                1 => CnpProtocol::Udp(port),
                2 => CnpProtocol::Sctp(port),
                _ => CnpProtocol::NamedPort(self.pick(&PORT_NAMES)?.0.to_string()),
            }])
        } else {
            None
        };
        Ok(CnpRule { name: None, action, peers, protocols })
    }

    fn cluster_policy(&mut self) -> R<ClusterNetworkPolicy> {
        let name = self.string(&CNP_NAMES)?;
        let tier = self.string(&["Admin", "Baseline"])?;
        let priority = Some(i64::from(self.u.int_in_range(0..=2u8)?));
        let subject = if self.chance(40)? { CnpSubject::Namespaces(self.selector(&NS_KEYS)?) } else { CnpSubject::Pods(self.cnp_pods()?) };
        let mut p = ClusterNetworkPolicy {
            name,
            audit: self.u.ratio(1, 4)?,
            generation: None,
            uid: None,
            tier,
            priority,
            subject,
            ingress: Vec::new(),
            egress: Vec::new(),
        };
        for _ in 0..self.u.int_in_range(0..=2u8)? {
            p.ingress.push(self.cnp_rule(false)?);
        }
        for _ in 0..self.u.int_in_range(0..=2u8)? {
            p.egress.push(self.cnp_rule(true)?);
        }
        Ok(p)
    }

    /// An arbitrary ClusterNetworkPolicy with a name of the pool, and mostly a known tier and
    /// selectors and CIDRs of the pools.
    fn tame_cluster_policy(&mut self, p: &mut ClusterNetworkPolicy) -> R<()> {
        p.name = self.string(&CNP_NAMES)?;
        if self.chance(90)? {
            p.tier = self.string(&["Admin", "Baseline"])?;
        }
        if let Some(prio) = &mut p.priority {
            *prio = prio.rem_euclid(4);
        }
        match &mut p.subject {
            CnpSubject::Namespaces(s) => super::tame_selector(s),
            CnpSubject::Pods(pods) => tame_cnp_pods(pods),
            CnpSubject::Invalid(_) => {}
        }
        for rule in p.ingress.iter_mut().chain(p.egress.iter_mut()) {
            for peer in &mut rule.peers {
                match peer {
                    CnpPeer::Namespaces(s) | CnpPeer::Nodes(s) => super::tame_selector(s),
                    CnpPeer::Pods(pods) => tame_cnp_pods(pods),
                    CnpPeer::Networks(cidrs) => cidrs.iter_mut().for_each(|c| super::pick(c, &CIDRS)),
                    CnpPeer::DomainNames(names) => names.iter_mut().for_each(|n| super::pick(n, super::DOMAIN_NAMES)),
                    CnpPeer::Invalid(_) => {}
                }
            }
        }
        Ok(())
    }
}

fn tame_cnp_pods(pods: &mut CnpPods) {
    pods.namespace_selector.iter_mut().for_each(super::tame_selector);
    super::tame_selector(&mut pods.pod_selector);
}
