//! What a change to the cluster's objects would open or close: every (source pod,
//! destination pod, port, protocol, family) whose verdict differs between two snapshots, with
//! what decided it before and after — by the same [`Explainer`] `flockctl explain` runs.
//!
//! Pairs are not judged one by one: pods no policy can tell apart, in either snapshot, form a
//! class, one flow per pair of classes is explained, and a change is spread over the classes'
//! members. Two pods share a class when they agree on everything a verdict can read of
//! them: namespace (name, labels, annotations), labels, declared ports, phase, host
//! networking (and then the node, whose addresses a host-network pod has), address
//! families, and which of the policies' CIDRs each address falls in. A pod whose address
//! another pod also reports is a class of its own (which of them owns it is per pod).
//! Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use serde::Serialize;

use super::{DirectionExplanation, End, Explainer, Explanation, Query, Verdict};
use crate::model::cnp::CnpPeer;
use crate::model::{Family, ObjectRef, Pod, Protocol, Snapshot};
use crate::translate::Options;

/// Which flows to judge.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// One destination port (with `protocol`, default TCP); `None`: every port the
    /// destination pod declares, each with its protocol.
    pub port: Option<u16>,
    /// Only this protocol.
    pub protocol: Option<Protocol>,
    /// Only this family; `None`: each family both pods have.
    pub family: Option<Family>,
}

/// One flow whose verdict changes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct FlowChange {
    /// `namespace/name`.
    pub from: String,
    pub to: String,
    pub port: u16,
    pub protocol: &'static str,
    pub family: &'static str,
    pub before: &'static str,
    pub after: &'static str,
    /// What decided, before and after: per direction, the tier and the deciding rules.
    pub decided_before: Vec<String>,
    pub decided_after: Vec<String>,
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WhatIf {
    /// The changes, sorted, at most the limit asked for.
    pub changes: Vec<FlowChange>,
    /// How many flows change in all.
    pub total: usize,
    /// Of them, Allow → Deny.
    pub closed: usize,
    /// Of them, Deny → Allow.
    pub opened: usize,
    /// Pods present before and after (the others have no before or no after).
    pub pods: usize,
    /// Classes of pods no policy tells apart.
    pub classes: usize,
    /// Flows explained (each twice: before and after).
    pub evaluated: usize,
    /// Without a port asked for, only the ports destination pods declare are judged: the
    /// numeric ports (`port/PROTOCOL`) a changed NetworkPolicy names that no pod declares,
    /// whose changes that hides.
    pub unchecked_ports: Vec<String>,
}

/// The flows whose verdict differs between `before` and `after` (the same cluster with a
/// change applied), within `scope`; at most `limit` are listed, all are counted.
pub fn whatif(before: &Snapshot, after: &Snapshot, options: &Options, scope: &Scope, limit: usize) -> WhatIf {
    let classes = classes(before, after, options);
    let pods = classes.iter().map(|c| c.members.len()).sum();
    // When only policies changed, a flow can change only where a changed policy applies: at
    // a source or destination one of them selects.
    let affected: Option<Vec<bool>> = only_policies_changed(before, after).then(|| {
        let changed = changed_policies(before, after);
        classes
            .iter()
            .map(|c| {
                let rep = &c.members[0];
                [before, after].into_iter().any(|s| s.pod_by_name(rep).is_some_and(|p| changed.iter().any(|c| c.may_select(s, p))))
            })
            .collect()
    });
    // Judged as if every pod that is not host-networked ran on one node: a verdict between
    // pods does not depend on where they run, and one translation per snapshot is much less
    // than one per node (tests hold this against explanations on the real placement).
    let (one_before, one_after) = (on_one_node(before), on_one_node(after));
    let (mut explain_before, mut explain_after) =
        (Explainer::new(&one_before, options.clone()), Explainer::new(&one_after, options.clone()));
    let unchecked_ports = if scope.port.is_none() { unchecked_ports(before, after, &classes, scope) } else { Vec::new() };
    let mut out =
        WhatIf { changes: Vec::new(), total: 0, closed: 0, opened: 0, pods, classes: classes.len(), evaluated: 0, unchecked_ports };
    for (i, src) in classes.iter().enumerate() {
        for (j, dst) in classes.iter().enumerate() {
            if affected.as_ref().is_some_and(|a| !a[i] && !a[j]) {
                continue;
            }
            let (from, to) = if std::ptr::eq(src, dst) {
                match src.members.get(..2) {
                    Some([a, b]) => (a, b),
                    _ => continue,
                }
            } else {
                (&src.members[0], &dst.members[0])
            };
            for (port, protocol) in flows(dst, scope) {
                for family in families(src, dst, scope) {
                    let query = Query { from: End::Pod(from.clone()), to: End::Pod(to.clone()), protocol, port, family: Some(family) };
                    let (Ok(b), Ok(a)) = (explain_before.explain(&query), explain_after.explain(&query)) else { continue };
                    out.evaluated += 1;
                    if b.verdict == a.verdict {
                        continue;
                    }
                    let n = pairs(src, dst);
                    out.total += n;
                    if a.verdict == Verdict::Deny {
                        out.closed += n;
                    } else {
                        out.opened += n;
                    }
                    let (decided_before, decided_after) = (decided(&b), decided(&a));
                    for x in &src.members {
                        for y in &dst.members {
                            if out.changes.len() >= limit {
                                break;
                            }
                            if x == y {
                                continue;
                            }
                            out.changes.push(FlowChange {
                                from: x.to_string(),
                                to: y.to_string(),
                                port,
                                protocol: protocol.as_k8s(),
                                family: family.as_str(),
                                before: verdict(b.verdict),
                                after: verdict(a.verdict),
                                decided_before: decided_before.clone(),
                                decided_after: decided_after.clone(),
                            });
                        }
                    }
                }
            }
        }
    }
    out.changes.sort();
    out
}

pub(super) fn verdict(v: Verdict) -> &'static str {
    match v {
        Verdict::Allow => "Allow",
        Verdict::Deny => "Deny",
    }
}

/// Ordered pairs of distinct pods, one from each class.
fn pairs(src: &Class, dst: &Class) -> usize {
    let n = src.members.len() * dst.members.len();
    if std::ptr::eq(src, dst) { n - src.members.len() } else { n }
}

/// What decided each direction: the tier, and the rules or policies that did.
pub(super) fn decided(e: &Explanation) -> Vec<String> {
    let one = |dir: &str, d: &DirectionExplanation| {
        let refs: Vec<String> = d
            .deciding
            .iter()
            .map(|r| {
                let name = if r.namespace.is_empty() { r.name.clone() } else { format!("{}/{}", r.namespace, r.name) };
                let rule = match (&r.rule, &r.rule_name) {
                    (Some(i), Some(n)) => format!(" {dir}[{i}] {n}"),
                    (Some(i), None) => format!(" {dir}[{i}]"),
                    _ => String::new(),
                };
                format!("{} {name}{rule}: {}", r.kind, r.action)
            })
            .collect();
        let by = format!("{dir} {}: {:?}", verdict(d.verdict), d.decided_by);
        if refs.is_empty() { by } else { format!("{by} ({})", refs.join(", ")) }
    };
    vec![one("egress", &e.egress), one("ingress", &e.ingress)]
}

/// The (port, protocol) flows to judge towards a destination class.
fn flows(dst: &Class, scope: &Scope) -> Vec<(u16, Protocol)> {
    if let Some(port) = scope.port {
        return vec![(port, scope.protocol.unwrap_or(Protocol::Tcp))];
    }
    dst.ports.iter().copied().filter(|(_, p)| scope.protocol.is_none_or(|want| want == *p)).collect()
}

/// The families both classes have addresses in (within the scope).
fn families(src: &Class, dst: &Class, scope: &Scope) -> Vec<Family> {
    [Family::V4, Family::V6]
        .into_iter()
        .filter(|f| src.families.contains(f) && dst.families.contains(f) && scope.family.is_none_or(|want| want == *f))
        .collect()
}

/// Pods no policy of either snapshot can tell apart.
#[derive(Debug)]
struct Class {
    /// In `namespace/name` order; the first is the representative (every pod but those on
    /// the host network is judged on one node, so any member will do).
    members: Vec<ObjectRef>,
    /// Declared ports in either snapshot (the members agree on them).
    ports: BTreeSet<(u16, Protocol)>,
    families: BTreeSet<Family>,
}

/// A class being gathered: its members (by `namespace/name`), ports and families.
type Gathering = (Vec<(String, ObjectRef)>, BTreeSet<(u16, Protocol)>, BTreeSet<Family>);

/// The classes of the pods present in both snapshots.
fn classes(before: &Snapshot, after: &Snapshot, options: &Options) -> Vec<Class> {
    let keys: BTreeSet<String> = label_keys(before, options).into_iter().chain(label_keys(after, options)).collect();
    let cidrs: Vec<IpNet> = cidrs(before).into_iter().chain(cidrs(after)).collect::<BTreeSet<_>>().into_iter().collect();
    let shared_before = shared_addresses(before);
    let shared_after = shared_addresses(after);
    let mut by_key: BTreeMap<String, Gathering> = BTreeMap::new();
    for b in before.pods() {
        let key = b.key();
        let Some(a) = after.pod_by_name(&key) else { continue };
        let shared = b.ips.iter().any(|ip| shared_before.contains(ip)) || a.ips.iter().any(|ip| shared_after.contains(ip));
        let class_key = format!(
            "{}\u{0}{}{}",
            features(before, b, &cidrs, &keys),
            features(after, a, &cidrs, &keys),
            if shared { format!("\u{0}{key}") } else { String::new() }
        );
        let entry = by_key.entry(class_key).or_default();
        entry.0.push((key.to_string(), key));
        for p in b.ports.iter().chain(&a.ports) {
            entry.1.insert((p.port, p.protocol));
        }
        for ip in &b.ips {
            entry.2.insert(Family::of(*ip));
        }
    }
    by_key
        .into_values()
        .map(|(mut members, ports, families)| {
            members.sort();
            Class { members: members.into_iter().map(|(_, key)| key).collect(), ports, families }
        })
        .collect()
}

/// Everything a verdict can read of `pod` in `s`, but its name, uid, exact addresses and the
/// labels no selector looks at.
fn features(s: &Snapshot, pod: &Pod, cidrs: &[IpNet], keys: &BTreeSet<String>) -> String {
    let read = |labels: &crate::model::Labels| -> Vec<(String, String)> {
        labels.iter().filter(|(k, _)| keys.contains(*k)).map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    let ns = s.namespace(&pod.namespace).map(|n| (read(&n.labels), n.audit, n.log_allowed));
    let mut ports: Vec<String> = pod.ports.iter().map(|p| format!("{p:?}")).collect();
    ports.sort();
    let addresses: Vec<String> = pod
        .ips
        .iter()
        .map(|ip| {
            let inside: Vec<usize> = cidrs.iter().enumerate().filter(|(_, c)| c.contains(ip)).map(|(i, _)| i).collect();
            format!("{:?}{inside:?}", Family::of(*ip))
        })
        .collect();
    let node = if pod.host_network { pod.node.as_deref().unwrap_or("") } else { "" };
    format!(
        "{}\u{1}{ns:?}\u{1}{:?}\u{1}{ports:?}\u{1}{:?}\u{1}{}\u{1}{node}\u{1}{}\u{1}{addresses:?}",
        pod.namespace,
        read(&pod.labels),
        pod.phase,
        pod.host_network,
        pod.node.is_some()
    )
}

/// The label keys anything of `s` selects on: the policies' subject and peer selectors (pods
/// and namespaces), the trusted resolvers' labels and the run label. Other labels cannot
/// tell pods apart.
fn label_keys(s: &Snapshot, options: &Options) -> BTreeSet<String> {
    let mut keys = BTreeSet::from([crate::model::RUN_LABEL.to_string()]);
    let mut add = |sel: &crate::model::LabelSelector| {
        keys.extend(sel.match_labels.keys().cloned());
        keys.extend(sel.match_expressions.iter().map(|e| e.key.clone()));
    };
    for p in s.policies() {
        add(&p.pod_selector);
        for rule in p.ingress.iter().chain(&p.egress) {
            for peer in &rule.peers {
                peer.pod_selector.iter().chain(&peer.namespace_selector).for_each(&mut add);
            }
        }
    }
    let add_pods = |pods: &crate::model::cnp::CnpPods, add: &mut dyn FnMut(&crate::model::LabelSelector)| {
        add(&pods.pod_selector);
        pods.namespace_selector.iter().for_each(add);
    };
    for p in s.cluster_policies() {
        match &p.subject {
            crate::model::cnp::CnpSubject::Namespaces(sel) => add(sel),
            crate::model::cnp::CnpSubject::Pods(pods) => add_pods(pods, &mut add),
            crate::model::cnp::CnpSubject::Invalid(_) => {}
        }
        for rule in p.ingress.iter().chain(&p.egress) {
            for peer in &rule.peers {
                match peer {
                    CnpPeer::Namespaces(sel) => add(sel),
                    CnpPeer::Pods(pods) => add_pods(pods, &mut add),
                    CnpPeer::Networks(_) | CnpPeer::Nodes(_) | CnpPeer::DomainNames(_) | CnpPeer::Invalid(_) => {}
                }
            }
        }
    }
    if let Some(r) = &options.dns_resolvers {
        keys.extend(r.labels.keys().cloned());
    }
    keys
}

/// A node name no Kubernetes node can have (names are DNS subdomains: no `/`).
const ONE_NODE: &str = "flock/whatif";

/// `s` with every scheduled pod that is not host-networked on [`ONE_NODE`].
fn on_one_node(s: &Snapshot) -> Snapshot {
    let mut out = s.clone();
    let moved: Vec<Pod> =
        s.pods().filter(|p| p.node.is_some() && !p.host_network).map(|p| Pod { node: Some(ONE_NODE.to_string()), ..p.clone() }).collect();
    for p in moved {
        out.upsert_pod(p);
    }
    out
}

/// Whether `before` and `after` differ in their policies only (pods, namespaces and nodes
/// alike).
fn only_policies_changed(before: &Snapshot, after: &Snapshot) -> bool {
    before.pod_count() == after.pod_count()
        && before.pods().all(|p| after.pod_by_name(&p.key()).is_some_and(|q| q == p))
        && before.namespaces().eq(after.namespaces())
        && before.nodes().eq(after.nodes())
}

/// A policy added, removed or changed: what decides which pods it applies to.
enum Changed<'a> {
    Policy(&'a crate::model::NetworkPolicy),
    Cluster(&'a crate::model::cnp::ClusterNetworkPolicy),
}

impl Changed<'_> {
    /// Whether it may apply to `pod` of `s` (a selector flock cannot read: it may).
    fn may_select(&self, s: &Snapshot, pod: &Pod) -> bool {
        use crate::model::cnp::CnpSubject;
        use crate::translate::selector::Selector;
        let matches = |sel: &crate::model::LabelSelector, labels: &crate::model::Labels| {
            Selector::compile(sel).map_or(true, |compiled| compiled.matches(labels))
        };
        let ns_labels = s.namespace(&pod.namespace).map(|n| n.labels.clone()).unwrap_or_default();
        match self {
            Self::Policy(p) => p.namespace == pod.namespace && matches(&p.pod_selector, &pod.labels),
            Self::Cluster(p) => match &p.subject {
                CnpSubject::Namespaces(sel) => matches(sel, &ns_labels),
                CnpSubject::Pods(pods) => {
                    pods.namespace_selector.as_ref().is_none_or(|sel| matches(sel, &ns_labels)) && matches(&pods.pod_selector, &pod.labels)
                }
                CnpSubject::Invalid(_) => true,
            },
        }
    }
}

/// The policies of either snapshot that the other has not, or has otherwise.
fn changed_policies<'a>(before: &'a Snapshot, after: &'a Snapshot) -> Vec<Changed<'a>> {
    let mut out = Vec::new();
    for (s, other) in [(before, after), (after, before)] {
        for p in s.policies() {
            if !other.policies_in(&p.namespace).any(|q| q == p) {
                out.push(Changed::Policy(p));
            }
        }
        for p in s.cluster_policies() {
            if !other.cluster_policies().any(|q| q == p) {
                out.push(Changed::Cluster(p));
            }
        }
    }
    out
}

/// The numeric ports the changed NetworkPolicies' rules name (a range by its first port)
/// that the flows they govern are not judged on, within the scope's protocol: an ingress
/// rule's port no pod the policy selects declares, an egress rule's port no pod declares.
/// `port/PROTOCOL`, sorted.
fn unchecked_ports(before: &Snapshot, after: &Snapshot, classes: &[Class], scope: &Scope) -> Vec<String> {
    let all: BTreeSet<(u16, Protocol)> = classes.iter().flat_map(|c| c.ports.iter().copied()).collect();
    let mut named = BTreeSet::new();
    for changed in changed_policies(before, after) {
        let Changed::Policy(p) = changed else { continue };
        let selected: BTreeSet<(u16, Protocol)> = classes
            .iter()
            .filter(|c| [before, after].into_iter().any(|s| s.pod_by_name(&c.members[0]).is_some_and(|pod| changed.may_select(s, pod))))
            .flat_map(|c| c.ports.iter().copied())
            .collect();
        for (rules, declared) in [(&p.ingress, &selected), (&p.egress, &all)] {
            for port in rules.iter().flat_map(|r| &r.ports) {
                let Some(crate::model::PortRef::Number(n)) = port.port else { continue };
                let protocol = port.protocol.as_deref().map_or(Some(Protocol::Tcp), Protocol::parse);
                if let (Ok(n), Some(protocol)) = (u16::try_from(n), protocol)
                    && scope.protocol.is_none_or(|want| want == protocol)
                    && !declared.contains(&(n, protocol))
                {
                    named.insert((n, protocol));
                }
            }
        }
    }
    named.into_iter().map(|(n, p)| format!("{n}/{}", p.as_k8s())).collect()
}

/// Addresses more than one pod reports.
fn shared_addresses(s: &Snapshot) -> BTreeSet<IpAddr> {
    let mut seen = BTreeSet::new();
    let mut shared = BTreeSet::new();
    for p in s.pods() {
        for ip in &p.ips {
            if !seen.insert(*ip) {
                shared.insert(*ip);
            }
        }
    }
    shared
}

/// Every CIDR the policies of `s` name (ipBlock cidr and except; networks): what can tell
/// pods apart by address.
fn cidrs(s: &Snapshot) -> Vec<IpNet> {
    let mut out = Vec::new();
    let mut add = |c: &str| {
        if let Ok(net) = c.parse::<IpNet>() {
            out.push(net.trunc());
        }
    };
    for p in s.policies() {
        for rule in p.ingress.iter().chain(&p.egress) {
            for peer in &rule.peers {
                if let Some(b) = &peer.ip_block {
                    add(&b.cidr);
                    b.except.iter().for_each(|e| add(e));
                }
            }
        }
    }
    for p in s.cluster_policies() {
        for rule in p.ingress.iter().chain(&p.egress) {
            for peer in &rule.peers {
                if let CnpPeer::Networks(n) = peer {
                    n.iter().for_each(|c| add(c));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::conformance::{self, Case};
    use crate::explain::Explainer;
    use crate::testkit;

    /// Every changed flow, pair by pair, with no classes: what `whatif` must equal.
    fn brute_force(
        before: &Snapshot,
        after: &Snapshot,
        options: &Options,
        scope: &Scope,
    ) -> BTreeSet<(String, String, u16, &'static str, &'static str, &'static str)> {
        let (mut eb, mut ea) = (Explainer::new(before, options.clone()), Explainer::new(after, options.clone()));
        let mut out = BTreeSet::new();
        let pods: Vec<&Pod> = before.pods().filter(|p| after.pod_by_name(&p.key()).is_some()).collect();
        for from in &pods {
            for to in &pods {
                if from.key() == to.key() {
                    continue;
                }
                let to_after = after.pod_by_name(&to.key()).unwrap();
                let mut flows: BTreeSet<(u16, Protocol)> = to.ports.iter().chain(&to_after.ports).map(|p| (p.port, p.protocol)).collect();
                if let Some(port) = scope.port {
                    flows = [(port, scope.protocol.unwrap_or(Protocol::Tcp))].into();
                }
                for (port, protocol) in flows {
                    if scope.protocol.is_some_and(|p| p != protocol) {
                        continue;
                    }
                    for family in [Family::V4, Family::V6] {
                        if !from.ips.iter().any(|ip| Family::of(*ip) == family) || !to.ips.iter().any(|ip| Family::of(*ip) == family) {
                            continue;
                        }
                        let q = Query { from: End::Pod(from.key()), to: End::Pod(to.key()), protocol, port, family: Some(family) };
                        let (Ok(b), Ok(a)) = (eb.explain(&q), ea.explain(&q)) else { continue };
                        if b.verdict != a.verdict {
                            out.insert((
                                from.key().to_string(),
                                to.key().to_string(),
                                port,
                                protocol.as_k8s(),
                                verdict(b.verdict),
                                verdict(a.verdict),
                            ));
                        }
                    }
                }
            }
        }
        out
    }

    /// Each step of `case` as a change: whatif from the state before it to the state after.
    fn check_case(base: &Snapshot, case: &Case, scopes: &[Scope]) -> usize {
        let mut before = base.clone();
        let mut changed = 0;
        for step in &case.steps {
            let mut after = before.clone();
            conformance::apply_step(&mut after, step);
            for scope in scopes {
                let w = whatif(&before, &after, &Options::default(), scope, usize::MAX);
                let got: BTreeSet<_> =
                    w.changes.iter().map(|c| (c.from.clone(), c.to.clone(), c.port, c.protocol, c.before, c.after)).collect();
                assert_eq!(got.len(), w.total, "{}: duplicates", case.dir_name);
                let want = brute_force(&before, &after, &Options::default(), scope);
                assert_eq!(got, want, "{} {scope:?}", case.dir_name);
                assert_eq!(w.opened + w.closed, w.total);
                changed += w.total;
            }
            before = after;
        }
        changed
    }

    fn scopes() -> Vec<Scope> {
        vec![
            Scope::default(),
            Scope { port: Some(80), protocol: Some(Protocol::Tcp), family: Some(Family::V4) },
            Scope { port: Some(81), protocol: Some(Protocol::Udp), family: None },
        ]
    }

    /// The base cluster with a twin of every pod (same namespace, labels, ports and node;
    /// the next address): classes of two.
    fn twinned() -> Snapshot {
        let mut s = testkit::base_cluster();
        let pods: Vec<Pod> = s.pods().cloned().collect();
        for mut p in pods {
            p.name = format!("{}2", p.name);
            p.uid = format!("{}-twin", p.uid);
            p.ips = p
                .ips
                .iter()
                .map(|ip| match ip {
                    IpAddr::V4(v4) => IpAddr::V4(std::net::Ipv4Addr::from(u32::from(*v4) + 100)),
                    IpAddr::V6(v6) => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(*v6) + 100)),
                })
                .collect();
            s.upsert_pod(p);
        }
        s
    }

    #[test]
    fn every_conformance_step_changes_what_pair_by_pair_explains_say() {
        for base in [testkit::base_cluster(), twinned()] {
            conformance_cases(&base);
        }
    }

    fn conformance_cases(base: &Snapshot) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
        let mut dirs: Vec<_> =
            std::fs::read_dir(&root).unwrap().filter_map(Result::ok).map(|e| e.path()).filter(|p| p.join("case.yaml").is_file()).collect();
        dirs.sort();
        let mut changed = 0;
        for dir in &dirs {
            let name = dir.file_name().unwrap().to_string_lossy().to_string();
            let case = conformance::parse_case(dir, &name, &std::fs::read_to_string(dir.join("case.yaml")).unwrap()).unwrap();
            changed += check_case(base, &case, &scopes());
        }
        assert!(dirs.len() > 20 && changed > 0, "{} cases, {changed} changes", dirs.len());
    }

    #[test]
    fn random_changes_agree_with_pair_by_pair_explains() {
        let base = testkit::base_cluster();
        let twins = twinned();
        // No policy looks at any label: a class per namespace.
        assert_eq!(whatif(&twins, &twins, &Options::default(), &Scope::default(), 0).classes, 3);
        let mut changed = 0;
        for generated in testkit::cases::generate(&base, 0x5eed_ca5e, 60) {
            let case = conformance::parse_case(Path::new(&generated.dir_name), &generated.dir_name, &generated.yaml).unwrap();
            changed += check_case(&base, &case, &scopes()[..1]);
            changed += check_case(&twins, &case, &scopes()[..1]);
        }
        assert!(changed > 0);
    }

    /// `s` with a policy whose selector reads the `pod` label (changing nothing else).
    fn selecting_twins(s: &Snapshot) -> Snapshot {
        let mut out = s.clone();
        for p in testkit::policies(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: none, namespace: z}\n\
             spec: {podSelector: {matchLabels: {pod: nobody}}, policyTypes: [Ingress]}\n",
        ) {
            out.upsert_policy(p);
        }
        out
    }

    #[test]
    fn classes_group_pods_no_policy_tells_apart() {
        let base = testkit::base_cluster();
        // No policy: no selector reads the `pod` label, so a namespace's pods are one class.
        let w = whatif(&base, &base, &Options::default(), &Scope::default(), 10);
        assert_eq!((w.total, w.pods, w.classes), (0, 9, 3));
        // A policy selecting by `pod` tells them apart, everywhere.
        let mut selecting = base.clone();
        for p in testkit::policies(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web, namespace: x}\n\
             spec: {podSelector: {matchLabels: {pod: a}}, policyTypes: [Ingress]}\n",
        ) {
            selecting.upsert_policy(p);
        }
        assert_eq!(whatif(&base, &selecting, &Options::default(), &Scope::default(), 10).classes, 9);
        // A pod and its twin (same labels, ports, namespace) share a class.
        let mut twin = base.pod_by_name(&ObjectRef::new("x", "a")).unwrap().clone();
        twin.name = "a2".into();
        twin.uid = "uid-a2".into();
        twin.ips = vec!["198.18.1.99".parse().unwrap()];
        let mut s = base.clone();
        s.upsert_pod(twin);
        let w = whatif(&s, &selecting_twins(&s), &Options::default(), &Scope::default(), 10);
        assert_eq!((w.pods, w.classes), (10, 9));
        // An ipBlock around the twin's address tells it apart.
        let mut after = s.clone();
        let policies = testkit::policies(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: out, namespace: y}\n\
             spec: {podSelector: {}, policyTypes: [Egress], egress: [{to: [{ipBlock: {cidr: 198.18.1.99/32}}]}]}\n",
        );
        for p in policies {
            after.upsert_policy(p);
        }
        let w = whatif(&s, &after, &Options::default(), &Scope { port: Some(80), ..Scope::default() }, usize::MAX);
        // x/a2 is apart (its address); the rest, per namespace (no selector reads a label).
        assert_eq!(w.classes, 4);
        // y's pods may now reach only x/a2: every other destination closes.
        assert!(w.changes.iter().all(|c| c.from.starts_with("y/") && c.to != "x/a2" && c.after == "Deny"), "{:?}", w.changes);
        assert_eq!(w.total, 3 * 8);
    }
}
