//! ClusterNetworkPolicy as written → a validated policy the translator can place in its tier.
//!
//! Semantics (network-policy-api `v1alpha2`, `clusternetworkpolicy_types.go`): per direction,
//! the Admin tier (priority ascending — lower numbers first — then rule order within a
//! policy), then NetworkPolicy, then the Baseline tier, then the default (allow). `Accept`
//! and `Deny` are final for the direction; `Pass` skips the rest of the tier. A policy with no
//! rules for a direction does not affect that direction (no implicit isolation). Only
//! `namespaces` and `pods` peers exist for ingress; egress adds `networks` (CIDRs, which
//! match pod addresses too), `nodes` and `domainNames`.
//!
//! Equal priorities in one tier are undefined by the API ("the implementation can apply any
//! of the matching policies"). flock evaluates each such policy's rules in order and takes
//! the safest of their first matches: Deny over Pass over Accept (never more than any
//! choice the API allows). Such overlaps are reported.
//!
//! Fail closed, as the API asks for peers it cannot understand ("For Accept rules, treat the
//! rule as matching no traffic. For Deny and Pass rules, treat the rule as a Deny all rule"),
//! and extended by flock to every part of a rule it cannot read or does not support yet (an
//! unknown action, protocol or port shape, an invalid selector or CIDR or domain name, a
//! `domainNames` peer in a Deny or Pass rule, a named port next to a `networks`, `nodes` or
//! `domainNames` peer, a peer ingress cannot have):
//! such a rule matches nothing if it accepts, and denies all traffic of its direction, in its
//! place, if it denies or passes. For what concerns the whole policy:
//! - an unknown `tier` or a `priority` outside 0–1000 cannot be placed: the policy is
//!   evaluated first in the Admin tier, its Accept rules match nothing and its Pass rules
//!   deny what they match (a Pass there could skip an Admin Deny);
//! - an unreadable `subject` selects every pod, with the same reading of its rules.
//!
//! Every such case is reported with the policy's name, the field and the reason.

use super::ir::{Action, Direction, DomainDef, IpBlockDef, NsScope, PeerDef, PolicyKind, PolicyProblem, Tier};
use super::selector::Selector;
use crate::model::cnp::{ClusterNetworkPolicy, CnpPeer, CnpPods, CnpPort, CnpProtocol, CnpRule, CnpSubject};
use crate::model::{Labels, ObjectRef, Protocol, clip};

/// The highest priority the API allows.
pub(crate) const MAX_PRIORITY: i64 = 1000;

/// Whom a policy applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Subject {
    /// Pods whose namespace matches `namespaces` and who match `pods`.
    Pods { namespaces: Selector, pods: Selector },
    /// Every pod (an unreadable subject, fail closed).
    Everything,
}

impl Subject {
    pub(crate) fn matches(&self, namespace_labels: Option<&Labels>, pod_labels: &Labels) -> bool {
        match self {
            Self::Everything => true,
            // A namespace flock has not seen matches no selector (its labels are unknown).
            Self::Pods { namespaces, pods } => namespace_labels.is_some_and(|l| namespaces.matches(l)) && pods.matches(pod_labels),
        }
    }
}

/// A peer a rule can match.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum CnpPeerDef {
    /// Pods (a shared address set).
    Pods(PeerDef),
    /// Addresses that are not pods' (a CIDR — pod addresses inside it match too — or the
    /// addresses of some Nodes): no named port goes with them.
    Network(PeerDef),
    /// Addresses learned for domain names (an Accept rule's `domainNames`): no named port
    /// goes with them either.
    Domains(DomainDef),
}

impl CnpPeerDef {}

/// One entry of `protocols`, validated.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum CnpPortSpec {
    Range(Protocol, u16, u16),
    /// A container port name, resolved on the destination pod (its protocol and number).
    Named(String),
}

/// What a rule matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RuleMatch {
    /// Its peers (any of them) and ports (`None`: every protocol and port).
    Peers { peers: Vec<CnpPeerDef>, ports: Option<Vec<CnpPortSpec>> },
    /// Every packet of the direction (a Deny or Pass rule flock cannot read: Deny all).
    Everything,
}

/// A rule as flock enforces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CompiledCnpRule {
    pub(crate) index: usize,
    pub(crate) name: Option<String>,
    pub(crate) action: Action,
    pub(crate) matches: RuleMatch,
    /// Why it is not enforced as written.
    pub(crate) fail_closed: Option<String>,
}

/// A validated ClusterNetworkPolicy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CompiledCnp {
    pub(crate) name: String,
    /// Annotated for audit (`Options::audit_mode` decides whether that counts).
    pub(crate) audit: bool,
    pub(crate) tier: Tier,
    /// `None`: the policy cannot be placed; it is evaluated first in the Admin tier.
    pub(crate) priority: Option<i64>,
    pub(crate) subject: Subject,
    pub(crate) ingress: Vec<CompiledCnpRule>,
    pub(crate) egress: Vec<CompiledCnpRule>,
}

impl CompiledCnp {
    pub(crate) fn rules(&self, dir: Direction) -> &[CompiledCnpRule] {
        match dir {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }
}

struct Reporter<'a> {
    name: &'a str,
    problems: &'a mut Vec<PolicyProblem>,
}

impl Reporter<'_> {
    fn report(&mut self, field: String, message: String) {
        self.problems.push(PolicyProblem { kind: PolicyKind::ClusterNetworkPolicy, policy: ObjectRef::new("", self.name), field, message });
    }
}

/// Validates and compiles `p`, appending what is wrong with it to `problems`.
pub(crate) fn compile(p: &ClusterNetworkPolicy, problems: &mut Vec<PolicyProblem>) -> CompiledCnp {
    let mut r = Reporter { name: &p.name, problems };
    // Policy-level problems: the policy cannot be placed or its subject read.
    let mut degraded = false;
    let tier = match p.tier.as_str() {
        "Admin" => Tier::Admin,
        "Baseline" => Tier::Baseline,
        other => {
            r.report(
                "spec.tier".into(),
                format!(
                    "{:?} is not Admin or Baseline; evaluated first in the Admin tier, its Accept rules match nothing and its Pass rules deny (fail closed)",
                    clip(other)
                ),
            );
            degraded = true;
            Tier::Admin
        }
    };
    let priority = match p.priority {
        Some(n) if (0..=MAX_PRIORITY).contains(&n) && !degraded => Some(n),
        Some(_) | None if degraded => None,
        other => {
            let what = other.map_or_else(|| "missing".to_string(), |n| format!("{n} is not in 0-{MAX_PRIORITY}"));
            r.report(
                "spec.priority".into(),
                format!("{what}; evaluated first in the Admin tier, its Accept rules match nothing and its Pass rules deny (fail closed)"),
            );
            degraded = true;
            None
        }
    };
    let tier = if degraded { Tier::Admin } else { tier };
    let subject = match compile_subject(&p.subject) {
        Ok(s) => s,
        Err((field, message)) => {
            r.report(
                format!("spec.subject{field}"),
                format!("{message}; selecting every pod, its Accept rules match nothing and its Pass rules deny (fail closed)"),
            );
            degraded = true;
            Subject::Everything
        }
    };
    let mut compile_rules = |dir: Direction, rules: &[CnpRule]| -> Vec<CompiledCnpRule> {
        rules
            .iter()
            .enumerate()
            .filter_map(|(i, rule)| {
                let c = compile_rule(dir, tier, i, rule, &mut r)?;
                degrade(c, degraded)
            })
            .collect()
    };
    let ingress = compile_rules(Direction::Ingress, &p.ingress);
    let egress = compile_rules(Direction::Egress, &p.egress);
    CompiledCnp { name: p.name.clone(), audit: p.audit, tier, priority, subject, ingress, egress }
}

/// A rule of a policy that cannot be placed or whose subject cannot be read: Accept matches
/// nothing, Pass denies what it matches (see the module doc).
fn degrade(mut rule: CompiledCnpRule, degraded: bool) -> Option<CompiledCnpRule> {
    if !degraded {
        return Some(rule);
    }
    match rule.action {
        Action::Accept => None,
        Action::Pass => {
            rule.action = Action::Deny;
            rule.fail_closed.get_or_insert_with(|| "the policy cannot be placed: Pass read as Deny".into());
            Some(rule)
        }
        Action::Deny => Some(rule),
    }
}

type FieldError = (String, String);

fn selector(sel: &crate::model::LabelSelector, field: &str) -> Result<Selector, FieldError> {
    Selector::compile(sel).map_err(|e| (format!("{field}.{}", e.field), e.message))
}

fn compile_pods(p: &CnpPods, field: &str) -> Result<(Selector, Selector), FieldError> {
    let namespaces = match &p.namespace_selector {
        None => Selector::everything(),
        Some(s) => selector(s, &format!("{field}.namespaceSelector"))?,
    };
    let pods = selector(&p.pod_selector, &format!("{field}.podSelector"))?;
    Ok((namespaces, pods))
}

fn compile_subject(s: &CnpSubject) -> Result<Subject, FieldError> {
    match s {
        CnpSubject::Namespaces(sel) => Ok(Subject::Pods { namespaces: selector(sel, ".namespaces")?, pods: Selector::everything() }),
        CnpSubject::Pods(p) => {
            let (namespaces, pods) = compile_pods(p, ".pods")?;
            Ok(Subject::Pods { namespaces, pods })
        }
        CnpSubject::Invalid(why) => Err((String::new(), why.clone())),
    }
}

fn compile_rule(dir: Direction, tier: Tier, index: usize, rule: &CnpRule, r: &mut Reporter<'_>) -> Option<CompiledCnpRule> {
    let base = format!("spec.{}[{index}]", dir.as_field());
    let label = rule.name.as_deref().map(|n| format!(" ({})", clip(n))).unwrap_or_default();
    let action = match rule.action.as_str() {
        "Accept" => Some(Action::Accept),
        "Deny" => Some(Action::Deny),
        "Pass" => Some(Action::Pass),
        _ => None,
    };
    let Some(action) = action else {
        r.report(
            format!("{base}.action"),
            format!(
                "{:?}{label} is not Accept, Deny or Pass; this rule denies all {dir} traffic of its subject (fail closed)",
                clip(&rule.action)
            ),
        );
        return Some(CompiledCnpRule {
            index,
            name: rule.name.clone(),
            action: Action::Deny,
            matches: RuleMatch::Everything,
            fail_closed: Some(format!("unknown action {:?}", clip(&rule.action))),
        });
    };
    let matches = compile_matches(dir, tier, rule, action).map_err(|(field, message)| (format!("{base}{field}"), message));
    match matches {
        Ok(matches) => Some(CompiledCnpRule { index, name: rule.name.clone(), action, matches, fail_closed: None }),
        Err((field, message)) => match action {
            Action::Accept => {
                r.report(field, format!("{message}{label}; this Accept rule matches nothing (fail closed)"));
                None
            }
            Action::Deny | Action::Pass => {
                r.report(field, format!("{message}{label}; this {action} rule denies all {dir} traffic of its subject (fail closed)"));
                Some(CompiledCnpRule {
                    index,
                    name: rule.name.clone(),
                    action: Action::Deny,
                    matches: RuleMatch::Everything,
                    fail_closed: Some(message),
                })
            }
        },
    }
}

fn compile_matches(dir: Direction, tier: Tier, rule: &CnpRule, action: Action) -> Result<RuleMatch, FieldError> {
    let peers_field = match dir {
        Direction::Ingress => "from",
        Direction::Egress => "to",
    };
    if rule.peers.is_empty() {
        return Err((format!(".{peers_field}"), "at least one peer is required".into()));
    }
    let mut peers = Vec::with_capacity(rule.peers.len());
    let mut addresses_only = false;
    for (j, peer) in rule.peers.iter().enumerate() {
        let at = |f: &str| format!(".{peers_field}[{j}]{f}");
        match peer {
            CnpPeer::Namespaces(sel) => {
                let ns = selector(sel, &at(".namespaces"))?;
                peers.push(CnpPeerDef::Pods(PeerDef::Pods { namespaces: NsScope::Matching(ns), pods: None }));
            }
            CnpPeer::Pods(p) => {
                let (namespaces, pods) = compile_pods(p, &at(".pods"))?;
                let pods = (!pods.is_everything()).then_some(pods);
                peers.push(CnpPeerDef::Pods(PeerDef::Pods { namespaces: NsScope::Matching(namespaces), pods }));
            }
            CnpPeer::Networks(cidrs) if dir == Direction::Egress => {
                if cidrs.is_empty() {
                    return Err((at(".networks"), "at least one CIDR is required".into()));
                }
                for (k, c) in cidrs.iter().enumerate() {
                    let net = super::compile::parse_cidr(c).map_err(|m| (at(&format!(".networks[{k}]")), m))?;
                    peers.push(CnpPeerDef::Network(PeerDef::Block(IpBlockDef { cidr: net, except: Vec::new() })));
                }
                addresses_only = true;
            }
            CnpPeer::Networks(_) => return Err((at(".networks"), "ingress rules have no networks peer".into())),
            CnpPeer::Nodes(sel) if dir == Direction::Egress => {
                peers.push(CnpPeerDef::Network(PeerDef::Nodes(selector(sel, &at(".nodes"))?)));
                addresses_only = true;
            }
            CnpPeer::Nodes(_) => return Err((at(".nodes"), "ingress rules have no nodes peer".into())),
            CnpPeer::DomainNames(_) if dir == Direction::Ingress => {
                return Err((at(".domainNames"), "ingress rules have no domainNames peer".into()));
            }
            CnpPeer::DomainNames(_) if action != Action::Accept || tier != Tier::Admin => {
                return Err((at(".domainNames"), "domainNames peers are only supported in Accept rules of the Admin tier".into()));
            }
            CnpPeer::DomainNames(names) => {
                if names.is_empty() {
                    return Err((at(".domainNames"), "at least one domain name is required".into()));
                }
                let mut patterns = Vec::with_capacity(names.len());
                for (k, n) in names.iter().enumerate() {
                    patterns.push(
                        crate::dns::DomainPattern::parse(n)
                            .map_err(|m| (at(&format!(".domainNames[{k}]")), format!("{:?}: {m}", clip(n))))?,
                    );
                }
                peers.push(CnpPeerDef::Domains(DomainDef::new(patterns)));
                addresses_only = true;
            }
            CnpPeer::Invalid(why) => return Err((at(""), why.clone())),
        }
    }
    peers.sort();
    peers.dedup();
    let ports = match &rule.protocols {
        None => None,
        Some(list) if list.is_empty() => {
            return Err((".protocols".into(), "at least one protocol is required when protocols is set".into()));
        }
        Some(list) => {
            let mut specs = Vec::with_capacity(list.len());
            for (j, p) in list.iter().enumerate() {
                let at = |f: &str| format!(".protocols[{j}]{f}");
                let spec = match p {
                    CnpProtocol::Tcp(port) => range(Protocol::Tcp, port).map_err(|m| (at(".tcp.destinationPort"), m))?,
                    CnpProtocol::Udp(port) => range(Protocol::Udp, port).map_err(|m| (at(".udp.destinationPort"), m))?,
                    CnpProtocol::Sctp(port) => range(Protocol::Sctp, port).map_err(|m| (at(".sctp.destinationPort"), m))?,
                    CnpProtocol::NamedPort(name) => {
                        if addresses_only {
                            return Err((
                                at(".destinationNamedPort"),
                                "a named port cannot be used with a networks, nodes or domainNames peer".into(),
                            ));
                        }
                        super::compile::validate_port_name(name)
                            .map_err(|m| (at(".destinationNamedPort"), format!("{:?}: {m}", clip(name))))?;
                        CnpPortSpec::Named(name.clone())
                    }
                    CnpProtocol::Invalid(why) => return Err((at(""), why.clone())),
                };
                specs.push(spec);
            }
            specs.sort();
            specs.dedup();
            Some(specs)
        }
    };
    Ok(RuleMatch::Peers { peers, ports })
}

fn port_number(n: i64) -> Option<u16> {
    u16::try_from(n).ok().filter(|p| *p != 0)
}

fn range(protocol: Protocol, port: &CnpPort) -> Result<CnpPortSpec, String> {
    match port {
        CnpPort::Number(n) => {
            let p = port_number(*n).ok_or_else(|| format!("number: {n} is not a port number (1-65535)"))?;
            Ok(CnpPortSpec::Range(protocol, p, p))
        }
        CnpPort::Range { start, end } => {
            let s = port_number(*start).ok_or_else(|| format!("range.start: {start} is not a port number (1-65535)"))?;
            let e = port_number(*end).ok_or_else(|| format!("range.end: {end} is not a port number (1-65535)"))?;
            if s >= e {
                return Err(format!("range: start {s} must be less than end {e}"));
            }
            Ok(CnpPortSpec::Range(protocol, s, e))
        }
        CnpPort::Invalid(why) => Err(why.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LabelSelector;
    use crate::model::cnp::CnpPods;

    fn policy(tier: &str, priority: Option<i64>) -> ClusterNetworkPolicy {
        ClusterNetworkPolicy {
            name: "p".into(),
            audit: false,
            generation: None,
            uid: None,
            tier: tier.into(),
            priority,
            subject: CnpSubject::Namespaces(LabelSelector::default()),
            ingress: vec![],
            egress: vec![],
        }
    }

    fn rule(action: &str, peers: Vec<CnpPeer>, protocols: Option<Vec<CnpProtocol>>) -> CnpRule {
        CnpRule { name: Some("r".into()), action: action.into(), peers, protocols }
    }

    fn all_ns() -> CnpPeer {
        CnpPeer::Namespaces(LabelSelector::default())
    }

    fn compiled(p: &ClusterNetworkPolicy) -> (CompiledCnp, Vec<PolicyProblem>) {
        let mut problems = Vec::new();
        let c = compile(p, &mut problems);
        (c, problems)
    }

    #[test]
    fn valid_rules_compile_as_written() {
        let mut p = policy("Baseline", Some(7));
        p.egress = vec![rule(
            "Pass",
            vec![CnpPeer::Networks(vec!["198.18.1.7/24".into()]), all_ns()],
            Some(vec![CnpProtocol::Udp(CnpPort::Range { start: 80, end: 81 }), CnpProtocol::Tcp(CnpPort::Number(443))]),
        )];
        let (c, problems) = compiled(&p);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!((c.tier, c.priority), (Tier::Baseline, Some(7)));
        let r = &c.egress[0];
        assert_eq!(r.action, Action::Pass);
        let RuleMatch::Peers { peers, ports } = &r.matches else { panic!() };
        assert!(
            peers.contains(&CnpPeerDef::Network(PeerDef::Block(IpBlockDef { cidr: "198.18.1.0/24".parse().unwrap(), except: vec![] })))
        );
        assert_eq!(ports.as_deref().unwrap(), [CnpPortSpec::Range(Protocol::Tcp, 443, 443), CnpPortSpec::Range(Protocol::Udp, 80, 81)]);
    }

    #[test]
    fn domain_names_compile_in_admin_accept_rules_and_fail_closed_elsewhere() {
        // Valid names: one peer, patterns canonical (lowercase, no trailing dot, sorted).
        let mut p = policy("Admin", Some(1));
        p.egress =
            vec![rule("Accept", vec![CnpPeer::DomainNames(vec!["GitHub.com.".into(), "*.pypi.org".into(), "github.com".into()])], None)];
        let (c, problems) = compiled(&p);
        assert!(problems.is_empty(), "{problems:?}");
        let RuleMatch::Peers { peers, .. } = &c.egress[0].matches else { panic!() };
        let [CnpPeerDef::Domains(d)] = peers.as_slice() else { panic!("{peers:?}") };
        assert_eq!(d.short(), "github.com,*.pypi.org");
        // Bad names, Deny/Pass, Baseline, ingress: the problem names the field; the rule fails
        // closed like any rule flock cannot read.
        for (tier, action, names, field, says) in [
            ("Admin", "Accept", vec!["example.com", "*.*.example.com"], "spec.egress[0].to[1].domainNames[1]", "'*' may only"),
            ("Admin", "Accept", vec![], "spec.egress[0].to[1].domainNames", "at least one"),
            ("Admin", "Deny", vec!["example.com"], "spec.egress[0].to[1].domainNames", "only supported in Accept rules"),
            ("Baseline", "Accept", vec!["example.com"], "spec.egress[0].to[1].domainNames", "of the Admin tier"),
        ] {
            let mut p = policy(tier, Some(1));
            let peer = CnpPeer::DomainNames(names.iter().map(|n| n.to_string()).collect());
            p.egress = vec![rule(action, vec![all_ns(), peer], None)];
            let (_, problems) = compiled(&p);
            assert_eq!(problems.len(), 1, "{names:?}: {problems:?}");
            assert_eq!(problems[0].field, field, "{names:?}");
            assert!(problems[0].message.contains(says), "{names:?}: {}", problems[0].message);
        }
        // No named port with a domainNames peer.
        let mut p = policy("Admin", Some(1));
        p.egress =
            vec![rule("Accept", vec![CnpPeer::DomainNames(vec!["example.com".into()])], Some(vec![CnpProtocol::NamedPort("http".into())]))];
        let (c, problems) = compiled(&p);
        assert_eq!(problems[0].field, "spec.egress[0].protocols[0].destinationNamedPort");
        assert!(c.egress.is_empty());
        let mut p = policy("Admin", Some(1));
        p.ingress = vec![rule("Accept", vec![CnpPeer::DomainNames(vec!["example.com".into()])], None)];
        let (_, problems) = compiled(&p);
        assert!(problems[0].message.contains("ingress rules have no domainNames peer"), "{problems:?}");
    }

    #[test]
    fn a_rule_flock_cannot_read_matches_nothing_if_it_accepts_and_denies_all_otherwise() {
        let bad_peers: Vec<(CnpPeer, &str)> = vec![
            (CnpPeer::Invalid("unknown field \"services\"".into()), "spec.egress[0].to[1]"),
            (CnpPeer::Networks(vec!["198.18.0.0".into()]), "spec.egress[0].to[1].networks[0]"),
            (CnpPeer::Networks(vec!["::ffff:198.18.0.0/112".into()]), "spec.egress[0].to[1].networks[0]"),
            (
                CnpPeer::Pods(CnpPods {
                    namespace_selector: None,
                    pod_selector: LabelSelector { match_labels: [("a".to_string(), "b-".to_string())].into(), ..Default::default() },
                }),
                "spec.egress[0].to[1].pods.podSelector.matchLabels[a]",
            ),
        ];
        for (peer, field) in bad_peers {
            for action in ["Accept", "Deny", "Pass"] {
                let mut p = policy("Admin", Some(1));
                p.egress = vec![rule(action, vec![all_ns(), peer.clone()], None), rule("Accept", vec![all_ns()], None)];
                let (c, problems) = compiled(&p);
                assert_eq!(problems.len(), 1, "{action} {peer:?}: {problems:?}");
                assert_eq!(problems[0].field, field, "{action} {peer:?}");
                assert_eq!(problems[0].kind, PolicyKind::ClusterNetworkPolicy);
                if action == "Accept" {
                    assert_eq!(c.egress.len(), 1, "the bad Accept rule is dropped");
                    assert_eq!(c.egress[0].index, 1);
                } else {
                    assert_eq!((c.egress[0].action, &c.egress[0].matches), (Action::Deny, &RuleMatch::Everything), "{action}");
                    assert_eq!(c.egress.len(), 2, "the other rules stay");
                }
            }
        }
        let bad_protocols = [
            (CnpProtocol::Invalid("unknown field \"icmp\"".into()), "spec.ingress[0].protocols[0]"),
            (CnpProtocol::Tcp(CnpPort::Range { start: 81, end: 81 }), "spec.ingress[0].protocols[0].tcp.destinationPort"),
            (CnpProtocol::Udp(CnpPort::Number(70000)), "spec.ingress[0].protocols[0].udp.destinationPort"),
            (CnpProtocol::NamedPort("HTTP".into()), "spec.ingress[0].protocols[0].destinationNamedPort"),
        ];
        for (proto, field) in bad_protocols {
            let mut p = policy("Admin", Some(1));
            p.ingress = vec![rule("Deny", vec![all_ns()], Some(vec![proto.clone()]))];
            let (c, problems) = compiled(&p);
            assert_eq!(problems[0].field, field, "{proto:?}");
            assert_eq!(c.ingress[0].matches, RuleMatch::Everything);
        }
        // Ingress has no networks peer; an unknown action denies all.
        let mut p = policy("Admin", Some(1));
        p.ingress = vec![rule("Accept", vec![CnpPeer::Networks(vec!["198.18.0.0/15".into()])], None), rule("Allow", vec![all_ns()], None)];
        let (c, problems) = compiled(&p);
        assert_eq!(problems.len(), 2);
        assert_eq!(c.ingress.len(), 1);
        assert_eq!((c.ingress[0].index, c.ingress[0].action, &c.ingress[0].matches), (1, Action::Deny, &RuleMatch::Everything));
        // A named port next to a networks peer (the API's CEL rule).
        let mut p = policy("Admin", Some(1));
        p.egress = vec![rule(
            "Deny",
            vec![CnpPeer::Networks(vec!["198.18.0.0/15".into()])],
            Some(vec![CnpProtocol::NamedPort("serve-80-tcp".into())]),
        )];
        let (c, problems) = compiled(&p);
        assert_eq!(problems[0].field, "spec.egress[0].protocols[0].destinationNamedPort");
        assert_eq!(c.egress[0].matches, RuleMatch::Everything);
    }

    #[test]
    fn a_policy_that_cannot_be_placed_goes_first_accepts_nothing_and_passes_nothing() {
        for (tier, priority, field) in
            [("Sideways", Some(1), "spec.tier"), ("Admin", None, "spec.priority"), ("Baseline", Some(1001), "spec.priority")]
        {
            let mut p = policy(tier, priority);
            p.ingress = vec![rule("Accept", vec![all_ns()], None), rule("Pass", vec![all_ns()], None), rule("Deny", vec![all_ns()], None)];
            let (c, problems) = compiled(&p);
            assert_eq!(problems.len(), 1, "{problems:?}");
            assert_eq!(problems[0].field, field);
            assert_eq!((c.tier, c.priority), (Tier::Admin, None));
            let actions: Vec<(usize, Action)> = c.ingress.iter().map(|r| (r.index, r.action)).collect();
            assert_eq!(actions, [(1, Action::Deny), (2, Action::Deny)], "{tier} {priority:?}");
        }
        // An unreadable subject selects every pod, with the same reading of the rules.
        let mut p = policy("Baseline", Some(3));
        p.subject = CnpSubject::Invalid("exactly one of namespaces, pods must be set, none is".into());
        p.egress = vec![rule("Accept", vec![all_ns()], None), rule("Pass", vec![all_ns()], None)];
        let (c, problems) = compiled(&p);
        assert_eq!(problems[0].field, "spec.subject");
        assert_eq!((c.subject, c.tier, c.priority), (Subject::Everything, Tier::Baseline, Some(3)));
        assert_eq!(c.egress.iter().map(|r| r.action).collect::<Vec<_>>(), [Action::Deny]);
    }
}
