//! Which established connections the policy in force no longer admits: pure, from the node's
//! [`NodePolicy`] (the translation the renderer wrote into the committed table) and the
//! connections conntrack lists.
//!
//! The ruleset accepts every packet of an established connection before any policy (the
//! cheap path every packet takes); only a connection's first packet meets policy. So after a
//! change the agent lists the node's connections, judges each as its first packet would be
//! judged now — egress at a source pod of this node, then ingress at a destination pod of this
//! node, on the addresses and port after DNAT ([`Entry::policed`]) — with the very decision
//! function `flockctl explain` uses ([`crate::explain::decide_transport`]), and sets a bit of
//! the ct mark of the connections denied. The ruleset's first rule stops every packet of a
//! marked connection, both ways (`render::revoked_rule`): TCP answered with a reset, so each
//! end learns the connection is gone as soon as it sends; the entry stays until it expires,
//! so no packet of the connection — a reply in flight included — can start it again as a new
//! one. A marked connection the policy admits again is unmarked.
//!
//! Pure like the translator (checked by `tests/purity.rs`).
//!
//! Connections a local pod opened to the node's own addresses are judged like any other (hook
//! `input` sends their packets through the pod's egress policy, and stops marked ones);
//! connections the node opened (kubelet probes, to its pods or anywhere) are not policed and
//! are left alone.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use crate::conntrack::{Entry, Tuple};
use crate::explain::{Decider, PolicyRef, Transport, Verdict, decide_flow, denies_flow};
use crate::model::Protocol;
use crate::translate::{Direction, EndpointPolicy, NodePolicy};

/// One connection the policy in force denies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    /// The connection as policy judges it (after DNAT).
    pub(crate) flow: Tuple,
    /// Why (shared by the connections of one pod, peer and port).
    pub(crate) why: Arc<Why>,
}

/// What denies a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Why {
    /// The pod whose policy denies it, `namespace/name`.
    pub(crate) pod: String,
    pub(crate) namespace: String,
    pub(crate) direction: Direction,
    pub(crate) decided_by: Decider,
    /// The rules or isolating policies that deny it.
    pub(crate) deciding: Vec<PolicyRef>,
    /// A sentence for people.
    pub(crate) reason: String,
}

impl Why {
    /// What denies, for logs: each deciding policy, or the tier when none is named.
    pub(crate) fn cause(&self) -> String {
        if self.deciding.is_empty() {
            return self.decided_by.to_string();
        }
        self.deciding.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    }
}

/// Judges connections against one node's policy.
pub struct Judge<'a> {
    np: &'a NodePolicy,
    local: BTreeMap<IpAddr, &'a EndpointPolicy>,
    node_addrs: &'a BTreeSet<IpAddr>,
}

impl<'a> Judge<'a> {
    /// `node_addrs`: the node's own addresses (its namespace's, not its pods'): connections
    /// from them are the node's, which policy does not judge.
    pub fn new(np: &'a NodePolicy, node_addrs: &'a BTreeSet<IpAddr>) -> Self {
        let local = np.endpoints.iter().flat_map(|e| e.addrs.iter().map(move |a| (*a, e))).collect();
        Self { np, local, node_addrs }
    }

    /// `None`: the policy admits the connection, or does not police it.
    #[cfg(test)]
    pub(crate) fn judge(&self, flow: &Tuple) -> Option<Revocation> {
        self.why(flow, false).map(|why| Revocation { flow: *flow, why: Arc::new(why) })
    }

    /// The ends this node polices: (the local pod's policy, its direction, the peer), egress
    /// first as in the data path.
    fn ends(&self, flow: &Tuple) -> impl Iterator<Item = (&'a EndpointPolicy, Direction, IpAddr)> + use<'a, '_> {
        let policed = !self.node_addrs.contains(&flow.src);
        let ends = [(flow.src, Direction::Egress, flow.dst), (flow.dst, Direction::Ingress, flow.src)];
        ends.into_iter().filter(move |_| policed).filter_map(|(at, dir, peer)| self.local.get(&at).map(|ep| (*ep, dir, peer)))
    }

    /// Whether the policy denies the connection (nothing allocated). `domain_admitted`: a
    /// domain rule admitted it (its ct mark has `render::DOMAIN_MARK`): the domain rules that
    /// still exist keep it, whatever the TTL of the address it went to (NPEP-133).
    pub(crate) fn denied(&self, flow: &Tuple, domain_admitted: bool) -> bool {
        let transport = transport(flow);
        self.ends(flow).any(|(ep, dir, peer)| denies_flow(self.np, ep, dir, peer, transport, domain_admitted && dir == Direction::Egress))
    }

    fn why(&self, flow: &Tuple, domain_admitted: bool) -> Option<Why> {
        let transport = transport(flow);
        for (ep, direction, peer) in self.ends(flow) {
            let d = decide_flow(self.np, ep, direction, peer, transport, domain_admitted && direction == Direction::Egress);
            if d.verdict == Verdict::Deny {
                return Some(Why {
                    pod: ep.pod.to_string(),
                    namespace: ep.pod.namespace.clone(),
                    direction,
                    decided_by: d.decided_by,
                    deciding: d.deciding,
                    reason: d.reason,
                });
            }
        }
        None
    }

    /// What to change in `entries` for the ct mark bit `bit` to say exactly which connections
    /// the policy denies: the denied ones without it, with why, and the marked ones the policy
    /// admits again. Closed TCP connections are left alone (nothing flows on them; a SYN of
    /// their tuple starts a new connection, which policy judges).
    pub fn sweep<'e>(&self, entries: &'e [Entry], bit: u32) -> Sweep<'e> {
        let mut out = Sweep::default();
        // Connections differing only in the source port are judged alike: judged once, and
        // explained (for the log) only when they are revoked.
        let mut whys: BTreeMap<(IpAddr, IpAddr, u8, u16, bool), Arc<Why>> = BTreeMap::new();
        for e in entries.iter().filter(|e| !e.is_closed()) {
            let flow = e.policed();
            let marked = e.mark & bit != 0;
            let domain = e.mark & crate::render::DOMAIN_MARK != 0;
            match (self.denied(&flow, domain), marked) {
                (true, false) => {
                    let key = (flow.src, flow.dst, flow.protocol, flow.dport, domain);
                    let why = match whys.get(&key) {
                        Some(w) => Arc::clone(w),
                        None => match self.why(&flow, domain) {
                            Some(w) => Arc::clone(whys.entry(key).or_insert(Arc::new(w))),
                            None => continue,
                        },
                    };
                    out.revoke.push((e, Revocation { flow, why }));
                }
                (false, true) => out.restore.push(e),
                _ => {}
            }
        }
        out
    }
}

fn transport(flow: &Tuple) -> Transport {
    match flow.protocol {
        6 => Transport::Port(Protocol::Tcp, flow.dport),
        17 => Transport::Port(Protocol::Udp, flow.dport),
        132 => Transport::Port(Protocol::Sctp, flow.dport),
        _ => Transport::Other,
    }
}

/// What one pass over the conntrack table changes.
#[derive(Debug, Default)]
pub struct Sweep<'e> {
    /// Connections the policy denies, not marked yet.
    pub revoke: Vec<(&'e Entry, Revocation)>,
    /// Marked connections the policy admits again (it changed back).
    pub restore: Vec<&'e Entry>,
}

/// A batch of revocations summed up for one log line: how many connections each cause cut.
pub(crate) fn by_cause(revocations: &[Revocation]) -> BTreeMap<String, usize> {
    let mut causes: BTreeMap<*const Why, String> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for r in revocations {
        let cause = causes.entry(Arc::as_ptr(&r.why)).or_insert_with(|| r.why.cause());
        *out.entry(cause.clone()).or_insert(0) += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit;
    use crate::translate::{Options, translate};

    /// The base cluster with x/a isolated for ingress (only x/b admitted, TCP 80) and z/a's
    /// egress denied to y/b by a ClusterNetworkPolicy.
    fn policy(node: &str) -> (NodePolicy, crate::model::Snapshot) {
        let mut s = testkit::base_cluster();
        for p in testkit::policies(
            "
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-from-b, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: b}}}], ports: [{port: 80}]}]",
        ) {
            s.upsert_policy(p);
        }
        let endpoints = s.derived_endpoints(node);
        (translate(&s, &endpoints, &Options::default()), s)
    }

    /// The policy of x/a's node.
    fn on_x_a_node() -> (NodePolicy, crate::model::Snapshot) {
        let s0 = testkit::base_cluster();
        let node = s0.pod_by_name(&testkit::pod_ref("x/a")).and_then(|p| p.node.clone()).expect("x/a has a node");
        policy(&node)
    }

    fn ip(s: &crate::model::Snapshot, pod: &str) -> IpAddr {
        s.pod_by_name(&testkit::pod_ref(pod)).and_then(|p| p.ips.first().copied()).expect("pod address")
    }

    fn flow(src: IpAddr, dst: IpAddr, protocol: u8, dport: u16) -> Tuple {
        Tuple { src, dst, protocol, sport: 40000, dport }
    }

    #[test]
    fn connections_are_judged_as_their_first_packet_would_be_now() {
        let (np, s) = on_x_a_node();
        let none = BTreeSet::new();
        let judge = Judge::new(&np, &none);
        let (xa, xb, yb) = (ip(&s, "x/a"), ip(&s, "x/b"), ip(&s, "y/b"));
        // Admitted: x/b to x/a on TCP 80.
        assert_eq!(judge.judge(&flow(xb, xa, 6, 80)), None);
        // Denied: another port, another peer, another protocol (ICMP: only rules without
        // ports admit it).
        let r = judge.judge(&flow(xb, xa, 6, 81)).expect("port 81 is denied");
        assert_eq!((r.why.pod.as_str(), r.why.namespace.as_str(), r.why.direction), ("x/a", "x", Direction::Ingress));
        assert_eq!(r.why.decided_by, Decider::NetworkPolicy);
        assert_eq!(r.why.cause(), "NetworkPolicy x/a-from-b: Isolate");
        assert!(judge.judge(&flow(yb, xa, 6, 80)).is_some());
        assert!(judge.judge(&flow(xb, xa, 1, 0)).is_some());
        assert!(judge.judge(&flow(xb, xa, 17, 80)).is_some());
        // x/a's egress is not isolated.
        assert_eq!(judge.judge(&flow(xa, yb, 6, 81)), None);
        // The node's own address as the source: what the node sends is not policed.
        let own: BTreeSet<IpAddr> = [xb].into();
        assert_eq!(Judge::new(&np, &own).judge(&flow(xb, xa, 6, 81)), None);
    }

    /// A pod's connection to its own node is judged by the pod's egress, as its packets are
    /// (hook `input`); the node's connection to the pod (a kubelet probe) is not policed.
    #[test]
    fn a_pods_connections_to_its_own_node_are_judged_the_nodes_to_it_are_not() {
        let mut s = testkit::base_cluster();
        let deny = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny-all, namespace: x}\nspec: {podSelector: {}, policyTypes: [Ingress, Egress]}\n";
        for p in testkit::policies(deny) {
            s.upsert_policy(p);
        }
        let node = s.pod_by_name(&testkit::pod_ref("x/a")).and_then(|p| p.node.clone()).expect("x/a has a node");
        let node_ip = s.node(&node).and_then(|n| n.internal_ips.first().copied()).expect("the node's InternalIP");
        let np = translate(&s, &s.derived_endpoints(&node), &Options::default());
        let own: BTreeSet<IpAddr> = [node_ip].into();
        let judge = Judge::new(&np, &own);
        let xa = ip(&s, "x/a");
        let r = judge.judge(&flow(xa, node_ip, 6, 10250)).expect("x/a's egress denies its node's kubelet port");
        assert_eq!((r.why.pod.as_str(), r.why.direction), ("x/a", Direction::Egress));
        assert_eq!(judge.judge(&flow(node_ip, xa, 6, 80)), None, "a kubelet probe is never revoked");
    }

    #[test]
    fn a_sweep_marks_the_denied_and_unmarks_the_admitted() {
        let (np, s) = on_x_a_node();
        let none = BTreeSet::new();
        let judge = Judge::new(&np, &none);
        let (xa, xb, yb) = (ip(&s, "x/a"), ip(&s, "x/b"), ip(&s, "y/b"));
        let entry = |f: Tuple, mark: u32, tcp_state: Option<u8>| {
            let reply = Tuple { src: f.dst, dst: f.src, protocol: f.protocol, sport: f.dport, dport: f.sport };
            let mut e = Entry::new(f, reply);
            (e.mark, e.tcp_state) = (mark, tcp_state);
            e
        };
        const BIT: u32 = 0x0100_0000;
        let entries = [
            entry(flow(yb, xa, 6, 80), 0, Some(3)),     // denied, unmarked: revoke
            entry(flow(yb, xa, 17, 80), BIT | 1, None), // denied, marked: as is
            entry(flow(xb, xa, 6, 80), BIT, Some(3)),   // admitted, marked: restore
            entry(flow(xb, xa, 6, 80), 1, Some(3)),     // admitted, another agent's bit: as is
            entry(flow(yb, xa, 6, 81), 0, Some(7)),     // denied but closed (TIME_WAIT): as is
            entry(flow(yb, xa, 132, 80), 0, None),      // SCTP: the rule's port is TCP's: revoke
        ];
        let sw = judge.sweep(&entries, BIT);
        let revoked: Vec<Tuple> = sw.revoke.iter().map(|(e, _)| e.orig).collect();
        assert_eq!(revoked, vec![entries[0].orig, entries[5].orig]);
        assert_eq!(sw.restore.iter().map(|e| e.orig).collect::<Vec<_>>(), vec![entries[2].orig]);
    }

    /// A connection a domain rule admitted (its ct mark says so) is kept while the rule
    /// exists, whatever its address's TTL; the same connection without the mark, or to a
    /// port the rule does not name, is revoked.
    #[test]
    fn domain_admitted_connections_live_while_their_rule_does() {
        let s = testkit::base_cluster_with(&testkit::domain_policy("x", &["*.example.test"], 443));
        let node = s.pod_by_name(&testkit::pod_ref("x/a")).and_then(|p| p.node.clone()).unwrap();
        let np = translate(&s, &s.derived_endpoints(&node), &Options::default());
        let none = BTreeSet::new();
        let judge = Judge::new(&np, &none);
        let (xa, out) = (ip(&s, "x/a"), "198.18.250.80".parse().unwrap());
        let entry = |f: Tuple, mark: u32| {
            let reply = Tuple { src: f.dst, dst: f.src, protocol: f.protocol, sport: f.dport, dport: f.sport };
            let mut e = Entry::new(f, reply);
            (e.mark, e.tcp_state) = (mark, Some(3));
            e
        };
        const BIT: u32 = 0x0100_0000;
        let domain = crate::render::DOMAIN_MARK;
        let entries = [entry(flow(xa, out, 6, 443), domain), entry(flow(xa, out, 6, 443), 0), entry(flow(xa, out, 6, 22), domain)];
        let sw = judge.sweep(&entries, BIT);
        let revoked: Vec<Tuple> = sw.revoke.iter().map(|(e, _)| e.orig).collect();
        assert_eq!(revoked, vec![entries[1].orig, entries[2].orig]);
    }

    #[test]
    fn a_service_connection_is_judged_after_dnat() {
        let (np, s) = on_x_a_node();
        let none = BTreeSet::new();
        let judge = Judge::new(&np, &none);
        let (xa, xb) = (ip(&s, "x/a"), ip(&s, "x/b"));
        // x/b -> a service address on 8080, DNAT to x/a:80 (admitted) or x/a:81 (denied).
        let vip: IpAddr = "198.19.0.10".parse().expect("address");
        let orig = Tuple { src: xb, dst: vip, protocol: 6, sport: 40000, dport: 8080 };
        let to = |port| Entry::new(orig, Tuple { src: xa, dst: xb, protocol: 6, sport: port, dport: 40000 });
        let entries = [to(80), to(81)];
        let sw = judge.sweep(&entries, 1);
        assert_eq!(sw.revoke.len(), 1);
        assert_eq!(sw.revoke[0].1.flow, Tuple { src: xb, dst: xa, protocol: 6, sport: 40000, dport: 81 });
    }

    #[test]
    fn a_batch_is_summed_up_by_cause() {
        let (np, s) = on_x_a_node();
        let none = BTreeSet::new();
        let judge = Judge::new(&np, &none);
        let (xa, yb, zb) = (ip(&s, "x/a"), ip(&s, "y/b"), ip(&s, "z/b"));
        let rs: Vec<Revocation> = [flow(yb, xa, 6, 80), flow(zb, xa, 17, 53)].iter().filter_map(|f| judge.judge(f)).collect();
        assert_eq!(by_cause(&rs), BTreeMap::from([("NetworkPolicy x/a-from-b: Isolate".to_string(), 2)]));
    }
}
