//! How this node reaches other nodes' pods, programmed with rtnetlink in the node's namespace
//! (`--routing`):
//!
//! - **host-gw**: a route to every other node's pod CIDRs via that node's InternalIP of the
//!   same family. Works only while the nodes share an L2 segment (the gateway is on-link).
//! - **vxlan**: an overlay, flannel-style without flooding or learning: one VXLAN device per
//!   underlay family (`flock.vxlan`, `flock.vxlan6`), and per other node a route to its pod
//!   CIDR via that CIDR's first address on the device (`onlink`), a permanent neighbour entry
//!   giving that address the node's VTEP MAC, and a forwarding entry sending the MAC to the
//!   node's InternalIP. The route's preferred source is this node's InternalIP of the inner
//!   family: the device has no address, and the host's own packets must leave with a source
//!   the other node's guard takes from this node (an address on `lo` would otherwise win). A VTEP MAC is derived from the node's underlay address
//!   ([`vtep_mac`]), so no node needs to publish one.
//! - **auto**: host-gw to nodes whose InternalIP is on-link (the kernel's routes reach it
//!   without a gateway), VXLAN to the rest (Calico's CrossSubnet).
//!
//! The plan ([`plan`]) is pure; [`Router`] makes the kernel match it: routes tagged with
//! flock's route protocol, neighbour and forwarding entries on flock's own devices only, so
//! nobody else's routes or devices are touched.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use futures::TryStreamExt;
use ipnet::IpNet;
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol};
use rtnetlink::{Handle, RouteMessageBuilder};
use tokio::sync::{mpsc, oneshot};

use crate::model::Snapshot;
use crate::netns::{self, Netns};

/// Route protocol number marking flock's routes (`ip route show proto 70`).
pub(crate) const ROUTE_PROTOCOL: u8 = 70;

/// How packets reach other nodes' pods (`--routing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Routing {
    /// Via the other node's InternalIP (one L2 segment).
    #[default]
    HostGw,
    /// Over VXLAN to every other node.
    Vxlan,
    /// host-gw where the other node is on-link, VXLAN elsewhere.
    Auto,
}

impl std::fmt::Display for Routing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::HostGw => "host-gw",
            Self::Vxlan => "vxlan",
            Self::Auto => "auto",
        })
    }
}

impl std::str::FromStr for Routing {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "host-gw" => Ok(Self::HostGw),
            "vxlan" => Ok(Self::Vxlan),
            "auto" => Ok(Self::Auto),
            other => Err(format!("{other:?}: host-gw, vxlan or auto")),
        }
    }
}

/// The overlay's settings (`--vxlan-vni`, `--vxlan-port`, `--vxlan-device`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanConfig {
    pub vni: u32,
    pub port: u16,
    /// The IPv4 underlay's device; the IPv6 underlay's is this with `6` appended.
    pub device: String,
}

impl Default for VxlanConfig {
    fn default() -> Self {
        Self { vni: 1, port: 4789, device: "flock.vxlan".into() }
    }
}

impl VxlanConfig {
    /// The device of an underlay family.
    pub fn device_for(&self, ipv6: bool) -> String {
        if ipv6 { format!("{}6", self.device) } else { self.device.clone() }
    }

    /// Whether the settings can be used: a VNI of 24 bits, a port, a device name that fits
    /// an interface name with `6` appended.
    pub fn check(&self) -> Result<(), String> {
        if self.vni == 0 || self.vni >= 1 << 24 {
            return Err(format!("VXLAN VNI {}: 1 to 16777215", self.vni));
        }
        if self.port == 0 {
            return Err("VXLAN port 0".into());
        }
        let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
        if self.device.is_empty() || self.device.len() > 14 || !self.device.chars().all(ok) {
            return Err(format!("VXLAN device {:?}: 1 to 14 of a-z, A-Z, 0-9, '.', '-', '_'", self.device));
        }
        Ok(())
    }
}

/// What the routing needs to know of the agent's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RoutingConfig {
    pub routing: Routing,
    pub vxlan: VxlanConfig,
}

/// Bytes VXLAN adds to an inner Ethernet frame over an IPv4 underlay (outer IP 20, UDP 8,
/// VXLAN 8, inner Ethernet 14) and over IPv6 (outer IP 40).
pub const VXLAN_OVERHEAD_V4: u32 = 50;
pub const VXLAN_OVERHEAD_V6: u32 = 70;

/// The MTU inside the overlay over a link of `link_mtu` (an IPv6 underlay if `v6`), kept
/// between IPv6's minimum and a jumbo frame's: the devices and the pods get the same one.
fn overlay_mtu(link_mtu: u32, v6: bool) -> u32 {
    let overhead = if v6 { VXLAN_OVERHEAD_V6 } else { VXLAN_OVERHEAD_V4 };
    link_mtu.saturating_sub(overhead).clamp(1280, 9000)
}

/// A MAC address.
pub type Mac = [u8; 6];

/// The VTEP MAC of the node whose underlay address is `ip`: locally administered, unicast,
/// the rest a hash of the address (every node computes every other's).
pub fn vtep_mac(ip: IpAddr) -> Mac {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"flock-vtep ");
    match ip {
        IpAddr::V4(a) => h.update(a.octets()),
        IpAddr::V6(a) => h.update(a.octets()),
    }
    let d = h.finalize();
    [0x0a, d[0], d[1], d[2], d[3], d[4]]
}

/// One desired route: via a gateway on the node's own links, or (`dev`) on-link on an
/// overlay device, with (`src`) the source the host's own packets take.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct NodeRoute {
    pub(crate) dst: IpNet,
    pub(crate) via: IpAddr,
    pub(crate) dev: Option<String>,
    pub(crate) src: Option<IpAddr>,
}

/// One VXLAN device: its name, the local underlay address and its MAC.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Vtep {
    pub(crate) name: String,
    pub(crate) local: IpAddr,
    pub(crate) mac: Mac,
}

/// One other node over the overlay: the gateway address its route names, with the node's
/// VTEP MAC (neighbour entry) and underlay address (forwarding entry).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Tunnel {
    pub(crate) dev: String,
    pub(crate) gateway: IpAddr,
    pub(crate) mac: Mac,
    pub(crate) underlay: IpAddr,
}

/// This node and the others, as routing sees them (from the snapshot).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Peers {
    /// This node's InternalIPs (the overlay's local addresses).
    pub own: Vec<IpAddr>,
    /// Every other node: name, InternalIPs, pod CIDRs.
    pub others: Vec<(String, Vec<IpAddr>, Vec<IpNet>)>,
}

/// The peers of `node` in `snapshot`.
pub(crate) fn peers(snapshot: &Snapshot, node: &str) -> Peers {
    let mut p = Peers::default();
    for n in snapshot.nodes() {
        if n.name == node {
            p.own = n.internal_ips.clone();
        } else {
            p.others.push((n.name.clone(), n.internal_ips.clone(), n.pod_cidrs.clone()));
        }
    }
    p
}

/// What the kernel should hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Plan {
    pub(crate) routes: BTreeSet<NodeRoute>,
    pub(crate) vteps: BTreeSet<Vtep>,
    pub(crate) tunnels: BTreeSet<Tunnel>,
    /// Pod CIDRs no path can be planned to, and why (reported; no route is better than a
    /// wrong one).
    pub(crate) unreachable: BTreeMap<IpNet, String>,
    /// Overlay routes without a preferred source, and why (reported).
    pub(crate) sourceless: BTreeMap<IpNet, String>,
}

/// The plan for `peers` under `config`; `on_link(ip)`: whether this node reaches `ip` without
/// a gateway (only asked under [`Routing::Auto`]).
pub(crate) fn plan(peers: &Peers, config: &RoutingConfig, on_link: impl Fn(IpAddr) -> bool) -> Plan {
    let mut out = Plan::default();
    let own = |v6: bool| peers.own.iter().copied().find(|a| a.is_ipv6() == v6);
    for (name, ips, cidrs) in &peers.others {
        let theirs = |v6: bool| ips.iter().copied().find(|a| a.is_ipv6() == v6);
        for cidr in cidrs {
            let cidr = cidr.trunc();
            let v6 = matches!(cidr, IpNet::V6(_));
            let direct = theirs(v6).filter(|ip| match config.routing {
                Routing::HostGw => true,
                Routing::Vxlan => false,
                Routing::Auto => on_link(*ip),
            });
            if let Some(via) = direct {
                out.routes.insert(NodeRoute { dst: cidr, via, dev: None, src: None });
                continue;
            }
            if config.routing == Routing::HostGw {
                out.unreachable.insert(cidr, format!("node {name} has no InternalIP of the pod CIDR's family"));
                continue;
            }
            // The underlay: the pod CIDR's family where both nodes have it, else the other.
            let Some((local, remote)) = [v6, !v6].into_iter().find_map(|f| Some((own(f)?, theirs(f)?))) else {
                out.unreachable.insert(cidr, format!("node {name} and this node share no InternalIP family for VXLAN"));
                continue;
            };
            let dev = config.vxlan.device_for(local.is_ipv6());
            out.vteps.insert(Vtep { name: dev.clone(), local, mac: vtep_mac(local) });
            let gateway = cidr.network();
            out.tunnels.insert(Tunnel { dev: dev.clone(), gateway, mac: vtep_mac(remote), underlay: remote });
            if own(v6).is_none() {
                out.sourceless.insert(cidr, "this node has no InternalIP of the pod CIDR's family".into());
            }
            out.routes.insert(NodeRoute { dst: cidr, via: gateway, dev: Some(dev), src: own(v6) });
        }
    }
    out
}

/// Whether `ip` is on-link by `routes` (the main table's `(destination, has a gateway)`): the
/// longest matching prefix has no gateway. flock's own routes are not among them.
pub(crate) fn on_link(ip: IpAddr, routes: &[(IpNet, bool)]) -> bool {
    routes.iter().filter(|(dst, _)| dst.contains(&ip)).max_by_key(|(dst, _)| dst.prefix_len()).is_some_and(|(_, gw)| !gw)
}

/// Why routes could not be programmed.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("route {route}: {message}")]
    Netlink { route: String, message: String },
    #[error("the route programmer of {netns} stopped")]
    Stopped { netns: String },
    #[error("device {device}: {message}")]
    Clash { device: String, message: String },
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
    #[error("cannot open a netlink connection in {netns}: {source}")]
    Connect {
        netns: String,
        #[source]
        source: std::io::Error,
    },
}

type Job = (Peers, oneshot::Sender<Result<RouteChanges, RouteError>>);

/// What a reconcile changed, and what it could not reach.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RouteChanges {
    pub added: usize,
    pub removed: usize,
    /// Pod CIDRs without a path, and why.
    pub unreachable: BTreeMap<IpNet, String>,
    /// Pod CIDRs over the overlay whose route has no preferred source, and why.
    pub sourceless: BTreeMap<IpNet, String>,
}

/// Programs routes in one namespace, from a thread of its own that entered it (a netlink
/// socket talks to the namespace it was opened in; async workers never change namespace).
pub struct Router {
    tx: mpsc::Sender<Job>,
    netns: String,
}

impl Router {
    /// Starts the programmer thread for `ns`.
    pub fn start(ns: Netns, config: RoutingConfig) -> Result<Self, RouteError> {
        let (tx, mut rx) = mpsc::channel::<Job>(4);
        let name = ns.describe();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread_ns = ns.clone();
        let desc = name.clone();
        std::thread::Builder::new()
            .name("flock-routes".into())
            .spawn(move || {
                let outcome = netns::run_in(&thread_ns, move || {
                    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = ready_tx.send(Err(RouteError::Connect { netns: desc.clone(), source: e }));
                            return;
                        }
                    };
                    rt.block_on(async move {
                        let (conn, handle, _) = match rtnetlink::new_connection() {
                            Ok(c) => c,
                            Err(e) => {
                                let _ = ready_tx.send(Err(RouteError::Connect { netns: desc.clone(), source: e }));
                                return;
                            }
                        };
                        tokio::spawn(conn);
                        // The overlay refuses to start over another component's device.
                        if config.routing != Routing::HostGw
                            && let Err(e) = clash(&handle, &config.vxlan).await
                        {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                        let _ = ready_tx.send(Ok(()));
                        // Said when it changes, not at every sync.
                        let mut unreachable = BTreeMap::new();
                        let mut sourceless = BTreeMap::new();
                        while let Some((peers, reply)) = rx.recv().await {
                            let result = reconcile(&handle, &config, &peers).await;
                            if let Ok(c) = &result
                                && c.unreachable != unreachable
                            {
                                for (cidr, why) in c.unreachable.iter().filter(|(k, _)| !unreachable.contains_key(*k)) {
                                    tracing::warn!(%cidr, why, "no route to another node's pod CIDR");
                                }
                                unreachable = c.unreachable.clone();
                            }
                            if let Ok(c) = &result
                                && c.sourceless != sourceless
                            {
                                for (cidr, why) in c.sourceless.iter().filter(|(k, _)| !sourceless.contains_key(*k)) {
                                    tracing::warn!(%cidr, why, "overlay route without a preferred source: the host's own packets may be dropped as spoofed");
                                }
                                sourceless = c.sourceless.clone();
                            }
                            let _ = reply.send(result);
                        }
                    });
                });
                if let Err(e) = outcome {
                    tracing::error!(error = %e, "route programmer could not enter its namespace");
                }
            })
            .map_err(|e| RouteError::Connect { netns: name.clone(), source: e })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self { tx, netns: name }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(RouteError::Stopped { netns: name }),
        }
    }

    /// Makes flock's routes, overlay devices and their entries what `peers` need.
    pub async fn sync(&self, peers: Peers) -> Result<RouteChanges, RouteError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send((peers, reply)).await.map_err(|_| RouteError::Stopped { netns: self.netns.clone() })?;
        rx.await.map_err(|_| RouteError::Stopped { netns: self.netns.clone() })?
    }
}

fn netlink(what: impl std::fmt::Display) -> impl FnOnce(rtnetlink::Error) -> RouteError {
    let route = what.to_string();
    move |e| RouteError::Netlink { route, message: e.to_string() }
}

fn describe(r: &NodeRoute) -> String {
    let src = r.src.map(|s| format!(" src {s}")).unwrap_or_default();
    match &r.dev {
        Some(d) => format!("{} via {} dev {d} onlink{src}", r.dst, r.via),
        None => format!("{} via {}{src}", r.dst, r.via),
    }
}

fn message(r: &NodeRoute, oif: Option<u32>) -> RouteMessage {
    let proto = RouteProtocol::Other(ROUTE_PROTOCOL);
    let mut m = match (r.dst, r.via) {
        (IpNet::V4(d), IpAddr::V4(g)) => {
            RouteMessageBuilder::<std::net::Ipv4Addr>::new().destination_prefix(d.addr(), d.prefix_len()).gateway(g).protocol(proto).build()
        }
        (IpNet::V6(d), IpAddr::V6(g)) => {
            RouteMessageBuilder::<std::net::Ipv6Addr>::new().destination_prefix(d.addr(), d.prefix_len()).gateway(g).protocol(proto).build()
        }
        // plan pairs families; a mismatch cannot be built.
        _ => RouteMessage::default(),
    };
    if let Some(index) = oif {
        m.attributes.push(RouteAttribute::Oif(index));
        m.header.flags.insert(rtnetlink::packet_route::route::RouteFlags::Onlink);
    }
    match r.src {
        Some(IpAddr::V4(a)) if r.dst.addr().is_ipv4() => m.attributes.push(RouteAttribute::PrefSource(RouteAddress::Inet(a))),
        Some(IpAddr::V6(a)) if r.dst.addr().is_ipv6() => m.attributes.push(RouteAttribute::PrefSource(RouteAddress::Inet6(a))),
        _ => {}
    }
    m
}

/// A route of the kernel's, as flock reads it.
struct KernelRoute {
    dst: IpNet,
    /// The gateway; `0.0.0.0` for routes with several next hops or no link at all.
    via: Option<IpAddr>,
    oif: Option<u32>,
    /// The preferred source.
    src: Option<IpAddr>,
}

fn parse_route(m: &RouteMessage) -> Option<KernelRoute> {
    let mut dst = None;
    let mut via = None;
    let mut oif = None;
    let mut src = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::PrefSource(RouteAddress::Inet(s)) => src = Some(IpAddr::V4(*s)),
            RouteAttribute::PrefSource(RouteAddress::Inet6(s)) => src = Some(IpAddr::V6(*s)),
            RouteAttribute::Destination(RouteAddress::Inet(d)) => dst = Some(IpAddr::V4(*d)),
            RouteAttribute::Destination(RouteAddress::Inet6(d)) => dst = Some(IpAddr::V6(*d)),
            RouteAttribute::Gateway(RouteAddress::Inet(g)) => via = Some(IpAddr::V4(*g)),
            RouteAttribute::Gateway(RouteAddress::Inet6(g)) => via = Some(IpAddr::V6(*g)),
            RouteAttribute::Oif(i) => oif = Some(*i),
            // Several next hops, or a nexthop object: not on-link, as with a gateway.
            RouteAttribute::MultiPath(_) | RouteAttribute::NhId(_) if via.is_none() => {
                via = Some(IpAddr::from([0, 0, 0, 0]));
            }
            _ => {}
        }
    }
    // Blackhole, unreachable, prohibit, throw: no link at all.
    if m.header.kind != rtnetlink::packet_route::route::RouteType::Unicast {
        via = via.or(Some(IpAddr::from([0, 0, 0, 0])));
    }
    let dst = match dst {
        Some(d) => IpNet::new(d, m.header.destination_prefix_length).ok()?,
        // The default route has no destination attribute.
        None if m.header.address_family == rtnetlink::packet_route::AddressFamily::Inet6 => IpNet::V6(ipnet::Ipv6Net::default()),
        None => IpNet::V4(ipnet::Ipv4Net::default()),
    };
    Some(KernelRoute { dst, via, oif, src })
}

/// flock's routes (as [`NodeRoute`]s, with their messages) and the main table's others
/// (destination, has a gateway) for [`on_link`].
async fn routes(
    handle: &Handle,
    devices: &BTreeMap<u32, String>,
) -> Result<(Vec<(NodeRoute, RouteMessage)>, Vec<(IpNet, bool)>), RouteError> {
    let (mut ours, mut main) = (Vec::new(), Vec::new());
    for probe in [RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(), RouteMessageBuilder::<std::net::Ipv6Addr>::new().build()] {
        let mut stream = handle.route().get(probe).execute();
        while let Some(m) = stream.try_next().await.map_err(netlink("listing"))? {
            let Some(KernelRoute { dst, via, oif, src }) = parse_route(&m) else { continue };
            if m.header.protocol == RouteProtocol::Other(ROUTE_PROTOCOL) {
                if let Some(via) = via {
                    let dev = oif.and_then(|i| devices.get(&i).cloned());
                    ours.push((NodeRoute { dst, via, dev, src }, m));
                }
            } else if m.header.table == 254 || m.header.table == 0 {
                main.push((dst, via.is_some()));
            }
        }
    }
    Ok((ours, main))
}

/// Every address the node holds and may send from, all families and links: the local end
/// (`IFA_LOCAL` where given: on a point-to-point link `IFA_ADDRESS` is the peer's), and no
/// IPv6 address still tentative or whose duplicate detection failed (the kernel refuses
/// those as a route's source).
async fn local_addresses(handle: &Handle) -> Result<BTreeSet<IpAddr>, RouteError> {
    use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags};
    let mut out = BTreeSet::new();
    let mut s = handle.address().get().execute();
    while let Some(m) = s.try_next().await.map_err(netlink("addresses"))? {
        let unusable = AddressFlags::Tentative | AddressFlags::Dadfailed;
        let flags = m.attributes.iter().find_map(|a| match a {
            AddressAttribute::Flags(f) => Some(*f),
            _ => None,
        });
        let header_unusable = m.header.flags.intersects(AddressHeaderFlags::Tentative | AddressHeaderFlags::Dadfailed);
        if flags.map_or(header_unusable, |f| f.intersects(unusable)) {
            continue;
        }
        let local = m.attributes.iter().find_map(|a| match a {
            AddressAttribute::Local(ip) => Some(*ip),
            _ => None,
        });
        let address = m.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        });
        if let Some(ip) = local.or(address) {
            out.insert(ip);
        }
    }
    Ok(out)
}

/// The index of link `name`, if it exists.
async fn link_index(handle: &Handle, name: &str) -> Result<Option<(u32, rtnetlink::packet_route::link::LinkMessage)>, RouteError> {
    let mut s = handle.link().get().match_name(name.to_string()).execute();
    match s.try_next().await {
        Ok(Some(m)) => Ok(Some((m.header.index, m))),
        Ok(None) => Ok(None),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -nix::libc::ENODEV => Ok(None),
        Err(e) => Err(netlink(format!("device {name}"))(e)),
    }
}

/// Whether link `m` is the VXLAN device `v` wants (VNI, port, local address).
fn fits(m: &rtnetlink::packet_route::link::LinkMessage, v: &Vtep, config: &VxlanConfig) -> bool {
    use rtnetlink::packet_route::link::{InfoData, InfoVxlan, LinkAttribute, LinkInfo};
    let mut seen = (false, false, false);
    for a in &m.attributes {
        if let LinkAttribute::LinkInfo(infos) = a {
            for i in infos {
                if let LinkInfo::Data(InfoData::Vxlan(data)) = i {
                    for d in data {
                        match d {
                            InfoVxlan::Id(id) => seen.0 = *id == config.vni,
                            InfoVxlan::Port(p) => seen.1 = *p == config.port,
                            InfoVxlan::Local(a) => seen.2 = IpAddr::V4(*a) == v.local,
                            InfoVxlan::Local6(a) => seen.2 = IpAddr::V6(*a) == v.local,
                            _ => {}
                        }
                    }
                }
            }
        }
    }
    seen == (true, true, true)
}

/// The MTU of the link holding `local` (the underlay's), if found.
async fn underlay_mtu(handle: &Handle, local: IpAddr) -> Result<Option<u32>, RouteError> {
    use rtnetlink::packet_route::address::AddressAttribute;
    use rtnetlink::packet_route::link::LinkAttribute;
    let mut addrs = handle.address().get().execute();
    let mut index = None;
    while let Some(a) = addrs.try_next().await.map_err(netlink("addresses"))? {
        if a.attributes.iter().any(|x| matches!(x, AddressAttribute::Address(ip) if *ip == local)) {
            index = Some(a.header.index);
        }
    }
    let Some(index) = index else { return Ok(None) };
    let mut links = handle.link().get().match_index(index).execute();
    let Some(link) = links.try_next().await.map_err(netlink("the underlay's link"))? else { return Ok(None) };
    Ok(link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Mtu(m) => Some(*m),
        _ => None,
    }))
}

/// The MTU pods get under an overlay: the smallest of the underlay links' MTU (those holding
/// `own`, this node's InternalIPs) minus the encapsulation of that underlay's family; `None`
/// under host-gw or when no such link is found. Looked up in the current network namespace.
pub async fn overlay_pod_mtu(own: &[IpAddr], routing: Routing) -> Result<Option<u32>, RouteError> {
    if routing == Routing::HostGw {
        return Ok(None);
    }
    let (conn, handle, _) = rtnetlink::new_connection().map_err(|source| RouteError::Connect { netns: "the agent's".into(), source })?;
    let task = tokio::spawn(conn);
    let mut out: Option<u32> = None;
    for ip in own {
        if let Some(mtu) = underlay_mtu(&handle, *ip).await? {
            let m = overlay_mtu(mtu, ip.is_ipv6());
            out = Some(out.map_or(m, |o| o.min(m)));
        }
    }
    task.abort();
    Ok(out)
}

/// flock's devices no longer wanted (index, name): removed once the routes replacing theirs
/// are in, so pods keep a path while a node moves from VXLAN to host-gw.
type Retired = Vec<(u32, String)>;

/// Makes the VXLAN devices `want` (flock's names only); their indexes by name, and those of
/// flock's devices no longer wanted.
async fn devices(handle: &Handle, config: &VxlanConfig, want: &BTreeSet<Vtep>) -> Result<(BTreeMap<String, u32>, Retired), RouteError> {
    use rtnetlink::LinkVxlan;
    use rtnetlink::packet_route::link::LinkAttribute;
    let mut out = BTreeMap::new();
    let mut retired = Vec::new();
    // Devices flock made under another name (a changed --vxlan-device) go first: they would
    // take VXLAN nobody routes or guards.
    let names = [config.device_for(false), config.device_for(true)];
    for (index, name) in marked_devices(handle).await? {
        if !names.contains(&name) {
            handle.link().del(index).execute().await.map_err(netlink(format!("device {name}")))?;
            tracing::info!(device = %name, "removed a VXLAN device flock made under another name");
        }
    }
    if !want.is_empty() {
        clash(handle, config).await?;
    }
    for v6 in [false, true] {
        let name = config.device_for(v6);
        let wanted = want.iter().find(|v| v.name == name);
        let have = link_index(handle, &name).await?;
        if have.as_ref().is_some_and(|(_, m)| !marked(m)) {
            // Someone else's (not wanted, or `clash` would have refused): left alone.
            continue;
        }
        if let Some((index, m)) = &have {
            if wanted.is_some_and(|v| fits(m, v, config)) {
                out.insert(name, *index);
                continue;
            }
            if wanted.is_none() {
                retired.push((*index, name));
                continue;
            }
            // Ours by name, and not what is wanted (another VNI, port or address): replaced
            // whole.
            handle.link().del(*index).execute().await.map_err(netlink(format!("device {name}")))?;
            tracing::info!(device = %name, "removed a VXLAN device that no longer fits");
        }
        let Some(v) = wanted else { continue };
        let mtu = overlay_mtu(underlay_mtu(handle, v.local).await?.unwrap_or(1500), v6);
        let b = LinkVxlan::new(&name, config.vni).port(config.port).learning(false);
        let b = match v.local {
            IpAddr::V4(a) => b.local(a),
            IpAddr::V6(a) => b.local6(a),
        };
        // Down until marked: a device left unmarked (a crash between the two steps) would be
        // taken for another component's, and never removed or guarded.
        let msg = b.address(v.mac.to_vec()).mtu(mtu).build();
        handle.link().add(msg).execute().await.map_err(|e| RouteError::Netlink {
            route: format!("device {name} (VXLAN VNI {}, UDP port {})", config.vni, config.port),
            message: format!("{e} (is the VNI and port taken by a device flock does not own?)"),
        })?;
        let (index, _) = link_index(handle, &name)
            .await?
            .ok_or_else(|| RouteError::Netlink { route: format!("device {name}"), message: "gone after it was added".into() })?;
        // The mark (the kernel sets an alias only on an existing device).
        let mark = rtnetlink::LinkUnspec::new_with_index(index).append_extra_attribute(LinkAttribute::IfAlias(DEVICE_ALIAS.into())).build();
        handle.link().set(mark).execute().await.map_err(netlink(format!("device {name}")))?;
        let up = rtnetlink::LinkUnspec::new_with_index(index).up().build();
        handle.link().set(up).execute().await.map_err(netlink(format!("device {name}")))?;
        tracing::info!(device = %name, vni = config.vni, port = config.port, local = %v.local, mtu, "added the VXLAN device");
        out.insert(name, index);
    }
    Ok((out, retired))
}

/// The alias marking flock's VXLAN devices (`ip -d link show` shows it).
const DEVICE_ALIAS: &str = "flock overlay";

/// Whether link `m` carries flock's mark.
fn marked(m: &rtnetlink::packet_route::link::LinkMessage) -> bool {
    use rtnetlink::packet_route::link::LinkAttribute;
    m.attributes.iter().any(|a| matches!(a, LinkAttribute::IfAlias(x) if x == DEVICE_ALIAS))
}

/// Every link: index, name, message.
async fn links(handle: &Handle) -> Result<Vec<(u32, String, rtnetlink::packet_route::link::LinkMessage)>, RouteError> {
    use rtnetlink::packet_route::link::LinkAttribute;
    let mut out = Vec::new();
    let mut links = handle.link().get().execute();
    while let Some(m) = links.try_next().await.map_err(netlink("devices"))? {
        let name = m.attributes.iter().find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        });
        if let Some(name) = name {
            out.push((m.header.index, name, m));
        }
    }
    Ok(out)
}

/// flock's VXLAN devices (by their alias), whatever their names.
async fn marked_devices(handle: &Handle) -> Result<Vec<(u32, String)>, RouteError> {
    Ok(links(handle).await?.into_iter().filter(|(_, _, m)| marked(m)).map(|(i, n, _)| (i, n)).collect())
}

/// Why the overlay's settings cannot be taken on this node: a device flock does not own has
/// one of its names, or already receives its VNI on its UDP port (the same VNI, or every VNI:
/// an `external` device, as Cilium's). flock never deletes or shares such a device.
async fn clash(handle: &Handle, config: &VxlanConfig) -> Result<(), RouteError> {
    use rtnetlink::packet_route::link::{InfoData, InfoVxlan, LinkAttribute, LinkInfo};
    let names = [config.device_for(false), config.device_for(true)];
    for (_, name, m) in links(handle).await? {
        if marked(&m) {
            continue;
        }
        if names.contains(&name) {
            return Err(RouteError::Clash {
                device: name,
                message: "has the name of flock's VXLAN device and is not flock's (no alias \"flock overlay\"): choose another --vxlan-device, or remove it".into(),
            });
        }
        let (mut vni, mut port, mut external) = (None, None, false);
        for a in &m.attributes {
            let LinkAttribute::LinkInfo(infos) = a else { continue };
            for i in infos {
                let LinkInfo::Data(InfoData::Vxlan(data)) = i else { continue };
                for d in data {
                    match d {
                        InfoVxlan::Id(id) => vni = Some(*id),
                        InfoVxlan::Port(p) => port = Some(*p),
                        InfoVxlan::CollectMetadata(on) => external = *on,
                        _ => {}
                    }
                }
            }
        }
        if port == Some(config.port) && (external || vni == Some(config.vni)) {
            let what = if external { "every VNI".to_string() } else { format!("VNI {}", config.vni) };
            return Err(RouteError::Clash {
                device: name,
                message: format!(
                    "a VXLAN device flock does not own already receives {what} on UDP port {}: choose another --vxlan-port or --vxlan-vni",
                    config.port
                ),
            });
        }
    }
    Ok(())
}

/// Removes every VXLAN device flock made (host-gw, or routing left to another component):
/// none may stay up without the table's guard.
pub async fn remove_overlay(ns: &Netns) -> Result<usize, RouteError> {
    remove(ns, false).await.map(|(_, devices)| devices)
}

/// Removes every route flock made (protocol 70, both families) and every VXLAN device: flock
/// is being removed from the node. Returns (routes, devices) removed.
pub async fn remove_all(ns: &Netns) -> Result<(usize, usize), RouteError> {
    remove(ns, true).await
}

async fn remove(ns: &Netns, with_routes: bool) -> Result<(usize, usize), RouteError> {
    let desc = ns.describe();
    let ns = ns.clone();
    let joined = tokio::task::spawn_blocking(move || {
        netns::run_in(&ns, || -> Result<(usize, usize), RouteError> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| RouteError::Connect { netns: ns.describe(), source })?;
            rt.block_on(async {
                let (conn, handle, _) =
                    rtnetlink::new_connection().map_err(|source| RouteError::Connect { netns: ns.describe(), source })?;
                let task = tokio::spawn(conn);
                let mut routes = 0;
                if with_routes {
                    let (ours, _) = self::routes(&handle, &BTreeMap::new()).await?;
                    for (route, m) in ours {
                        handle.route().del(m).execute().await.map_err(netlink(format!("route to {}", route.dst)))?;
                        routes += 1;
                    }
                }
                let mut n = 0;
                for (index, name) in marked_devices(&handle).await? {
                    handle.link().del(index).execute().await.map_err(netlink(format!("device {name}")))?;
                    if !with_routes {
                        tracing::info!(device = %name, "removed a VXLAN device: this agent does not run the overlay");
                    }
                    n += 1;
                }
                task.abort();
                Ok((routes, n))
            })
        })
    })
    .await;
    match joined {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(RouteError::Netns(e)),
        Err(e) => Err(RouteError::Stopped { netns: format!("{desc}: {e}") }),
    }
}

/// Makes the neighbour and forwarding entries of flock's devices exactly `want`.
async fn tunnels(handle: &Handle, devices: &BTreeMap<String, u32>, want: &BTreeSet<Tunnel>) -> Result<RouteChanges, RouteError> {
    use rtnetlink::packet_route::AddressFamily;
    use rtnetlink::packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourState};
    let mut changes = RouteChanges::default();
    let by_index: BTreeMap<u32, &String> = devices.iter().map(|(n, i)| (*i, n)).collect();
    // (device, gateway or underlay address, MAC, forwarding entry)
    let mut have = BTreeMap::new();
    // The IP neighbours, then the forwarding database (a dump of its own).
    let mut listed = Vec::new();
    for family in [None, Some(AddressFamily::Bridge)] {
        let mut req = handle.neighbours().get();
        if let Some(f) = family {
            req = req.set_address_family(f);
        }
        let mut s = req.execute();
        while let Some(m) = s.try_next().await.map_err(netlink("neighbours"))? {
            listed.push(m);
        }
    }
    for m in listed {
        let Some(dev) = by_index.get(&m.header.ifindex) else { continue };
        let (mut ip, mut mac) = (None, None);
        for a in &m.attributes {
            match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => ip = Some(IpAddr::V4(*a)),
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => ip = Some(IpAddr::V6(*a)),
                // A forwarding entry's destination comes unparsed (its family is the bridge's).
                NeighbourAttribute::Destination(NeighbourAddress::Other(b)) => {
                    ip = <[u8; 4]>::try_from(b.as_slice())
                        .map(IpAddr::from)
                        .or_else(|_| <[u8; 16]>::try_from(b.as_slice()).map(IpAddr::from))
                        .ok();
                }
                NeighbourAttribute::LinkLayerAddress(l) => mac = <Mac>::try_from(l.as_slice()).ok(),
                _ => {}
            }
        }
        let fdb = m.header.family == AddressFamily::Bridge;
        // Only what flock writes: permanent neighbours, forwarding entries with a destination
        // (the kernel's own entries on the device are left alone).
        if !fdb && m.header.state != NeighbourState::Permanent {
            continue;
        }
        if let (Some(ip), Some(mac)) = (ip, mac) {
            have.entry(((*dev).clone(), ip, mac, fdb)).or_insert(m);
        }
    }
    let mut wanted = BTreeSet::new();
    for t in want {
        wanted.insert((t.dev.clone(), t.gateway, t.mac, false));
        wanted.insert((t.dev.clone(), t.underlay, t.mac, true));
    }
    for (key, m) in &have {
        if !wanted.contains(key) {
            handle.neighbours().del(m.clone()).execute().await.map_err(netlink(format!("{} {} on {}", key.1, mac_text(&key.2), key.0)))?;
            changes.removed += 1;
        }
    }
    for key in wanted.iter().filter(|k| !have.contains_key(*k)) {
        let (dev, ip, mac, fdb) = key;
        let Some(index) = devices.get(dev) else { continue };
        let what = format!("{} {ip} on {dev}", mac_text(mac));
        let req = if *fdb {
            handle.neighbours().add_bridge(*index, mac).destination(*ip).flags(NeighbourFlags::Own)
        } else {
            handle.neighbours().add(*index, *ip).link_layer_address(mac).state(NeighbourState::Permanent)
        };
        req.replace().execute().await.map_err(netlink(what))?;
        changes.added += 1;
    }
    Ok(changes)
}

fn mac_text(m: &Mac) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

async fn reconcile(handle: &Handle, config: &RoutingConfig, peers: &Peers) -> Result<RouteChanges, RouteError> {
    // Devices first (their indexes name the overlay's routes), from a plan made with the main
    // table as it is.
    let (_, main) = routes(handle, &BTreeMap::new()).await?;
    let plan = plan(peers, config, |ip| on_link(ip, &main));
    let (devices, retired) = devices(handle, &config.vxlan, &plan.vteps).await?;
    let names: BTreeMap<u32, String> = devices.iter().map(|(n, i)| (*i, n.clone())).collect();
    let mut changes = tunnels(handle, &devices, &plan.tunnels).await?;
    changes.sourceless = plan.sourceless;
    // A preferred source the kernel does not hold would make the route's addition fail: the
    // route goes without one (the kernel chooses) and says so.
    let local = local_addresses(handle).await?;
    let routes_wanted: BTreeSet<NodeRoute> = plan
        .routes
        .into_iter()
        .map(|mut r| {
            if let Some(src) = r.src.filter(|s| !local.contains(s)) {
                changes.sourceless.insert(r.dst, format!("this node's InternalIP {src} is not an address of the node"));
                r.src = None;
            }
            r
        })
        .collect();
    let (have, _) = routes(handle, &names).await?;
    let present: BTreeSet<&NodeRoute> = have.iter().map(|(r, _)| r).collect();
    // Added (or replaced in place) before anything is removed: a node moving between host-gw
    // and VXLAN keeps a route to its pods throughout.
    for r in routes_wanted.iter().filter(|r| !present.contains(r)) {
        let oif = match &r.dev {
            Some(d) => Some(*devices.get(d).ok_or_else(|| RouteError::Netlink { route: describe(r), message: format!("no device {d}") })?),
            None => None,
        };
        // `replace`: the route to the same prefix (another gateway, device or source, from
        // this run or an earlier one) is taken over rather than failing with EEXIST.
        handle.route().add(message(r, oif)).replace().execute().await.map_err(netlink(describe(r)))?;
        changes.added += 1;
    }
    let destinations: BTreeSet<IpNet> = routes_wanted.iter().map(|r| r.dst).collect();
    for (r, m) in &have {
        if !destinations.contains(&r.dst) {
            handle.route().del(m.clone()).execute().await.map_err(netlink(describe(r)))?;
            changes.removed += 1;
        }
    }
    for (index, name) in retired {
        handle.link().del(index).execute().await.map_err(netlink(format!("device {name}")))?;
        tracing::info!(device = %name, "removed a VXLAN device no longer needed");
    }
    changes.unreachable = plan.unreachable;
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn cfg(routing: Routing) -> RoutingConfig {
        RoutingConfig { routing, vxlan: VxlanConfig::default() }
    }

    #[test]
    fn host_gw_routes_other_nodes_pod_cidrs_by_family() {
        let mut s = testkit::base_cluster();
        let direct = |s: &Snapshot, node: &str| plan(&peers(s, node), &cfg(Routing::HostGw), |_| true);
        let p = direct(&s, "node-1");
        assert_eq!(
            p.routes.into_iter().collect::<Vec<_>>(),
            vec![NodeRoute { dst: "198.18.2.0/24".parse().unwrap(), via: ip("198.18.0.2"), dev: None, src: None }]
        );
        assert!(p.vteps.is_empty() && p.tunnels.is_empty());
        // An IPv6 CIDR without an IPv6 InternalIP gets no route (reported); with one, it does.
        let mut n2 = s.node("node-2").unwrap().clone();
        n2.pod_cidrs.push("2001:db8:2::/64".parse().unwrap());
        s.upsert_node(n2.clone());
        let p = direct(&s, "node-1");
        assert_eq!(p.routes.len(), 1);
        assert!(p.unreachable[&"2001:db8:2::/64".parse::<IpNet>().unwrap()].contains("node-2"));
        n2.internal_ips.push(ip("2001:db8:ff::2"));
        s.upsert_node(n2);
        assert_eq!(direct(&s, "node-1").routes.len(), 2);
        assert!(direct(&s, "node-2").routes.iter().all(|r| r.dst.to_string() == "198.18.1.0/24"));
    }

    #[test]
    fn vxlan_routes_on_link_via_the_cidrs_first_address_to_the_nodes_vtep() {
        let peers = Peers {
            own: vec![ip("198.18.0.1"), ip("2001:db8:ff::1")],
            others: vec![
                (
                    "b".into(),
                    vec![ip("198.18.9.2"), ip("2001:db8:ff::2")],
                    vec!["198.18.2.0/24".parse().unwrap(), "2001:db8:2::/64".parse().unwrap()],
                ),
                // No IPv6 underlay: its IPv6 pods go over the IPv4 one.
                ("c".into(), vec![ip("198.18.9.3")], vec!["2001:db8:3::/64".parse().unwrap()]),
            ],
        };
        let p = plan(&peers, &cfg(Routing::Vxlan), |_| true);
        let routes: Vec<String> = p.routes.iter().map(describe).collect();
        assert_eq!(
            routes,
            vec![
                "198.18.2.0/24 via 198.18.2.0 dev flock.vxlan onlink src 198.18.0.1",
                "2001:db8:2::/64 via 2001:db8:2:: dev flock.vxlan6 onlink src 2001:db8:ff::1",
                // The inner family's source, whatever the underlay.
                "2001:db8:3::/64 via 2001:db8:3:: dev flock.vxlan onlink src 2001:db8:ff::1",
            ]
        );
        let vteps: Vec<(&str, IpAddr)> = p.vteps.iter().map(|v| (v.name.as_str(), v.local)).collect();
        assert_eq!(vteps, vec![("flock.vxlan", ip("198.18.0.1")), ("flock.vxlan6", ip("2001:db8:ff::1"))]);
        assert!(p.vteps.iter().all(|v| v.mac == vtep_mac(v.local)));
        let b4 = p.tunnels.iter().find(|t| t.gateway == ip("198.18.2.0")).unwrap();
        assert_eq!((b4.underlay, b4.mac, b4.dev.as_str()), (ip("198.18.9.2"), vtep_mac(ip("198.18.9.2")), "flock.vxlan"));
        assert!(p.unreachable.is_empty());
        // auto: host-gw to the on-link node, VXLAN to the other.
        let p = plan(&peers, &cfg(Routing::Auto), |a| a == ip("198.18.9.2") || a == ip("2001:db8:ff::2"));
        let routes: Vec<String> = p.routes.iter().map(describe).collect();
        assert_eq!(
            routes,
            vec![
                "198.18.2.0/24 via 198.18.9.2",
                "2001:db8:2::/64 via 2001:db8:ff::2",
                "2001:db8:3::/64 via 2001:db8:3:: dev flock.vxlan onlink src 2001:db8:ff::1",
            ]
        );
        // No shared underlay family: unreachable, by name.
        let lone = Peers {
            own: vec![ip("2001:db8:ff::1")],
            others: vec![("d".into(), vec![ip("198.18.9.4")], vec!["198.18.4.0/24".parse().unwrap()])],
        };
        let p = plan(&lone, &cfg(Routing::Vxlan), |_| true);
        assert!(p.routes.is_empty() && p.unreachable.values().all(|w| w.contains("node d")));
    }

    #[test]
    fn an_overlay_route_without_a_source_of_its_family_is_reported() {
        // This node has no IPv6 InternalIP: the other node's IPv6 pods go over IPv4, and the
        // host's own IPv6 packets have no source the other node's guard takes.
        let peers = Peers {
            own: vec![ip("198.18.0.1")],
            others: vec![("b".into(), vec![ip("198.18.9.2")], vec!["198.18.2.0/24".parse().unwrap(), "2001:db8:2::/64".parse().unwrap()])],
        };
        let p = plan(&peers, &cfg(Routing::Vxlan), |_| true);
        assert_eq!(p.routes.len(), 2);
        assert_eq!(p.sourceless.keys().map(ToString::to_string).collect::<Vec<_>>(), ["2001:db8:2::/64"]);
        assert!(p.sourceless.values().all(|w| w.contains("no InternalIP")));
    }

    #[test]
    fn vtep_macs_are_unicast_locally_administered_and_distinct() {
        let (a, b) = (vtep_mac(ip("198.18.0.1")), vtep_mac(ip("198.18.0.2")));
        assert_ne!(a, b);
        assert_eq!(a, vtep_mac(ip("198.18.0.1")));
        assert_eq!(a[0] & 0b11, 0b10, "locally administered, unicast");
    }

    #[test]
    fn on_link_is_the_longest_match_without_a_gateway() {
        let table =
            [("0.0.0.0/0".parse().unwrap(), true), ("198.18.9.0/24".parse().unwrap(), false), ("198.18.9.128/25".parse().unwrap(), true)];
        assert!(on_link(ip("198.18.9.2"), &table));
        assert!(!on_link(ip("198.18.9.200"), &table));
        assert!(!on_link(ip("198.18.10.1"), &table));
        assert!(!on_link(ip("2001:db8::1"), &table));
        assert!(on_link(ip("198.18.10.1"), &[("0.0.0.0/0".parse().unwrap(), false)]));
    }

    #[test]
    fn routing_modes_and_vxlan_settings_parse_and_check() {
        for m in ["host-gw", "vxlan", "auto"] {
            assert_eq!(m.parse::<Routing>().unwrap().to_string(), m);
        }
        assert!("hostgw".parse::<Routing>().is_err());
        assert!(VxlanConfig::default().check().is_ok());
        for bad in [
            VxlanConfig { vni: 0, ..VxlanConfig::default() },
            VxlanConfig { vni: 1 << 24, ..VxlanConfig::default() },
            VxlanConfig { port: 0, ..VxlanConfig::default() },
            VxlanConfig { device: "a-very-long-name".into(), ..VxlanConfig::default() },
            VxlanConfig { device: "bad name".into(), ..VxlanConfig::default() },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
