use super::*;
use crate::testkit::{base_cluster, parse_manifests, pod_ref};

fn cluster(extra: &str) -> Snapshot {
    let mut s = base_cluster();
    for o in parse_manifests(extra).objects {
        o.apply_to(&mut s);
    }
    s
}

fn q(from: &str, to: &str, port: u16) -> Query {
    Query { from: End::parse(from).unwrap(), to: End::parse(to).unwrap(), protocol: Protocol::Tcp, port, family: None }
}

const TWO_ALLOWS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
    - from: [{namespaceSelector: {}}]
      ports: [{port: 80}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-y, namespace: x}
spec:
  podSelector: {}
  ingress:
    - ports: [{port: 81}]
    - from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]
"#;

#[test]
fn every_admitting_rule_is_named_and_isolation_is_reported_when_none_admits() {
    let s = cluster(TWO_ALLOWS);
    let e = explain(&s, &q("y/b", "x/a", 80)).unwrap();
    assert_eq!(e.verdict, Verdict::Allow);
    assert_eq!(e.egress.decided_by, Decider::Default, "{}", to_text(&e));
    assert_eq!(e.ingress.decided_by, Decider::NetworkPolicy);
    let rules: Vec<(String, Option<usize>, &str)> = e.ingress.deciding.iter().map(|r| (r.name.clone(), r.rule, r.action)).collect();
    assert_eq!(rules, [("from-y".to_string(), Some(1), "Allow"), ("web".to_string(), Some(0), "Allow")]);
    assert_eq!(e.ingress.isolated_by, ["policy x/from-y", "policy x/web"]);

    // From z on 80: only web admits; on 82 nothing does.
    let e = explain(&s, &q("z/c", "x/a", 80)).unwrap();
    assert_eq!(e.ingress.deciding.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["web"]);
    let e = explain(&s, &q("z/c", "x/a", 82)).unwrap();
    assert_eq!(e.verdict, Verdict::Deny);
    assert_eq!(e.ingress.decided_by, Decider::NetworkPolicy);
    let isolating: Vec<(&str, &str, Option<usize>)> = e.ingress.deciding.iter().map(|r| (r.name.as_str(), r.action, r.rule)).collect();
    assert_eq!(isolating, [("from-y", "Isolate", None), ("web", "Isolate", None)]);
    assert!(e.ingress.reason.contains("no rule of theirs admits"), "{}", e.ingress.reason);
}

const TIERS: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: guard-x}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}
  ingress:
    - name: y-is-up-to-x
      action: Pass
      from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: y}}}]
    - name: no-z
      action: Deny
      from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: also-10}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}
  ingress:
    - action: Accept
      from: [{namespaces: {}}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: floor}
spec:
  tier: Baseline
  priority: 5
  subject: {namespaces: {}}
  ingress:
    - name: not-from-y
      action: Deny
      from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: y}}}]
"#;

#[test]
fn tiers_decide_in_the_enforced_order() {
    let s = cluster(TIERS);
    // z → x: guard-x denies and also-10 accepts at equal priority: Deny wins.
    let e = explain(&s, &q("z/a", "x/b", 80)).unwrap();
    assert_eq!((e.verdict, e.ingress.decided_by), (Verdict::Deny, Decider::AdminClusterNetworkPolicy), "{}", to_text(&e));
    assert_eq!(e.ingress.deciding.len(), 1);
    let d = &e.ingress.deciding[0];
    assert_eq!(
        (d.kind, d.name.as_str(), d.rule, d.rule_name.as_deref(), d.action),
        ("ClusterNetworkPolicy", "guard-x", Some(1), Some("no-z"), "Deny")
    );
    // y → x: Pass beats Accept; no NetworkPolicy isolates x/b, so Baseline denies.
    let e = explain(&s, &q("y/a", "x/b", 80)).unwrap();
    assert_eq!((e.verdict, e.ingress.decided_by), (Verdict::Deny, Decider::BaselineClusterNetworkPolicy), "{}", to_text(&e));
    assert_eq!(e.ingress.passed.iter().map(|r| r.rule_name.as_deref()).collect::<Vec<_>>(), [Some("y-is-up-to-x")]);
    assert_eq!(e.ingress.deciding[0].name, "floor");
    // x → x: also-10 accepts.
    let e = explain(&s, &q("x/a", "x/b", 80)).unwrap();
    assert_eq!((e.verdict, e.ingress.decided_by), (Verdict::Allow, Decider::AdminClusterNetworkPolicy));
    // y → z: only the Baseline applies.
    let e = explain(&s, &q("y/a", "z/b", 80)).unwrap();
    assert_eq!((e.verdict, e.ingress.decided_by), (Verdict::Deny, Decider::BaselineClusterNetworkPolicy));
    // z → y: nothing matches; the default allows.
    let e = explain(&s, &q("z/a", "y/b", 80)).unwrap();
    assert_eq!((e.verdict, e.ingress.decided_by), (Verdict::Allow, Decider::Default));
    assert!(e.ingress.reason.contains("allowed by default"), "{}", e.ingress.reason);
}

#[test]
fn addresses_and_ends_flock_does_not_enforce() {
    let s = cluster(TWO_ALLOWS);
    // A pod's address is the pod.
    let a = s.pod_by_name(&pod_ref("x/a")).unwrap().ips[0];
    let e = explain(&s, &q("y/b", &a.to_string(), 80)).unwrap();
    assert_eq!(e.to.pod.as_deref(), Some("x/a"));
    assert_eq!(e.ingress.decided_by, Decider::NetworkPolicy);
    // An address outside the cluster: egress only.
    let e = explain(&s, &q("x/a", "198.19.200.1", 443)).unwrap();
    assert_eq!((e.verdict, e.ingress.decided_by), (Verdict::Allow, Decider::NotEnforced));
    assert_eq!(e.family, "IPv4");
    assert!(e.ingress.reason.contains("not a pod"), "{}", e.ingress.reason);
    // Errors name what is wrong.
    assert_eq!(explain(&s, &q("x/nope", "x/a", 80)).unwrap_err(), ExplainError::NoPod(pod_ref("x/nope")));
    assert_eq!(explain(&s, &q("x/a", "x/a", 80)).unwrap_err(), ExplainError::SamePod(pod_ref("x/a")));
    assert!(matches!(End::parse("no-slash"), Err(ExplainError::BadEnd(_))));
    assert!(matches!(explain(&s, &q("x/a", "2001:db8::99", 80)), Err(ExplainError::NoAddress { .. })));
}

#[test]
fn json_has_the_verdict_and_the_deciding_policies() {
    let s = cluster(TWO_ALLOWS);
    let e = explain(&s, &q("y/b", "x/a", 80)).unwrap();
    let v = serde_json::to_value(&e).unwrap();
    assert_eq!(v["verdict"], "Allow");
    assert_eq!(v["ingress"]["decided_by"], "NetworkPolicy");
    let d = &v["ingress"]["deciding"][0];
    assert_eq!((d["kind"].as_str(), d["namespace"].as_str(), d["name"].as_str()), (Some("NetworkPolicy"), Some("x"), Some("from-y")));
    assert_eq!((d["rule"].as_u64(), d["action"].as_str()), (Some(1), Some("Allow")));
    assert_eq!(v["egress"]["deciding"], serde_json::json!([]));
}

#[test]
fn run_pods_are_closed_by_flock_itself() {
    let s = cluster(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: run-1, namespace: x, labels: {flock.dev/run: r1}}
spec: {nodeName: node-1}
status: {phase: Running, podIPs: [{ip: 198.18.1.90}]}
"#,
    );
    let e = explain(&s, &q("x/run-1", "y/a", 80)).unwrap();
    assert_eq!((e.verdict, e.egress.decided_by), (Verdict::Deny, Decider::Flock), "{}", to_text(&e));
    assert_eq!(e.egress.deciding[0].kind, "flock");
}

/// `denies` (the verdict alone, for judging many connections) agrees with `decide` on every
/// pod pair, transport and node of the steps of generated cases (Admin, Baseline and
/// NetworkPolicy shapes, relabels, deletions).
#[test]
fn denies_is_decides_verdict() {
    let base = base_cluster();
    let transports = [
        Transport::Port(Protocol::Tcp, 80),
        Transport::Port(Protocol::Tcp, 81),
        Transport::Port(Protocol::Udp, 80),
        Transport::Port(Protocol::Udp, 81),
        Transport::Port(Protocol::Sctp, 80),
        Transport::Other,
    ];
    let mut checked = 0;
    for g in crate::testkit::cases::generate(&base, 11, 40) {
        let case = crate::conformance::parse_case(std::path::Path::new("case.yaml"), &g.dir_name, &g.yaml).unwrap();
        let mut s = base.clone();
        for step in &case.steps {
            crate::conformance::apply_step(&mut s, step);
            for node in ["node-1", "node-2"] {
                let np = translate::translate(&s, &s.derived_endpoints(node), &translate::Options::default());
                for ep in &np.endpoints {
                    for peer in s.pods().flat_map(|p| p.ips.iter().copied()) {
                        for dir in [Direction::Ingress, Direction::Egress] {
                            for t in transports {
                                let full = decide_transport(&np, ep, dir, peer, t).verdict == Verdict::Deny;
                                assert_eq!(denies(&np, ep, dir, peer, t), full, "{}: {} {dir} {peer} {t:?}", g.dir_name, ep.pod);
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 50_000, "{checked}");
}

/// A host-network pod is its node: named as an end it stands for its node's address (its
/// node's InternalIP when its status has none); a pod's flow to it meets the pod's egress,
/// its flow to a pod of its own node is the node's own (not policed), to a pod of another
/// node it meets that pod's ingress.
#[test]
fn host_network_pods_are_their_node() {
    let s = cluster(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: kubelet, namespace: kube-system}
spec: {nodeName: node-1, hostNetwork: true}
status: {phase: Running}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: x}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}
"#,
    );
    // x/a (node-1) to its node's kubelet: its egress denies it.
    let e = explain(&s, &q("x/a", "kube-system/kubelet", 10250)).unwrap();
    assert_eq!(e.to.address.to_string(), "198.18.0.1");
    assert_eq!((e.verdict, e.egress.decided_by, e.ingress.decided_by), (Verdict::Deny, Decider::NetworkPolicy, Decider::NotEnforced));
    assert!(e.ingress.reason.contains("host-network pod"), "{}", e.ingress.reason);
    // The kubelet to x/a, on its own node: not policed, though x/a's ingress is isolated.
    let e = explain(&s, &q("kube-system/kubelet", "x/a", 80)).unwrap();
    assert_eq!((e.verdict, e.ingress.decided_by), (Verdict::Allow, Decider::NotEnforced), "{}", to_text(&e));
    assert!(e.ingress.reason.contains("own node node-1"), "{}", e.ingress.reason);
    // ... and to x/b, on node-2: x/b's ingress policy decides.
    let e = explain(&s, &q("kube-system/kubelet", "x/b", 80)).unwrap();
    assert_eq!((e.verdict, e.ingress.decided_by), (Verdict::Deny, Decider::NetworkPolicy), "{}", to_text(&e));
}
