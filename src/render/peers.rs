//! NetworkPolicy allow rules as a constant number of lookups per packet, whatever the number
//! of policies, rules and peers that select a pod (Cilium's identity model, in nftables).
//!
//! Per direction, every address some allow rule names is put in exactly one **peer class**:
//! the addresses that belong to the same peer definitions (and, for egress named ports, with
//! the same port numbers) share one. Then:
//!
//! ```text
//! map ingress-peer-addrs-v4   pod address → jump ingress-class-…    (one element per address:
//! map ingress-peer-nets-v4    ipBlock or pod CIDR range → jump …     O(peers) for the node)
//! chain ingress-class-…       oifname @…/all accept                  pods allowed all traffic
//!                             oifname . meta l4proto . th dport @…/ports accept
//! set ingress-any-peer        oifname . meta l4proto . th dport: ports allowed from anywhere
//! ```
//!
//! A pod address's class includes the ipBlocks around it, so its exact lookup decides when
//! it hits; the ipBlock map is for the other addresses.
//!
//! A pod's NetworkPolicy stage is then at most a few rules: `accept` (a rule allowing
//! everything), the any-peer ports lookup, and the two class map lookups per family — each
//! one lookup, none repeated per policy, rule or peer. A class chain that allows nothing returns, and the pod's
//! chain drops. Element comments name the pod (or ipBlock) and the policy rules, so a traced
//! packet still says which rule allowed it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::names::{self, comment};
use super::rule::{Field, Rule, Stmt, Verdict};
use super::{Chain, Element, Key, KeyPart, Set};
use crate::model::{Family, Protocol};
use crate::translate::{
    AllowRule, Changed, Direction, EndpointPolicy, NamedPortDef, NodePolicy, PeerDef, PeerMatch, PortMatch, PortRanges,
};

/// What a peer class is made of: peer definitions, and named-port definitions with the
/// (protocol, port) the name has at these addresses.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Member {
    Peer(usize),
    Named(usize, Protocol, u16),
}

/// The NetworkPolicy stage of one direction of every endpoint of the node.
pub(super) struct PeerPlan {
    dir: Direction,
    /// The endpoints whose NetworkPolicy stage this plan writes.
    covered: BTreeSet<String>,
    /// Per endpoint interface: which families have class lookups, and whether ports from any
    /// peer are allowed (the any-peer set).
    endpoints: BTreeMap<String, EndpointUse>,
    /// The class chains' sets, and the any-peer set.
    pub(super) sets: Vec<Set>,
    /// The class maps (they refer to the chains, which refer to the sets).
    pub(super) maps: Vec<Set>,
    pub(super) chains: Vec<Chain>,
}

#[derive(Default)]
struct EndpointUse {
    /// (family, ipBlock map?) of the class maps it looks up.
    maps: BTreeSet<(Family, bool)>,
    any_peer_ports: bool,
}

/// The (endpoint index, rule) pairs a peer definition serves.
type Served<'a> = Vec<(usize, &'a AllowRule)>;

/// An address range (first, last) with a member and the comment of its source.
type Entry<'a> = (u128, u128, Member, &'a str);

impl PeerPlan {
    /// Classes, maps, chains and sets for the isolated endpoints' allow rules in `dir`.
    pub(super) fn new(np: &NodePolicy, dir: Direction, allow: &Verdict, classes_from: usize) -> Self {
        let isolated: Vec<_> = np.endpoints.iter().filter(|ep| Self::would_cover(ep, dir, classes_from)).collect();
        let covered: BTreeSet<String> = isolated.iter().map(|ep| ep.interface.clone()).collect();

        // Every peer definition, with the (endpoint, rule) it serves.
        let mut by_def: BTreeMap<&PeerDef, Served<'_>> = BTreeMap::new();
        let mut by_named: BTreeMap<&NamedPortDef, Served<'_>> = BTreeMap::new();
        let mut any_peer: BTreeMap<(usize, Protocol), PortUnion> = BTreeMap::new();
        for (e, ep) in isolated.iter().enumerate() {
            let d = ep.direction(dir);
            if d.rules.iter().any(|r| r.peer == PeerMatch::Any && r.ports == PortMatch::Any) {
                continue; // allowed outright: nothing to look up
            }
            for r in &d.rules {
                match &r.peer {
                    PeerMatch::Addresses(def) => by_def.entry(def).or_default().push((e, r)),
                    PeerMatch::NamedPort(def) => by_named.entry(def).or_default().push((e, r)),
                    // Learned at run time: a rule of its own in the pod's chain.
                    PeerMatch::Domains(_) => {}
                    PeerMatch::Any => {
                        if let PortMatch::Protocol(p, ranges) = &r.ports {
                            any_peer.entry((e, *p)).or_default().add(ranges, r);
                        }
                    }
                }
            }
        }
        let (defs, def_rules): (Vec<&PeerDef>, Vec<Served<'_>>) = by_def.into_iter().unzip();
        let (named, named_rules): (Vec<&NamedPortDef>, Vec<Served<'_>>) = by_named.into_iter().unzip();
        let mut plan = Self { dir, covered, endpoints: BTreeMap::new(), sets: Vec::new(), maps: Vec::new(), chains: Vec::new() };

        // Addresses → members, per family: pod (and node) addresses exactly, ipBlocks as
        // runs of addresses. A pod address's class includes the ipBlocks around it, so the
        // exact lookup decides alone when it hits, and pods never split an ipBlock's
        // elements (which would multiply them, and rewrite an interval map at every pod).
        let mut runs = Vec::new();
        for fam in [Family::V4, Family::V6] {
            let (mut blocks, mut hosts): (Vec<Entry<'_>>, Vec<Entry<'_>>) = (Vec::new(), Vec::new());
            for (i, def) in defs.iter().enumerate() {
                let Some(set) = np.peer_sets.get(*def) else { continue };
                // An ipBlock's prefixes are ranges, and so are the pod CIDRs in the set of
                // every pod; the rest are addresses.
                let block = matches!(def, PeerDef::Block(_));
                match fam {
                    Family::V4 => {
                        for (n, c) in &set.v4 {
                            let out = if block || n.prefix_len() < 32 { &mut blocks } else { &mut hosts };
                            out.push((v4_start(n), v4_end(n), Member::Peer(i), c.as_str()));
                        }
                    }
                    Family::V6 => {
                        for (n, c) in &set.v6 {
                            let out = if block || n.prefix_len() < 128 { &mut blocks } else { &mut hosts };
                            out.push((v6_start(n), v6_end(n), Member::Peer(i), c.as_str()));
                        }
                    }
                }
            }
            for (i, def) in named.iter().enumerate() {
                let Some(set) = np.port_sets.get(*def) else { continue };
                match fam {
                    Family::V4 => hosts.extend(set.v4.iter().map(|((a, p, n), c)| {
                        let a = u128::from(u32::from(*a));
                        (a, a, Member::Named(i, *p, *n), c.as_str())
                    })),
                    Family::V6 => hosts
                        .extend(set.v6.iter().map(|((a, p, n), c)| (u128::from(*a), u128::from(*a), Member::Named(i, *p, *n), c.as_str()))),
                }
            }
            let max = match fam {
                Family::V4 => u128::from(u32::MAX),
                Family::V6 => u128::MAX,
            };
            let nets = classify(blocks, max);
            let hosts = exact(hosts, &nets);
            runs.push((fam, hosts, nets));
        }

        // One chain (and its sets) per distinct class, shared by both families.
        let mut class_chain: BTreeMap<Vec<Member>, Option<String>> = BTreeMap::new();
        for (_, hosts, nets) in &runs {
            for run in hosts.iter().chain(nets) {
                if !class_chain.contains_key(&run.members) {
                    class_chain.insert(run.members.clone(), None);
                }
            }
        }
        let describe = |m: &Member| match m {
            Member::Peer(i) => defs[*i].to_string(),
            Member::Named(i, p, n) => format!("{} = {} {n}", named[*i], p.as_nft()),
        };
        for (members, chain_name) in &mut class_chain {
            let mut per_ep: BTreeMap<usize, Allowed> = BTreeMap::new();
            for m in members.iter() {
                match m {
                    Member::Peer(i) => {
                        for (e, r) in &def_rules[*i] {
                            per_ep.entry(*e).or_default().add(&r.ports, r);
                        }
                    }
                    Member::Named(i, p, n) => {
                        for (e, r) in &named_rules[*i] {
                            per_ep.entry(*e).or_default().add(&PortMatch::Protocol(*p, PortRanges::Ranges(vec![(*n, *n)])), r);
                        }
                    }
                }
            }
            if per_ep.is_empty() {
                continue; // only endpoints allowed outright use it
            }
            let what: Vec<String> = members.iter().map(describe).collect();
            let what = what.join("; ");
            let chain_comment = comment(&format!("{dir} {} peers in: {what}", if dir == Direction::Ingress { "from" } else { "to" }));
            let purpose = format!("{}-class", dir.as_field());
            let name = names::dynamic(&purpose, &[&format!("{members:?}"), &what, &chain_comment], &class_short(members, &defs, &named));
            let iface = if dir == Direction::Ingress { Field::OifName } else { Field::IifName };
            let (mut all, mut ports) = (Vec::new(), Vec::new());
            for (e, allowed) in &per_ep {
                let ep = isolated[*e];
                let pod = ep.pod.to_string();
                if let Some(origins) = &allowed.all {
                    all.push(Element {
                        key: Key::one(KeyPart::Ifname(ep.interface.clone())),
                        comment: comment(&format!("{pod}: {}", origins.join(", "))),
                        verdict: None,
                    });
                    continue;
                }
                for (p, union) in &allowed.ports {
                    for (range, origins) in union.ranges() {
                        ports.push(Element {
                            key: Key::new(vec![KeyPart::Ifname(ep.interface.clone()), KeyPart::Proto((*p).into()), range]),
                            comment: comment(&format!("{pod}: {}", origins.join(", "))),
                            verdict: None,
                        });
                    }
                }
            }
            let mut rules = Vec::new();
            for (elements, suffix, key, matcher, about) in [
                (all, "all", vec!["ifname"], vec![iface], "pods allowed all traffic"),
                (
                    ports,
                    "ports",
                    vec!["ifname", "inet_proto", "inet_service"],
                    vec![iface, Field::L4Proto, Field::ThDport],
                    "pod, protocol and ports allowed",
                ),
            ] {
                if elements.is_empty() {
                    continue;
                }
                let set_comment = comment(&format!("{about}, {dir} {}: {what}", if dir == Direction::Ingress { "from" } else { "to" },));
                let set_name = format!("{name}/{suffix}");
                rules.push(Rule::new(vec![Stmt::Lookup { fields: matcher, neg: false, set: set_name.clone() }], Some(allow.clone())));
                let mut elements = elements;
                super::element::sort_as_written(&mut elements);
                plan.sets.push(Set {
                    name: set_name,
                    comment: set_comment,
                    key,
                    data: None,
                    interval: suffix == "ports",
                    timeout: false,
                    limit: None,
                    elements: elements.into(),
                });
            }
            plan.chains.push(Chain { name: name.clone(), comment: chain_comment, hook: None, rules: rules.into() });
            *chain_name = Some(name);
        }

        // The class maps, and which endpoint uses which of them.
        let mut uses: BTreeMap<usize, BTreeSet<(Family, bool)>> = BTreeMap::new();
        for (fam, hosts, nets) in runs {
            for (list, interval) in [(hosts, false), (nets, true)] {
                let mut elements = Vec::new();
                let mut served: BTreeSet<usize> = BTreeSet::new();
                for run in &list {
                    let Some(Some(chain)) = class_chain.get(&run.members) else { continue };
                    let verdict = Some(Verdict::Jump(chain.clone()));
                    if interval {
                        for net in prefixes(run.start, run.end, fam) {
                            elements.push(Element {
                                key: Key::one(KeyPart::Net(net)),
                                comment: comment(run.comment),
                                verdict: verdict.clone(),
                            });
                        }
                    } else {
                        elements.push(Element {
                            key: Key::one(KeyPart::Addr(address(run.start, fam))),
                            comment: comment(run.comment),
                            verdict,
                        });
                    }
                    for m in &run.members {
                        let rules = match m {
                            Member::Peer(i) => &def_rules[*i],
                            Member::Named(i, ..) => &named_rules[*i],
                        };
                        served.extend(rules.iter().map(|(e, _)| *e));
                    }
                }
                if elements.is_empty() {
                    continue;
                }
                for e in served {
                    uses.entry(e).or_default().insert((fam, interval));
                }
                let what = if interval { "ipBlock or pod CIDR range" } else { "pod or node address" };
                plan.maps.push(Set {
                    name: map_name(dir, fam, interval),
                    comment: format!(
                        "{} {what} of each {dir} peer of this node's NetworkPolicies -> the chain of its peer class",
                        fam.as_str()
                    ),
                    key: vec![super::addr_type(fam)],
                    data: Some("verdict"),
                    interval,
                    timeout: false,
                    limit: None,
                    elements: elements.into(),
                });
            }
        }
        for (e, maps) in uses {
            let ep = isolated[e];
            let u = plan.endpoints.entry(ep.interface.clone()).or_default();
            u.maps.extend(maps.into_iter().filter(|(f, _)| match f {
                Family::V4 => ep.has_v4(),
                Family::V6 => ep.has_v6(),
            }));
        }

        // Ports allowed from (to) any peer.
        if !any_peer.is_empty() {
            let mut elements = Vec::new();
            for ((e, p), union) in &any_peer {
                let ep = isolated[*e];
                let pod = ep.pod.to_string();
                for (range, origins) in union.ranges() {
                    elements.push(Element {
                        key: Key::new(vec![KeyPart::Ifname(ep.interface.clone()), KeyPart::Proto((*p).into()), range]),
                        comment: comment(&format!("{pod}: {}", origins.join(", "))),
                        verdict: None,
                    });
                }
                plan.endpoints.entry(ep.interface.clone()).or_default().any_peer_ports = true;
            }
            super::element::sort_as_written(&mut elements);
            plan.sets.push(Set {
                name: any_peer_name(dir),
                comment: format!("pod, protocol and ports whose {dir} NetworkPolicy allows any peer"),
                key: vec!["ifname", "inet_proto", "inet_service"],
                data: None,
                interval: true,
                timeout: false,
                limit: None,
                elements: elements.into(),
            });
        }
        plan
    }

    /// Whether a plan of `dir` covers `ep`: its allow rules, one rule per lookup, would take
    /// `classes_from` lookups or more (see `RenderOptions`).
    pub(super) fn would_cover(ep: &EndpointPolicy, dir: Direction, classes_from: usize) -> bool {
        let families = usize::from(ep.has_v4()) + usize::from(ep.has_v6());
        let d = ep.direction(dir);
        let lookups: usize = d.rules.iter().map(|r| if r.peer == PeerMatch::Any { 1 } else { families }).sum();
        d.is_isolated() && lookups >= classes_from.max(1)
    }

    /// Whether the plan must be made again after `changed`: an endpoint it covers (or would
    /// now) changed, or a set one of its endpoints' allow rules refers to.
    pub(super) fn is_stale(&self, np: &NodePolicy, changed: &Changed, classes_from: usize) -> bool {
        let by_iface = |iface: &str| np.endpoints.binary_search_by(|e| e.interface.as_str().cmp(iface)).ok().map(|i| &np.endpoints[i]);
        for iface in &changed.endpoints {
            if self.covered.contains(iface) || by_iface(iface).is_some_and(|ep| Self::would_cover(ep, self.dir, classes_from)) {
                return true;
            }
        }
        if changed.peer_sets.is_empty() && changed.port_sets.is_empty() {
            return false;
        }
        self.covered.iter().filter_map(|iface| by_iface(iface)).any(|ep| {
            ep.direction(self.dir).rules.iter().any(|r| match &r.peer {
                PeerMatch::Any | PeerMatch::Domains(_) => false,
                PeerMatch::Addresses(d) => changed.peer_sets.contains(d),
                PeerMatch::NamedPort(d) => changed.port_sets.contains(d),
            })
        })
    }

    /// Whether `interface`'s NetworkPolicy stage goes through the peer classes.
    pub(super) fn covers(&self, interface: &str) -> bool {
        self.covered.contains(interface)
    }

    /// The lookups of `interface`'s NetworkPolicy stage, each with verdict `allow`.
    pub(super) fn rules(&self, interface: &str, allow: &Verdict) -> Vec<Rule> {
        let Some(u) = self.endpoints.get(interface) else { return Vec::new() };
        let mut out = Vec::new();
        let iface = match self.dir {
            Direction::Ingress => Field::OifName,
            Direction::Egress => Field::IifName,
        };
        if u.any_peer_ports {
            let fields = vec![iface, Field::L4Proto, Field::ThDport];
            out.push(
                Rule::new(vec![Stmt::Lookup { fields, neg: false, set: any_peer_name(self.dir) }], Some(allow.clone()))
                    .comment("ports allowed for any peer"),
            );
        }
        for (fam, interval) in &u.maps {
            let what = if *interval { "ipBlock peers" } else { "pod peers" };
            let field = match self.dir {
                Direction::Ingress => Field::Saddr(*fam),
                Direction::Egress => Field::Daddr(*fam),
            };
            out.push(
                Rule::new(vec![Stmt::Vmap { fields: vec![field], map: map_name(self.dir, *fam, *interval) }], None)
                    .comment(format!("{} {what}: the peer class decides", fam.as_str())),
            );
        }
        out
    }
}

fn map_name(dir: Direction, fam: Family, interval: bool) -> String {
    format!("{}-peer-{}-{}", dir.as_field(), if interval { "nets" } else { "addrs" }, fam.tag())
}

fn address(a: u128, fam: Family) -> IpAddr {
    match fam {
        Family::V4 => Ipv4Addr::from(u32::try_from(a).unwrap_or(u32::MAX)).into(),
        Family::V6 => Ipv6Addr::from(a).into(),
    }
}

/// Exact addresses (pods, nodes) with their members, each also a member of the ipBlocks of
/// the run of `nets` that contains it.
fn exact<'a>(entries: Vec<Entry<'a>>, nets: &[Run<'_>]) -> Vec<Run<'a>> {
    let mut by_addr: BTreeMap<u128, (BTreeSet<Member>, &'a str)> = BTreeMap::new();
    for (a, _, m, c) in entries {
        by_addr.entry(a).or_insert_with(|| (BTreeSet::new(), c)).0.insert(m);
    }
    by_addr
        .into_iter()
        .map(|(a, (mut members, comment))| {
            let i = nets.partition_point(|r| r.start <= a);
            if let Some(r) = i.checked_sub(1).map(|i| &nets[i]).filter(|r| r.end >= a) {
                members.extend(r.members.iter().cloned());
            }
            Run { start: a, end: a, members: members.into_iter().collect(), comment }
        })
        .collect()
}

fn any_peer_name(dir: Direction) -> String {
    format!("{}-any-peer", dir.as_field())
}

/// A short human part for a class's names: its first member.
fn class_short(members: &[Member], defs: &[&PeerDef], named: &[&NamedPortDef]) -> String {
    let first = match members.first() {
        Some(Member::Peer(i)) => defs[*i].short(),
        Some(Member::Named(i, _, n)) => format!("{}={n}", named[*i].short()),
        None => String::new(),
    };
    if members.len() > 1 { format!("{first}-and-{}", members.len() - 1) } else { first }
}

/// What one endpoint is allowed from (to) one class: everything, or ports per protocol.
#[derive(Default)]
struct Allowed<'a> {
    all: Option<Vec<String>>,
    ports: BTreeMap<Protocol, PortUnion<'a>>,
}

impl<'a> Allowed<'a> {
    fn add(&mut self, ports: &PortMatch, rule: &'a AllowRule) {
        match ports {
            PortMatch::Any => {
                let all = self.all.get_or_insert_with(Vec::new);
                for o in &rule.origins {
                    let o = o.to_string();
                    if !all.contains(&o) {
                        all.push(o);
                    }
                }
            }
            PortMatch::Protocol(p, ranges) => self.ports.entry(*p).or_default().add(ranges, rule),
        }
    }
}

/// The union of some rules' port ranges of one protocol, remembering which rules gave which.
#[derive(Default)]
struct PortUnion<'a> {
    parts: Vec<(u16, u16, &'a AllowRule)>,
}

impl<'a> PortUnion<'a> {
    fn add(&mut self, ranges: &PortRanges, rule: &'a AllowRule) {
        match ranges {
            // Port 0 too: `meta l4proto tcp` in the one-rule form matched it.
            PortRanges::All => self.parts.push((0, u16::MAX, rule)),
            PortRanges::Ranges(rs) => self.parts.extend(rs.iter().map(|(s, e)| (*s, *e, rule))),
        }
    }

    /// Disjoint ranges (`80`, `80-90`) covering the union, each with the origins of the rules
    /// whose ranges overlap it (nft rejects overlapping elements in a concatenated set).
    fn ranges(&self) -> Vec<(KeyPart, Vec<String>)> {
        let mut parts = self.parts.clone();
        parts.sort_by_key(|(s, e, _)| (*s, *e));
        let mut merged: Vec<(u16, u16, Vec<String>)> = Vec::new();
        for (s, e, rule) in parts {
            let origins = rule.origins.iter().map(ToString::to_string);
            match merged.last_mut() {
                Some(last) if u32::from(s) <= u32::from(last.1) + 1 => {
                    last.1 = last.1.max(e);
                    for o in origins {
                        if !last.2.contains(&o) {
                            last.2.push(o);
                        }
                    }
                }
                _ => merged.push((s, e, origins.collect())),
            }
        }
        merged.into_iter().map(|(s, e, o)| (KeyPart::Ports(s, e), o)).collect()
    }
}

/// A maximal run of addresses with the same members.
struct Run<'a> {
    start: u128,
    end: u128,
    members: Vec<Member>,
    /// The comment of the most specific address or prefix in the run (a pod's name, or the
    /// ipBlock).
    comment: &'a str,
}

/// Splits the address space into runs of equal membership (a sweep over range starts and
/// ends): every address in exactly one run, runs in address order, no run without members.
fn classify(mut entries: Vec<Entry<'_>>, max: u128) -> Vec<Run<'_>> {
    // Events: +member at start, -member after end. Narrower entries sort later at the same
    // start, so their comment (a pod's) is the one kept.
    entries.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let mut ends: BTreeMap<u128, Vec<usize>> = BTreeMap::new();
    let mut active: BTreeMap<Member, (usize, Vec<usize>)> = BTreeMap::new();
    let mut runs: Vec<Run<'_>> = Vec::new();
    let mut i = 0;
    let mut pos: Option<u128> = entries.first().map(|e| e.0);
    while let Some(at) = pos {
        // Apply the removals due at `at` (their end + 1 == at) and the entries starting here.
        if let Some(gone) = ends.remove(&at) {
            for g in gone {
                let m = &entries[g].2;
                if let Some((count, list)) = active.get_mut(m) {
                    *count -= 1;
                    list.retain(|x| *x != g);
                    if *count == 0 {
                        active.remove(m);
                    }
                }
            }
        }
        while i < entries.len() && entries[i].0 == at {
            let (_, end, m, _) = &entries[i];
            let slot = active.entry(m.clone()).or_insert((0, Vec::new()));
            slot.0 += 1;
            slot.1.push(i);
            if *end < max {
                ends.entry(end + 1).or_default().push(i);
            }
            i += 1;
        }
        let next_start = entries.get(i).map(|e| e.0);
        let next_end = ends.keys().next().copied();
        let next = match (next_start, next_end) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if !active.is_empty() {
            let end = next.map_or(max, |n| n - 1);
            let members: Vec<Member> = active.keys().cloned().collect();
            // The most specific entry covering the run names it.
            let best = active.values().flat_map(|(_, l)| l.iter()).min_by_key(|x| entries[**x].1 - entries[**x].0).copied();
            let comment = best.map_or("", |b| entries[b].3);
            match runs.last_mut() {
                Some(last) if last.end.checked_add(1) == Some(at) && last.members == members && last.comment == comment => last.end = end,
                _ => runs.push(Run { start: at, end, members, comment }),
            }
        }
        pos = next;
    }
    runs
}

fn v4_start(n: &Ipv4Net) -> u128 {
    u128::from(u32::from(n.network()))
}

fn v4_end(n: &Ipv4Net) -> u128 {
    u128::from(u32::from(n.broadcast()))
}

fn v6_start(n: &Ipv6Net) -> u128 {
    u128::from(n.network())
}

fn v6_end(n: &Ipv6Net) -> u128 {
    u128::from(n.broadcast())
}

/// The fewest prefixes covering `start..=end` exactly, in address order (nft lists interval
/// elements as prefixes when they are prefixes).
fn prefixes(start: u128, end: u128, fam: Family) -> Vec<IpNet> {
    let bits: u32 = match fam {
        Family::V4 => 32,
        Family::V6 => 128,
    };
    let mut out = Vec::new();
    let mut at = start;
    loop {
        // The largest aligned block at `at` that does not pass `end`.
        let mut size_log = if at == 0 { bits } else { at.trailing_zeros().min(bits) };
        while size_log > 0 {
            let last = if size_log >= 128 { u128::MAX } else { at + ((1u128 << size_log) - 1) };
            if last <= end {
                break;
            }
            size_log -= 1;
        }
        let prefix_len = u8::try_from(bits - size_log).unwrap_or(0);
        let net = match fam {
            Family::V4 => IpNet::V4(Ipv4Net::new(Ipv4Addr::from(u32::try_from(at).unwrap_or(u32::MAX)), prefix_len).unwrap_or_default()),
            Family::V6 => IpNet::V6(Ipv6Net::new(Ipv6Addr::from(at), prefix_len).unwrap_or_default()),
        };
        out.push(net);
        let last = if size_log >= 128 { u128::MAX } else { at + ((1u128 << size_log) - 1) };
        if last >= end {
            return out;
        }
        at = last + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::addr_int;

    fn net(s: &str) -> (u128, u128) {
        let n: IpNet = s.parse().unwrap();
        (addr_int(n.network()), addr_int(n.broadcast()))
    }

    #[test]
    fn prefixes_cover_ranges_exactly() {
        let p = |a: &str, b: &str| {
            prefixes(addr_int(a.parse().unwrap()), addr_int(b.parse().unwrap()), Family::V4)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(p("198.18.0.0", "198.19.255.255"), ["198.18.0.0/15"]);
        assert_eq!(p("198.18.0.5", "198.18.0.5"), ["198.18.0.5/32"]);
        assert_eq!(p("198.18.0.1", "198.18.0.6"), ["198.18.0.1/32", "198.18.0.2/31", "198.18.0.4/31", "198.18.0.6/32"]);
        assert_eq!(p("0.0.0.0", "255.255.255.255"), ["0.0.0.0/0"]);
        let all6 = prefixes(0, u128::MAX, Family::V6);
        assert_eq!(all6.len(), 1);
        assert_eq!(all6[0].to_string(), "::/0");
    }

    #[test]
    fn classify_splits_by_membership() {
        let (a0, a1) = net("198.18.0.0/16");
        let (h, _) = net("198.18.1.1/32");
        let (o, _) = net("198.18.1.2/32");
        let runs = classify(
            vec![
                (a0, a1, Member::Peer(0), "block"),
                (h, h, Member::Peer(1), "x/a"),
                (h, h, Member::Peer(2), "x/a"),
                (o, o, Member::Peer(1), "x/b"),
            ],
            u128::from(u32::MAX),
        );
        let got: Vec<(String, String, Vec<Member>, &str)> = runs
            .iter()
            .map(|r| {
                (
                    Ipv4Addr::from(u32::try_from(r.start).unwrap()).to_string(),
                    Ipv4Addr::from(u32::try_from(r.end).unwrap()).to_string(),
                    r.members.clone(),
                    r.comment,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("198.18.0.0".into(), "198.18.1.0".into(), vec![Member::Peer(0)], "block"),
                ("198.18.1.1".into(), "198.18.1.1".into(), vec![Member::Peer(0), Member::Peer(1), Member::Peer(2)], "x/a"),
                ("198.18.1.2".into(), "198.18.1.2".into(), vec![Member::Peer(0), Member::Peer(1)], "x/b"),
                ("198.18.1.3".into(), "198.18.255.255".into(), vec![Member::Peer(0)], "block"),
            ]
        );
        // The whole space, and nothing.
        let runs = classify(vec![(0, u128::MAX, Member::Peer(0), "all")], u128::MAX);
        assert_eq!((runs.len(), runs[0].start, runs[0].end), (1, 0, u128::MAX));
        assert!(classify(Vec::new(), u128::MAX).is_empty());
    }
}
