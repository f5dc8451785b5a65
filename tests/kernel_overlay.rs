//! The VXLAN overlay against the real kernel (root only): two nodes on different subnets
//! behind a router namespace (a routed underlay, where host-gw cannot reach the other node),
//! each with a pod; flock's route programmer ([`flock::agent::routes::Router`]) makes the
//! devices, neighbour and forwarding entries and routes, and the pods reach each other over
//! IPv4 and IPv6, with full-size packets. host-gw on the same underlay fails, by route.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use flock::agent::routes::{Peers, Router, Routing, RoutingConfig, VxlanConfig, vtep_mac};
use flock::testkit::kernel::{NetnsGuard, Node, Pod, require_root, run};

struct Underlay {
    _router: NetnsGuard,
    nodes: [Node; 2],
    pods: [Pod; 2],
}

/// Node i on 198.18.5i.0/24 and 2001:db8:5i::/64 behind the router; pod i in 198.18.15i.0/24
/// and 2001:db8:15i::/64, its host interface `flk00000000000i` (a pod interface to flock's
/// table).
fn underlay(tag: &str) -> Underlay {
    let router = NetnsGuard::new(&format!("{tag}r"));
    router.sysctl("net.ipv4.ip_forward", "1");
    router.sysctl("net.ipv6.conf.all.forwarding", "1");
    let nodes = [Node::new(&format!("{tag}a")), Node::new(&format!("{tag}b"))];
    for (i, n) in nodes.iter().enumerate() {
        let port = format!("r{i}");
        run(&["ip", "-n", &router.name, "link", "add", &port, "type", "veth", "peer", "name", "wan", "netns", &n.ns.name]);
        router.sysctl(&format!("net.ipv6.conf.{port}.accept_dad"), "0");
        n.ns.sysctl("net.ipv6.conf.wan.accept_dad", "0");
        router.ip(&["addr", "add", &format!("198.18.5{i}.254/24"), "dev", &port]);
        router.ip(&["-6", "addr", "add", &format!("2001:db8:5{i}::fe/64"), "dev", &port, "nodad"]);
        router.ip(&["link", "set", &port, "up"]);
        n.ns.ip(&["addr", "add", &format!("198.18.5{i}.1/24"), "dev", "wan"]);
        n.ns.ip(&["-6", "addr", "add", &format!("2001:db8:5{i}::1/64"), "dev", "wan", "nodad"]);
        n.ns.ip(&["link", "set", "wan", "up"]);
        n.ns.ip(&["route", "replace", "default", "via", &format!("198.18.5{i}.254"), "dev", "wan"]);
        n.ns.ip(&["-6", "route", "replace", "default", "via", &format!("2001:db8:5{i}::fe"), "dev", "wan"]);
    }
    let pods = [0, 1].map(|i| {
        nodes[i].add_pod(
            &format!("{tag}p{i}"),
            &format!("flk00000000000{i}"),
            &[format!("198.18.15{i}.2").parse().unwrap(), format!("2001:db8:15{i}::2").parse().unwrap()],
        )
    });
    Underlay { _router: router, nodes, pods }
}

fn peers(of: usize) -> Peers {
    let node = |i: usize| -> (String, Vec<IpAddr>, Vec<ipnet::IpNet>) {
        (
            format!("node-{i}"),
            vec![format!("198.18.5{i}.1").parse().unwrap(), format!("2001:db8:5{i}::1").parse().unwrap()],
            vec![format!("198.18.15{i}.0/24").parse().unwrap(), format!("2001:db8:15{i}::/64").parse().unwrap()],
        )
    };
    Peers { own: node(of).1, others: vec![node(1 - of)] }
}

/// Fragments created and reassemblies asked for in `ns`, IPv4 and IPv6.
fn fragments(ns: &NetnsGuard) -> u64 {
    let mut total = 0;
    for file in ["/proc/net/snmp", "/proc/net/snmp6"] {
        let text = String::from_utf8(ns.exec(&["cat", file]).stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        // snmp: a header line of names, then a line of values; snmp6: "name value" lines.
        for pair in lines.windows(2) {
            if pair[0].starts_with("Ip: ") && pair[1].starts_with("Ip: ") {
                for (k, v) in pair[0].split_whitespace().zip(pair[1].split_whitespace()) {
                    if k == "FragCreates" || k == "ReasmReqds" {
                        total += v.parse::<u64>().unwrap();
                    }
                }
            }
        }
        for l in &lines {
            let mut w = l.split_whitespace();
            if let (Some(k), Some(v)) = (w.next(), w.next())
                && (k == "Ip6FragCreates" || k == "Ip6ReasmReqds")
            {
                total += v.parse::<u64>().unwrap();
            }
        }
    }
    total
}

/// A TCP exchange of `size` bytes each way from `from` to `to` (port 9000 served in `to`).
fn exchange(from: &Pod, to: &Pod, dst: IpAddr, size: usize) -> Result<(), String> {
    exchange_from(&from.ns, to, dst, size).map(|_| ())
}

/// [`exchange`] from any namespace; the source address the server saw.
fn exchange_from(from: &NetnsGuard, to: &Pod, dst: IpAddr, size: usize) -> Result<IpAddr, String> {
    let listener =
        flock_cni::netns::run_in(&to.ns.netns(), || TcpListener::bind(SocketAddr::new(dst, 9000))).unwrap().map_err(|e| e.to_string())?;
    let server = std::thread::spawn(move || -> std::io::Result<IpAddr> {
        let (mut c, peer) = listener.accept()?;
        c.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut buf = vec![0u8; size];
        c.read_exact(&mut buf)?;
        c.write_all(&buf)?;
        Ok(peer.ip())
    });
    let client = flock_cni::netns::run_in(&from.netns(), || -> std::io::Result<()> {
        let mut c = TcpStream::connect_timeout(&SocketAddr::new(dst, 9000), Duration::from_secs(3))?;
        c.set_read_timeout(Some(Duration::from_secs(5)))?;
        let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        c.write_all(&data)?;
        let mut back = vec![0u8; size];
        c.read_exact(&mut back)?;
        if back != data {
            return Err(std::io::Error::other("the echo differs"));
        }
        Ok(())
    })
    .unwrap();
    // A failed client leaves the server waiting on accept: it is not joined then.
    client.map_err(|e| format!("client: {e}"))?;
    server.join().unwrap().map_err(|e| format!("server: {e}"))
}

#[test]
fn pods_on_a_routed_underlay_reach_each_other_over_vxlan_and_not_over_host_gw() {
    if !require_root("pods_on_a_routed_underlay_reach_each_other_over_vxlan_and_not_over_host_gw") {
        return;
    }
    let u = underlay("ovl");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let start = |i: usize, routing| Router::start(u.nodes[i].ns.netns(), RoutingConfig { routing, vxlan: VxlanConfig::default() }).unwrap();

    // host-gw: the other node is off-link, so its pod CIDR's route cannot be made.
    let r = start(0, Routing::HostGw);
    let err = rt.block_on(r.sync(peers(0))).unwrap_err().to_string();
    assert!(err.contains("198.18.151.0/24 via 198.18.51.1"), "{err}");
    drop(r);

    for routing in [Routing::Vxlan, Routing::Auto] {
        let routers = [start(0, routing), start(1, routing)];
        for (i, r) in routers.iter().enumerate() {
            let c = rt.block_on(r.sync(peers(i))).unwrap_or_else(|e| panic!("{routing}: node {i}: {e}"));
            assert!(c.unreachable.is_empty(), "{c:?}");
            // Level-triggered: nothing to do the second time.
            let again = rt.block_on(r.sync(peers(i))).unwrap();
            if (again.added, again.removed) != (0, 0) {
                let ns = &u.nodes[i].ns;
                let show = |a: &[&str]| String::from_utf8_lossy(&ns.exec(a).stdout).into_owned();
                panic!(
                    "{routing}: node {i} changed again: {again:?}\n{}{}{}{}{}",
                    show(&["ip", "neigh", "show", "nud", "permanent"]),
                    show(&["ip", "-6", "neigh", "show", "nud", "permanent"]),
                    show(&["bridge", "fdb", "show"]),
                    show(&["ip", "route", "show", "proto", "70"]),
                    show(&["ip", "-6", "route", "show", "proto", "70"]),
                );
            }
        }
        let dev = String::from_utf8(u.nodes[0].ns.exec(&["ip", "-d", "link", "show", "flock.vxlan"]).stdout).unwrap();
        assert!(dev.contains("vxlan id 1") && dev.contains("dstport 4789") && dev.contains("nolearning"), "{dev}");
        assert!(dev.contains("mtu 1450"), "{dev}");
        let dev6 = String::from_utf8(u.nodes[0].ns.exec(&["ip", "-d", "link", "show", "flock.vxlan6"]).stdout).unwrap();
        assert!(dev6.contains("mtu 1430"), "{dev6}");
        // The pods' MTU the agent writes into the CNI config: the underlay's less the
        // encapsulation (dual stack: the IPv6 underlay's 70 bytes).
        let mtu = flock_cni::netns::run_in(&u.nodes[0].ns.netns(), || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(flock::agent::routes::overlay_pod_mtu(&peers(0).own, routing))
        })
        .unwrap()
        .unwrap();
        assert_eq!(mtu, Some(1430));
        for (i, p) in u.pods.iter().enumerate() {
            p.ns.ip(&["link", "set", "eth0", "mtu", "1430"]);
            u.nodes[i].ns.ip(&["link", "set", &format!("flk00000000000{i}"), "mtu", "1430"]);
        }
        // Both families, both ways, full-size segments (1,390 and 1,370 bytes of TCP payload),
        // and nothing fragmented anywhere on the way.
        let frags = || -> Vec<u64> { u.nodes.iter().map(|n| fragments(&n.ns)).chain([fragments(&u._router)]).collect() };
        let before = frags();
        for (a, b) in [(0, 1), (1, 0)] {
            for dst in u.pods[b].ips.clone() {
                exchange(&u.pods[a], &u.pods[b], dst, 64 * 1024).unwrap_or_else(|e| panic!("{routing}: pod {a} to {dst}: {e}"));
            }
        }
        assert_eq!(frags(), before, "{routing}: packets were fragmented or reassembled");
        drop(routers);
        // Another device name: the device made under the old one goes (it is marked).
        let renamed = Router::start(
            u.nodes[0].ns.netns(),
            RoutingConfig { routing, vxlan: VxlanConfig { device: "flock.vx2".into(), ..VxlanConfig::default() } },
        )
        .unwrap();
        rt.block_on(renamed.sync(peers(0))).unwrap();
        assert!(!u.nodes[0].ns.try_exec(&["ip", "link", "show", "flock.vxlan"]).status.success(), "{routing}: the old device stayed");
        let alias = String::from_utf8(u.nodes[0].ns.exec(&["ip", "-d", "link", "show", "flock.vx2"]).stdout).unwrap();
        assert!(alias.contains("alias flock overlay"), "{alias}");
        drop(renamed);
        // An agent without the overlay removes every device of flock's before anything else.
        let gone = rt.block_on(flock::agent::routes::remove_overlay(&u.nodes[0].ns.netns())).unwrap();
        assert_eq!(gone, 2, "{routing}: flock.vx2 and flock.vx26");
        let _ = rt
            .block_on(
                Router::start(u.nodes[0].ns.netns(), RoutingConfig { routing, vxlan: VxlanConfig::default() }).unwrap().sync(peers(0)),
            )
            .unwrap();
        // Going back to host-gw removes the devices (and with them their entries and routes).
        let r = start(0, Routing::HostGw);
        let _ = rt.block_on(r.sync(Peers { own: peers(0).own, others: vec![] })).unwrap();
        assert!(!u.nodes[0].ns.try_exec(&["ip", "link", "show", "flock.vxlan"]).status.success());
        let r1 = start(1, Routing::HostGw);
        let _ = rt.block_on(r1.sync(Peers { own: peers(1).own, others: vec![] })).unwrap();
    }
}

/// The path MTU `ip route get` reports from `pod` to `dst` (none when nothing was learned).
fn learned_mtu(pod: &Pod, dst: IpAddr) -> Option<u32> {
    let fam = if dst.is_ipv6() { "-6" } else { "-4" };
    let out = String::from_utf8(pod.ns.exec(&["ip", fam, "route", "get", &dst.to_string()]).stdout).unwrap();
    let mut words = out.split_whitespace();
    words.find(|w| *w == "mtu").and_then(|_| words.next()).and_then(|m| m.parse().ok())
}

#[test]
fn a_smaller_mtu_on_the_underlay_path_reaches_the_sender() {
    if !require_root("a_smaller_mtu_on_the_underlay_path_reaches_the_sender") {
        return;
    }
    // Node 1's link, both ends, is 1,400 bytes: a full-size frame of node 0's (its link is
    // 1,500) does not fit on the last hop.
    let u = underlay("ovm");
    u._router.ip(&["link", "set", "r1", "mtu", "1400"]);
    u.nodes[1].ns.ip(&["link", "set", "wan", "mtu", "1400"]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let routers = [0, 1]
        .map(|i| Router::start(u.nodes[i].ns.netns(), RoutingConfig { routing: Routing::Vxlan, vxlan: VxlanConfig::default() }).unwrap());
    for (i, r) in routers.iter().enumerate() {
        rt.block_on(r.sync(peers(i))).unwrap();
    }
    let dev = String::from_utf8(u.nodes[1].ns.exec(&["ip", "-d", "link", "show", "flock.vxlan6"]).stdout).unwrap();
    assert!(dev.contains("mtu 1330"), "node 1's device follows its link: {dev}");
    // Both pods at node 0's MTU, so TCP's segments (MSS 1,370 and 1,390) do not fit the path.
    for (i, p) in u.pods.iter().enumerate() {
        p.ns.ip(&["link", "set", "eth0", "mtu", "1430"]);
        u.nodes[i].ns.ip(&["link", "set", &format!("flk00000000000{i}"), "mtu", "1430"]);
    }
    for (a, b) in [(0, 1), (1, 0)] {
        assert_eq!(learned_mtu(&u.pods[a], u.pods[b].ips[1]), None, "pod {a} knows a path MTU before sending");
    }
    // An exchange echoes: each pod sends full-size segments both ways.
    for (a, b) in [(0, 1), (1, 0)] {
        for dst in u.pods[b].ips.clone() {
            exchange(&u.pods[a], &u.pods[b], dst, 64 * 1024).unwrap_or_else(|e| panic!("pod {a} to {dst}: {e}"));
        }
    }
    // IPv6: the router's "packet too big" reached node 0, whose device told pod 0 (the
    // overlay's 70 bytes less than the 1,400 hop); node 1 told pod 1 from its own device's
    // MTU. (IPv4's outer packets may be fragmented on the way: VXLAN sends them without DF.)
    assert_eq!(learned_mtu(&u.pods[0], u.pods[1].ips[1]), Some(1330), "pod 0 did not learn the path's MTU");
    assert_eq!(learned_mtu(&u.pods[1], u.pods[0].ips[1]), Some(1330), "pod 1 did not learn its node's device MTU");
}

/// The Internet checksum of `data`.
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A VXLAN frame (VNI 1) carrying a UDP datagram from `src` to `dst`:9999 (IPv4 or IPv6),
/// addressed to the VTEP MAC of `to_node`, as if from that of `from_node`.
fn forged_vxlan(from_node: IpAddr, to_node: IpAddr, src: IpAddr, dst: IpAddr, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x08, 0, 0, 0, 0, 0, 1, 0];
    f.extend(vtep_mac(to_node));
    f.extend(vtep_mac(from_node));
    let udp_len = (8 + payload.len()) as u16;
    let mut udp = vec![0x15, 0xb3, 0x27, 0x0f];
    udp.extend(udp_len.to_be_bytes());
    udp.extend([0, 0]);
    udp.extend(payload);
    match (src, dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            f.extend([0x08, 0x00]);
            let total = 20 + udp_len;
            let mut ip = vec![0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0x40, 0, 64, 17, 0, 0];
            ip.extend(src.octets());
            ip.extend(dst.octets());
            let sum = checksum(&ip);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            f.extend(ip);
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            f.extend([0x86, 0xdd]);
            // IPv6 makes the UDP checksum mandatory: over a pseudo-header and the datagram.
            let mut pseudo = Vec::new();
            pseudo.extend(src.octets());
            pseudo.extend(dst.octets());
            pseudo.extend(u32::from(udp_len).to_be_bytes());
            pseudo.extend([0, 0, 0, 17]);
            pseudo.extend(&udp);
            let sum = checksum(&pseudo);
            udp[6..8].copy_from_slice(&sum.to_be_bytes());
            f.extend([0x60, 0, 0, 0]);
            f.extend(udp_len.to_be_bytes());
            f.extend([17, 64]);
            f.extend(src.octets());
            f.extend(dst.octets());
        }
        _ => panic!("{src} and {dst} are of different families"),
    }
    f.extend(udp);
    f
}

/// The guard's last counting rule in `ns`'s `overlay-in` chain (what no sender set took).
fn listed_guard(ns: &NetnsGuard) -> String {
    let listed = String::from_utf8(ns.exec(&["nft", "list", "chain", "inet", "flock", "overlay-in"]).stdout).unwrap();
    listed
        .lines()
        .find(|l| l.contains("counter") && l.contains("VXLAN not from a node"))
        .unwrap_or_else(|| panic!("no guard:\n{listed}"))
        .to_string()
}

/// The base cluster with the underlay's nodes (node-1 and node-2 as nodes 0 and 1: their
/// addresses and pod CIDRs) and `extra` pods.
fn overlay_cluster(extra: &[flock::model::Pod]) -> flock::model::Snapshot {
    let mut snap = flock::testkit::base_cluster();
    for (name, i) in [("node-1", 0), ("node-2", 1)] {
        let mut n = snap.node(name).unwrap().clone();
        n.internal_ips = vec![format!("198.18.5{i}.1").parse().unwrap(), format!("2001:db8:5{i}::1").parse().unwrap()];
        n.pod_cidrs = vec![format!("198.18.15{i}.0/24").parse().unwrap(), format!("2001:db8:15{i}::/64").parse().unwrap()];
        snap.upsert_node(n);
    }
    for p in extra {
        snap.upsert_pod(p.clone());
    }
    snap
}

/// The underlay's pods as the cluster's (namespace x, `vx0` on node-1, `vx1` on node-2).
fn overlay_pods() -> [flock::model::Pod; 2] {
    [0, 1].map(|i: usize| flock::model::Pod {
        namespace: "x".into(),
        name: format!("vx{i}"),
        uid: flock::model::derived_uid("x", &format!("vx{i}")),
        labels: Default::default(),
        node: Some(format!("node-{}", i + 1)),
        phase: flock::model::PodPhase::Running,
        ips: vec![format!("198.18.15{i}.2").parse().unwrap(), format!("2001:db8:15{i}::2").parse().unwrap()],
        host_network: false,
        ports: vec![],
        created: None,
        unpublished: false,
    })
}

/// Pod `i`'s endpoint on its node (its host interface as [`underlay`] names it).
fn overlay_endpoint(i: usize, pods: &[flock::model::Pod; 2]) -> flock::model::LocalEndpoint {
    flock::model::LocalEndpoint {
        interface: format!("flk00000000000{i}"),
        container_id: format!("c{i}"),
        pod: flock::model::ObjectRef::new("x", format!("vx{i}")),
        pod_uid: None,
        addrs: pods[i].ips.clone(),
    }
}

/// Applies flock's table for `node` (under the overlay, with `endpoints`) in `ns`.
fn apply_overlay_table(ns: &NetnsGuard, snap: &flock::model::Snapshot, node: &str, endpoints: &[flock::model::LocalEndpoint]) {
    let options =
        flock::translate::Options { overlay_port: Some(4789), overlay_node: Some(node.into()), ..flock::translate::Options::default() };
    let ir = flock::translate::translate(snap, endpoints, &options);
    let text = flock::render::render(&ir).to_text();
    let script = std::env::temp_dir().join(format!("flock-overlay-{}-{node}.nft", std::process::id()));
    std::fs::write(&script, &text).unwrap();
    let out = ns.try_exec(&["nft", "-f", script.to_str().unwrap()]);
    let _ = std::fs::remove_file(&script);
    assert!(out.status.success(), "{}\n{text}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn vxlan_from_a_non_node_or_with_a_forged_inner_source_is_dropped() {
    if !require_root("vxlan_from_a_non_node_or_with_a_forged_inner_source_is_dropped") {
        return;
    }
    // Under `--routing auto` the same: on a routed underlay every peer is reached over VXLAN.
    for (routing, tag) in [(Routing::Vxlan, "ovs"), (Routing::Auto, "ovsa")] {
        forged_inner_sources(routing, tag);
    }
}

fn forged_inner_sources(routing: Routing, tag: &str) {
    let u = underlay(tag);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let routers = [0, 1].map(|i| Router::start(u.nodes[i].ns.netns(), RoutingConfig { routing, vxlan: VxlanConfig::default() }).unwrap());
    for (i, r) in routers.iter().enumerate() {
        rt.block_on(r.sync(peers(i))).unwrap();
    }
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    // Node i's underlay address of a family.
    let node = |i: usize, v6: bool| if v6 { ip(&format!("2001:db8:5{i}::1")) } else { ip(&format!("198.18.5{i}.1")) };
    let (pod0, pod1, pod0_v6, pod1_v6) = (ip("198.18.150.2"), ip("198.18.151.2"), ip("2001:db8:150::2"), ip("2001:db8:151::2"));
    let sink = flock_cni::netns::run_in(&u.pods[1].ns.netns(), || {
        let s = std::net::UdpSocket::bind("[::]:9999").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        s
    })
    .unwrap();
    // A frame carrying a UDP datagram from `src` to pod 1 (of `src`'s family), sent to node 1
    // (of `from`'s family) from `from` in namespace `ns`; what pod 1 received.
    let forge = |ns: &NetnsGuard, from: IpAddr, src: IpAddr, tag: &str| {
        let v6 = from.is_ipv6();
        let dst = if src.is_ipv6() { pod1_v6 } else { pod1 };
        let frame = forged_vxlan(node(0, v6), node(1, v6), src, dst, tag.as_bytes());
        flock_cni::netns::run_in(&ns.netns(), || {
            let s = std::net::UdpSocket::bind(SocketAddr::new(from, 0)).unwrap();
            s.send_to(&frame, SocketAddr::new(node(1, v6), 4789)).unwrap();
        })
        .unwrap();
        let mut buf = [0u8; 64];
        sink.recv(&mut buf).ok().map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    let (router, node0_ns) = (&u._router, &u.nodes[0].ns);
    let (router_v4, router_v6) = (ip("198.18.51.254"), ip("2001:db8:51::fe"));
    let (elsewhere, elsewhere_v6) = (ip("198.18.99.9"), ip("2001:db8:99::9"));
    // The controls: without flock's table the kernel takes every forged frame — from the
    // router's address (not a node), and from node 0 carrying a source that is not its, over
    // both underlays.
    for (ns, from, src) in [
        (router, router_v4, pod0),
        (router, router_v6, pod0_v6),
        (node0_ns, node(0, false), elsewhere),
        (node0_ns, node(0, true), elsewhere_v6),
        (node0_ns, node(0, true), elsewhere),
    ] {
        assert_eq!(
            forge(ns, from, src, "before").as_deref(),
            Some("before"),
            "a frame from {from} carrying {src} does not reach the pod even unguarded: the test proves nothing"
        );
    }
    // flock's table for node 1 under the overlay: the nodes' addresses and pod CIDRs, pod 1
    // its endpoint.
    let pods = overlay_pods();
    let snap = overlay_cluster(&pods);
    apply_overlay_table(&u.nodes[1].ns, &snap, "node-2", &[overlay_endpoint(1, &pods)]);
    for (from, src) in [(router_v4, pod0), (router_v6, pod0_v6)] {
        assert_eq!(forge(router, from, src, "after").as_deref(), None, "VXLAN from non-node {from} reached the pod");
    }
    // From node 0, as node 0's pod, over either underlay and in either inner family: taken
    // (the guard reads the frame right).
    for (v6, src) in [(false, pod0), (true, pod0_v6), (true, pod0), (false, pod0_v6)] {
        assert_eq!(forge(node0_ns, node(0, v6), src, "pod0").as_deref(), Some("pod0"), "node 0's pod's frame ({src}) was dropped");
    }
    // From node 0, as an address that is not node 0's pods': dropped, node 1's own pods too.
    let forged = [
        (false, elsewhere),
        (false, ip("198.18.151.7")),
        (false, node(1, false)),
        (true, elsewhere_v6),
        (true, ip("2001:db8:151::7")),
        (true, elsewhere),
        (false, elsewhere_v6),
    ];
    for (v6, src) in forged {
        assert_eq!(forge(node0_ns, node(0, v6), src, "forged").as_deref(), None, "node 0's frame from {src} reached the pod");
    }
    let guard = listed_guard(&u.nodes[1].ns);
    let want = format!("counter packets {} ", 2 + forged.len());
    assert!(guard.contains(&want), "the spoofed frames were not all counted ({want}): {guard}");
    // Node 0's own packets to pod 1 leave with its InternalIP, whatever other addresses it
    // holds: the route names the source. An address on lo (a service or BGP address) would
    // otherwise be the kernel's choice, and the guard would drop it as spoofed.
    node0_ns.ip(&["addr", "add", "198.18.60.1/32", "dev", "lo"]);
    node0_ns.ip(&["-6", "addr", "add", "2001:db8:100::1/128", "dev", "lo"]);
    for dst in u.pods[1].ips.clone() {
        let seen = exchange_from(node0_ns, &u.pods[1], dst, 4 * 1024).unwrap_or_else(|e| panic!("node 0 to pod 1 ({dst}): {e}"));
        assert_eq!(seen, node(0, dst.is_ipv6()), "node 0's packets to {dst} left with another source");
    }
    assert!(listed_guard(&u.nodes[1].ns).contains(&want), "node 0's own packets were counted as spoofed");
    // The real overlay still works, both ways.
    for (a, b) in [(0, 1), (1, 0)] {
        exchange(&u.pods[a], &u.pods[b], u.pods[b].ips[0], 16 * 1024).unwrap_or_else(|e| panic!("pod {a} to pod {b} under the guard: {e}"));
    }
}

/// The issue's first attack and its variants: VXLAN to an address of node 1 that its Node
/// object does not list (a second NIC, a VIP) — which the kernel decapsulates all the same —
/// from pod 0 through node 0's masquerade (so that it leaves with node 0's address), and from
/// node 0 itself, over IPv4 and IPv6 underlays. Without flock's tables each reaches pod 1
/// (checked first, so the test can fail); with them none does: node 0 drops its pod's VXLAN
/// to an address that is not a pod's, node 1 takes VXLAN only at its VXLAN device's address.
/// Pod to pod on the VXLAN port still works, and so does the overlay.
#[test]
fn vxlan_to_an_address_the_device_does_not_receive_on_is_dropped() {
    if !require_root("vxlan_to_an_address_the_device_does_not_receive_on_is_dropped") {
        return;
    }
    // Under `--routing auto` the same: on a routed underlay every peer is reached over VXLAN.
    for (routing, tag) in [(Routing::Vxlan, "ovd"), (Routing::Auto, "ovda")] {
        unreceived_addresses(routing, tag);
    }
}

fn unreceived_addresses(routing: Routing, tag: &str) {
    let u = underlay(tag);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let routers = [0, 1].map(|i| Router::start(u.nodes[i].ns.netns(), RoutingConfig { routing, vxlan: VxlanConfig::default() }).unwrap());
    for (i, r) in routers.iter().enumerate() {
        rt.block_on(r.sync(peers(i))).unwrap();
    }
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    let node = |i: usize, v6: bool| if v6 { ip(&format!("2001:db8:5{i}::1")) } else { ip(&format!("198.18.5{i}.1")) };
    let (pod0, pod1, pod0_v6, pod1_v6) = (ip("198.18.150.2"), ip("198.18.151.2"), ip("2001:db8:150::2"), ip("2001:db8:151::2"));
    // Node 1's addresses that no Node object lists, routed to it by the underlay.
    let (unlisted, unlisted_v6) = (ip("198.18.61.1"), ip("2001:db8:61::1"));
    u.nodes[1].ns.ip(&["addr", "add", "198.18.61.1/32", "dev", "lo"]);
    u.nodes[1].ns.ip(&["-6", "addr", "add", "2001:db8:61::1/128", "dev", "lo"]);
    u._router.ip(&["route", "add", "198.18.61.1/32", "via", "198.18.51.1"]);
    u._router.ip(&["-6", "route", "add", "2001:db8:61::1/128", "via", "2001:db8:51::1"]);
    // Node 0 masquerades what its pods send out of its uplink (Calico's natOutgoing,
    // ip-masq-agent): a table of the test's own, beside flock's.
    let nat = "table inet t58nat {\n chain post {\n  type nat hook postrouting priority srcnat; policy accept;\n  oifname \"wan\" masquerade\n }\n}\n";
    let nat_file = std::env::temp_dir().join(format!("flock-overlay-nat-{}.nft", std::process::id()));
    std::fs::write(&nat_file, nat).unwrap();
    let out = u.nodes[0].ns.try_exec(&["nft", "-f", nat_file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&nat_file);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let sink = flock_cni::netns::run_in(&u.pods[1].ns.netns(), || {
        let s = std::net::UdpSocket::bind("[::]:9999").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        s
    })
    .unwrap();
    // A frame carrying pod 0's datagram to pod 1, sent from namespace `ns` to `to`:4789; what
    // pod 1 received.
    let forge = |ns: &NetnsGuard, to: IpAddr, v6_inner: bool, tag: &str| {
        let v6 = to.is_ipv6();
        let (src, dst) = if v6_inner { (pod0_v6, pod1_v6) } else { (pod0, pod1) };
        let frame = forged_vxlan(node(0, v6), node(1, v6), src, dst, tag.as_bytes());
        flock_cni::netns::run_in(&ns.netns(), || {
            let s = std::net::UdpSocket::bind(SocketAddr::new(if v6 { ip("::") } else { ip("0.0.0.0") }, 0)).unwrap();
            s.send_to(&frame, SocketAddr::new(to, 4789)).unwrap();
        })
        .unwrap();
        let mut buf = [0u8; 64];
        sink.recv(&mut buf).ok().map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    let (pod0_ns, node0_ns) = (&u.pods[0].ns, &u.nodes[0].ns);
    let attacks = [(pod0_ns, unlisted, false), (pod0_ns, unlisted_v6, true), (node0_ns, unlisted, false), (node0_ns, unlisted_v6, true)];
    // The controls: without flock's tables every one reaches pod 1.
    for (ns, to, v6_inner) in attacks {
        assert_eq!(
            forge(ns, to, v6_inner, "before").as_deref(),
            Some("before"),
            "a frame to {to} from {} does not reach pod 1 even unguarded: the test proves nothing",
            ns.name
        );
    }

    // flock's tables: node 0's with pod 0 as its endpoint (no policy: its egress is open),
    // node 1's.
    let (pods, endpoint) = (overlay_pods(), overlay_endpoint);
    let snap = overlay_cluster(&pods);
    apply_overlay_table(node0_ns, &snap, "node-1", &[endpoint(0, &pods)]);
    apply_overlay_table(&u.nodes[1].ns, &snap, "node-2", &[endpoint(1, &pods)]);
    for (ns, to, v6_inner) in attacks {
        assert_eq!(forge(ns, to, v6_inner, "after").as_deref(), None, "a frame to {to} from {} reached pod 1", ns.name);
    }
    // Node 0's own frames to node 1's InternalIPs carrying its pod's packets, both underlays
    // and both inner families: taken (the device's address is the one allowed).
    for (v6, v6_inner) in [(false, false), (true, true), (false, true), (true, false)] {
        assert_eq!(forge(node0_ns, node(1, v6), v6_inner, "pod0").as_deref(), Some("pod0"), "node 0's frame to node 1 was dropped");
    }
    // Which rules dropped them: node 0's from-pods (the pod's, before masquerade), node 1's
    // destination check (node 0's own).
    let listed =
        |ns: &NetnsGuard, chain: &str| String::from_utf8(ns.exec(&["nft", "list", "chain", "inet", "flock", chain]).stdout).unwrap();
    let from_pods = listed(node0_ns, "from-pods");
    for fam in ["ip daddr", "ip6 daddr"] {
        let rule = from_pods.lines().find(|l| l.contains(&format!("{fam} != @overlay-pod-cidrs"))).unwrap_or_else(|| panic!("{from_pods}"));
        assert!(rule.contains("counter packets 1 "), "{rule}");
    }
    let overlay_in = listed(&u.nodes[1].ns, "overlay-in");
    for fam in ["ip daddr", "ip6 daddr"] {
        let rule = overlay_in.lines().find(|l| l.contains(&format!("{fam} != @overlay-local"))).unwrap_or_else(|| panic!("{overlay_in}"));
        assert!(rule.contains("counter packets 1 "), "{rule}");
    }

    // Pod to pod on the VXLAN port is left to policy (none here: it connects), both families.
    for dst in [pod1, pod1_v6] {
        let listener = flock_cni::netns::run_in(&u.pods[1].ns.netns(), || {
            let s = std::net::UdpSocket::bind(SocketAddr::new(dst, 4789)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            s
        })
        .unwrap();
        flock_cni::netns::run_in(&u.pods[0].ns.netns(), || {
            let s = std::net::UdpSocket::bind(SocketAddr::new(if dst.is_ipv6() { pod0_v6 } else { pod0 }, 0)).unwrap();
            s.send_to(b"pod-to-pod", SocketAddr::new(dst, 4789)).unwrap();
        })
        .unwrap();
        let mut buf = [0u8; 32];
        let got = listener.recv(&mut buf).map(|n| buf[..n].to_vec());
        assert_eq!(got.ok().as_deref(), Some(&b"pod-to-pod"[..]), "pod 0's UDP to {dst}:4789 was dropped");
    }
    for (a, b) in [(0, 1), (1, 0)] {
        exchange(&u.pods[a], &u.pods[b], u.pods[b].ips[1], 16 * 1024)
            .unwrap_or_else(|e| panic!("pod {a} to pod {b} under the tables: {e}"));
    }
}

#[test]
fn the_overlay_refuses_to_start_over_a_device_flock_does_not_own() {
    if !require_root("the_overlay_refuses_to_start_over_a_device_flock_does_not_own") {
        return;
    }
    let u = underlay("ovc");
    let ns = &u.nodes[0].ns;
    let start = |routing, vxlan: VxlanConfig| Router::start(ns.netns(), RoutingConfig { routing, vxlan });
    let refused = |routing, vxlan: VxlanConfig| match start(routing, vxlan) {
        Ok(_) => panic!("{routing}: the overlay started"),
        Err(e) => e.to_string(),
    };
    // Another component's VXLAN device on the same port: with the same VNI, then receiving
    // every VNI (`external`, as Cilium's).
    ns.ip(&["link", "add", "other0", "type", "vxlan", "id", "1", "dstport", "4789", "local", "198.18.50.1"]);
    for routing in [Routing::Vxlan, Routing::Auto] {
        let e = refused(routing, VxlanConfig::default());
        assert!(e.contains("other0") && e.contains("VNI 1 on UDP port 4789"), "{e}");
    }
    // Another VNI on another port: no clash.
    drop(start(Routing::Vxlan, VxlanConfig { vni: 2, ..VxlanConfig::default() }).unwrap());
    drop(start(Routing::Vxlan, VxlanConfig { port: 4790, ..VxlanConfig::default() }).unwrap());
    ns.ip(&["link", "del", "other0"]);
    ns.ip(&["link", "add", "other1", "type", "vxlan", "external", "dstport", "4789"]);
    let e = refused(Routing::Vxlan, VxlanConfig::default());
    assert!(e.contains("other1") && e.contains("every VNI"), "{e}");
    ns.ip(&["link", "del", "other1"]);
    // A device of flock's name that is not flock's: refused, and left as it was — also by a
    // host-gw agent, which removes only flock's marked devices.
    ns.ip(&["link", "add", "flock.vxlan", "type", "bridge"]);
    let e = refused(Routing::Vxlan, VxlanConfig::default());
    assert!(e.contains("flock.vxlan") && e.contains("not flock's"), "{e}");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let r = start(Routing::HostGw, VxlanConfig::default()).unwrap();
    rt.block_on(r.sync(Peers { own: peers(0).own, others: vec![] })).unwrap();
    assert_eq!(rt.block_on(flock::agent::routes::remove_overlay(&ns.netns())).unwrap(), 0);
    let still = String::from_utf8(ns.exec(&["ip", "-d", "link", "show", "flock.vxlan"]).stdout).unwrap();
    assert!(still.contains("bridge"), "{still}");
}
