//! Node routing, "host-gw" style: a route to every other node's pod CIDRs via that node's
//! InternalIP of the same family, programmed with rtnetlink in the node's namespace and
//! tagged with flock's route protocol so stale ones can be found and removed without
//! touching anyone else's routes.

use std::collections::BTreeSet;
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

/// One desired route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct NodeRoute {
    pub(crate) dst: IpNet,
    pub(crate) via: IpAddr,
}

/// Routes `node` needs: other nodes' pod CIDRs via their InternalIP of the same family. A
/// CIDR of this node, or one without a gateway of its family, gets no route.
pub(crate) fn desired_routes(snapshot: &Snapshot, node: &str) -> BTreeSet<NodeRoute> {
    let mut out = BTreeSet::new();
    for n in snapshot.nodes().filter(|n| n.name != node) {
        for cidr in &n.pod_cidrs {
            if let Some(via) = n.internal_ips.iter().find(|ip| ip.is_ipv4() == matches!(cidr, IpNet::V4(_))) {
                out.insert(NodeRoute { dst: cidr.trunc(), via: *via });
            }
        }
    }
    out
}

/// Why routes could not be programmed.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("route {route}: {message}")]
    Netlink { route: String, message: String },
    #[error("the route programmer of {netns} stopped")]
    Stopped { netns: String },
    #[error(transparent)]
    Netns(#[from] crate::netns::NetnsError),
    #[error("cannot open a netlink connection in {netns}: {source}")]
    Connect {
        netns: String,
        #[source]
        source: std::io::Error,
    },
}

type Job = (BTreeSet<NodeRoute>, oneshot::Sender<Result<RouteChanges, RouteError>>);

/// What a reconcile changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RouteChanges {
    pub(crate) added: usize,
    pub(crate) removed: usize,
}

/// Programs routes in one namespace, from a thread of its own that entered it (a netlink
/// socket talks to the namespace it was opened in; async workers never change namespace).
pub(crate) struct Router {
    tx: mpsc::Sender<Job>,
    netns: String,
}

impl Router {
    /// Starts the programmer thread for `ns`.
    pub(crate) fn start(ns: Netns) -> Result<Self, RouteError> {
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
                        let _ = ready_tx.send(Ok(()));
                        while let Some((want, reply)) = rx.recv().await {
                            let _ = reply.send(reconcile(&handle, &want).await);
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

    /// Makes flock's routes exactly `want`.
    pub(crate) async fn sync(&self, want: BTreeSet<NodeRoute>) -> Result<RouteChanges, RouteError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send((want, reply)).await.map_err(|_| RouteError::Stopped { netns: self.netns.clone() })?;
        rx.await.map_err(|_| RouteError::Stopped { netns: self.netns.clone() })?
    }
}

fn message(r: &NodeRoute) -> RouteMessage {
    let proto = RouteProtocol::Other(ROUTE_PROTOCOL);
    match (r.dst, r.via) {
        (IpNet::V4(d), IpAddr::V4(g)) => {
            RouteMessageBuilder::<std::net::Ipv4Addr>::new().destination_prefix(d.addr(), d.prefix_len()).gateway(g).protocol(proto).build()
        }
        (IpNet::V6(d), IpAddr::V6(g)) => {
            RouteMessageBuilder::<std::net::Ipv6Addr>::new().destination_prefix(d.addr(), d.prefix_len()).gateway(g).protocol(proto).build()
        }
        // desired_routes pairs families; a mismatch cannot be built.
        _ => RouteMessage::default(),
    }
}

fn parse_route(m: &RouteMessage) -> Option<NodeRoute> {
    let mut dst = None;
    let mut via = None;
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(RouteAddress::Inet(d)) => dst = Some(IpAddr::V4(*d)),
            RouteAttribute::Destination(RouteAddress::Inet6(d)) => dst = Some(IpAddr::V6(*d)),
            RouteAttribute::Gateway(RouteAddress::Inet(g)) => via = Some(IpAddr::V4(*g)),
            RouteAttribute::Gateway(RouteAddress::Inet6(g)) => via = Some(IpAddr::V6(*g)),
            _ => {}
        }
    }
    let dst = IpNet::new(dst?, m.header.destination_prefix_length).ok()?;
    Some(NodeRoute { dst, via: via? })
}

async fn ours(handle: &Handle) -> Result<Vec<(NodeRoute, RouteMessage)>, RouteError> {
    let mut out = Vec::new();
    for probe in [RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(), RouteMessageBuilder::<std::net::Ipv6Addr>::new().build()] {
        let mut stream = handle.route().get(probe).execute();
        while let Some(m) = stream.try_next().await.map_err(|e| RouteError::Netlink { route: "listing".into(), message: e.to_string() })? {
            if m.header.protocol == RouteProtocol::Other(ROUTE_PROTOCOL)
                && let Some(r) = parse_route(&m)
            {
                out.push((r, m));
            }
        }
    }
    Ok(out)
}

async fn reconcile(handle: &Handle, want: &BTreeSet<NodeRoute>) -> Result<RouteChanges, RouteError> {
    let have = ours(handle).await?;
    let mut changes = RouteChanges::default();
    for (r, m) in &have {
        if !want.contains(r) {
            handle
                .route()
                .del(m.clone())
                .execute()
                .await
                .map_err(|e| RouteError::Netlink { route: format!("{} via {}", r.dst, r.via), message: e.to_string() })?;
            changes.removed += 1;
        }
    }
    let present: BTreeSet<NodeRoute> = have.iter().map(|(r, _)| *r).collect();
    for r in want.iter().filter(|r| !present.contains(r)) {
        // `replace`: a route to the same prefix left by an earlier run with another gateway
        // is taken over rather than failing with EEXIST.
        handle
            .route()
            .add(message(r))
            .replace()
            .execute()
            .await
            .map_err(|e| RouteError::Netlink { route: format!("{} via {}", r.dst, r.via), message: e.to_string() })?;
        changes.added += 1;
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit;

    #[test]
    fn routes_to_other_nodes_pod_cidrs_by_family() {
        let mut s = testkit::base_cluster();
        let want = desired_routes(&s, "node-1");
        assert_eq!(
            want.into_iter().collect::<Vec<_>>(),
            vec![NodeRoute { dst: "198.18.2.0/24".parse().unwrap(), via: "198.18.0.2".parse().unwrap() }]
        );
        // An IPv6 CIDR without an IPv6 InternalIP gets no route; with one, it does.
        let mut n2 = s.node("node-2").unwrap().clone();
        n2.pod_cidrs.push("2001:db8:2::/64".parse().unwrap());
        s.upsert_node(n2.clone());
        assert_eq!(desired_routes(&s, "node-1").len(), 1);
        n2.internal_ips.push("2001:db8:ff::2".parse().unwrap());
        s.upsert_node(n2);
        assert_eq!(desired_routes(&s, "node-1").len(), 2);
        assert!(desired_routes(&s, "node-2").iter().all(|r| r.dst.to_string() == "198.18.1.0/24"));
    }
}
