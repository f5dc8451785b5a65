//! Explaining from a node's live table: the listing of `inet flock` (`nft -s list table inet
//! flock`) parsed, and the first packet of the flow traced through it (`nft::trace`) — what
//! the kernel enforces right now, named by the comments the renderer writes on every chain,
//! rule and element (policy, rule index, pod).
//!
//! Ends are found in the table itself: a local pod by its `pod-addrs-*` element (interface
//! and address, commented `namespace/name`), a remote pod by any element keyed by its
//! address and commented with its name (peer sets hold every pod a policy names), anything
//! else by address. Only this node's part of the flow is judged: egress when the source is
//! local, ingress when the destination is. With the node's own addresses
//! ([`LiveTable::with_node_addresses`]), a local pod's flow to one of them is traced through
//! hook `input` (its egress policy judges it there), and a flow from one of them to a local
//! pod is the node's own, which flock does not police.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;

use super::{End, Query, Verdict};
use crate::model::Family;
use crate::model::Protocol;
use crate::nft::table::{Ruleset, Table};
use crate::nft::trace::{self, Ct, L4, Packet};
use crate::render::{
    AUDIT_BASE_CHAIN, AUDIT_INPUT_CHAIN, BASE_CHAIN, EGRESS_ALLOWED, FROM_PODS, INPUT_CHAIN, POD_ADDRS_V4, POD_ADDRS_V6, TO_PODS,
};

/// The interface name traced packets use for the node's uplink: anything that is not a pod
/// interface (`flk*`).
const UPLINK: &str = "uplink";

/// Why the live table cannot explain a flow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LiveError {
    #[error("the listing of table inet flock does not parse: {0}")]
    Listing(String),
    #[error("there is no table inet flock on this node: flock-agent has not programmed it")]
    NoTable,
    #[error("pod {0} is not on this node and no element of its table names it: pass its address instead")]
    UnknownPod(String),
    #[error("pod {pod} has no {family} address in this node's table")]
    NoAddress { pod: String, family: &'static str },
    #[error("{from} and {to} have no address family in common")]
    NoCommonFamily { from: String, to: String },
    #[error("neither {from} nor {to} is a pod on this node: run explain on a node of either")]
    NotLocal { from: String, to: String },
    #[error("tracing the packet: {0}")]
    Trace(String),
}

/// One rule the packet matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TracedRule {
    pub(crate) chain: String,
    /// The chain's comment (whose policy it is).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) chain_comment: Option<String>,
    /// The rule, its comment included.
    pub rule: String,
    /// The comments of the set or map elements the rule matched (pods, policy rules).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub matched: Vec<String>,
}

/// The verdict of one direction judged on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LiveDirection {
    pub(crate) verdict: Verdict,
    /// The rules of the pod's policy chains the packet matched, the deciding one last
    /// (empty: nothing restricts this direction of the pod).
    pub rules: Vec<TracedRule>,
}

/// One end as found in the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct LiveEnd {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) pod: Option<String>,
    pub(crate) address: IpAddr,
    /// The pod's interface when it is on this node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) interface: Option<String>,
}

/// The live explanation of a flow on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LiveExplanation {
    /// This node's verdict (the other end's node may still deny what this one allows).
    pub verdict: Verdict,
    pub(crate) from: LiveEnd,
    pub(crate) to: LiveEnd,
    pub(crate) protocol: &'static str,
    pub(crate) port: u16,
    pub(crate) family: &'static str,
    /// At the source, when it is on this node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) egress: Option<LiveDirection>,
    /// At the destination, when it is on this node (and egress let the packet through).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingress: Option<LiveDirection>,
    /// Every rule the packet matched, from the base chain on.
    pub path: Vec<TracedRule>,
    /// Audit mode (the table has the `audit` base chain): the rules of the audited views
    /// the packet would be denied by, which log it (empty: the audited policies allow it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit: Option<Vec<TracedRule>>,
    /// Why nothing on this node judges the flow, when nothing does (the node's own traffic).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) note: Option<String>,
}

/// An end as the table knows it.
struct Found {
    pod: Option<String>,
    /// When the pod is on this node.
    interface: Option<String>,
    ips: Vec<IpAddr>,
}

/// A node's live table, ready to explain flows.
pub struct LiveTable {
    table: Table,
    /// Local pods: name → (interface, addresses).
    local: BTreeMap<String, (String, Vec<IpAddr>)>,
    /// Pods named by elements: name → addresses.
    named: BTreeMap<String, Vec<IpAddr>>,
    /// The node's own addresses (none known: every address is another host's).
    node: Vec<IpAddr>,
}

impl LiveTable {
    /// The timed sets of the table (domain rules' learned addresses): `nft -s` lists their
    /// elements' timeouts but not what is left of them, which [`Self::learned`] adds.
    pub fn timed_sets(&self) -> Vec<String> {
        self.table.sets.iter().filter(|(_, s)| s.spec.flags.iter().any(|f| f == "timeout")).map(|(n, _)| n.clone()).collect()
    }

    /// What a read of timed set `set` says of its elements: (address, timeout, what is left).
    pub fn learned(&mut self, set: &str, entries: &[(IpAddr, std::time::Duration, std::time::Duration)]) {
        let Some(s) = self.table.sets.get_mut(set) else { return };
        for (addr, timeout, left) in entries {
            if let Some(e) = s.elements.get_mut(&addr.to_string()) {
                e.timeout = Some(nft_duration(*timeout));
                e.expires = Some(nft_duration(*left));
            }
        }
    }

    /// Parses `nft -s list table inet flock` output.
    pub fn parse(listing: &str) -> Result<Self, LiveError> {
        let rs = Ruleset::from_text(listing).map_err(|e| LiveError::Listing(e.to_string()))?;
        let table = rs.table("inet", "flock").cloned().ok_or(LiveError::NoTable)?;
        let mut local: BTreeMap<String, (String, Vec<IpAddr>)> = BTreeMap::new();
        let mut named: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
        for (name, set) in &table.sets {
            for (key, elem) in &set.elements {
                let Some(pod) = elem.comment.as_deref().filter(|c| is_pod_name(c)) else { continue };
                if name == POD_ADDRS_V4 || name == POD_ADDRS_V6 {
                    // `"flk…" . address`
                    if let Some((iface, addr)) = key.split_once(" . ")
                        && let Ok(ip) = addr.parse::<IpAddr>()
                    {
                        let e = local.entry(pod.to_string()).or_insert_with(|| (iface.trim_matches('"').to_string(), Vec::new()));
                        e.1.push(ip);
                    }
                } else if let Ok(ip) = key.parse::<IpAddr>() {
                    let v = named.entry(pod.to_string()).or_default();
                    if !v.contains(&ip) {
                        v.push(ip);
                    }
                }
            }
        }
        Ok(Self { table, local, named, node: Vec::new() })
    }

    /// The node's own addresses, on every interface (`revocation::node_addresses` on the
    /// node): a local pod's packet to one of them meets hook `input`, not `forward`.
    pub fn with_node_addresses(mut self, addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        self.node = addrs.into_iter().collect();
        self
    }

    /// The local pod owning `ip`.
    fn local_owner(&self, ip: IpAddr) -> Option<(&str, &(String, Vec<IpAddr>))> {
        self.local.iter().find(|(_, (_, ips))| ips.contains(&ip)).map(|(n, v)| (n.as_str(), v))
    }

    /// A pod name or an address, as the table knows it.
    fn resolve(&self, end: &End) -> Result<Found, LiveError> {
        match end {
            End::Pod(p) => {
                let name = p.to_string();
                if let Some((iface, ips)) = self.local.get(&name) {
                    return Ok(Found { pod: Some(name), interface: Some(iface.clone()), ips: ips.clone() });
                }
                let ips = self.named.get(&name).cloned().ok_or_else(|| LiveError::UnknownPod(name.clone()))?;
                Ok(Found { pod: Some(name), interface: None, ips })
            }
            End::Address(ip) => match self.local_owner(*ip) {
                Some((name, (iface, _))) => Ok(Found { pod: Some(name.to_string()), interface: Some(iface.clone()), ips: vec![*ip] }),
                None => {
                    let name = self.named.iter().find(|(_, ips)| ips.contains(ip)).map(|(n, _)| n.clone());
                    Ok(Found { pod: name, interface: None, ips: vec![*ip] })
                }
            },
        }
    }

    /// Traces the first packet of `query` through this node's table.
    pub fn explain(&self, query: &Query) -> Result<LiveExplanation, LiveError> {
        let Found { pod: from_pod, interface: from_if, ips: from_ips } = self.resolve(&query.from)?;
        let Found { pod: to_pod, interface: to_if, ips: to_ips } = self.resolve(&query.to)?;
        let describe =
            |pod: &Option<String>, ips: &[IpAddr]| pod.clone().unwrap_or_else(|| ips.first().map(ToString::to_string).unwrap_or_default());
        let has = |ips: &[IpAddr], f: Family| ips.iter().any(|ip| Family::of(*ip) == f);
        let family = match (&query.from, &query.to, query.family) {
            (End::Address(a), _, _) | (_, End::Address(a), _) => Family::of(*a),
            (_, _, Some(f)) => f,
            _ => [Family::V4, Family::V6]
                .into_iter()
                .find(|f| has(&from_ips, *f) && has(&to_ips, *f))
                .ok_or_else(|| LiveError::NoCommonFamily { from: describe(&from_pod, &from_ips), to: describe(&to_pod, &to_ips) })?,
        };
        let pick = |pod: &Option<String>, ips: &[IpAddr]| {
            ips.iter()
                .copied()
                .find(|ip| Family::of(*ip) == family)
                .ok_or_else(|| LiveError::NoAddress { pod: describe(pod, ips), family: family.as_str() })
        };
        let (src, dst) = (pick(&from_pod, &from_ips)?, pick(&to_pod, &to_ips)?);
        if from_if.is_none() && to_if.is_none() {
            return Err(LiveError::NotLocal { from: describe(&from_pod, &from_ips), to: describe(&to_pod, &to_ips) });
        }
        let from = LiveEnd { pod: from_pod, address: src, interface: from_if.clone() };
        let to = LiveEnd { pod: to_pod, address: dst, interface: to_if.clone() };
        let (protocol, port, family_name) = (query.protocol.as_k8s(), query.port, family.as_str());
        if self.node.contains(&src) {
            let note = format!("{src} is this node's own address: what the node sends its pods (kubelet probes) is not policed");
            return Ok(LiveExplanation {
                verdict: Verdict::Allow,
                from,
                to,
                protocol,
                port,
                family: family_name,
                egress: None,
                ingress: None,
                path: Vec::new(),
                audit: None,
                note: Some(note),
            });
        }
        // A local pod's packet to the node itself goes through hook `input`.
        let to_node = from_if.is_some() && self.node.contains(&dst);
        let (base, audit_base) = if to_node { (INPUT_CHAIN, AUDIT_INPUT_CHAIN) } else { (BASE_CHAIN, AUDIT_BASE_CHAIN) };
        let l4 = match query.protocol {
            Protocol::Tcp => L4::Tcp,
            Protocol::Udp => L4::Udp,
            Protocol::Sctp => L4::Sctp,
        };
        let pkt = Packet {
            iif: from_if.clone().unwrap_or_else(|| UPLINK.to_string()),
            oif: if to_node { String::new() } else { to_if.clone().unwrap_or_else(|| UPLINK.to_string()) },
            src,
            dst,
            l4,
            dport: query.port,
            ct: Ct::New,
        };
        let tracer = trace::Tracer::new(&self.table);
        let traced = |base: &str| -> Result<(trace::Verdict, Vec<TracedRule>), LiveError> {
            let t = tracer.trace(base, &pkt).map_err(|e| LiveError::Trace(e.to_string()))?;
            let path = t
                .path
                .into_iter()
                .map(|s| TracedRule {
                    chain_comment: self.table.chains.get(&s.chain).and_then(|c| c.spec.comment.clone()),
                    chain: s.chain,
                    rule: s.rule,
                    matched: s.matched,
                })
                .collect();
            Ok((t.verdict, path))
        };
        let (verdict, path) = traced(base)?;
        let audit = match self.table.chains.contains_key(audit_base) {
            true => {
                Some(traced(audit_base)?.1.into_iter().filter(|r| r.chain.starts_with("audit-") && r.chain.contains("-log-")).collect())
            }
            false => None,
        };
        let verdict = if verdict == trace::Verdict::Accept { Verdict::Allow } else { Verdict::Deny };
        // Egress is denied when the packet was dropped by the source check or the pod's
        // egress chains; ingress is judged only when egress let the packet on.
        let in_egress = |chain: &str| chain == FROM_PODS || (chain.starts_with("egress-") && chain != EGRESS_ALLOWED);
        let egress_denied = verdict == Verdict::Deny && from_if.is_some() && path.last().is_some_and(|r| in_egress(&r.chain));
        let egress = from_if.as_ref().map(|_| LiveDirection {
            verdict: if egress_denied { Verdict::Deny } else { Verdict::Allow },
            rules: path.iter().filter(|r| in_egress(&r.chain)).cloned().collect(),
        });
        let ingress = to_if.as_ref().filter(|_| !egress_denied).map(|_| LiveDirection {
            verdict,
            rules: path.iter().filter(|r| r.chain == TO_PODS || r.chain.starts_with("ingress-")).cloned().collect(),
        });
        let note = to_node.then(|| format!("{dst} is this node's own address: the source's egress policy decides (hook input)"));
        Ok(LiveExplanation { verdict, from, to, protocol, port, family: family_name, egress, ingress, path, audit, note })
    }
}

/// A duration as nft lists one (`30s`, `12s500ms`, `1h`).
fn nft_duration(d: std::time::Duration) -> String {
    crate::nft::table::duration_text(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn is_pod_name(c: &str) -> bool {
    let part = |s: &str| !s.is_empty() && !s.contains(|ch: char| ch.is_whitespace() || ch == '/' || ch == ':');
    c.split_once('/').is_some_and(|(ns, name)| part(ns) && part(name))
}

/// The live explanation as text.
pub fn to_text(e: &LiveExplanation) -> String {
    use std::fmt::Write as _;
    let end = |x: &LiveEnd| x.pod.clone().map_or_else(|| x.address.to_string(), |p| format!("{p} ({})", x.address));
    let mut s = String::new();
    let _ = writeln!(s, "{} on this node: {}/{} {}: {} -> {}", e.verdict, e.protocol, e.port, e.family, end(&e.from), end(&e.to));
    if let Some(note) = &e.note {
        let _ = writeln!(s, "  {note}");
        if e.path.is_empty() {
            return s;
        }
    }
    for (name, d, other) in [("egress", &e.egress, "the source's node"), ("ingress", &e.ingress, "the destination's node")] {
        match d {
            None if name == "ingress" && e.to.interface.is_some() => {
                let _ = writeln!(s, "  ingress: not reached (egress denied)");
            }
            None if name == "ingress" && e.note.is_some() => {
                let _ = writeln!(s, "  ingress: none (the destination is the node itself)");
            }
            None => {
                let _ = writeln!(s, "  {name}: judged on {other}, not here");
            }
            Some(d) if d.rules.is_empty() => {
                let _ = writeln!(s, "  {name}: {}: no policy chain (nothing restricts it)", d.verdict);
            }
            Some(d) => {
                let _ = writeln!(s, "  {name}: {}", d.verdict);
                for r in &d.rules {
                    let _ = writeln!(s, "    {}: {}", r.chain, r.rule);
                    for m in &r.matched {
                        let _ = writeln!(s, "      matched element: {m}");
                    }
                }
            }
        }
    }
    match &e.audit {
        Some(rules) if !rules.is_empty() => {
            let _ = writeln!(s, "  audit mode: the audited policies would deny it (logged, accepted):");
            for r in rules {
                let _ = writeln!(s, "    {}: {}", r.chain, r.rule);
            }
        }
        Some(_) => {
            let _ = writeln!(s, "  audit mode: the audited policies would allow it");
        }
        None => {}
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_nft_lists_them() {
        use std::time::Duration;
        assert_eq!(nft_duration(Duration::from_secs(30)), "30s");
        assert_eq!(nft_duration(Duration::from_millis(12_500)), "12s500ms");
        assert_eq!(nft_duration(Duration::from_secs(3600)), "1h");
        assert_eq!(nft_duration(Duration::from_secs(3_725)), "1h2m5s");
        assert_eq!(nft_duration(Duration::ZERO), "0s");
        assert_eq!(nft_duration(Duration::from_millis(5)), "5ms");
    }
}
