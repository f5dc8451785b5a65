//! ClusterNetworkPolicy (`policy.networking.k8s.io/v1alpha2`, the cluster administrator's
//! tiers) as written, and its conversion from the API's JSON.
//!
//! Like [`super::NetworkPolicy`], the content is kept as written and judged by the
//! translator — with one difference: the API's shape has "exactly one of" fields (a
//! subject, a peer, a protocol, a port), and an object that sets none or several, or a field
//! flock does not know (a newer API version's peer type), cannot be represented as one of
//! the known variants. Those become `Invalid` with the reason, so the translator can fail
//! closed exactly as the API asks ("For Accept rules, treat the rule as matching no traffic.
//! For Deny and Pass rules, treat the rule as a Deny all rule", v1alpha2
//! `ClusterNetworkPolicyIngressPeer`/`EgressPeer`) and report it by name — instead of the
//! whole object being dropped, which would open what it denies.
//!
//! The conversion reads JSON (`serde_json::Value`) rather than typed structs: typed
//! deserialization would either reject such an object outright or silently drop the field
//! it does not know.

use serde_json::{Map, Value};

use super::convert::{self, ConvertError};
use super::{LabelSelector, clip};

/// The API group, version and kind.
pub(crate) const GROUP: &str = "policy.networking.k8s.io";
pub(crate) const VERSION: &str = "v1alpha2";
pub(crate) const API_VERSION: &str = "policy.networking.k8s.io/v1alpha2";
pub(crate) const KIND: &str = "ClusterNetworkPolicy";
/// The resource's plural (its URL path segment).
pub(crate) const PLURAL: &str = "clusternetworkpolicies";

/// A ClusterNetworkPolicy (cluster-scoped), as written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct ClusterNetworkPolicy {
    pub name: String,
    /// Annotated `flock.dev/enforcement: audit`.
    pub audit: bool,
    /// `metadata.generation` and `metadata.uid` (set by the API server, `None` in
    /// manifests): what a status condition's `observedGeneration` refers to, and which
    /// object of that name it is on. Not used to enforce.
    pub generation: Option<i64>,
    pub uid: Option<String>,
    /// `spec.tier` as written: `Admin` or `Baseline` (anything else: reported, fail closed).
    pub tier: String,
    /// `spec.priority` as written (`None`: absent or not an integer).
    pub priority: Option<i64>,
    pub subject: CnpSubject,
    pub ingress: Vec<CnpRule>,
    pub egress: Vec<CnpRule>,
}

/// `spec.subject`: exactly one of `namespaces` or `pods`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum CnpSubject {
    /// Every pod of the namespaces matching the selector.
    Namespaces(LabelSelector),
    Pods(CnpPods),
    /// Not one of the above (none, several, or an unknown field): why.
    Invalid(String),
}

impl Default for CnpSubject {
    fn default() -> Self {
        Self::Invalid("missing".into())
    }
}

/// `pods`: a namespace selector (absent: every namespace) AND a pod selector.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CnpPods {
    pub(crate) namespace_selector: Option<LabelSelector>,
    pub(crate) pod_selector: LabelSelector,
}

/// One ingress or egress rule.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct CnpRule {
    pub name: Option<String>,
    /// `Accept`, `Deny` or `Pass` as written.
    pub action: String,
    /// `from` (ingress) or `to` (egress).
    pub peers: Vec<CnpPeer>,
    /// `None`: absent (every protocol and port, ICMP included).
    pub protocols: Option<Vec<CnpProtocol>>,
}

/// One entry of `from`/`to`: exactly one field.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum CnpPeer {
    /// Every pod of the matching namespaces.
    Namespaces(LabelSelector),
    Pods(CnpPods),
    /// CIDRs (egress only), pod addresses included.
    Networks(Vec<String>),
    /// The addresses of the matching Nodes (egress only).
    Nodes(LabelSelector),
    /// Domain names (egress only, Accept only).
    DomainNames(Vec<String>),
    /// Not one of the above: why.
    Invalid(String),
}

/// One entry of `protocols`: exactly one field.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum CnpProtocol {
    Tcp(CnpPort),
    Udp(CnpPort),
    Sctp(CnpPort),
    /// A container port name, resolved on the destination pod.
    NamedPort(String),
    Invalid(String),
}

/// `destinationPort`: a number or an inclusive range, as written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum CnpPort {
    Number(i64),
    Range { start: i64, end: i64 },
    Invalid(String),
}

/// The one field set in `obj`, among `known`; an `Err` naming what is wrong otherwise.
fn one_of<'a>(obj: &'a Value, known: &[&str]) -> Result<(&'a str, &'a Value), String> {
    let Some(map) = obj.as_object() else { return Err(format!("expected an object, found {}", kind_of(obj))) };
    let set: Vec<(&String, &Value)> = map.iter().filter(|(_, v)| !v.is_null()).collect();
    if let Some((k, _)) = set.iter().find(|(k, _)| !known.contains(&k.as_str())) {
        return Err(format!("unknown field {:?} (flock knows {})", clip(k), known.join(", ")));
    }
    match set.as_slice() {
        [(k, v)] => Ok((k.as_str(), v)),
        [] => Err(format!("exactly one of {} must be set, none is", known.join(", "))),
        many => {
            let names: Vec<&str> = many.iter().map(|(k, _)| k.as_str()).collect();
            Err(format!("exactly one of {} must be set, found {}", known.join(", "), names.join(", ")))
        }
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn selector(v: &Value) -> Result<LabelSelector, String> {
    let sel: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector =
        serde_json::from_value(v.clone()).map_err(|e| format!("not a label selector: {}", clip(&e.to_string())))?;
    if let Some(map) = v.as_object()
        && let Some(k) = map.keys().find(|k| *k != "matchLabels" && *k != "matchExpressions")
    {
        return Err(format!("unknown field {:?} in a label selector", clip(k)));
    }
    Ok(convert::label_selector(&sel))
}

fn pods(v: &Value) -> Result<CnpPods, String> {
    let Some(map) = v.as_object() else { return Err(format!("expected an object, found {}", kind_of(v))) };
    if let Some(k) = map.keys().find(|k| *k != "namespaceSelector" && *k != "podSelector") {
        return Err(format!("unknown field {:?} (flock knows namespaceSelector, podSelector)", clip(k)));
    }
    let pod_selector = match map.get("podSelector") {
        Some(p) if !p.is_null() => selector(p).map_err(|e| format!("podSelector: {e}"))?,
        _ => return Err("podSelector is required".into()),
    };
    let namespace_selector = match map.get("namespaceSelector") {
        Some(n) if !n.is_null() => Some(selector(n).map_err(|e| format!("namespaceSelector: {e}"))?),
        _ => None,
    };
    Ok(CnpPods { namespace_selector, pod_selector })
}

fn strings(v: &Value) -> Result<Vec<String>, String> {
    let Some(list) = v.as_array() else { return Err(format!("expected a list, found {}", kind_of(v))) };
    list.iter().map(|s| s.as_str().map(str::to_string).ok_or_else(|| format!("expected a string, found {}", kind_of(s)))).collect()
}

fn subject(v: Option<&Value>) -> CnpSubject {
    let Some(v) = v.filter(|v| !v.is_null()) else { return CnpSubject::Invalid("missing".into()) };
    let parsed = one_of(v, &["namespaces", "pods"]).and_then(|(k, v)| match k {
        "namespaces" => selector(v).map(CnpSubject::Namespaces).map_err(|e| format!("namespaces: {e}")),
        _ => pods(v).map(CnpSubject::Pods).map_err(|e| format!("pods: {e}")),
    });
    parsed.unwrap_or_else(CnpSubject::Invalid)
}

fn peer(v: &Value) -> CnpPeer {
    let parsed = one_of(v, &["namespaces", "pods", "networks", "nodes", "domainNames"]).and_then(|(k, v)| {
        let at = |e: String| format!("{k}: {e}");
        match k {
            "namespaces" => selector(v).map(CnpPeer::Namespaces).map_err(at),
            "pods" => pods(v).map(CnpPeer::Pods).map_err(at),
            "networks" => strings(v).map(CnpPeer::Networks).map_err(at),
            "nodes" => selector(v).map(CnpPeer::Nodes).map_err(at),
            _ => strings(v).map(CnpPeer::DomainNames).map_err(at),
        }
    });
    parsed.unwrap_or_else(CnpPeer::Invalid)
}

fn port(v: &Value) -> CnpPort {
    let Some(map) = v.as_object() else { return CnpPort::Invalid(format!("expected an object, found {}", kind_of(v))) };
    if let Some(k) = map.keys().find(|k| *k != "destinationPort") {
        return CnpPort::Invalid(format!("unknown field {:?} (flock knows destinationPort)", clip(k)));
    }
    let Some(dp) = map.get("destinationPort").filter(|d| !d.is_null()) else {
        return CnpPort::Invalid("destinationPort is required".into());
    };
    let parsed = one_of(dp, &["number", "range"]).and_then(|(k, v)| match k {
        "number" => v.as_i64().map(CnpPort::Number).ok_or_else(|| format!("number: expected an integer, found {}", kind_of(v))),
        _ => {
            let Some(r) = v.as_object() else { return Err(format!("range: expected an object, found {}", kind_of(v))) };
            if let Some(k) = r.keys().find(|k| *k != "start" && *k != "end") {
                return Err(format!("range: unknown field {:?}", clip(k)));
            }
            let get = |f: &str| r.get(f).and_then(Value::as_i64).ok_or_else(|| format!("range.{f}: an integer is required"));
            Ok(CnpPort::Range { start: get("start")?, end: get("end")? })
        }
    });
    parsed.unwrap_or_else(|e| CnpPort::Invalid(format!("destinationPort: {e}")))
}

fn protocol(v: &Value) -> CnpProtocol {
    let parsed = one_of(v, &["tcp", "udp", "sctp", "destinationNamedPort"]).and_then(|(k, v)| match k {
        "tcp" => Ok(CnpProtocol::Tcp(port(v))),
        "udp" => Ok(CnpProtocol::Udp(port(v))),
        "sctp" => Ok(CnpProtocol::Sctp(port(v))),
        _ => v
            .as_str()
            .map(|s| CnpProtocol::NamedPort(s.to_string()))
            .ok_or_else(|| format!("destinationNamedPort: expected a string, found {}", kind_of(v))),
    });
    parsed.unwrap_or_else(CnpProtocol::Invalid)
}

fn rule(v: &Value, peers_field: &str) -> CnpRule {
    let field = |f: &str| v.get(f).filter(|x| !x.is_null());
    let peers = match field(peers_field) {
        None => Vec::new(),
        Some(Value::Array(list)) => list.iter().map(peer).collect(),
        Some(other) => vec![CnpPeer::Invalid(format!("{peers_field}: expected a list, found {}", kind_of(other)))],
    };
    let protocols = match field("protocols") {
        None => None,
        Some(Value::Array(list)) => Some(list.iter().map(protocol).collect()),
        Some(other) => Some(vec![CnpProtocol::Invalid(format!("expected a list, found {}", kind_of(other)))]),
    };
    let mut action = field("action").and_then(Value::as_str).unwrap_or_default().to_string();
    // A rule field flock does not know could narrow or widen what the rule matches: the rule
    // cannot be read as written. Its action is kept; its peers become one invalid peer, so it
    // fails closed like a peer flock does not understand.
    let unknown: Vec<&String> = v
        .as_object()
        .map(|m| m.keys().filter(|k| !["name", "action", peers_field, "protocols"].contains(&k.as_str())).collect())
        .unwrap_or_default();
    let peers = if let Some(k) = unknown.first() {
        vec![CnpPeer::Invalid(format!("unknown rule field {:?} (flock knows name, action, {peers_field}, protocols)", clip(k)))]
    } else {
        peers
    };
    if !v.is_object() {
        action.clear();
    }
    CnpRule { name: field("name").and_then(Value::as_str).map(str::to_string), action, peers, protocols }
}

fn rules(spec: &Map<String, Value>, dir: &str, peers_field: &str) -> Vec<CnpRule> {
    match spec.get(dir) {
        Some(Value::Array(list)) => list.iter().map(|r| rule(r, peers_field)).collect(),
        // Not a list: one rule that cannot be read, which the translator fails closed for.
        Some(v) if !v.is_null() => {
            vec![CnpRule { peers: vec![CnpPeer::Invalid(format!("{dir}: expected a list, found {}", kind_of(v)))], ..Default::default() }]
        }
        _ => Vec::new(),
    }
}

/// Converts a ClusterNetworkPolicy object (its whole JSON: metadata and spec).
pub fn from_json(obj: &Value) -> Result<ClusterNetworkPolicy, ConvertError> {
    let err = |field: &str, message: &str| ConvertError { field: field.into(), message: message.into() };
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| err("metadata.name", "missing"))?
        .to_string();
    let empty = Map::new();
    let spec = match obj.get("spec") {
        Some(Value::Object(m)) => m,
        None | Some(Value::Null) => &empty,
        Some(_) => return Err(err("spec", "expected an object")),
    };
    Ok(ClusterNetworkPolicy {
        name,
        audit: obj.pointer("/metadata/annotations").and_then(|a| a.get(super::ENFORCEMENT_ANNOTATION)).and_then(Value::as_str)
            == Some("audit"),
        generation: obj.pointer("/metadata/generation").and_then(Value::as_i64),
        uid: obj.pointer("/metadata/uid").and_then(Value::as_str).map(str::to_string),
        tier: spec.get("tier").and_then(Value::as_str).unwrap_or_default().to_string(),
        priority: spec.get("priority").and_then(Value::as_i64),
        subject: subject(spec.get("subject")),
        ingress: rules(spec, "ingress", "from"),
        egress: rules(spec, "egress", "to"),
    })
}

/// The object as the API writes it (`from_json` reads it back to an equal value). What
/// flock could not read (`Invalid`) is written as a field no version of the API has, so it
/// reads back as unreadable again.
#[cfg(feature = "testkit")]
pub(crate) fn to_json(p: &ClusterNetworkPolicy) -> Value {
    use serde_json::json;
    let sel = |s: &LabelSelector| {
        let mut m = Map::new();
        if !s.match_labels.is_empty() {
            m.insert("matchLabels".into(), json!(s.match_labels));
        }
        if !s.match_expressions.is_empty() {
            let exprs: Vec<Value> =
                s.match_expressions.iter().map(|e| json!({"key": e.key, "operator": e.operator, "values": e.values})).collect();
            m.insert("matchExpressions".into(), Value::Array(exprs));
        }
        Value::Object(m)
    };
    let invalid = |why: &str| json!({"flockUnreadable": why});
    let pods = |p: &CnpPods| {
        let mut m = Map::new();
        if let Some(ns) = &p.namespace_selector {
            m.insert("namespaceSelector".into(), sel(ns));
        }
        m.insert("podSelector".into(), sel(&p.pod_selector));
        Value::Object(m)
    };
    let port = |p: &CnpPort| match p {
        CnpPort::Number(n) => json!({"destinationPort": {"number": n}}),
        CnpPort::Range { start, end } => json!({"destinationPort": {"range": {"start": start, "end": end}}}),
        CnpPort::Invalid(why) => json!({"destinationPort": invalid(why)}),
    };
    let rule = |r: &CnpRule, peers_field: &str| {
        let mut m = Map::new();
        if let Some(n) = &r.name {
            m.insert("name".into(), json!(n));
        }
        m.insert("action".into(), json!(r.action));
        let peers: Vec<Value> = r
            .peers
            .iter()
            .map(|x| match x {
                CnpPeer::Namespaces(s) => json!({"namespaces": sel(s)}),
                CnpPeer::Pods(p) => json!({"pods": pods(p)}),
                CnpPeer::Networks(n) => json!({"networks": n}),
                CnpPeer::Nodes(s) => json!({"nodes": sel(s)}),
                CnpPeer::DomainNames(d) => json!({"domainNames": d}),
                CnpPeer::Invalid(why) => invalid(why),
            })
            .collect();
        m.insert(peers_field.into(), Value::Array(peers));
        if let Some(protocols) = &r.protocols {
            let list: Vec<Value> = protocols
                .iter()
                .map(|x| match x {
                    CnpProtocol::Tcp(p) => json!({"tcp": port(p)}),
                    CnpProtocol::Udp(p) => json!({"udp": port(p)}),
                    CnpProtocol::Sctp(p) => json!({"sctp": port(p)}),
                    CnpProtocol::NamedPort(n) => json!({"destinationNamedPort": n}),
                    CnpProtocol::Invalid(why) => invalid(why),
                })
                .collect();
            m.insert("protocols".into(), Value::Array(list));
        }
        Value::Object(m)
    };
    let subject = match &p.subject {
        CnpSubject::Namespaces(s) => json!({"namespaces": sel(s)}),
        CnpSubject::Pods(x) => json!({"pods": pods(x)}),
        CnpSubject::Invalid(why) => invalid(why),
    };
    let mut spec = Map::new();
    spec.insert("tier".into(), json!(p.tier));
    if let Some(n) = p.priority {
        spec.insert("priority".into(), json!(n));
    }
    spec.insert("subject".into(), subject);
    if !p.ingress.is_empty() {
        spec.insert("ingress".into(), Value::Array(p.ingress.iter().map(|r| rule(r, "from")).collect()));
    }
    if !p.egress.is_empty() {
        spec.insert("egress".into(), Value::Array(p.egress.iter().map(|r| rule(r, "to")).collect()));
    }
    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(p.name));
    if let Some(g) = p.generation {
        metadata.insert("generation".into(), json!(g));
    }
    if let Some(u) = &p.uid {
        metadata.insert("uid".into(), json!(u));
    }
    if p.audit {
        metadata.insert("annotations".into(), json!({super::ENFORCEMENT_ANNOTATION: "audit"}));
    }
    json!({"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec})
}

/// The spec fields flock reads (others are reported as unknown by the manifest reader).
pub(crate) const SPEC_FIELDS: [&str; 5] = ["tier", "priority", "subject", "ingress", "egress"];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cnp(spec: Value) -> ClusterNetworkPolicy {
        from_json(&json!({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    #[test]
    fn reads_every_field_of_the_api() {
        let p = cnp(json!({
            "tier": "Admin", "priority": 10,
            "subject": {"pods": {"namespaceSelector": {"matchLabels": {"ns": "x"}}, "podSelector": {}}},
            "ingress": [{"name": "deny-y", "action": "Deny", "from": [{"namespaces": {"matchLabels": {"ns": "y"}}}],
                         "protocols": [{"tcp": {"destinationPort": {"number": 80}}}, {"udp": {"destinationPort": {"range": {"start": 80, "end": 81}}}},
                                       {"destinationNamedPort": "serve-80-sctp"}]}],
            "egress": [{"action": "Pass", "to": [{"networks": ["198.18.0.0/15"]}, {"nodes": {}}, {"domainNames": ["*.example.com"]},
                                                  {"pods": {"podSelector": {"matchLabels": {"pod": "a"}}}}]}]
        }));
        assert_eq!((p.tier.as_str(), p.priority), ("Admin", Some(10)));
        assert!(matches!(&p.subject, CnpSubject::Pods(CnpPods { namespace_selector: Some(_), .. })));
        let r = &p.ingress[0];
        assert_eq!((r.name.as_deref(), r.action.as_str()), (Some("deny-y"), "Deny"));
        assert_eq!(
            r.protocols.as_deref().unwrap(),
            [
                CnpProtocol::Tcp(CnpPort::Number(80)),
                CnpProtocol::Udp(CnpPort::Range { start: 80, end: 81 }),
                CnpProtocol::NamedPort("serve-80-sctp".into())
            ]
        );
        let e = &p.egress[0].peers;
        assert!(matches!(&e[0], CnpPeer::Networks(n) if n == &["198.18.0.0/15"]));
        assert!(matches!(&e[1], CnpPeer::Nodes(_)));
        assert!(matches!(&e[2], CnpPeer::DomainNames(_)));
        assert!(matches!(&e[3], CnpPeer::Pods(CnpPods { namespace_selector: None, .. })));
    }

    #[test]
    fn what_cannot_be_read_as_one_known_variant_is_invalid_with_the_reason() {
        let p = cnp(json!({
            "tier": "Admin", "priority": 1,
            "subject": {"namespaces": {}, "pods": {"podSelector": {}}},
            "egress": [{"action": "Deny", "to": [{}, {"networks": ["198.18.0.0/15"], "pods": {"podSelector": {}}}, {"services": {}},
                                                  {"pods": {"namespaceSelector": {}}}],
                        "protocols": [{}, {"tcp": {}}, {"tcp": {"destinationPort": {"number": 1, "range": {"start": 1, "end": 2}}}}, {"icmp": {}}]},
                       {"action": "Accept", "to": [{"namespaces": {}}], "ports": [80]}]
        }));
        let CnpSubject::Invalid(why) = &p.subject else { panic!("{:?}", p.subject) };
        assert!(why.contains("found namespaces, pods"), "{why}");
        let why: Vec<String> = p.egress[0]
            .peers
            .iter()
            .map(|x| match x {
                CnpPeer::Invalid(w) => w.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(why[0].contains("none is"), "{why:?}");
        assert!(why[1].contains("found networks, pods"), "{why:?}");
        assert!(why[2].contains("unknown field \"services\""), "{why:?}");
        assert!(why[3].contains("podSelector is required"), "{why:?}");
        let protos = p.egress[0].protocols.as_deref().unwrap();
        assert!(matches!(&protos[0], CnpProtocol::Invalid(w) if w.contains("none is")));
        assert!(matches!(&protos[1], CnpProtocol::Tcp(CnpPort::Invalid(w)) if w.contains("destinationPort is required")));
        assert!(matches!(&protos[2], CnpProtocol::Tcp(CnpPort::Invalid(w)) if w.contains("found number, range")));
        assert!(matches!(&protos[3], CnpProtocol::Invalid(w) if w.contains("unknown field \"icmp\"")));
        // An unknown rule field: the rule keeps its action, its peers are unreadable.
        assert_eq!(p.egress[1].action, "Accept");
        assert!(matches!(&p.egress[1].peers[..], [CnpPeer::Invalid(w)] if w.contains("unknown rule field \"ports\"")));
    }

    #[test]
    fn a_missing_name_is_a_conversion_error_and_a_missing_spec_reads_as_empty() {
        assert_eq!(from_json(&json!({"metadata": {}})).unwrap_err().field, "metadata.name");
        let p = from_json(&json!({"metadata": {"name": "p"}})).unwrap();
        assert_eq!((p.tier.as_str(), p.priority, p.generation), ("", None, None));
        assert!(matches!(p.subject, CnpSubject::Invalid(_)));
    }

    #[test]
    fn the_generation_and_uid_are_read_and_written_back() {
        let p = from_json(
            &json!({"metadata": {"name": "p", "generation": 3, "uid": "u-1"}, "spec": {"tier": "Admin", "subject": {"namespaces": {}}}}),
        )
        .unwrap();
        assert_eq!((p.generation, p.uid.as_deref()), (Some(3), Some("u-1")));
        assert_eq!(from_json(&to_json(&p)).unwrap(), p);
    }
}
