//! Audit mode (`flock.dev/enforcement: audit`, honoured with `Options::audit_mode`): audited
//! policies are not enforced — the `forward` chain gives the verdict of the cluster without
//! them — and what they would deny is logged by the `audit` base chain, which accepts
//! everything. Checked pair by pair through the packet tracer against `flockctl explain`
//! (its enforced verdict and its audit verdicts), and against the cluster with the audited
//! policies removed (enforced view) or their annotation dropped (what audit foresees).
//! Without audit mode the annotation changes nothing; a sandboxed run's pod is never
//! audited.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::net::IpAddr;

use flock::apply::{Applier, fake::FakeNft};
use flock::explain::{End, Explainer, Query, Verdict};
use flock::model::{Protocol, Snapshot};
use flock::nft::Table;
use flock::nft::trace::{Ct, L4, Packet, trace};
use flock::render::{self, AUDIT_BASE_CHAIN, BASE_CHAIN};
use flock::testkit::{BASE_PODS, UPLINK, base_cluster, parse_manifests, pod_ref};
use flock::translate::{self, Options};

const AUDIT: Options = Options { isolate_run_pods: true, audit_mode: true, dns_resolvers: None, overlay_port: None, overlay_node: None };
const ENFORCE: Options = Options { isolate_run_pods: true, audit_mode: false, dns_resolvers: None, overlay_port: None, overlay_node: None };

/// Scenarios on the base cluster: (name, manifests).
const SCENARIOS: &[(&str, &str)] = &[
    (
        "an audited default-deny beside an enforced policy",
        r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: x, annotations: {flock.dev/enforcement: audit}}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-from-y, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}], ports: [{port: 80}]}]
"#,
    ),
    (
        "a namespace in audit mode; another value enforces",
        r#"
apiVersion: v1
kind: Namespace
metadata: {name: z, labels: {kubernetes.io/metadata.name: z}, annotations: {flock.dev/enforcement: audit}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: only-x, namespace: z}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: y-egress, namespace: y, annotations: {flock.dev/enforcement: Audit}}
spec:
  podSelector: {matchLabels: {pod: c}}
  policyTypes: [Egress]
  egress: [{to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: z}}}]}]
"#,
    ),
    (
        "audited cluster policies in both tiers",
        r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: no-y-to-x, annotations: {flock.dev/enforcement: audit}}
spec:
  tier: Admin
  priority: 5
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}
  ingress:
    - {name: from-y, action: Deny, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: y}}}]}
    - {name: z-passes, action: Pass, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: floor}
spec:
  tier: Baseline
  priority: 5
  subject: {namespaces: {}}
  ingress:
    - {action: Deny, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: audited-floor, annotations: {flock.dev/enforcement: audit}}
spec:
  tier: Baseline
  priority: 6
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: y}}}
  egress:
    - {action: Deny, to: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {pod: b}}}}]}
"#,
    ),
];

fn cluster(manifests: &str) -> Snapshot {
    let mut s = base_cluster();
    for o in parse_manifests(manifests).objects {
        o.apply_to(&mut s);
    }
    s
}

/// The snapshot without the audited policies (`drop`), or with them all enforced.
fn variant(s: &Snapshot, drop: bool) -> Snapshot {
    let mut out = s.clone();
    let audit_ns: Vec<String> = s.namespaces().filter(|n| n.audit).map(|n| n.name.clone()).collect();
    for p in s.policies() {
        if p.audit || audit_ns.contains(&p.namespace) {
            if drop {
                out.remove_policy(&p.key());
            } else {
                out.upsert_policy(flock::model::NetworkPolicy { audit: false, ..p.clone() });
            }
        }
    }
    for p in s.cluster_policies() {
        if p.audit {
            if drop {
                out.remove_cluster_policy(&p.name);
            } else {
                out.upsert_cluster_policy(flock::model::cnp::ClusterNetworkPolicy { audit: false, ..p.clone() });
            }
        }
    }
    for ns in audit_ns {
        let mut n = s.namespace(&ns).unwrap().clone();
        n.audit = false;
        out.upsert_namespace(n);
    }
    out
}

/// Each node's table, and each pod's (node, interface, addresses).
struct Nodes {
    tables: BTreeMap<String, Table>,
    /// Each node's table as `flockctl explain --live` reads it.
    live: BTreeMap<String, flock::explain::live::LiveTable>,
    pods: BTreeMap<String, (String, String, Vec<IpAddr>)>,
}

fn nodes(s: &Snapshot, options: &Options) -> Nodes {
    let (mut tables, mut pods, mut live) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for node in ["node-1", "node-2"] {
        let eps = s.derived_endpoints(node);
        let rs = render::render(&translate::translate(s, &eps, options));
        let mut a = Applier::new(FakeNft::new());
        a.apply(&rs).unwrap_or_else(|e| panic!("{node}: {e}\n{}", rs.to_text()));
        tables.insert(node.to_string(), a.backend().table().unwrap().clone());
        let listing = flock::nft::canonical(&rs.to_text()).unwrap();
        live.insert(node.to_string(), flock::explain::live::LiveTable::parse(&listing).unwrap());
        for ep in eps {
            pods.insert(ep.pod.to_string(), (node.to_string(), ep.interface.clone(), ep.addrs.clone()));
        }
    }
    Nodes { tables, live, pods }
}

/// What the tables do with a new connection from `from` to `to`: whether `forward` lets it
/// through every node on the way, and which audit log chains the `audit` base chains sent
/// it to (`audit-ingress-log-…` or `audit-egress-log-…`), in order.
fn traced(n: &Nodes, from: &str, to: &str, port: u16) -> (bool, Vec<String>) {
    let (src_node, src_if, src_ips) = &n.pods[from];
    let (dst_node, dst_if, dst_ips) = &n.pods[to];
    let hops: Vec<(&str, &str, &str)> =
        if src_node == dst_node { vec![(src_node, src_if, dst_if)] } else { vec![(src_node, src_if, UPLINK), (dst_node, UPLINK, dst_if)] };
    let (mut allowed, mut audited) = (true, Vec::new());
    // A packet `forward` drops goes no further: the next node never sees it.
    for (node, iif, oif) in hops {
        if !allowed {
            break;
        }
        let table = &n.tables[node];
        let pkt = Packet { iif: iif.into(), oif: oif.into(), src: src_ips[0], dst: dst_ips[0], l4: L4::Tcp, dport: port, ct: Ct::New };
        if table.chains.contains_key(AUDIT_BASE_CHAIN) {
            let t = trace(table, AUDIT_BASE_CHAIN, &pkt).unwrap();
            assert_eq!(t.verdict, flock::nft::trace::Verdict::Accept, "the audit chain never drops: {t}");
            audited.extend(t.path.iter().filter(|s| s.chain.starts_with("audit-") && s.chain.contains("-log-")).map(|s| s.chain.clone()));
        }
        allowed = trace(table, BASE_CHAIN, &pkt).unwrap().verdict == flock::nft::trace::Verdict::Accept;
    }
    audited.dedup();
    (allowed, audited)
}

#[test]
fn audited_policies_are_logged_not_enforced() {
    let (mut audited_cells, mut cells) = (0, 0);
    for (name, manifests) in SCENARIOS {
        let s = cluster(manifests);
        let without = variant(&s, true);
        let all = variant(&s, false);
        let n = nodes(&s, &AUDIT);
        let (mut explainer, mut without_x, mut all_x) =
            (Explainer::new(&s, AUDIT), Explainer::new(&without, ENFORCE), Explainer::new(&all, ENFORCE));
        for from in BASE_PODS {
            for to in BASE_PODS {
                if from == to {
                    continue;
                }
                for port in [80, 81] {
                    let q = Query { from: End::Pod(pod_ref(from)), to: End::Pod(pod_ref(to)), protocol: Protocol::Tcp, port, family: None };
                    let cell = format!("{name}: {from} -> {to} :{port}");
                    let e = explainer.explain(&q).unwrap();
                    let (allowed, audit_logs) = traced(&n, from, to, port);
                    cells += 1;
                    // Enforced: as if the audited policies did not exist.
                    let want = without_x.explain(&q).unwrap().verdict == Verdict::Allow;
                    assert_eq!(allowed, want, "{cell}: forward");
                    assert_eq!(e.verdict == Verdict::Allow, want, "{cell}: explain\n{}", flock::explain::to_text(&e));
                    // Audit: each node evaluates the audited views of its end of the flow, as
                    // it enforces: the source's egress; then the destination's ingress — on
                    // the same node unless the audited egress would deny, on another node
                    // when the packet got there (the enforced egress let it out).
                    let denies = |d: &flock::explain::DirectionExplanation| d.audit.as_ref().is_some_and(|a| a.verdict == Verdict::Deny);
                    let same_node = e.from.node == e.to.node;
                    let mut expect: Vec<&str> = Vec::new();
                    if denies(&e.egress) {
                        expect.push("audit-egress-log-");
                    }
                    let ingress_reached = if same_node { !denies(&e.egress) } else { e.egress.verdict == Verdict::Allow };
                    if ingress_reached && denies(&e.ingress) {
                        expect.push("audit-ingress-log-");
                    }
                    let got: Vec<&str> = audit_logs
                        .iter()
                        .map(|c| if c.starts_with("audit-egress") { "audit-egress-log-" } else { "audit-ingress-log-" })
                        .collect();
                    assert_eq!(got, expect, "{cell}: audit logs {audit_logs:?}\n{}", flock::explain::to_text(&e));
                    // What the audit foresees is what enforcing the audited policies does, for
                    // the directions they apply to.
                    let enforced_all = all_x.explain(&q).unwrap();
                    for (d, a) in [(&e.egress, &enforced_all.egress), (&e.ingress, &enforced_all.ingress)] {
                        if let Some(view) = &d.audit {
                            assert_eq!(view.verdict, a.verdict, "{cell}: the audit view");
                        }
                    }
                    // `explain --live` on a node holding both ends says the same.
                    if same_node {
                        let node = e.from.node.clone().unwrap();
                        let l = n.live[&node].explain(&q).unwrap();
                        assert_eq!(l.audit.as_ref().map(|r| !r.is_empty()), Some(!expect.is_empty()), "{cell}: live {:?}", l.audit);
                        assert_eq!(l.verdict, e.verdict, "{cell}: live");
                    }
                    audited_cells += usize::from(!expect.is_empty());
                }
            }
        }
    }
    eprintln!("{cells} cells, {audited_cells} audited denials");
    assert!(audited_cells > 40, "{audited_cells}");
}

#[test]
fn without_audit_mode_the_annotation_changes_nothing() {
    for (name, manifests) in SCENARIOS {
        let s = cluster(manifests);
        let all = variant(&s, false);
        for node in ["node-1", "node-2"] {
            let eps = s.derived_endpoints(node);
            let annotated = render::render(&translate::translate(&s, &eps, &ENFORCE)).to_text();
            let plain = render::render(&translate::translate(&all, &eps, &ENFORCE)).to_text();
            assert_eq!(annotated, plain, "{name} {node}");
            assert!(!annotated.contains("chain audit"), "{name} {node}");
        }
    }
}

#[test]
fn a_sandboxed_runs_pod_and_policy_are_never_audited() {
    let s = cluster(
        r#"
apiVersion: v1
kind: Pod
metadata: {name: run-1, namespace: x, labels: {flock.dev/run: r1}}
spec: {nodeName: node-1}
status: {phase: Running, podIPs: [{ip: 198.18.1.90}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: run-1-egress, namespace: x, labels: {flock.dev/run: r1}, annotations: {flock.dev/enforcement: audit}}
spec:
  podSelector: {matchLabels: {flock.dev/run: r1}}
  policyTypes: [Egress]
  egress: [{to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: everything-denied, namespace: x, annotations: {flock.dev/enforcement: audit}}
spec: {podSelector: {}, policyTypes: [Egress]}
"#,
    );
    // The run's own policy, labelled flock.dev/run, is read as not audited at all.
    assert!(!s.policy(&pod_ref("x/run-1-egress")).unwrap().audit);
    let np = translate::translate(&s, &s.derived_endpoints("node-1"), &AUDIT);
    let run = np.endpoints.iter().find(|e| e.pod.to_string() == "x/run-1").unwrap();
    // Every policy selecting the run's pod is enforced, the audited one too: its egress is
    // isolated by both, with no audit view.
    let by: Vec<String> = run.egress.isolated_by.iter().map(ToString::to_string).collect();
    assert_eq!(by, ["run pod", "policy x/everything-denied", "policy x/run-1-egress"]);
    assert!(run.egress.audit.is_none());
    // Another pod of x: audited.
    let xa = np.endpoints.iter().find(|e| e.pod.to_string() == "x/a").unwrap();
    assert!(xa.egress.isolated_by.is_empty() && xa.egress.audit.is_some());
}

#[test]
fn a_namespace_can_ask_for_allowed_connections_to_be_logged() {
    let s = cluster(
        r#"
apiVersion: v1
kind: Namespace
metadata: {name: x, labels: {kubernetes.io/metadata.name: x}, annotations: {flock.dev/log-allowed: "true"}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-y, namespace: x}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: y}}}], ports: [{port: 80}]}]
"#,
    );
    let n = nodes(&s, &ENFORCE);
    let mut explainer = Explainer::new(&s, ENFORCE);
    let mut logged = 0;
    for from in BASE_PODS {
        for to in BASE_PODS {
            if from == to {
                continue;
            }
            let (src_node, src_if, src_ips) = &n.pods[from];
            let (dst_node, dst_if, dst_ips) = &n.pods[to];
            let q = Query { from: End::Pod(pod_ref(from)), to: End::Pod(pod_ref(to)), protocol: Protocol::Tcp, port: 80, family: None };
            let e = explainer.explain(&q).unwrap();
            let (egress, ingress) = (e.egress.verdict == Verdict::Allow, e.ingress.verdict == Verdict::Allow);
            let mut allow_logs = Vec::new();
            let hops: Vec<(&str, &str, &str)> = if src_node == dst_node {
                vec![(src_node, src_if, dst_if)]
            } else {
                vec![(src_node, src_if, UPLINK), (dst_node, UPLINK, dst_if)]
            };
            for (node, iif, oif) in hops {
                let pkt =
                    Packet { iif: iif.into(), oif: oif.into(), src: src_ips[0], dst: dst_ips[0], l4: L4::Tcp, dport: 80, ct: Ct::New };
                let t = trace(&n.tables[node], BASE_CHAIN, &pkt).unwrap();
                allow_logs.extend(t.path.iter().filter(|s| s.rule.contains("log prefix \"flock:allow:")).map(|s| s.rule.clone()));
            }
            // Logged: what the policy of a pod of x allows, at its end of the flow (an
            // ingress only once the egress let the packet go).
            let mut want = Vec::new();
            if egress && from.starts_with("x/") {
                want.push("egress");
            }
            if egress && ingress && to.starts_with("x/") {
                want.push("ingress");
            }
            let got: Vec<&str> = allow_logs.iter().map(|r| if r.contains(":egress:") { "egress" } else { "ingress" }).collect();
            assert_eq!(got, want, "{from} -> {to}: {allow_logs:?}");
            logged += got.len();
        }
    }
    assert!(logged > 20, "{logged}");
    // The verdicts are those without the annotation.
    let mut plain = s.clone();
    plain.upsert_namespace(flock::model::Namespace { log_allowed: false, ..s.namespace("x").unwrap().clone() });
    let p = nodes(&plain, &ENFORCE);
    for from in BASE_PODS {
        for to in BASE_PODS {
            if from != to {
                assert_eq!(traced(&n, from, to, 80).0, traced(&p, from, to, 80).0, "{from} -> {to}");
            }
        }
    }
}
