//! Test support shared by unit tests, integration tests, benchmarks and fuzz targets: the
//! upstream NetworkPolicy e2e model as a snapshot, manifest helpers, and readable summaries
//! of the translator's output.
//!
//! Test conventions (like kube-proxy's proxier tests): the base cluster of
//! `tests/conformance/base-cluster.yaml` — namespaces x, y, z; pods a, b, c in each; node-1
//! (198.18.1.0/24) and node-2 (198.18.2.0/24); every pod serving 80 and 81 on TCP, UDP and
//! SCTP with ports named `serve-<port>-<proto>`.

pub mod cases;
pub mod kernel;

use std::path::Path;

use crate::model::manifest::{self, Manifests, Object};
use crate::model::{NetworkPolicy, ObjectRef, Snapshot};
use crate::translate::{Direction, NodePolicy, PeerMatch, PortMatch, PortRanges};

/// The conformance base cluster's manifest text.
pub const BASE_CLUSTER_YAML: &str = include_str!("../../tests/conformance/base-cluster.yaml");

/// The nine pods of the base cluster, in the conformance matrix order.
pub const BASE_PODS: [&str; 9] = ["x/a", "x/b", "x/c", "y/a", "y/b", "y/c", "z/a", "z/b", "z/c"];

/// Parses manifest text, panicking with the error (test input is trusted).
#[allow(clippy::panic)]
pub fn parse_manifests(text: &str) -> Manifests {
    match manifest::parse_str(Path::new("<test>"), text) {
        Ok(m) => m,
        Err(e) => panic!("bad test manifest: {e}"),
    }
}

/// A ClusterNetworkPolicy `by-name` (Admin, priority 10) for the pods of namespace `ns` of
/// the base cluster: egress to `names` on TCP `port` accepted (rule `example`), all other
/// IPv4 egress denied.
pub fn domain_policy(ns: &str, names: &[&str], port: u16) -> String {
    let names: Vec<String> = names.iter().map(|n| format!("'{n}'")).collect();
    format!(
        "apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {{name: by-name}}
spec:
  tier: Admin
  priority: 10
  subject: {{namespaces: {{matchLabels: {{ns: {ns}}}}}}}
  egress:
    - {{name: example, action: Accept, to: [{{domainNames: [{}]}}], protocols: [{{tcp: {{destinationPort: {{number: {port}}}}}}}]}}
    - {{action: Deny, to: [{{networks: [0.0.0.0/0]}}]}}
",
        names.join(", ")
    )
}

/// The base cluster with `yaml`'s objects applied.
pub fn base_cluster_with(yaml: &str) -> Snapshot {
    let mut s = base_cluster();
    for o in parse_manifests(yaml).objects {
        o.apply_to(&mut s);
    }
    s
}

/// The base cluster as a snapshot.
pub fn base_cluster() -> Snapshot {
    parse_manifests(BASE_CLUSTER_YAML).to_snapshot()
}

/// NetworkPolicies from YAML text (one or more documents).
#[allow(clippy::panic)]
pub fn policies(text: &str) -> Vec<NetworkPolicy> {
    parse_manifests(text)
        .objects
        .into_iter()
        .map(|o| match o {
            Object::NetworkPolicy(p) => p,
            other => panic!("expected only NetworkPolicies, got {:?}", other.kind()),
        })
        .collect()
}

/// `"x/a"` → `ObjectRef`.
pub fn pod_ref(s: &str) -> ObjectRef {
    let (ns, name) = s.split_once('/').unwrap_or(("default", s));
    ObjectRef::new(ns, name)
}

/// A one-line summary of what `pod` allows in `dir`, for table-driven assertions:
/// `open`, or `isolated: ` followed by the rules, `;`-separated, each as
/// `<peers> <ports>`. Peers are `*` (any), the sorted pod names of a pod set, the prefixes of
/// an ipBlock, or `<pod>:<proto>/<port>` entries of a named-port set (which carries its own
/// ports, so none follow). Ports are `*` (any
/// protocol) or `TCP:80-81`, `UDP:*`.
pub fn summary(np: &NodePolicy, pod: &str, dir: Direction) -> String {
    let key = pod_ref(pod);
    let Some(ep) = np.endpoints.iter().find(|e| e.pod == key) else {
        return format!("no endpoint for {pod}");
    };
    let d = ep.direction(dir);
    if !d.is_isolated() {
        return "open".into();
    }
    let rules: Vec<String> = d
        .rules
        .iter()
        .map(|r| {
            let peers = match &r.peer {
                PeerMatch::Any => "*".to_string(),
                PeerMatch::Addresses(def) => {
                    let set = &np.peer_sets[def];
                    let mut names: Vec<String> = if matches!(def, crate::translate::PeerDef::Block(_)) {
                        set.v4.keys().map(ToString::to_string).chain(set.v6.keys().map(ToString::to_string)).collect()
                    } else {
                        set.v4.values().chain(set.v6.values()).cloned().collect()
                    };
                    names.sort();
                    names.dedup();
                    format!("[{}]", names.join(","))
                }
                PeerMatch::Domains(def) => format!("[{def}]"),
                PeerMatch::NamedPort(def) => {
                    let set = &np.port_sets[def];
                    let mut names: Vec<String> = set
                        .v4
                        .iter()
                        .map(|((_, p, n), c)| format!("{c}:{}/{n}", p.as_nft()))
                        .chain(set.v6.iter().map(|((_, p, n), c)| format!("{c}:{}/{n}", p.as_nft())))
                        .collect();
                    names.sort();
                    names.dedup();
                    format!("[{}]", names.join(","))
                }
            };
            let ports = match &r.ports {
                PortMatch::Any => "*".to_string(),
                PortMatch::Protocol(p, PortRanges::All) => format!("{p}:*"),
                PortMatch::Protocol(p, PortRanges::Ranges(rs)) => {
                    let rs: Vec<String> = rs.iter().map(|(s, e)| if s == e { s.to_string() } else { format!("{s}-{e}") }).collect();
                    format!("{p}:{}", rs.join(","))
                }
            };
            if matches!(r.peer, PeerMatch::NamedPort(_)) { peers } else { format!("{peers} {ports}") }
        })
        .collect();
    format!("isolated: {}", rules.join("; "))
}

/// Where a pod lives in a [`TracedCluster`].
#[derive(Debug, Clone)]
pub(crate) struct Placement {
    pub(crate) node: String,
    /// The host side of its interface; empty for a host-network pod, which is its node.
    pub(crate) interface: String,
    pub(crate) ips: Vec<std::net::IpAddr>,
}

impl Placement {
    /// A host-network pod: it runs in its node's namespace, with the node's addresses.
    pub(crate) fn is_host(&self) -> bool {
        self.interface.is_empty()
    }
}

/// A cluster whose nodes' rulesets live in fake nft tables and whose reachability is decided
/// by the packet tracer: the whole pure pipeline (translate → render → fake apply → trace),
/// checked against expected matrices without a kernel.
pub struct TracedCluster {
    /// Each node's table, compiled for tracing.
    pub(crate) nodes: std::collections::BTreeMap<String, crate::nft::trace::Tracer>,
    /// The pods flock enforces, and host-network pods (see [`Placement::is_host`]).
    pub(crate) pods: std::collections::BTreeMap<String, Placement>,
    /// Each node's rendered ruleset text.
    pub texts: std::collections::BTreeMap<String, String>,
    /// Each node's own addresses (its Node object's): a pod's packet to one of them meets
    /// hook `input` there, not `forward`.
    pub node_addrs: std::collections::BTreeMap<String, Vec<std::net::IpAddr>>,
}

/// The address of family `family` of the pod `name` placed at `p`.
fn address_of(p: &Placement, name: &str, family: crate::model::Family) -> Result<std::net::IpAddr, String> {
    p.ips.iter().copied().find(|ip| crate::model::Family::of(*ip) == family).ok_or(format!("{name} has no {} address", family.as_str()))
}

/// The name of the node uplink in traced packets (anything that is not a pod interface).
pub const UPLINK: &str = "eth0";

impl TracedCluster {
    /// Translates, renders and applies (to a fake nft) every node of the snapshot.
    #[allow(clippy::panic)]
    pub fn build(snapshot: &Snapshot) -> Self {
        Self::build_with(snapshot, &crate::render::RenderOptions::default())
    }

    /// [`Self::build`] with a choice of ruleset shape.
    #[allow(clippy::panic)]
    pub fn build_with(snapshot: &Snapshot, render: &crate::render::RenderOptions) -> Self {
        use crate::apply::{Applier, fake::FakeNft};
        let mut node_names: Vec<String> = snapshot.nodes().map(|n| n.name.clone()).collect();
        node_names.extend(snapshot.pods().filter_map(|p| p.node.clone()));
        node_names.sort();
        node_names.dedup();
        let mut nodes = std::collections::BTreeMap::new();
        let mut pods = std::collections::BTreeMap::new();
        let mut texts = std::collections::BTreeMap::new();
        for node in node_names {
            let eps = snapshot.derived_endpoints(&node);
            let np = crate::translate::translate(snapshot, &eps, &crate::translate::Options::default());
            let rs = crate::render::render_with(&np, render);
            let mut applier = Applier::new(FakeNft::new());
            if let Err(e) = applier.apply(&rs) {
                panic!("node {node}: the fake nft refused the ruleset: {e}\n{}", rs.to_text());
            }
            let Some(table) = applier.backend().table().cloned() else { panic!("node {node}: no table after apply") };
            for ep in eps {
                pods.insert(ep.pod.to_string(), Placement { node: node.clone(), interface: ep.interface.clone(), ips: ep.addrs.clone() });
            }
            texts.insert(node.clone(), rs.to_text());
            nodes.insert(node, crate::nft::trace::Tracer::new(&table));
        }
        let node_addrs: std::collections::BTreeMap<String, Vec<std::net::IpAddr>> =
            snapshot.nodes().map(|n| (n.name.clone(), n.addresses.iter().chain(&n.internal_ips).copied().collect())).collect();
        for p in snapshot.pods().filter(|p| p.host_network && !p.phase.is_terminal()) {
            let Some(node) = p.node.clone() else { continue };
            let ips = if p.ips.is_empty() { node_addrs.get(&node).cloned().unwrap_or_default() } else { p.ips.clone() };
            pods.insert(p.key().to_string(), Placement { node, interface: String::new(), ips });
        }
        Self { nodes, pods, texts, node_addrs }
    }

    /// Whether `addr` is an address of `node` itself.
    fn is_node_address(&self, node: &str, addr: std::net::IpAddr) -> bool {
        self.node_addrs.get(node).is_some_and(|a| a.contains(&addr))
    }

    /// Whether a new connection from `from` to `to` passes every node's ruleset.
    pub fn connected(
        &self,
        from: &str,
        to: &str,
        protocol: crate::model::Protocol,
        port: u16,
        family: Option<crate::model::Family>,
    ) -> Result<bool, String> {
        use crate::model::Family;
        let src = self.pods.get(from).ok_or(format!("no pod {from}"))?;
        let dst = self.pods.get(to).ok_or(format!("no pod {to}"))?;
        let fam = match family {
            Some(f) => f,
            None => Family::of(*dst.ips.first().ok_or(format!("{to} has no address"))?),
        };
        let (s, d) = (address_of(src, from, fam)?, address_of(dst, to, fam)?);
        // Each node the packet crosses, and how: from a pod interface or the uplink, to a pod
        // interface, the uplink, or the node itself (hook `input`). What a node sends leaves
        // through hook `output`, which flock does not police.
        let mut hops: Vec<(&str, &str, Option<&str>)> = Vec::new();
        match (src.is_host(), dst.is_host(), src.node == dst.node) {
            (true, true, _) | (true, false, true) => {}
            (true, false, false) => hops.push((&dst.node, UPLINK, Some(&dst.interface))),
            (false, true, true) => hops.push((&src.node, &src.interface, None)),
            (false, true, false) => hops.push((&src.node, &src.interface, Some(UPLINK))),
            (false, false, true) => hops.push((&src.node, &src.interface, Some(&dst.interface))),
            (false, false, false) => {
                hops.extend([(src.node.as_str(), src.interface.as_str(), Some(UPLINK)), (&dst.node, UPLINK, Some(&dst.interface))])
            }
        }
        for (node, iif, oif) in hops {
            if !self.passes(node, iif, oif, (s, d), protocol, port)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether a new connection from pod `from` to an address outside the pods (a node, a
    /// network) leaves `from`'s node: only the source node's ruleset is on the path.
    pub fn reaches_address(&self, from: &str, to: std::net::IpAddr, protocol: crate::model::Protocol, port: u16) -> Result<bool, String> {
        let src = self.pods.get(from).ok_or(format!("no pod {from}"))?;
        let s = address_of(src, from, crate::model::Family::of(to))?;
        let oif = (!self.is_node_address(&src.node, to)).then_some(UPLINK);
        self.passes(&src.node, &src.interface, oif, (s, to), protocol, port)
    }

    /// Whether a new connection from an address outside the pods (a node, a network) to pod
    /// `to` gets in: it arrives on the uplink of `to`'s node, whose ruleset alone is on the path.
    pub(crate) fn reached_from_address(
        &self,
        from: std::net::IpAddr,
        to: &str,
        protocol: crate::model::Protocol,
        port: u16,
    ) -> Result<bool, String> {
        let dst = self.pods.get(to).ok_or(format!("no pod {to}"))?;
        let d = address_of(dst, to, crate::model::Family::of(from))?;
        if self.is_node_address(&dst.node, from) {
            // The node itself: not policed (hook `output`).
            return Ok(true);
        }
        self.passes(&dst.node, UPLINK, Some(&dst.interface), (from, d), protocol, port)
    }

    /// Whether the first packet of a new connection passes `node`'s ruleset from `iif` to
    /// `oif` (hook `forward`), or to the node itself (`None`: hook `input`).
    fn passes(
        &self,
        node: &str,
        iif: &str,
        oif: Option<&str>,
        (src, dst): (std::net::IpAddr, std::net::IpAddr),
        protocol: crate::model::Protocol,
        port: u16,
    ) -> Result<bool, String> {
        use crate::nft::trace::{Ct, L4, Packet, Verdict};
        let l4 = match protocol {
            crate::model::Protocol::Tcp => L4::Tcp,
            crate::model::Protocol::Udp => L4::Udp,
            crate::model::Protocol::Sctp => L4::Sctp,
        };
        let tracer = self.nodes.get(node).ok_or(format!("no node {node}"))?;
        let base = if oif.is_some() { crate::render::BASE_CHAIN } else { crate::render::INPUT_CHAIN };
        let pkt = Packet { iif: iif.into(), oif: oif.unwrap_or_default().into(), src, dst, l4, dport: port, ct: Ct::New };
        let t = tracer.trace(base, &pkt).map_err(|e| format!("node {node}: {e}"))?;
        Ok(t.verdict != Verdict::Drop)
    }

    /// Runs a conformance case from `base` with a choice of ruleset shape, returning every
    /// mismatching cell (and errors for probes the tracer cannot perform).
    #[cfg(test)]
    pub(crate) fn run_case_with(
        base: &Snapshot,
        case: &crate::conformance::Case,
        render: &crate::render::RenderOptions,
    ) -> Result<Vec<crate::conformance::Mismatch>, String> {
        let mut snapshot = base.clone();
        let mut mismatches = Vec::new();
        for (i, step) in case.steps.iter().enumerate() {
            crate::conformance::apply_step(&mut snapshot, step);
            let cluster = Self::build_with(&snapshot, render);
            for probe in &step.probes {
                let mut observed = std::collections::BTreeMap::new();
                for from in &probe.order {
                    for to in &probe.order {
                        // The tracer sees no DNS answers: what a domain rule learned is not
                        // its to judge.
                        if from == to
                            || probe.expect(from, to) == crate::conformance::Expect::Unchecked
                            || !case.judged_offline(&snapshot, to)
                        {
                            continue;
                        }
                        let c = cluster.connected(from, to, probe.protocol, probe.port, probe.family)?;
                        observed.insert((from.clone(), to.clone()), c);
                    }
                }
                let judged = crate::conformance::compare(i, probe, &observed);
                mismatches.extend(judged.into_iter().filter(|m| observed.contains_key(&(m.from.clone(), m.to.clone()))));
            }
        }
        Ok(mismatches)
    }
}
