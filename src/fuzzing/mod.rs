//! The fuzz targets' logic, shared by the cargo-fuzz targets in `fuzz/` and the corpus replay
//! in `cargo test` (`tests/fuzz_corpus.rs`), so a corpus file means the same thing in both and
//! the replay needs no libFuzzer. Built only with the `arbitrary` feature.
//!
//! Each target takes the raw input, runs the pipeline, asserts its property (a violation
//! panics: a crash to libFuzzer, a failure to the replay) and returns every ruleset text it
//! rendered, so the kernel test can load each one with `nft -c`:
//!
//! - [`pipeline`]: an arbitrary snapshot and endpoints → translate → render: no panic,
//!   rendering again with the endpoints in reverse order gives the same bytes, the
//!   text parses back to exactly the rendered objects ([`check_structure`]), and the in-memory
//!   nft applies it and reads back what was applied (no drift). The last three, the
//!   cross-checks, run on one input in [`CROSS_CHECK_EVERY`] (chosen by the input's hash);
//!   [`pipeline_full`], a target of its own over the same corpus, and the corpus replay run
//!   them on every input.
//! - [`manifest`]: manifest bytes → parse → snapshot → translate and render for every node:
//!   no panic, and the same structure check.
//! - [`hostile_strings`]: arbitrary strings put into the names, labels, annotations, port
//!   names, node names and policy fields of a realistic cluster, written as a manifest and read
//!   back: the rendered script still parses to exactly the objects of the typed ruleset.
//! - [`fail_closed`]: valid policies plus one the API server would reject: the rejected one
//!   isolates what it would select and allows nothing beyond its own valid rules
//!   ([`fail_closed`](mod@fail_closed) module).
//! - [`differential`]: random clusters with NetworkPolicies and ClusterNetworkPolicies: the
//!   enforced rulesets (through the packet tracer) agree with the reference evaluator
//!   ([`crate::reference`]) on every flow ([`differential`](mod@differential) module).
//! - [`dns_answer`]: any bytes as a resolver's response: [`crate::dns::learn`] never panics
//!   and teaches only what the response holds ([`dns`](mod@dns) module).
//! - [`dns_exchange`]: the DNS proxy's rewriting of a pod's query and its matching of an
//!   answer against the outstanding query ([`crate::dns::exchange`]): no panic, only the answer
//!   to the rewritten query is accepted, and the pod gets it back with its own id and question.
//! - [`incremental`]: a cluster and the node's endpoints changed step by step: after each
//!   step the incremental translator and render cache agree with the full translation and
//!   render ([`incremental`](mod@incremental) module).
//!
//! Structured input comes from the model types' `Arbitrary` derives. Arbitrary strings rarely
//! equal each other, so a few fields are *tamed*: a one-byte string becomes an entry of a small
//! pool of realistic values (namespace `x`, label `pod=a`, port `serve-80-tcp`, CIDR
//! `198.18.0.0/15`), most addresses land in the clusters' ranges, and absurd port numbers
//! near 80. Everything longer or rarer stays as arbitrary as the fuzzer made it.

pub mod differential;
pub mod dns;
pub mod fail_closed;
pub mod incremental;

pub use differential::differential;
pub use dns::{dns_answer, dns_exchange};
pub use fail_closed::fail_closed;
pub use incremental::incremental;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::sync::OnceLock;

use arbitrary::{Arbitrary, Unstructured};

use crate::apply::fake::FakeNft;
use crate::apply::{Applier, Backend, Drift};
use crate::model::manifest::{self, ManifestError, Object};
use crate::model::{
    LabelSelector, Labels, LocalEndpoint, Namespace, NetworkPolicy, Node, ObjectRef, Pod, PodPhase, PolicyPeer, PolicyPort, PortRef,
    Snapshot,
};
use crate::nft::NftRuleset;
use crate::render::{self, Object as RsObject, Ruleset, names};
use crate::translate::{self, Options};

/// Renders for at most this many nodes per input (keeps one execution fast).
const MAX_NODES: usize = 4;

// ---------------------------------------------------------------------------------------------
// pipeline

/// A cluster to start from, so inputs need not build one from nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    Empty,
    /// The conformance base cluster (x/y/z × a/b/c on two nodes).
    Conformance,
    /// `deploy/examples/quickstart`, its policy included.
    Quickstart,
}

/// Most inputs start from the empty cluster: a small input keeps an execution short, so the
/// fuzzer tries many more of them; one in eight starts from each base cluster, whose renders
/// are larger. Reads a `u32`, as the derived implementation did, so the rest of an input
/// decodes as before.
impl<'a> Arbitrary<'a> for Base {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match u32::arbitrary(u)? % 8 {
            0 => Self::Conformance,
            1 => Self::Quickstart,
            _ => Self::Empty,
        })
    }

    fn size_hint(_depth: usize) -> (usize, Option<usize>) {
        (4, Some(4))
    }
}

/// Which node to render for.
#[derive(Debug, Clone, Arbitrary)]
pub(crate) enum NodePick {
    /// An index into the known node names (Nodes and pods' `nodeName`, sorted).
    Known(u8),
    Named(String),
}

/// An endpoint the runtime reports besides those derived from the snapshot: any container
/// id (the interface name is derived from it, as the CNI plugin does), any pod reference and
/// uid (unknown pods, stale uids), any addresses.
#[derive(Debug, Clone, Arbitrary)]
pub(crate) struct EndpointInput {
    pub(crate) container_id: String,
    pub(crate) pod: ObjectRef,
    pub(crate) pod_uid: Option<String>,
    pub(crate) addrs: Vec<IpAddr>,
}

/// The `pipeline` target's input.
#[derive(Debug, Clone, Arbitrary)]
pub struct PipelineInput {
    pub base: Base,
    pub(crate) namespaces: Vec<Namespace>,
    pub(crate) pods: Vec<Pod>,
    pub(crate) policies: Vec<NetworkPolicy>,
    pub(crate) nodes: Vec<Node>,
    pub(crate) node: NodePick,
    pub(crate) endpoints: Vec<EndpointInput>,
    pub(crate) isolate_run_pods: bool,
    /// Every pod's allow rules through peer classes (`RenderOptions::peer_classes_from` 0),
    /// instead of only those of pods with many rules.
    pub(crate) peer_classes: bool,
}

/// One input in this many gets the cross-checks in target `pipeline`.
pub(crate) const CROSS_CHECK_EVERY: u64 = 8;

/// Whether `pipeline` cross-checks this input (a second render, the in-memory nft): decided by
/// the input's bytes alone (FNV-1a), so a crash reproduces from its file. The cross-checks
/// are most of an execution; running them on one input in [`CROSS_CHECK_EVERY`] lets the
/// fuzzer try several times as many inputs, while [`pipeline_full`] and the corpus replay
/// run them on every one.
pub(crate) fn cross_check_sampled(data: &[u8]) -> bool {
    fnv1a(data).is_multiple_of(CROSS_CHECK_EVERY)
}

/// One input in this many may add as many objects as its bytes describe; the others add at
/// most [`SMALL`] of each kind on top of their base cluster.
pub(crate) const BIG_EVERY: u64 = 16;

/// How many objects of each kind a small `pipeline` input adds: (namespaces, pods, policies,
/// nodes, endpoints). An execution's cost grows with the objects, and libFuzzer lets inputs
/// grow as it runs; capping most of them keeps the fuzzer fast while big clusters still come
/// from the base clusters and the big inputs.
pub(crate) const SMALL: (usize, usize, usize, usize, usize) = (4, 8, 4, 2, 4);

/// Whether this input is big (see [`BIG_EVERY`]): other bits of the same hash as the sample.
pub(crate) fn big_input(data: &[u8]) -> bool {
    (fnv1a(data) >> 32).is_multiple_of(BIG_EVERY)
}

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// Target `pipeline`: see the module doc. Translation, render and text run on every input,
/// the cross-checks on a sample ([`cross_check_sampled`]).
pub fn pipeline(data: &[u8]) -> Vec<String> {
    run_pipeline(data, cross_check_sampled(data))
}

/// Target `pipeline_full`: [`pipeline`] with every check on every input (the corpus replay
/// uses it for the `pipeline` corpus).
pub fn pipeline_full(data: &[u8]) -> Vec<String> {
    run_pipeline(data, true)
}

#[allow(clippy::panic)]
fn run_pipeline(data: &[u8], cross_check: bool) -> Vec<String> {
    let Ok(mut input) = PipelineInput::arbitrary_take_rest(Unstructured::new(data)) else { return Vec::new() };
    if !big_input(data) {
        let (namespaces, pods, policies, nodes, endpoints) = SMALL;
        input.namespaces.truncate(namespaces);
        input.pods.truncate(pods);
        input.policies.truncate(policies);
        input.nodes.truncate(nodes);
        input.endpoints.truncate(endpoints);
    }
    let mut snapshot = base_snapshot(input.base);
    for ns in input.namespaces {
        snapshot.upsert_namespace(tame_namespace(ns));
    }
    for pod in input.pods {
        snapshot.upsert_pod(tame_pod(pod));
    }
    for policy in input.policies {
        snapshot.upsert_policy(tame_policy(policy));
    }
    for node in input.nodes {
        snapshot.upsert_node(tame_node(node));
    }
    let node = match input.node {
        NodePick::Known(i) => {
            let known = node_names(&snapshot);
            known.get(usize::from(i) % known.len().max(1)).cloned().unwrap_or_else(|| "node-1".into())
        }
        NodePick::Named(mut n) => {
            pick(&mut n, NODES);
            n
        }
    };
    let mut endpoints = snapshot.derived_endpoints(&node);
    endpoints.extend(input.endpoints.into_iter().map(tame_endpoint));
    let options = Options { isolate_run_pods: input.isolate_run_pods, ..Options::default() };

    let shape = if input.peer_classes {
        render::RenderOptions { peer_classes_from: 0, ..crate::render::RenderOptions::DEFAULT }
    } else {
        render::RenderOptions::default()
    };
    let render =
        |endpoints: &[crate::model::LocalEndpoint]| render::render_with(&translate::translate(&snapshot, endpoints, &options), &shape);

    let _ = translate::validate_all(&snapshot);
    let ruleset = render(&endpoints);
    let text = ruleset.to_text();
    // A second render with the endpoints in reverse order: equal bytes show the render is
    // deterministic and independent of the order in which the runtime reports endpoints.
    // (Without endpoints the render is the base table alone, checked by the goldens.)
    if !cross_check {
        return vec![text];
    }
    if !endpoints.is_empty() {
        endpoints.reverse();
        let reversed = render(&endpoints).to_text();
        assert!(
            text == reversed,
            "rendering the same input again, endpoints reversed, gave different bytes:\n{}",
            first_difference(&text, &reversed)
        );
    }
    // The in-memory nft (the kernel's reference and type checks) takes it; into an empty
    // table the transaction is the text itself, so its parse is the one the structure check
    // reads (one parse per input: parsing is most of an execution).
    //
    // The baseline is read once, after the apply: the in-memory nft reads the same each time.
    let mut applier = Applier::new(FakeNft::new()).defer_baseline();
    if let Err(e) = applier.apply(&ruleset) {
        panic!("node {node:?}: the in-memory nft refused the render: {e}\n{text}");
    }
    let commit = applier.commits();
    let baseline = applier.backend_mut().read_state().unwrap_or_else(|e| panic!("node {node:?}: reading the in-memory nft: {e}"));
    applier.accept_baseline(commit, baseline);
    if applier.backend().last_script.as_deref() != Some(text.as_str()) {
        panic!("node {node:?}: the first transaction into an empty table is not the render alone");
    }
    if let Err(e) = check_parsed(&ruleset, applier.backend().state()) {
        panic!("node {node:?}: {e}\n{text}");
    }
    // ... and reads back what was applied.
    match applier.check_drift() {
        Ok(Drift::InSync) => {}
        other => panic!("node {node:?}: the applied table does not read back as applied: {other:?}\n{text}"),
    }
    vec![text]
}

fn base_snapshot(base: Base) -> Snapshot {
    static BASES: OnceLock<[Snapshot; 3]> = OnceLock::new();
    let bases = BASES.get_or_init(|| {
        [
            Snapshot::new(),
            crate::testkit::base_cluster(),
            crate::testkit::parse_manifests(&format!("{QUICKSTART_CLUSTER}\n---\n{QUICKSTART_POLICIES}")).to_snapshot(),
        ]
    });
    bases[base as usize].clone()
}

const QUICKSTART_CLUSTER: &str = include_str!("../../deploy/examples/quickstart/cluster.yaml");
const QUICKSTART_POLICIES: &str = include_str!("../../deploy/examples/quickstart/policies.yaml");

/// Nodes and pods' `nodeName`s, sorted and de-duplicated.
fn node_names(s: &Snapshot) -> Vec<String> {
    let mut names: Vec<String> = s.nodes().map(|n| n.name.clone()).chain(s.pods().filter_map(|p| p.node.clone())).collect();
    names.sort();
    names.dedup();
    names
}

// ---------------------------------------------------------------------------------------------
// manifest

/// Target `manifest`: see the module doc.
#[allow(clippy::panic)]
pub fn manifest(data: &[u8]) -> Vec<String> {
    let Ok(text) = std::str::from_utf8(data) else { return Vec::new() };
    let Ok(m) = manifest::parse_str(Path::new("fuzz.yaml"), text) else { return Vec::new() };
    render_nodes(&m.to_snapshot())
}

/// Translates and renders for (up to [`MAX_NODES`]) nodes of `snapshot`, checking each
/// render's structure; returns the texts.
#[allow(clippy::panic)]
fn render_nodes(snapshot: &Snapshot) -> Vec<String> {
    let _ = translate::validate_all(snapshot);
    let mut out = Vec::new();
    for node in node_names(snapshot).into_iter().take(MAX_NODES) {
        let endpoints = snapshot.derived_endpoints(&node);
        let ruleset = render::render(&translate::translate(snapshot, &endpoints, &Options::default()));
        let text = ruleset.to_text();
        if let Err(e) = check_structure(&ruleset, &text) {
            panic!("node {node:?}: {e}\n{text}");
        }
        out.push(text);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// hostile_strings

/// Where a hostile string goes; the index picks the object (modulo their number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub(crate) enum Slot {
    /// Renames a namespace; its pods and policies follow.
    NamespaceName(u8),
    NamespaceLabelKey(u8),
    NamespaceLabelValue(u8),
    PodName(u8),
    PodUid(u8),
    PodLabelKey(u8),
    /// Sets every existing label of the pod to the string.
    PodLabelValue(u8),
    /// Renames the named container ports of a pod (and the policies' references to them).
    PortName(u8),
    PolicyName(u8),
    /// A `matchLabels` value of the policy's pod selector and of its peers' selectors.
    SelectorValue(u8),
    /// An `In` expression's key and value in the policy's pod selector.
    SelectorExpression(u8),
    /// An ipBlock CIDR (a new egress rule with the string as CIDR and except).
    Cidr(u8),
    PolicyType(u8),
    Protocol(u8),
    /// Renames a node; its pods follow.
    NodeName(u8),
    /// An annotation (key and value) on any object.
    Annotation(u8),
}

/// The `hostile_strings` target's input: strings and where each goes (slots repeat when
/// there are more strings).
#[derive(Debug, Clone, Arbitrary)]
pub(crate) struct HostileInput {
    pub(crate) quickstart: bool,
    pub(crate) slots: Vec<Slot>,
    pub(crate) strings: Vec<String>,
}

/// Target `hostile_strings`: see the module doc.
#[allow(clippy::panic)]
pub fn hostile_strings(data: &[u8]) -> Vec<String> {
    let Ok(input) = HostileInput::arbitrary_take_rest(Unstructured::new(data)) else { return Vec::new() };
    let base = if input.quickstart { Base::Quickstart } else { Base::Conformance };
    let mut objects: Vec<Object> = base_objects(base);
    let mut annotations: BTreeMap<usize, Annotations> = BTreeMap::new();
    if !input.slots.is_empty() {
        for (slot, s) in input.slots.iter().cycle().zip(input.strings) {
            inject(&mut objects, &mut annotations, *slot, s);
        }
    }
    let text = to_manifest(&objects, &annotations);
    let m = match manifest::parse_str(Path::new("hostile.yaml"), &text) {
        Ok(m) => m,
        // The API server's own rules (a name must not be empty, ...): not flock's to judge.
        Err(ManifestError::Object { .. }) => return Vec::new(),
        Err(e) => panic!("the manifest writer produced a manifest that does not read back: {e}\n{text}"),
    };
    assert!(m.warnings.is_empty(), "unexpected warnings: {:?}", m.warnings);
    render_nodes(&m.to_snapshot())
}

fn base_objects(base: Base) -> Vec<Object> {
    static OBJECTS: OnceLock<[Vec<Object>; 2]> = OnceLock::new();
    let objects = OBJECTS.get_or_init(|| {
        // Three of the conformance cluster's nine pods (one per namespace) keep executions fast.
        let mut conformance =
            crate::testkit::parse_manifests(&format!("{}\n---\n{HOSTILE_POLICIES}", crate::testkit::BASE_CLUSTER_YAML)).objects;
        conformance.retain(
            |o| !matches!(o, Object::Pod(p) if !matches!((p.namespace.as_str(), p.name.as_str()), ("x", "a") | ("y", "b") | ("z", "c"))),
        );
        [conformance, crate::testkit::parse_manifests(&format!("{QUICKSTART_CLUSTER}\n---\n{QUICKSTART_POLICIES}")).objects]
    });
    objects[usize::from(base == Base::Quickstart)].clone()
}

/// Policies over the conformance cluster that use every feature a string can reach: pod and
/// namespace selectors (labels and expressions), ipBlocks, named ports both ways, endPort.
const HOSTILE_POLICIES: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-web, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: y}}, podSelector: {matchExpressions: [{key: pod, operator: In, values: [b, c]}]}}]
    ports: [{port: serve-80-tcp}, {port: 81, endPort: 90, protocol: UDP}]
  egress:
  - to: [{podSelector: {matchLabels: {pod: b}}, namespaceSelector: {}}]
    ports: [{port: serve-81-sctp, protocol: SCTP}]
  - to: [{ipBlock: {cidr: 198.18.0.0/15, except: [198.18.2.0/24]}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-z, namespace: y}
spec:
  podSelector: {matchExpressions: [{key: pod, operator: NotIn, values: [c]}]}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {ns: z}}}]
";

/// Puts `s` into the slot of `objects`.
fn inject(objects: &mut [Object], annotations: &mut BTreeMap<usize, Annotations>, slot: Slot, s: String) {
    let nth = |objects: &[Object], i: u8, f: fn(&Object) -> bool| -> Option<usize> {
        let idx: Vec<usize> = objects.iter().enumerate().filter(|(_, o)| f(o)).map(|(i, _)| i).collect();
        (!idx.is_empty()).then(|| idx[usize::from(i) % idx.len()])
    };
    let is_ns = |o: &Object| matches!(o, Object::Namespace(_));
    let is_pod = |o: &Object| matches!(o, Object::Pod(_));
    let is_policy = |o: &Object| matches!(o, Object::NetworkPolicy(_));
    let is_node = |o: &Object| matches!(o, Object::Node(_));
    match slot {
        Slot::NamespaceName(i) => {
            let Some(k) = nth(objects, i, is_ns) else { return };
            let Object::Namespace(ns) = &mut objects[k] else { return };
            let old = std::mem::replace(&mut ns.name, s.clone());
            for o in objects.iter_mut() {
                match o {
                    Object::Pod(p) if p.namespace == old => p.namespace = s.clone(),
                    Object::NetworkPolicy(p) if p.namespace == old => p.namespace = s.clone(),
                    _ => {}
                }
            }
        }
        Slot::NamespaceLabelKey(i) | Slot::NamespaceLabelValue(i) => {
            let Some(k) = nth(objects, i, is_ns) else { return };
            let Object::Namespace(ns) = &mut objects[k] else { return };
            if matches!(slot, Slot::NamespaceLabelKey(_)) {
                ns.labels.insert(s, "x");
            } else {
                ns.labels = ns.labels.keys().map(|k| (k, s.as_str())).collect();
            }
        }
        Slot::PodName(i) | Slot::PodUid(i) | Slot::PodLabelKey(i) | Slot::PodLabelValue(i) | Slot::PortName(i) => {
            let Some(k) = nth(objects, i, is_pod) else { return };
            let Object::Pod(p) = &mut objects[k] else { return };
            match slot {
                Slot::PodName(_) => p.name = s,
                Slot::PodUid(_) => p.uid = s,
                Slot::PodLabelKey(_) => {
                    p.labels.insert(s, "a");
                }
                Slot::PodLabelValue(_) => p.labels = p.labels.keys().map(|k| (k, s.as_str())).collect(),
                _ => {
                    let mut renamed = Vec::new();
                    for cp in p.ports.iter_mut().filter(|cp| cp.name.is_some()) {
                        renamed.extend(cp.name.replace(s.as_str().into()));
                    }
                    for o in objects.iter_mut() {
                        if let Object::NetworkPolicy(np) = o {
                            for port in np.ingress.iter_mut().chain(np.egress.iter_mut()).flat_map(|r| r.ports.iter_mut()) {
                                if matches!(&port.port, Some(PortRef::Name(n)) if renamed.iter().any(|r: &std::sync::Arc<str>| **r == **n))
                                {
                                    port.port = Some(PortRef::Name(s.clone()));
                                }
                            }
                        }
                    }
                }
            }
        }
        Slot::PolicyName(i)
        | Slot::SelectorValue(i)
        | Slot::SelectorExpression(i)
        | Slot::Cidr(i)
        | Slot::PolicyType(i)
        | Slot::Protocol(i) => {
            let Some(k) = nth(objects, i, is_policy) else { return };
            let Object::NetworkPolicy(np) = &mut objects[k] else { return };
            match slot {
                Slot::PolicyName(_) => np.name = s,
                Slot::SelectorValue(_) => {
                    let peers = np.ingress.iter_mut().chain(np.egress.iter_mut()).flat_map(|r| r.peers.iter_mut());
                    let selectors = peers.flat_map(|p| p.pod_selector.iter_mut().chain(p.namespace_selector.iter_mut()));
                    for sel in std::iter::once(&mut np.pod_selector).chain(selectors) {
                        sel.match_labels.values_mut().for_each(|v| *v = s.clone());
                    }
                }
                Slot::SelectorExpression(_) => np.pod_selector.match_expressions.push(crate::model::LabelSelectorRequirement {
                    key: s.clone(),
                    operator: "In".into(),
                    values: vec![s],
                }),
                Slot::Cidr(_) => np.egress.push(crate::model::PolicyRule {
                    peers: vec![PolicyPeer {
                        ip_block: Some(crate::model::IpBlock { cidr: s.clone(), except: vec![s] }),
                        ..Default::default()
                    }],
                    ports: vec![],
                }),
                Slot::PolicyType(_) => np.policy_types.push(s),
                _ => np.ingress.push(crate::model::PolicyRule {
                    peers: vec![],
                    ports: vec![PolicyPort { protocol: Some(s), port: Some(PortRef::Number(80)), end_port: None }],
                }),
            }
        }
        Slot::NodeName(i) => {
            let Some(k) = nth(objects, i, is_node) else { return };
            let Object::Node(n) = &mut objects[k] else { return };
            let old = std::mem::replace(&mut n.name, s.clone());
            for o in objects.iter_mut() {
                if let Object::Pod(p) = o
                    && p.node.as_deref() == Some(old.as_str())
                {
                    p.node = Some(s.clone());
                }
            }
        }
        Slot::Annotation(i) => {
            let k = usize::from(i) % objects.len().max(1);
            annotations.entry(k).or_default().insert(s.clone(), s);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The structure check

/// Checks that `text` (the render of `rs`) parses to exactly the objects of `rs`: one table
/// `inet flock` with the same comment, the same chains (comments, hooks, rules word for word),
/// sets and maps (types, flags, comments, elements with their comments and verdicts), nothing
/// more, and object names that are plain identifiers. A string that became nft syntax would
/// change at least one of these.
pub(crate) fn check_structure(rs: &Ruleset, text: &str) -> Result<(), String> {
    let parsed = NftRuleset::from_text(text).map_err(|e| format!("the render does not parse: {e}"))?;
    check_parsed(rs, &parsed)
}

/// [`check_structure`] of a render already parsed (and applied) into `parsed`.
pub(crate) fn check_parsed(rs: &Ruleset, parsed: &NftRuleset) -> Result<(), String> {
    if parsed.tables.len() != 1 {
        return Err(format!("{} tables instead of one", parsed.tables.len()));
    }
    let t = parsed.table(names::FAMILY, names::TABLE).ok_or("no table inet flock")?;
    if t.comment.as_deref() != Some(rs.comment.as_str()) {
        return Err(format!("table comment {:?}, rendered {:?}", t.comment, rs.comment));
    }
    if t.chains.len() + t.sets.len() != rs.objects.len() {
        return Err(format!("{} chains and {} sets parsed, {} objects rendered", t.chains.len(), t.sets.len(), rs.objects.len()));
    }
    for o in &rs.objects {
        let name = o.name();
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._/-".contains(&b)) {
            return Err(format!("object name {name:?} is not a plain identifier"));
        }
        match o {
            RsObject::Chain(c) => {
                let p = t.chains.get(name).ok_or_else(|| format!("chain {name} is missing"))?;
                if p.spec.comment.as_deref() != Some(c.comment.as_str()) {
                    return Err(format!("chain {name}: comment {:?}, rendered {:?}", p.spec.comment, c.comment));
                }
                if p.spec.hook.is_some() != c.hook.is_some() {
                    return Err(format!("chain {name}: hook {:?}", p.spec.hook));
                }
                if !p.rules.iter().map(String::as_str).eq(c
                    .rules
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .iter()
                    .map(String::as_str))
                {
                    return Err(format!("chain {name}: rules differ:\n parsed   {:?}\n rendered {:?}", p.rules, c.rules));
                }
            }
            RsObject::Set(s) => {
                let p = t.sets.get(name).ok_or_else(|| format!("set {name} is missing"))?;
                let mut type_ = s.key.join(" . ");
                if let Some(d) = s.data {
                    let _ = write!(type_, " : {d}");
                }
                if p.kind.to_string() != o.keyword() || p.spec.type_ != type_ {
                    return Err(format!("{} {name}: parsed as {} of type {:?}", o.keyword(), p.kind, p.spec.type_));
                }
                if !p.spec.flags.iter().map(String::as_str).eq(s.flags())
                    || p.spec.comment.as_deref() != Some(s.comment.as_str())
                    || p.spec.limit.as_deref() != s.limit_text().as_deref().and_then(|l| l.strip_prefix("limit "))
                {
                    return Err(format!("set {name}: flags {:?}, limit {:?}, comment {:?}", p.spec.flags, p.spec.limit, p.spec.comment));
                }
                if p.elements.len() != s.elements.len() {
                    return Err(format!("set {name}: {} elements parsed, {} rendered", p.elements.len(), s.elements.len()));
                }
                for e in s.elements.iter() {
                    let key = e.key.to_string();
                    let pe = p.elements.get(&key).ok_or_else(|| format!("set {name}: element {key:?} is missing"))?;
                    if pe.comment.as_deref() != Some(e.comment.as_str()) || pe.verdict != e.verdict.as_ref().map(ToString::to_string) {
                        return Err(format!("set {name}: element {:?} parsed as {pe:?}", e.key));
                    }
                }
            }
        }
    }
    Ok(())
}

fn first_difference(a: &str, b: &str) -> String {
    a.lines().zip(b.lines()).find(|(x, y)| x != y).map_or_else(|| "one is longer".to_string(), |(x, y)| format!("{x}\n{y}"))
}

// ---------------------------------------------------------------------------------------------
// Manifests from model objects

/// Writes `objects` as a Kubernetes manifest (one flow-style YAML document each) that
/// [`manifest::parse_str`] reads back to the same objects. Every string is double-quoted with
/// every character outside printable ASCII escaped, so any string survives the trip.
/// `annotations` are added to the object at their index.
pub fn to_manifest(objects: &[Object], annotations: &BTreeMap<usize, Annotations>) -> String {
    let mut out = String::new();
    for (i, o) in objects.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        let ann = annotations.get(&i);
        match o {
            // JSON is flow-style YAML; serde_json escapes every string safely.
            Object::ClusterNetworkPolicy(p) => {
                out.push_str(&crate::model::cnp::to_json(p).to_string());
                out.push('\n');
                continue;
            }
            Object::Namespace(ns) => {
                out.push_str("{\"apiVersion\": \"v1\", \"kind\": \"Namespace\", ");
                let mut ann = ann.cloned().unwrap_or_default();
                if ns.audit {
                    ann.insert(crate::model::ENFORCEMENT_ANNOTATION.into(), "audit".into());
                }
                if ns.log_allowed {
                    ann.insert(crate::model::LOG_ALLOWED_ANNOTATION.into(), "true".into());
                }
                metadata(&mut out, &ns.name, None, None, Some(&ns.labels), Some(&ann), None);
            }
            Object::Node(n) => {
                out.push_str("{\"apiVersion\": \"v1\", \"kind\": \"Node\", ");
                metadata(&mut out, &n.name, None, None, Some(&n.labels), ann, None);
                let cidrs: Vec<String> = n.pod_cidrs.iter().map(|c| yaml_str(&c.to_string())).collect();
                let external = n.addresses.iter().filter(|a| !n.internal_ips.contains(a));
                let addrs: Vec<String> = n
                    .internal_ips
                    .iter()
                    .map(|a| ("InternalIP", a))
                    .chain(external.map(|a| ("ExternalIP", a)))
                    .map(|(t, a)| format!("{{\"type\": \"{t}\", \"address\": {}}}", yaml_str(&a.to_string())))
                    .collect();
                let _ = write!(
                    out,
                    ", \"spec\": {{\"podCIDRs\": [{}]}}, \"status\": {{\"addresses\": [{}]}}",
                    cidrs.join(", "),
                    addrs.join(", ")
                );
            }
            Object::Pod(p) => {
                out.push_str("{\"apiVersion\": \"v1\", \"kind\": \"Pod\", ");
                metadata(&mut out, &p.name, Some(&p.namespace), Some(&p.uid), Some(&p.labels), ann, None);
                let ports: Vec<String> = p
                    .ports
                    .iter()
                    .map(|cp| {
                        let name = cp.name.as_deref().map(|n| format!("\"name\": {}, ", yaml_str(n))).unwrap_or_default();
                        format!("{{{name}\"containerPort\": {}, \"protocol\": \"{}\"}}", cp.port, cp.protocol.as_k8s())
                    })
                    .collect();
                out.push_str(", \"spec\": {");
                if let Some(node) = &p.node {
                    let _ = write!(out, "\"nodeName\": {}, ", yaml_str(node));
                }
                let _ = write!(
                    out,
                    "\"hostNetwork\": {}, \"containers\": [{{\"name\": \"c\", \"ports\": [{}]}}]}}",
                    p.host_network,
                    ports.join(", ")
                );
                let ips: Vec<String> = p.ips.iter().map(|ip| format!("{{\"ip\": {}}}", yaml_str(&ip.to_string()))).collect();
                let _ = write!(out, ", \"status\": {{\"phase\": \"{}\", \"podIPs\": [{}]}}", phase(p.phase), ips.join(", "));
            }
            Object::NetworkPolicy(np) => {
                out.push_str("{\"apiVersion\": \"networking.k8s.io/v1\", \"kind\": \"NetworkPolicy\", ");
                let mut ann = ann.cloned().unwrap_or_default();
                if np.audit {
                    ann.insert(crate::model::ENFORCEMENT_ANNOTATION.into(), "audit".into());
                }
                metadata(&mut out, &np.name, Some(&np.namespace), None, None, Some(&ann), np.generation);
                out.push_str(", \"spec\": {\"podSelector\": ");
                selector(&mut out, &np.pod_selector);
                let types: Vec<String> = np.policy_types.iter().map(|t| yaml_str(t)).collect();
                let _ = write!(out, ", \"policyTypes\": [{}]", types.join(", "));
                for (field, peers_field, rules) in [("ingress", "from", &np.ingress), ("egress", "to", &np.egress)] {
                    let _ = write!(out, ", \"{field}\": [");
                    for (j, r) in rules.iter().enumerate() {
                        if j > 0 {
                            out.push_str(", ");
                        }
                        let _ = write!(out, "{{\"{peers_field}\": [");
                        for (k, peer) in r.peers.iter().enumerate() {
                            if k > 0 {
                                out.push_str(", ");
                            }
                            policy_peer(&mut out, peer);
                        }
                        out.push_str("], \"ports\": [");
                        for (k, port) in r.ports.iter().enumerate() {
                            if k > 0 {
                                out.push_str(", ");
                            }
                            policy_port(&mut out, port);
                        }
                        out.push_str("]}");
                    }
                    out.push(']');
                }
                out.push('}');
            }
        }
        out.push_str("}\n");
    }
    out
}

fn metadata(
    out: &mut String,
    name: &str,
    namespace: Option<&str>,
    uid: Option<&str>,
    labels: Option<&Labels>,
    ann: Option<&Annotations>,
    generation: Option<i64>,
) {
    let _ = write!(out, "\"metadata\": {{\"name\": {}", yaml_str(name));
    if let Some(g) = generation {
        let _ = write!(out, ", \"generation\": {g}");
    }
    if let Some(ns) = namespace {
        let _ = write!(out, ", \"namespace\": {}", yaml_str(ns));
    }
    if let Some(uid) = uid {
        let _ = write!(out, ", \"uid\": {}", yaml_str(uid));
    }
    if let Some(map) = labels {
        out.push_str(", \"labels\": ");
        string_map(out, map.iter());
    }
    if let Some(map) = ann {
        out.push_str(", \"annotations\": ");
        string_map(out, map.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    }
    out.push('}');
}

fn string_map<'a>(out: &mut String, map: impl Iterator<Item = (&'a str, &'a str)>) {
    out.push('{');
    for (i, (k, v)) in map.enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{}: {}", yaml_str(k), yaml_str(v));
    }
    out.push('}');
}

fn selector(out: &mut String, sel: &LabelSelector) {
    out.push_str("{\"matchLabels\": ");
    string_map(out, sel.match_labels.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    out.push_str(", \"matchExpressions\": [");
    for (i, e) in sel.match_expressions.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let values: Vec<String> = e.values.iter().map(|v| yaml_str(v)).collect();
        let _ =
            write!(out, "{{\"key\": {}, \"operator\": {}, \"values\": [{}]}}", yaml_str(&e.key), yaml_str(&e.operator), values.join(", "));
    }
    out.push_str("]}");
}

fn policy_peer(out: &mut String, peer: &PolicyPeer) {
    out.push('{');
    let mut first = true;
    let mut sep = |out: &mut String| {
        if !first {
            out.push_str(", ");
        }
        first = false;
    };
    if let Some(s) = &peer.pod_selector {
        sep(out);
        out.push_str("\"podSelector\": ");
        selector(out, s);
    }
    if let Some(s) = &peer.namespace_selector {
        sep(out);
        out.push_str("\"namespaceSelector\": ");
        selector(out, s);
    }
    if let Some(b) = &peer.ip_block {
        sep(out);
        let except: Vec<String> = b.except.iter().map(|e| yaml_str(e)).collect();
        let _ = write!(out, "\"ipBlock\": {{\"cidr\": {}, \"except\": [{}]}}", yaml_str(&b.cidr), except.join(", "));
    }
    out.push('}');
}

fn policy_port(out: &mut String, port: &PolicyPort) {
    let mut fields = Vec::new();
    if let Some(p) = &port.protocol {
        fields.push(format!("\"protocol\": {}", yaml_str(p)));
    }
    match &port.port {
        Some(PortRef::Number(n)) => fields.push(format!("\"port\": {n}")),
        Some(PortRef::Name(n)) => fields.push(format!("\"port\": {}", yaml_str(n))),
        None => {}
    }
    if let Some(e) = port.end_port {
        fields.push(format!("\"endPort\": {e}"));
    }
    let _ = write!(out, "{{{}}}", fields.join(", "));
}

fn phase(p: PodPhase) -> &'static str {
    match p {
        PodPhase::Pending => "Pending",
        PodPhase::Running => "Running",
        PodPhase::Succeeded => "Succeeded",
        PodPhase::Failed => "Failed",
        PodPhase::Unknown => "Unknown",
    }
}

/// A YAML double-quoted scalar for any string: printable ASCII as is (`"` and `\` escaped),
/// everything else as `\xXX`, `\uXXXX` or `\UXXXXXXXX`.
pub(crate) fn yaml_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' => out.push(c),
            c if u32::from(c) <= 0xff => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if u32::from(c) <= 0xffff => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\U{:08x}", u32::from(c));
            }
        }
    }
    out.push('"');
    out
}

// ---------------------------------------------------------------------------------------------
// Taming

const NAMESPACES: &[&str] = &["x", "y", "z", "shop", "tools", "default"];
const POD_NAMES: &[&str] = &["a", "b", "c", "web", "db", "debug"];
const NODES: &[&str] = &["node-1", "node-2"];
const LABEL_KEYS: &[&str] = &["pod", "ns", "app", "team", "kubernetes.io/metadata.name", crate::model::RUN_LABEL];
const LABEL_VALUES: &[&str] = &["a", "b", "c", "x", "y", "z", "web", "db", "shop", ""];
const PORT_NAMES: &[&str] = &["serve-80-tcp", "serve-81-udp", "serve-80-sctp", "http", "pg", "dns"];
const PROTOCOLS: &[&str] = &["TCP", "UDP", "SCTP", "tcp", ""];
const POLICY_TYPES: &[&str] = &["Ingress", "Egress", "Sideways"];
const OPERATORS: &[&str] = &["In", "NotIn", "Exists", "DoesNotExist", "Equals"];
const CIDRS: &[&str] =
    &["198.18.0.0/15", "198.18.1.0/24", "198.18.1.11/32", "0.0.0.0/0", "10.0.0.0/8", "2001:db8::/32", "2001:db8:1::/64", "::/0"];

/// A one-byte string becomes an entry of `pool`.
/// Domain names and `flock.dev/egress-domains` annotations a one-byte string becomes (valid and
/// not), so the fuzzers reach domain rules.
pub(crate) const DOMAIN_NAMES: &[&str] = &["example.com", "*.example.com", "api.example.test", "*.*.bad", "com"];
const EGRESS_DOMAINS: &[&str] = &[
    r#"[{"name": "example.com", "ports": [{"port": 443}]}]"#,
    r#"[{"name": "*.example.com"}, {"name": "api.example.test", "ports": [{"protocol": "UDP", "port": 53, "endPort": 60}]}]"#,
    r#"[{"name": "*.*.bad"}]"#,
    "not json",
];

fn pick(s: &mut String, pool: &[&str]) {
    if let [b] = s.as_bytes() {
        *s = pool[usize::from(*b) % pool.len()].to_string();
    }
}

fn pick_opt(s: &mut Option<String>, pool: &[&str]) {
    if let Some(s) = s {
        pick(s, pool);
    }
}

/// Most addresses land in the clusters' ranges (198.18.0.0/22, 2001:db8:0-3::/120) where
/// pods and ipBlocks meet; the rest stay as they are.
fn tame_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            if o[0] % 8 == 7 { ip } else { IpAddr::V4(Ipv4Addr::new(198, 18, o[2] % 4, o[3])) }
        }
        IpAddr::V6(a) => {
            let s = a.segments();
            if s[0] % 8 == 7 { ip } else { IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, s[1] % 4, 0, 0, 0, 0, s[7] % 256)) }
        }
    }
}

/// Annotations (and selectors' `matchLabels`): plain maps, unlike the snapshot's [`Labels`].
type Annotations = BTreeMap<String, String>;

fn tame_map(labels: Annotations) -> Annotations {
    labels
        .into_iter()
        .map(|(mut k, mut v)| {
            pick(&mut k, LABEL_KEYS);
            pick(&mut v, LABEL_VALUES);
            (k, v)
        })
        .collect()
}

fn tame_selector(sel: &mut LabelSelector) {
    sel.match_labels = tame_map(std::mem::take(&mut sel.match_labels));
    for e in &mut sel.match_expressions {
        pick(&mut e.key, LABEL_KEYS);
        pick(&mut e.operator, OPERATORS);
        e.values.iter_mut().for_each(|v| pick(v, LABEL_VALUES));
    }
}

fn tame_port_number(n: i32) -> i32 {
    if (-1..=65536).contains(&n) { n } else { 78 + n.rem_euclid(8) }
}

fn tame_namespace(mut ns: Namespace) -> Namespace {
    pick(&mut ns.name, NAMESPACES);
    ns.labels = tame_map(ns.labels.to_map()).into();
    ns
}

fn tame_pod(mut p: Pod) -> Pod {
    pick(&mut p.namespace, NAMESPACES);
    pick(&mut p.name, POD_NAMES);
    if p.uid.len() <= 1 {
        // Replaces the base cluster's pod of that name (manifest pods have derived uids).
        p.uid = crate::model::derived_uid(&p.namespace, &p.name);
    }
    p.labels = tame_map(p.labels.to_map()).into();
    pick_opt(&mut p.node, NODES);
    p.ips = p.ips.into_iter().map(tame_ip).collect();
    for cp in &mut p.ports {
        if let Some(name) = &cp.name {
            let mut name = name.to_string();
            pick(&mut name, PORT_NAMES);
            cp.name = Some(name.into());
        }
    }
    p
}

fn tame_policy(mut np: NetworkPolicy) -> NetworkPolicy {
    pick(&mut np.namespace, NAMESPACES);
    pick_opt(&mut np.egress_domains, EGRESS_DOMAINS);
    tame_selector(&mut np.pod_selector);
    np.policy_types.iter_mut().for_each(|t| pick(t, POLICY_TYPES));
    for rule in np.ingress.iter_mut().chain(np.egress.iter_mut()) {
        for peer in &mut rule.peers {
            peer.pod_selector.iter_mut().chain(peer.namespace_selector.iter_mut()).for_each(tame_selector);
            if let Some(b) = &mut peer.ip_block {
                pick(&mut b.cidr, CIDRS);
                b.except.iter_mut().for_each(|e| pick(e, CIDRS));
            }
        }
        for port in &mut rule.ports {
            pick_opt(&mut port.protocol, PROTOCOLS);
            match &mut port.port {
                Some(PortRef::Number(n)) => *n = tame_port_number(*n),
                Some(PortRef::Name(n)) => pick(n, PORT_NAMES),
                None => {}
            }
            port.end_port = port.end_port.map(tame_port_number);
        }
    }
    np
}

fn tame_node(mut n: Node) -> Node {
    pick(&mut n.name, NODES);
    n
}

fn tame_endpoint(e: EndpointInput) -> LocalEndpoint {
    let mut pod = e.pod;
    pick(&mut pod.namespace, NAMESPACES);
    pick(&mut pod.name, POD_NAMES);
    let pod_uid = e.pod_uid.map(|u| if u.len() <= 1 { crate::model::derived_uid(&pod.namespace, &pod.name) } else { u });
    LocalEndpoint {
        interface: flock_cni::host_interface_name(&e.container_id, "eth0"),
        container_id: e.container_id,
        pod,
        pod_uid,
        addrs: e.addrs.into_iter().map(tame_ip).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_input_in_eight_is_cross_checked_and_one_in_sixteen_is_big() {
        let inputs: Vec<Vec<u8>> = (0..4000u32).map(|i| differential::seeded_bytes(u64::from(i), 64)).collect();
        let sampled = inputs.iter().filter(|d| cross_check_sampled(d)).count();
        // 500 expected; a hash that ignored its input would give 0 or 4000.
        assert!((380..=620).contains(&sampled), "{sampled} of 4000 sampled");
        let big = inputs.iter().filter(|d| big_input(d)).count();
        assert!((170..=330).contains(&big), "{big} of 4000 big");
        // Independent bits: about one in 128 is both.
        assert!(inputs.iter().filter(|d| big_input(d) && cross_check_sampled(d)).count() < 80);
        // The sampled and unsampled runs render the same.
        let d = inputs.iter().find(|d| !cross_check_sampled(d) && !pipeline(d).is_empty()).unwrap();
        assert_eq!(pipeline(d), pipeline_full(d));
    }

    #[test]
    fn manifest_writer_round_trips_hostile_strings() {
        let mut objects = base_objects(Base::Conformance);
        let mut annotations = BTreeMap::new();
        let hostile = "a\"b\\c\n\t\u{0}\u{85}\u{2028}\u{feff}\u{10ffff}} ; # $x @y";
        inject(&mut objects, &mut annotations, Slot::PodName(0), hostile.into());
        inject(&mut objects, &mut annotations, Slot::Annotation(3), hostile.into());
        let text = to_manifest(&objects, &annotations);
        let back = manifest::parse_str(Path::new("t.yaml"), &text).unwrap().objects;
        assert_eq!(back, objects);
    }

    #[test]
    fn every_base_checks_out() {
        for base in [Base::Empty, Base::Conformance, Base::Quickstart] {
            let s = base_snapshot(base);
            for node in node_names(&s) {
                let rs = render::render(&translate::translate(&s, &s.derived_endpoints(&node), &Options::default()));
                check_structure(&rs, &rs.to_text()).unwrap();
            }
        }
        assert_eq!(hostile_strings(&[]).len(), 2);
    }

    #[test]
    fn structure_check_sees_an_injected_object() {
        let s = base_snapshot(Base::Conformance);
        let rs = render::render(&translate::translate(&s, &s.derived_endpoints("node-1"), &Options::default()));
        let text = rs.to_text();
        let injected = text.replacen("\tchain forward {", "\tchain evil {\n\t}\n\tchain forward {", 1);
        assert!(check_structure(&rs, &injected).unwrap_err().contains("chains and"));
        let reworded = text.replacen("ct state invalid drop", "ct state invalid accept", 1);
        assert!(check_structure(&rs, &reworded).unwrap_err().contains("rules differ"));
    }
}
