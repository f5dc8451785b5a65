//! A logged packet turned into a denial an operator can read: which pod's policy dropped it
//! and in which direction, the two ends by pod name where they are pods, the protocol and
//! port, and what denies in that direction (the NetworkPolicies isolating the pod, the
//! ClusterNetworkPolicies with Deny rules selecting it, or flock's own isolation) — or that
//! the packet came with a spoofed source or went to a pod flock does not know.
//!
//! Pure: the node's endpoints as last translated ([`Endpoints`]) and the cluster snapshot
//! name what the record's addresses and prefix refer to.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;

use super::Logged;
use crate::model::{ObjectRef, Snapshot};
use crate::render::log::LogPrefix;
use crate::translate::{Action, Direction, DirectionPolicy, NodePolicy};

/// What denies each direction of each endpoint of the node, by host interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Endpoints {
    by_interface: BTreeMap<String, EndpointView>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct EndpointView {
    pod: ObjectRef,
    ingress: Vec<String>,
    egress: Vec<String>,
    /// The same, with the audited policies (audit mode).
    audit_ingress: Vec<String>,
    audit_egress: Vec<String>,
}

impl Endpoints {
    /// From the node's translation.
    pub(crate) fn of(np: &NodePolicy) -> Self {
        let by_interface = np
            .endpoints
            .iter()
            .map(|e| {
                let audit = |d: &DirectionPolicy| d.audit.as_deref().map(deniers).unwrap_or_default();
                let view = EndpointView {
                    pod: e.pod.clone(),
                    ingress: deniers(&e.ingress),
                    egress: deniers(&e.egress),
                    audit_ingress: audit(&e.ingress),
                    audit_egress: audit(&e.egress),
                };
                (e.interface.clone(), view)
            })
            .collect();
        Self { by_interface }
    }
}

/// What may deny in one direction: what isolates it, then each ClusterNetworkPolicy with a
/// Deny rule there.
fn deniers(d: &DirectionPolicy) -> Vec<String> {
    let mut out: Vec<String> = d.isolated_by.iter().map(ToString::to_string).collect();
    for g in d.admin.iter().chain(&d.baseline) {
        for p in &g.policies {
            let name = format!("clusternetworkpolicy {}", p.name);
            if p.rules.iter().any(|r| r.action == Action::Deny) && !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

/// Why a packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// The policy of the pod in `direction`.
    Policy,
    /// From a pod interface, with a source address that is not its pod's.
    SpoofedSource,
    /// To a pod interface flock has no policy for (yet).
    UnknownPod,
    /// A packet of a connection a policy change revoked (dropped; TCP: the sender got a
    /// reset).
    Revoked,
    /// Not a denial: a new connection the pod's policy allowed, logged because its namespace
    /// asks for it (`flock.dev/log-allowed`).
    Allowed,
}

impl Reason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Policy => "policy",
            Self::SpoofedSource => "spoofed-source",
            Self::UnknownPod => "unknown-pod",
            Self::Revoked => "revoked",
            Self::Allowed => "allowed",
        }
    }
}

/// One denial, as logged and counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Denial {
    pub reason: Reason,
    /// `ingress` or `egress` (of `pod`), for policy denials.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direction: Option<&'static str>,
    /// The pod whose policy dropped the packet (`namespace/name`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Its namespace (the metric's label); for other reasons, the source pod's if known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) namespace: Option<String>,
    /// The source: `namespace/name` of a pod, else the address.
    pub from: String,
    /// The destination: `namespace/name` of a pod, else the address.
    pub to: String,
    pub(crate) protocol: String,
    /// `IPv4` or `IPv6`.
    pub(crate) family: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) port: Option<u16>,
    /// What denies in that direction (see the module doc); `unknown pod` when the interface
    /// is not one of this node's endpoints any more.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<String>,
    /// Audit mode: the packet was accepted; the audited policies would deny it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) audit: bool,
    /// The log prefix, when it is not one flock writes (another table logging to the group).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) prefix: Option<String>,
}

impl Denial {
    /// The metric's direction label: `ingress`, `egress`, or the reason.
    pub fn direction_label(&self) -> &'static str {
        match (self.direction, self.reason) {
            (Some(d), _) => d,
            (None, Reason::SpoofedSource) => "spoofed-source",
            (None, Reason::UnknownPod) => "unknown-pod",
            (None, Reason::Revoked) => "revoked",
            (None, Reason::Policy | Reason::Allowed) => "unknown",
        }
    }
}

impl Denial {
    fn by_policy(&mut self, endpoints: &Endpoints, direction: Direction, interface: &str, audit: bool) {
        self.direction = Some(direction.as_field());
        self.audit = audit;
        match endpoints.by_interface.get(interface) {
            Some(ep) => {
                self.pod = Some(ep.pod.to_string());
                self.namespace = Some(ep.pod.namespace.clone());
                self.policies = match (direction, audit) {
                    (Direction::Ingress, false) => ep.ingress.clone(),
                    (Direction::Egress, false) => ep.egress.clone(),
                    (Direction::Ingress, true) => ep.audit_ingress.clone(),
                    (Direction::Egress, true) => ep.audit_egress.clone(),
                };
            }
            None => self.policies = vec![format!("unknown pod (interface {interface})")],
        }
    }
}

/// Names an address: the pod it belongs to, else the address itself.
fn name(snapshot: &Snapshot, ip: IpAddr) -> String {
    snapshot.peer_owning(&ip).map_or_else(|| ip.to_string(), |p| p.key().to_string())
}

/// The denial `logged` records, read with the node's `endpoints` and the cluster `snapshot`.
pub(crate) fn denial(logged: &Logged, endpoints: &Endpoints, snapshot: &Snapshot) -> Denial {
    let (from, to) = (name(snapshot, logged.src), name(snapshot, logged.dst));
    let mut d = Denial {
        reason: Reason::Policy,
        direction: None,
        pod: None,
        namespace: None,
        from,
        to,
        protocol: logged.protocol_name(),
        family: crate::model::Family::of(logged.src).as_str(),
        port: logged.dport,
        policies: Vec::new(),
        audit: false,
        prefix: None,
    };
    let ns_of = |s: &str| s.split_once('/').map(|(ns, _)| ns.to_string());
    match LogPrefix::parse(&logged.prefix) {
        Some(LogPrefix::Deny { direction, interface }) => d.by_policy(endpoints, direction, &interface, false),
        Some(LogPrefix::Audit { direction, interface }) => d.by_policy(endpoints, direction, &interface, true),
        Some(LogPrefix::Allow { direction, interface }) => {
            d.by_policy(endpoints, direction, &interface, false);
            d.reason = Reason::Allowed;
            d.policies.clear();
        }
        Some(LogPrefix::Spoofed) => {
            d.reason = Reason::SpoofedSource;
            d.namespace = ns_of(&d.from);
        }
        Some(LogPrefix::UnknownPod) => {
            d.reason = Reason::UnknownPod;
            d.namespace = ns_of(&d.to);
        }
        Some(LogPrefix::Revoked) => {
            d.reason = Reason::Revoked;
            d.namespace = ns_of(&d.from).or_else(|| ns_of(&d.to));
        }
        None => d.prefix = Some(logged.prefix.clone()),
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{base_cluster, parse_manifests};

    const POLICIES: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-in, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: guard}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  egress:
    - action: Deny
      to: [{networks: [198.19.0.0/16]}]
"#;

    fn logged(prefix: &str, src: &str, dst: &str) -> Logged {
        Logged {
            prefix: prefix.into(),
            indev: None,
            outdev: None,
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            protocol: 6,
            dport: Some(80),
        }
    }

    #[test]
    fn records_name_pods_directions_and_what_denies() {
        let mut s = base_cluster();
        for o in parse_manifests(POLICIES).objects {
            o.apply_to(&mut s);
        }
        let np = crate::translate::translate(&s, &s.derived_endpoints("node-1"), &crate::translate::Options::default());
        let eps = Endpoints::of(&np);
        let xa = np.endpoints.iter().find(|e| e.pod.to_string() == "x/a").unwrap();
        let (xa_ip, yb_ip) =
            (s.pod_by_name(&ObjectRef::new("x", "a")).unwrap().ips[0], s.pod_by_name(&ObjectRef::new("y", "b")).unwrap().ips[0]);

        let d = denial(&logged(&format!("flock:deny:ingress:{}", xa.interface), &yb_ip.to_string(), &xa_ip.to_string()), &eps, &s);
        assert_eq!(
            (d.reason, d.direction, d.pod.as_deref(), d.namespace.as_deref()),
            (Reason::Policy, Some("ingress"), Some("x/a"), Some("x"))
        );
        assert_eq!((d.from.as_str(), d.to.as_str(), d.protocol.as_str(), d.port), ("y/b", "x/a", "TCP", Some(80)));
        assert_eq!(d.policies, ["policy x/deny-in"]);

        let d = denial(&logged(&format!("flock:deny:egress:{}", xa.interface), &xa_ip.to_string(), "198.19.1.1"), &eps, &s);
        assert_eq!((d.direction_label(), d.to.as_str()), ("egress", "198.19.1.1"));
        assert_eq!(d.policies, ["clusternetworkpolicy guard"]);

        let d = denial(&logged("flock:deny:ingress:flkgone", "198.19.1.1", &xa_ip.to_string()), &eps, &s);
        assert_eq!(d.policies, ["unknown pod (interface flkgone)"]);
        let d = denial(&logged("flock:spoofed", "198.19.9.9", &yb_ip.to_string()), &eps, &s);
        assert_eq!((d.reason, d.direction_label(), d.namespace.as_deref()), (Reason::SpoofedSource, "spoofed-source", None));
        let d = denial(&logged("flock:unknown-pod", &yb_ip.to_string(), &xa_ip.to_string()), &eps, &s);
        assert_eq!((d.reason, d.namespace.as_deref()), (Reason::UnknownPod, Some("x")));
        let d = denial(&logged("flock:revoked", &yb_ip.to_string(), &xa_ip.to_string()), &eps, &s);
        assert_eq!((d.reason, d.direction_label(), d.namespace.as_deref()), (Reason::Revoked, "revoked", Some("y")));
        let d = denial(&logged("other", &yb_ip.to_string(), &xa_ip.to_string()), &eps, &s);
        assert_eq!(d.prefix.as_deref(), Some("other"));
        let json = serde_json::to_value(denial(&logged("flock:spoofed", "198.19.9.9", "198.19.9.8"), &eps, &s)).unwrap();
        assert_eq!(json["reason"], "spoofed-source");
    }
}
