//! `flockctl bench --dataplane`, the overlay: a pod on one node to a pod on another, over
//! host-gw and over VXLAN in the same run, as new TCP connections per second and as one bulk
//! TCP stream's throughput.
//!
//! Twins, as for the scenarios of [`crate::dataplane`]: per routing mode two node namespaces
//! on one veth "underlay" (one subnet, 1,500-byte MTU, so both modes can cross it), a client
//! pod on the first and a server pod on the second, wired as flock-cni wires pods (the host
//! side named as the agent's maps name it), each node with flock's table for the same
//! snapshot applied — under VXLAN with its overlay guard — and its routes, devices, neighbour
//! and forwarding entries programmed by the agent's own route programmer
//! ([`flock::agent::routes::Router`]). Pods get the MTU the agent gives them: the link's
//! under host-gw, less the encapsulation under VXLAN. The two modes take turns in short slices
//! (ABBA…), so what else runs on the machine hits both alike; a round's ratio is VXLAN /
//! host-gw of that round.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

use flock::agent::routes::{Peers, Router, Routing, RoutingConfig, VXLAN_OVERHEAD_V4, VxlanConfig};
use flock::apply::Applier;
use flock::apply::kernel::NftCli;
use flock::model::{ContainerPort, LabelSelector, Labels, Namespace, NetworkPolicy, Node, PolicyPeer, Protocol, Snapshot};
use flock::netns::Netns;
use flock::render::{self, RenderOptions};
use flock::sim::fabric::run as sh;
use flock::translate::{self, Options};
use flock_cni::testing::NetnsGuard;

use crate::twins::{
    CONNECT_TIMEOUT, CT_TIMEOUTS, Load, NS, PORT, SLICE, Server, WARM_UP, load, netns, path, pod, probe, server_policy, spread, sysctl,
};

/// The bulk stream's port (the server's second listener; the policy allows it too).
const BULK_PORT: u16 = PORT + 1;
/// The underlay's MTU.
const LINK_MTU: u32 = 1500;
/// Node i's underlay address and pod CIDR; the client is a pod of node 0, the server of node 1.
const NODES: [(&str, Ipv4Addr, &str); 2] =
    [("node-a", Ipv4Addr::new(198, 18, 60, 1), "198.18.160.0/24"), ("node-b", Ipv4Addr::new(198, 18, 60, 2), "198.18.161.0/24")];
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 160, 2);
const SERVER: Ipv4Addr = Ipv4Addr::new(198, 18, 161, 10);
/// MACs of the pods' veth ends (static neighbours): host side, pod side.
const MACS: [(&str, &str); 2] = [("02:66:6c:6b:01:01", "02:66:6c:6b:01:02"), ("02:66:6c:6b:01:03", "02:66:6c:6b:01:04")];

/// The cluster both twins enforce: the two nodes, the client and server pods, and a policy
/// admitting the client to the server's two ports.
fn snapshot() -> Snapshot {
    let mut s = Snapshot::new();
    let mut labels = Labels::new();
    labels.insert(flock::model::convert::NAMESPACE_NAME_LABEL, NS);
    s.upsert_namespace(Namespace { name: NS.into(), labels, ..Namespace::default() });
    for (name, ip, cidr) in NODES {
        let mut labels = Labels::new();
        labels.insert("kubernetes.io/hostname", name);
        s.upsert_node(Node {
            name: name.into(),
            pod_cidrs: cidr.parse().into_iter().collect(),
            internal_ips: vec![IpAddr::V4(ip)],
            addresses: vec![IpAddr::V4(ip)],
            labels,
        });
    }
    let tcp = |port| ContainerPort { name: None, port, protocol: Protocol::Tcp };
    for (name, node, ip, ports) in [("client", NODES[0].0, CLIENT, vec![]), ("server", NODES[1].0, SERVER, vec![tcp(PORT), tcp(BULK_PORT)])]
    {
        let mut labels = Labels::new();
        labels.insert("app", name);
        s.upsert_pod(pod(name, labels, node, IpAddr::V4(ip), ports));
    }
    let mut client = LabelSelector::default();
    client.match_labels.insert("app".into(), "client".into());
    let mut policy: NetworkPolicy = server_policy("overlay".into(), vec![PolicyPeer { pod_selector: Some(client), ..Default::default() }]);
    for rule in &mut policy.ingress {
        let mut bulk = rule.ports[0].clone();
        bulk.port = Some(flock::model::PortRef::Number(i32::from(BULK_PORT)));
        rule.ports.push(bulk);
    }
    s.upsert_policy(policy);
    s
}

/// One routing mode's twin: the namespaces, the servers, the route programmers.
struct Side {
    routing: Routing,
    pod_mtu: u32,
    rules: usize,
    /// Held for their drop, before the namespaces go.
    _server: Server,
    _sink: Server,
    /// What the sink has read.
    received: Arc<AtomicU64>,
    _routers: Vec<Router>,
    client: NetnsGuard,
    _server_ns: NetnsGuard,
    _nodes: [NetnsGuard; 2],
}

impl Side {
    fn new(
        routing: Routing,
        snap: &Snapshot,
        options: &RenderOptions,
        servers: usize,
        rt: &tokio::runtime::Runtime,
    ) -> anyhow::Result<Self> {
        let tag = format!("ovl-{routing}");
        let nodes = [netns(&format!("{tag}-a"))?, netns(&format!("{tag}-b"))?];
        let (client, server) = (netns(&format!("{tag}-client"))?, netns(&format!("{tag}-server"))?);
        for ns in [&nodes[0], &nodes[1], &client, &server] {
            sysctl(ns, "net.ipv6.conf.all.accept_dad", "0")?;
            sysctl(ns, "net.ipv6.conf.default.accept_dad", "0")?;
        }
        for n in &nodes {
            sysctl(n, "net.ipv4.ip_forward", "1")?;
        }
        sysctl(&client, "net.ipv4.ip_local_port_range", "1024 65535")?;
        sysctl(&client, "net.ipv4.tcp_tw_reuse", "1")?;
        sysctl(&server, "net.core.somaxconn", "4096")?;
        let (a, b) = (nodes[0].name.as_str(), nodes[1].name.as_str());
        sh(&["ip", "-n", a, "link", "add", "wan", "mtu", &LINK_MTU.to_string(), "type", "veth", "peer", "name", "wan", "netns", b])?;
        for (ns, (_, ip, _)) in nodes.iter().zip(NODES) {
            sh(&["ip", "-n", &ns.name, "addr", "add", &format!("{ip}/24"), "dev", "wan"])?;
            sh(&["ip", "-n", &ns.name, "link", "set", "wan", "up"])?;
        }
        // The MTU the agent writes into the CNI config: the link's, less VXLAN's overhead.
        let pod_mtu = if routing == Routing::HostGw { LINK_MTU } else { LINK_MTU - VXLAN_OVERHEAD_V4 };
        let mut rules = 0;
        for (i, ((node, pod_ns), (pod_ip, peer_ip))) in
            nodes.iter().zip([&client, &server]).zip([(CLIENT, SERVER), (SERVER, CLIENT)]).enumerate()
        {
            let node_name = NODES[i].0;
            let endpoints = snap.derived_endpoints(node_name);
            let Some(ep) = endpoints.first() else { bail!("no pod on {node_name}") };
            let (host_mac, pod_mac) = MACS[i];
            let (n, p, iface, mtu) = (node.name.as_str(), pod_ns.name.as_str(), ep.interface.as_str(), pod_mtu.to_string());
            sh(&[
                "ip", "-n", n, "link", "add", iface, "address", host_mac, "mtu", &mtu, "type", "veth", "peer", "name", "eth0", "address",
                pod_mac, "mtu", &mtu, "netns", p,
            ])?;
            sh(&["ip", "-n", n, "link", "set", iface, "up"])?;
            sh(&["ip", "-n", p, "link", "set", "eth0", "up"])?;
            sh(&["ip", "-n", p, "addr", "add", &format!("{pod_ip}/32"), "dev", "eth0"])?;
            sh(&["ip", "-n", p, "route", "add", &format!("{peer_ip}/32"), "dev", "eth0", "src", &pod_ip.to_string()])?;
            sh(&["ip", "-n", p, "neigh", "replace", &peer_ip.to_string(), "lladdr", host_mac, "dev", "eth0", "nud", "permanent"])?;
            sh(&["ip", "-n", n, "route", "add", &format!("{pod_ip}/32"), "dev", iface])?;
            sh(&["ip", "-n", n, "neigh", "replace", &pod_ip.to_string(), "lladdr", pod_mac, "dev", iface, "nud", "permanent"])?;

            let overlay_port = (routing != Routing::HostGw).then_some(VxlanConfig::default().port);
            let ir = translate::translate(
                snap,
                &endpoints,
                &Options { overlay_port, overlay_node: Some(node_name.into()), ..Options::default() },
            );
            let rs = render::render_with(&ir, options);
            rules += rs.stats().rules;
            Applier::new(NftCli::new(Netns::named(n))).defer_baseline().apply(&rs).with_context(|| format!("applying the table in {n}"))?;
            for (key, value) in CT_TIMEOUTS {
                sysctl(node, key, value)?;
            }
        }
        let mut routers = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            let (_, other_ip, other_cidr) = NODES[1 - i];
            let peers = Peers {
                own: vec![IpAddr::V4(NODES[i].1)],
                others: vec![(NODES[1 - i].0.to_string(), vec![IpAddr::V4(other_ip)], vec![other_cidr.parse()?])],
            };
            let r = Router::start(Netns::named(&node.name), RoutingConfig { routing, vxlan: VxlanConfig::default() })
                .with_context(|| format!("routes in {}", node.name))?;
            rt.block_on(r.sync(peers)).with_context(|| format!("routes in {}", node.name))?;
            routers.push(r);
        }
        let dst = SocketAddr::new(IpAddr::V4(SERVER), PORT);
        let server_loop = Server::start(&path(&server), dst, servers).with_context(|| format!("server in {}", server.name))?;
        let (sink, received) = sink(&path(&server), SocketAddr::new(IpAddr::V4(SERVER), BULK_PORT))?;
        probe(&path(&client), Some(IpAddr::V4(CLIENT)), dst, CONNECT_TIMEOUT)
            .with_context(|| format!("client to server over {routing}"))?;
        Ok(Self {
            routing,
            pod_mtu,
            rules,
            _server: server_loop,
            _sink: sink,
            received,
            _routers: routers,
            client,
            _server_ns: server,
            _nodes: nodes,
        })
    }

    fn dst(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(SERVER), PORT)
    }

    /// Bytes per second the server took from one stream over `duration` (after a warm-up).
    fn bulk(&self, duration: Duration) -> anyhow::Result<f64> {
        let dst = SocketAddr::new(IpAddr::V4(SERVER), BULK_PORT);
        let mut conn = flock::netns::run_in(&Netns::named(&self.client.name), || TcpStream::connect_timeout(&dst, CONNECT_TIMEOUT))?
            .with_context(|| format!("bulk stream to {dst} over {}", self.routing))?;
        conn.set_write_timeout(Some(CONNECT_TIMEOUT))?;
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let stop = stop.clone();
            std::thread::spawn(move || -> std::io::Result<()> {
                let buf = vec![0x5a_u8; 128 * 1024];
                while !stop.load(Ordering::Relaxed) {
                    conn.write_all(&buf)?;
                }
                Ok(())
            })
        };
        std::thread::sleep(WARM_UP);
        let (c0, t0) = (self.received.load(Ordering::Relaxed), Instant::now());
        std::thread::sleep(duration);
        let (c1, t1) = (self.received.load(Ordering::Relaxed), Instant::now());
        stop.store(true, Ordering::Relaxed);
        let written = writer.join().map_err(|_| anyhow::anyhow!("the bulk writer panicked"))?;
        written.with_context(|| format!("bulk stream over {}", self.routing))?;
        if c1 <= c0 {
            bail!("no bytes crossed over {}", self.routing);
        }
        Ok((c1 - c0) as f64 / (t1 - t0).as_secs_f64())
    }
}

/// A server that reads and counts whatever its connections send (one stream at a time).
fn sink(ns: &Path, addr: SocketAddr) -> anyhow::Result<(Server, Arc<AtomicU64>)> {
    let bytes = Arc::new(AtomicU64::new(0));
    let counted = bytes.clone();
    let server = Server::serving(ns, addr, 1, move |mut conn| {
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        let mut buf = vec![0u8; 256 * 1024];
        // Until the writer closes (or the read times out).
        while let Ok(n @ 1..) = conn.read(&mut buf) {
            counted.fetch_add(n as u64, Ordering::Relaxed);
        }
    })
    .with_context(|| format!("bulk sink on {addr}"))?;
    Ok((server, bytes))
}

/// host-gw and VXLAN twins measured in `rounds` rounds of `seconds` each per mode and
/// measure; the report's `overlay` section.
pub fn measure(rounds: usize, seconds: Duration, clients: usize, servers: usize, options: &RenderOptions) -> anyhow::Result<Value> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("a runtime for the route programmer")?;
    let snap = snapshot();
    let sides = [Side::new(Routing::HostGw, &snap, options, servers, &rt)?, Side::new(Routing::Vxlan, &snap, options, servers, &rt)?];
    let slices = ((seconds.as_secs_f64() / SLICE.as_secs_f64()).round() as u32).max(1);
    let slice = seconds / slices;
    let mut conns: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut bulk: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        let mut total = [Load::default(), Load::default()];
        let mut bytes = [0.0, 0.0];
        for side in &sides {
            load(&path(&side.client), side.dst(), clients, WARM_UP)?.check().with_context(|| format!("warming up, {}", side.routing))?;
        }
        for i in 0..slices as usize {
            let order = if (i + round).is_multiple_of(2) { [0, 1] } else { [1, 0] };
            for k in order {
                let l = load(&path(&sides[k].client), sides[k].dst(), clients, slice)?;
                l.check().with_context(|| format!("connections over {}", sides[k].routing))?;
                total[k].add(&l);
            }
            for k in order {
                bytes[k] += sides[k].bulk(slice)? / f64::from(slices);
            }
        }
        for k in 0..2 {
            conns[k].push(total[k].rate());
            bulk[k].push(bytes[k] * 8.0 / 1e9);
        }
        eprintln!(
            "dataplane: round {}/{rounds} overlay: host-gw {:.0} conn/s {:.2} Gbit/s, vxlan {:.0} conn/s {:.2} Gbit/s",
            round + 1,
            conns[0][round],
            bulk[0][round],
            conns[1][round],
            bulk[1][round]
        );
    }
    let ratio = |v: &[Vec<f64>; 2]| spread(&v[1].iter().zip(&v[0]).map(|(x, h)| x / h.max(f64::MIN_POSITIVE)).collect::<Vec<_>>());
    let side = |k: usize| {
        json!({
            "conn_per_s": spread(&conns[k]),
            "bulk_gbit_per_s": spread(&bulk[k]),
            "pod_mtu": sides[k].pod_mtu,
            "rules_in_tables": sides[k].rules,
        })
    };
    Ok(json!({
        "what": "a pod of one node opening connections to (and streaming to) a pod of another node, host-gw and VXLAN on the same run; both nodes enforce flock's table (a policy admits the client), VXLAN's with its overlay guard",
        "host_gw": side(0),
        "vxlan": side(1),
        "vxlan_over_host_gw": {"conn_per_s": ratio(&conns), "bulk": ratio(&bulk)},
        "load": format!(
            "per round, {clients} client threads open connections for {} s per mode and one TCP stream of 128 KiB writes runs {} s per mode, the modes taking turns in slices (ABBA…); throughput is what the server read",
            seconds.as_secs_f64(),
            seconds.as_secs_f64()
        ),
        "topology": format!(
            "per mode: node-a netns <-> wan veth ({LINK_MTU}, one /24) <-> node-b netns; client pod netns on node-a, server pod netns on node-b, wired as flock-cni wires pods; routes, VXLAN device, neighbour and forwarding entries by flock-agent's route programmer"
        ),
    }))
}
