//! NetworkPolicy as written → a validated, canonical policy the translator can evaluate.
//!
//! Validation mirrors the API server's (`ValidateNetworkPolicySpec`): peers, ipBlocks,
//! ports, protocols, selectors and policyTypes. A policy that fails it is not trusted, but it
//! is not ignored either (that would open pods its author meant to close):
//! - an invalid rule (peer, ipBlock, port, protocol) allows nothing; the policy's other rules
//!   still apply;
//! - an invalid `podSelector` selects every pod of the namespace, isolating them in the
//!   policy's directions, and **none** of the policy's rules apply: flock cannot tell which
//!   pods the author meant to open, so it opens none (a widened selector with its allows
//!   kept would open every pod of the namespace);
//! - an unknown `policyTypes` entry isolates both directions (fail closed).
//!
//! Nothing unknown ever widens an allow: a rule is kept only when every peer and port in it
//! was understood. Every problem is reported with the policy's `namespace/name`, the field
//! and the reason.

use ipnet::IpNet;

use super::ir::{Direction, DomainDef, IpBlockDef, NsScope, PeerDef, PolicyKind, PolicyProblem};
use super::selector::Selector;
use crate::model::manifest::StrictValue;
use crate::model::{EGRESS_DOMAINS_ANNOTATION, NetworkPolicy, ObjectRef, PolicyPeer, PolicyPort, PolicyRule, PortRef, Protocol, clip};

/// One entry of a rule's `ports`, validated.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum PortSpec {
    /// Every port of one protocol (`protocol` without `port`).
    AllOf(Protocol),
    /// A port or an `endPort` range.
    Range(Protocol, u16, u16),
    /// A named container port, resolved on the destination pod.
    Named(Protocol, String),
}

/// A valid rule. `None` means "all" for peers and ports alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CompiledRule {
    pub(crate) index: usize,
    pub(crate) peers: Option<Vec<PeerDef>>,
    pub(crate) ports: Option<Vec<PortSpec>>,
}

/// An entry of the `flock.dev/egress-domains` annotation, validated: an egress allow to the
/// addresses learned for `domains`, on `ports` (`None`: every port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CompiledDomains {
    pub(crate) index: usize,
    pub(crate) domains: DomainDef,
    pub(crate) ports: Option<Vec<PortSpec>>,
}

/// A validated policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompiledPolicy {
    pub(crate) key: ObjectRef,
    /// Annotated for audit (`Options::audit_mode` decides whether that counts).
    pub(crate) audit: bool,
    pub(crate) selector: Selector,
    pub(crate) ingress: bool,
    pub(crate) egress: bool,
    /// Valid ingress rules (invalid ones are dropped: they allow nothing).
    pub(crate) ingress_rules: Vec<CompiledRule>,
    pub(crate) egress_rules: Vec<CompiledRule>,
    /// Valid entries of the `flock.dev/egress-domains` annotation (egress allows, when the
    /// policy restricts egress).
    pub(crate) egress_domains: Vec<CompiledDomains>,
}

impl CompiledPolicy {
    pub(crate) fn affects(&self, dir: Direction) -> bool {
        match dir {
            Direction::Ingress => self.ingress,
            Direction::Egress => self.egress,
        }
    }

    pub(crate) fn rules(&self, dir: Direction) -> &[CompiledRule] {
        match dir {
            Direction::Ingress => &self.ingress_rules,
            Direction::Egress => &self.egress_rules,
        }
    }
}

/// Validates and compiles `policy`, appending what is wrong with it to `problems`.
pub fn compile(policy: &NetworkPolicy, problems: &mut Vec<PolicyProblem>) -> CompiledPolicy {
    let key = policy.key();
    let mut report = |field: String, message: String| {
        problems.push(PolicyProblem { kind: PolicyKind::NetworkPolicy, policy: key.clone(), field, message })
    };

    let (selector, selector_valid) = match Selector::compile(&policy.pod_selector) {
        Ok(s) => (s, true),
        Err(e) => {
            report(
                format!("spec.podSelector.{}", e.field),
                format!("{}; isolating every pod in the namespace and allowing nothing (fail closed)", e.message),
            );
            (Selector::everything(), false)
        }
    };

    let (mut ingress, mut egress) = (false, false);
    if policy.policy_types.is_empty() {
        ingress = true;
        egress = !policy.egress.is_empty();
    } else {
        if policy.policy_types.len() > 2 {
            report(
                "spec.policyTypes".into(),
                format!("must have at most 2 items, has {}; each entry is read as written", policy.policy_types.len()),
            );
        }
        for (i, t) in policy.policy_types.iter().enumerate() {
            match t.as_str() {
                "Ingress" => ingress = true,
                "Egress" => egress = true,
                other => {
                    report(
                        format!("spec.policyTypes[{i}]"),
                        format!("{:?} is not Ingress or Egress; isolating both directions (fail closed)", clip(other)),
                    );
                    ingress = true;
                    egress = true;
                }
            }
        }
    }

    let mut compile_rules = |dir: Direction, rules: &[PolicyRule]| -> Vec<CompiledRule> {
        rules
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match compile_rule(&policy.namespace, dir, i, r) {
                Ok(rule) => Some(rule),
                Err((field, message)) => {
                    report(field, format!("{message}; this rule allows nothing"));
                    None
                }
            })
            .collect()
    };
    // The rules are validated (and their problems reported) either way.
    let mut ingress_rules = compile_rules(Direction::Ingress, &policy.ingress);
    let mut egress_rules = compile_rules(Direction::Egress, &policy.egress);
    let mut egress_domains = match &policy.egress_domains {
        Some(text) => compile_domains(text, &mut report),
        None => Vec::new(),
    };
    if !egress_domains.is_empty() && !egress {
        report(
            format!("metadata.annotations[{EGRESS_DOMAINS_ANNOTATION}]"),
            "the policy does not restrict egress (policyTypes): its domain allows change nothing".into(),
        );
    }
    if !selector_valid {
        ingress_rules.clear();
        egress_rules.clear();
        egress_domains.clear();
    }

    CompiledPolicy { key, audit: policy.audit, selector, ingress, egress, ingress_rules, egress_rules, egress_domains }
}

/// The annotation's entries, each validated on its own: an entry flock cannot read allows
/// nothing (reported); text that is not the annotation's JSON allows nothing at all.
fn compile_domains(text: &str, report: &mut impl FnMut(String, String)) -> Vec<CompiledDomains> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Entry {
        name: String,
        #[serde(default)]
        ports: Vec<Port>,
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Port {
        protocol: Option<String>,
        port: i64,
        end_port: Option<i64>,
    }
    let field = format!("metadata.annotations[{EGRESS_DOMAINS_ANNOTATION}]");
    // Each entry is read as a JSON value first (so one that is not an entry spoils only
    // itself), without serde_json's last-wins rule for duplicate keys: in
    // `{"name": "api.example.com", "name": "*.example.com"}` a reviewer reads the first name
    // and serde_json's `Value` keeps the second. An entry with a duplicate key, at any depth,
    // is not read at all.
    let entries: Vec<StrictValue> = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            report(field, format!("not a JSON list ({}); it allows nothing (fail closed)", clip(&e.to_string())));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (i, StrictValue { value, duplicate }) in entries.into_iter().enumerate() {
        let at = format!("{field}[{i}]");
        if let Some(path) = duplicate {
            report(format!("{at}{path}"), "duplicate key (which value is meant is ambiguous); this entry allows nothing".into());
            continue;
        }
        let entry: Entry = match serde_json::from_value(value) {
            Ok(e) => e,
            Err(e) => {
                report(at, format!("{}; this entry allows nothing", clip(&e.to_string())));
                continue;
            }
        };
        let pattern = match crate::dns::DomainPattern::parse(&entry.name) {
            Ok(p) => p,
            Err(m) => {
                report(format!("{at}.name"), format!("{:?}: {m}; this entry allows nothing", clip(&entry.name)));
                continue;
            }
        };
        let mut ports = Vec::with_capacity(entry.ports.len());
        let mut bad = None;
        for (j, p) in entry.ports.iter().enumerate() {
            let protocol = match p.protocol.as_deref() {
                None => Some(Protocol::Tcp),
                Some(s) => Protocol::parse(s),
            };
            let number = |n: i64| u16::try_from(n).ok().filter(|n| *n != 0);
            match (protocol, number(p.port), p.end_port.map(number)) {
                (None, _, _) => {
                    bad = Some((
                        format!("{at}.ports[{j}].protocol"),
                        format!("{:?} is not TCP, UDP or SCTP", p.protocol.as_deref().map(clip)),
                    ))
                }
                (_, None, _) => bad = Some((format!("{at}.ports[{j}].port"), format!("{} is not a port number (1-65535)", p.port))),
                (_, _, Some(None)) => bad = Some((format!("{at}.ports[{j}].endPort"), "not a port number (1-65535)".to_string())),
                (Some(proto), Some(s), Some(Some(e))) if e >= s => ports.push(PortSpec::Range(proto, s, e)),
                (Some(_), Some(_), Some(Some(e))) => {
                    bad = Some((format!("{at}.ports[{j}].endPort"), format!("{e} is below port {}", p.port)))
                }
                (Some(proto), Some(s), None) => ports.push(PortSpec::Range(proto, s, s)),
            }
            if bad.is_some() {
                break;
            }
        }
        if let Some((f, m)) = bad {
            report(f, format!("{m}; this entry allows nothing"));
            continue;
        }
        out.push(CompiledDomains { index: i, domains: DomainDef::new(vec![pattern]), ports: (!ports.is_empty()).then_some(ports) });
    }
    out
}

type FieldError = (String, String);

fn compile_rule(namespace: &str, dir: Direction, index: usize, rule: &PolicyRule) -> Result<CompiledRule, FieldError> {
    let base = format!("spec.{}[{index}]", dir.as_field());
    let peers_field = match dir {
        Direction::Ingress => "from",
        Direction::Egress => "to",
    };
    let peers = if rule.peers.is_empty() {
        None
    } else {
        let mut defs = Vec::with_capacity(rule.peers.len());
        for (j, peer) in rule.peers.iter().enumerate() {
            defs.push(compile_peer(namespace, peer).map_err(|(f, m)| (format!("{base}.{peers_field}[{j}]{f}"), m))?);
        }
        defs.sort();
        defs.dedup();
        Some(defs)
    };
    let ports = if rule.ports.is_empty() {
        None
    } else {
        let mut specs = Vec::with_capacity(rule.ports.len());
        for (j, port) in rule.ports.iter().enumerate() {
            specs.push(compile_port(port).map_err(|(f, m)| (format!("{base}.ports[{j}]{f}"), m))?);
        }
        Some(specs)
    };
    Ok(CompiledRule { index, peers, ports })
}

fn compile_peer(namespace: &str, peer: &PolicyPeer) -> Result<PeerDef, FieldError> {
    let count =
        usize::from(peer.pod_selector.is_some()) + usize::from(peer.namespace_selector.is_some()) + usize::from(peer.ip_block.is_some());
    if count == 0 {
        return Err((String::new(), "must specify a peer (podSelector, namespaceSelector or ipBlock)".into()));
    }
    if let Some(block) = &peer.ip_block {
        if count > 1 {
            return Err((String::new(), "may not specify both ipBlock and another peer".into()));
        }
        let cidr = parse_cidr(&block.cidr).map_err(|m| (".ipBlock.cidr".to_string(), m))?;
        let mut except = Vec::with_capacity(block.except.len());
        for (k, e) in block.except.iter().enumerate() {
            let field = format!(".ipBlock.except[{k}]");
            let net = parse_cidr(e).map_err(|m| (field.clone(), m))?;
            if !cidr.contains(&net) || net.prefix_len() <= cidr.prefix_len() {
                return Err((field, format!("{e} must be a strict subset of cidr {}", block.cidr)));
            }
            except.push(net);
        }
        except.sort();
        except.dedup();
        return Ok(PeerDef::Block(IpBlockDef { cidr, except }));
    }
    let namespaces = match &peer.namespace_selector {
        None => NsScope::Named(namespace.to_string()),
        Some(s) => NsScope::Matching(Selector::compile(s).map_err(|e| (format!(".namespaceSelector.{}", e.field), e.message))?),
    };
    let pods = match &peer.pod_selector {
        None => None,
        Some(s) => {
            let sel = Selector::compile(s).map_err(|e| (format!(".podSelector.{}", e.field), e.message))?;
            (!sel.is_everything()).then_some(sel)
        }
    };
    Ok(PeerDef::Pods { namespaces, pods })
}

/// Parses a CIDR as the API server does: an address and a prefix length are both required;
/// host bits are cleared. An IPv4-mapped IPv6 CIDR (`::ffff:198.18.0.0/112`) is rejected,
/// as Kubernetes' strict CIDR validation does: it names IPv4 addresses in IPv6 syntax, which
/// no IPv6 packet carries, so reading it as either family would be a guess.
pub(super) fn parse_cidr(s: &str) -> Result<IpNet, String> {
    let net = s.parse::<IpNet>().map_err(|_| format!("{:?} is not a valid CIDR", clip(s)))?;
    if let IpNet::V6(v6) = net
        && v6.addr().to_ipv4_mapped().is_some()
    {
        return Err(format!("{s:?} is an IPv4-mapped IPv6 CIDR; write the IPv4 CIDR instead"));
    }
    Ok(net.trunc())
}

fn compile_port(port: &PolicyPort) -> Result<PortSpec, FieldError> {
    let protocol = match port.protocol.as_deref() {
        None => Protocol::Tcp,
        Some(p) => Protocol::parse(p).ok_or_else(|| (".protocol".to_string(), format!("{:?} is not TCP, UDP or SCTP", clip(p))))?,
    };
    match &port.port {
        None => match port.end_port {
            Some(_) => Err((".endPort".into(), "may not be specified when port is not specified".into())),
            None => Ok(PortSpec::AllOf(protocol)),
        },
        Some(PortRef::Number(n)) => {
            let start = port_number(*n).ok_or_else(|| (".port".to_string(), format!("{n} is not a port number (1-65535)")))?;
            let end = match port.end_port {
                None => start,
                Some(e) => {
                    let end = port_number(e).ok_or_else(|| (".endPort".to_string(), format!("{e} is not a port number (1-65535)")))?;
                    if end < start {
                        return Err((".endPort".into(), format!("{e} must be greater than or equal to port {n}")));
                    }
                    end
                }
            };
            Ok(PortSpec::Range(protocol, start, end))
        }
        Some(PortRef::Name(name)) => {
            if port.end_port.is_some() {
                return Err((".endPort".into(), "may not be specified when port is non-numeric".into()));
            }
            validate_port_name(name).map_err(|m| (".port".to_string(), format!("{:?}: {m}", clip(name))))?;
            Ok(PortSpec::Named(protocol, name.clone()))
        }
    }
}

fn port_number(n: i32) -> Option<u16> {
    u16::try_from(n).ok().filter(|n| *n != 0)
}

/// An IANA service name, as the API server checks a named port (`IsValidPortName`).
pub(crate) fn validate_port_name(name: &str) -> Result<(), &'static str> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() > 15 {
        return Err("a port name must be 1 to 15 characters");
    }
    if !b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-') {
        return Err("a port name may contain only lowercase alphanumerics and '-'");
    }
    if !b.iter().any(u8::is_ascii_lowercase) {
        return Err("a port name must contain at least one letter");
    }
    if b[0] == b'-' || b[b.len() - 1] == b'-' || name.contains("--") {
        return Err("a port name may not begin or end with '-' or contain '--'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{IpBlock, LabelSelector, LabelSelectorRequirement};

    fn policy() -> NetworkPolicy {
        NetworkPolicy { namespace: "x".into(), name: "p".into(), ..Default::default() }
    }

    fn port(protocol: Option<&str>, port: Option<PortRef>, end_port: Option<i32>) -> PolicyPort {
        PolicyPort { protocol: protocol.map(str::to_string), port, end_port }
    }

    fn rule_with_port(p: PolicyPort) -> PolicyRule {
        PolicyRule { peers: vec![], ports: vec![p] }
    }

    fn problems_of(p: &NetworkPolicy) -> (CompiledPolicy, Vec<PolicyProblem>) {
        let mut problems = Vec::new();
        let c = compile(p, &mut problems);
        (c, problems)
    }

    #[test]
    fn policy_types_default_from_rules() {
        let mut p = policy();
        let (c, _) = problems_of(&p);
        assert!(c.ingress && !c.egress);
        p.egress = vec![PolicyRule::default()];
        let (c, _) = problems_of(&p);
        assert!(c.ingress && c.egress);
        p.policy_types = vec!["Egress".into()];
        let (c, probs) = problems_of(&p);
        assert!(!c.ingress && c.egress && probs.is_empty());
    }

    #[test]
    fn unknown_policy_type_fails_closed() {
        let mut p = policy();
        p.policy_types = vec!["Sideways".into()];
        let (c, probs) = problems_of(&p);
        assert!(c.ingress && c.egress);
        assert_eq!(probs[0].field, "spec.policyTypes[0]");
    }

    #[test]
    fn port_validation_matches_the_api_server() {
        let bad = [
            (port(Some("QUIC"), Some(PortRef::Number(80)), None), "spec.ingress[0].ports[0].protocol"),
            (port(Some("tcp"), Some(PortRef::Number(80)), None), "spec.ingress[0].ports[0].protocol"),
            (port(None, Some(PortRef::Number(0)), None), "spec.ingress[0].ports[0].port"),
            (port(None, Some(PortRef::Number(65536)), None), "spec.ingress[0].ports[0].port"),
            (port(None, Some(PortRef::Number(90)), Some(80)), "spec.ingress[0].ports[0].endPort"),
            (port(None, Some(PortRef::Number(90)), Some(70000)), "spec.ingress[0].ports[0].endPort"),
            (port(None, Some(PortRef::Name("http".into())), Some(90)), "spec.ingress[0].ports[0].endPort"),
            (port(None, None, Some(90)), "spec.ingress[0].ports[0].endPort"),
            (port(None, Some(PortRef::Name("HTTP".into())), None), "spec.ingress[0].ports[0].port"),
            (port(None, Some(PortRef::Name("a-very-long-port-name".into())), None), "spec.ingress[0].ports[0].port"),
            (port(None, Some(PortRef::Name("123".into())), None), "spec.ingress[0].ports[0].port"),
            (port(None, Some(PortRef::Name("a--b".into())), None), "spec.ingress[0].ports[0].port"),
        ];
        for (bad_port, field) in bad {
            let mut p = policy();
            p.ingress = vec![rule_with_port(bad_port.clone()), PolicyRule::default()];
            let (c, probs) = problems_of(&p);
            assert_eq!(probs.len(), 1, "{bad_port:?}");
            assert_eq!(probs[0].field, field, "{bad_port:?}");
            assert!(probs[0].message.ends_with("this rule allows nothing"));
            // The invalid rule is dropped, the valid one stays, the pod stays isolated.
            assert_eq!(c.ingress_rules.len(), 1);
            assert_eq!(c.ingress_rules[0].index, 1);
            assert!(c.ingress);
        }
        let good = [
            (port(None, Some(PortRef::Number(80)), None), PortSpec::Range(Protocol::Tcp, 80, 80)),
            (port(Some("UDP"), Some(PortRef::Number(80)), Some(90)), PortSpec::Range(Protocol::Udp, 80, 90)),
            (port(Some("SCTP"), None, None), PortSpec::AllOf(Protocol::Sctp)),
            (port(None, Some(PortRef::Name("serve-80-tcp".into())), None), PortSpec::Named(Protocol::Tcp, "serve-80-tcp".into())),
        ];
        for (good_port, want) in good {
            let mut p = policy();
            p.ingress = vec![rule_with_port(good_port)];
            let (c, probs) = problems_of(&p);
            assert!(probs.is_empty(), "{probs:?}");
            assert_eq!(c.ingress_rules[0].ports, Some(vec![want]));
        }
    }

    fn peer_rule(peer: PolicyPeer) -> PolicyRule {
        PolicyRule { peers: vec![peer], ports: vec![] }
    }

    fn block(cidr: &str, except: &[&str]) -> PolicyPeer {
        PolicyPeer {
            ip_block: Some(IpBlock { cidr: cidr.into(), except: except.iter().map(|s| s.to_string()).collect() }),
            ..Default::default()
        }
    }

    #[test]
    fn peer_validation_matches_the_api_server() {
        let sel = || Some(LabelSelector::default());
        let bad = [
            (PolicyPeer::default(), "spec.egress[0].to[0]"),
            (
                PolicyPeer { pod_selector: sel(), ip_block: block("198.18.0.0/15", &[]).ip_block, ..Default::default() },
                "spec.egress[0].to[0]",
            ),
            (block("198.18.0.0", &[]), "spec.egress[0].to[0].ipBlock.cidr"),
            (block("nope/8", &[]), "spec.egress[0].to[0].ipBlock.cidr"),
            (block("198.18.0.0/15", &["198.20.0.0/16"]), "spec.egress[0].to[0].ipBlock.except[0]"),
            (block("198.18.0.0/15", &["198.18.0.0/15"]), "spec.egress[0].to[0].ipBlock.except[0]"),
            (block("198.18.0.0/15", &["2001:db8::/64"]), "spec.egress[0].to[0].ipBlock.except[0]"),
            (
                PolicyPeer {
                    namespace_selector: Some(LabelSelector {
                        match_expressions: vec![LabelSelectorRequirement { key: "k".into(), operator: "Matches".into(), values: vec![] }],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                "spec.egress[0].to[0].namespaceSelector.matchExpressions[0].operator",
            ),
        ];
        for (peer, field) in bad {
            let mut p = policy();
            p.egress = vec![peer_rule(peer.clone())];
            let (c, probs) = problems_of(&p);
            assert_eq!(probs.len(), 1, "{peer:?}: {probs:?}");
            assert_eq!(probs[0].field, field, "{peer:?}");
            assert!(c.egress && c.egress_rules.is_empty());
        }
    }

    #[test]
    fn peers_are_canonical() {
        let mut p = policy();
        p.ingress = vec![PolicyRule {
            peers: vec![
                PolicyPeer { pod_selector: Some(LabelSelector::default()), ..Default::default() },
                block("198.18.1.7/24", &["198.18.1.128/25"]),
            ],
            ports: vec![],
        }];
        let (c, probs) = problems_of(&p);
        assert!(probs.is_empty());
        let peers = c.ingress_rules[0].peers.clone().unwrap();
        assert!(peers.contains(&PeerDef::Pods { namespaces: NsScope::Named("x".into()), pods: None }));
        assert!(peers.contains(&PeerDef::Block(IpBlockDef {
            cidr: "198.18.1.0/24".parse().unwrap(),
            except: vec!["198.18.1.128/25".parse().unwrap()]
        })));
    }

    #[test]
    fn invalid_pod_selector_isolates_the_whole_namespace_and_allows_nothing() {
        let bad_selectors = [
            (
                LabelSelector {
                    match_expressions: vec![LabelSelectorRequirement { key: "k".into(), operator: "In".into(), values: vec![] }],
                    ..Default::default()
                },
                "spec.podSelector.matchExpressions[0].values",
            ),
            (
                LabelSelector {
                    match_expressions: vec![LabelSelectorRequirement {
                        key: "app".into(),
                        operator: "Matches".into(),
                        values: vec!["web".into()],
                    }],
                    ..Default::default()
                },
                "spec.podSelector.matchExpressions[0].operator",
            ),
            (
                LabelSelector { match_labels: [("app".to_string(), "web-".to_string())].into(), ..Default::default() },
                "spec.podSelector.matchLabels[app]",
            ),
        ];
        for (sel, field) in bad_selectors {
            let mut p = policy();
            p.pod_selector = sel;
            // Rules that would open everything, both directions, plus one invalid rule.
            p.ingress = vec![PolicyRule::default(), rule_with_port(port(Some("QUIC"), None, None))];
            p.egress = vec![PolicyRule::default()];
            let (c, probs) = problems_of(&p);
            assert!(c.selector.is_everything(), "{field}");
            assert!(c.ingress && c.egress, "{field}: isolated in the policy's directions");
            assert!(c.ingress_rules.is_empty() && c.egress_rules.is_empty(), "{field}: no rule of the policy applies");
            assert_eq!(probs[0].field, field);
            assert!(probs[0].message.contains("allowing nothing"), "{}", probs[0].message);
            // The bad rule is still reported on its own.
            assert!(probs.iter().any(|pr| pr.field == "spec.ingress[1].ports[0].protocol"), "{probs:?}");
        }
    }

    #[test]
    fn the_egress_domains_annotation_adds_egress_allows_and_fails_closed_per_entry() {
        let mut p = policy();
        p.policy_types = vec!["Egress".into()];
        p.egress_domains = Some(
            r#"[{"name": "GitHub.com.", "ports": [{"port": 443}, {"protocol": "UDP", "port": 5000, "endPort": 5010}]},
                {"name": "*.pypi.org"},
                {"name": "*.*.bad"},
                {"name": "ok.example", "ports": [{"protocol": "ICMP", "port": 1}]},
                {"name": "ok.example", "ports": [{"port": 90, "endPort": 80}]},
                {"name": "ok.example", "extra": 1}]"#
                .into(),
        );
        let (c, probs) = problems_of(&p);
        let got: Vec<(usize, String, Option<Vec<PortSpec>>)> =
            c.egress_domains.iter().map(|d| (d.index, d.domains.short(), d.ports.clone())).collect();
        assert_eq!(
            got,
            vec![
                (
                    0,
                    "github.com".to_string(),
                    Some(vec![PortSpec::Range(Protocol::Tcp, 443, 443), PortSpec::Range(Protocol::Udp, 5000, 5010)])
                ),
                (1, "*.pypi.org".to_string(), None),
            ]
        );
        let fields: Vec<&str> = probs.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "metadata.annotations[flock.dev/egress-domains][2].name",
                "metadata.annotations[flock.dev/egress-domains][3].ports[0].protocol",
                "metadata.annotations[flock.dev/egress-domains][4].ports[0].endPort",
                "metadata.annotations[flock.dev/egress-domains][5]",
            ]
        );
        assert!(probs.iter().all(|p| p.message.ends_with("this entry allows nothing")), "{probs:?}");
        // Not JSON: nothing from it.
        p.egress_domains = Some("github.com:443".into());
        let (c, probs) = problems_of(&p);
        assert!(c.egress_domains.is_empty());
        assert!(probs[0].message.contains("allows nothing"), "{probs:?}");
        // A policy that does not restrict egress: reported, changes nothing.
        p.policy_types = vec!["Ingress".into()];
        p.egress_domains = Some(r#"[{"name": "github.com"}]"#.into());
        let (_, probs) = problems_of(&p);
        assert!(probs[0].message.contains("does not restrict egress"), "{probs:?}");
    }

    /// serde_json's `Value` keeps the last of a duplicated key: a reviewer reading the first
    /// `name` would approve a wildcard. An entry with a duplicate key, at any depth, allows
    /// nothing and is reported at the key; the other entries are unaffected.
    #[test]
    fn egress_domains_entries_with_duplicate_keys_allow_nothing() {
        let mut p = policy();
        p.policy_types = vec!["Egress".into()];
        p.egress_domains = Some(
            r#"[{"name": "api.example.com", "name": "*.example.com"},
                {"name": "ok.example", "ports": [{"port": 443, "port": 1, "protocol": "TCP"}]},
                {"name": "ok.example", "ports": [{"port": 443}, {"protocol": "UDP", "port": 53, "protocol": "TCP"}]},
                {"name": "github.com", "ports": [{"port": 443}]}]"#
                .into(),
        );
        let (c, probs) = problems_of(&p);
        let got: Vec<(usize, String)> = c.egress_domains.iter().map(|d| (d.index, d.domains.short())).collect();
        assert_eq!(got, [(3, "github.com".to_string())], "{probs:?}");
        let fields: Vec<&str> = probs.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "metadata.annotations[flock.dev/egress-domains][0].name",
                "metadata.annotations[flock.dev/egress-domains][1].ports[0].port",
                "metadata.annotations[flock.dev/egress-domains][2].ports[1].protocol",
            ]
        );
        assert!(probs.iter().all(|p| p.message.contains("duplicate key") && p.message.ends_with("this entry allows nothing")), "{probs:?}");
        // The same entries without the duplicates are read (the check is not a parse failure).
        p.egress_domains =
            Some(r#"[{"name": "api.example.com"}, {"name": "ok.example", "ports": [{"port": 443, "protocol": "TCP"}]}]"#.into());
        let (c, probs) = problems_of(&p);
        assert!(probs.is_empty(), "{probs:?}");
        assert_eq!(c.egress_domains.len(), 2);
        // A duplicate key nested anywhere else in an entry (an unknown field's value) is one
        // too, and a huge key is named clipped.
        let key = "k".repeat(1 << 20);
        p.egress_domains = Some(format!(r#"[{{"name": "a.example", "x": [{{"{key}": 1, "{key}": 2}}]}}]"#));
        let (c, probs) = problems_of(&p);
        assert!(c.egress_domains.is_empty());
        assert_eq!(probs.len(), 1, "{probs:?}");
        assert!(probs[0].field.starts_with("metadata.annotations[flock.dev/egress-domains][0].x[0].kkk"), "{}", &probs[0].field[..80]);
        assert!(probs[0].field.ends_with("…(1048576 bytes)") && probs[0].field.len() < 400, "{}", probs[0].field.len());
    }

    /// Values of the annotation are quoted clipped in problems.
    #[test]
    fn egress_domains_problems_quote_values_clipped() {
        let mut p = policy();
        p.policy_types = vec!["Egress".into()];
        let huge = "a".repeat(10 << 20);
        p.egress_domains = Some(format!(
            r#"[{{"name": "{huge}"}}, {{"name": "a.example", "ports": [{{"protocol": "{huge}", "port": 1}}]}}, {{"name": "a.example", "{huge}": 1}}]"#
        ));
        let (c, probs) = problems_of(&p);
        assert!(c.egress_domains.is_empty());
        assert_eq!(probs.len(), 3, "{probs:?}");
        for pr in &probs {
            assert!(pr.to_string().len() < 1024, "{}", &pr.to_string()[..200]);
            assert!(pr.to_string().starts_with("NetworkPolicy x/p: metadata.annotations[flock.dev/egress-domains]["), "{pr}");
        }
        p.egress_domains = Some(format!(r#"{{"{huge}": 1}}"#));
        let (_, probs) = problems_of(&p);
        assert!(probs[0].message.len() < 1024 && probs[0].message.contains("allows nothing"), "{}", &probs[0].message[..200]);
    }

    #[test]
    fn ipv4_mapped_ipv6_blocks_are_invalid() {
        for cidr in ["::ffff:198.18.0.0/112", "::ffff:198.18.0.0/96", "::ffff:c612:0/120"] {
            let mut p = policy();
            p.egress = vec![peer_rule(block(cidr, &[]))];
            let (c, probs) = problems_of(&p);
            assert_eq!(probs.len(), 1, "{cidr}");
            assert_eq!(probs[0].field, "spec.egress[0].to[0].ipBlock.cidr");
            assert!(c.egress && c.egress_rules.is_empty());
        }
        // An except inside an IPv6 block that is written IPv4-mapped is invalid too.
        let mut p = policy();
        p.egress = vec![peer_rule(block("::/0", &["::ffff:198.18.0.0/112"]))];
        let (c, probs) = problems_of(&p);
        assert_eq!(probs[0].field, "spec.egress[0].to[0].ipBlock.except[0]");
        assert!(c.egress_rules.is_empty());
        // Ordinary IPv6 blocks are fine.
        let mut p = policy();
        p.egress = vec![peer_rule(block("2001:db8::/32", &["2001:db8:1::/48"]))];
        assert!(problems_of(&p).1.is_empty());
    }
}
