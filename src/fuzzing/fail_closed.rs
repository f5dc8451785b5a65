//! Target `fail_closed`: a policy flock cannot fully understand never opens anything.
//!
//! The input is a set of valid NetworkPolicies P and one more, Q, made from a valid policy
//! by one corruption the API server would reject (an invalid podSelector, peer, ipBlock,
//! port, protocol or policyType), on the conformance base cluster. The generator knows what
//! it broke, so it knows — without asking the translator — which part of Q is still valid:
//! Q′ (none of Q for a broken podSelector; Q without the broken rule for a broken peer or
//! port; all of Q's rules, both directions, for an unknown policyType). It also knows which
//! pods Q would select (every pod of Q's namespace when the podSelector is broken) and in
//! which directions.
//!
//! Through the whole pipeline (translate → render → in-memory nft → packet tracer), per pod,
//! direction and flow (every other pod and two non-pod addresses; TCP, UDP, SCTP; ports
//! 79–82), it checks:
//! - (a) a flow allowed with P+Q is allowed with P alone, or admitted by Q′ (Q′ selects the
//!   pod in that direction and its rules allow the flow);
//! - (b) every pod Q would select is isolated by Q in Q's directions (the translator names Q
//!   among the pod's isolating policies) and, there, what P+Q allows is what P's rules admit
//!   or Q′'s rules admit — nothing by default.
//!
//! Ignoring Q fails (b); keeping a broken Q's rules with a widened selector fails (a). The
//! tests in `tests/fail_closed.rs` show both against the check itself ([`Verdicts::check`]).
//!
//! Selector matching of the *valid* selectors here is a naive re-implementation
//! ([`naive_matches`]), sharing no code with the translator's.

use std::collections::BTreeMap;
use std::net::IpAddr;

use arbitrary::{Arbitrary, Unstructured};

use crate::apply::Applier;
use crate::apply::fake::FakeNft;
use crate::model::{
    IpBlock, LabelSelector, LabelSelectorRequirement, Labels, NetworkPolicy, ObjectRef, PolicyPeer, PolicyPort, PolicyRule, PortRef,
    Protocol, Snapshot,
};
use crate::nft::trace::{Ct, L4, Packet, Tracer, Verdict};
use crate::translate::{self, Direction, Isolation, NodePolicy};

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const KEYS: [&str; 3] = ["pod", "ns", "app"];
const VALUES: [&str; 5] = ["a", "b", "c", "x", "y"];
/// ipBlock CIDRs: everything, the pod ranges of the base cluster, a few pods, and ranges
/// without pods.
const CIDRS: [&str; 9] = [
    "0.0.0.0/0",
    "198.18.0.0/15",
    "198.18.1.0/24",
    "198.18.2.0/24",
    "198.18.1.0/28",
    "198.18.2.16/28",
    "198.18.1.11/32",
    "198.18.2.23/32",
    "198.19.255.0/24",
];
/// Named ports: three the base pods declare, one nobody does.
const PORT_NAMES: [&str; 4] = ["serve-80-tcp", "serve-81-udp", "serve-80-sctp", "serve-82-tcp"];
const PORTS: [u16; 4] = [79, 80, 81, 82];
/// Flow peers that are not pods: one inside an ipBlock of [`CIDRS`] only, one in the pod range.
const EXTERNAL: [&str; 2] = ["198.19.255.7", "198.18.200.9"];
/// The name of the policy under test.
pub(crate) const Q_NAME: &str = "q-corrupted";

/// One selector requirement; indexes pick from the pools.
#[derive(Debug, Clone, Arbitrary)]
pub enum GenReq {
    Label(u8, u8),
    In(u8, Vec<u8>),
    NotIn(u8, Vec<u8>),
    Exists(u8),
    DoesNotExist(u8),
}

/// A valid label selector (at most two requirements).
#[derive(Debug, Clone, Arbitrary)]
pub struct GenSelector(pub Vec<GenReq>);

/// A valid peer.
#[derive(Debug, Clone, Arbitrary)]
pub enum GenPeer {
    Pods(GenSelector),
    Namespaces(GenSelector),
    Both(GenSelector, GenSelector),
    Block(u8, Vec<u8>),
}

/// A valid port entry.
#[derive(Debug, Clone, Arbitrary)]
pub enum GenPort {
    Number(u8, u8),
    /// Protocol omitted (TCP).
    DefaultProtocol(u8),
    Range(u8, u8, u8),
    Named(u8, u8),
    AllOf(u8),
}

#[derive(Debug, Clone, Arbitrary)]
pub struct GenRule {
    pub peers: Vec<GenPeer>,
    pub ports: Vec<GenPort>,
}

/// A valid NetworkPolicy. `types`: 0 defaulted, 1 Ingress, 2 Egress, 3 both.
#[derive(Debug, Clone, Arbitrary)]
pub struct GenPolicy {
    pub namespace: u8,
    pub selector: GenSelector,
    pub types: u8,
    pub ingress: Vec<GenRule>,
    pub egress: Vec<GenRule>,
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum SelectorCorruption {
    /// `matchLabels: {pod: "web-"}` (a value may not end with `-`).
    BadValue,
    UnknownOperator,
    InWithoutValues,
    ExistsWithValues,
    BadKey,
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum PeerCorruption {
    Empty,
    BlockAndPods,
    CidrWithoutPrefix,
    ExceptOutside,
    Ipv4MappedCidr,
    Ipv4MappedExcept,
    BadNamespaceSelector,
    BadPodSelector,
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum PortCorruption {
    LowercaseProtocol,
    UnknownProtocol,
    Zero,
    TooLarge,
    EndBeforeStart,
    EndWithName,
    EndWithoutPort,
    BadName,
}

/// What is broken in Q.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Corruption {
    PodSelector(SelectorCorruption),
    Peer { egress: bool, rule: u8, peer: u8, kind: PeerCorruption },
    Port { egress: bool, rule: u8, port: u8, kind: PortCorruption },
    PolicyType,
}

/// The target's input.
#[derive(Debug, Clone, Arbitrary)]
pub struct FailClosedInput {
    pub valid: Vec<GenPolicy>,
    pub corrupted: GenPolicy,
    pub corruption: Corruption,
}

/// Q as written, and what the generator knows about it.
#[derive(Debug, Clone)]
pub struct Corrupted {
    pub q: NetworkPolicy,
    /// Q's valid part (`None`: nothing of Q is valid).
    pub(crate) valid_part: Option<NetworkPolicy>,
    /// The pods Q would select (`namespace/name`).
    pub would_select: Vec<String>,
    pub(crate) ingress: bool,
    pub(crate) egress: bool,
}

fn at<T: Copy>(pool: &[T], i: u8) -> T {
    pool[usize::from(i) % pool.len()]
}

fn proto(i: u8) -> Protocol {
    at(&Protocol::ALL, i)
}

fn proto_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "TCP",
        Protocol::Udp => "UDP",
        Protocol::Sctp => "SCTP",
    }
}

impl GenSelector {
    fn build(&self) -> LabelSelector {
        let mut sel = LabelSelector::default();
        for r in self.0.iter().take(2) {
            let values = |vs: &Vec<u8>| -> Vec<String> {
                let mut out: Vec<String> = vs.iter().take(3).map(|v| at(&VALUES, *v).to_string()).collect();
                if out.is_empty() {
                    out.push(VALUES[0].to_string());
                }
                out
            };
            let expr = |key: u8, operator: &str, values: Vec<String>| LabelSelectorRequirement {
                key: at(&KEYS, key).to_string(),
                operator: operator.to_string(),
                values,
            };
            match r {
                GenReq::Label(k, v) => {
                    sel.match_labels.insert(at(&KEYS, *k).to_string(), at(&VALUES, *v).to_string());
                }
                GenReq::In(k, vs) => sel.match_expressions.push(expr(*k, "In", values(vs))),
                GenReq::NotIn(k, vs) => sel.match_expressions.push(expr(*k, "NotIn", values(vs))),
                GenReq::Exists(k) => sel.match_expressions.push(expr(*k, "Exists", vec![])),
                GenReq::DoesNotExist(k) => sel.match_expressions.push(expr(*k, "DoesNotExist", vec![])),
            }
        }
        sel
    }
}

fn cidr_contains_strictly(outer: &str, inner: &str) -> bool {
    match (outer.parse::<ipnet::IpNet>(), inner.parse::<ipnet::IpNet>()) {
        (Ok(o), Ok(i)) => o.contains(&i) && i.prefix_len() > o.prefix_len(),
        _ => false,
    }
}

impl GenPeer {
    fn build(&self) -> PolicyPeer {
        match self {
            GenPeer::Pods(s) => PolicyPeer { pod_selector: Some(s.build()), ..Default::default() },
            GenPeer::Namespaces(s) => PolicyPeer { namespace_selector: Some(s.build()), ..Default::default() },
            GenPeer::Both(p, n) => PolicyPeer { pod_selector: Some(p.build()), namespace_selector: Some(n.build()), ..Default::default() },
            GenPeer::Block(c, excepts) => {
                let cidr = at(&CIDRS, *c);
                let inside: Vec<&str> = CIDRS.iter().copied().filter(|e| cidr_contains_strictly(cidr, e)).collect();
                let mut except: Vec<String> =
                    if inside.is_empty() { vec![] } else { excepts.iter().take(2).map(|e| at(&inside, *e).to_string()).collect() };
                except.dedup();
                PolicyPeer { ip_block: Some(IpBlock { cidr: cidr.to_string(), except }), ..Default::default() }
            }
        }
    }
}

impl GenPort {
    fn build(&self) -> PolicyPort {
        let number = |p: u8| Some(PortRef::Number(i32::from(at(&PORTS, p))));
        match *self {
            GenPort::Number(pr, p) => PolicyPort { protocol: Some(proto_name(proto(pr)).into()), port: number(p), end_port: None },
            GenPort::DefaultProtocol(p) => PolicyPort { protocol: None, port: number(p), end_port: None },
            GenPort::Range(pr, start, len) => {
                let s = at(&PORTS, start);
                let e = s.saturating_add(u16::from(len % 3));
                PolicyPort { protocol: Some(proto_name(proto(pr)).into()), port: number(start), end_port: Some(i32::from(e)) }
            }
            GenPort::Named(pr, n) => PolicyPort {
                protocol: Some(proto_name(proto(pr)).into()),
                port: Some(PortRef::Name(at(&PORT_NAMES, n).into())),
                end_port: None,
            },
            GenPort::AllOf(pr) => PolicyPort { protocol: Some(proto_name(proto(pr)).into()), port: None, end_port: None },
        }
    }
}

impl GenRule {
    fn build(&self) -> PolicyRule {
        PolicyRule {
            peers: self.peers.iter().take(2).map(GenPeer::build).collect(),
            ports: self.ports.iter().take(2).map(GenPort::build).collect(),
        }
    }
}

impl GenPolicy {
    /// The valid policy `name`.
    pub(crate) fn build(&self, name: &str) -> NetworkPolicy {
        NetworkPolicy {
            audit: false,
            namespace: at(&NAMESPACES, self.namespace).to_string(),
            name: name.to_string(),
            pod_selector: self.selector.build(),
            policy_types: match self.types % 4 {
                0 => vec![],
                1 => vec!["Ingress".into()],
                2 => vec!["Egress".into()],
                _ => vec!["Ingress".into(), "Egress".into()],
            },
            ingress: self.ingress.iter().take(3).map(GenRule::build).collect(),
            egress: self.egress.iter().take(3).map(GenRule::build).collect(),
            generation: None,
            egress_domains: None,
        }
    }
}

/// The directions a *written* policy isolates, by the API's defaulting (policyTypes empty:
/// Ingress, and Egress iff it has egress rules).
fn written_directions(p: &NetworkPolicy) -> (bool, bool) {
    if p.policy_types.is_empty() {
        return (true, !p.egress.is_empty());
    }
    (p.policy_types.iter().any(|t| t == "Ingress"), p.policy_types.iter().any(|t| t == "Egress"))
}

fn explicit_types(ingress: bool, egress: bool) -> Vec<String> {
    let mut t = Vec::new();
    if ingress {
        t.push("Ingress".to_string());
    }
    if egress {
        t.push("Egress".to_string());
    }
    t
}

fn bad_selector(kind: SelectorCorruption) -> LabelSelector {
    let expr = |operator: &str, values: &[&str]| LabelSelectorRequirement {
        key: "pod".into(),
        operator: operator.into(),
        values: values.iter().map(|v| v.to_string()).collect(),
    };
    let mut sel = LabelSelector::default();
    match kind {
        SelectorCorruption::BadValue => {
            sel.match_labels.insert("pod".into(), "web-".into());
        }
        SelectorCorruption::UnknownOperator => sel.match_expressions.push(expr("Like", &["a"])),
        SelectorCorruption::InWithoutValues => sel.match_expressions.push(expr("In", &[])),
        SelectorCorruption::ExistsWithValues => sel.match_expressions.push(expr("Exists", &["a"])),
        SelectorCorruption::BadKey => {
            sel.match_labels.insert("-bad".into(), "a".into());
        }
    }
    sel
}

fn bad_peer(kind: PeerCorruption) -> PolicyPeer {
    let block = |cidr: &str, except: &[&str]| Some(IpBlock { cidr: cidr.into(), except: except.iter().map(|s| s.to_string()).collect() });
    match kind {
        PeerCorruption::Empty => PolicyPeer::default(),
        PeerCorruption::BlockAndPods => {
            PolicyPeer { pod_selector: Some(LabelSelector::default()), ip_block: block("198.18.0.0/15", &[]), ..Default::default() }
        }
        PeerCorruption::CidrWithoutPrefix => PolicyPeer { ip_block: block("198.18.0.0", &[]), ..Default::default() },
        PeerCorruption::ExceptOutside => PolicyPeer { ip_block: block("198.18.1.0/24", &["198.18.2.0/24"]), ..Default::default() },
        PeerCorruption::Ipv4MappedCidr => PolicyPeer { ip_block: block("::ffff:198.18.0.0/112", &[]), ..Default::default() },
        PeerCorruption::Ipv4MappedExcept => PolicyPeer { ip_block: block("0.0.0.0/0", &["::ffff:198.18.1.0/120"]), ..Default::default() },
        PeerCorruption::BadNamespaceSelector => {
            PolicyPeer { namespace_selector: Some(bad_selector(SelectorCorruption::UnknownOperator)), ..Default::default() }
        }
        PeerCorruption::BadPodSelector => {
            PolicyPeer { pod_selector: Some(bad_selector(SelectorCorruption::BadValue)), ..Default::default() }
        }
    }
}

fn bad_port(kind: PortCorruption) -> PolicyPort {
    let n = |v: i32| Some(PortRef::Number(v));
    let port = |protocol: Option<&str>, port: Option<PortRef>, end_port: Option<i32>| PolicyPort {
        protocol: protocol.map(str::to_string),
        port,
        end_port,
    };
    match kind {
        PortCorruption::LowercaseProtocol => port(Some("tcp"), n(80), None),
        PortCorruption::UnknownProtocol => port(Some("QUIC"), n(80), None),
        PortCorruption::Zero => port(None, n(0), None),
        PortCorruption::TooLarge => port(None, n(70000), None),
        PortCorruption::EndBeforeStart => port(None, n(81), Some(80)),
        PortCorruption::EndWithName => port(None, Some(PortRef::Name("serve-80-tcp".into())), Some(90)),
        PortCorruption::EndWithoutPort => port(Some("UDP"), None, Some(90)),
        PortCorruption::BadName => port(None, Some(PortRef::Name("HTTP".into())), None),
    }
}

/// Breaks rule `rule` (modulo their number; a new one when there is none) of `q`'s ingress or
/// egress with `f`; the index of the broken rule.
fn break_rule(q: &mut NetworkPolicy, egress: bool, rule: u8, f: impl FnOnce(&mut PolicyRule)) -> usize {
    let rules = if egress { &mut q.egress } else { &mut q.ingress };
    if rules.is_empty() {
        rules.push(PolicyRule::default());
    }
    let r = usize::from(rule) % rules.len();
    f(&mut rules[r]);
    r
}

/// Puts `bad` in `list` in place of entry `at` (modulo its length), or as its only entry.
fn put<T>(list: &mut Vec<T>, at: u8, bad: T) {
    if list.is_empty() {
        list.push(bad);
    } else {
        let i = usize::from(at) % list.len();
        list[i] = bad;
    }
}

/// The naive matcher for the generator's valid selectors.
pub(crate) fn naive_matches(sel: &LabelSelector, labels: &Labels) -> bool {
    sel.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v.as_str()))
        && sel.match_expressions.iter().all(|e| {
            let v = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => v.is_some_and(|v| e.values.iter().any(|x| x == v)),
                "NotIn" => v.is_none_or(|v| !e.values.iter().any(|x| x == v)),
                "Exists" => v.is_some(),
                "DoesNotExist" => v.is_none(),
                _ => false,
            }
        })
}

impl FailClosedInput {
    /// P, as policies `p0`, `p1`, … (at most four).
    pub fn valid_policies(&self) -> Vec<NetworkPolicy> {
        self.valid.iter().take(4).enumerate().map(|(i, g)| g.build(&format!("p{i}"))).collect()
    }

    /// Q and what is known about it, on `snapshot` (for the pods Q would select).
    pub fn corrupted(&self, snapshot: &Snapshot) -> Corrupted {
        let q0 = self.corrupted.build(Q_NAME);
        let mut q = q0.clone();
        let pods_matching = |sel: Option<&LabelSelector>| -> Vec<String> {
            let mut pods: Vec<String> = snapshot
                .pods_in(&q0.namespace)
                .filter(|p| sel.is_none_or(|s| naive_matches(s, &p.labels)))
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .collect();
            pods.sort();
            pods
        };
        match self.corruption {
            Corruption::PodSelector(kind) => {
                q.pod_selector = bad_selector(kind);
                let (ingress, egress) = written_directions(&q);
                Corrupted { q, valid_part: None, would_select: pods_matching(None), ingress, egress }
            }
            Corruption::Peer { egress, rule, peer, kind } => {
                let r = break_rule(&mut q, egress, rule, |r| put(&mut r.peers, peer, bad_peer(kind)));
                Self::without_rule(q, egress, r, pods_matching(Some(&q0.pod_selector)))
            }
            Corruption::Port { egress, rule, port, kind } => {
                let r = break_rule(&mut q, egress, rule, |r| put(&mut r.ports, port, bad_port(kind)));
                Self::without_rule(q, egress, r, pods_matching(Some(&q0.pod_selector)))
            }
            Corruption::PolicyType => {
                let (i, e) = written_directions(&q0);
                q.policy_types = explicit_types(i, e);
                q.policy_types.push("Sideways".into());
                let mut valid = q0.clone();
                valid.policy_types = explicit_types(true, true);
                Corrupted { q, valid_part: Some(valid), would_select: pods_matching(Some(&q0.pod_selector)), ingress: true, egress: true }
            }
        }
    }

    fn without_rule(q: NetworkPolicy, egress: bool, rule: usize, would_select: Vec<String>) -> Corrupted {
        let (i, e) = written_directions(&q);
        let mut valid = q.clone();
        valid.policy_types = explicit_types(i, e);
        if egress {
            valid.egress.remove(rule);
        } else {
            valid.ingress.remove(rule);
        }
        Corrupted { q, valid_part: Some(valid), would_select, ingress: i, egress: e }
    }
}

/// One snapshot through the whole pure pipeline, every node: what the translator decided and
/// the in-memory nft tables the tracer reads.
pub struct Enforced {
    /// Each node's translation and its table, compiled for tracing.
    pub(crate) nodes: BTreeMap<String, (NodePolicy, Tracer)>,
    /// Pod (`namespace/name`) → (node, interface, addresses).
    pub(crate) pods: BTreeMap<String, (String, String, Vec<IpAddr>)>,
    /// The rendered texts (for `nft -c` in the corpus replay).
    pub(crate) texts: Vec<String>,
}

impl Enforced {
    #[allow(clippy::panic)]
    pub fn build(snapshot: &Snapshot) -> Self {
        let mut names: Vec<String> = snapshot.nodes().map(|n| n.name.clone()).collect();
        names.sort();
        let mut nodes = BTreeMap::new();
        let mut pods = BTreeMap::new();
        let mut texts = Vec::new();
        for node in names {
            let eps = snapshot.derived_endpoints(&node);
            let np = translate::translate(snapshot, &eps, &translate::Options::default());
            let rs = crate::render::render(&np);
            let mut applier = Applier::new(FakeNft::new());
            if let Err(e) = applier.apply(&rs) {
                panic!("node {node}: the in-memory nft refused the ruleset: {e}");
            }
            let Some(table) = applier.backend().table().cloned() else { panic!("node {node}: no table after apply") };
            for ep in &eps {
                pods.insert(ep.pod.to_string(), (node.clone(), ep.interface.clone(), ep.addrs.clone()));
            }
            texts.push(rs.to_text());
            nodes.insert(node, (np, Tracer::new(&table)));
        }
        Self { nodes, pods, texts }
    }

    /// How the policies isolate `pod` in `dir` (empty: not isolated).
    pub(crate) fn isolated_by(&self, pod: &str, dir: Direction) -> Vec<Isolation> {
        let Some((node, _, _)) = self.pods.get(pod) else { return Vec::new() };
        let Some((np, _)) = self.nodes.get(node) else { return Vec::new() };
        np.endpoints
            .iter()
            .find(|e| e.pod.to_string() == pod)
            .map(|e| match dir {
                Direction::Ingress => e.ingress.isolated_by.clone(),
                Direction::Egress => e.egress.isolated_by.clone(),
            })
            .unwrap_or_default()
    }

    /// Whether `pod`'s own ruleset lets a new flow through in `dir`: egress from `pod` to
    /// `peer`, or ingress to `pod` from `peer`. The other end is placed off the node, so only
    /// `pod`'s direction is judged.
    #[allow(clippy::panic)]
    pub(crate) fn allows(&self, pod: &str, dir: Direction, peer: IpAddr, protocol: Protocol, port: u16) -> bool {
        let Some((node, iface, addrs)) = self.pods.get(pod) else { panic!("no pod {pod}") };
        let Some(own) = addrs.iter().copied().find(|a| a.is_ipv4() == peer.is_ipv4()) else { return false };
        let l4 = match protocol {
            Protocol::Tcp => L4::Tcp,
            Protocol::Udp => L4::Udp,
            Protocol::Sctp => L4::Sctp,
        };
        let uplink = crate::testkit::UPLINK.to_string();
        let pkt = match dir {
            Direction::Egress => Packet { iif: iface.clone(), oif: uplink, src: own, dst: peer, l4, dport: port, ct: Ct::New },
            Direction::Ingress => Packet { iif: uplink, oif: iface.clone(), src: peer, dst: own, l4, dport: port, ct: Ct::New },
        };
        match self.nodes[node].1.trace(crate::render::BASE_CHAIN, &pkt) {
            Ok(t) => t.verdict == Verdict::Accept,
            Err(e) => panic!("node {node}: {e}"),
        }
    }
}

/// The three enforcements the property compares.
pub struct Verdicts {
    /// P and Q.
    pub with_q: Enforced,
    /// P alone.
    pub without_q: Enforced,
    /// Q's valid part alone (`None`: nothing of Q is valid).
    pub valid_part: Option<Enforced>,
}

/// A violation of the property, readable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

impl Verdicts {
    /// Builds the three from the base snapshot, P and Q.
    pub fn build(base: &Snapshot, p: &[NetworkPolicy], q: &Corrupted) -> Self {
        let mut without = base.clone();
        for pol in p {
            without.upsert_policy(pol.clone());
        }
        let mut with = without.clone();
        with.upsert_policy(q.q.clone());
        let valid_part = q.valid_part.as_ref().map(|v| {
            let mut s = base.clone();
            s.upsert_policy(v.clone());
            Enforced::build(&s)
        });
        Self { with_q: Enforced::build(&with), without_q: Enforced::build(&without), valid_part }
    }

    /// Whether Q′ admits the flow: it selects `pod` in `dir` and its rules allow it.
    fn valid_part_admits(&self, pod: &str, dir: Direction, peer: IpAddr, protocol: Protocol, port: u16) -> bool {
        self.valid_part.as_ref().is_some_and(|e| !e.isolated_by(pod, dir).is_empty() && e.allows(pod, dir, peer, protocol, port))
    }

    /// The property (see the module doc); the first violation.
    pub fn check(&self, q: &Corrupted) -> Result<(), Violation> {
        let q_key = ObjectRef::new(q.q.namespace.clone(), q.q.name.clone());
        let mut peers: Vec<IpAddr> = EXTERNAL.iter().filter_map(|a| a.parse().ok()).collect();
        for (_, _, addrs) in self.with_q.pods.values() {
            peers.extend(addrs.iter().copied());
        }
        for pod in self.with_q.pods.keys() {
            for dir in [Direction::Ingress, Direction::Egress] {
                let q_dir = match dir {
                    Direction::Ingress => q.ingress,
                    Direction::Egress => q.egress,
                };
                let selected = q_dir && q.would_select.iter().any(|p| p == pod);
                if selected && !self.with_q.isolated_by(pod, dir).contains(&Isolation::Policy(q_key.clone())) {
                    return Err(Violation(format!("(b) {pod} {dir}: not isolated by {q_key}")));
                }
                let p_isolates = !self.without_q.isolated_by(pod, dir).is_empty();
                for &peer in &peers {
                    if self.with_q.pods.get(pod).is_some_and(|(_, _, a)| a.contains(&peer)) {
                        continue;
                    }
                    for protocol in Protocol::ALL {
                        for port in PORTS {
                            if !self.with_q.allows(pod, dir, peer, protocol, port) {
                                continue;
                            }
                            let by_p = self.without_q.allows(pod, dir, peer, protocol, port);
                            let by_q = self.valid_part_admits(pod, dir, peer, protocol, port);
                            let flow = format!("{pod} {dir} {peer} {protocol:?}/{port}");
                            // (b) where Q isolates: only rules admit; (a) elsewhere: P or Q′.
                            let admitted = if selected { (p_isolates && by_p) || by_q } else { by_p || by_q };
                            if selected && !admitted {
                                return Err(Violation(format!("(b) {flow}: allowed, but no rule of P or of Q's valid part admits it")));
                            }
                            if !admitted {
                                return Err(Violation(format!(
                                    "(a) {flow}: allowed with Q, not with P, and Q's valid part does not admit it"
                                )));
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// The base cluster of every input (built once).
pub fn base() -> &'static Snapshot {
    static BASE: std::sync::OnceLock<Snapshot> = std::sync::OnceLock::new();
    BASE.get_or_init(crate::testkit::base_cluster)
}

/// Target `fail_closed`: see the module doc. Panics on a violation.
#[allow(clippy::panic)]
pub fn fail_closed(data: &[u8]) -> Vec<String> {
    let Ok(input) = FailClosedInput::arbitrary_take_rest(Unstructured::new(data)) else { return Vec::new() };
    let base = base();
    let p = input.valid_policies();
    let q = input.corrupted(base);
    let verdicts = Verdicts::build(base, &p, &q);
    if let Err(v) = verdicts.check(&q) {
        panic!("fail-closed property violated: {}\nQ = {:#?}\nP = {:#?}", v.0, q.q, p);
    }
    verdicts.with_q.texts
}
