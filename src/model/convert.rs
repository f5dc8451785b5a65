//! Kubernetes API objects (k8s-openapi types) → snapshot types.
//!
//! The one conversion shared by every source (manifest files, the informers). It keeps only
//! the fields of [`super`]'s types and rejects what the API server itself would never store
//! (an unparsable pod IP, a container port out of range), naming the field. NetworkPolicy
//! content is *not* judged here: it is copied as written and the translator validates it.

use std::net::IpAddr;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1 as net;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{
    ContainerPort, LabelSelector, LabelSelectorRequirement, Namespace, NetworkPolicy, Node, Pod, PodPhase, PolicyPeer, PolicyPort,
    PolicyRule, PortRef, Protocol, clip, derived_uid,
};

/// Label the API server puts on every namespace (immutable, equal to its name).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Namespace of a namespaced object that does not say (kubectl's default).
pub(crate) const DEFAULT_NAMESPACE: &str = "default";

/// A field the API server would not have stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConvertError {
    /// Path of the field, e.g. `status.podIPs[1].ip`.
    pub(crate) field: String,
    pub(crate) message: String,
}

impl ConvertError {
    pub(crate) fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: field.into(), message: message.into() }
    }
}

fn err(field: impl Into<String>, message: impl Into<String>) -> ConvertError {
    ConvertError::new(field, message)
}

fn name_of(metadata: &meta::ObjectMeta) -> Result<String, ConvertError> {
    match metadata.name.as_deref() {
        Some(n) if !n.is_empty() => Ok(n.to_string()),
        _ => Err(err("metadata.name", "missing")),
    }
}

fn namespace_of(metadata: &meta::ObjectMeta) -> String {
    match metadata.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => ns.to_string(),
        _ => DEFAULT_NAMESPACE.to_string(),
    }
}

/// A Namespace. The `kubernetes.io/metadata.name` label is set as the API server sets it.
pub(crate) fn namespace(ns: &core::Namespace) -> Result<Namespace, ConvertError> {
    let name = name_of(&ns.metadata)?;
    let mut labels: super::Labels = ns.metadata.labels.iter().flatten().collect();
    labels.insert(NAMESPACE_NAME_LABEL, &name);
    let audit = annotation(&ns.metadata, super::ENFORCEMENT_ANNOTATION) == Some("audit");
    let log_allowed = annotation(&ns.metadata, super::LOG_ALLOWED_ANNOTATION) == Some("true");
    Ok(Namespace { name, labels, audit, log_allowed })
}

fn annotation<'a>(metadata: &'a meta::ObjectMeta, key: &str) -> Option<&'a str> {
    metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// A namespace known only by name (referenced by a pod or policy, never declared).
pub fn implicit_namespace(name: &str) -> Namespace {
    let mut labels = super::Labels::new();
    labels.insert(NAMESPACE_NAME_LABEL, name);
    Namespace { name: name.to_string(), labels, ..Namespace::default() }
}

/// A Pod. A pod without `metadata.uid` (a manifest) gets [`derived_uid`].
pub(crate) fn pod(pod: &core::Pod) -> Result<Pod, ConvertError> {
    let name = name_of(&pod.metadata)?;
    let namespace = namespace_of(&pod.metadata);
    let uid = match pod.metadata.uid.as_deref() {
        Some(u) if !u.is_empty() => u.to_string(),
        _ => derived_uid(&namespace, &name),
    };
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();

    let mut ips: Vec<IpAddr> = Vec::new();
    if let Some(status) = status {
        let listed = status.pod_ips.as_deref().unwrap_or_default();
        for (i, ip) in listed.iter().enumerate() {
            let addr: IpAddr =
                ip.ip.parse().map_err(|_| err(format!("status.podIPs[{i}].ip"), format!("{:?} is not an IP address", clip(&ip.ip))))?;
            if !ips.contains(&addr) {
                ips.push(addr);
            }
        }
        if let Some(ip) = status.pod_ip.as_deref().filter(|s| !s.is_empty()) {
            let addr: IpAddr = ip.parse().map_err(|_| err("status.podIP", format!("{:?} is not an IP address", clip(ip))))?;
            if !ips.contains(&addr) {
                ips.insert(0, addr);
            }
        }
    }
    if ips.iter().filter(|ip| ip.is_ipv4()).count() > 1 || ips.iter().filter(|ip| ip.is_ipv6()).count() > 1 {
        return Err(err("status.podIPs", "at most one address per family"));
    }

    let mut ports = Vec::new();
    if let Some(spec) = spec {
        for (c, container) in spec.containers.iter().enumerate() {
            for (p, port) in container.ports.iter().flatten().enumerate() {
                let field = format!("spec.containers[{c}].ports[{p}]");
                let number = u16::try_from(port.container_port).ok().filter(|n| *n != 0).ok_or_else(|| {
                    err(format!("{field}.containerPort"), format!("{} is not a port number (1-65535)", port.container_port))
                })?;
                let protocol = match port.protocol.as_deref() {
                    None | Some("") => Protocol::Tcp,
                    Some(p) => Protocol::parse(p)
                        .ok_or_else(|| err(format!("{field}.protocol"), format!("{:?} is not TCP, UDP or SCTP", clip(p))))?,
                };
                ports.push(ContainerPort {
                    name: port.name.as_deref().filter(|n| !n.is_empty()).map(super::labels::intern),
                    port: number,
                    protocol,
                });
            }
        }
    }

    Ok(Pod {
        namespace,
        name,
        uid,
        labels: pod.metadata.labels.iter().flatten().collect(),
        node: spec.and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty()),
        phase: status.and_then(|s| s.phase.as_deref()).map(PodPhase::parse).unwrap_or_default(),
        ips,
        host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
        ports,
        created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second()),
        unpublished: false,
    })
}

/// A Node: pod CIDRs and InternalIPs.
pub(crate) fn node(node: &core::Node) -> Result<Node, ConvertError> {
    let name = name_of(&node.metadata)?;
    let mut pod_cidrs = Vec::new();
    if let Some(spec) = &node.spec {
        for (i, cidr) in spec.pod_cidrs.iter().flatten().enumerate() {
            let net =
                cidr.parse::<ipnet::IpNet>().map_err(|_| err(format!("spec.podCIDRs[{i}]"), format!("{:?} is not a CIDR", clip(cidr))))?;
            if !pod_cidrs.contains(&net.trunc()) {
                pod_cidrs.push(net.trunc());
            }
        }
        if let Some(cidr) = spec.pod_cidr.as_deref().filter(|s| !s.is_empty()) {
            let net = cidr.parse::<ipnet::IpNet>().map_err(|_| err("spec.podCIDR", format!("{:?} is not a CIDR", clip(cidr))))?;
            if !pod_cidrs.contains(&net.trunc()) {
                pod_cidrs.insert(0, net.trunc());
            }
        }
    }
    let (mut internal_ips, mut addresses) = (Vec::new(), Vec::new());
    if let Some(status) = &node.status {
        for (i, addr) in status.addresses.iter().flatten().enumerate() {
            // Hostname and DNS entries are names; only the IP-typed ones must parse.
            let parsed = addr.address.parse::<IpAddr>();
            match addr.type_.as_str() {
                "InternalIP" => {
                    let ip = parsed.map_err(|_| {
                        err(format!("status.addresses[{i}].address"), format!("{:?} is not an IP address", clip(&addr.address)))
                    })?;
                    internal_ips.push(ip);
                    if !addresses.contains(&ip) {
                        addresses.push(ip);
                    }
                }
                // Only matched by `nodes` peers; an address that is not one cannot be matched.
                "ExternalIP" => {
                    if let Ok(ip) = parsed
                        && !addresses.contains(&ip)
                    {
                        addresses.push(ip);
                    }
                }
                _ => {}
            }
        }
    }
    let labels = node.metadata.labels.iter().flatten().collect();
    Ok(Node { name, pod_cidrs, internal_ips, addresses, labels })
}

/// A NetworkPolicy, copied as written (see the module doc).
pub fn network_policy(np: &net::NetworkPolicy) -> Result<NetworkPolicy, ConvertError> {
    let name = name_of(&np.metadata)?;
    let namespace = namespace_of(&np.metadata);
    let spec = np.spec.clone().unwrap_or_default();
    // A sandboxed run's policy (flock-controller labels it) is never audited.
    let run_policy = np.metadata.labels.as_ref().is_some_and(|l| l.contains_key(crate::model::RUN_LABEL));
    Ok(NetworkPolicy {
        audit: annotation(&np.metadata, super::ENFORCEMENT_ANNOTATION) == Some("audit") && !run_policy,
        namespace,
        name,
        pod_selector: spec.pod_selector.as_ref().map(label_selector).unwrap_or_default(),
        policy_types: spec.policy_types.unwrap_or_default(),
        ingress: spec.ingress.unwrap_or_default().iter().map(|r| rule(r.from.as_deref(), r.ports.as_deref())).collect(),
        egress: spec.egress.unwrap_or_default().iter().map(|r| rule(r.to.as_deref(), r.ports.as_deref())).collect(),
        generation: np.metadata.generation,
        egress_domains: annotation(&np.metadata, super::EGRESS_DOMAINS_ANNOTATION).map(str::to_string),
    })
}

fn rule(peers: Option<&[net::NetworkPolicyPeer]>, ports: Option<&[net::NetworkPolicyPort]>) -> PolicyRule {
    PolicyRule {
        peers: peers
            .unwrap_or_default()
            .iter()
            .map(|p| PolicyPeer {
                pod_selector: p.pod_selector.as_ref().map(label_selector),
                namespace_selector: p.namespace_selector.as_ref().map(label_selector),
                ip_block: p
                    .ip_block
                    .as_ref()
                    .map(|b| super::IpBlock { cidr: b.cidr.clone(), except: b.except.clone().unwrap_or_default() }),
            })
            .collect(),
        ports: ports
            .unwrap_or_default()
            .iter()
            .map(|p| PolicyPort {
                protocol: p.protocol.clone(),
                port: p.port.as_ref().map(|port| match port {
                    IntOrString::Int(n) => PortRef::Number(*n),
                    IntOrString::String(s) => PortRef::Name(s.clone()),
                }),
                end_port: p.end_port,
            })
            .collect(),
    }
}

/// A label selector as written.
pub(crate) fn label_selector(sel: &meta::LabelSelector) -> LabelSelector {
    LabelSelector {
        match_labels: sel.match_labels.clone().unwrap_or_default(),
        match_expressions: sel
            .match_expressions
            .iter()
            .flatten()
            .map(|e| LabelSelectorRequirement {
                key: e.key.clone(),
                operator: e.operator.clone(),
                values: e.values.clone().unwrap_or_default(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_from(yaml: &str) -> Result<Pod, ConvertError> {
        let p: core::Pod = serde_saphyr::from_str(yaml).unwrap();
        pod(&p)
    }

    #[test]
    fn pod_fields_and_defaults() {
        let p = pod_from(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a, labels: {pod: a}}\n\
             spec: {nodeName: n1, containers: [{name: c, ports: [{containerPort: 80, name: http}, {containerPort: 53, protocol: UDP}]}]}\n\
             status: {podIP: 198.18.1.1, podIPs: [{ip: 198.18.1.1}, {ip: '2001:db8::1'}]}",
        )
        .unwrap();
        assert_eq!(p.namespace, "default");
        assert_eq!(p.uid, derived_uid("default", "a"));
        assert_eq!(p.node.as_deref(), Some("n1"));
        assert_eq!(p.phase, PodPhase::Pending);
        assert_eq!(p.ips.len(), 2);
        assert_eq!(p.ports[0], ContainerPort { name: Some("http".into()), port: 80, protocol: Protocol::Tcp });
        assert_eq!(p.ports[1].protocol, Protocol::Udp);
    }

    #[test]
    fn bad_pod_fields_are_named() {
        let e = pod_from("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nstatus: {podIPs: [{ip: nope}]}").unwrap_err();
        assert_eq!(e.field, "status.podIPs[0].ip");
        let e =
            pod_from("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, ports: [{containerPort: 70000}]}]}")
                .unwrap_err();
        assert_eq!(e.field, "spec.containers[0].ports[0].containerPort");
        let e = pod_from(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, ports: [{containerPort: 7, protocol: tcp}]}]}",
        )
        .unwrap_err();
        assert_eq!(e.field, "spec.containers[0].ports[0].protocol");
        let e = pod_from("apiVersion: v1\nkind: Pod\nmetadata: {namespace: x}").unwrap_err();
        assert_eq!(e.field, "metadata.name");
    }

    #[test]
    fn namespace_gets_its_name_label() {
        let ns: core::Namespace = serde_saphyr::from_str("apiVersion: v1\nkind: Namespace\nmetadata: {name: x, labels: {a: b}}").unwrap();
        let ns = namespace(&ns).unwrap();
        assert_eq!(ns.labels.get(NAMESPACE_NAME_LABEL), Some("x"));
        assert_eq!(ns.labels.get("a"), Some("b"));
    }

    #[test]
    fn policy_is_copied_as_written() {
        let np: net::NetworkPolicy = serde_saphyr::from_str(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: x}\n\
             spec:\n  ingress:\n  - from: [{ipBlock: {cidr: bogus}}]\n    ports: [{port: http, protocol: QUIC, endPort: 9}]\n",
        )
        .unwrap();
        let p = network_policy(&np).unwrap();
        assert_eq!(p.pod_selector, LabelSelector::default());
        assert!(p.policy_types.is_empty());
        assert_eq!(p.ingress[0].peers[0].ip_block.as_ref().unwrap().cidr, "bogus");
        assert_eq!(p.ingress[0].ports[0].protocol.as_deref(), Some("QUIC"));
        assert_eq!(p.ingress[0].ports[0].port, Some(PortRef::Name("http".into())));
    }

    #[test]
    fn policy_keeps_its_generation() {
        let np: net::NetworkPolicy = serde_saphyr::from_str(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: x, generation: 4}\nspec: {}\n",
        )
        .unwrap();
        assert_eq!(network_policy(&np).unwrap().generation, Some(4));
    }

    #[test]
    fn node_cidrs_and_internal_ips() {
        let n: core::Node = serde_saphyr::from_str(
            "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nspec: {podCIDR: 198.18.1.0/24, podCIDRs: [198.18.1.0/24, '2001:db8:1::/64']}\n\
             status: {addresses: [{type: InternalIP, address: 198.18.0.1}, {type: Hostname, address: n1}]}",
        )
        .unwrap();
        let n = node(&n).unwrap();
        assert_eq!(n.pod_cidrs.len(), 2);
        assert_eq!(n.internal_ips, vec!["198.18.0.1".parse::<IpAddr>().unwrap()]);
    }
}
