//! flockctl's live mode at the library edge: one list of every resource the agent reads
//! (`flock::source::kube::list_cluster`) against the in-repo API server — the same snapshot
//! as the manifests it was loaded from (checked through the rulesets they render), pages
//! followed, unreadable objects left out and named, RBAC refusals named by verb and
//! resource.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/uids.rs"]
mod uids;

use std::fmt::Write as _;
use std::path::PathBuf;

use flock::model::Snapshot;
use flock::source::kube::{ListError, list_cluster};
use flock::translate::{self, Options};
use flock_test_apiserver::{ApiServer, FailRule, load};
use serde_json::json;

const BASE: &str = "tests/conformance/base-cluster.yaml";

fn manifest(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(name)
}

/// Every node's ruleset text: what the snapshot means to the agents.
fn rulesets(s: &Snapshot) -> Vec<(String, String)> {
    let mut nodes: Vec<String> = s.nodes().map(|n| n.name.clone()).chain(s.pods().filter_map(|p| p.node.clone())).collect();
    nodes.sort();
    nodes.dedup();
    nodes
        .into_iter()
        .map(|node| {
            let policy = translate::translate(s, &s.derived_endpoints(&node), &Options::default());
            let text = flock::render::render(&policy).to_text();
            (node, text)
        })
        .collect()
}

/// A scratch file, removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Many pods (more than a list page) with policies selecting some of them.
fn big_cluster() -> Scratch {
    let mut text = String::new();
    for i in 0..1_234 {
        let (ns, node) = (["x", "y", "z"][i % 3], ["node-1", "node-2"][i % 2]);
        let ip = format!("198.18.{}.{}", 10 + i / 250, 1 + i % 250);
        let uid = flock::model::derived_uid(ns, &format!("p{i}"));
        write!(
            text,
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}, namespace: {ns}, uid: {uid}, labels: {{app: a{}}}}}\n\
             spec: {{nodeName: {node}, containers: [{{name: c, ports: [{{containerPort: 80, name: http}}]}}]}}\n\
             status: {{phase: Running, podIP: {ip}, podIPs: [{{ip: {ip}}}]}}\n",
            i % 7
        )
        .unwrap();
    }
    text.push_str(
        "---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web, namespace: x}\n\
         spec: {podSelector: {matchLabels: {app: a1}}, ingress: [{from: [{podSelector: {matchLabels: {app: a2}}}], ports: [{port: http}]}]}\n",
    );
    let path = std::env::temp_dir().join(format!("flock-kube-list-{}.yaml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    Scratch(path)
}

const POLICIES: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web, namespace: x}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
    - from: [{namespaceSelector: {matchLabels: {ns: y}}, podSelector: {matchExpressions: [{key: pod, operator: In, values: [b, c]}]}}]
      ports: [{port: 80}, {port: 81, protocol: UDP}]
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: guard-x}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}
  ingress:
    - {name: no-z, action: Deny, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}}]}
---
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: default-deny}
spec:
  tier: Baseline
  priority: 1
  subject: {namespaces: {}}
  egress:
    - {name: no-networks, action: Deny, to: [{networks: [198.19.0.0/16]}]}
"#;

#[tokio::test]
async fn one_list_gives_the_snapshot_the_manifests_give() {
    let big = big_cluster();
    let policies = Scratch(std::env::temp_dir().join(format!("flock-kube-list-policies-{}.yaml", std::process::id())));
    std::fs::write(&policies.0, POLICIES).unwrap();
    // The base cluster with its pods' uids written out, as the big one has them: the API
    // server would assign others, and interface names follow uids.
    let base = Scratch(std::env::temp_dir().join(format!("flock-kube-list-base-{}.yaml", std::process::id())));
    std::fs::write(&base.0, uids::with_derived_uids(&std::fs::read_to_string(manifest(BASE)).unwrap())).unwrap();
    for paths in [vec![base.0.clone(), policies.0.clone()], vec![big.0.clone()]] {
        let server = ApiServer::start_temp().await.unwrap();
        load::install_crds(&server).unwrap();
        load::load_manifests(&server, &paths).unwrap();
        let listed = list_cluster(&server.client()).await.unwrap();
        assert!(listed.unreadable.is_empty(), "{:?}", listed.unreadable);
        assert!(listed.cluster_policies_served);
        let from_files = flock::source::files::load_manifests(&paths).unwrap().into_snapshot();
        assert_eq!(listed.snapshot.pod_count(), from_files.pod_count(), "{paths:?}");
        assert_eq!(rulesets(&listed.snapshot), rulesets(&from_files), "{paths:?}");
        // Pages: more than one list request per resource when there are more objects.
        if from_files.pod_count() > 500 {
            let pod_lists = server.requests().iter().filter(|r| r.path.ends_with("/pods") && !r.watch).count();
            assert!(pod_lists >= 3, "{pod_lists} pod lists for {} pods", from_files.pod_count());
        }
        server.shutdown().await;
    }
}

#[tokio::test]
async fn cluster_policies_are_listed_and_an_absent_crd_is_an_empty_list() {
    let server = ApiServer::start_temp().await.unwrap();
    server.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}})).unwrap();
    let listed = list_cluster(&server.client()).await.unwrap();
    assert!(!listed.cluster_policies_served);
    assert_eq!(listed.snapshot.cluster_policies().count(), 0);

    load::install_crds(&server).unwrap();
    server
        .apply(json!({"apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy", "metadata": {"name": "guard"},
                      "spec": {"tier": "Admin", "priority": 5, "subject": {"namespaces": {}},
                               "ingress": [{"name": "deny", "action": "Deny", "from": [{"namespaces": {}}]}]}}))
        .unwrap();
    let listed = list_cluster(&server.client()).await.unwrap();
    assert!(listed.cluster_policies_served);
    assert_eq!(listed.snapshot.cluster_policies().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["guard"]);
    server.shutdown().await;
}

#[tokio::test]
async fn an_object_flock_cannot_read_is_left_out_and_named() {
    let server = ApiServer::start_temp().await.unwrap();
    server.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}})).unwrap();
    server
        .apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "odd", "namespace": "x", "uid": "u-odd"},
                      "spec": {"nodeName": "node-1", "containers": []},
                      "status": {"phase": "Running", "podIPs": [{"ip": "not-an-address"}]}}))
        .unwrap();
    server
        .apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "fine", "namespace": "x"},
                      "spec": {"nodeName": "node-1", "containers": []},
                      "status": {"phase": "Running", "podIPs": [{"ip": "198.18.0.9"}]}}))
        .unwrap();
    let listed = list_cluster(&server.client()).await.unwrap();
    assert_eq!(listed.snapshot.pod_count(), 1);
    assert_eq!(listed.unreadable.len(), 1, "{:?}", listed.unreadable);
    assert!(listed.unreadable[0].starts_with("pods Pod(\"u-odd\")"), "{}", listed.unreadable[0]);
    assert!(listed.unreadable[0].contains("not-an-address"), "{}", listed.unreadable[0]);
    server.shutdown().await;
}

#[tokio::test]
async fn an_rbac_refusal_names_the_verb_and_the_resource() {
    let server = ApiServer::start_temp().await.unwrap();
    server.fail_requests(FailRule::new(usize::MAX, 403).path_contains("/networkpolicies"));
    let e = list_cluster(&server.client()).await.unwrap_err();
    assert!(matches!(e, ListError::Forbidden { resource: "networkpolicies", .. }), "{e:?}");
    let message = e.to_string();
    assert!(message.contains("cannot list networkpolicies") && message.contains("`list` verb"), "{message}");
    server.shutdown().await;
}
