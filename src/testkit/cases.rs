//! Random conformance cases on the x/y/z model (docs/development.md, "Conformance case
//! format"): NetworkPolicies and ClusterNetworkPolicies drawn from a pool of selectors, peers
//! and ports, then changed — replaced, deleted, pods and namespaces relabelled — over two or
//! three steps, each probed on one port and protocol over every pair of the nine pods. The
//! expectations come from the reference evaluator ([`crate::reference`]), which shares no code
//! with the translator, so `flockctl conformance` on the generated cases checks the whole
//! pipeline, in the kernel, against an independent reading of the APIs — and, run in a
//! shuffled order on one simulated cluster, that no case's outcome depends on what ran
//! before it (connections left from earlier cases and steps included).
//!
//! Deterministic: a seed gives the same cases.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::{Value, json};

use crate::conformance::{self, DEFAULT_ORDER, DeleteRef, Step};
use crate::model::Family;
use crate::model::manifest::{self, DocRef, Kind, Manifests};
use crate::model::{ObjectRef, Pod, Protocol, Snapshot};
use crate::reference::{self, End, Flow};
use crate::synth::Rng;

/// One generated case: its folder name and `case.yaml`.
#[derive(Debug, Clone)]
pub struct GeneratedCase {
    pub(crate) dir_name: String,
    pub(crate) yaml: String,
}

impl GeneratedCase {
    /// Writes `<dir>/<dir_name>/case.yaml`.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        let d = dir.join(&self.dir_name);
        std::fs::create_dir_all(&d)?;
        std::fs::write(d.join("case.yaml"), &self.yaml)
    }
}

/// `count` cases from `seed`, on the IPv4 base cluster `base`.
#[allow(clippy::panic)]
pub fn generate(base: &Snapshot, seed: u64, count: usize) -> Vec<GeneratedCase> {
    let mut rng = Rng::new(seed);
    (0..count).map(|i| one(base, &mut rng, seed, i)).collect()
}

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];
const PROBES: [(u16, Protocol); 4] = [(80, Protocol::Tcp), (81, Protocol::Tcp), (80, Protocol::Udp), (81, Protocol::Udp)];

fn pod_selector(rng: &mut Rng) -> Value {
    match rng.below(6) {
        0 => json!({}),
        1 | 2 => json!({"matchLabels": {"pod": rng.pick(&PODS)}}),
        3 => json!({"matchLabels": {"role": rng.pick(&["r1", "r2"])}}),
        4 => json!({"matchExpressions": [{"key": "pod", "operator": "NotIn", "values": [rng.pick(&PODS)]}]}),
        _ => json!({"matchExpressions": [{"key": "role", "operator": "Exists"}]}),
    }
}

fn namespace_selector(rng: &mut Rng) -> Value {
    match rng.below(5) {
        0 => json!({}),
        1 | 2 => json!({"matchLabels": {"ns": rng.pick(&NAMESPACES)}}),
        3 => json!({"matchLabels": {"team": rng.pick(&["t1", "t2"])}}),
        _ => {
            let (a, b) = (rng.pick(&NAMESPACES), rng.pick(&NAMESPACES));
            json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": [a, b]}]})
        }
    }
}

fn ip_block(rng: &mut Rng, base: &Snapshot) -> Value {
    match rng.below(4) {
        0 => json!({"cidr": "198.18.0.0/15"}),
        1 => json!({"cidr": "198.18.1.0/24"}),
        2 => json!({"cidr": "198.18.0.0/15", "except": ["198.18.2.0/24"]}),
        _ => {
            let pod = format!("{}/{}", rng.pick(&NAMESPACES), rng.pick(&PODS));
            let ip = base.pod_by_name(&super::pod_ref(&pod)).and_then(|p| p.ips.first().copied());
            ip.map_or_else(|| json!({"cidr": "198.18.1.0/24"}), |ip| json!({"cidr": format!("{ip}/32")}))
        }
    }
}

fn np_peer(rng: &mut Rng, base: &Snapshot) -> Value {
    match rng.below(5) {
        0 | 1 => json!({"podSelector": pod_selector(rng)}),
        2 => json!({"namespaceSelector": namespace_selector(rng)}),
        3 => json!({"namespaceSelector": namespace_selector(rng), "podSelector": pod_selector(rng)}),
        _ => json!({"ipBlock": ip_block(rng, base)}),
    }
}

fn np_ports(rng: &mut Rng) -> Option<Value> {
    let one = |rng: &mut Rng| match rng.below(6) {
        0 => json!({"port": 80}),
        1 => json!({"port": 81, "protocol": "UDP"}),
        2 => json!({"port": rng.pick(&["serve-80-tcp", "serve-81-udp", "serve-81-tcp"])}),
        3 => json!({"protocol": "UDP"}),
        4 => json!({"port": 80, "endPort": 81, "protocol": rng.pick(&["TCP", "UDP"])}),
        _ => json!({"port": 81}),
    };
    match rng.below(4) {
        0 => None,
        1 | 2 => Some(json!([one(rng)])),
        _ => Some(json!([one(rng), one(rng)])),
    }
}

fn np_rule(rng: &mut Rng, base: &Snapshot, peers_field: &str) -> Value {
    let mut rule = serde_json::Map::new();
    if !rng.chance(15) {
        let n = 1 + rng.below(2);
        rule.insert(peers_field.into(), Value::Array((0..n).map(|_| np_peer(rng, base)).collect()));
    }
    if let Some(p) = np_ports(rng) {
        rule.insert("ports".into(), p);
    }
    Value::Object(rule)
}

fn network_policy(rng: &mut Rng, base: &Snapshot, namespace: &str, name: &str) -> Value {
    let mut spec = serde_json::Map::new();
    spec.insert("podSelector".into(), pod_selector(rng));
    let (ingress, egress) = match rng.below(4) {
        0 | 1 => (true, false),
        2 => (false, true),
        _ => (true, true),
    };
    let mut types = Vec::new();
    if ingress {
        types.push("Ingress");
        let n = rng.below(3);
        spec.insert("ingress".into(), Value::Array((0..n).map(|_| np_rule(rng, base, "from")).collect()));
    }
    if egress {
        types.push("Egress");
        let n = rng.below(3);
        spec.insert("egress".into(), Value::Array((0..n).map(|_| np_rule(rng, base, "to")).collect()));
    }
    // Without policyTypes, Ingress is implied and Egress only with egress rules.
    if !(ingress && !egress && rng.chance(50)) {
        spec.insert("policyTypes".into(), json!(types));
    }
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name, "namespace": namespace}, "spec": spec})
}

fn cnp_peer(rng: &mut Rng, egress: bool) -> Value {
    match rng.below(if egress { 4 } else { 3 }) {
        0 => json!({"namespaces": namespace_selector(rng)}),
        1 | 2 => json!({"pods": {"namespaceSelector": namespace_selector(rng), "podSelector": pod_selector(rng)}}),
        _ => json!({"networks": [rng.pick(&["198.18.1.0/24", "198.18.2.0/24", "198.18.0.0/15"])]}),
    }
}

fn cnp_protocols(rng: &mut Rng) -> Option<Value> {
    match rng.below(5) {
        0 | 1 => None,
        2 => Some(json!([{"tcp": {"destinationPort": {"number": rng.pick(&[80, 81])}}}])),
        3 => Some(json!([{"udp": {"destinationPort": {"range": {"start": 80, "end": 81}}}}])),
        _ => Some(json!([{"destinationNamedPort": rng.pick(&["serve-80-tcp", "serve-81-udp"])}])),
    }
}

fn cluster_policy(rng: &mut Rng, name: &str) -> Value {
    let admin = rng.chance(60);
    let actions: &[&str] = if admin { &["Accept", "Deny", "Pass"] } else { &["Accept", "Deny", "Deny"] };
    let subject = if rng.chance(50) {
        json!({"namespaces": namespace_selector(rng)})
    } else {
        json!({"pods": {"namespaceSelector": namespace_selector(rng), "podSelector": pod_selector(rng)}})
    };
    let mut spec = serde_json::Map::new();
    spec.insert("tier".into(), json!(if admin { "Admin" } else { "Baseline" }));
    spec.insert("priority".into(), json!(rng.below(4)));
    spec.insert("subject".into(), subject);
    for (field, peers, egress) in [("ingress", "from", false), ("egress", "to", true)] {
        if rng.chance(40) {
            continue;
        }
        let rules: Vec<Value> = (0..1 + rng.below(2))
            .map(|_| {
                let mut r = serde_json::Map::new();
                r.insert("action".into(), json!(rng.pick(actions)));
                r.insert(peers.into(), Value::Array((0..1 + rng.below(2)).map(|_| cnp_peer(rng, egress)).collect()));
                if let Some(p) = cnp_protocols(rng) {
                    r.insert("protocols".into(), p);
                }
                Value::Object(r)
            })
            .collect();
        spec.insert(field.into(), Value::Array(rules));
    }
    json!({"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy", "metadata": {"name": name}, "spec": spec})
}

/// The Pod as a manifest (same namespace, name and so uid: re-applied, it changes in place).
fn pod_manifest(p: &Pod) -> Value {
    let labels: BTreeMap<String, String> = p.labels.to_map();
    let ports: Vec<Value> = p
        .ports
        .iter()
        .map(|c| {
            let mut port = json!({"containerPort": c.port, "protocol": c.protocol.as_k8s()});
            if let Some(n) = &c.name {
                port["name"] = json!(n.as_ref());
            }
            port
        })
        .collect();
    let ips: Vec<Value> = p.ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": p.name, "namespace": p.namespace, "labels": labels},
        "spec": {"nodeName": p.node, "containers": [{"name": "serve", "ports": ports}]},
        "status": {"phase": "Running", "podIP": p.ips.first().map(ToString::to_string), "podIPs": ips},
    })
}

fn relabel_pod(rng: &mut Rng, s: &Snapshot) -> Option<Value> {
    let key = super::pod_ref(&format!("{}/{}", rng.pick(&NAMESPACES), rng.pick(&PODS)));
    let mut p = s.pod_by_name(&key).cloned()?;
    match rng.below(3) {
        0 => p.labels.remove("role"),
        n => p.labels.insert("role", if n == 1 { "r1" } else { "r2" }),
    };
    Some(pod_manifest(&p))
}

fn relabel_namespace(rng: &mut Rng, s: &Snapshot) -> Option<Value> {
    let name = NAMESPACES[rng.below(NAMESPACES.len())];
    let ns = s.namespace(name)?.clone();
    let mut labels = ns.labels.to_map();
    match rng.below(3) {
        0 => labels.remove("team"),
        n => labels.insert("team".into(), if n == 1 { "t1" } else { "t2" }.into()),
    };
    Some(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns.name, "labels": labels}}))
}

/// A policy to create or replace: `(kind, namespace, name, object)`.
fn some_policy(rng: &mut Rng, base: &Snapshot) -> (Kind, String, String, Value) {
    if rng.chance(65) {
        let ns = rng.pick(&NAMESPACES).to_string();
        let name = format!("np-{}", rng.below(3));
        let v = network_policy(rng, base, &ns, &name);
        (Kind::NetworkPolicy, ns, name, v)
    } else {
        let name = format!("cnp-{}", rng.below(2));
        let v = cluster_policy(rng, &name);
        (Kind::ClusterNetworkPolicy, String::new(), name, v)
    }
}

#[allow(clippy::panic)]
fn one(base: &Snapshot, rng: &mut Rng, seed: u64, index: usize) -> GeneratedCase {
    let name = format!("random-{seed}-{index}");
    let dir_name = format!("{index:03}-{name}");
    let mut snapshot = base.clone();
    // Policies alive in the case, to replace or delete later.
    let mut live: Vec<(Kind, String, String)> = Vec::new();
    let mut yaml = String::new();
    let _ = writeln!(yaml, "name: {name}");
    let _ = writeln!(yaml, "source: \"generated: flock::testkit::cases, seed {seed}, case {index}\"");
    let _ = writeln!(yaml, "notes: \"random policies and changes on the x/y/z model; expectations from the reference evaluator\"");
    yaml.push_str("steps:\n");
    let steps = 2 + rng.below(2);
    for step in 0..steps {
        let mut apply: Vec<Value> = Vec::new();
        let mut delete: Vec<(Kind, String, String)> = Vec::new();
        let changes = if step == 0 { 1 + rng.below(3) } else { 1 + rng.below(2) };
        for _ in 0..changes {
            match if step == 0 { 0 } else { rng.below(5) } {
                0 | 1 => {
                    let (kind, ns, n, v) = some_policy(rng, base);
                    if !live.iter().any(|(k, a, b)| *k == kind && *a == ns && *b == n) {
                        live.push((kind, ns, n));
                    }
                    apply.push(v);
                }
                2 if !live.is_empty() => {
                    let gone = live.swap_remove(rng.below(live.len()));
                    apply.retain(|v| !names(v, &gone));
                    delete.push(gone);
                }
                3 => apply.extend(relabel_pod(rng, &snapshot)),
                _ => apply.extend(relabel_namespace(rng, &snapshot)),
            }
        }
        // Apply the step as the runner will: parsed from the same objects.
        let mut parsed = Manifests::default();
        for (j, v) in apply.iter().enumerate() {
            if let Err(e) =
                manifest::parse_value(Path::new("<generated>"), DocRef { document: step + 1, item: Some(j) }, v.clone(), &mut parsed)
            {
                panic!("generated an object the manifest reader refuses: {e}\n{v}");
            }
        }
        let deletes = delete.iter().map(|(kind, ns, n)| DeleteRef { kind: *kind, key: ObjectRef::new(ns.clone(), n.clone()) }).collect();
        conformance::apply_step(&mut snapshot, &Step { apply: parsed.objects, delete: deletes, ..Step::default() });

        let _ = writeln!(yaml, "  - apply:");
        if apply.is_empty() {
            yaml.truncate(yaml.len() - "  - apply:\n".len());
            yaml.push_str("  - apply: []\n");
        }
        for v in &apply {
            let _ = writeln!(yaml, "      - {v}");
        }
        if !delete.is_empty() {
            yaml.push_str("    delete:\n");
            for (kind, ns, n) in &delete {
                let kind = match kind {
                    Kind::NetworkPolicy => "NetworkPolicy",
                    _ => "ClusterNetworkPolicy",
                };
                if ns.is_empty() {
                    let _ = writeln!(yaml, "      - {{kind: {kind}, name: {n}}}");
                } else {
                    let _ = writeln!(yaml, "      - {{kind: {kind}, namespace: {ns}, name: {n}}}");
                }
            }
        }
        let (port, protocol) = *rng.pick(&PROBES);
        let _ = writeln!(yaml, "    probes:\n      - port: {port}\n        protocol: {protocol}\n        matrix:");
        for from in DEFAULT_ORDER {
            let mut row = String::new();
            for to in DEFAULT_ORDER {
                if from == to {
                    row.push('-');
                    continue;
                }
                let flow =
                    Flow { from: End::Pod(super::pod_ref(from)), to: End::Pod(super::pod_ref(to)), protocol, port, family: Family::V4 };
                match reference::evaluate(&snapshot, &flow) {
                    Ok(v) => row.push(if v.allowed { '1' } else { '0' }),
                    Err(e) => panic!("{name} step {}: the reference evaluator cannot judge {from} -> {to}: {e}", step + 1),
                }
            }
            let _ = writeln!(yaml, "          {from}: \"{row}\"");
        }
    }
    GeneratedCase { dir_name, yaml }
}

/// Whether `v` is the object `(kind, namespace, name)`.
fn names(v: &Value, (kind, ns, name): &(Kind, String, String)) -> bool {
    let k = v["kind"].as_str().unwrap_or_default();
    let same_kind = matches!((kind, k), (Kind::NetworkPolicy, "NetworkPolicy") | (Kind::ClusterNetworkPolicy, "ClusterNetworkPolicy"));
    same_kind && v["metadata"]["name"] == json!(name) && v["metadata"]["namespace"].as_str().unwrap_or_default() == ns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_are_deterministic_and_read_back() {
        let base = super::super::base_cluster();
        let a = generate(&base, 7, 12);
        let b = generate(&base, 7, 12);
        assert_eq!(a.iter().map(|c| &c.yaml).collect::<Vec<_>>(), b.iter().map(|c| &c.yaml).collect::<Vec<_>>());
        assert_ne!(a[0].yaml, generate(&base, 8, 1)[0].yaml);
        for c in &a {
            let case = conformance::parse_case(Path::new("case.yaml"), &c.dir_name, &c.yaml).unwrap_or_else(|e| panic!("{e}\n{}", c.yaml));
            assert!((2..=3).contains(&case.steps.len()));
            assert!(case.steps.iter().all(|s| s.probes.len() == 1));
        }
        // Both verdicts occur across the cases.
        let all: String = a.iter().map(|c| c.yaml.as_str()).collect();
        assert!(all.contains("\"-1") && all.contains("\"-0"));
    }

    #[test]
    fn a_relabelled_pod_is_the_same_pod() {
        let base = super::super::base_cluster();
        let p = base.pod_by_name(&super::super::pod_ref("x/b")).cloned().unwrap();
        let mut m = Manifests::default();
        manifest::parse_value(Path::new("p"), DocRef { document: 1, item: None }, pod_manifest(&p), &mut m).unwrap();
        let mut s = base.clone();
        conformance::apply_step(&mut s, &Step { apply: m.objects, ..Step::default() });
        assert_eq!(s.pod_by_name(&super::super::pod_ref("x/b")), Some(&p));
    }
}
