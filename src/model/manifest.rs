//! Kubernetes YAML manifests → snapshot objects (the static source's input).
//!
//! Reads files or directories (recursively, `*.yaml`/`*.yml`/`*.json`, in name order),
//! multi-document YAML and `List` kinds. Nodes, Namespaces, Pods and NetworkPolicies become
//! [`Object`]s; other kinds are skipped with a warning (manifest folders usually hold
//! Deployments and Services too). Every error names the file, the document (1-based, and the
//! `items[]` index inside a List) and the field.

use std::fmt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1 as net;
use serde::de::DeserializeOwned;
use serde_yaml_ng::Value;

use super::convert::{self, ConvertError};
use super::{Namespace, NetworkPolicy, Node, ObjectRef, Pod, Snapshot};

/// One object from a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Object {
    Namespace(Namespace),
    Pod(Pod),
    NetworkPolicy(NetworkPolicy),
    Node(Node),
}

/// The kinds flock reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Namespace,
    Pod,
    NetworkPolicy,
    Node,
}

impl Kind {
    pub fn parse(kind: &str) -> Option<Self> {
        match kind {
            "Namespace" => Some(Self::Namespace),
            "Pod" => Some(Self::Pod),
            "NetworkPolicy" => Some(Self::NetworkPolicy),
            "Node" => Some(Self::Node),
            _ => None,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Namespace => "Namespace",
            Self::Pod => "Pod",
            Self::NetworkPolicy => "NetworkPolicy",
            Self::Node => "Node",
        })
    }
}

impl Object {
    pub fn kind(&self) -> Kind {
        match self {
            Self::Namespace(_) => Kind::Namespace,
            Self::Pod(_) => Kind::Pod,
            Self::NetworkPolicy(_) => Kind::NetworkPolicy,
            Self::Node(_) => Kind::Node,
        }
    }

    /// `namespace/name`; cluster-scoped objects have an empty namespace.
    pub fn key(&self) -> ObjectRef {
        match self {
            Self::Namespace(n) => ObjectRef::new("", n.name.clone()),
            Self::Pod(p) => p.key(),
            Self::NetworkPolicy(p) => p.key(),
            Self::Node(n) => ObjectRef::new("", n.name.clone()),
        }
    }

    /// Adds or replaces this object in `snapshot`.
    pub fn apply_to(&self, snapshot: &mut Snapshot) {
        match self {
            Self::Namespace(n) => snapshot.upsert_namespace(n.clone()),
            Self::Pod(p) => snapshot.upsert_pod(p.clone()),
            Self::NetworkPolicy(p) => snapshot.upsert_policy(p.clone()),
            Self::Node(n) => snapshot.upsert_node(n.clone()),
        }
    }
}

/// Why a manifest could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read {path}: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error("{path}: {doc}: not valid YAML: {error}")]
    Yaml { path: PathBuf, doc: DocRef, error: serde_yaml_ng::Error },
    #[error("{path}: {doc}: {message}")]
    Object { path: PathBuf, doc: DocRef, message: String },
}

/// Where in a file an object is: the document (1-based) and, inside a List, the item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DocRef {
    pub document: usize,
    pub item: Option<usize>,
}

impl fmt::Display for DocRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}", self.document)?;
        if let Some(i) = self.item {
            write!(f, ", items[{i}]")?;
        }
        Ok(())
    }
}

/// Objects read from manifests, and the warnings about what was skipped.
#[derive(Debug, Clone, Default)]
pub struct Manifests {
    pub objects: Vec<Object>,
    pub warnings: Vec<String>,
}

impl Manifests {
    /// The snapshot these objects describe. Later objects replace earlier ones with the same
    /// key. Namespaces that pods or policies use but no manifest declares are added with only
    /// their `kubernetes.io/metadata.name` label, as they exist in every real cluster.
    pub fn to_snapshot(&self) -> Snapshot {
        let mut snapshot = Snapshot::new();
        for obj in &self.objects {
            obj.apply_to(&mut snapshot);
        }
        add_implicit_namespaces(&mut snapshot);
        snapshot
    }
}

/// Adds a namespace object for every namespace referenced by a pod or policy but missing.
pub fn add_implicit_namespaces(snapshot: &mut Snapshot) {
    let mut missing: Vec<String> = snapshot
        .pods()
        .map(|p| p.namespace.clone())
        .chain(snapshot.policies().map(|p| p.namespace.clone()))
        .filter(|ns| snapshot.namespace(ns).is_none())
        .collect();
    missing.sort();
    missing.dedup();
    for ns in missing {
        snapshot.upsert_namespace(convert::implicit_namespace(&ns));
    }
}

/// Reads every manifest under `paths` (files, or directories walked recursively).
pub fn load_paths(paths: &[PathBuf]) -> Result<Manifests, ManifestError> {
    let mut out = Manifests::default();
    for path in paths {
        for file in manifest_files(path)? {
            let text = std::fs::read_to_string(&file).map_err(|error| ManifestError::Read { path: file.clone(), error })?;
            let parsed = parse_str(&file, &text)?;
            out.objects.extend(parsed.objects);
            out.warnings.extend(parsed.warnings);
        }
    }
    Ok(out)
}

fn manifest_files(path: &Path) -> Result<Vec<PathBuf>, ManifestError> {
    let meta = std::fs::metadata(path).map_err(|error| ManifestError::Read { path: path.to_path_buf(), error })?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|error| ManifestError::Read { path: path.to_path_buf(), error })?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(|error| ManifestError::Read { path: path.to_path_buf(), error })?;
    entries.sort();
    let mut files = Vec::new();
    for entry in entries {
        if entry.is_dir() {
            files.extend(manifest_files(&entry)?);
        } else if matches!(entry.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json")) {
            files.push(entry);
        }
    }
    Ok(files)
}

/// Parses one manifest text; `path` only names it in errors.
pub fn parse_str(path: &Path, text: &str) -> Result<Manifests, ManifestError> {
    let mut out = Manifests::default();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let at = DocRef { document: i + 1, item: None };
        let value = Value::deserialize_from(doc).map_err(|error| ManifestError::Yaml { path: path.to_path_buf(), doc: at, error })?;
        parse_value(path, at, value, &mut out)?;
    }
    Ok(out)
}

/// Extension so a document deserializer yields a [`Value`] without naming serde traits at
/// every call site.
trait DeserializeFrom: Sized {
    fn deserialize_from(doc: serde_yaml_ng::Deserializer<'_>) -> Result<Self, serde_yaml_ng::Error>;
}

impl DeserializeFrom for Value {
    fn deserialize_from(doc: serde_yaml_ng::Deserializer<'_>) -> Result<Self, serde_yaml_ng::Error> {
        serde::Deserialize::deserialize(doc)
    }
}

/// Reads one YAML value (an object or a List) into `out`; `path` and `at` name it in errors.
pub fn parse_value(path: &Path, at: DocRef, value: Value, out: &mut Manifests) -> Result<(), ManifestError> {
    let fail = |message: String| ManifestError::Object { path: path.to_path_buf(), doc: at, message };
    if value.is_null() {
        return Ok(()); // an empty document (e.g. a trailing `---`)
    }
    let Value::Mapping(map) = &value else {
        return Err(fail("not a Kubernetes object (expected a mapping with apiVersion and kind)".into()));
    };
    let kind = match map.get("kind") {
        Some(Value::String(k)) => k.clone(),
        Some(_) => return Err(fail("kind: expected a string".into())),
        None => return Err(fail("kind: missing".into())),
    };
    let api_version = match map.get("apiVersion") {
        Some(Value::String(v)) => v.clone(),
        Some(_) => return Err(fail("apiVersion: expected a string".into())),
        None => return Err(fail("apiVersion: missing".into())),
    };

    if kind == "List" || (kind.ends_with("List") && at.item.is_none()) {
        let items = match map.get("items") {
            Some(Value::Sequence(items)) => items.clone(),
            None | Some(Value::Null) => Vec::new(),
            Some(_) => return Err(fail("items: expected a list".into())),
        };
        for (i, item) in items.into_iter().enumerate() {
            parse_value(path, DocRef { item: Some(i), ..at }, item, out)?;
        }
        return Ok(());
    }

    let label = |name: Option<&str>| match name {
        Some(n) => format!("{kind} {n}"),
        None => kind.clone(),
    };
    let obj_name = map.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).map(str::to_string);
    let in_object = |message: String| fail(format!("{}: {message}", label(obj_name.as_deref())));

    let mut unknown = Vec::new();
    let object = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => {
            Object::Namespace(typed::<core::Namespace>(value, &mut unknown).and_then(|o| conv(convert::namespace(&o))).map_err(in_object)?)
        }
        ("v1", "Pod") => Object::Pod(typed::<core::Pod>(value, &mut unknown).and_then(|o| conv(convert::pod(&o))).map_err(in_object)?),
        ("v1", "Node") => Object::Node(typed::<core::Node>(value, &mut unknown).and_then(|o| conv(convert::node(&o))).map_err(in_object)?),
        ("networking.k8s.io/v1", "NetworkPolicy") => Object::NetworkPolicy(
            typed::<net::NetworkPolicy>(value, &mut unknown).and_then(|o| conv(convert::network_policy(&o))).map_err(&in_object)?,
        ),
        (_, k) if Kind::parse(k).is_some() => {
            return Err(in_object(format!("apiVersion: {api_version:?} is not served for {kind}")));
        }
        _ => {
            out.warnings.push(format!(
                "{}: {at}: skipping {} (flock reads Nodes, Namespaces, Pods and NetworkPolicies)",
                path.display(),
                label(obj_name.as_deref())
            ));
            return Ok(());
        }
    };
    // Unknown fields: a NetworkPolicy's (or anyone's metadata) could change what is selected
    // — `podSelecter: …` silently read as an empty podSelector selects the whole namespace —
    // so they are errors, as with `kubectl apply --validate=strict`. Elsewhere (a Pod written
    // for a newer Kubernetes) they cannot change policy and are warnings.
    for field in unknown {
        let message = format!("{field}: unknown field (not in the Kubernetes 1.33 schema of {kind})");
        if object.kind() == Kind::NetworkPolicy || field.starts_with("metadata.") {
            return Err(in_object(message));
        }
        out.warnings.push(format!("{}: {at}: {}: {message}; ignored", path.display(), label(obj_name.as_deref())));
    }
    out.objects.push(object);
    Ok(())
}

/// Deserializes `value` as `T`, naming the failing field; appends to `unknown` the paths of
/// fields `T` does not have (those lost when the typed object is written back).
fn typed<T: DeserializeOwned + serde::Serialize>(value: Value, unknown: &mut Vec<String>) -> Result<T, String> {
    let written = serde_json::to_value(&value).ok();
    let obj: T = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        if path == "." { e.inner().to_string() } else { format!("{path}: {}", e.inner()) }
    })?;
    if let (Some(written), Ok(known)) = (written, serde_json::to_value(&obj)) {
        unknown_fields(&written, &known, "", unknown);
    }
    Ok(obj)
}

/// Paths present in `written` but not in `known` (the typed round trip). Nulls are absent
/// values, not fields; lists are compared item by item.
fn unknown_fields(written: &serde_json::Value, known: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    use serde_json::Value as J;
    match (written, known) {
        (J::Object(w), J::Object(k)) => {
            for (key, value) in w {
                let at = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                match k.get(key) {
                    _ if value.is_null() => {}
                    None => out.push(at),
                    Some(kv) => unknown_fields(value, kv, &at, out),
                }
            }
        }
        (J::Array(w), J::Array(k)) => {
            for (i, (wv, kv)) in w.iter().zip(k).enumerate() {
                unknown_fields(wv, kv, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn conv<T>(r: Result<T, ConvertError>) -> Result<T, String> {
    r.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Manifests, ManifestError> {
        parse_str(Path::new("test.yaml"), text)
    }

    #[test]
    fn multi_document_and_lists() {
        let m = parse(
            "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n---\n\
             apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: a, namespace: x}}\n\
             - {apiVersion: apps/v1, kind: Deployment, metadata: {name: d}}\n---\n",
        )
        .unwrap();
        assert_eq!(m.objects.len(), 2);
        assert_eq!(m.objects[1].kind(), Kind::Pod);
        assert_eq!(m.warnings.len(), 1);
        assert!(m.warnings[0].contains("document 2, items[1]"), "{}", m.warnings[0]);
        assert!(m.warnings[0].contains("Deployment d"), "{}", m.warnings[0]);
    }

    #[test]
    fn errors_name_file_document_object_and_field() {
        let e = parse("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, ports: [{containerPort: abc}]}]}\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("test.yaml: document 2: Pod a: spec.containers[0].ports[0].containerPort:"), "{e}");

        let e = parse("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nstatus: {podIP: 1.2.3}\n").unwrap_err().to_string();
        assert_eq!(e, "test.yaml: document 1: Pod a: status.podIP: \"1.2.3\" is not an IP address");

        let e = parse("kind: Pod\n").unwrap_err().to_string();
        assert_eq!(e, "test.yaml: document 1: apiVersion: missing");
        let e = parse("- 1\n- 2\n").unwrap_err().to_string();
        assert!(e.contains("not a Kubernetes object"), "{e}");
        let e = parse("a: [\n").unwrap_err().to_string();
        assert!(e.starts_with("test.yaml: document 1: not valid YAML"), "{e}");
        let e = parse("apiVersion: extensions/v1beta1\nkind: NetworkPolicy\nmetadata: {name: p}\n").unwrap_err().to_string();
        assert!(e.contains("is not served for NetworkPolicy"), "{e}");
    }

    #[test]
    fn unknown_fields_of_a_policy_or_metadata_are_errors_elsewhere_warnings() {
        // A typo that would read as an empty podSelector (the whole namespace).
        let e = parse(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: x}\n\
             spec: {podSelecter: {matchLabels: {app: db}}, ingress: [{}]}\n",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "test.yaml: document 1: NetworkPolicy p: spec.podSelecter: unknown field (not in the Kubernetes 1.33 schema of NetworkPolicy)"
        );
        let e = parse(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\n\
             spec: {podSelector: {}, ingress: [{from: [{podSelector: {matchLabel: {a: b}}}]}]}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.ends_with(
                "spec.ingress[0].from[0].podSelector.matchLabel: unknown field (not in the Kubernetes 1.33 schema of NetworkPolicy)"
            ),
            "{e}"
        );
        let e = parse("apiVersion: v1\nkind: Pod\nmetadata: {name: a, lables: {app: web}}\n").unwrap_err().to_string();
        assert!(e.ends_with("Pod a: metadata.lables: unknown field (not in the Kubernetes 1.33 schema of Pod)"), "{e}");
        // Elsewhere in a Pod: a warning, the pod is read.
        let m = parse("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [], futureField: 1}\n").unwrap();
        assert_eq!(m.objects.len(), 1);
        assert_eq!(m.warnings.len(), 1);
        assert!(m.warnings[0].contains("Pod a: spec.futureField: unknown field"), "{}", m.warnings[0]);
        // Nulls, empty lists and data maps are not unknown fields.
        let m = parse(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, labels: {any: thing}, annotations: null}\n\
             spec: {podSelector: {matchLabels: {weird.key/x: v}}, policyTypes: [Ingress], ingress: [], egress: null}\n",
        )
        .unwrap();
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
    }

    #[test]
    fn snapshot_adds_implicit_namespaces() {
        let m = parse("apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: q}\n").unwrap();
        let s = m.to_snapshot();
        assert!(s.namespace("q").is_some());
    }

    #[test]
    fn reads_the_shared_base_cluster() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/base-cluster.yaml");
        let m = load_paths(&[path]).unwrap();
        let s = m.to_snapshot();
        assert_eq!(s.pod_count(), 9);
        assert_eq!(s.nodes().count(), 2);
        let a = s.pod_by_name(&ObjectRef::new("x", "a")).unwrap();
        assert_eq!(a.ports.len(), 6);
        assert_eq!(a.ips, vec!["198.18.1.11".parse::<std::net::IpAddr>().unwrap()]);
    }
}
