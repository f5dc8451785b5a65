//! ClusterNetworkPolicy test objects: the CRD as network-policy-api's release manifest
//! defines what flock (and the test API server) relies on — cluster scope, the v1alpha2
//! version with a status subresource, `status.conditions` a list-map keyed by `type` — and
//! policies.

#![allow(dead_code)]

use serde_json::{Value, json};

pub const API_VERSION: &str = "policy.networking.k8s.io/v1alpha2";
pub const KIND: &str = "ClusterNetworkPolicy";
pub const CRD_NAME: &str = "clusternetworkpolicies.policy.networking.k8s.io";

/// The CustomResourceDefinition (the parts the API server acts on): the one the test API
/// server's binary installs.
pub fn crd() -> Value {
    flock_test_apiserver::load::cluster_network_policy_crd()
}

/// An Admin-tier policy with these ingress rules, for the pods (of any namespace) labelled
/// `app: <subject>`.
pub fn cnp(name: &str, priority: i64, subject: &str, ingress: Value) -> Value {
    json!({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name},
           "spec": {"tier": "Admin", "priority": priority,
                    "subject": {"pods": {"podSelector": {"matchLabels": {"app": subject}}}},
                    "ingress": ingress}})
}

/// One ingress rule with `action` from every pod of every namespace.
pub fn from_everyone(action: &str) -> Value {
    json!([{"name": "all-pods", "action": action, "from": [{"namespaces": {}}]}])
}
