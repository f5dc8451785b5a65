//! Loading a cluster from files: the CRDs flock's programs read (the `flock.dev` ones from
//! `deploy/`, and the ClusterNetworkPolicy API of network-policy-api) and manifests —
//! multi-document YAML or JSON, `List` kinds, directories — applied as `kubectl apply`
//! would leave them on a real cluster: namespaces referenced but not declared are created,
//! and every namespace carries its `kubernetes.io/metadata.name` label.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::{ApiServer, Error};

/// The ClusterNetworkPolicy CRD (policy.networking.k8s.io/v1alpha2): the parts the server
/// acts on — cluster scope, a status subresource, `status.conditions` a list-map keyed by
/// `type`.
pub fn cluster_network_policy_crd() -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "clusternetworkpolicies.policy.networking.k8s.io"},
           "spec": {"group": "policy.networking.k8s.io", "scope": "Cluster",
                    "names": {"kind": "ClusterNetworkPolicy", "listKind": "ClusterNetworkPolicyList", "plural": "clusternetworkpolicies",
                              "singular": "clusternetworkpolicy", "shortNames": ["cnp"]},
                    "versions": [{"name": "v1alpha2", "served": true, "storage": true, "subresources": {"status": {}},
                                  "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                                      "spec": {"type": "object"},
                                      "status": {"type": "object", "properties": {"conditions": {
                                          "type": "array", "items": {"type": "object"},
                                          "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}}}}}}}]}})
}

/// flock's own CRDs, as deployed.
const FLOCK_CRDS: [(&str, &str); 4] = [
    ("deploy/agent/crds/flocknodes.flock.dev.yaml", include_str!("../../../deploy/agent/crds/flocknodes.flock.dev.yaml")),
    ("deploy/controller/crds/runprofiles.flock.dev.yaml", include_str!("../../../deploy/controller/crds/runprofiles.flock.dev.yaml")),
    ("deploy/controller/crds/runs.flock.dev.yaml", include_str!("../../../deploy/controller/crds/runs.flock.dev.yaml")),
    ("deploy/controller/crds/auditevents.flock.dev.yaml", include_str!("../../../deploy/controller/crds/auditevents.flock.dev.yaml")),
];

/// Why a cluster could not be loaded; names the file and the document.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file or directory could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not YAML (or JSON).
    #[error("{path}: not valid YAML: {message}")]
    Yaml {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// An object the server refused (an unknown kind, no name, …).
    #[error("{path}: document {doc} ({what}): {source}")]
    Object {
        /// The file.
        path: PathBuf,
        /// The document's position in the file, from 1.
        doc: usize,
        /// `kind namespace/name` as far as known.
        what: String,
        /// What the server said.
        #[source]
        source: Error,
    },
}

/// Serves the CRDs flock's programs read: ClusterNetworkPolicy and flock.dev's.
pub fn install_crds(server: &ApiServer) -> Result<(), LoadError> {
    let mut crds = vec![(PathBuf::from("ClusterNetworkPolicy CRD"), 1, cluster_network_policy_crd())];
    for (path, text) in FLOCK_CRDS {
        for (i, doc) in documents(Path::new(path), text)?.into_iter().enumerate() {
            crds.push((PathBuf::from(path), i + 1, doc));
        }
    }
    for (path, doc, object) in crds {
        apply(server, &path, doc, object)?;
    }
    Ok(())
}

/// Applies every object of the manifests at `paths` (files, or directories read in name
/// order for `.yaml`, `.yml` and `.json` files): CRDs first, then namespaces (with the ones
/// referenced but not declared), then the rest. Returns how many objects were applied.
pub fn load_manifests(server: &ApiServer, paths: &[PathBuf]) -> Result<usize, LoadError> {
    let mut objects = Vec::new();
    for path in paths {
        for file in files(path)? {
            let text = std::fs::read_to_string(&file).map_err(|source| LoadError::Read { path: file.clone(), source })?;
            for (i, doc) in documents(&file, &text)?.into_iter().enumerate() {
                objects.push((file.clone(), i + 1, doc));
            }
        }
    }
    let rank = |o: &Value| match o["kind"].as_str() {
        Some("CustomResourceDefinition") => 0,
        Some("Namespace") => 1,
        _ => 2,
    };
    objects.sort_by_key(|(_, _, o)| rank(o));
    let declared: BTreeSet<String> = objects
        .iter()
        .filter(|(_, _, o)| o["kind"] == "Namespace")
        .filter_map(|(_, _, o)| o["metadata"]["name"].as_str().map(String::from))
        .collect();
    let mut count = 0;
    let mut created = BTreeSet::new();
    for (path, doc, mut object) in objects {
        if object["kind"] == "Namespace" {
            label_namespace(&mut object);
        } else if let Some(ns) = object["metadata"]["namespace"].as_str().filter(|ns| !declared.contains(*ns)).map(String::from) {
            // A real cluster has the namespace (kubectl apply would fail without it).
            if created.insert(ns.clone()) {
                let mut namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
                label_namespace(&mut namespace);
                apply(server, &path, doc, namespace)?;
            }
        }
        apply(server, &path, doc, object)?;
        count += 1;
    }
    Ok(count)
}

/// The label the API server sets on every namespace (NamespaceDefaultLabelName).
fn label_namespace(ns: &mut Value) {
    let name = ns["metadata"]["name"].clone();
    if let Some(meta) = ns["metadata"].as_object_mut() {
        let labels = meta.entry("labels").or_insert_with(|| json!({}));
        if let Some(labels) = labels.as_object_mut() {
            labels.insert("kubernetes.io/metadata.name".into(), name);
        }
    }
}

fn apply(server: &ApiServer, path: &Path, doc: usize, object: Value) -> Result<(), LoadError> {
    let what = format!(
        "{} {}{}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["namespace"].as_str().map(|ns| format!("{ns}/")).unwrap_or_default(),
        object["metadata"]["name"].as_str().unwrap_or("?")
    );
    server.apply(object).map(drop).map_err(|source| LoadError::Object { path: path.to_path_buf(), doc, what, source })
}

/// The files of `path`: itself, or a directory's manifest files in name order.
fn files(path: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let read = |source| LoadError::Read { path: path.to_path_buf(), source };
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(path).map_err(read)? {
        let p = entry.map_err(read)?.path();
        if p.is_file() && p.extension().and_then(|e| e.to_str()).is_some_and(|e| matches!(e, "yaml" | "yml" | "json")) {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// The objects of one file: every non-empty document, `List` kinds expanded.
fn documents(path: &Path, text: &str) -> Result<Vec<Value>, LoadError> {
    // YAML 1.2, as Kubernetes reads it: only `true` and `false` are booleans (namespace `y`
    // is a name).
    // Test clusters are large and trusted: no count limits, the default depth one.
    let options = serde_saphyr::options! {
        strict_booleans: true,
        budget: serde_saphyr::budget! {
            max_documents: usize::MAX,
            max_events: usize::MAX,
            max_nodes: usize::MAX,
            max_total_scalar_bytes: usize::MAX,
        },
    };
    let docs: Vec<Value> = serde_saphyr::from_multiple_with_options(text, options)
        .map_err(|e| LoadError::Yaml { path: path.to_path_buf(), message: e.to_string() })?;
    let mut out = Vec::new();
    for doc in docs {
        match doc {
            Value::Null => {}
            Value::Object(ref o) if o.get("kind").and_then(Value::as_str).is_some_and(|k| k == "List" || k.ends_with("List")) => {
                if let Some(Value::Array(items)) = o.get("items") {
                    out.extend(items.iter().cloned());
                }
            }
            other => out.push(other),
        }
    }
    Ok(out)
}
