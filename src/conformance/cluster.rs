//! The case format on a real cluster (`flockctl conformance --kubeconfig`), its pure half:
//! the base cluster as real objects, each case's objects carried over onto the cluster's
//! names and addresses, and why a case cannot run there (`SKIP <reason>`). The runner in
//! flockctl makes the API calls and the exec probes.
//!
//! Carrying over: namespaces get the run's prefix (selectors on `kubernetes.io/metadata.name`
//! follow), so do ClusterNetworkPolicies, whose subjects are also narrowed to the run's
//! namespaces (a case's cluster-wide policy must not reach anyone else's pods); an ipBlock
//! or `networks` entry that names a base pod's address, a node's pod CIDR or a whole family
//! becomes the cluster's; any other address is not carried over and the case is skipped,
//! never run on a guess.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{Map, Value, json};

use super::{Case, DeleteRef, Expect, Probe};
use crate::model::cnp;
use crate::model::manifest::{Kind, Object};
use crate::model::{Family, ObjectRef, Pod, Protocol, Snapshot};

/// The label on everything a run creates (its value: the run's id).
pub const RUN_LABEL: &str = "flock.dev/conformance-run";
/// The server-side apply field manager of a run's writes.
pub const FIELD_MANAGER: &str = "flockctl-conformance";
const NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// ClusterNetworkPolicy's group, version, kind and plural (what a dynamic client needs).
pub const CNP_RESOURCE: (&str, &str, &str, &str) = (cnp::GROUP, cnp::VERSION, cnp::KIND, cnp::PLURAL);

/// What a run targets, as the runner found the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Put before every namespace and ClusterNetworkPolicy name.
    pub prefix: String,
    /// The run's id (the value of [`RUN_LABEL`]).
    pub run: String,
    /// The image of every pod (agnhost).
    pub image: String,
    /// Whether the cluster's nodes have SCTP (else no SCTP server is started).
    pub sctp: bool,
    /// The base's node names → the cluster's; a node not here is left to the scheduler.
    pub nodes: BTreeMap<String, String>,
    /// The families of the cluster's pod addresses, the primary one first.
    pub families: Vec<Family>,
}

/// What a CIDR of a case names, in the case's own cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Named {
    Pod(ObjectRef, Family),
    NodeCidr(String, Family),
    All(Family),
}

/// The cluster's current addresses of what the case names: its pods (by the case's keys)
/// and nodes' pod CIDRs (by the base's node names).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Live {
    pub pods: BTreeMap<ObjectRef, Vec<IpAddr>>,
    pub node_cidrs: BTreeMap<String, Vec<IpNet>>,
}

/// An object to write, carried over onto the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct Carried {
    pub kind: Kind,
    /// Its namespace on the cluster (`None`: cluster-scoped).
    pub namespace: Option<String>,
    pub name: String,
    pub object: Value,
}

/// Carries a case over onto a target.
#[derive(Debug, Clone)]
pub struct Mapping {
    pub target: Target,
    /// The family of the base's pod addresses (what a case's unqualified probe uses).
    base_family: Family,
    /// The case's addresses: base pods' and those of pods the case applies.
    addresses: BTreeMap<IpAddr, ObjectRef>,
    node_cidrs: BTreeMap<IpNet, String>,
}

impl Mapping {
    pub fn new(base: &Snapshot, target: Target) -> Self {
        let base_family = base.pods().find_map(|p| p.ips.first().copied()).map_or(Family::V4, Family::of);
        let addresses = base.pods().flat_map(|p| p.ips.iter().map(move |ip| (*ip, p.key()))).collect();
        let node_cidrs = base.nodes().flat_map(|n| n.pod_cidrs.iter().map(move |c| (c.trunc(), n.name.clone()))).collect();
        Self { target, base_family, addresses, node_cidrs }
    }

    /// A case namespace's name on the cluster.
    pub fn namespace(&self, ns: &str) -> String {
        format!("{}{ns}", self.target.prefix)
    }

    /// A case pod's key on the cluster.
    pub fn pod(&self, key: &ObjectRef) -> ObjectRef {
        ObjectRef::new(self.namespace(&key.namespace), key.name.clone())
    }

    /// The cluster's family for a family of the case: the base's becomes the cluster's
    /// primary one, the other its second (if it has one).
    pub fn family(&self, case: Family) -> Option<Family> {
        if case == self.base_family { self.target.families.first().copied() } else { self.target.families.get(1).copied() }
    }

    /// The family a probe uses on the cluster (`None`: the cluster lacks it).
    pub fn probe_family(&self, probe: &Probe) -> Option<Family> {
        self.family(probe.family.unwrap_or(self.base_family))
    }

    fn labels(&self, labels: impl IntoIterator<Item = (String, String)>) -> Map<String, Value> {
        let mut out: Map<String, Value> =
            labels.into_iter().filter(|(k, _)| k != NAME_LABEL && k != RUN_LABEL).map(|(k, v)| (k, Value::String(v))).collect();
        out.insert(RUN_LABEL.into(), Value::String(self.target.run.clone()));
        out
    }

    /// A namespace of the case, as created on the cluster.
    pub fn namespace_object(
        &self,
        name: &str,
        labels: impl IntoIterator<Item = (String, String)>,
        annotations: Map<String, Value>,
    ) -> Carried {
        let real = self.namespace(name);
        let mut metadata = json!({"name": real, "labels": self.labels(labels)});
        if !annotations.is_empty() {
            metadata["annotations"] = Value::Object(annotations);
        }
        Carried {
            kind: Kind::Namespace,
            namespace: None,
            name: real,
            object: json!({"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}),
        }
    }

    /// A pod of the case, as a real pod: the image serves each TCP and UDP port the pod
    /// declares (SCTP too where the nodes have it), with the declared port names; a pod that
    /// declares none runs `pause` (it is only a client). Placed on the node the case names
    /// when the cluster has it.
    pub fn pod_object(&self, pod: &Pod) -> Result<Carried, String> {
        if pod.host_network {
            return Err(format!("pod {} is host-network", pod.key()));
        }
        let key = self.pod(&pod.key());
        let mut containers = Vec::new();
        let mut seen = Vec::new();
        for p in &pod.ports {
            if seen.contains(&(p.port, p.protocol)) || (p.protocol == Protocol::Sctp && !self.target.sctp) {
                continue;
            }
            seen.push((p.port, p.protocol));
            let proto = p.protocol.as_k8s();
            let mut port = json!({"containerPort": p.port, "protocol": proto});
            if let Some(n) = &p.name {
                port["name"] = Value::String(n.to_string());
            }
            let name = format!("cont-{}-{}", p.port, proto.to_ascii_lowercase());
            let c = match p.protocol {
                Protocol::Sctp => json!({"name": name, "image": self.target.image, "imagePullPolicy": "IfNotPresent",
                    "command": ["/agnhost", "porter"], "env": [{"name": format!("SERVE_SCTP_PORT_{}", p.port), "value": "foo"}], "ports": [port]}),
                _ => json!({"name": name, "image": self.target.image, "imagePullPolicy": "IfNotPresent",
                    "command": ["/agnhost", "serve-hostname", if p.protocol == Protocol::Tcp { "--tcp" } else { "--udp" }, "--http=false", "--port", p.port.to_string()],
                    "ports": [port]}),
            };
            containers.push(c);
        }
        if containers.is_empty() {
            containers.push(
                json!({"name": "client", "image": self.target.image, "imagePullPolicy": "IfNotPresent", "command": ["/agnhost", "pause"]}),
            );
        }
        let labels = (&pod.labels).into_iter().map(|(k, v)| (k.to_string(), v.to_string()));
        let mut spec = json!({"terminationGracePeriodSeconds": 0, "enableServiceLinks": false, "automountServiceAccountToken": false, "containers": containers});
        if let Some(node) = pod.node.as_ref().and_then(|n| self.target.nodes.get(n)) {
            spec["nodeName"] = Value::String(node.clone());
        }
        let object = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": key.name, "namespace": key.namespace, "labels": self.labels(labels)}, "spec": spec});
        Ok(Carried { kind: Kind::Pod, namespace: Some(key.namespace), name: key.name, object })
    }

    /// The container a probe from `pod` runs in (its first).
    pub fn client_container(object: &Value) -> Option<&str> {
        object["spec"]["containers"].get(0)?.get("name")?.as_str()
    }

    /// What a CIDR of the case names, if it names something the runner can carry over.
    fn named(&self, cidr: &str) -> Result<Named, String> {
        let net: IpNet = cidr.parse().map_err(|_| format!("{cidr:?} is not a CIDR"))?;
        let family = Family::of(net.addr());
        if net.prefix_len() == 0 {
            return Ok(Named::All(family));
        }
        if net.prefix_len() == net.max_prefix_len()
            && let Some(pod) = self.addresses.get(&net.addr())
        {
            return Ok(Named::Pod(pod.clone(), family));
        }
        if let Some(node) = self.node_cidrs.get(&net)
            && net == net.trunc()
        {
            return Ok(Named::NodeCidr(node.clone(), family));
        }
        // A range holding every pod address of its family (the case's cluster range, say)
        // selects the case's pods as that whole family does: the only addresses probed.
        let mut pods = self.addresses.keys().filter(|a| Family::of(**a) == family).peekable();
        if pods.peek().is_some() && pods.all(|a| net.contains(a)) {
            return Ok(Named::All(family));
        }
        Err(format!("{cidr} is neither a pod's address, a node's pod CIDR, a whole family nor a range of every pod"))
    }

    /// A CIDR of the case on the cluster, with the cluster's current addresses.
    fn map_cidr(&self, cidr: &str, live: &Live) -> Result<String, String> {
        let named = self.named(cidr)?;
        let case_family = match &named {
            Named::Pod(_, f) | Named::NodeCidr(_, f) | Named::All(f) => *f,
        };
        let family =
            self.family(case_family).ok_or_else(|| format!("{cidr}: the cluster's pods have no {} address", case_family.as_str()))?;
        match named {
            Named::All(_) => Ok(if family == Family::V4 { "0.0.0.0/0" } else { "::/0" }.into()),
            Named::Pod(pod, _) => {
                let ip = live.pods.get(&pod).and_then(|ips| ips.iter().find(|ip| Family::of(**ip) == family));
                let ip =
                    ip.ok_or_else(|| format!("{cidr} is pod {pod}'s address, and it has no {} address on the cluster", family.as_str()))?;
                Ok(IpNet::from(*ip).to_string())
            }
            Named::NodeCidr(node, _) => {
                let c = live.node_cidrs.get(&node).and_then(|cs| cs.iter().find(|c| Family::of(c.addr()) == family));
                Ok(c.ok_or_else(|| format!("{cidr} is {node}'s pod CIDR, and the cluster's {node} has no {} pod CIDR", family.as_str()))?
                    .to_string())
            }
        }
    }

    /// Records the addresses of a pod the case applies (for its CIDRs that name them).
    pub fn learn(&mut self, pod: &Pod) {
        for ip in &pod.ips {
            self.addresses.insert(*ip, pod.key());
        }
    }

    /// Forgets the case's pods (back to the base's addresses).
    pub fn reset(&mut self, base: &Snapshot) {
        *self = Self::new(base, self.target.clone());
    }

    fn selector(&self, sel: &mut Value) {
        if let Some(v) = sel.get_mut("matchLabels").and_then(|m| m.get_mut(NAME_LABEL))
            && let Some(ns) = v.as_str()
        {
            *v = Value::String(self.namespace(ns));
        }
        for e in sel.get_mut("matchExpressions").and_then(Value::as_array_mut).into_iter().flatten() {
            if e.get("key").and_then(Value::as_str) == Some(NAME_LABEL) {
                for v in e.get_mut("values").and_then(Value::as_array_mut).into_iter().flatten() {
                    if let Some(ns) = v.as_str() {
                        *v = Value::String(self.namespace(ns));
                    }
                }
            }
        }
    }

    /// Namespace selectors and addresses anywhere in a policy's spec.
    fn walk(&self, v: &mut Value, live: &Live) -> Result<(), String> {
        match v {
            Value::Object(map) => {
                for (k, child) in map.iter_mut() {
                    match k.as_str() {
                        "namespaceSelector" | "namespaces" if child.is_object() => self.selector(child),
                        "ipBlock" => {
                            if let Some(c) = child.get_mut("cidr") {
                                let s = c.as_str().unwrap_or_default().to_string();
                                *c = Value::String(self.map_cidr(&s, live)?);
                            }
                            for e in child.get_mut("except").and_then(Value::as_array_mut).into_iter().flatten() {
                                let s = e.as_str().unwrap_or_default().to_string();
                                *e = Value::String(self.map_cidr(&s, live)?);
                            }
                        }
                        "networks" => {
                            for e in child.as_array_mut().into_iter().flatten() {
                                let s = e.as_str().unwrap_or_default().to_string();
                                *e = Value::String(self.map_cidr(&s, live)?);
                            }
                        }
                        "domainNames" => return Err("domain names need the case's DNS records".into()),
                        _ => self.walk(child, live)?,
                    }
                }
            }
            Value::Array(items) => {
                for i in items {
                    self.walk(i, live)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// A Namespace, NetworkPolicy or ClusterNetworkPolicy of a step, carried over (Pods go
    /// through [`Mapping::pod_object`]); `Ok(None)` for a Pod.
    pub fn carry(&self, raw: &Value, live: &Live) -> Result<Option<Carried>, String> {
        let kind = raw.get("kind").and_then(Value::as_str).unwrap_or_default();
        let meta = &raw["metadata"];
        let name = meta.get("name").and_then(Value::as_str).unwrap_or_default();
        let labels: Vec<(String, String)> = meta
            .get("labels")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect();
        let annotations = meta.get("annotations").and_then(Value::as_object).cloned().unwrap_or_default();
        let mut metadata = json!({"labels": self.labels(labels.clone())});
        if !annotations.is_empty() {
            metadata["annotations"] = Value::Object(annotations.clone());
        }
        let mut spec = raw.get("spec").cloned().unwrap_or(Value::Null);
        match Kind::parse(kind) {
            Some(Kind::Pod) => Ok(None),
            Some(Kind::Namespace) => Ok(Some(self.namespace_object(name, labels, annotations))),
            Some(Kind::NetworkPolicy) => {
                let ns = self.namespace(meta.get("namespace").and_then(Value::as_str).unwrap_or(crate::model::convert::DEFAULT_NAMESPACE));
                self.walk(&mut spec, live).map_err(|e| format!("NetworkPolicy {name}: {e}"))?;
                metadata["name"] = Value::String(name.into());
                metadata["namespace"] = Value::String(ns.clone());
                let object = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata, "spec": spec});
                Ok(Some(Carried { kind: Kind::NetworkPolicy, namespace: Some(ns), name: name.into(), object }))
            }
            Some(Kind::ClusterNetworkPolicy) => {
                self.walk(&mut spec, live).map_err(|e| format!("ClusterNetworkPolicy {name}: {e}"))?;
                // Only the run's namespaces: what the case calls every namespace is the
                // case's cluster, not this one.
                let mine = |sel: &mut Value| {
                    if !sel.is_object() {
                        return;
                    }
                    if !sel.get("matchLabels").is_some_and(Value::is_object) {
                        sel["matchLabels"] = json!({});
                    }
                    sel["matchLabels"][RUN_LABEL] = Value::String(self.target.run.clone());
                };
                if let Some(subject) = spec.get_mut("subject") {
                    if let Some(sel) = subject.get_mut("namespaces") {
                        mine(sel);
                    }
                    if let Some(sel) = subject.get_mut("pods").and_then(|p| p.get_mut("namespaceSelector")) {
                        mine(sel);
                    }
                }
                let real = format!("{}{name}", self.target.prefix);
                metadata["name"] = Value::String(real.clone());
                let object = json!({"apiVersion": cnp::API_VERSION, "kind": cnp::KIND, "metadata": metadata, "spec": spec});
                Ok(Some(Carried { kind: Kind::ClusterNetworkPolicy, namespace: None, name: real, object }))
            }
            _ => Err(format!("cannot carry a {kind} over")),
        }
    }

    /// A deletion of a step: kind, namespace and name on the cluster.
    pub fn deletion(&self, d: &DeleteRef) -> (Kind, Option<String>, String) {
        match d.kind {
            Kind::Namespace => (d.kind, None, self.namespace(&d.key.name)),
            Kind::ClusterNetworkPolicy => (d.kind, None, format!("{}{}", self.target.prefix, d.key.name)),
            Kind::Node => (d.kind, None, d.key.name.clone()),
            _ => {
                let ns = if d.key.namespace.is_empty() { crate::model::convert::DEFAULT_NAMESPACE } else { d.key.namespace.as_str() };
                (d.kind, Some(self.namespace(ns)), d.key.name.clone())
            }
        }
    }

    /// Why `case` cannot run on the target, if it cannot: what it needs that the cluster or
    /// the runner does not give. Checked before the case touches the cluster.
    pub fn skip_reason(&self, base: &Snapshot, case: &Case) -> Option<String> {
        if case.dns.is_some() {
            return Some("needs the case's DNS server and records (the cluster's DNS answers for itself)".into());
        }
        let mut pods: BTreeMap<ObjectRef, ()> = base.pods().map(|p| (p.key(), ())).collect();
        let mut owners: BTreeMap<IpAddr, ObjectRef> = self.addresses.clone();
        let mut scratch = self.clone();
        for step in &case.steps {
            for raw in &step.raw_apply {
                let kind = raw.get("kind").and_then(Value::as_str).unwrap_or_default();
                match Kind::parse(kind) {
                    Some(Kind::Node) => return Some("changes Node objects (the cluster's kubelets own them)".into()),
                    Some(_) => {}
                    None => return Some(format!("applies a {kind}, which the runner does not carry over")),
                }
            }
            for o in &step.apply {
                if let Object::Pod(p) = o {
                    if p.host_network {
                        return Some(format!("needs host-network pod {} (its servers would be the node's)", p.key()));
                    }
                    for ip in &p.ips {
                        if let Some(owner) = owners.get(ip).filter(|o| **o != p.key()) {
                            return Some(format!("reuses {ip}, pod {owner}'s address, for pod {} (a cluster picks its own)", p.key()));
                        }
                        owners.insert(*ip, p.key());
                    }
                    scratch.learn(p);
                    pods.insert(p.key(), ());
                }
            }
            if step.delete.iter().any(|d| d.kind == Kind::Node) {
                return Some("deletes Node objects (the cluster's kubelets own them)".into());
            }
        }
        // Addresses against every pod the case ever has (a range of every pod must hold
        // those a later step adds too).
        for step in &case.steps {
            for raw in &step.raw_apply {
                if let Err(e) = scratch.check_addresses(raw) {
                    return Some(e);
                }
            }
            for p in &step.probes {
                if p.protocol == Protocol::Sctp && !self.target.sctp && !p.kernel_optional {
                    return Some("needs SCTP, which the cluster's nodes lack".into());
                }
                if self.probe_family(p).is_none() {
                    let f = p.family.unwrap_or(self.base_family);
                    return Some(format!("probes {}, which the cluster's pods lack", f.as_str()));
                }
                for end in &p.order {
                    let checked = p
                        .order
                        .iter()
                        .any(|o| o != end && (p.expect(end, o) != Expect::Unchecked || p.expect(o, end) != Expect::Unchecked));
                    if checked && ObjectRef::parse(end).is_none_or(|k| !pods.contains_key(&k)) {
                        return Some(format!("probes {end}, which is not a pod of the case"));
                    }
                }
            }
        }
        None
    }

    /// Whether every address a policy names can be carried over (statically: which pod or
    /// node it names, not yet their addresses).
    fn check_addresses(&self, raw: &Value) -> Result<(), String> {
        fn cidrs<'v>(v: &'v Value, out: &mut Vec<&'v str>, domains: &mut bool) {
            match v {
                Value::Object(m) => {
                    for (k, c) in m {
                        match k.as_str() {
                            "ipBlock" => {
                                out.extend(c.get("cidr").and_then(Value::as_str));
                                out.extend(c.get("except").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str));
                            }
                            "networks" => out.extend(c.as_array().into_iter().flatten().filter_map(Value::as_str)),
                            "domainNames" => *domains = true,
                            _ => cidrs(c, out, domains),
                        }
                    }
                }
                Value::Array(a) => a.iter().for_each(|i| cidrs(i, out, domains)),
                _ => {}
            }
        }
        let (mut out, mut domains) = (Vec::new(), false);
        cidrs(raw.get("spec").unwrap_or(&Value::Null), &mut out, &mut domains);
        if domains {
            return Err("has domain-name peers, which need the case's DNS records".into());
        }
        for c in out {
            let named = self.named(c).map_err(|e| format!("names an address the cluster has no counterpart of: {e}"))?;
            let f = match named {
                Named::Pod(_, f) | Named::NodeCidr(_, f) | Named::All(f) => f,
            };
            if self.family(f).is_none() {
                return Err(format!("names {c}, and the cluster's pods have no {} address", f.as_str()));
            }
        }
        Ok(())
    }
}

/// flock's explanation of a cell on the cluster's own objects, in one line (for a cell that
/// did not match, where flock is the cluster's CNI).
pub fn explain_cell(snapshot: &Snapshot, from: &ObjectRef, to: &ObjectRef, protocol: Protocol, port: u16, family: Family) -> String {
    let query = crate::explain::Query {
        from: crate::explain::End::Pod(from.clone()),
        to: crate::explain::End::Pod(to.clone()),
        protocol,
        port,
        family: Some(family),
    };
    match crate::explain::explain(snapshot, &query) {
        Ok(e) => format!("flock explains {}: egress {}, ingress {}", e.verdict, e.egress.reason, e.ingress.reason),
        Err(e) => format!("flock cannot explain it: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn target(families: &[Family]) -> Target {
        Target {
            prefix: "fc-".into(),
            run: "r1".into(),
            image: "agnhost:test".into(),
            sctp: false,
            nodes: [("node-1".to_string(), "node-1".to_string()), ("node-2".to_string(), "node-2".to_string())].into(),
            families: families.to_vec(),
        }
    }

    fn live() -> Live {
        let pods = [
            (ObjectRef::new("x", "a"), vec!["198.18.1.5".parse().unwrap(), "2001:db8:1::5".parse().unwrap()]),
            (ObjectRef::new("x", "b"), vec!["198.18.2.7".parse().unwrap(), "2001:db8:2::7".parse().unwrap()]),
        ];
        let node_cidrs = [
            ("node-1".to_string(), vec!["198.18.1.0/24".parse().unwrap(), "2001:db8:1::/64".parse().unwrap()]),
            ("node-2".to_string(), vec!["198.18.2.0/24".parse().unwrap()]),
        ];
        Live { pods: pods.into(), node_cidrs: node_cidrs.into() }
    }

    fn case(text: &str) -> Case {
        super::super::parse_case(Path::new("c.yaml"), "001-x", text).unwrap()
    }

    #[test]
    fn policies_follow_the_run_s_names_and_addresses() {
        let base = crate::testkit::base_cluster();
        let m = Mapping::new(&base, target(&[Family::V4]));
        let np = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "p", "namespace": "x", "labels": {"k": "v"}},
            "spec": {"podSelector": {}, "ingress": [{"from": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}, "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["z"]}]}},
                {"ipBlock": {"cidr": "198.18.2.0/24", "except": ["198.18.2.12/32"]}},
                {"ipBlock": {"cidr": "0.0.0.0/0"}}]}]}});
        let c = m.carry(&np, &live()).unwrap().unwrap();
        assert_eq!(c.namespace.as_deref(), Some("fc-x"));
        assert_eq!(c.object["metadata"]["labels"], json!({"k": "v", RUN_LABEL: "r1"}));
        let from = &c.object["spec"]["ingress"][0]["from"];
        assert_eq!(from[0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], "fc-y");
        assert_eq!(from[0]["namespaceSelector"]["matchExpressions"][0]["values"], json!(["fc-z"]));
        assert_eq!(from[1]["ipBlock"], json!({"cidr": "198.18.2.0/24", "except": ["198.18.2.7/32"]}));
        assert_eq!(from[2]["ipBlock"]["cidr"], "0.0.0.0/0");
        // On an IPv6 cluster the base's IPv4 names the pods' IPv6 addresses.
        let v6 = Mapping::new(&base, target(&[Family::V6]));
        assert!(v6.carry(&np, &live()).is_err(), "node-2 has no IPv6 pod CIDR here");
        let mut both = live();
        both.node_cidrs.insert("node-2".into(), vec!["198.18.2.0/24".parse().unwrap(), "2001:db8:2::/64".parse().unwrap()]);
        let c = v6.carry(&np, &both).unwrap().unwrap();
        let from = &c.object["spec"]["ingress"][0]["from"];
        assert_eq!(from[1]["ipBlock"], json!({"cidr": "2001:db8:2::/64", "except": ["2001:db8:2::7/128"]}));
        assert_eq!(from[2]["ipBlock"]["cidr"], "::/0");
        // node-2 has no IPv6 pod CIDR on this cluster: named, not guessed.
        assert!(v6.map_cidr("198.18.2.0/24", &live()).unwrap_err().contains("node-2 has no IPv6 pod CIDR"));
    }

    #[test]
    fn cluster_policies_reach_only_the_run_s_namespaces() {
        let base = crate::testkit::base_cluster();
        let m = Mapping::new(&base, target(&[Family::V4]));
        let cnp = json!({"apiVersion": cnp::API_VERSION, "kind": "ClusterNetworkPolicy", "metadata": {"name": "deny"},
            "spec": {"tier": "Admin", "priority": 1, "subject": {"namespaces": {}},
                "egress": [{"action": "Deny", "to": [{"networks": ["198.18.1.11/32"]}, {"pods": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "x"}}, "podSelector": {}}}]}]}});
        let live = Live { pods: [(ObjectRef::new("x", "a"), vec!["198.18.1.99".parse().unwrap()])].into(), ..Live::default() };
        let c = m.carry(&cnp, &live).unwrap().unwrap();
        assert_eq!(c.name, "fc-deny");
        assert_eq!(c.namespace, None);
        assert_eq!(c.object["spec"]["subject"]["namespaces"], json!({"matchLabels": {RUN_LABEL: "r1"}}));
        assert_eq!(c.object["spec"]["egress"][0]["to"][0]["networks"], json!(["198.18.1.99/32"]));
        assert_eq!(
            c.object["spec"]["egress"][0]["to"][1]["pods"]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "fc-x"
        );
        let pods = json!({"kind": "ClusterNetworkPolicy", "metadata": {"name": "p"}, "spec": {"subject": {"pods": {"namespaceSelector": {"matchLabels": {"ns": "x"}}, "podSelector": {}}}}});
        let c = m.carry(&pods, &live).unwrap().unwrap();
        assert_eq!(c.object["spec"]["subject"]["pods"]["namespaceSelector"]["matchLabels"], json!({"ns": "x", RUN_LABEL: "r1"}));
        // An address the case's cluster does not give a pod or node is not carried over.
        let odd = json!({"kind": "ClusterNetworkPolicy", "metadata": {"name": "p"}, "spec": {"egress": [{"to": [{"networks": ["198.18.2.0/23"]}]}]}});
        assert!(m.carry(&odd, &live).unwrap_err().contains("198.18.2.0/23 is neither a pod's address"));
        // Every pod's range selects the pods the whole family does.
        let all = json!({"kind": "ClusterNetworkPolicy", "metadata": {"name": "p"}, "spec": {"egress": [{"to": [{"networks": ["198.18.0.0/15"]}]}]}});
        assert_eq!(m.carry(&all, &live).unwrap().unwrap().object["spec"]["egress"][0]["to"][0]["networks"], json!(["0.0.0.0/0"]));
    }

    #[test]
    fn pods_serve_their_ports_on_the_named_node() {
        let base = crate::testkit::base_cluster();
        let mut t = target(&[Family::V4]);
        t.nodes.remove("node-2");
        let m = Mapping::new(&base, t);
        let a = base.pod_by_name(&ObjectRef::new("x", "a")).unwrap();
        let c = m.pod_object(a).unwrap();
        assert_eq!((c.namespace.as_deref(), c.name.as_str()), (Some("fc-x"), "a"));
        assert_eq!(c.object["spec"]["nodeName"], "node-1");
        let containers = c.object["spec"]["containers"].as_array().unwrap();
        // TCP and UDP on 80 and 81; no SCTP server where the nodes lack SCTP.
        let names: Vec<&str> = containers.iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["cont-80-tcp", "cont-80-udp", "cont-81-tcp", "cont-81-udp"]);
        assert_eq!(containers[1]["command"], json!(["/agnhost", "serve-hostname", "--udp", "--http=false", "--port", "80"]));
        assert_eq!(containers[0]["ports"][0], json!({"containerPort": 80, "protocol": "TCP", "name": "serve-80-tcp"}));
        assert_eq!(c.object["metadata"]["labels"], json!({"pod": "a", RUN_LABEL: "r1"}));
        // node-2 is not the cluster's: the scheduler places the pod.
        let b = m.pod_object(base.pod_by_name(&ObjectRef::new("x", "b")).unwrap()).unwrap();
        assert!(b.object["spec"].get("nodeName").is_none());
        let mut sctp = m.clone();
        sctp.target.sctp = true;
        let c = sctp.pod_object(a).unwrap();
        assert_eq!(c.object["spec"]["containers"].as_array().unwrap().len(), 6);
        assert_eq!(Mapping::client_container(&c.object), Some("cont-80-tcp"));
    }

    #[test]
    fn cases_the_cluster_cannot_hold_are_skipped_with_the_reason() {
        let base = crate::testkit::base_cluster();
        let m = Mapping::new(&base, target(&[Family::V4]));
        let reason = |t: &str| m.skip_reason(&base, &case(t));
        let probe = "probes: [{port: 80, protocol: TCP, matrix: {x/a: '-1-------'}}]";
        assert_eq!(reason(&format!("name: x\nsteps: [{{{probe}}}]\n")), None);
        assert!(reason("name: x\ndns: {server: x/a}\nsteps: []\n").unwrap().contains("DNS"));
        let sctp = "name: x\nsteps: [{probes: [{port: 80, protocol: SCTP, matrix: {x/a: '-1-------'}}]}]\n";
        assert!(reason(sctp).unwrap().contains("needs SCTP"));
        let optional = "name: x\nsteps: [{probes: [{port: 80, protocol: SCTP, kernel_optional: true, matrix: {x/a: '-1-------'}}]}]\n";
        assert_eq!(reason(optional), None);
        let v6 = "name: x\nsteps: [{probes: [{port: 80, protocol: TCP, family: IPv6, matrix: {x/a: '-1-------'}}]}]\n";
        assert!(reason(v6).unwrap().contains("probes IPv6"));
        let wide = "name: x\nsteps: [{apply: [{apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: p, namespace: x}, \
                    spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 198.18.1.0/25}}]}]}}]}]\n";
        assert!(reason(wide).unwrap().contains("no counterpart of: 198.18.1.0/25 is neither"));
        // A range of every pod the case has is fine, unless a later step adds one outside.
        assert_eq!(reason(&wide.replace("198.18.1.0/25", "198.18.0.0/15")), None);
        let outside = wide.replace("198.18.1.0/25", "198.18.0.0/15").replace(
            "}]}]\n",
            "}]}, {apply: [{apiVersion: v1, kind: Pod, metadata: {name: far, namespace: x}, spec: {containers: [{name: c, image: i}]}, \
             status: {phase: Running, podIPs: [{ip: 198.20.0.1}]}}]}]\n",
        );
        assert!(reason(&outside).unwrap().contains("198.18.0.0/15 is neither"), "{outside}");
        let host = "name: x\nsteps: [{apply: [{apiVersion: v1, kind: Pod, metadata: {name: h, namespace: x}, \
                    spec: {nodeName: node-1, hostNetwork: true, containers: [{name: c, image: i}]}, status: {phase: Running, podIPs: [{ip: 198.18.0.1}]}}]}]\n";
        assert!(reason(host).unwrap().contains("host-network"));
        let reuse = "name: x\nsteps: [{apply: [{apiVersion: v1, kind: Pod, metadata: {name: n, namespace: x}, \
                     spec: {nodeName: node-1, containers: [{name: c, image: i}]}, status: {phase: Running, podIPs: [{ip: 198.18.1.11}]}}]}]\n";
        assert!(reason(reuse).unwrap().contains("reuses 198.18.1.11, pod x/a's address"));
        // A new pod's own address is carried over (it names that pod).
        let new = "name: x\nsteps: [{apply: [{apiVersion: v1, kind: Pod, metadata: {name: n, namespace: x}, \
                   spec: {nodeName: node-1, containers: [{name: c, image: i}]}, status: {phase: Running, podIPs: [{ip: 198.18.1.77}]}}, \
                   {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, metadata: {name: p, namespace: x}, \
                   spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 198.18.1.77/32}}]}]}}], \
                   probes: [{port: 80, protocol: TCP, order: [x/n, x/a], matrix: {x/n: '-1'}}]}]\n";
        assert_eq!(reason(new), None);
        let stranger = "name: x\nsteps: [{probes: [{port: 80, protocol: TCP, order: [x/a, q/q], matrix: {x/a: '-1'}}]}]\n";
        assert!(reason(stranger).unwrap().contains("q/q, which is not a pod"));
    }

    /// What `tests/conformance` can run on a two-node cluster without SCTP: every skip
    /// says why, and the runnable ones stay the bulk of the corpus.
    #[test]
    fn most_of_the_corpus_runs_on_a_real_cluster() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
        let base = crate::source::files::load_manifests(&[root.join("base-cluster.yaml")]).unwrap().to_snapshot();
        for families in [vec![Family::V4], vec![Family::V6], vec![Family::V4, Family::V6]] {
            let m = Mapping::new(&base, target(&families));
            let mut skipped = BTreeMap::new();
            let dirs = crate::source::files::find_cases(std::slice::from_ref(&root)).unwrap();
            for d in &dirs {
                let c = crate::source::files::load_case(d).unwrap();
                if let Some(why) = m.skip_reason(&base, &c) {
                    skipped.insert(c.dir_name.clone(), why);
                }
            }
            eprintln!("{families:?}: {} of {} skipped: {skipped:#?}", skipped.len(), dirs.len());
            assert!(dirs.len() - skipped.len() >= 75, "{families:?}: only {} runnable", dirs.len() - skipped.len());
        }
    }

    #[test]
    fn deletions_name_the_cluster_s_objects() {
        let base = crate::testkit::base_cluster();
        let m = Mapping::new(&base, target(&[Family::V4]));
        let d = |kind, ns: &str, name: &str| m.deletion(&DeleteRef { kind, key: ObjectRef::new(ns, name) });
        assert_eq!(d(Kind::NetworkPolicy, "x", "p"), (Kind::NetworkPolicy, Some("fc-x".into()), "p".into()));
        assert_eq!(d(Kind::ClusterNetworkPolicy, "", "p"), (Kind::ClusterNetworkPolicy, None, "fc-p".into()));
        assert_eq!(d(Kind::Namespace, "", "n"), (Kind::Namespace, None, "fc-n".into()));
        assert_eq!(d(Kind::Pod, "y", "a"), (Kind::Pod, Some("fc-y".into()), "a".into()));
    }
}
