//! Routed pod networking, Calico style: one veth per pod, no bridge.
//!
//! - The pod side is created directly in the pod's namespace under the runtime's name
//!   (`CNI_IFNAME`), with the pod's addresses as /32 and /128 and link-local gateways:
//!   169.254.1.1 (configured nowhere) and fe80::1 (assigned to the host side), each a
//!   permanent neighbour entry with the host side's MAC, and a link-local address of its
//!   own (EUI-64 of its MAC, set by the plugin). Both MACs are set at creation. DAD is off
//!   on both ends so IPv6 works at once.
//! - The host side is named by [`crate::host_interface_name`] and gets a /32 or /128 route
//!   and a permanent neighbour entry (the pod side's MAC) per pod address and for the pod's
//!   link-local address, forwarding, no address of its own besides fe80::1, and ARP off: a
//!   pod is a hostile sender, and with ARP on, each ARP request or IPv6 neighbour
//!   solicitation from a forged source would become a neighbour entry of the node (the
//!   kernel's table is shared by every pod of the node, 1,024 entries by default). With ARP
//!   off the node processes no ARP from the pod and learns no neighbour from its
//!   solicitations (router solicitations, still recorded, are dropped by flock's ruleset);
//!   both ends know each other from the start.
//! - Every pod-to-pod packet is routed by the host and crosses the forward hook once, with
//!   the source pod's host interface as `iifname` and the destination's as `oifname`: that is
//!   what flock's ruleset dispatches on.
//!
//! Work in the pod's namespace runs on a thread that entered it ([`crate::netns`]); netlink
//! sockets are opened on that thread, so they talk to the pod's namespace.

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::netlink::Netlink;
use crate::netns::{self, NetnsError};

/// The pod's IPv4 gateway: configured nowhere; the pod's permanent neighbour entry for it
/// names the host side's MAC.
pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The MAC of every host-side interface (Calico's choice too: each veth is a link of its
/// own, so they may share it). Both ends get a MAC at creation, never a random one: udev's
/// `MACAddressPolicy=persistent` rewrites a random MAC shortly after a link appears, which
/// would leave the permanent neighbour entries naming a MAC that no longer exists.
pub const HOST_MAC: [u8; 6] = [0xee; 6];

pub use crate::naming::{eui64_link_local, pod_mac};

/// The pod's IPv6 gateway, assigned to every host-side interface (link-local, so repeating it
/// on each link is fine).
pub const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// What to wire.
#[derive(Debug, Clone)]
pub struct PodNetwork {
    /// Host-side interface name.
    pub host_if: String,
    /// Pod-side interface name (`CNI_IFNAME`).
    pub pod_if: String,
    /// The pod's network namespace (`CNI_NETNS`).
    pub netns: PathBuf,
    /// The pod's addresses (one per family at most).
    pub addrs: Vec<IpAddr>,
    /// Destinations routed via the gateway of their family (default routes when empty for a
    /// family the pod has).
    pub routes: Vec<(IpAddr, u8)>,
    pub mtu: Option<u32>,
}

/// What was wired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wired {
    pub host_mac: String,
    pub pod_mac: String,
}

/// Why wiring failed (nothing is left behind when it does).
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error("interface {name} already exists {place}")]
    Exists { name: String, place: String },
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("{what}: {source}")]
    Netlink {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("sysctl {key}: {source}")]
    Sysctl {
        key: String,
        #[source]
        source: io::Error,
    },
}

fn nl_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> DataplaneError {
    let what = what.into();
    move |source| DataplaneError::Netlink { what, source }
}

/// Writes `/proc/sys/<parts joined by />` in the calling thread's network namespace.
/// (Joined as path parts, not a dotted key: interface names may contain dots.)
pub fn sysctl(parts: &[&str], value: &str) -> Result<(), DataplaneError> {
    let mut path = PathBuf::from("/proc/sys");
    for p in parts {
        path.push(p);
    }
    std::fs::write(&path, value).map_err(|source| DataplaneError::Sysctl { key: parts.join("."), source })
}

/// Whether `name` exists in the calling thread's namespace.
pub fn link_exists(name: &str) -> Result<bool, DataplaneError> {
    let mut nl = Netlink::new().map_err(nl_err("netlink socket"))?;
    Ok(nl.link(name).map_err(nl_err(format!("looking up {name}")))?.is_some())
}

/// Wires the pod. On error everything created is removed again.
pub fn setup(p: &PodNetwork) -> Result<Wired, DataplaneError> {
    let ns = File::open(&p.netns).map_err(|source| NetnsError::Open { path: p.netns.clone(), source })?;
    let mut host = Netlink::new().map_err(nl_err("netlink socket"))?;
    if host.link(&p.host_if).map_err(nl_err(format!("looking up {}", p.host_if)))?.is_some() {
        return Err(DataplaneError::Exists { name: p.host_if.clone(), place: "on the host (an earlier ADD of this attachment)".into() });
    }
    let pod_if = p.pod_if.clone();
    let pod_exists = netns::run_in_file(&ns, &p.netns, move || -> Result<bool, DataplaneError> {
        let mut nl = Netlink::new().map_err(nl_err("netlink socket in the pod"))?;
        Ok(nl.link(&pod_if).map_err(nl_err(format!("looking up {pod_if} in the pod")))?.is_some())
    })??;
    if pod_exists {
        return Err(DataplaneError::Exists { name: p.pod_if.clone(), place: format!("in {}", p.netns.display()) });
    }
    host.add_veth((&p.host_if, HOST_MAC), (&p.pod_if, pod_mac(&p.host_if)), ns.as_raw_fd(), p.mtu).map_err(|e| {
        if e.raw_os_error() == Some(nix::libc::EEXIST) {
            DataplaneError::Exists { name: format!("{} or {}", p.host_if, p.pod_if), place: "(created concurrently)".into() }
        } else {
            DataplaneError::Netlink { what: format!("creating veth {} / {}", p.host_if, p.pod_if), source: e }
        }
    })?;
    match configure(p, &ns, &mut host) {
        Ok(w) => Ok(w),
        Err(e) => {
            // Deleting the host side removes the pod side, its addresses and all routes.
            let _ = teardown(&p.host_if);
            Err(e)
        }
    }
}

fn configure(p: &PodNetwork, ns: &File, host: &mut Netlink) -> Result<Wired, DataplaneError> {
    let has_v4 = p.addrs.iter().any(IpAddr::is_ipv4);
    let has_v6 = p.addrs.iter().any(IpAddr::is_ipv6);
    let hl = host.link(&p.host_if).map_err(nl_err(format!("looking up {}", p.host_if)))?.ok_or_else(|| DataplaneError::Netlink {
        what: format!("{} vanished after creation", p.host_if),
        source: io::Error::from_raw_os_error(nix::libc::ENODEV),
    })?;

    // Host side: no IPv4 address, no ARP (the neighbours on both ends are permanent).
    let h = p.host_if.as_str();
    host.set_noarp(hl.index).map_err(nl_err(format!("setting {h} arp off")))?;
    if has_v4 {
        sysctl(&["net", "ipv4", "conf", h, "forwarding"], "1")?;
        sysctl(&["net", "ipv4", "ip_forward"], "1")?;
    }
    if has_v6 {
        sysctl(&["net", "ipv6", "conf", h, "accept_dad"], "0")?;
        sysctl(&["net", "ipv6", "conf", h, "forwarding"], "1")?;
        sysctl(&["net", "ipv6", "conf", "all", "forwarding"], "1")?;
        host.add_address(hl.index, IpAddr::V6(GATEWAY_V6), 64).map_err(nl_err(format!("adding {GATEWAY_V6}/64 to {h}")))?;
    }
    host.set_up(hl.index).map_err(nl_err(format!("setting {h} up")))?;

    // Pod side.
    let pod = p.clone();
    let host_lladdr = hl.lladdr.clone();
    let pod_lladdr = pod_mac(&p.host_if);
    let pod_link = netns::run_in_file(ns, &p.netns, move || -> Result<(crate::netlink::Link, Vec<IpAddr>), DataplaneError> {
        let mut nl = Netlink::new().map_err(nl_err("netlink socket in the pod"))?;
        let i = pod.pod_if.as_str();
        let link = nl.link(i).map_err(nl_err(format!("looking up {i} in the pod")))?.ok_or_else(|| DataplaneError::Netlink {
            what: format!("{i} did not appear in the pod"),
            source: io::Error::from_raw_os_error(nix::libc::ENODEV),
        })?;
        // The pod side's link-local address, set here rather than by the kernel (which adds
        // it only once the carrier is seen, after ADD returns): the node answers what the
        // pod sends from it (to fe80::1) through a permanent neighbour entry too.
        let mut link_local = Vec::new();
        if has_v6 {
            sysctl(&["net", "ipv6", "conf", i, "accept_dad"], "0")?;
            sysctl(&["net", "ipv6", "conf", i, "addr_gen_mode"], "1")?;
            let ll = IpAddr::V6(eui64_link_local(pod_lladdr));
            nl.add_address(link.index, ll, 64).map_err(nl_err(format!("adding {ll}/64 to {i}")))?;
            link_local.push(ll);
        }
        for a in &pod.addrs {
            let prefix = if a.is_ipv4() { 32 } else { 128 };
            nl.add_address(link.index, *a, prefix).map_err(nl_err(format!("adding {a}/{prefix} to {i}")))?;
        }
        nl.set_up(link.index).map_err(nl_err(format!("setting {i} up")))?;
        for gw in gateways(has_v4, has_v6) {
            nl.add_permanent_neighbour(link.index, gw, &host_lladdr).map_err(nl_err(format!("neighbour {gw} on {i}")))?;
        }
        if has_v4 {
            let gw = IpAddr::V4(GATEWAY_V4);
            nl.add_route(gw, 32, None, link.index).map_err(nl_err(format!("route {gw} dev {i} scope link")))?;
        }
        for (dst, prefix, gw) in pod_routes(&pod) {
            nl.add_route(dst, prefix, Some(gw), link.index).map_err(nl_err(format!("route {dst}/{prefix} via {gw} dev {i}")))?;
        }
        Ok((link, link_local))
    })??;
    let (pod_link, pod_link_local) = pod_link;
    for a in &pod_link_local {
        host.add_permanent_neighbour(hl.index, *a, &pod_link.lladdr).map_err(nl_err(format!("neighbour {a} on {h}")))?;
    }

    for a in &p.addrs {
        let prefix = if a.is_ipv4() { 32 } else { 128 };
        host.add_permanent_neighbour(hl.index, *a, &pod_link.lladdr).map_err(nl_err(format!("neighbour {a} on {h}")))?;
        host.add_route(*a, prefix, None, hl.index).map_err(nl_err(format!("route {a}/{prefix} dev {h}")))?;
    }
    Ok(Wired { host_mac: hl.mac, pod_mac: pod_link.mac })
}

/// The pod's gateways, one per family it has: permanent neighbours of the pod side.
fn gateways(has_v4: bool, has_v6: bool) -> impl Iterator<Item = IpAddr> {
    [has_v4.then_some(IpAddr::V4(GATEWAY_V4)), has_v6.then_some(IpAddr::V6(GATEWAY_V6))].into_iter().flatten()
}

/// The pod's routes: the configured ones for each family it has an address in, or a
/// default route; each via the gateway of its family.
pub fn pod_routes(p: &PodNetwork) -> Vec<(IpAddr, u8, IpAddr)> {
    let mut out = Vec::new();
    for (v6, gw, default) in [
        (false, IpAddr::V4(GATEWAY_V4), IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        (true, IpAddr::V6(GATEWAY_V6), IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
    ] {
        if !p.addrs.iter().any(|a| a.is_ipv6() == v6) {
            continue;
        }
        let configured: Vec<(IpAddr, u8)> = p.routes.iter().copied().filter(|(d, _)| d.is_ipv6() == v6).collect();
        if configured.is_empty() {
            out.push((default, 0, gw));
        } else {
            out.extend(configured.into_iter().map(|(d, pl)| (d, pl, gw)));
        }
    }
    out
}

/// Removes the host side (and with it the pod side and every route). `Ok(false)` when it
/// was already gone.
pub fn teardown(host_if: &str) -> Result<bool, DataplaneError> {
    let mut nl = Netlink::new().map_err(nl_err("netlink socket"))?;
    let Some(link) = nl.link(host_if).map_err(nl_err(format!("looking up {host_if}")))? else { return Ok(false) };
    match nl.delete_link(link.index) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(nix::libc::ENODEV) => Ok(false),
        Err(e) => Err(DataplaneError::Netlink { what: format!("deleting {host_if}"), source: e }),
    }
}

/// Verifies the attachment as [`setup`] left it: both interfaces, the pod's addresses, the
/// host routes. The error says what is missing.
pub fn check(p: &PodNetwork) -> Result<(), String> {
    let mut host = Netlink::new().map_err(|e| format!("netlink socket: {e}"))?;
    let hl = host
        .link(&p.host_if)
        .map_err(|e| format!("looking up {}: {e}", p.host_if))?
        .ok_or_else(|| format!("host interface {} is missing", p.host_if))?;
    if !hl.up {
        return Err(format!("host interface {} is down", p.host_if));
    }
    for v6 in [false, true] {
        let wanted: Vec<&IpAddr> = p.addrs.iter().filter(|a| a.is_ipv6() == v6).collect();
        if wanted.is_empty() {
            continue;
        }
        let routes = host.routes(v6).map_err(|e| format!("listing routes: {e}"))?;
        for a in wanted {
            let full = if v6 { 128 } else { 32 };
            if !routes.iter().any(|r| r.dst == *a && r.prefix == full && r.oif == Some(hl.index)) {
                return Err(format!("host route {a}/{full} dev {} is missing", p.host_if));
            }
        }
    }
    // With ARP off (every attachment this version makes), the node reaches the pod only
    // through its permanent neighbour entries.
    let noarp = hl.noarp;
    if noarp {
        let neighbours = host.neighbours(hl.index).map_err(|e| format!("listing neighbours of {}: {e}", p.host_if))?;
        let mac = pod_mac(&p.host_if);
        for a in &p.addrs {
            if !neighbours.iter().any(|n| n.addr == *a && n.permanent && n.lladdr == mac) {
                return Err(format!("permanent neighbour {a} on {} is missing", p.host_if));
            }
        }
    }
    let ns = File::open(&p.netns).map_err(|e| format!("cannot open {}: {e}", p.netns.display()))?;
    let pod = p.clone();
    netns::run_in_file(&ns, &p.netns, move || -> Result<(), String> {
        let mut nl = Netlink::new().map_err(|e| format!("netlink socket in the pod: {e}"))?;
        let link = nl
            .link(&pod.pod_if)
            .map_err(|e| format!("looking up {}: {e}", pod.pod_if))?
            .ok_or_else(|| format!("{} is missing in {}", pod.pod_if, pod.netns.display()))?;
        let have = nl.addresses(link.index).map_err(|e| format!("listing addresses: {e}"))?;
        for a in &pod.addrs {
            if !have.iter().any(|(h, _)| h == a) {
                return Err(format!("address {a} is missing on {} in {}", pod.pod_if, pod.netns.display()));
            }
        }
        if noarp {
            let neighbours = nl.neighbours(link.index).map_err(|e| format!("listing neighbours in the pod: {e}"))?;
            let (v4, v6) = (pod.addrs.iter().any(IpAddr::is_ipv4), pod.addrs.iter().any(IpAddr::is_ipv6));
            for gw in gateways(v4, v6) {
                if !neighbours.iter().any(|n| n.addr == gw && n.permanent && n.lladdr == HOST_MAC) {
                    return Err(format!("the gateway's permanent neighbour {gw} on {} in {} is missing", pod.pod_if, pod.netns.display()));
                }
            }
        }
        Ok(())
    })
    .map_err(|e| e.to_string())?
}

/// Every link whose name starts with `prefix`, in the calling thread's namespace.
pub fn links_with_prefix(prefix: &str) -> Result<Vec<String>, DataplaneError> {
    let mut nl = Netlink::new().map_err(nl_err("netlink socket"))?;
    Ok(nl.links().map_err(nl_err("listing links"))?.into_iter().map(|l| l.name).filter(|n| n.starts_with(prefix)).collect())
}

/// Whether a network namespace path can be opened.
pub fn netns_exists(path: &Path) -> bool {
    File::open(path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_macs_are_unicast_locally_administered_and_follow_the_name() {
        let name = crate::host_interface_name("cid", "eth0");
        let mac = pod_mac(&name);
        assert_eq!(mac[0] & 0x03, 0x02, "unicast, locally administered: {mac:02x?}");
        assert_eq!(format!("{:02x}{:02x}{:02x}{:02x}{:02x}", mac[1], mac[2], mac[3], mac[4], mac[5]), name[5..]);
        assert_ne!(pod_mac(&crate::host_interface_name("cid2", "eth0")), mac);
        assert_eq!(HOST_MAC[0] & 0x03, 0x02);
        assert_eq!(eui64_link_local([0x0a, 0x11, 0x22, 0x33, 0x44, 0x55]), "fe80::811:22ff:fe33:4455".parse::<Ipv6Addr>().unwrap());
    }
}
