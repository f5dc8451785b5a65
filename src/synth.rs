//! A synthetic cluster for benchmarks (`flockctl bench`): N pods, M policies, K namespaces,
//! with the label and selector mixes of real clusters. Pure and deterministic: equal
//! parameters (seed included) give an equal snapshot. The pseudo-random numbers come from
//! SplitMix64, a few lines that need no dependency.
//!
//! The shape:
//! - Namespaces `ns-<k>` labelled `team` (five namespaces per team) and `env`, plus
//!   `kube-system` (DNS pods), `monitoring` (Prometheus) and `ingress` (the ingress
//!   controller).
//! - Each namespace runs apps of about five replicas; pods carry `app`, `tier` (web, api, db),
//!   `version` and `pod-template-hash`, and declare the named ports `http`, `metrics` and,
//!   for api and db pods, `grpc` or `pg`, whose numbers differ from app to app (so egress
//!   named ports resolve per destination).
//! - Pods are spread over nodes of [`Params::pods_per_node`] pods in a shuffled order, so a
//!   node hosts pods of many namespaces, as a scheduler would place them. Node `node-0` is
//!   the node benchmarks render for.
//! - Policies per namespace, in this order while the namespace's share of M lasts: default
//!   deny (both directions), allow DNS egress, allow from Prometheus on the `metrics` named
//!   port, allow from the namespace's own pods; then a cycle of allow-from-app (same
//!   namespace, named port), namespace+pod peers (the team's namespaces AND a tier, with an
//!   endPort range), egress to the namespace's databases on the `pg` named port, allow from
//!   the ingress controller, egress to the internet (ipBlock with excepts), and ingress from
//!   the cluster's range minus one node (ipBlock with except).
//! - ClusterNetworkPolicies, when asked for: Admin policies in a cycle of deny ingress from
//!   `env: dev` namespaces to a team, accept DNS egress for every namespace, pass Prometheus to
//!   a team's NetworkPolicies on a named port, deny a team's web pods egress to the metadata
//!   address, deny a team egress to the kubelet port of every node, and a team's isolation
//!   (pass from the team, deny from every other namespace); priorities spread over 0–1000 with
//!   pairs of equal priority. Baseline policies cycle through deny ingress from other teams,
//!   accept egress within the team, and deny SMTP to anywhere. Teams take the Admin shapes in turn
//!   (all six for a team, then the next team), the Baseline ones round robin.
//! - Addresses: IPv4 from 198.18.0.0/15, a /25 per node, while the nodes fit (1,016 nodes;
//!   the nodes' own addresses in 198.19.252.0/22); larger clusters are IPv6 from
//!   2001:db8::/32, a /64 per node (the nodes' own in 2001:db8:ffff:ffff::/64). No node's
//!   address is in a pod CIDR.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::model::cnp::{ClusterNetworkPolicy, CnpPeer, CnpPods, CnpPort, CnpProtocol, CnpRule, CnpSubject};
use crate::model::convert::NAMESPACE_NAME_LABEL;
use crate::model::labels::intern;
use crate::model::{
    ContainerPort, IpBlock, LabelSelector, LabelSelectorRequirement, Labels, Namespace, NetworkPolicy, Node, Pod, PodPhase, PolicyPeer,
    PolicyPort, PolicyRule, PortRef, Protocol, Snapshot,
};

/// What to generate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    pub pods: usize,
    pub policies: usize,
    /// Application namespaces (the three system namespaces come on top).
    pub namespaces: usize,
    pub pods_per_node: usize,
    pub seed: u64,
    /// ClusterNetworkPolicies of the Admin tier.
    pub admin_policies: usize,
    /// ClusterNetworkPolicies of the Baseline tier.
    pub baseline_policies: usize,
}

impl Params {
    /// `pods` pods and `policies` policies in `policies / 10` namespaces (at least one), 110
    /// pods per node.
    pub fn new(pods: usize, policies: usize) -> Self {
        Self { pods, policies, namespaces: (policies / 10).max(1), pods_per_node: 110, seed: 1, admin_policies: 0, baseline_policies: 0 }
    }
}

/// A generated cluster.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub snapshot: Snapshot,
    /// The node benchmarks render for (`node-0`, with `pods_per_node` pods).
    pub node: String,
    pub nodes: usize,
    pub(crate) pods_per_node: usize,
    pub ipv6: bool,
}

impl Cluster {
    /// A pod like `like` (same namespace, labels and ports) named `<name>-new`, on an existing
    /// node other than the benchmarked one (`node-1`, or `node-0` alone) at the first address
    /// of its pod CIDR past its pods: where a scheduler and the node's IPAM put a new pod.
    pub fn new_pod_like(&self, like: &Pod) -> Pod {
        let node = usize::from(self.nodes > 1);
        let mut pod = like.clone();
        pod.name = format!("{}-new", like.name);
        pod.uid = crate::model::derived_uid(&pod.namespace, &pod.name);
        pod.node = Some(format!("node-{node}"));
        pod.ips = vec![pod_ip(node, self.pods_per_node, self.ipv6)];
        pod
    }

    /// A copy of `like` (same namespace, labels and ports) named `<name>-copy-<n>`, with a new
    /// uid and the `n`-th address after the cluster's nodes, on the node it belongs to; `None`
    /// when an IPv4 cluster has no address left for it in 198.18.0.0/15.
    pub fn copy_pod(&self, like: &Pod, n: usize) -> Option<Pod> {
        let node = self.nodes + n / self.pods_per_node;
        if !self.ipv6 && node >= MAX_NODES_V4 {
            return None;
        }
        let mut pod = like.clone();
        pod.name = format!("{}-copy-{n}", like.name);
        pod.uid = crate::model::derived_uid(&pod.namespace, &pod.name);
        pod.node = Some(format!("node-{node}"));
        pod.ips = vec![pod_ip(node, n % self.pods_per_node, self.ipv6)];
        Some(pod)
    }
}

/// Replicas per app (about).
const REPLICAS: usize = 5;
/// Application namespaces per team.
const NAMESPACES_PER_TEAM: usize = 5;
/// System pods: DNS, Prometheus, ingress controller.
const SYSTEM_PODS: [(&str, &str, &str, usize); 3] =
    [("kube-system", "k8s-app", "kube-dns", 2), ("monitoring", "app", "prometheus", 2), ("ingress", "app", "ingress-controller", 3)];

/// SplitMix64.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        // The modulo bias is irrelevant at these sizes.
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// One of `from` (not empty).
    pub fn pick<'a, T>(&mut self, from: &'a [T]) -> &'a T {
        &from[self.below(from.len())]
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    /// `items` in a random order (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }
}

/// Generates the cluster.
pub fn generate(p: &Params) -> Cluster {
    let mut rng = Rng::new(p.seed);
    let k = p.namespaces.max(1);
    let per_node = p.pods_per_node.max(1);
    let system: usize = SYSTEM_PODS.iter().map(|s| s.3).sum();
    let total = p.pods + system;
    let nodes = total.div_ceil(per_node).max(1);
    // A /25 per node holds 126 pods; 198.18.0.0/15 holds 1,016 of them and the nodes' own
    // addresses.
    let ipv6 = nodes > MAX_NODES_V4 || per_node > 126;
    let mut s = Snapshot::new();

    for i in 0..nodes {
        let ip = node_ip(i, ipv6);
        let mut labels = crate::model::Labels::new();
        labels.insert("kubernetes.io/hostname", format!("node-{i}"));
        s.upsert_node(Node {
            name: format!("node-{i}"),
            pod_cidrs: vec![node_cidr(i, ipv6)],
            internal_ips: vec![ip],
            addresses: vec![ip],
            labels,
        });
    }
    for i in 0..k {
        let mut labels = Labels::new();
        labels.insert(NAMESPACE_NAME_LABEL, ns_name(i));
        labels.insert("team", format!("team-{}", i / NAMESPACES_PER_TEAM));
        labels.insert("env", ["prod", "staging", "dev"][i % 3]);
        s.upsert_namespace(Namespace { name: ns_name(i), labels, ..Namespace::default() });
    }
    for (name, _, _, _) in SYSTEM_PODS {
        let mut labels = Labels::new();
        labels.insert(NAMESPACE_NAME_LABEL, name);
        labels.insert("purpose", name);
        s.upsert_namespace(Namespace { name: name.into(), labels, ..Namespace::default() });
    }

    // Pods without placement: application pods namespace by namespace, then system pods.
    let mut pods: Vec<Pod> = Vec::with_capacity(total);
    let per_ns = p.pods / k;
    for i in 0..k {
        let count = per_ns + usize::from(i < p.pods % k);
        for j in 0..count {
            pods.push(app_pod(i, j, count));
        }
    }
    for (ns, key, value, count) in SYSTEM_PODS {
        for j in 0..count {
            let mut pod = blank_pod(ns, &format!("{value}-{j}"));
            pod.labels.insert(key, value);
            pod.ports = vec![
                ContainerPort { name: Some(intern("dns")), port: 53, protocol: Protocol::Udp },
                ContainerPort { name: Some(intern("metrics")), port: 9153, protocol: Protocol::Tcp },
            ];
            pods.push(pod);
        }
    }
    // Placement: a shuffled order filled node by node.
    for i in (1..pods.len()).rev() {
        pods.swap(i, rng.below(i + 1));
    }
    for (slot, mut pod) in pods.into_iter().enumerate() {
        let node = slot / per_node;
        pod.node = Some(format!("node-{node}"));
        pod.ips = vec![pod_ip(node, slot % per_node, ipv6)];
        s.upsert_pod(pod);
    }

    let per_ns_policies = p.policies / k;
    for i in 0..k {
        let count = per_ns_policies + usize::from(i < p.policies % k);
        let apps = apps_in(p.pods / k);
        for j in 0..count {
            s.upsert_policy(policy(i, j, apps, k, ipv6, &mut rng));
        }
    }
    let teams = k.div_ceil(NAMESPACES_PER_TEAM);
    for i in 0..p.admin_policies {
        s.upsert_cluster_policy(admin_policy(i, p.admin_policies, teams, ipv6));
    }
    for i in 0..p.baseline_policies {
        s.upsert_cluster_policy(baseline_policy(i, teams, ipv6));
    }
    Cluster { snapshot: s, node: "node-0".into(), nodes, pods_per_node: per_node, ipv6 }
}

fn ns_name(i: usize) -> String {
    format!("ns-{i}")
}

fn apps_in(pods: usize) -> usize {
    pods.div_ceil(REPLICAS).max(1)
}

fn node_cidr(node: usize, ipv6: bool) -> IpNet {
    if ipv6 { IpNet::V6(Ipv6Net::new_assert(node_v6(node, 0), 64)) } else { IpNet::V4(Ipv4Net::new_assert(node_v4(node, 0), 25)) }
}

fn node_v4(node: usize, host: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + (node as u32) * 128 + host as u32)
}

fn node_v6(node: usize, host: usize) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, (node >> 16) as u16, node as u16, 0, 0, 0, host as u16)
}

/// IPv4 nodes' own addresses: 198.19.252.0/22, past the last node's pod CIDR (a node's
/// address is in none, as on a real cluster).
const NODE_IPS_V4: u32 = 0xc613_fc00;
/// IPv4 clusters hold at most this many nodes (their /25s below [`NODE_IPS_V4`]).
const MAX_NODES_V4: usize = 1016;

fn node_ip(node: usize, ipv6: bool) -> IpAddr {
    if ipv6 {
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0xffff, 0, 0, (node >> 16) as u16, node as u16))
    } else {
        IpAddr::V4(Ipv4Addr::from(NODE_IPS_V4 + node as u32))
    }
}

fn pod_ip(node: usize, index: usize, ipv6: bool) -> IpAddr {
    if ipv6 { IpAddr::V6(node_v6(node, index + 1)) } else { IpAddr::V4(node_v4(node, index + 1)) }
}

fn blank_pod(ns: &str, name: &str) -> Pod {
    Pod {
        namespace: ns.into(),
        name: name.into(),
        uid: crate::model::derived_uid(ns, name),
        labels: Labels::new(),
        node: None,
        phase: PodPhase::Running,
        ips: Vec::new(),
        host_network: false,
        ports: Vec::new(),
        created: None,
        unpublished: false,
    }
}

const TIERS: [&str; 3] = ["web", "api", "db"];

/// Pod `j` of the `count` pods of namespace `ns`.
fn app_pod(ns: usize, j: usize, count: usize) -> Pod {
    let app = j % apps_in(count);
    let replica = j / apps_in(count);
    let tier = TIERS[app % 3];
    let hash = crate::render::names::hash8(&[&ns_name(ns), &app.to_string()]).to_ascii_lowercase();
    let mut pod = blank_pod(&ns_name(ns), &format!("app-{app}-{hash}-{replica}"));
    pod.labels.insert("app", format!("app-{app}"));
    pod.labels.insert("tier", tier);
    pod.labels.insert("version", format!("v{}", 1 + app % 2));
    pod.labels.insert("pod-template-hash", hash);
    pod.ports = vec![
        ContainerPort { name: Some(intern("http")), port: 8000 + (app % 100) as u16, protocol: Protocol::Tcp },
        ContainerPort { name: Some(intern("metrics")), port: 9090, protocol: Protocol::Tcp },
    ];
    match tier {
        "api" => pod.ports.push(ContainerPort { name: Some(intern("grpc")), port: 9000 + (app % 50) as u16, protocol: Protocol::Tcp }),
        "db" => pod.ports.push(ContainerPort { name: Some(intern("pg")), port: 5432 + (app % 3) as u16, protocol: Protocol::Tcp }),
        _ => {}
    }
    pod
}

fn labels(pairs: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
        ..Default::default()
    }
}

fn port(protocol: &str, port: PortRef, end_port: Option<i32>) -> PolicyPort {
    PolicyPort { protocol: Some(protocol.into()), port: Some(port), end_port }
}

fn pods_peer(sel: LabelSelector) -> PolicyPeer {
    PolicyPeer { pod_selector: Some(sel), ..Default::default() }
}

fn block(cidr: &str, except: &[String]) -> PolicyPeer {
    PolicyPeer { ip_block: Some(IpBlock { cidr: cidr.into(), except: except.to_vec() }), ..Default::default() }
}

/// Policy `j` of namespace `ns` (see the module doc for the mix).
fn policy(ns: usize, j: usize, apps: usize, namespaces: usize, ipv6: bool, rng: &mut Rng) -> NetworkPolicy {
    let namespace = ns_name(ns);
    let app = |rng: &mut Rng| format!("app-{}", rng.below(apps));
    let mut p = NetworkPolicy { namespace: namespace.clone(), ..Default::default() };
    let rule = |peers: Vec<PolicyPeer>, ports: Vec<PolicyPort>| PolicyRule { peers, ports };
    match j {
        0 => {
            p.name = "default-deny".into();
            p.policy_types = vec!["Ingress".into(), "Egress".into()];
        }
        1 => {
            p.name = "allow-dns".into();
            p.policy_types = vec!["Egress".into()];
            p.egress = vec![rule(
                vec![PolicyPeer {
                    namespace_selector: Some(labels(&[(NAMESPACE_NAME_LABEL, "kube-system")])),
                    pod_selector: Some(labels(&[("k8s-app", "kube-dns")])),
                    ..Default::default()
                }],
                vec![port("UDP", PortRef::Number(53), None), port("TCP", PortRef::Number(53), None)],
            )];
        }
        2 => {
            p.name = "allow-prometheus".into();
            p.ingress = vec![rule(
                vec![PolicyPeer {
                    namespace_selector: Some(labels(&[("purpose", "monitoring")])),
                    pod_selector: Some(labels(&[("app", "prometheus")])),
                    ..Default::default()
                }],
                vec![port("TCP", PortRef::Name("metrics".into()), None)],
            )];
        }
        3 => {
            p.name = "allow-same-namespace".into();
            p.ingress = vec![rule(vec![pods_peer(LabelSelector::default())], vec![])];
        }
        _ => match (j - 4) % 6 {
            0 => {
                let (to, from) = (app(rng), app(rng));
                p.name = format!("allow-{from}-to-{to}-{j}");
                p.pod_selector = labels(&[("app", &to)]);
                p.ingress = vec![rule(vec![pods_peer(labels(&[("app", &from)]))], vec![port("TCP", PortRef::Name("http".into()), None)])];
            }
            1 => {
                let to = app(rng);
                let team = rng.below(namespaces.div_ceil(NAMESPACES_PER_TEAM));
                p.name = format!("allow-team-{team}-api-to-{to}-{j}");
                p.pod_selector = labels(&[("app", &to)]);
                p.ingress = vec![rule(
                    vec![PolicyPeer {
                        namespace_selector: Some(labels(&[("team", &format!("team-{team}"))])),
                        pod_selector: Some(LabelSelector {
                            match_expressions: vec![LabelSelectorRequirement {
                                key: "tier".into(),
                                operator: "In".into(),
                                values: vec!["api".into()],
                            }],
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    vec![port("TCP", PortRef::Number(9000), Some(9100))],
                )];
            }
            2 => {
                let from = app(rng);
                p.name = format!("allow-{from}-to-db-{j}");
                p.pod_selector = labels(&[("app", &from)]);
                p.policy_types = vec!["Egress".into()];
                p.egress = vec![rule(vec![pods_peer(labels(&[("tier", "db")]))], vec![port("TCP", PortRef::Name("pg".into()), None)])];
            }
            3 => {
                p.name = format!("allow-ingress-controller-{j}");
                p.pod_selector = labels(&[("tier", "web")]);
                p.ingress = vec![rule(
                    vec![PolicyPeer { namespace_selector: Some(labels(&[("purpose", "ingress")])), ..Default::default() }],
                    vec![port("TCP", PortRef::Number(8000), Some(8099))],
                )];
            }
            4 => {
                let from = app(rng);
                p.name = format!("allow-{from}-to-internet-{j}");
                p.pod_selector = labels(&[("app", &from)]);
                p.policy_types = vec!["Egress".into()];
                p.egress = vec![if ipv6 {
                    rule(vec![block("::/0", &["2001:db8::/32".into(), "fc00::/7".into()])], vec![port("TCP", PortRef::Number(443), None)])
                } else {
                    let private = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "198.18.0.0/15"].map(String::from);
                    rule(vec![block("0.0.0.0/0", &private)], vec![port("TCP", PortRef::Number(443), None)])
                }];
            }
            _ => {
                let to = app(rng);
                let node = rng.below(MAX_NODES_V4);
                p.name = format!("allow-cluster-to-{to}-{j}");
                p.pod_selector = labels(&[("app", &to)]);
                let (cidr, except) = if ipv6 {
                    ("2001:db8::/32", node_cidr(node, true).to_string())
                } else {
                    ("198.18.0.0/15", node_cidr(node, false).to_string())
                };
                p.ingress = vec![rule(vec![block(cidr, &[except])], vec![port("TCP", PortRef::Name("http".into()), None)])];
            }
        },
    }
    p
}

fn cnp_rule(name: String, action: &str, peers: Vec<CnpPeer>, protocols: Option<Vec<CnpProtocol>>) -> CnpRule {
    CnpRule { name: Some(name), action: action.into(), peers, protocols }
}

fn team(t: usize) -> LabelSelector {
    labels(&[("team", &format!("team-{t}"))])
}

/// Admin policy `i` of `count` (see the module doc).
fn admin_policy(i: usize, count: usize, teams: usize, ipv6: bool) -> ClusterNetworkPolicy {
    // Every shape for a team before the next team.
    let t = (i / 6) % teams.max(1);
    // Pairs of equal priority, spread over the range.
    let priority = ((i / 2) * 2 * 1000 / count.max(1)).min(1000) as i64;
    let mut p = ClusterNetworkPolicy {
        tier: "Admin".into(),
        priority: Some(priority),
        subject: CnpSubject::Namespaces(team(t)),
        ..Default::default()
    };
    match i % 6 {
        0 => {
            p.name = format!("team-{t}-no-dev-{i}");
            p.ingress = vec![cnp_rule(format!("deny-from-dev-{i}"), "Deny", vec![CnpPeer::Namespaces(labels(&[("env", "dev")]))], None)];
        }
        1 => {
            p.name = format!("dns-{i}");
            p.subject = CnpSubject::Namespaces(LabelSelector::default());
            let dns = CnpPods {
                namespace_selector: Some(labels(&[(NAMESPACE_NAME_LABEL, "kube-system")])),
                pod_selector: labels(&[("k8s-app", "kube-dns")]),
            };
            p.egress = vec![cnp_rule(
                format!("accept-dns-{i}"),
                "Accept",
                vec![CnpPeer::Pods(dns)],
                Some(vec![CnpProtocol::Udp(CnpPort::Number(53)), CnpProtocol::Tcp(CnpPort::Number(53))]),
            )];
        }
        2 => {
            p.name = format!("team-{t}-monitoring-{i}");
            p.ingress = vec![cnp_rule(
                format!("pass-prometheus-{i}"),
                "Pass",
                vec![CnpPeer::Namespaces(labels(&[("purpose", "monitoring")]))],
                Some(vec![CnpProtocol::NamedPort("metrics".into())]),
            )];
        }
        3 => {
            p.name = format!("team-{t}-web-no-metadata-{i}");
            p.subject = CnpSubject::Pods(CnpPods { namespace_selector: Some(team(t)), pod_selector: labels(&[("tier", "web")]) });
            let metadata = if ipv6 { "fd00:ec2::254/128" } else { "169.254.169.254/32" };
            p.egress = vec![cnp_rule(format!("deny-metadata-{i}"), "Deny", vec![CnpPeer::Networks(vec![metadata.into()])], None)];
        }
        4 => {
            p.name = format!("team-{t}-no-kubelet-{i}");
            p.egress = vec![cnp_rule(
                format!("deny-kubelet-{i}"),
                "Deny",
                vec![CnpPeer::Nodes(LabelSelector::default())],
                Some(vec![CnpProtocol::Tcp(CnpPort::Range { start: 10249, end: 10250 })]),
            )];
        }
        _ => {
            p.name = format!("team-{t}-isolation-{i}");
            p.ingress = vec![
                cnp_rule(format!("pass-team-{i}"), "Pass", vec![CnpPeer::Namespaces(team(t))], None),
                cnp_rule(format!("deny-other-namespaces-{i}"), "Deny", vec![CnpPeer::Namespaces(LabelSelector::default())], None),
            ];
        }
    }
    p
}

/// Baseline policy `i` (see the module doc).
fn baseline_policy(i: usize, teams: usize, ipv6: bool) -> ClusterNetworkPolicy {
    let t = i % teams.max(1);
    let mut p = ClusterNetworkPolicy {
        tier: "Baseline".into(),
        priority: Some((i * 10 % 1001) as i64),
        subject: CnpSubject::Namespaces(team(t)),
        ..Default::default()
    };
    match i % 3 {
        0 => {
            p.name = format!("team-{t}-baseline-ingress-{i}");
            p.ingress = vec![
                cnp_rule(format!("accept-team-{i}"), "Accept", vec![CnpPeer::Namespaces(team(t))], None),
                cnp_rule(format!("deny-rest-{i}"), "Deny", vec![CnpPeer::Namespaces(LabelSelector::default())], None),
            ];
        }
        1 => {
            p.name = format!("team-{t}-baseline-egress-{i}");
            p.egress = vec![cnp_rule(format!("accept-team-{i}"), "Accept", vec![CnpPeer::Namespaces(team(t))], None)];
        }
        _ => {
            p.name = format!("team-{t}-no-smtp-{i}");
            let all = if ipv6 { "::/0" } else { "0.0.0.0/0" };
            p.egress = vec![cnp_rule(
                format!("deny-smtp-{i}"),
                "Deny",
                vec![CnpPeer::Networks(vec![all.into()])],
                Some(vec![CnpProtocol::Tcp(CnpPort::Number(25))]),
            )];
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::{Options, translate};

    #[test]
    fn shuffles_are_permutations() {
        let mut v: Vec<usize> = (0..50).collect();
        Rng::new(3).shuffle(&mut v);
        assert_ne!(v, (0..50).collect::<Vec<_>>());
        v.sort_unstable();
        assert_eq!(v, (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn sizes_and_determinism() {
        let p = Params { pods: 1000, policies: 100, namespaces: 10, pods_per_node: 110, seed: 7, admin_policies: 12, baseline_policies: 6 };
        let a = generate(&p);
        let system: usize = SYSTEM_PODS.iter().map(|s| s.3).sum();
        assert_eq!(a.snapshot.pod_count(), 1000 + system);
        assert_eq!(a.snapshot.policy_count(), 100);
        assert_eq!(a.snapshot.namespaces().count(), 13);
        assert!(!a.ipv6);
        assert_eq!(a.snapshot.derived_endpoints(&a.node).len(), 110);
        let b = generate(&p);
        let eps = a.snapshot.derived_endpoints(&a.node);
        assert_eq!(translate(&a.snapshot, &eps, &Options::default()), translate(&b.snapshot, &eps, &Options::default()));
        // Every generated policy is valid, ClusterNetworkPolicies included.
        assert!(crate::translate::validate_all(&a.snapshot).is_empty());
        assert_eq!(a.snapshot.cluster_policies().count(), 18);
        let np = translate(&a.snapshot, &eps, &Options::default());
        assert!(np.problems.is_empty(), "{:?}", np.problems);
        assert!(np.endpoints.iter().any(|e| !e.ingress.admin.is_empty()) && np.endpoints.iter().any(|e| !e.egress.baseline.is_empty()));
    }

    #[test]
    fn large_clusters_are_ipv6_in_the_documentation_range() {
        // More pods per node than a /25 holds: IPv6 (as are clusters of more than 1,016 nodes).
        let p = Params { pods: 1000, policies: 10, namespaces: 10, pods_per_node: 200, seed: 1, admin_policies: 0, baseline_policies: 0 };
        let c = generate(&p);
        assert!(c.ipv6);
        let range: IpNet = "2001:db8::/32".parse().unwrap();
        assert!(c.snapshot.pods().all(|p| p.ips.iter().all(|ip| range.contains(ip))));
        let small = generate(&Params::new(1000, 10));
        let range: IpNet = "198.18.0.0/15".parse().unwrap();
        assert!(small.snapshot.pods().all(|p| p.ips.iter().all(|ip| range.contains(ip))));
    }
}
