//! A small synchronous rtnetlink client over `netlink-sys` and `netlink-packet-route`
//! (the netavark approach: a CNI plugin is a short-lived process, blocking I/O fits it, and
//! no async runtime is needed).
//!
//! A netlink socket talks to the network namespace it was *created* in, so a [`Netlink`]
//! for a pod's namespace is created on a thread that has entered it (see
//! [`crate::dataplane`]). Each method says which `ip` command it equals.

use std::io;
use std::net::IpAddr;
use std::os::fd::RawFd;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage, AddressScope};
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage};
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

/// The main routing table.
const RT_TABLE_MAIN: u8 = 254;

/// A link: index, name, MAC (as text and as bytes), up or not, ARP off or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mac: String,
    pub lladdr: Vec<u8>,
    pub up: bool,
    pub noarp: bool,
    pub mtu: Option<u32>,
}

/// A neighbour entry: address, link-layer address, and whether it is permanent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbour {
    pub addr: IpAddr,
    pub lladdr: Vec<u8>,
    pub permanent: bool,
}

/// A route of the main table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteInfo {
    pub dst: IpAddr,
    pub prefix: u8,
    pub oif: Option<u32>,
    pub gateway: Option<IpAddr>,
}

/// A netlink route socket in the namespace of the thread that created it.
pub struct Netlink {
    socket: Socket,
    seq: u32,
}

impl Netlink {
    /// Opens a socket in the calling thread's network namespace.
    pub fn new() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(Self { socket, seq: 0 })
    }

    /// Sends one request and collects the replies until the ACK, the end of a dump, or an
    /// error (returned as the kernel's errno).
    fn request(&mut self, msg: RouteNetlinkMessage, flags: u16) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        packet.finalize();
        let mut buf = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket.send(&buf, 0)?;

        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut out = Vec::new();
        loop {
            let (data, _) = self.socket.recv_from_full()?;
            let mut offset = 0;
            while offset < data.len() {
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[offset..])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("bad netlink reply: {e}")))?;
                let len = reply.header.length as usize;
                if len == 0 {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "zero-length netlink message"));
                }
                offset += len;
                if reply.header.sequence_number != self.seq {
                    continue;
                }
                match reply.payload {
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(out),
                            Some(_) => Err(e.to_io()),
                        };
                    }
                    NetlinkPayload::InnerMessage(m) => {
                        out.push(m);
                        if !dump && flags & NLM_F_ACK == 0 {
                            return Ok(out);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// `ip link show NAME`; `None` when there is no such link.
    pub fn link(&mut self, name: &str) -> io::Result<Option<Link>> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.request(RouteNetlinkMessage::GetLink(msg), 0) {
            Ok(replies) => Ok(replies.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(link_of(&l)),
                _ => None,
            })),
            Err(e) if e.raw_os_error() == Some(nix::libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `ip link show`
    pub fn links(&mut self) -> io::Result<Vec<Link>> {
        let replies = self.request(RouteNetlinkMessage::GetLink(LinkMessage::default()), NLM_F_DUMP)?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(link_of(&l)),
                _ => None,
            })
            .collect())
    }

    /// `ip link add HOST address HOST_MAC [mtu M] type veth peer name PEER address PEER_MAC
    /// netns FD [mtu M]`: both ends are created at once, the peer directly in the namespace
    /// of `peer_netns`. Fails with EEXIST when either name is taken.
    pub fn add_veth(&mut self, host: (&str, [u8; 6]), peer: (&str, [u8; 6]), peer_netns: RawFd, mtu: Option<u32>) -> io::Result<()> {
        let mut peer_msg = LinkMessage::default();
        peer_msg.attributes.push(LinkAttribute::IfName(peer.0.to_string()));
        peer_msg.attributes.push(LinkAttribute::Address(peer.1.to_vec()));
        peer_msg.attributes.push(LinkAttribute::NetNsFd(peer_netns));
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(host.0.to_string()));
        msg.attributes.push(LinkAttribute::Address(host.1.to_vec()));
        if let Some(m) = mtu {
            msg.attributes.push(LinkAttribute::Mtu(m));
            peer_msg.attributes.push(LinkAttribute::Mtu(m));
        }
        msg.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Veth), LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_msg)))]));
        self.request(RouteNetlinkMessage::NewLink(msg), NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL).map(drop)
    }

    /// `ip link set dev INDEX up`
    pub fn set_up(&mut self, index: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        self.request(RouteNetlinkMessage::SetLink(msg), NLM_F_ACK).map(drop)
    }

    /// `ip link set dev INDEX arp off`: the kernel neither sends nor processes ARP on the
    /// link, and learns no IPv6 neighbour from it; its neighbours are then the permanent
    /// entries [`Netlink::add_permanent_neighbour`] writes.
    pub fn set_noarp(&mut self, index: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = LinkFlags::Noarp;
        msg.header.change_mask = LinkFlags::Noarp;
        self.request(RouteNetlinkMessage::SetLink(msg), NLM_F_ACK).map(drop)
    }

    /// `ip neigh replace ADDR lladdr MAC dev INDEX nud permanent`
    pub fn add_permanent_neighbour(&mut self, index: u32, addr: IpAddr, lladdr: &[u8]) -> io::Result<()> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = if addr.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
        msg.header.ifindex = index;
        msg.header.state = NeighbourState::Permanent;
        msg.header.kind = RouteType::Unicast;
        msg.attributes.push(NeighbourAttribute::Destination(match addr {
            IpAddr::V4(a) => NeighbourAddress::Inet(a),
            IpAddr::V6(a) => NeighbourAddress::Inet6(a),
        }));
        msg.attributes.push(NeighbourAttribute::LinkLayerAddress(lladdr.to_vec()));
        self.request(RouteNetlinkMessage::NewNeighbour(msg), NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE).map(drop)
    }

    /// `ip neigh show dev INDEX` (both families).
    pub fn neighbours(&mut self, index: u32) -> io::Result<Vec<Neighbour>> {
        let replies = self.request(RouteNetlinkMessage::GetNeighbour(NeighbourMessage::default()), NLM_F_DUMP)?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewNeighbour(n) if n.header.ifindex == index => {
                    let mut addr = None;
                    let mut lladdr = Vec::new();
                    for a in &n.attributes {
                        match a {
                            NeighbourAttribute::Destination(NeighbourAddress::Inet(v)) => addr = Some(IpAddr::V4(*v)),
                            NeighbourAttribute::Destination(NeighbourAddress::Inet6(v)) => addr = Some(IpAddr::V6(*v)),
                            NeighbourAttribute::LinkLayerAddress(l) => lladdr.clone_from(l),
                            _ => {}
                        }
                    }
                    Some(Neighbour { addr: addr?, lladdr, permanent: n.header.state == NeighbourState::Permanent })
                }
                _ => None,
            })
            .collect())
    }

    /// `ip link del dev INDEX` (a veth takes its peer with it).
    pub fn delete_link(&mut self, index: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.request(RouteNetlinkMessage::DelLink(msg), NLM_F_ACK).map(drop)
    }

    /// `ip addr add ADDR/PREFIX dev INDEX [nodad]` (IPv6 addresses get `nodad`: the pod's
    /// address is unique by IPAM, and DAD would delay traffic by a second).
    pub fn add_address(&mut self, index: u32, addr: IpAddr, prefix: u8) -> io::Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.index = index;
        msg.header.prefix_len = prefix;
        msg.header.scope = if addr.is_ipv6() && is_link_local(addr) { AddressScope::Link } else { AddressScope::Universe };
        match addr {
            IpAddr::V4(_) => msg.header.family = AddressFamily::Inet,
            IpAddr::V6(_) => {
                msg.header.family = AddressFamily::Inet6;
                msg.header.flags = AddressHeaderFlags::Nodad;
            }
        }
        msg.attributes.push(AddressAttribute::Local(addr));
        msg.attributes.push(AddressAttribute::Address(addr));
        self.request(RouteNetlinkMessage::NewAddress(msg), NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL).map(drop)
    }

    /// `ip addr show dev INDEX`: (address, prefix) pairs.
    pub fn addresses(&mut self, index: u32) -> io::Result<Vec<(IpAddr, u8)>> {
        let replies = self.request(RouteNetlinkMessage::GetAddress(AddressMessage::default()), NLM_F_DUMP)?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) if a.header.index == index => {
                    let addr = a.attributes.iter().find_map(|at| match at {
                        AddressAttribute::Address(ip) => Some(*ip),
                        _ => None,
                    })?;
                    Some((addr, a.header.prefix_len))
                }
                _ => None,
            })
            .collect())
    }

    /// `ip route add DST/PREFIX [via GW] dev OIF [scope link] [onlink]` in the main table.
    pub fn add_route(&mut self, dst: IpAddr, prefix: u8, gateway: Option<IpAddr>, oif: u32) -> io::Result<()> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = if dst.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
        msg.header.destination_prefix_length = prefix;
        msg.header.table = RT_TABLE_MAIN;
        msg.header.protocol = RouteProtocol::Static;
        msg.header.kind = RouteType::Unicast;
        msg.header.scope = if gateway.is_some() { RouteScope::Universe } else { RouteScope::Link };
        if prefix > 0 {
            msg.attributes.push(RouteAttribute::Destination(route_address(dst)));
        }
        if let Some(gw) = gateway {
            msg.attributes.push(RouteAttribute::Gateway(route_address(gw)));
        }
        msg.attributes.push(RouteAttribute::Oif(oif));
        self.request(RouteNetlinkMessage::NewRoute(msg), NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL).map(drop)
    }

    /// `ip route show table main` for one family.
    pub fn routes(&mut self, v6: bool) -> io::Result<Vec<RouteInfo>> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = if v6 { AddressFamily::Inet6 } else { AddressFamily::Inet };
        let replies = self.request(RouteNetlinkMessage::GetRoute(msg), NLM_F_DUMP)?;
        let unspecified: IpAddr = if v6 { std::net::Ipv6Addr::UNSPECIFIED.into() } else { std::net::Ipv4Addr::UNSPECIFIED.into() };
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) if r.header.table == RT_TABLE_MAIN => {
                    let mut info = RouteInfo { dst: unspecified, prefix: r.header.destination_prefix_length, oif: None, gateway: None };
                    for a in &r.attributes {
                        match a {
                            RouteAttribute::Destination(d) => info.dst = ip_of(d).unwrap_or(unspecified),
                            RouteAttribute::Gateway(g) => info.gateway = ip_of(g),
                            RouteAttribute::Oif(o) => info.oif = Some(*o),
                            _ => {}
                        }
                    }
                    Some(info)
                }
                _ => None,
            })
            .collect())
    }
}

fn link_of(l: &LinkMessage) -> Link {
    let mut link = Link {
        index: l.header.index,
        name: String::new(),
        mac: String::new(),
        lladdr: Vec::new(),
        up: l.header.flags.contains(LinkFlags::Up),
        noarp: l.header.flags.contains(LinkFlags::Noarp),
        mtu: None,
    };
    for a in &l.attributes {
        match a {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Address(b) => {
                link.mac = b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(":");
                link.lladdr.clone_from(b);
            }
            LinkAttribute::Mtu(m) => link.mtu = Some(*m),
            _ => {}
        }
    }
    link
}

fn route_address(ip: IpAddr) -> RouteAddress {
    match ip {
        IpAddr::V4(a) => RouteAddress::Inet(a),
        IpAddr::V6(a) => RouteAddress::Inet6(a),
    }
}

fn ip_of(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v) => Some(IpAddr::V4(*v)),
        RouteAddress::Inet6(v) => Some(IpAddr::V6(*v)),
        _ => None,
    }
}

fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
    }
}
