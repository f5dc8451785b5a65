//! ClusterNetworkPolicy through the whole pure pipeline (translate → render → in-memory nft →
//! packet tracer) on the conformance base cluster: the points the API leaves to flock
//! (equal priorities, fail-closed readings) and how the tiers meet flock's own isolation.
//! The API's semantics proper are checked by the conformance cases (`tests/conformance/`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use flock::model::Protocol::Tcp;
use flock::model::cnp::{ClusterNetworkPolicy, from_json};
use flock::model::{LocalEndpoint, ObjectRef, Snapshot};
use flock::testkit::{TracedCluster, base_cluster, policies};
use flock::translate::{self, Direction, Options};
use serde_json::{Value, json};

fn cnp(name: &str, tier: &str, priority: i64, subject: Value, ingress: Value, egress: Value) -> ClusterNetworkPolicy {
    from_json(&json!({"metadata": {"name": name}, "spec": {"tier": tier, "priority": priority, "subject": subject, "ingress": ingress, "egress": egress}}))
        .unwrap()
}

fn ns(name: &str) -> Value {
    json!({"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": name}}})
}

fn with(cnps: Vec<ClusterNetworkPolicy>, nps: &str) -> Snapshot {
    let mut s = base_cluster();
    for p in cnps {
        s.upsert_cluster_policy(p);
    }
    if !nps.is_empty() {
        for p in policies(nps) {
            s.upsert_policy(p);
        }
    }
    s
}

/// The 9×9 matrix on TCP `port` as the conformance rows (`-` on the diagonal).
fn matrix(s: &Snapshot, port: u16) -> Vec<String> {
    let c = TracedCluster::build(s);
    flock::testkit::BASE_PODS
        .iter()
        .map(|from| {
            flock::testkit::BASE_PODS
                .iter()
                .map(|to| {
                    if from == to {
                        '-'
                    } else if c.connected(from, to, Tcp, port, None).unwrap() {
                        '1'
                    } else {
                        '0'
                    }
                })
                .collect()
        })
        .collect()
}

#[test]
fn equal_priorities_take_deny_over_pass_over_accept_whatever_the_names() {
    // Two Admin policies at priority 5 select x: one accepts from y, one denies from y.
    // Whichever name sorts first, y -> x is denied; z -> x falls through (allowed).
    for (accept_name, deny_name) in [("a-accept", "b-deny"), ("b-accept", "a-deny")] {
        let s = with(
            vec![
                cnp(accept_name, "Admin", 5, ns("x"), json!([{"action": "Accept", "from": [ns("y")]}]), json!(null)),
                cnp(deny_name, "Admin", 5, ns("x"), json!([{"action": "Deny", "from": [ns("y")]}]), json!(null)),
            ],
            "",
        );
        let m = matrix(&s, 80);
        assert_eq!(m[3], "000-11111", "{accept_name}/{deny_name}: y/a -> x/*");
        assert_eq!(m[6], "111111-11", "{accept_name}/{deny_name}: z/a -> x/*");
        // Reported: the order is the API's to leave undefined, flock's to choose.
        let eps = s.derived_endpoints("node-1");
        let np = translate::translate(&s, &eps, &Options::default());
        assert!(
            np.problems.iter().any(|p| p.field == "spec.priority" && p.message.contains("Deny over Pass over Accept")),
            "{:?}",
            np.problems
        );
    }
    // Pass beats Accept: with a NetworkPolicy denying y -> x, a tie of Pass and Accept passes,
    // so the NetworkPolicy denies.
    let s = with(
        vec![
            cnp("a", "Admin", 5, ns("x"), json!([{"action": "Accept", "from": [ns("y")]}]), json!(null)),
            cnp("b", "Admin", 5, ns("x"), json!([{"action": "Pass", "from": [ns("y")]}]), json!(null)),
        ],
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: x}\nspec: {podSelector: {}}",
    );
    assert_eq!(matrix(&s, 80)[3], "000-11111");
    // Within one policy, rule order stands: Accept x/a... first, then Deny all of y.
    let s = with(
        vec![
            cnp(
                "ordered",
                "Admin",
                5,
                ns("x"),
                json!([{"action": "Accept", "from": [{"pods": {"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "a"}}}}]},
                       {"action": "Deny", "from": [ns("y")]}]),
                json!(null),
            ),
            cnp("other", "Admin", 5, ns("z"), json!([{"action": "Deny", "from": [ns("x")]}]), json!(null)),
        ],
        "",
    );
    let m = matrix(&s, 80);
    assert_eq!(m[3], "111-11111", "y/a is accepted by the first rule");
    assert_eq!(m[4], "0001-1111", "y/b is denied by the second");
}

#[test]
fn what_flock_cannot_read_fails_closed_through_the_whole_pipeline() {
    // A Deny rule with a peer flock does not know denies all ingress of its subject; an
    // Accept rule with one matches nothing (the NetworkPolicy still denies).
    let unknown_peer = json!([{"action": "Deny", "from": [{"services": {"name": "x"}}]}]);
    let s = with(vec![cnp("guard", "Admin", 1, ns("x"), unknown_peer, json!(null))], "");
    let m = matrix(&s, 80);
    for row in &m {
        assert_eq!(&row[..3].replace('-', "0"), "000", "nobody reaches x: {m:?}");
    }
    let accept_unknown = json!([{"action": "Accept", "from": [{"services": {"name": "x"}}]}]);
    let s = with(
        vec![cnp("open", "Admin", 1, ns("x"), accept_unknown, json!(null))],
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: x}\nspec: {podSelector: {}}",
    );
    assert_eq!(matrix(&s, 80)[3], "000-11111", "the Accept rule matched nothing: the NetworkPolicy denies");
    // A Pass rule flock cannot read denies all, not passes.
    let pass_unknown = json!([{"action": "Pass", "from": [{}]}]);
    let s = with(vec![cnp("pass", "Admin", 1, ns("x"), pass_unknown, json!(null))], "");
    assert_eq!(matrix(&s, 80)[3], "000-11111");
}

#[test]
fn flocks_own_isolation_is_above_every_tier() {
    // A run pod (flock.dev/run) without its policy stays egress-closed under an Admin Accept
    // of all egress.
    let mut s = with(
        vec![cnp(
            "open-egress",
            "Admin",
            0,
            json!({"namespaces": {}}),
            json!(null),
            json!([{"action": "Accept", "to": [{"namespaces": {}}]}]),
        )],
        "",
    );
    let uid = s.pod_by_name(&ObjectRef::new("x", "a")).unwrap().uid.clone();
    let mut pod = s.pod(&uid).unwrap().clone();
    pod.labels.insert(flock::model::RUN_LABEL, "job-1");
    s.upsert_pod(pod);
    let m = matrix(&s, 80);
    assert_eq!(m[0], "-00000000", "the run pod's egress is closed: {m:?}");
    assert_eq!(m[1], "1-1111111", "other pods are open");
    // An endpoint whose Pod flock does not know is closed both ways, whatever the tiers.
    let ghost = LocalEndpoint {
        interface: flock_cni::host_interface_name("ghost", "eth0"),
        container_id: "ghost".into(),
        pod: ObjectRef::new("x", "ghost"),
        pod_uid: None,
        addrs: vec!["198.18.1.99".parse().unwrap()],
    };
    let np = translate::translate(&s, &[ghost], &Options::default());
    let ep = &np.endpoints[0];
    for dir in [Direction::Ingress, Direction::Egress] {
        let d = ep.direction(dir);
        assert!(d.is_isolated() && d.rules.is_empty() && d.admin.is_empty() && d.baseline.is_empty(), "{dir}: {d:?}");
    }
}

#[test]
fn a_policy_that_passes_everything_changes_nothing() {
    let nps = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: b-from-y, namespace: x}\n\
               spec: {podSelector: {matchLabels: {pod: b}}, ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}]}]}";
    let baseline = cnp("base", "Baseline", 3, ns("z"), json!([{"action": "Deny", "from": [ns("x")]}]), json!(null));
    let pass_all = cnp(
        "pass-all",
        "Admin",
        0,
        json!({"namespaces": {}}),
        json!([{"action": "Pass", "from": [{"namespaces": {}}]}]),
        json!([{"action": "Pass", "to": [{"namespaces": {}}, {"networks": ["0.0.0.0/0", "::/0"]}]}]),
    );
    let without = with(vec![baseline.clone()], nps);
    let with_pass = with(vec![baseline, pass_all], nps);
    for port in [80, 81] {
        assert_eq!(matrix(&without, port), matrix(&with_pass, port), "port {port}");
    }
}

#[test]
fn a_nodes_peer_matches_the_addresses_of_the_selected_nodes_not_their_pods() {
    // Base cluster: node-1 is 198.18.0.1, node-2 198.18.0.2 (hostname labels node-1/node-2).
    let node1 = json!({"nodes": {"matchLabels": {"kubernetes.io/hostname": "node-1"}}});
    let s = with(
        vec![
            cnp("x-no-nodes", "Admin", 1, ns("x"), json!(null), json!([{"action": "Deny", "to": [{"nodes": {}}]}])),
            cnp("y-node-1", "Admin", 2, ns("y"), json!(null), json!([{"action": "Accept", "to": [node1]}])),
            cnp("y-rest", "Admin", 3, ns("y"), json!(null), json!([{"action": "Deny", "to": [{"networks": ["0.0.0.0/0"]}]}])),
        ],
        "",
    );
    let c = TracedCluster::build(&s);
    let (n1, n2, outside) = ("198.18.0.1".parse().unwrap(), "198.18.0.2".parse().unwrap(), "198.19.0.9".parse().unwrap());
    for pod in ["x/a", "x/b", "x/c"] {
        assert!(!c.reaches_address(pod, n1, Tcp, 10250).unwrap(), "{pod} -> node-1");
        assert!(!c.reaches_address(pod, n2, Tcp, 10250).unwrap(), "{pod} -> node-2");
        assert!(c.reaches_address(pod, outside, Tcp, 443).unwrap(), "{pod} -> outside");
    }
    for pod in ["y/a", "y/b", "y/c"] {
        assert!(c.reaches_address(pod, n1, Tcp, 10250).unwrap(), "{pod} -> node-1");
        assert!(!c.reaches_address(pod, n2, Tcp, 10250).unwrap(), "{pod} -> node-2");
    }
    // Pods on the denied nodes stay reachable from x: node addresses are not pod addresses.
    assert_eq!(matrix(&s, 80)[0], "-11111111");
    // A node's labels changing moves its addresses in or out of the set.
    let mut s2 = s.clone();
    let mut n = s2.nodes().find(|n| n.name == "node-2").unwrap().clone();
    n.labels.insert("kubernetes.io/hostname", "node-1");
    s2.upsert_node(n);
    assert!(TracedCluster::build(&s2).reaches_address("y/a", n2, Tcp, 10250).unwrap());
}

/// Every ruleset the ClusterNetworkPolicy cases render (each step, each node, both bases) loads
/// with `nft -c`: SCTP rules included, which this kernel cannot carry traffic for.
#[test]
fn every_cluster_policy_case_renders_rules_nft_accepts() {
    use flock::apply::Backend;
    use flock::apply::kernel::NftCli;
    use flock::testkit::kernel::{NetnsGuard, require_root};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let v6_base = flock::source::files::load_manifests(&[root.join("conformance-v6/base-cluster.yaml")]).unwrap().to_snapshot();
    let v4_cases: Vec<_> = flock::source::files::find_cases(&[root.join("conformance")])
        .unwrap()
        .into_iter()
        .filter(|d| std::fs::read_to_string(d.join("case.yaml")).unwrap().contains("kind: ClusterNetworkPolicy"))
        .collect();
    let v6_cases = flock::source::files::ipv6_cluster_policy_cases(&root.join("conformance"), &root.join("conformance-v6")).unwrap();
    let mut renders = std::collections::BTreeSet::new();
    for (base, cases) in [(base_cluster(), &v4_cases), (v6_base, &v6_cases)] {
        for dir in cases {
            let case = flock::source::files::load_case(dir).unwrap();
            let mut s = base.clone();
            for step in &case.steps {
                flock::conformance::apply_step(&mut s, step);
                for node in ["node-1", "node-2"] {
                    let eps = s.derived_endpoints(node);
                    renders.insert(flock::render::render(&translate::translate(&s, &eps, &Options::default())).to_text());
                }
            }
        }
    }
    assert!(renders.iter().any(|t| t.contains("sctp dport 80")), "an SCTP rule is among the renders");
    if !require_root("every_cluster_policy_case_renders_rules_nft_accepts") {
        return;
    }
    let ns = NetnsGuard::new("cnp-check");
    let mut nft = NftCli::new(ns.netns());
    for text in &renders {
        if let Err(e) = nft.check(text) {
            panic!("nft -c rejected a render: {e}\n{text}");
        }
    }
    eprintln!("nft -c accepted all {} distinct renders of {} + {} cases", renders.len(), v4_cases.len(), v6_cases.len());
}
