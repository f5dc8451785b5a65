//! Target `differential`: random clusters and policies → the enforced rulesets (translate →
//! render → in-memory nft → packet tracer), compared flow by flow with the reference
//! evaluator ([`crate::reference`]), which reads the API text and shares no code with the
//! pipeline.
//!
//! A cluster is small and dense so that policies overlap: one to three labelled nodes (with
//! InternalIP and sometimes ExternalIP addresses); up to four namespaces (some without a
//! Namespace object); two to seven pods on IPv4, IPv6 or both, some terminal (reusing a live
//! pod's address), host-networked, pending or a run's pod, with named container ports whose
//! numbers differ from pod to pod; up to four NetworkPolicies and four ClusterNetworkPolicies
//! of both tiers, with tied priorities, every peer and port kind — and, now and then, a field
//! the API server would reject (a bad label value, an unknown operator, action or tier, an
//! unsupported peer) to check the fail-closed readings too.
//!
//! Flows: every ordered pair of enforced pods, each family they share, TCP/UDP/SCTP to six
//! ports; each pod to the node addresses, an external address and the addresses of pods that
//! are not peers; and from those addresses to each pod.
//!
//! The generator reads an [`Unstructured`]: fuzzer bytes, or a seeded stream
//! ([`seeded_bytes`]) for the property test in `tests/reference.rs`. Exhausted input reads as
//! zeros, which this generator maps to the plainest choices (valid fields, Running pods).

use std::collections::BTreeMap;
use std::net::IpAddr;

use arbitrary::Unstructured;

use crate::model::Family;
use crate::model::cnp::{ClusterNetworkPolicy, CnpPeer, CnpPods, CnpPort, CnpProtocol, CnpRule, CnpSubject};
use crate::model::manifest::Object;
use crate::model::{
    ContainerPort, IpBlock, LabelSelector, LabelSelectorRequirement, Labels, Namespace, NetworkPolicy, Node, ObjectRef, Pod, PodPhase,
    PolicyPeer, PolicyPort, PolicyRule, PortRef, Protocol, Snapshot,
};
use crate::reference::{self, End, Flow};
use crate::testkit::TracedCluster;

type R<T> = arbitrary::Result<T>;

const NAMESPACES: [&str; 4] = ["x", "y", "z", "w"];
/// Pod label keys; the last one has a prefix with a DNS label longer than 63 characters,
/// which a subdomain allows.
const POD_KEYS: [&str; 3] = ["app", "tier", "a123456789b123456789c123456789d123456789e123456789f123456789g1234.example.com/role"];
const NS_KEYS: [&str; 3] = ["team", "env", "kubernetes.io/metadata.name"];
const NODE_KEYS: [&str; 2] = ["role", "zone"];
const VALUES: [&str; 4] = ["a", "b", "x", "y"];
/// Flow ports and the port numbers policies and pods use.
pub const PORTS: [u16; 6] = [53, 80, 81, 443, 8080, 9090];
const PORT_NAMES: [&str; 5] = ["http", "dns", "metrics", "sctp-svc", "nobody-has-it"];
const CIDRS_V4: [&str; 9] = [
    "0.0.0.0/0",
    "198.18.0.0/15",
    "198.18.1.0/24",
    "198.18.2.0/24",
    "198.18.1.8/29",
    "198.18.2.12/30",
    "198.19.0.0/24",
    "198.19.0.2/32",
    "198.19.200.0/24",
];
const CIDRS_V6: [&str; 8] = [
    "::/0",
    "2001:db8::/32",
    "2001:db8:1::/64",
    "2001:db8:2::/64",
    "2001:db8:1::8/125",
    "2001:db8:ff::/64",
    "2001:db8:ff::2/128",
    "2001:db8:c8::/48",
];
/// Addresses outside every pod and node, inside some CIDRs above.
const EXTERNAL: [&str; 2] = ["198.19.200.9", "2001:db8:c8::9"];

/// `percent` % of the time (never on exhausted input, which reads as 0).
fn chance(u: &mut Unstructured<'_>, percent: u8) -> R<bool> {
    Ok(u.int_in_range(0..=99u8)? >= 100 - percent)
}

/// A literal of the generator's own making (always well-formed), parsed.
fn parsed<T: std::str::FromStr>(s: &str) -> R<T> {
    s.parse().map_err(|_| arbitrary::Error::IncorrectFormat)
}

fn pick<'a, T>(u: &mut Unstructured<'_>, items: &'a [T]) -> R<&'a T> {
    u.choose(items)
}

fn count(u: &mut Unstructured<'_>, min: usize, max: usize) -> R<usize> {
    u.int_in_range(min..=max)
}

/// A label selector over `keys`: mostly valid, 0–2 requirements; 4 % of the time something
/// the API server rejects.
fn selector(u: &mut Unstructured<'_>, keys: &[&str]) -> R<LabelSelector> {
    let mut sel = LabelSelector::default();
    for _ in 0..count(u, 0, 2)? {
        let key = pick(u, keys)?.to_string();
        let values = |u: &mut Unstructured<'_>| -> R<Vec<String>> {
            let n = count(u, 1, 2)?;
            (0..n).map(|_| pick(u, &VALUES).map(|v| v.to_string())).collect()
        };
        let op = u.int_in_range(0..=4u8)?;
        let expr = |operator: &str, values: Vec<String>| LabelSelectorRequirement { key: key.clone(), operator: operator.into(), values };
        match op {
            0 => {
                sel.match_labels.insert(key.clone(), pick(u, &VALUES)?.to_string());
            }
            1 => sel.match_expressions.push(expr("In", values(u)?)),
            2 => sel.match_expressions.push(expr("NotIn", values(u)?)),
            3 => sel.match_expressions.push(expr("Exists", vec![])),
            _ => sel.match_expressions.push(expr("DoesNotExist", vec![])),
        }
    }
    if chance(u, 4)? {
        match u.int_in_range(0..=2u8)? {
            0 => {
                sel.match_labels.insert("app".into(), "web-".into());
            }
            1 => sel.match_expressions.push(LabelSelectorRequirement {
                key: "app".into(),
                operator: "Matches".into(),
                values: vec!["a".into()],
            }),
            _ => sel.match_expressions.push(LabelSelectorRequirement { key: "tier".into(), operator: "In".into(), values: vec![] }),
        }
    }
    Ok(sel)
}

fn labels(u: &mut Unstructured<'_>, keys: &[&str]) -> R<Labels> {
    let mut l = Labels::new();
    for key in keys {
        if chance(u, 60)? {
            l.insert(key, pick(u, &VALUES)?);
        }
    }
    Ok(l)
}

fn cidrs(v4: bool, v6: bool) -> Vec<&'static str> {
    let mut out = Vec::new();
    if v4 {
        out.extend(CIDRS_V4);
    }
    if v6 {
        out.extend(CIDRS_V6);
    }
    out
}

/// Which families the cluster's pods have.
#[derive(Debug, Clone, Copy)]
struct Families {
    v4: bool,
    v6: bool,
}

struct Gen<'u, 'd> {
    u: &'u mut Unstructured<'d>,
    fam: Families,
}

impl Gen<'_, '_> {
    fn protocol(&mut self) -> R<Protocol> {
        Ok(*pick(self.u, &Protocol::ALL)?)
    }

    fn ipblock(&mut self) -> R<PolicyPeer> {
        let all = cidrs(self.fam.v4, self.fam.v6);
        let cidr = *pick(self.u, &all)?;
        let net: ipnet::IpNet = parsed(cidr)?;
        let mut except = Vec::new();
        if chance(self.u, 40)? {
            let inside: Vec<&str> = all
                .iter()
                .copied()
                .filter(|c| c.parse::<ipnet::IpNet>().is_ok_and(|n| net.contains(&n) && n.prefix_len() > net.prefix_len()))
                .collect();
            // Now and then an except that is not inside (invalid: the rule allows nothing).
            if !inside.is_empty() && !chance(self.u, 5)? {
                except.push(pick(self.u, &inside)?.to_string());
            } else {
                except.push(pick(self.u, &all)?.to_string());
            }
        }
        let cidr = if chance(self.u, 2)? { "198.18.0.0/33".to_string() } else { cidr.to_string() };
        Ok(PolicyPeer { ip_block: Some(IpBlock { cidr, except }), ..Default::default() })
    }

    fn np_peer(&mut self) -> R<PolicyPeer> {
        Ok(match self.u.int_in_range(0..=4u8)? {
            0 => PolicyPeer { pod_selector: Some(selector(self.u, &POD_KEYS)?), ..Default::default() },
            1 => PolicyPeer { namespace_selector: Some(selector(self.u, &NS_KEYS)?), ..Default::default() },
            2 => PolicyPeer {
                pod_selector: Some(selector(self.u, &POD_KEYS)?),
                namespace_selector: Some(selector(self.u, &NS_KEYS)?),
                ip_block: None,
            },
            3 => self.ipblock()?,
            // Rarely: no field at all (invalid).
            _ if chance(self.u, 10)? => PolicyPeer::default(),
            _ => PolicyPeer { pod_selector: Some(LabelSelector::default()), ..Default::default() },
        })
    }

    fn np_port(&mut self) -> R<PolicyPort> {
        let protocol = if chance(self.u, 70)? { Some(self.protocol()?.as_k8s().to_string()) } else { None };
        let port = *pick(self.u, &PORTS)?;
        Ok(match self.u.int_in_range(0..=4u8)? {
            0 => PolicyPort { protocol, port: Some(PortRef::Number(i32::from(port))), end_port: None },
            1 => {
                let end = *pick(self.u, &PORTS)?;
                PolicyPort { protocol, port: Some(PortRef::Number(i32::from(port))), end_port: Some(i32::from(end)) }
            }
            2 => PolicyPort { protocol, port: Some(PortRef::Name(pick(self.u, &PORT_NAMES)?.to_string())), end_port: None },
            3 => PolicyPort { protocol, port: None, end_port: None },
            _ if chance(self.u, 20)? => match self.u.int_in_range(0..=2u8)? {
                0 => PolicyPort { protocol: Some("ICMP".into()), port: Some(PortRef::Number(80)), end_port: None },
                1 => PolicyPort { protocol, port: Some(PortRef::Number(0)), end_port: None },
                _ => PolicyPort { protocol, port: None, end_port: Some(81) },
            },
            _ => PolicyPort { protocol, port: Some(PortRef::Number(i32::from(port))), end_port: None },
        })
    }

    fn np_rule(&mut self) -> R<PolicyRule> {
        let peers = (0..count(self.u, 0, 2)?).map(|_| self.np_peer()).collect::<R<_>>()?;
        let ports = (0..count(self.u, 0, 2)?).map(|_| self.np_port()).collect::<R<_>>()?;
        Ok(PolicyRule { peers, ports })
    }

    fn network_policy(&mut self, i: usize) -> R<NetworkPolicy> {
        let namespace = pick(self.u, &NAMESPACES)?.to_string();
        let pod_selector = selector(self.u, &POD_KEYS)?;
        let policy_types = match self.u.int_in_range(0..=4u8)? {
            0 | 1 => vec![],
            2 => vec!["Ingress".into()],
            3 => vec!["Egress".into()],
            _ if chance(self.u, 10)? => vec!["Sideways".into()],
            _ => vec!["Ingress".into(), "Egress".into()],
        };
        let ingress = (0..count(self.u, 0, 2)?).map(|_| self.np_rule()).collect::<R<_>>()?;
        let egress = (0..count(self.u, 0, 2)?).map(|_| self.np_rule()).collect::<R<_>>()?;
        Ok(NetworkPolicy {
            audit: false,
            namespace,
            name: format!("np{i}"),
            pod_selector,
            policy_types,
            ingress,
            egress,
            generation: None,
            egress_domains: None,
        })
    }

    fn cnp_pods(&mut self) -> R<CnpPods> {
        let namespace_selector = if chance(self.u, 60)? { Some(selector(self.u, &NS_KEYS)?) } else { None };
        Ok(CnpPods { namespace_selector, pod_selector: selector(self.u, &POD_KEYS)? })
    }

    fn cnp_peer(&mut self, egress: bool) -> R<CnpPeer> {
        let all = cidrs(self.fam.v4, self.fam.v6);
        Ok(match self.u.int_in_range(0..=4u8)? {
            0 => CnpPeer::Namespaces(selector(self.u, &NS_KEYS)?),
            1 => CnpPeer::Pods(self.cnp_pods()?),
            2 if egress || chance(self.u, 10)? => {
                let n = count(self.u, 1, 2)?;
                CnpPeer::Networks((0..n).map(|_| pick(self.u, &all).map(|c| c.to_string())).collect::<R<_>>()?)
            }
            3 if egress || chance(self.u, 10)? => CnpPeer::Nodes(selector(self.u, &NODE_KEYS)?),
            _ if chance(self.u, 8)? => {
                if chance(self.u, 50)? {
                    CnpPeer::DomainNames(vec![pick(self.u, super::DOMAIN_NAMES)?.to_string()])
                } else {
                    CnpPeer::Invalid("exactly one of namespaces, pods, networks, nodes, domainNames must be set, none is".into())
                }
            }
            _ => CnpPeer::Pods(self.cnp_pods()?),
        })
    }

    fn cnp_protocol(&mut self) -> R<CnpProtocol> {
        let port = match self.u.int_in_range(0..=2u8)? {
            0 | 1 => CnpPort::Number(i64::from(*pick(self.u, &PORTS)?)),
            _ => {
                let (a, b) = (*pick(self.u, &PORTS)?, *pick(self.u, &PORTS)?);
                // Mostly start < end; start >= end is invalid.
                let (start, end) = if a <= b && !chance(self.u, 10)? { (a, b.max(a + 1)) } else { (b, a) };
                CnpPort::Range { start: i64::from(start), end: i64::from(end) }
            }
        };
        Ok(match self.u.int_in_range(0..=4u8)? {
            0 => CnpProtocol::Tcp(port),
            1 => CnpProtocol::Udp(port),
            2 => CnpProtocol::Sctp(port),
            3 => CnpProtocol::NamedPort(pick(self.u, &PORT_NAMES)?.to_string()),
            _ if chance(self.u, 10)? => {
                CnpProtocol::Invalid("exactly one of tcp, udp, sctp, destinationNamedPort must be set, none is".into())
            }
            _ => CnpProtocol::Tcp(port),
        })
    }

    fn cnp_rule(&mut self, egress: bool) -> R<CnpRule> {
        let action = match self.u.int_in_range(0..=2u8)? {
            0 => "Accept",
            1 => "Deny",
            _ => "Pass",
        };
        let action = if chance(self.u, 3)? { "Allow" } else { action };
        let peers = (0..count(self.u, 1, 2)?).map(|_| self.cnp_peer(egress)).collect::<R<_>>()?;
        let protocols =
            if chance(self.u, 55)? { Some((0..count(self.u, 1, 2)?).map(|_| self.cnp_protocol()).collect::<R<_>>()?) } else { None };
        let name = chance(self.u, 50)?.then(|| format!("{}-{}", action.to_lowercase(), if egress { "out" } else { "in" }));
        Ok(CnpRule { name, action: action.into(), peers, protocols })
    }

    fn cluster_policy(&mut self, i: usize) -> R<ClusterNetworkPolicy> {
        let tier = if chance(self.u, 45)? { "Baseline" } else { "Admin" };
        let tier = if chance(self.u, 3)? { "Middle" } else { tier };
        // Few distinct priorities: ties are common.
        let priority = match self.u.int_in_range(0..=9u8)? {
            0..=2 => Some(0),
            3..=5 => Some(1),
            6 | 7 => Some(5),
            8 => Some(1000),
            _ if chance(self.u, 30)? => Some(1001),
            _ => Some(2),
        };
        let priority = if chance(self.u, 2)? { None } else { priority };
        let subject = match self.u.int_in_range(0..=2u8)? {
            0 => CnpSubject::Namespaces(selector(self.u, &NS_KEYS)?),
            _ if chance(self.u, 4)? => CnpSubject::Invalid("exactly one of namespaces, pods must be set, none is".into()),
            _ => CnpSubject::Pods(self.cnp_pods()?),
        };
        let ingress = (0..count(self.u, 0, 2)?).map(|_| self.cnp_rule(false)).collect::<R<_>>()?;
        let egress = (0..count(self.u, 0, 2)?).map(|_| self.cnp_rule(true)).collect::<R<_>>()?;
        Ok(ClusterNetworkPolicy {
            name: format!("cnp{i}"),
            audit: false,
            generation: None,
            uid: None,
            tier: tier.into(),
            priority,
            subject,
            ingress,
            egress,
        })
    }
}

/// A random cluster: its objects in apply order (a snapshot is [`snapshot`] of them).
pub fn generate(u: &mut Unstructured<'_>) -> R<Vec<Object>> {
    let fam = match u.int_in_range(0..=3u8)? {
        0 | 1 => Families { v4: true, v6: false },
        2 => Families { v4: false, v6: true },
        _ => Families { v4: true, v6: true },
    };
    let mut objects = Vec::new();

    let node_count = count(u, 1, 3)?;
    let mut nodes = Vec::new();
    for n in 1..=node_count {
        let mut addresses: Vec<IpAddr> = Vec::new();
        let mut pod_cidrs = Vec::new();
        if fam.v4 {
            addresses.push(parsed(&format!("198.19.0.{n}"))?);
            pod_cidrs.push(parsed(&format!("198.18.{n}.0/24"))?);
        }
        if fam.v6 {
            addresses.push(parsed(&format!("2001:db8:ff::{n}"))?);
            pod_cidrs.push(parsed(&format!("2001:db8:{n}::/64"))?);
        }
        let internal_ips = addresses.clone();
        if chance(u, 30)? {
            if fam.v4 {
                addresses.push(parsed(&format!("198.19.1.{n}"))?);
            }
            if fam.v6 {
                addresses.push(parsed(&format!("2001:db8:fe::{n}"))?);
            }
        }
        let node = Node { name: format!("node-{n}"), pod_cidrs, internal_ips, addresses, labels: labels(u, &NODE_KEYS)? };
        nodes.push(node.clone());
        objects.push(Object::Node(node));
    }

    let ns_count = count(u, 1, 4)?;
    for name in &NAMESPACES[..ns_count] {
        // Now and then a namespace whose object flock has not seen.
        if chance(u, 8)? {
            continue;
        }
        let mut l = labels(u, &NS_KEYS[..2])?;
        l.insert("kubernetes.io/metadata.name", name);
        objects.push(Object::Namespace(Namespace { name: name.to_string(), labels: l, ..Namespace::default() }));
    }

    let pod_count = count(u, 2, 7)?;
    let mut live_ips: Vec<Vec<IpAddr>> = Vec::new();
    for i in 0..pod_count {
        let node = &nodes[count(u, 0, node_count - 1)?];
        let n = node.name.trim_start_matches("node-");
        let phase = match u.int_in_range(0..=19u8)? {
            17 => PodPhase::Pending,
            18 => PodPhase::Succeeded,
            19 => PodPhase::Failed,
            _ => PodPhase::Running,
        };
        let host_network = phase == PodPhase::Running && chance(u, 5)?;
        let mut ips: Vec<IpAddr> = Vec::new();
        if host_network {
            ips = node.internal_ips.clone();
        } else if phase.is_terminal() && !live_ips.is_empty() && chance(u, 50)? {
            // A finished pod whose address a live pod now has.
            ips = live_ips[count(u, 0, live_ips.len() - 1)?].clone();
        } else {
            let host = 10 + i;
            if fam.v4 {
                ips.push(parsed(&format!("198.18.{n}.{host}"))?);
            }
            if fam.v6 {
                ips.push(parsed(&format!("2001:db8:{n}::{host:x}"))?);
            }
            if !phase.is_terminal() {
                live_ips.push(ips.clone());
            }
        }
        let mut pod_labels = labels(u, &POD_KEYS)?;
        if chance(u, 5)? {
            pod_labels.insert(crate::model::RUN_LABEL, "r1");
        }
        let mut ports = Vec::new();
        for (name, protocol, numbers) in [
            ("http", Protocol::Tcp, [80u16, 8080]),
            ("dns", Protocol::Udp, [53, 53]),
            ("metrics", Protocol::Tcp, [9090, 81]),
            ("sctp-svc", Protocol::Sctp, [80, 443]),
        ] {
            if chance(u, 50)? {
                ports.push(ContainerPort { name: Some(name.into()), port: *pick(u, &numbers)?, protocol });
            }
        }
        let namespace = NAMESPACES[count(u, 0, ns_count - 1)?].to_string();
        let name = format!("p{i}");
        objects.push(Object::Pod(Pod {
            uid: crate::model::derived_uid(&namespace, &name),
            namespace,
            name,
            labels: pod_labels,
            node: Some(node.name.clone()),
            phase,
            ips,
            host_network,
            ports,
            created: Some(i as i64),
            unpublished: false,
        }));
    }

    let mut g = Gen { u, fam };
    for i in 0..count(g.u, 0, 4)? {
        objects.push(Object::NetworkPolicy(g.network_policy(i)?));
    }
    for i in 0..count(g.u, 0, 4)? {
        objects.push(Object::ClusterNetworkPolicy(g.cluster_policy(i)?));
    }
    Ok(objects)
}

/// The snapshot of `objects` (no implicit Namespace objects: a pod's may be missing).
pub fn snapshot(objects: &[Object]) -> Snapshot {
    let mut s = Snapshot::new();
    for o in objects {
        o.apply_to(&mut s);
    }
    s
}

/// `len` bytes from a splitmix64 stream seeded with `seed`: a reproducible generator input.
pub fn seeded_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The result of one cluster's comparison.
#[derive(Debug, Default)]
pub struct Comparison {
    pub flows: usize,
    /// Each flow where the pipeline and the reference disagree, described.
    pub disagreements: Vec<String>,
    /// Each node's rendered ruleset.
    pub(crate) renders: Vec<String>,
}

/// Every flow of the cluster through the pipeline and the reference.
pub fn compare(s: &Snapshot) -> Result<Comparison, String> {
    compare_with(s, s)
}

/// Every flow of `s` through the reference and of `enforced` through the pipeline: the same
/// snapshot, except in tests that show a wrong pipeline is caught.
pub fn compare_with(s: &Snapshot, enforced: &Snapshot) -> Result<Comparison, String> {
    // Both ruleset shapes meet the reference: half the clusters (by the parity of their pod
    // count, a cheap deterministic coin) have every pod's allow rules go through peer classes.
    let shape = if enforced.pod_count().is_multiple_of(2) {
        crate::render::RenderOptions { peer_classes_from: 0, ..crate::render::RenderOptions::DEFAULT }
    } else {
        crate::render::RenderOptions::default()
    };
    let cluster = TracedCluster::build_with(enforced, &shape);
    let mut out = Comparison { renders: cluster.texts.values().cloned().collect(), ..Default::default() };
    // The pods flock enforces: those with an endpoint on some node.
    let pods: Vec<&Pod> = s.pods().filter(|p| cluster.pods.contains_key(&format!("{}/{}", p.namespace, p.name))).collect();
    // Addresses that are not a peer pod's: nodes, the outside, non-peer pods'.
    let mut addresses: Vec<IpAddr> = s.nodes().flat_map(|n| n.addresses.iter().copied()).collect();
    addresses.extend(EXTERNAL.iter().filter_map(|a| a.parse::<IpAddr>().ok()));
    addresses.extend(s.pods().flat_map(|p| p.ips.iter().copied()));
    addresses.retain(|a| !s.pods().any(|p| !p.phase.is_terminal() && !p.host_network && p.ips.contains(a)));
    addresses.sort();
    addresses.dedup();

    let key = |p: &Pod| ObjectRef::new(p.namespace.clone(), p.name.clone());
    // `flockctl explain` reads the enforced cluster's translation: it must give the
    // pipeline's verdict for every flow too.
    let mut explainer = crate::explain::Explainer::new(enforced, crate::translate::Options::default());
    let reference = reference::Evaluator::new(s);
    let mut check = |flow: Flow, pipeline: Result<bool, String>| -> Result<(), String> {
        let verdict = reference.evaluate(&flow)?;
        let pipeline = pipeline?;
        out.flows += 1;
        let end = |e: &End| match e {
            End::Pod(p) => crate::explain::End::Pod(p.clone()),
            End::Address(a) => crate::explain::End::Address(*a),
        };
        let query = crate::explain::Query {
            from: end(&flow.from),
            to: end(&flow.to),
            protocol: flow.protocol,
            port: flow.port,
            family: Some(flow.family),
        };
        let explained = explainer.explain(&query).map_err(|e| format!("{flow:?}: explain: {e}"))?;
        if (explained.verdict == crate::explain::Verdict::Allow) != pipeline {
            out.disagreements.push(format!(
                "{flow:?}: explain {}, pipeline {}:\n{}",
                explained.verdict,
                if pipeline { "allows" } else { "denies" },
                crate::explain::to_text(&explained)
            ));
        }
        if verdict.allowed != pipeline {
            out.disagreements.push(format!(
                "{flow:?}: reference {} (egress {:?}, ingress {:?}), pipeline {}",
                if verdict.allowed { "allows" } else { "denies" },
                verdict.egress,
                verdict.ingress,
                if pipeline { "allows" } else { "denies" },
            ));
        }
        Ok(())
    };
    for from in &pods {
        for to in &pods {
            if from.uid == to.uid {
                continue;
            }
            for family in [Family::V4, Family::V6] {
                let has = |p: &Pod| p.ips.iter().any(|ip| Family::of(*ip) == family);
                if !has(from) || !has(to) {
                    continue;
                }
                for protocol in Protocol::ALL {
                    for port in PORTS {
                        let flow = Flow { from: End::Pod(key(from)), to: End::Pod(key(to)), protocol, port, family };
                        let (f, t) = (format!("{}/{}", from.namespace, from.name), format!("{}/{}", to.namespace, to.name));
                        check(flow, cluster.connected(&f, &t, protocol, port, Some(family)))?;
                    }
                }
            }
        }
        let name = format!("{}/{}", from.namespace, from.name);
        for addr in &addresses {
            if !from.ips.iter().any(|ip| ip.is_ipv4() == addr.is_ipv4()) {
                continue;
            }
            let family = Family::of(*addr);
            for protocol in Protocol::ALL {
                for port in PORTS {
                    let out_flow = Flow { from: End::Pod(key(from)), to: End::Address(*addr), protocol, port, family };
                    check(out_flow, cluster.reaches_address(&name, *addr, protocol, port))?;
                    let in_flow = Flow { from: End::Address(*addr), to: End::Pod(key(from)), protocol, port, family };
                    check(in_flow, cluster.reached_from_address(*addr, &name, protocol, port))?;
                }
            }
        }
    }
    Ok(out)
}

/// The fuzz target: a cluster from `data`, compared flow by flow; panics on a disagreement
/// (with the cluster as a manifest to reproduce it). Returns the renders.
#[allow(clippy::panic)]
pub fn differential(data: &[u8]) -> Vec<String> {
    let mut u = Unstructured::new(data);
    let Ok(objects) = generate(&mut u) else { return Vec::new() };
    let s = snapshot(&objects);
    match compare(&s) {
        Ok(c) if c.disagreements.is_empty() => c.renders,
        Ok(c) => panic!(
            "{} of {} flows disagree; the first:\n{}\ncluster:\n{}",
            c.disagreements.len(),
            c.flows,
            c.disagreements[0],
            super::to_manifest(&objects, &BTreeMap::new())
        ),
        Err(e) => panic!("cannot compare: {e}\ncluster:\n{}", super::to_manifest(&objects, &BTreeMap::new())),
    }
}
