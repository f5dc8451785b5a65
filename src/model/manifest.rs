//! Kubernetes YAML manifests → snapshot objects (the static source's input).
//!
//! Reads files or directories (recursively, `*.yaml`/`*.yml`/`*.json`, in name order),
//! multi-document YAML and `List` kinds. Nodes, Namespaces, Pods and NetworkPolicies become
//! [`Object`]s; other kinds are skipped with a warning (manifest folders usually hold
//! Deployments and Services too). Every error names the file, the document (1-based, and the
//! `items[]` index inside a List) and the field.
//!
//! YAML is read by serde-saphyr (the parser kube uses), one document at a time, within
//! budgets: nesting deeper than [`MAX_DEPTH`] and alias expansion beyond
//! [`MAX_ALIAS_REPLAY`] events fail at once instead of exhausting time or memory. A leading
//! UTF-8 byte order mark is accepted; `<<` merge keys are expanded. A document that is a
//! JSON object is read by serde_json (the same value, faster).

use std::fmt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1 as net;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::cnp::{self, ClusterNetworkPolicy};
use super::convert::{self, ConvertError};
use super::{Namespace, NetworkPolicy, Node, ObjectRef, Pod, Snapshot, clip};

/// One object from a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Object {
    Namespace(Namespace),
    Pod(Pod),
    NetworkPolicy(NetworkPolicy),
    ClusterNetworkPolicy(ClusterNetworkPolicy),
    Node(Node),
}

/// The kinds flock reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Namespace,
    Pod,
    NetworkPolicy,
    ClusterNetworkPolicy,
    Node,
}

impl Kind {
    pub fn parse(kind: &str) -> Option<Self> {
        match kind {
            "Namespace" => Some(Self::Namespace),
            "Pod" => Some(Self::Pod),
            "NetworkPolicy" => Some(Self::NetworkPolicy),
            cnp::KIND => Some(Self::ClusterNetworkPolicy),
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
            Self::ClusterNetworkPolicy => cnp::KIND,
            Self::Node => "Node",
        })
    }
}

impl Object {
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Self::Namespace(_) => Kind::Namespace,
            Self::Pod(_) => Kind::Pod,
            Self::NetworkPolicy(_) => Kind::NetworkPolicy,
            Self::ClusterNetworkPolicy(_) => Kind::ClusterNetworkPolicy,
            Self::Node(_) => Kind::Node,
        }
    }

    /// Adds or replaces this object in `snapshot`, moving it there.
    pub(crate) fn upsert_into(self, snapshot: &mut Snapshot) {
        match self {
            Self::Namespace(n) => snapshot.upsert_namespace(n),
            Self::Pod(p) => snapshot.upsert_pod(p),
            Self::NetworkPolicy(p) => snapshot.upsert_policy(p),
            Self::ClusterNetworkPolicy(p) => snapshot.upsert_cluster_policy(p),
            Self::Node(n) => snapshot.upsert_node(n),
        }
    }

    /// Adds or replaces a copy of this object in `snapshot`.
    pub fn apply_to(&self, snapshot: &mut Snapshot) {
        self.clone().upsert_into(snapshot);
    }
}

/// Why a manifest could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// `message` names the line and column in the file.
    #[error("{path}: {doc}: not valid YAML: {error}")]
    Yaml { path: PathBuf, doc: DocRef, error: YamlError },
    #[error("{path}: {doc}: {message}")]
    Object { path: PathBuf, doc: DocRef, message: String },
}

/// Where in a file an object is: the document (1-based) and, inside a List, the item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DocRef {
    pub(crate) document: usize,
    pub(crate) item: Option<usize>,
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
        Manifests { objects: self.objects.clone(), warnings: Vec::new() }.into_snapshot()
    }

    /// [`Self::to_snapshot`], moving the objects instead of copying them (the warnings are
    /// dropped: read them first).
    pub fn into_snapshot(self) -> Snapshot {
        let (mut pods, mut rest) = (Vec::new(), Vec::new());
        for obj in self.objects {
            match obj {
                Object::Pod(p) => pods.push(p),
                other => rest.push(other),
            }
        }
        let mut snapshot = Snapshot::with_pods(pods);
        for obj in rest {
            obj.upsert_into(&mut snapshot);
        }
        add_implicit_namespaces(&mut snapshot);
        snapshot
    }
}

/// Applies a change to `snapshot` as `kubectl apply` and `kubectl delete` would: objects
/// created or replaced (a pod replacing another of its name whatever its uid), then the
/// deletions (of absent objects: nothing), then the namespaces that objects name but nothing
/// declares. What conformance steps and `flockctl whatif` change.
pub fn apply_change(snapshot: &mut Snapshot, apply: &[Object], delete: &[(Kind, ObjectRef)]) {
    for obj in apply {
        if let Object::Pod(p) = obj {
            let old: Vec<String> =
                snapshot.pods_in(&p.namespace).filter(|o| o.name == p.name && o.uid != p.uid).map(|o| o.uid.clone()).collect();
            for uid in old {
                snapshot.remove_pod(&uid);
            }
        }
        obj.apply_to(snapshot);
    }
    for (kind, key) in delete {
        match kind {
            Kind::NetworkPolicy => {
                snapshot.remove_policy(key);
            }
            Kind::ClusterNetworkPolicy => {
                snapshot.remove_cluster_policy(&key.name);
            }
            Kind::Pod => {
                let uids: Vec<String> = snapshot.pods_in(&key.namespace).filter(|p| p.name == key.name).map(|p| p.uid.clone()).collect();
                for uid in uids {
                    snapshot.remove_pod(&uid);
                }
            }
            Kind::Namespace => {
                snapshot.remove_namespace(&key.name);
            }
            Kind::Node => {
                snapshot.remove_node(&key.name);
            }
        }
    }
    add_implicit_namespaces(snapshot);
}

/// Adds a namespace object for every namespace referenced by a pod or policy but missing.
pub(crate) fn add_implicit_namespaces(snapshot: &mut Snapshot) {
    let missing: std::collections::BTreeSet<String> = snapshot
        .namespaces_with_pods()
        .chain(snapshot.policies().map(|p| p.namespace.as_str()))
        .filter(|ns| snapshot.namespace(ns).is_none())
        .map(str::to_string)
        .collect();
    for ns in missing {
        snapshot.upsert_namespace(convert::implicit_namespace(&ns));
    }
}

/// Parses one manifest text; `path` only names it in errors.
///
/// Documents are independent, so a large file's are parsed on every core, in contiguous
/// runs whose results are joined in document order: the objects, warnings and the first
/// error are those of a sequential parse.
pub fn parse_str(path: &Path, text: &str) -> Result<Manifests, ManifestError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let docs = split_documents(text, cores);
    let threads = cores.min(docs.len() / PARALLEL_MIN_DOCUMENTS).max(1);
    if threads == 1 {
        return parse_documents(path, &docs, 0);
    }
    let run = docs.len().div_ceil(threads);
    let parts: Vec<Result<Manifests, ManifestError>> = std::thread::scope(|scope| {
        let handles: Vec<_> =
            docs.chunks(run).enumerate().map(|(i, part)| scope.spawn(move || parse_documents(path, part, i * run))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    let mut out = Manifests::default();
    for part in parts {
        let part = part?;
        out.objects.extend(part.objects);
        out.warnings.extend(part.warnings);
    }
    Ok(out)
}

/// The image of the first container of the first Pod in `text` (what a base cluster's pods
/// run, for `flockctl conformance --kubeconfig`).
pub fn first_pod_image(text: &str) -> Option<String> {
    documents(text).0.iter().find_map(|d| {
        let v: Value = from_yaml(d.body, d.first_line).ok()?;
        if v.get("kind")?.as_str()? != "Pod" {
            return None;
        }
        v["spec"]["containers"][0]["image"].as_str().map(String::from)
    })
}

/// Fewer documents than this per thread are parsed on one (a thread costs more than it saves).
const PARALLEL_MIN_DOCUMENTS: usize = 2048;

/// [`documents`] of `text`, a large one's found on up to `threads` threads: the text is cut
/// where a document marker (`---`) follows a line of content, which ends the document before
/// it whatever came earlier, so each piece splits exactly as the whole would.
fn split_documents(text: &str, threads: usize) -> Vec<Document<'_>> {
    if threads < 2 || text.len() < PARALLEL_MIN_BYTES {
        return documents(text).0;
    }
    let mut cuts = vec![0];
    for i in 1..threads {
        if let Some(cut) = document_cut(text, (i * text.len() / threads).max(cuts[cuts.len() - 1] + 1)) {
            cuts.push(cut);
        }
    }
    cuts.push(text.len());
    cuts.dedup();
    let parts: Vec<(Vec<Document<'_>>, usize)> = std::thread::scope(|scope| {
        let handles: Vec<_> = cuts.windows(2).map(|w| scope.spawn(move || documents(&text[w[0]..w[1]]))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    let mut all = Vec::new();
    let mut lines_before = 0;
    for (mut docs, lines) in parts {
        for d in &mut docs {
            d.first_line += lines_before;
        }
        lines_before += lines;
        all.append(&mut docs);
    }
    all
}

/// Fewer bytes than this are split on one thread.
const PARALLEL_MIN_BYTES: usize = 1 << 20;

/// The first offset at or after `from` where `text` can be cut into pieces that split into
/// documents exactly as the whole does: the start of a `---` marker line whose previous line
/// is content (not blank, a comment, a directive or `...`), so that the document before it
/// has begun and ends there. `None` if there is none.
fn document_cut(text: &str, from: usize) -> Option<usize> {
    let mut at = (from..text.len()).find(|i| text.is_char_boundary(*i))?;
    while let Some(i) = text[at..].find("\n---") {
        let cut = at + i + 1;
        at = cut;
        let marker = matches!(text.as_bytes().get(cut + 3), None | Some(b' ' | b'\t' | b'\r' | b'\n'));
        let line_start = text[..cut - 1].rfind('\n').map_or(0, |j| j + 1);
        let previous = text[line_start..cut - 1].strip_suffix('\r').unwrap_or(&text[line_start..cut - 1]);
        let content = !previous.contains('\r') && !blank_or_comment(previous) && !previous.starts_with('%') && !previous.starts_with("...");
        if marker && content {
            return Some(cut);
        }
    }
    None
}

/// Parses `docs`, the first of which is document `first + 1` of its file.
fn parse_documents(path: &Path, docs: &[Document<'_>], first: usize) -> Result<Manifests, ManifestError> {
    let mut out = Manifests::default();
    for (i, doc) in docs.iter().enumerate() {
        let at = DocRef { document: first + i + 1, item: None };
        let value = match from_json(doc.body) {
            Some(value) => value,
            None => {
                from_yaml(doc.text, doc.first_line).map_err(|error| ManifestError::Yaml { path: path.to_path_buf(), doc: at, error })?
            }
        };
        parse_value(path, at, value, &mut out)?;
    }
    Ok(out)
}

/// Deepest nesting of mappings and sequences in a manifest document (serde-saphyr's default).
/// Kubernetes objects nest about a dozen levels, CRD schemas a few dozen; without a bound a
/// document of `[[[[…` costs stack and quadratic time.
pub(crate) const MAX_DEPTH: usize = 64;

/// Most events that aliases (`*name`) may replay into one YAML document: anchors shared by a
/// few containers fit many times over, a "billion laughs" document fails at once.
pub(crate) const MAX_ALIAS_REPLAY: usize = 100_000;

/// serde-saphyr's options for manifests: flock's budgets, one-line errors.
fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        // The limits that stop amplification (depth, aliases); the input is in memory
        // already, so its size (events, nodes, scalar bytes) is no reason to fail.
        budget: serde_saphyr::budget! {
            max_depth: MAX_DEPTH,
            max_events: usize::MAX,
            max_nodes: usize::MAX,
            max_total_scalar_bytes: usize::MAX,
            max_total_comment_bytes: usize::MAX,
        },
        alias_limits: serde_saphyr::alias_limits! { max_total_replayed_events: MAX_ALIAS_REPLAY },
        // YAML 1.2 as before: only `true` and `false` are booleans (namespace `y` is a name).
        strict_booleans: true,
        emit_comments: false,
        with_snippet: false,
    }
}

/// A YAML document flock will not read: one line naming the line and column (clipped where
/// it quotes the input).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct YamlError(String);

/// Reads one YAML document as `T` within flock's budgets. `first_line` (lines before the
/// document in its file) makes the error's line numbers the file's; errors are one line.
pub(crate) fn from_yaml<T: DeserializeOwned>(text: &str, first_line: usize) -> Result<T, YamlError> {
    use serde_saphyr::{Error, ExternalMessageSource, SnippetMode, budget::BudgetBreach, granit_parser::ErrorKind};
    serde_saphyr::from_str_with_options(text, yaml_options()).map_err(|e| {
        YamlError({
            // The parser's own nesting limits (255) lie beyond the budget's but can trip first
            // when it scans ahead; either way the document nests deeper than MAX_DEPTH.
            let too_deep = match &e {
                Error::Budget { breach: BudgetBreach::Depth { .. }, .. } => true,
                Error::ExternalMessage { source, .. } => {
                    matches!(&**source, ExternalMessageSource::Parser(p) if matches!(p.kind(), ErrorKind::RecursionLimitExceeded))
                }
                _ => false,
            };
            match e.location() {
                Some(at) if too_deep => {
                    format!("nested deeper than {MAX_DEPTH} levels at line {}, column {}", at.line() + first_line as u64, at.column())
                }
                _ => {
                    let text =
                        e.render_with_options(serde_saphyr::render_options! { snippets: SnippetMode::Off, line_offset: first_line as u64 });
                    // The message can quote the input (a duplicate key): clipped, and so is the
                    // location after it, which is kept.
                    match text.rfind(" at line ") {
                        Some(i) => format!("{}{}", clip(&text[..i]), clip(&text[i..])),
                        None => clip(&text).to_string(),
                    }
                }
            }
        })
    })
}

/// A document that is a JSON object (as `kubectl get -o json` writes, or a flow-style
/// manifest), read as JSON: the same value as YAML reads (JSON is YAML), several times
/// faster. `None` when it is not one, or has a duplicate key or nests deeper than
/// [`MAX_DEPTH`] (then YAML reads it, and names the error).
fn from_json(body: &str) -> Option<Value> {
    if !body.trim_start().starts_with('{') {
        return None;
    }
    let mut de = serde_json::Deserializer::from_str(body);
    let strict = serde::de::DeserializeSeed::deserialize(StrictJson { depth: 1 }, &mut de).ok()?;
    de.end().ok()?;
    strict.duplicate.is_none().then_some(strict.value)
}

/// A JSON value read without serde_json's last-wins rule for duplicate keys (its `Value`
/// keeps the last value of a key written twice, silently: `{"name": "a", "name": "*"}`
/// reads as `*` to flock and as `a` to a reviewer who stops at the first). Nesting deeper
/// than [`MAX_DEPTH`] is an error.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StrictValue {
    /// The value; where a key is duplicated, the last of its values.
    pub(crate) value: Value,
    /// Where the first duplicate key is, relative to the value: `.name`, `.ports[0].port`
    /// (keys clipped: [`clip`]). A value with one is not to be trusted.
    pub(crate) duplicate: Option<String>,
}

impl<'de> serde::Deserialize<'de> for StrictValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::DeserializeSeed::deserialize(StrictJson { depth: 1 }, d)
    }
}

/// Reads a [`StrictValue`] at `depth` (1 for the document's).
#[derive(Clone, Copy)]
struct StrictJson {
    depth: usize,
}

impl StrictJson {
    /// The seed for the items of a collection at this depth (which YAML's budget counts).
    fn nested<E: serde::de::Error>(self) -> Result<Self, E> {
        if self.depth > MAX_DEPTH {
            return Err(E::custom("nested too deep"));
        }
        Ok(Self { depth: self.depth + 1 })
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for StrictJson {
    type Value = StrictValue;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<StrictValue, D::Error> {
        d.deserialize_any(self)
    }
}

fn scalar(value: Value) -> StrictValue {
    StrictValue { value, duplicate: None }
}

impl<'de> serde::de::Visitor<'de> for StrictJson {
    type Value = StrictValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<StrictValue, E> {
        Ok(scalar(Value::Null))
    }
    fn visit_bool<E>(self, v: bool) -> Result<StrictValue, E> {
        Ok(scalar(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<StrictValue, E> {
        Ok(scalar(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<StrictValue, E> {
        Ok(scalar(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<StrictValue, E> {
        Ok(scalar(v.into()))
    }
    fn visit_str<E>(self, v: &str) -> Result<StrictValue, E> {
        Ok(scalar(Value::String(v.to_string())))
    }
    fn visit_string<E>(self, v: String) -> Result<StrictValue, E> {
        Ok(scalar(Value::String(v)))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<StrictValue, A::Error> {
        let inner = self.nested()?;
        let (mut items, mut duplicate) = (Vec::new(), None);
        while let Some(item) = seq.next_element_seed(inner)? {
            if duplicate.is_none() {
                duplicate = item.duplicate.map(|d| format!("[{}]{d}", items.len()));
            }
            items.push(item.value);
        }
        Ok(StrictValue { value: Value::Array(items), duplicate })
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<StrictValue, A::Error> {
        let inner = self.nested()?;
        let (mut out, mut duplicate) = (serde_json::Map::new(), None);
        while let Some(key) = map.next_key::<String>()? {
            let item = map.next_value_seed(inner)?;
            match out.entry(key) {
                serde_json::map::Entry::Vacant(v) => {
                    if duplicate.is_none() {
                        duplicate = item.duplicate.map(|d| format!(".{}{d}", clip(v.key())));
                    }
                    v.insert(item.value);
                }
                serde_json::map::Entry::Occupied(mut o) => {
                    if duplicate.is_none() {
                        duplicate = Some(format!(".{}", clip(o.key())));
                    }
                    o.insert(item.value);
                }
            }
        }
        Ok(StrictValue { value: Value::Object(out), duplicate })
    }
}

/// One document of a YAML stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Document<'a> {
    /// Lines of the stream before the document.
    first_line: usize,
    /// The document: comments and directives before it, its `---` and content, its `...`.
    text: &'a str,
    /// The content: after `---` (or all of a document without one), before `...`.
    body: &'a str,
}

/// Splits a YAML stream into its documents, as the parser counts them (so errors can name
/// the document, empty ones included, and each document gets its own budget). A line that
/// starts with `---` or `...` followed by a blank or its end is a document marker wherever
/// it appears (YAML 1.2, `c-forbidden`: it ends block and plain scalars and is an error
/// inside quoted ones and flow collections); a document without `---` starts at the first
/// line after the previous one's `...` (or at the start) that is not blank, a comment or a
/// directive.
fn documents(text: &str) -> (Vec<Document<'_>>, usize) {
    let mut docs = Vec::new();
    let mut line_count = 0;
    // The current document: where it and its content start, its line; whether it has begun
    // (a `---` or content) or holds only what may precede one, and whether that includes a
    // directive (which needs a document: the parser is to see it).
    let (mut start, mut body, mut start_line, mut begun, mut directive) = (0, 0, 0, false, false);
    for (n, (offset, line)) in lines(text).enumerate() {
        line_count = n + 1;
        let end = offset + line.len();
        let marker = |m: &str| line.strip_prefix(m).filter(|rest| matches!(rest.bytes().next(), None | Some(b' ' | b'\t' | b'\r' | b'\n')));
        if marker("---").is_some() {
            if begun {
                docs.push(Document { first_line: start_line, text: &text[start..offset], body: &text[body..offset] });
                (start, start_line) = (offset, n);
            }
            (body, begun, directive) = (offset + 3, true, false);
        } else if let Some(rest) = marker("...") {
            if !blank_or_comment(rest) {
                // `... x`: not a document end but an error, which the parser is to see
                // first thing in a document (after a clean `...` it ignores the rest).
                if begun || directive {
                    docs.push(Document { first_line: start_line, text: &text[start..offset], body: &text[body..offset] });
                }
                (start, body, start_line, begun, directive) = (offset, offset, n, true, false);
            } else {
                if begun || directive {
                    docs.push(Document { first_line: start_line, text: &text[start..end], body: &text[body..offset] });
                }
                (start, body, start_line, begun, directive) = (end, end, n + 1, false, false);
            }
        } else if !begun {
            if line.starts_with('%') {
                directive = true;
            } else if !blank_or_comment(line) {
                begun = true;
            }
        }
    }
    if begun || directive {
        docs.push(Document { first_line: start_line, text: &text[start..], body: &text[body..] });
    }
    (docs, line_count)
}

/// Whether `s` holds nothing the parser reads: blanks, then a comment or the line's end.
fn blank_or_comment(s: &str) -> bool {
    let s = s.trim_start_matches([' ', '\t']);
    s.is_empty() || s.starts_with(['#', '\r', '\n'])
}

/// The lines of `text` with their byte offsets. A line ends after `\n`, `\r\n` or a lone
/// `\r`: YAML's line breaks, so lines and their numbers are the parser's.
fn lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut start = 0;
    std::iter::from_fn(move || {
        let rest = &text[start..];
        if rest.is_empty() {
            return None;
        }
        let len = match rest.find(['\n', '\r']) {
            Some(i) if rest[i..].starts_with("\r\n") => i + 2,
            Some(i) => i + 1,
            None => rest.len(),
        };
        let line = (start, &rest[..len]);
        start += len;
        Some(line)
    })
}

/// Reads one YAML value (an object or a List) into `out`; `path` and `at` name it in errors.
pub(crate) fn parse_value(path: &Path, at: DocRef, mut value: Value, out: &mut Manifests) -> Result<(), ManifestError> {
    let fail = |message: String| ManifestError::Object { path: path.to_path_buf(), doc: at, message };
    if value.is_null() {
        return Ok(()); // an empty document (e.g. a trailing `---`)
    }
    let Value::Object(map) = &value else {
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
        let items = match value.get_mut("items").map(Value::take) {
            Some(Value::Array(items)) => items,
            None | Some(Value::Null) => Vec::new(),
            Some(_) => return Err(fail("items: expected a list".into())),
        };
        for (i, item) in items.into_iter().enumerate() {
            parse_value(path, DocRef { item: Some(i), ..at }, item, out)?;
        }
        return Ok(());
    }

    // The kind and name as the object gives them: clipped, like every API string quoted.
    let label = |name: Option<&str>| match name {
        Some(n) => format!("{} {}", clip(&kind), clip(n)),
        None => clip(&kind).to_string(),
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
        (cnp::API_VERSION, cnp::KIND) => Object::ClusterNetworkPolicy(cluster_policy(&value, &mut unknown).map_err(&in_object)?),
        (_, k) if Kind::parse(k).is_some() => {
            return Err(in_object(format!("apiVersion: {:?} is not served for {kind}", clip(&api_version))));
        }
        _ => {
            out.warnings.push(format!(
                "{}: {at}: skipping {} (flock reads Nodes, Namespaces, Pods, NetworkPolicies and ClusterNetworkPolicies)",
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
        let message = format!("{}: unknown field (not in the Kubernetes 1.33 schema of {kind})", clip(&field));
        if matches!(object.kind(), Kind::NetworkPolicy | Kind::ClusterNetworkPolicy) || field.starts_with("metadata.") {
            return Err(in_object(message));
        }
        out.warnings.push(format!("{}: {at}: {}: {message}; ignored", path.display(), label(obj_name.as_deref())));
    }
    out.objects.push(object);
    Ok(())
}

/// A ClusterNetworkPolicy (flock's own reading: `cnp::from_json`, which keeps what it cannot
/// read inside rules visible to the translator); appends to `unknown` the fields of the
/// object, its metadata and its spec that flock does not know.
fn cluster_policy(value: &Value, unknown: &mut Vec<String>) -> Result<ClusterNetworkPolicy, String> {
    if let Some(meta) = value.get("metadata").filter(|m| !m.is_null()) {
        let mut meta_unknown = Vec::new();
        typed::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>(meta.clone(), &mut meta_unknown)
            .map_err(|e| format!("metadata: {e}"))?;
        unknown.extend(meta_unknown.into_iter().map(|f| format!("metadata.{f}")));
    }
    let top = ["apiVersion", "kind", "metadata", "spec", "status"];
    if let Some(map) = value.as_object() {
        unknown.extend(map.iter().filter(|(k, v)| !v.is_null() && !top.contains(&k.as_str())).map(|(k, _)| k.clone()));
    }
    if let Some(spec) = value.get("spec").and_then(Value::as_object) {
        unknown
            .extend(spec.iter().filter(|(k, v)| !v.is_null() && !cnp::SPEC_FIELDS.contains(&k.as_str())).map(|(k, _)| format!("spec.{k}")));
    }
    cnp::from_json(value).map_err(|e| e.to_string())
}

/// Deserializes `value` as `T`, naming the failing field; appends to `unknown` the paths of
/// the fields `T` does not have (that it ignores). Nulls are absent values, not fields.
/// The value is consumed: its strings move into `T` instead of being copied.
fn typed<T: DeserializeOwned>(value: Value, unknown: &mut Vec<String>) -> Result<T, String> {
    let track = Track::default();
    match T::deserialize(Tracked { value, at: &Seg::Root, track: &track }) {
        Ok(obj) => {
            unknown.append(&mut track.ignored.into_inner());
            Ok(obj)
        }
        // Both can quote the input (a key in the path, a value in serde's message).
        Err(e) => Err(match track.failed_at.into_inner() {
            Some(path) => format!("{}: {}", clip(&path), clip(&e.to_string())),
            None => clip(&e.to_string()).to_string(),
        }),
    }
}

/// Where a value is in its document: `spec.containers[0].name`.
#[derive(Clone, Copy)]
enum Seg<'p> {
    Root,
    Key(&'p Seg<'p>, &'p str),
    Index(&'p Seg<'p>, usize),
}

impl fmt::Display for Seg<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Root => Ok(()),
            Self::Key(Self::Root, key) => f.write_str(key),
            Self::Key(parent, key) => write!(f, "{parent}.{key}"),
            Self::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// What [`Tracked`] learns on its way through a value.
#[derive(Default)]
struct Track {
    /// The path of every non-null value the target ignores: the fields its type lacks.
    ignored: std::cell::RefCell<Vec<String>>,
    /// The path of the innermost value whose deserialization failed (the first to see the
    /// error records it; the levels above find it set).
    failed_at: std::cell::RefCell<Option<String>>,
}

impl Track {
    fn fail<T, E>(&self, at: &Seg<'_>, r: Result<T, E>) -> Result<T, E> {
        if r.is_err() {
            let mut failed = self.failed_at.borrow_mut();
            if failed.is_none() {
                *failed = Some(at.to_string());
            }
        }
        r
    }
}

/// A deserializer of a JSON value (as serde_json's, by value) that records what the target
/// ignores and where it failed, in `track`.
struct Tracked<'p> {
    value: Value,
    at: &'p Seg<'p>,
    track: &'p Track,
}

impl<'de> serde::Deserializer<'de> for Tracked<'_> {
    type Error = serde_json::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Object(map) => visitor.visit_map(TrackedMap { iter: map.into_iter(), next: None, at: self.at, track: self.track }),
            Value::Array(items) => visitor.visit_seq(TrackedSeq { iter: items.into_iter().enumerate(), at: self.at, track: self.track }),
            // Scalars have nothing to ignore: serde_json reads them.
            scalar => scalar.deserialize_any(visitor),
        }
    }

    fn deserialize_option<V: serde::de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.value {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: serde::de::Visitor<'de>>(self, _name: &'static str, visitor: V) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: serde::de::Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.value.deserialize_enum(name, variants, visitor)
    }

    fn deserialize_ignored_any<V: serde::de::Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        if !self.value.is_null() {
            self.track.ignored.borrow_mut().push(self.at.to_string());
        }
        visitor.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf unit unit_struct
        seq tuple tuple_struct map struct identifier
    }
}

struct TrackedMap<'p> {
    iter: serde_json::map::IntoIter,
    next: Option<(String, Value)>,
    at: &'p Seg<'p>,
    track: &'p Track,
}

impl<'de> serde::de::MapAccess<'de> for TrackedMap<'_> {
    type Error = serde_json::Error;

    fn next_key_seed<K: serde::de::DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Self::Error> {
        self.next = self.iter.next();
        match &self.next {
            Some((key, _)) => seed.deserialize(serde::de::value::StrDeserializer::new(key)).map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<S: serde::de::DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, Self::Error> {
        let Some((key, value)) = self.next.take() else {
            return Err(serde::de::Error::custom("a value without its key"));
        };
        let at = Seg::Key(self.at, &key);
        let r = seed.deserialize(Tracked { value, at: &at, track: self.track });
        self.track.fail(&at, r)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

struct TrackedSeq<'p> {
    iter: std::iter::Enumerate<std::vec::IntoIter<Value>>,
    at: &'p Seg<'p>,
    track: &'p Track,
}

impl<'de> serde::de::SeqAccess<'de> for TrackedSeq<'_> {
    type Error = serde_json::Error;

    fn next_element_seed<S: serde::de::DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>, Self::Error> {
        match self.iter.next() {
            Some((i, value)) => {
                let at = Seg::Index(self.at, i);
                let r = seed.deserialize(Tracked { value, at: &at, track: self.track }).map(Some);
                self.track.fail(&at, r)
            }
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
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
        // The innermost failing value is named, after fields and items that read fine.
        let e = parse("apiVersion: v1\nkind: Pod\nmetadata: {name: a, labels: {app: web, tier: [x]}}\nspec: {containers: [{name: c}, {name: d, ports: [{containerPort: 80}, {containerPort: 81, protocol: 7}]}]}\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("test.yaml: document 1: Pod a: metadata.labels.tier: invalid type: sequence"), "{e}");
        let e = parse("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c}, {name: d, ports: [{containerPort: 80}, {containerPort: 81, protocol: [7]}]}]}\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("test.yaml: document 1: Pod a: spec.containers[1].ports[1].protocol: invalid type"), "{e}");

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

    /// Strings of a manifest that its warnings and errors quote (a kind, a name, an unknown
    /// field, a value serde reports) are clipped: 10 MB of them make a short message that
    /// still names the file, the document and the object.
    #[test]
    fn huge_strings_are_clipped_in_warnings_and_errors() {
        const MB10: usize = 10 << 20;
        let huge = "v".repeat(MB10);
        let short = |m: &str| {
            assert!(m.len() < 1024, "{} bytes: {}", m.len(), &m[..300]);
            // The marker of the value, or of a field path or message that quotes it.
            assert!(m.contains("…(10485") && m.contains(" bytes)"), "{m}");
        };
        // A skipped kind, and a skipped object's name; a Pod's unknown field; a Pod with a
        // 10 MB label value (read, no warning). (YAML keys are at most 1024 characters:
        // documents with a 10 MB key are JSON.)
        let unknown_field =
            format!(r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "p"}}, "spec": {{"containers": [], "{huge}": 1}}}}"#);
        let m = parse(&format!(
            "apiVersion: v1\nkind: {huge}\nmetadata: {{name: a}}\n---\n\
             apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {huge}}}\n---\n\
             {unknown_field}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {{name: q, labels: {{app: {huge}}}}}\n"
        ))
        .unwrap();
        assert_eq!(m.objects.len(), 2);
        assert_eq!(m.warnings.len(), 3, "{:?}", m.warnings.iter().map(|w| &w[..200]).collect::<Vec<_>>());
        for w in &m.warnings {
            short(w);
        }
        assert!(m.warnings[0].starts_with("test.yaml: document 1: skipping vvv"), "{}", &m.warnings[0][..100]);
        assert!(m.warnings[1].starts_with("test.yaml: document 2: skipping ConfigMap vvv"), "{}", &m.warnings[1][..100]);
        assert!(m.warnings[2].starts_with("test.yaml: document 3: Pod p: spec.vvv"), "{}", &m.warnings[2][..100]);
        // Errors: an unknown metadata field, a value serde quotes, a bad pod IP, a name, an
        // apiVersion; read as YAML and as JSON.
        for text in [
            format!(r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "a", "{huge}": 1}}}}"#),
            format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: a}}\nspec: {{hostNetwork: {huge}}}\n"),
            format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: a}}\nstatus: {{podIP: {huge}}}\n"),
            format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {huge}}}\nstatus: {{podIP: nope}}\n"),
            format!("apiVersion: {huge}\nkind: Pod\nmetadata: {{name: a}}\n"),
            format!(r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "a"}}, "status": {{"podIP": "{huge}"}}}}"#),
        ] {
            let e = parse(&text).unwrap_err().to_string();
            short(&e);
            assert!(e.starts_with("test.yaml: document 1: Pod "), "{}", &e[..100]);
        }
        // The YAML parser's own message quotes a duplicate key: clipped, its location kept.
        let e = parse(&format!("apiVersion: v1\nkind: Pod\nmetadata:\n  ? {huge}\n  : 1\n  ? {huge}\n  : 2\n")).unwrap_err().to_string();
        short(&e);
        assert!(e.starts_with("test.yaml: document 1: not valid YAML: duplicate mapping key: vvv"), "{}", &e[..100]);
        assert!(e.ends_with(" at line 6, column 5"), "{e}");
    }

    /// [`StrictValue`] reads what serde_json's `Value` reads, and says where the first
    /// duplicate key is instead of keeping the last value silently.
    #[test]
    fn strict_values_locate_duplicate_keys() {
        let read = |text: &str| serde_json::from_str::<StrictValue>(text).unwrap();
        let plain = r#"{"a": [1, {"b": null}], "c": "d"}"#;
        assert_eq!(read(plain), StrictValue { value: serde_json::from_str(plain).unwrap(), duplicate: None });
        assert_eq!(read(r#"{"name": "api.example.com", "name": "*.example.com"}"#).duplicate.as_deref(), Some(".name"));
        assert_eq!(
            read(r#"[0, {"ports": [{"port": 1}, {"port": 2, "port": 3}], "x": 1, "x": 2}]"#).duplicate.as_deref(),
            Some("[1].ports[1].port")
        );
        // Not only the first key: the first duplicate, in document order.
        assert_eq!(read(r#"{"a": 1, "b": {"c": 1, "c": 2}, "a": 3}"#).duplicate.as_deref(), Some(".b.c"));
        // A manifest with one is read by YAML, which names the error.
        let e = parse(r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "name": "b"}}"#).unwrap_err().to_string();
        assert!(e.contains("not valid YAML"), "{e}");
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
        // Nulls (even of fields the schema lacks), empty lists and data maps are not unknown
        // fields.
        let m = parse(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec: {podSelector: {}, podSelecter: null}\n",
        )
        .unwrap();
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
        let m = parse(
            "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, labels: {any: thing}, annotations: null}\n\
             spec: {podSelector: {matchLabels: {weird.key/x: v}}, policyTypes: [Ingress], ingress: [], egress: null}\n",
        )
        .unwrap();
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
    }

    /// A manifest large enough to be parsed on several threads reads as one thread reads it:
    /// the same objects in the same order, the same warnings, and the first error with the
    /// same document and line.
    #[test]
    fn a_large_manifest_parses_on_several_threads_as_on_one() {
        let mut text = String::new();
        for i in 0..6000 {
            if i % 7 == 0 {
                text.push_str(&format!("---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p{i}\n  namespace: ns-{}\n  labels: {{app: a{}}}\nspec: {{nodeName: n1}}\nstatus: {{podIPs: [{{ip: 198.18.{}.{}}}]}}\n", i % 5, i % 3, i / 250, i % 250));
            } else if i % 11 == 0 {
                text.push_str(&format!(
                    "---\n{{\"apiVersion\": \"apps/v1\", \"kind\": \"Deployment\", \"metadata\": {{\"name\": \"d{i}\"}}}}\n"
                ));
            } else {
                text.push_str(&format!("---\n{{\"apiVersion\": \"v1\", \"kind\": \"Pod\", \"metadata\": {{\"name\": \"p{i}\", \"namespace\": \"ns-{}\", \"labels\": {{\"app\": \"a{}\"}}}}, \"spec\": {{\"nodeName\": \"n1\", \"priority\": 3}}}}\n", i % 5, i % 3));
            }
        }
        assert!(text.len() > PARALLEL_MIN_BYTES / 2, "{}", text.len());
        let text = text.repeat(2);
        let path = Path::new("big.yaml");
        let sequential = parse_documents(path, &documents(&text).0, 0).unwrap();
        let parallel = parse_str(path, &text).unwrap();
        assert_eq!(parallel.objects, sequential.objects);
        assert_eq!(parallel.warnings, sequential.warnings);
        assert!(parallel.objects.len() > 10_000 && !parallel.warnings.is_empty());
        // An error late in the file: the same message (document and line) either way.
        let bad = format!(
            "{text}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: x}}\nspec: {{containers: [{{name: c, ports: [{{containerPort: abc}}]}}]}}\n{text}"
        );
        let one = parse_documents(path, &documents(&bad).0, 0).unwrap_err().to_string();
        let many = parse_str(path, &bad).unwrap_err().to_string();
        assert_eq!(many, one);
        let bad_yaml = format!("{text}---\na: [\n{text}");
        let one = parse_documents(path, &documents(&bad_yaml).0, 0).unwrap_err().to_string();
        assert_eq!(parse_str(path, &bad_yaml).unwrap_err().to_string(), one);
        assert!(one.contains("document 12001"), "{one}");
    }

    #[test]
    fn a_large_text_splits_into_the_same_documents_on_several_threads() {
        let block = "# c\n%YAML 1.2\n---\na: |\n  ---\n  x\n...\n# between\n\nb: 1\n--- |\n  t\n---\n---\r\nkey: v\r\n---\n\
                     {\"apiVersion\": \"v1\"}\n  indented: é\n--- \nz: 1\n...\n---\n";
        let text = block.repeat(2 + 2 * PARALLEL_MIN_BYTES / block.len());
        let whole: Vec<_> = documents(&text).0.into_iter().map(|d| (d.first_line, d.text, d.body)).collect();
        for threads in 2..=5 {
            let split: Vec<_> = split_documents(&text, threads).into_iter().map(|d| (d.first_line, d.text, d.body)).collect();
            assert_eq!(split.len(), whole.len(), "{threads} threads");
            assert!(split == whole, "{threads} threads: the documents differ");
        }
        // A cut is only ever after a line of content.
        assert_eq!(document_cut("a: 1\n---\n", 0), Some(5));
        assert_eq!(document_cut("# c\n---\n", 0), None);
        assert_eq!(document_cut("...\n---\n", 0), None);
        assert_eq!(document_cut("%YAML 1.2\n---\n", 0), None);
        assert_eq!(document_cut("a: 1\n---x\n", 0), None);
    }

    #[test]
    fn documents_are_numbered_as_the_parser_counts_them() {
        fn docs(text: &str) -> Vec<(usize, &str)> {
            documents(text).0.into_iter().map(|d| (d.first_line, d.text)).collect()
        }
        // Comments and directives before `---` belong to its document; `---` inside
        // indented block scalars is text; a document ends at `...` or the next `---`.
        let text = "# c\n%YAML 1.2\n---\na: |\n  ---\n  x\n...\n# between\n\nb: 1\n--- |\n  t\n---\n---\r\n";
        assert_eq!(
            docs(text),
            [
                (0, "# c\n%YAML 1.2\n---\na: |\n  ---\n  x\n...\n"),
                (7, "# between\n\nb: 1\n"),
                (10, "--- |\n  t\n"),
                (12, "---\n"),
                (13, "---\r\n")
            ]
        );
        assert_eq!(docs("---x: 1\n----\n"), [(0, "---x: 1\n----\n")]);
        assert_eq!(docs("# only a comment\n...\n"), []);
        assert_eq!(docs(""), []);
        // A lone `\r` breaks lines too: this comment is followed by a block scalar.
        assert_eq!(docs("a: 1\r---\rb: 2\r"), [(0, "a: 1\r"), (1, "---\rb: 2\r")]);
        assert_eq!(docs("#c\r>  p\n"), [(0, "#c\r>  p\n")]);
        // What the parser must see to reject: a directive without a document, content after `...`.
        assert_eq!(docs("%YAML 1.2\n# c\n"), [(0, "%YAML 1.2\n# c\n")]);
        assert_eq!(docs("a: 1\n... b\nc: 2\n"), [(0, "a: 1\n"), (1, "... b\nc: 2\n")]);
        for text in ["%YAML 1.2\n", "... b\n", "{apiVersion: v1, kind: Namespace, metadata: {name: x}}\n... b\n"] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains("not valid YAML"), "{text:?}: {e}");
        }
        assert!(parse("#c\r[1]\n").unwrap_err().to_string().contains("not a Kubernetes object"));

        // Empty documents count; errors name the file's line.
        let e = parse("# c\n---\n---\nkind: Pod\n").unwrap_err().to_string();
        assert_eq!(e, "test.yaml: document 2: apiVersion: missing");
        let e = parse("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n---\nkind: [\n").unwrap_err().to_string();
        assert!(e.starts_with("test.yaml: document 2: not valid YAML: "), "{e}");
        assert!(e.ends_with("at line 5, column 7"), "{e}");
    }

    #[test]
    fn json_documents_read_as_yaml_reads_them() {
        let docs = [
            r#"{"a": [1, -2, 3.5, 1e3, true, false, null, {}, []], "b": "\u00e9\n\"x\"\t\\", "c": {"d": {"e": "yes"}}}"#,
            "{\"k\": \"v\"}",
        ];
        for doc in docs {
            assert_eq!(from_json(doc), Some(from_yaml::<Value>(doc, 0).unwrap()), "{doc}");
        }
        // The same depth limit: the deepest collection at MAX_DEPTH is read, one more is not.
        let nest = |n: usize| format!("{{\"a\": {}1{}}}", "[".repeat(n), "]".repeat(n));
        assert!(from_json(&nest(MAX_DEPTH - 1)).is_some() && from_yaml::<Value>(&nest(MAX_DEPTH - 1), 0).is_ok());
        assert!(from_json(&nest(MAX_DEPTH)).is_none() && from_yaml::<Value>(&nest(MAX_DEPTH), 0).is_err());
        // Not JSON (YAML reads it): a comment, plain scalars, a duplicate key, deep nesting.
        let deep = nest(200);
        for doc in ["{\"a\": 1} # c", "{a: yes}", "{\"a\": 1, \"a\": 2}", &deep, "[1]"] {
            assert_eq!(from_json(doc), None, "{doc}");
        }
        // `kubectl get -o json`: a List, its items named by index.
        let m = parse(
            r#"{"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}},
             {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}}]}"#,
        )
        .unwrap();
        assert_eq!(m.objects.len(), 1);
        assert!(m.warnings[0].contains("document 1, items[1]: skipping Service s"), "{:?}", m.warnings);
        let e = parse("---\n{\"apiVersion\": \"v1\", \"kind\": \"Pod\", \"kind\": \"Pod\"}\n").unwrap_err().to_string();
        assert!(e.starts_with("test.yaml: document 1: not valid YAML: ") && e.contains("duplicate"), "{e}");
        let e = parse(&format!("---\n{deep}\n")).unwrap_err().to_string();
        assert!(e == "test.yaml: document 1: not valid YAML: nested deeper than 64 levels at line 2, column 70", "{e}");
    }

    /// The document split agrees with the parser's own multi-document reading on every YAML
    /// file of the repository (manifests, CRDs, conformance cases, goldens).
    #[test]
    fn documents_agree_with_the_parser_on_the_repository() {
        fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                // A Helm chart's templates are Go templates, not YAML (their render is deploy/).
                if path.is_dir() && !path.ends_with("helm/flock/templates") {
                    yaml_files(&path, out);
                } else if path.extension().is_some_and(|e| e == "yaml") {
                    out.push(path);
                }
            }
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        for dir in ["deploy", "tests/conformance", "tests/golden"] {
            yaml_files(&root.join(dir), &mut files);
        }
        assert!(files.len() > 50, "{files:?}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let split: Vec<Value> = documents(&text)
                .0
                .into_iter()
                .map(|d| from_yaml::<Value>(d.text, d.first_line).unwrap())
                .filter(|v| !v.is_null())
                .collect();
            let whole: Vec<Value> = serde_saphyr::from_multiple_with_options(&text, yaml_options()).unwrap();
            assert_eq!(split, whole, "{}", file.display());
        }
    }

    /// The same on the `manifest` fuzz corpus (hostile input): both read the same
    /// documents, or both fail.
    #[test]
    fn documents_agree_with_the_parser_on_the_fuzz_corpus() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/manifest");
        let mut read = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
            let whole: Result<Vec<Value>, _> = serde_saphyr::from_multiple_with_options(text, yaml_options());
            let split: Result<Vec<Value>, _> = documents(text)
                .0
                .into_iter()
                .map(|d| from_yaml::<Value>(d.text, d.first_line))
                .filter(|v| v.as_ref().map_or(true, |v| !v.is_null()))
                .collect();
            match (whole, split) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a, b, "{}", path.display());
                    read += 1;
                }
                (Err(_), Err(_)) => {}
                (a, b) => panic!("{}: the parser: {:?}, by document: {:?}", path.display(), a.map(|v| v.len()), b.map(|v| v.len())),
            }
        }
        assert!(read > 100, "{read}");
    }

    #[test]
    fn a_byte_order_mark_is_accepted() {
        for text in [
            "\u{feff}apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n",
            "\u{feff}# c\n---\n{apiVersion: v1, kind: Namespace, metadata: {name: x}}\n",
        ] {
            let m = parse(text).unwrap();
            assert_eq!(m.objects.len(), 1, "{text:?}");
        }
        let e = parse("\u{feff}# c\n---\nkind: Pod\n").unwrap_err().to_string();
        assert_eq!(e, "test.yaml: document 1: apiVersion: missing");
    }

    /// A ConfigMap (skipped) whose `data.x` nests `depth` sequences.
    fn nested(depth: usize, block: bool) -> String {
        let value = if block { format!("\n    {}x", "- ".repeat(depth)) } else { format!("{}{}", "[".repeat(depth), "]".repeat(depth)) };
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: x}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c}}\ndata:\n  x: {value}\n"
        )
    }

    #[test]
    fn deep_nesting_fails_at_the_depth_budget() {
        // The document's mapping and `data` are two levels.
        for block in [false, true] {
            let m = parse(&nested(MAX_DEPTH - 2, block)).unwrap();
            assert_eq!(m.objects.len(), 1);
            assert!(m.warnings[0].contains("skipping ConfigMap c"), "{:?}", m.warnings);
            for depth in [MAX_DEPTH - 1, 1_000, 100_000] {
                let e = parse(&nested(depth, block)).unwrap_err().to_string();
                assert!(e.starts_with("test.yaml: document 2: not valid YAML: "), "{e}");
                let line = if block { 10 } else { 9 };
                assert!(e.contains(&format!("nested deeper than {MAX_DEPTH} levels at line {line}, column ")), "{e}");
            }
        }
    }

    #[test]
    fn alias_bombs_fail_and_aliases_work() {
        // "Billion laughs": nine levels of ten aliases each.
        let mut text = String::from(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lol}\ndata:\n  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n",
        );
        for (prev, name) in ["a", "b", "c", "d", "e", "f", "g", "h"].iter().zip(["b", "c", "d", "e", "f", "g", "h", "i"]) {
            text.push_str(&format!("  {name}: &{name} [{}]\n", vec![format!("*{prev}"); 10].join(", ")));
        }
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.starts_with("test.yaml: document 1: not valid YAML: "), "{e}");
        assert!(e.contains("alias"), "{e}");

        let m = parse("apiVersion: v1\nkind: Pod\nmetadata: {name: a, labels: &l {app: web}}\nspec: {containers: [], nodeSelector: *l}\n")
            .unwrap();
        assert_eq!(m.objects.len(), 1);
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
        let m = crate::source::files::load_manifests(&[path]).unwrap();
        let s = m.to_snapshot();
        assert_eq!(s.pod_count(), 9);
        assert_eq!(s.nodes().count(), 2);
        let a = s.pod_by_name(&ObjectRef::new("x", "a")).unwrap();
        assert_eq!(a.ports.len(), 6);
        assert_eq!(a.ips, vec!["198.18.1.11".parse::<std::net::IpAddr>().unwrap()]);
    }
}
