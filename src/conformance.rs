//! The conformance case format (`tests/conformance/FORMAT.md`): reading cases and comparing
//! observed reachability with their matrices. Pure; runners (the packet tracer in unit tests,
//! `flockctl conformance` on real kernels) supply the observations.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::model::manifest::{self, DocRef, Manifests, Object};
use crate::model::{ObjectRef, Protocol};

/// The nine base pods, in the default matrix order.
pub const DEFAULT_ORDER: [&str; 9] = ["x/a", "x/b", "x/c", "y/a", "y/b", "y/c", "z/a", "z/b", "z/c"];

/// An IP family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: std::net::IpAddr) -> Self {
        if ip.is_ipv4() { Self::V4 } else { Self::V6 }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "IPv4" | "ipv4" | "4" => Some(Self::V4),
            "IPv6" | "ipv6" | "6" => Some(Self::V6),
            _ => None,
        }
    }
}

/// What a cell expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Connect,
    Blocked,
    Unchecked,
}

/// A case folder that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    #[error("cannot read {path}: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error(transparent)]
    Manifest(#[from] manifest::ManifestError),
}

/// One probe of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    pub port: u16,
    pub protocol: Protocol,
    pub port_name: Option<String>,
    pub kernel_optional: bool,
    /// `None`: each destination's primary address (its first pod IP) decides the family.
    pub family: Option<Family>,
    /// Rows and columns.
    pub order: Vec<String>,
    /// row → expectations by column.
    pub matrix: BTreeMap<String, Vec<Expect>>,
}

impl Probe {
    /// The expectation for (from, to).
    pub fn expect(&self, from: &str, to: &str) -> Expect {
        let Some(col) = self.order.iter().position(|p| p == to) else { return Expect::Unchecked };
        self.matrix.get(from).and_then(|row| row.get(col)).copied().unwrap_or(Expect::Unchecked)
    }

    /// A human label: `TCP/80` (with the port name and family when given).
    pub fn label(&self) -> String {
        let mut s = format!("{}/{}", self.protocol, self.port);
        if let Some(n) = &self.port_name {
            s.push_str(&format!(" ({n})"));
        }
        if let Some(f) = self.family {
            s.push_str(&format!(" {}", f.as_str()));
        }
        s
    }
}

/// A deletion of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRef {
    pub kind: manifest::Kind,
    pub key: ObjectRef,
}

/// One step: changes, then probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub apply: Vec<Object>,
    pub delete: Vec<DeleteRef>,
    pub probes: Vec<Probe>,
}

/// A case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// The folder name (with its `NNN-` prefix).
    pub dir_name: String,
    pub name: String,
    pub source: String,
    pub notes: String,
    pub steps: Vec<Step>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: String,
    #[serde(default)]
    source: String,
    #[serde(default)]
    notes: String,
    steps: Vec<RawStep>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    #[serde(default)]
    apply: Vec<Value>,
    #[serde(default)]
    delete: Vec<RawDelete>,
    #[serde(default)]
    probes: Vec<RawProbe>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDelete {
    kind: String,
    #[serde(default)]
    namespace: String,
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProbe {
    port: u16,
    protocol: String,
    #[serde(default)]
    port_name: Option<String>,
    #[serde(default)]
    kernel_optional: bool,
    #[serde(default)]
    family: Option<String>,
    #[serde(default)]
    order: Option<Vec<String>>,
    matrix: BTreeMap<String, String>,
}

/// Case folders under `dirs`: each dir is a case (has `case.yaml`) or holds case folders.
pub fn find_cases(dirs: &[PathBuf]) -> Result<Vec<PathBuf>, CaseError> {
    let mut out = Vec::new();
    for d in dirs {
        if d.join("case.yaml").is_file() {
            out.push(d.clone());
            continue;
        }
        let read = std::fs::read_dir(d).map_err(|error| CaseError::Read { path: d.clone(), error })?;
        let mut sub: Vec<PathBuf> = read.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.join("case.yaml").is_file()).collect();
        sub.sort();
        if sub.is_empty() {
            return Err(CaseError::Invalid { path: d.clone(), message: "no case.yaml here or in its folders".into() });
        }
        out.extend(sub);
    }
    Ok(out)
}

/// The ClusterNetworkPolicy cases to run on the IPv6 base (`tests/conformance-v6/`): that
/// folder's own (IPv6 copies of the cases that write IPv4 CIDRs) and every case of `v4_root`
/// that applies a ClusterNetworkPolicy and writes no IPv4 address, as is.
pub fn ipv6_cluster_policy_cases(v4_root: &Path, v6_root: &Path) -> Result<Vec<PathBuf>, CaseError> {
    let mut out = Vec::new();
    for dir in find_cases(&[v4_root.to_path_buf()])? {
        let path = dir.join("case.yaml");
        let text = std::fs::read_to_string(&path).map_err(|error| CaseError::Read { path, error })?;
        let ipv4 = text.split(|c: char| !(c.is_ascii_digit() || c == '.')).any(|w| w.parse::<std::net::Ipv4Addr>().is_ok());
        if text.contains("kind: ClusterNetworkPolicy") && !ipv4 {
            out.push(dir);
        }
    }
    out.extend(find_cases(&[v6_root.to_path_buf()])?);
    Ok(out)
}

/// Reads `<dir>/case.yaml`.
pub fn load_case(dir: &Path) -> Result<Case, CaseError> {
    let path = dir.join("case.yaml");
    let text = std::fs::read_to_string(&path).map_err(|error| CaseError::Read { path: path.clone(), error })?;
    let dir_name = dir.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    parse_case(&path, &dir_name, &text)
}

/// Parses a case's text; `path` names it in errors.
pub fn parse_case(path: &Path, dir_name: &str, text: &str) -> Result<Case, CaseError> {
    let invalid = |message: String| CaseError::Invalid { path: path.to_path_buf(), message };
    let raw: RawCase = manifest::from_yaml(text, 0).map_err(invalid)?;
    let bare = dir_name.split_once('-').filter(|(n, _)| n.chars().all(|c| c.is_ascii_digit())).map_or(dir_name, |(_, rest)| rest);
    if !dir_name.is_empty() && raw.name != bare {
        return Err(invalid(format!("name {:?} does not match the folder name {dir_name:?}", raw.name)));
    }
    let mut steps = Vec::new();
    for (i, s) in raw.steps.into_iter().enumerate() {
        let mut objects = Manifests::default();
        for (j, v) in s.apply.into_iter().enumerate() {
            manifest::parse_value(path, DocRef { document: i + 1, item: Some(j) }, v, &mut objects)?;
        }
        if let Some(w) = objects.warnings.first() {
            return Err(invalid(format!("steps[{i}].apply: {w}")));
        }
        let mut delete = Vec::new();
        for d in s.delete {
            let kind = manifest::Kind::parse(&d.kind).ok_or_else(|| invalid(format!("steps[{i}].delete: unknown kind {:?}", d.kind)))?;
            delete.push(DeleteRef { kind, key: ObjectRef::new(d.namespace, d.name) });
        }
        let mut probes = Vec::new();
        for (j, p) in s.probes.into_iter().enumerate() {
            let at = format!("steps[{i}].probes[{j}]");
            let protocol =
                Protocol::parse(&p.protocol).ok_or_else(|| invalid(format!("{at}.protocol: {:?} is not TCP, UDP or SCTP", p.protocol)))?;
            let family = match p.family.as_deref() {
                None => None,
                Some(f) => Some(Family::parse(f).ok_or_else(|| invalid(format!("{at}.family: {f:?} is not IPv4 or IPv6")))?),
            };
            let order = p.order.unwrap_or_else(|| DEFAULT_ORDER.iter().map(|s| s.to_string()).collect());
            let mut matrix = BTreeMap::new();
            for (row, cells) in p.matrix {
                if !order.contains(&row) {
                    return Err(invalid(format!("{at}.matrix: row {row:?} is not in the order")));
                }
                if cells.chars().count() != order.len() {
                    return Err(invalid(format!("{at}.matrix.{row}: {} cells for {} columns", cells.chars().count(), order.len())));
                }
                let cells: Vec<Expect> = cells
                    .chars()
                    .map(|c| match c {
                        '1' => Ok(Expect::Connect),
                        '0' => Ok(Expect::Blocked),
                        '-' => Ok(Expect::Unchecked),
                        other => Err(invalid(format!("{at}.matrix.{row}: cell {other:?} is not 1, 0 or -"))),
                    })
                    .collect::<Result<_, _>>()?;
                matrix.insert(row, cells);
            }
            probes.push(Probe {
                port: p.port,
                protocol,
                port_name: p.port_name,
                kernel_optional: p.kernel_optional,
                family,
                order,
                matrix,
            });
        }
        steps.push(Step { apply: objects.objects, delete, probes });
    }
    Ok(Case { dir_name: dir_name.to_string(), name: raw.name, source: raw.source, notes: raw.notes, steps })
}

/// One checked cell that did not match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub step: usize,
    pub probe: String,
    pub from: String,
    pub to: String,
    pub expected: Expect,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.expected {
            Expect::Connect => "expected to connect, was blocked",
            _ => "expected blocked, connected",
        };
        write!(f, "step {} {} {} -> {}: {what}", self.step + 1, self.probe, self.from, self.to)
    }
}

/// Compares observations (`(from, to) → connected`) with a probe's matrix.
pub fn compare(step: usize, probe: &Probe, observed: &BTreeMap<(String, String), bool>) -> Vec<Mismatch> {
    let mut out = Vec::new();
    for from in &probe.order {
        for to in &probe.order {
            let expected = probe.expect(from, to);
            if expected == Expect::Unchecked || from == to {
                continue;
            }
            let connected = observed.get(&(from.clone(), to.clone())).copied();
            let ok = matches!((expected, connected), (Expect::Connect, Some(true)) | (Expect::Blocked, Some(false)));
            if !ok {
                out.push(Mismatch { step, probe: probe.label(), from: from.clone(), to: to.clone(), expected });
            }
        }
    }
    out
}

/// Applies a step's changes to a snapshot: objects are created or replaced by kind and key
/// (a Pod with another uid replaces the pod of that name: a new sandbox); deletions follow.
pub fn apply_step(snapshot: &mut crate::model::Snapshot, step: &Step) {
    for obj in &step.apply {
        if let Object::Pod(p) = obj {
            let old: Vec<String> =
                snapshot.pods_in(&p.namespace).filter(|o| o.name == p.name && o.uid != p.uid).map(|o| o.uid.clone()).collect();
            for uid in old {
                snapshot.remove_pod(&uid);
            }
        }
        obj.apply_to(snapshot);
    }
    for d in &step.delete {
        match d.kind {
            manifest::Kind::NetworkPolicy => {
                snapshot.remove_policy(&d.key);
            }
            manifest::Kind::ClusterNetworkPolicy => {
                snapshot.remove_cluster_policy(&d.key.name);
            }
            manifest::Kind::Pod => {
                let uids: Vec<String> =
                    snapshot.pods_in(&d.key.namespace).filter(|p| p.name == d.key.name).map(|p| p.uid.clone()).collect();
                for uid in uids {
                    snapshot.remove_pod(&uid);
                }
            }
            manifest::Kind::Namespace => {
                snapshot.remove_namespace(&d.key.name);
            }
            manifest::Kind::Node => {
                snapshot.remove_node(&d.key.name);
            }
        }
    }
    manifest::add_implicit_namespaces(snapshot);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_shared_examples() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
        let cases = find_cases(&[root]).unwrap();
        assert!(cases.len() >= 2);
        let c = load_case(&cases[1]).unwrap();
        assert_eq!(c.name, "allow-from-namespace-y-on-81");
        assert_eq!(c.steps.len(), 2);
        assert_eq!(c.steps[0].apply.len(), 1);
        assert_eq!(c.steps[1].delete[0].key, ObjectRef::new("x", "b-from-y-81"));
        let p = &c.steps[0].probes[0];
        assert_eq!(p.expect("y/a", "x/b"), Expect::Connect);
        assert_eq!(p.expect("x/a", "x/b"), Expect::Blocked);
        assert_eq!(p.expect("x/a", "x/a"), Expect::Unchecked);
    }

    #[test]
    fn bad_cases_are_rejected_with_the_field() {
        let bad = |t: &str| parse_case(Path::new("c.yaml"), "001-x", t).unwrap_err().to_string();
        assert!(bad("name: y\nsteps: []\n").contains("does not match the folder"));
        assert!(bad("name: x\nsteps: [{probes: [{port: 80, protocol: ICMP, matrix: {}}]}]\n").contains("protocol"));
        assert!(bad("name: x\nsteps: [{probes: [{port: 80, protocol: TCP, matrix: {x/a: '-1'}}]}]\n").contains("2 cells for 9 columns"));
        assert!(bad("name: x\nsteps: [{probes: [{port: 80, protocol: TCP, matrix: {q/a: '-11111111'}}]}]\n").contains("not in the order"));
        assert!(bad("name: x\nbogus: 1\nsteps: []\n").contains("bogus"));
    }
}
