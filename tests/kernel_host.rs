//! A pod's traffic to its own node on the real kernel (root only): judged by the pod's egress
//! policy through hook `input`, as forwarded traffic is; the node's own traffic to its pods
//! (kubelet probes) not policed; IPv6 neighbour discovery through the link-local gateway
//! working under the ruleset; spoofed sources to the node dropped; floods of neighbour
//! solicitations from forged sources teaching the node no neighbour entry.
//! The table is written as flock-agent writes it (netlink batches).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use flock::apply::Applier;
use flock::apply::kernel::NftCli;
use flock::model::{LocalEndpoint, PodPhase, Protocol, Snapshot};
use flock::render::render;
use flock::sim::probe::{self, Dest, Outcome, Task};
use flock::sim::servers::Servers;
use flock::testkit::kernel::{Forged, NetnsGuard, Node, forge_neighbour_requests, neighbours_of, require_root};
use flock::testkit::policies;
use flock::translate::{Options, translate};

const NODE_V4: &str = "198.18.5.1";
const NODE_V6: &str = "2001:db8:5::1";

/// Pods `a` (dual-stack) and `b` (IPv4) of namespace t on node n1, and `policies`.
fn cluster(policy_text: &str) -> (Snapshot, flock::model::Pod, flock::model::Pod) {
    let mut s = Snapshot::new();
    s.upsert_namespace(flock::model::convert::implicit_namespace("t"));
    let mk = |name: &str, ips: &[&str]| flock::model::Pod {
        namespace: "t".into(),
        name: name.into(),
        uid: flock::model::derived_uid("t", name),
        labels: [("pod".to_string(), name.to_string())].into(),
        node: Some("n1".into()),
        phase: PodPhase::Running,
        ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
        host_network: false,
        ports: vec![],
        created: None,
        unpublished: false,
    };
    let a = mk("a", &["198.18.10.1", "2001:db8:10::1"]);
    let b = mk("b", &["198.18.10.2"]);
    s.upsert_pod(a.clone());
    s.upsert_pod(b.clone());
    for p in policies(policy_text) {
        s.upsert_policy(p);
    }
    (s, a, b)
}

/// `a` isolated both ways, allowed nothing.
const DENY: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-deny-all, namespace: t}
spec: {podSelector: {matchLabels: {pod: a}}, policyTypes: [Ingress, Egress]}
";

/// `a` isolated both ways, its egress allowed to the node's addresses on TCP 10250.
const ALLOW_KUBELET: &str = "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-deny-all, namespace: t}
spec:
  podSelector: {matchLabels: {pod: a}}
  policyTypes: [Ingress, Egress]
  egress:
  - to: [{ipBlock: {cidr: 198.18.5.1/32}}, {ipBlock: {cidr: '2001:db8:5::1/128'}}]
    ports: [{protocol: TCP, port: 10250}]
";

fn apply(node: &Node, s: &Snapshot) {
    let rs = render(&translate(s, &s.derived_endpoints("n1"), &Options::default()));
    Applier::new(NftCli::new(node.ns.netns())).apply(&rs).unwrap();
}

/// Whether each (source namespace, destination, protocol) connects.
fn probe(tasks: &[(&NetnsGuard, &str, u16, Protocol)]) -> Vec<bool> {
    let tasks: Vec<Task> = tasks
        .iter()
        .map(|(ns, dst, port, protocol)| Task {
            src: ns.netns(),
            dst: Dest::Address(SocketAddr::new(dst.parse::<IpAddr>().unwrap(), *port)),
            protocol: *protocol,
        })
        .collect();
    probe::probe_all(&tasks, Duration::from_millis(1500), 8).into_iter().map(|o| o == Outcome::Connected).collect()
}

/// Forgets every neighbour, so the next packet needs neighbour discovery (ARP, IPv6 ND)
/// through the ruleset in force.
fn forget_neighbours(namespaces: &[&NetnsGuard]) {
    for ns in namespaces {
        ns.ip(&["neigh", "flush", "all"]);
        ns.ip(&["-6", "neigh", "flush", "all"]);
    }
}

#[test]
fn a_pods_traffic_to_its_own_node_meets_its_egress_policy() {
    if !require_root("a_pods_traffic_to_its_own_node_meets_its_egress_policy") {
        return;
    }
    let node = Node::new("host");
    node.ns.ip(&["addr", "add", &format!("{NODE_V4}/32"), "dev", "uplink"]);
    node.ns.ip(&["-6", "addr", "add", &format!("{NODE_V6}/128"), "dev", "uplink", "nodad"]);
    let (s, a, b) = cluster(DENY);
    // Wired as flock-cni wired pods before it turned ARP off, so that neighbour discovery
    // crosses the ruleset (what it wires now needs none: its neighbours are permanent).
    let pa = node.add_pod_learning_neighbours("a", &LocalEndpoint::for_pod(&a).interface, &a.ips);
    let pb = node.add_pod_learning_neighbours("b", &LocalEndpoint::for_pod(&b).interface, &b.ips);
    // The node's services (a kubelet) on every address, and a's server (what probes reach).
    let _node_servers = Servers::start(node.ns.netns(), vec![(10250, Protocol::Tcp), (10250, Protocol::Udp)]).unwrap();
    let _a_servers = Servers::start(pa.ns.netns(), vec![(80, Protocol::Tcp)]).unwrap();

    // Before flock's table: everything connects (the test's own plumbing works).
    let (tcp, udp) = (Protocol::Tcp, Protocol::Udp);
    let all = [
        (&pa.ns, NODE_V4, 10250, tcp),
        (&pa.ns, NODE_V6, 10250, tcp),
        (&pa.ns, NODE_V4, 10250, udp),
        (&pb.ns, NODE_V4, 10250, tcp),
        (&node.ns, "198.18.10.1", 80, tcp),
    ];
    assert_eq!(probe(&all), [true; 5], "without flock's table");

    // a isolated: it reaches nothing on its node, either family, either protocol; b, not
    // isolated, does; the node still reaches a (a kubelet probe: not policed) though a's
    // ingress is isolated.
    apply(&node, &s);
    forget_neighbours(&[&node.ns, &pa.ns, &pb.ns]);
    assert_eq!(probe(&all), [false, false, false, true, true], "a under deny-all");

    // a allowed TCP 10250 to the node's addresses: that opens, UDP stays closed. IPv6 needs
    // neighbour discovery of the gateway (fe80::1) through the ruleset first.
    let (allowed, _, _) = cluster(ALLOW_KUBELET);
    apply(&node, &allowed);
    forget_neighbours(&[&node.ns, &pa.ns, &pb.ns]);
    assert_eq!(probe(&all), [true, true, false, true, true], "a allowed TCP 10250 to its node");

    // A spoofed source to the node is dropped, from a pod whose egress is otherwise open.
    pb.ns.ip(&["addr", "add", "198.18.10.9/32", "dev", "eth0"]);
    let spoofed = pb.ns.try_exec(&["ping", "-c", "1", "-W", "1", "-I", "198.18.10.9", NODE_V4]);
    assert!(!spoofed.status.success(), "a spoofed source reached the node");
    assert!(pb.ns.try_exec(&["ping", "-c", "1", "-W", "1", NODE_V4]).status.success(), "b's own address reaches the node");
}

/// The attack over IPv6: a pod under egress deny-all floods its node with neighbour
/// solicitations from forged global sources, from link-local ones with a hop limit that
/// crossed a router or that are not the pod's own link-local address (the one flock-cni gives
/// it), and router solicitations from forged link-local ones (a node that forwards records
/// each source), then floods from the pod's own address past its rate. Without flock's table
/// each forged source becomes a neighbour entry of the node
/// (checked first, so the test can fail); with it none does, and the pod still finds its
/// gateway and reaches what its policy allows. The pod is wired as flock-cni wired pods
/// before it turned ARP off on the host side: for those attachments the ruleset is the
/// defence. What flock-cni wires now learns no neighbour from a pod at all, ARP included
/// (`cni-plugin/tests/kernel.rs`).
#[test]
fn forged_neighbour_solicitations_teach_the_node_nothing() {
    if !require_root("forged_neighbour_solicitations_teach_the_node_nothing") {
        return;
    }
    let node = Node::new("nd");
    node.ns.ip(&["addr", "add", &format!("{NODE_V4}/32"), "dev", "uplink"]);
    node.ns.ip(&["-6", "addr", "add", &format!("{NODE_V6}/128"), "dev", "uplink", "nodad"]);
    let (s, a, _) = cluster(DENY);
    let iface = LocalEndpoint::for_pod(&a).interface;
    let pa = node.add_pod_learning_neighbours("a", &iface, &a.ips);
    let forged = ["2001:db8:ee::", "fe80::ee", "fe80::dd", "fe80::cc"];

    // Without flock's table, the flood is learnt.
    forge_neighbour_requests(&pa.ns, Forged::Solicitation { prefix: "2001:db8:ee::", hop: 255 }, 20);
    forge_neighbour_requests(&pa.ns, Forged::Solicitation { prefix: "fe80::ee00", hop: 64 }, 20);
    forge_neighbour_requests(&pa.ns, Forged::RouterSolicitation { prefix: "fe80::dd00" }, 20);
    forge_neighbour_requests(&pa.ns, Forged::Solicitation { prefix: "fe80::cc00", hop: 255 }, 20);
    let learnt = neighbours_of(&node.ns, &iface, &forged);
    assert!(learnt.len() >= 20, "the attack did not work without flock: {learnt:?}");
    assert!(learnt.iter().any(|n| n.starts_with("fe80::cc")), "forged link-local solicitations were not learnt without flock: {learnt:?}");
    assert!(learnt.iter().any(|n| n.starts_with("fe80::dd")), "router solicitations were not learnt without flock: {learnt:?}");
    forget_neighbours(&[&node.ns]);

    // With flock's table (a under egress deny-all).
    apply(&node, &s);
    forge_neighbour_requests(&pa.ns, Forged::Solicitation { prefix: "2001:db8:ee::", hop: 255 }, 200);
    forge_neighbour_requests(&pa.ns, Forged::Solicitation { prefix: "fe80::ee00", hop: 64 }, 200);
    forge_neighbour_requests(&pa.ns, Forged::RouterSolicitation { prefix: "fe80::dd00" }, 200);
    // Link-local sources as RFC 4861 sends them (hop limit 255), but not the pod's own.
    forge_neighbour_requests(&pa.ns, Forged::Solicitation { prefix: "fe80::cc00", hop: 255 }, 200);
    std::thread::sleep(Duration::from_millis(200));
    let learnt = neighbours_of(&node.ns, &iface, &forged);
    assert!(learnt.is_empty(), "forged sources became neighbour entries: {learnt:?}");
    // From the pod's own address (which the source check passes), a flood past the rate:
    // the burst is taken, the rest dropped and counted.
    forge_neighbour_requests(&pa.ns, Forged::SolicitationsFrom { source: "2001:db8:10::1" }, 300);
    let listing = String::from_utf8_lossy(&node.ns.exec(&["nft", "list", "chain", "inet", "flock", "to-node"]).stdout).into_owned();
    let dropped: u64 = listing
        .lines()
        .find(|l| l.contains("nd-neighbor-solicit") && l.contains("past its rate"))
        .and_then(|l| l.split("counter packets ").nth(1)?.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no counted rate rule in to-node:\n{listing}"));
    assert!(dropped >= 200, "{dropped} of 300 solicitations past the rate dropped:\n{listing}");

    // The pod still finds its gateway (ND for fe80::1) and reaches what its policy allows:
    // under deny-all nothing, so allow TCP 10250 to the node.
    let _node_servers = Servers::start(node.ns.netns(), vec![(10250, Protocol::Tcp)]).unwrap();
    let (allowed, _, _) = cluster(ALLOW_KUBELET);
    apply(&node, &allowed);
    forget_neighbours(&[&node.ns, &pa.ns]);
    assert_eq!(probe(&[(&pa.ns, NODE_V6, 10250, Protocol::Tcp)]), [true], "a lost its IPv6 gateway");
    let gw = String::from_utf8_lossy(&pa.ns.ip(&["-6", "neigh", "show", "fe80::1"]).stdout).into_owned();
    assert!(gw.contains("lladdr"), "a did not resolve fe80::1: {gw}");
}
