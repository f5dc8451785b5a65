//! The conformance case format (docs/development.md, "Conformance case format", plus flock's
//! `cname` records; docs/development.md, "Conformance case format"): reading cases and comparing observed
//! reachability with their matrices. Pure; runners (the packet tracer in unit tests,
//! `flockctl conformance` on real kernels) supply the observations.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::model::manifest::{self, DocRef, Manifests, Object};
use crate::model::{ObjectRef, Protocol};

/// The nine base pods, in the default matrix order.
pub(crate) const DEFAULT_ORDER: [&str; 9] = ["x/a", "x/b", "x/c", "y/a", "y/b", "y/c", "z/a", "z/b", "z/c"];

use crate::model::Family;

pub mod cluster;

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
    pub(crate) port_name: Option<String>,
    pub(crate) kernel_optional: bool,
    /// `None`: each destination's primary address (its first pod IP) decides the family.
    pub family: Option<Family>,
    /// Rows and columns.
    pub order: Vec<String>,
    /// row → expectations by column.
    pub(crate) matrix: BTreeMap<String, Vec<Expect>>,
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

/// A probe by name (`host`): each source resolves the name through the case's DNS server,
/// then connects to the first address of the answer (of the probe's family, by default the
/// source's first pod IP's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostProbe {
    /// The name as the case writes it (asked as written: resolvers and flock ignore case).
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) protocol: Protocol,
    pub(crate) family: Option<Family>,
    /// Source → what its one cell expects.
    pub(crate) cells: BTreeMap<String, HostExpect>,
}

/// What the cell of a probe by name expects: the format's `1`, `0` and `-`, and flock's
/// narrower `B` (the name resolved, the connection did not succeed) and `N` (the name did not
/// resolve: no answer, or none with an address of the family).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostExpect {
    Connect,
    NoConnection,
    Blocked,
    Unresolved,
    Unchecked,
}

impl HostExpect {
    fn parse(cell: &str) -> Option<Self> {
        Some(match cell {
            "1" => Self::Connect,
            "0" => Self::NoConnection,
            "B" => Self::Blocked,
            "N" => Self::Unresolved,
            "-" => Self::Unchecked,
            _ => return None,
        })
    }

    fn holds(self, seen: HostSeen) -> bool {
        match self {
            Self::Connect => seen == HostSeen::Connected,
            Self::NoConnection => seen != HostSeen::Connected,
            Self::Blocked => seen == HostSeen::Blocked,
            Self::Unresolved => seen == HostSeen::Unresolved,
            Self::Unchecked => true,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Connect => "expected to connect",
            Self::NoConnection => "expected no connection",
            Self::Blocked => "expected to resolve and be blocked",
            Self::Unresolved => "expected not to resolve",
            Self::Unchecked => "not checked",
        }
    }
}

/// What a probe by name saw from one source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostSeen {
    Connected,
    /// The name resolved; the connection to its first address did not succeed.
    Blocked,
    Unresolved,
}

impl HostSeen {
    fn as_str(self) -> &'static str {
        match self {
            Self::Connected => "connected",
            Self::Blocked => "resolved, was blocked",
            Self::Unresolved => "did not resolve",
        }
    }
}

impl HostProbe {
    /// A human label: `api.example.test TCP/80` (with the family when given).
    pub(crate) fn label(&self) -> String {
        let mut s = format!("{} {}/{}", self.host, self.protocol, self.port);
        if let Some(f) = self.family {
            s.push_str(&format!(" {}", f.as_str()));
        }
        s
    }

    /// The sources whose cell is checked.
    pub(crate) fn checked(&self) -> impl Iterator<Item = &str> {
        self.cells.iter().filter(|(_, e)| **e != HostExpect::Unchecked).map(|(s, _)| s.as_str())
    }
}

/// What a name of the case's DNS answers (the format's `dns.records`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RecordData {
    /// Addresses: those of a pod (whichever it has when asked, of the asked family) first,
    /// then fixed ones.
    Addresses { pod: Option<ObjectRef>, fixed: Vec<std::net::IpAddr> },
    /// Another name (a flock extension of the format).
    Cname(String),
}

/// One record of the case's DNS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DnsRecord {
    /// Lowercase, without a trailing dot.
    pub(crate) name: String,
    pub(crate) ttl: u32,
    pub(crate) data: RecordData,
}

/// The case's cluster DNS: the pod that serves it and what it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DnsSpec {
    pub(crate) server: ObjectRef,
    pub(crate) records: Vec<DnsRecord>,
}

/// A record's TTL when the case gives none (seconds).
pub(crate) const DEFAULT_TTL: u32 = 30;

/// A deletion of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRef {
    pub kind: manifest::Kind,
    pub key: ObjectRef,
}

/// One step: a wait, changes, then probes (by name first, then by address).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Step {
    /// How long to wait before the step's changes (e.g. for a record's TTL to pass).
    pub(crate) wait: std::time::Duration,
    pub apply: Vec<Object>,
    /// The applied objects as the case writes them (what a real cluster is sent, rewritten
    /// by [`cluster`]).
    pub(crate) raw_apply: Vec<Value>,
    pub(crate) delete: Vec<DeleteRef>,
    pub probes: Vec<Probe>,
    pub(crate) host_probes: Vec<HostProbe>,
}

impl Step {
    /// The applied objects as the case writes them.
    pub fn raw_apply(&self) -> &[Value] {
        &self.raw_apply
    }

    /// How long to wait before the step's changes.
    pub fn wait(&self) -> std::time::Duration {
        self.wait
    }

    /// The step's deletions.
    pub fn deletions(&self) -> &[DeleteRef] {
        &self.delete
    }
}

/// A case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// The folder name (with its `NNN-` prefix).
    pub dir_name: String,
    pub(crate) name: String,
    pub(crate) source: String,
    pub(crate) notes: String,
    pub(crate) dns: Option<DnsSpec>,
    pub steps: Vec<Step>,
}

impl Case {
    /// Whether a stage that does not see DNS answers (the packet tracer, the reference, an
    /// offline explain) can judge a cell towards pod `to`: not when one of the case's records
    /// answers with `to`'s address, since a domain rule may have learned it.
    pub fn judged_offline(&self, snapshot: &crate::model::Snapshot, to: &str) -> bool {
        let Some(dns) = &self.dns else { return true };
        let Some(key) = ObjectRef::parse(to) else { return true };
        let ips: Vec<std::net::IpAddr> = snapshot.pod_by_name(&key).map(|p| p.ips.clone()).unwrap_or_default();
        !dns.records.iter().any(|r| match &r.data {
            RecordData::Addresses { pod, fixed } => pod.as_ref() == Some(&key) || fixed.iter().any(|a| ips.contains(a)),
            RecordData::Cname(_) => false,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: String,
    #[serde(default)]
    source: String,
    #[serde(default)]
    notes: String,
    #[serde(default)]
    dns: Option<RawDns>,
    steps: Vec<RawStep>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDns {
    server: String,
    #[serde(default)]
    records: Vec<RawRecord>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRecord {
    name: String,
    #[serde(default)]
    pod: Option<String>,
    #[serde(default)]
    addresses: Vec<std::net::IpAddr>,
    #[serde(default)]
    cname: Option<String>,
    #[serde(default)]
    ttl: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStep {
    #[serde(default)]
    wait: Option<f64>,
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
    #[serde(default)]
    host: Option<String>,
    matrix: BTreeMap<String, String>,
}

/// A DNS name as a case writes one, checked as policies' names are (`crate::dns::name`) but
/// never a `*.` pattern: lowercase, without the trailing dot.
fn dns_name(name: &str) -> Result<String, String> {
    let p = crate::dns::DomainPattern::parse(name).map_err(|e| e.to_string())?;
    if p.is_wildcard() {
        return Err("one name, not a pattern".into());
    }
    Ok(p.to_string())
}

fn parse_dns(raw: RawDns, invalid: &dyn Fn(String) -> CaseError) -> Result<DnsSpec, CaseError> {
    let server =
        ObjectRef::parse(&raw.server).ok_or_else(|| invalid(format!("dns.server: {:?} is not namespace/name of a pod", raw.server)))?;
    let mut records = Vec::new();
    for (i, r) in raw.records.into_iter().enumerate() {
        let at = format!("dns.records[{i}]");
        let name = dns_name(&r.name).map_err(|e| invalid(format!("{at}.name: {:?}: {e}", r.name)))?;
        let pod = match &r.pod {
            None => None,
            Some(p) => Some(ObjectRef::parse(p).ok_or_else(|| invalid(format!("{at}.pod: {p:?} is not namespace/name")))?),
        };
        let data = match (r.cname, pod, r.addresses.is_empty()) {
            (Some(c), None, true) => RecordData::Cname(dns_name(&c).map_err(|e| invalid(format!("{at}.cname: {c:?}: {e}")))?),
            (Some(_), _, _) => return Err(invalid(format!("{at}: a cname record takes no pod or addresses"))),
            (None, None, true) => return Err(invalid(format!("{at}: give pod, addresses or cname"))),
            (None, pod, _) => RecordData::Addresses { pod, fixed: r.addresses },
        };
        // A name with a CNAME has no other records (RFC 1034 3.6.2).
        let clash = records
            .iter()
            .any(|o: &DnsRecord| o.name == name && (matches!(o.data, RecordData::Cname(_)) || matches!(data, RecordData::Cname(_))));
        if clash {
            return Err(invalid(format!("{at}: {name} has a cname and other records")));
        }
        records.push(DnsRecord { name, ttl: r.ttl.unwrap_or(DEFAULT_TTL), data });
    }
    Ok(DnsSpec { server, records })
}

/// Parses a case's text; `path` names it in errors.
pub(crate) fn parse_case(path: &Path, dir_name: &str, text: &str) -> Result<Case, CaseError> {
    let invalid = |message: String| CaseError::Invalid { path: path.to_path_buf(), message };
    let raw: RawCase = manifest::from_yaml(text, 0).map_err(|e| invalid(e.to_string()))?;
    let bare = dir_name.split_once('-').filter(|(n, _)| n.chars().all(|c| c.is_ascii_digit())).map_or(dir_name, |(_, rest)| rest);
    if !dir_name.is_empty() && raw.name != bare {
        return Err(invalid(format!("name {:?} does not match the folder name {dir_name:?}", raw.name)));
    }
    let dns = raw.dns.map(|d| parse_dns(d, &invalid)).transpose()?;
    let mut steps = Vec::new();
    for (i, s) in raw.steps.into_iter().enumerate() {
        let wait = match s.wait {
            None => std::time::Duration::ZERO,
            Some(w) => std::time::Duration::try_from_secs_f64(w)
                .map_err(|_| invalid(format!("steps[{i}].wait: {w} is not a number of seconds")))?,
        };
        let mut objects = Manifests::default();
        let raw_apply = s.apply.clone();
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
        let mut host_probes = Vec::new();
        for (j, p) in s.probes.into_iter().enumerate() {
            let at = format!("steps[{i}].probes[{j}]");
            let protocol =
                Protocol::parse(&p.protocol).ok_or_else(|| invalid(format!("{at}.protocol: {:?} is not TCP, UDP or SCTP", p.protocol)))?;
            let family = match p.family.as_deref() {
                None => None,
                Some(f) => Some(Family::parse(f).ok_or_else(|| invalid(format!("{at}.family: {f:?} is not IPv4 or IPv6")))?),
            };
            if let Some(host) = p.host {
                if let Err(e) = dns_name(&host) {
                    return Err(invalid(format!("{at}.host: {host:?}: {e}")));
                }
                if dns.is_none() {
                    return Err(invalid(format!("{at}.host: a probe by name needs the case's dns")));
                }
                if p.order.is_some() || p.kernel_optional || p.port_name.is_some() {
                    return Err(invalid(format!("{at}: a probe by name takes no order, port_name or kernel_optional")));
                }
                let mut cells = BTreeMap::new();
                for (row, cell) in p.matrix {
                    let e = HostExpect::parse(&cell)
                        .ok_or_else(|| invalid(format!("{at}.matrix.{row}: {cell:?} is not one cell: 1, 0, B, N or -")))?;
                    cells.insert(row, e);
                }
                // The name as asked keeps its case (resolvers and flock compare without it).
                host_probes.push(HostProbe { host, port: p.port, protocol, family, cells });
                continue;
            }
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
        steps.push(Step { wait, apply: objects.objects, raw_apply, delete, probes, host_probes });
    }
    Ok(Case { dir_name: dir_name.to_string(), name: raw.name, source: raw.source, notes: raw.notes, dns, steps })
}

/// One checked cell that did not match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub(crate) step: usize,
    pub(crate) probe: String,
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) expected: Expect,
    /// What was expected and seen, where `expected` does not say it (probes by name).
    pub(crate) detail: Option<String>,
}

impl Mismatch {
    /// The cell's source, as the case names it.
    pub fn from(&self) -> &str {
        &self.from
    }

    /// The cell's destination, as the case names it.
    pub fn to(&self) -> &str {
        &self.to
    }
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match (&self.detail, self.expected) {
            (Some(d), _) => d.as_str(),
            (None, Expect::Connect) => "expected to connect, was blocked",
            (None, _) => "expected blocked, connected",
        };
        write!(f, "step {} {} {} -> {}: {what}", self.step + 1, self.probe, self.from, self.to)
    }
}

/// Compares observations (`(from, to) → connected`) with a probe's matrix.
pub(crate) fn compare(step: usize, probe: &Probe, observed: &BTreeMap<(String, String), bool>) -> Vec<Mismatch> {
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
                out.push(Mismatch { step, probe: probe.label(), from: from.clone(), to: to.clone(), expected, detail: None });
            }
        }
    }
    out
}

/// [`compare`], for runners outside the crate (`flockctl conformance --kubeconfig`).
pub fn compare_cells(step: usize, probe: &Probe, observed: &BTreeMap<(String, String), bool>) -> Vec<Mismatch> {
    compare(step, probe, observed)
}

/// Compares what probes by name saw (source → outcome; a source missing was not probed)
/// with their cells.
pub(crate) fn compare_host(step: usize, probe: &HostProbe, observed: &BTreeMap<String, HostSeen>) -> Vec<Mismatch> {
    let mut out = Vec::new();
    for (from, expected) in &probe.cells {
        if *expected == HostExpect::Unchecked {
            continue;
        }
        let seen = observed.get(from).copied();
        if seen.is_some_and(|s| expected.holds(s)) {
            continue;
        }
        let detail = format!("{}, {}", expected.as_str(), seen.map_or("was not probed", HostSeen::as_str));
        let coarse = if *expected == HostExpect::Connect { Expect::Connect } else { Expect::Blocked };
        out.push(Mismatch {
            step,
            probe: probe.label(),
            from: from.clone(),
            to: probe.host.clone(),
            expected: coarse,
            detail: Some(detail),
        });
    }
    out
}

/// Applies a step's changes to a snapshot: objects are created or replaced by kind and key
/// (a Pod with another uid replaces the pod of that name: a new sandbox); deletions follow.
pub fn apply_step(snapshot: &mut crate::model::Snapshot, step: &Step) {
    let deletes: Vec<(manifest::Kind, ObjectRef)> = step.delete.iter().map(|d| (d.kind, d.key.clone())).collect();
    manifest::apply_change(snapshot, &step.apply, &deletes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_shared_examples() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
        let cases = crate::source::files::find_cases(&[root]).unwrap();
        assert!(cases.len() >= 2);
        let c = crate::source::files::load_case(&cases[1]).unwrap();
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

    #[test]
    fn dns_records_host_probes_and_waits() {
        let text = "name: x\n\
                    dns: {server: kube-system/dns, records: [{name: API.example.test., pod: z/a, ttl: 5}, \
                    {name: www.example.test, cname: api.example.test}, {name: m.example.test, addresses: [198.18.3.1], pod: z/b}]}\n\
                    steps:\n\
                    - wait: 1.5\n  probes:\n\
                    \x20 - {port: 80, protocol: TCP, host: Api.Example.Test, matrix: {x/a: '1', x/b: '0', z/a: '-'}}\n\
                    \x20 - {port: 80, protocol: TCP, order: [x/a, z/a, z/b], matrix: {x/a: '-10'}}\n";
        let c = parse_case(Path::new("c.yaml"), "301-x", text).unwrap();
        let dns = c.dns.as_ref().unwrap();
        assert_eq!(dns.server, ObjectRef::new("kube-system", "dns"));
        assert_eq!(dns.records[0].name, "api.example.test");
        assert_eq!(dns.records[0].ttl, 5);
        assert_eq!(dns.records[1].ttl, DEFAULT_TTL);
        assert_eq!(dns.records[1].data, RecordData::Cname("api.example.test".into()));
        let step = &c.steps[0];
        assert_eq!(step.wait, std::time::Duration::from_millis(1500));
        assert_eq!(step.probes.len(), 1);
        let h = &step.host_probes[0];
        assert_eq!(h.host, "Api.Example.Test");
        assert_eq!(h.checked().collect::<Vec<_>>(), vec!["x/a", "x/b"]);
        let observed: BTreeMap<String, HostSeen> =
            [("x/a".to_string(), HostSeen::Connected), ("x/b".to_string(), HostSeen::Connected)].into();
        let m = compare_host(0, h, &observed);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].to_string(), "step 1 Api.Example.Test TCP/80 x/b -> Api.Example.Test: expected no connection, connected");
        // B and N say which way a cell failed to connect; 0 takes either.
        let cells = |e: HostExpect| HostProbe { cells: [("x/a".to_string(), e)].into(), ..h.clone() };
        let seen = |s: HostSeen| -> BTreeMap<String, HostSeen> { [("x/a".to_string(), s)].into() };
        for (e, s, ok) in [
            (HostExpect::NoConnection, HostSeen::Blocked, true),
            (HostExpect::NoConnection, HostSeen::Unresolved, true),
            (HostExpect::Blocked, HostSeen::Blocked, true),
            (HostExpect::Blocked, HostSeen::Unresolved, false),
            (HostExpect::Unresolved, HostSeen::Unresolved, true),
            (HostExpect::Unresolved, HostSeen::Blocked, false),
            (HostExpect::Connect, HostSeen::Blocked, false),
        ] {
            assert_eq!(compare_host(0, &cells(e), &seen(s)).is_empty(), ok, "{e:?} {s:?}");
        }
        let m = compare_host(0, &cells(HostExpect::Blocked), &seen(HostSeen::Unresolved));
        assert!(m[0].to_string().ends_with("expected to resolve and be blocked, did not resolve"), "{}", m[0]);
        assert!(compare_host(0, &cells(HostExpect::Blocked), &BTreeMap::new())[0].to_string().ends_with("was not probed"));
        // Offline stages leave the cells towards a record's addresses alone.
        let snapshot = crate::testkit::base_cluster();
        assert!(!c.judged_offline(&snapshot, "z/a"));
        assert!(!c.judged_offline(&snapshot, "z/b"));
        assert!(c.judged_offline(&snapshot, "z/c"));
    }

    #[test]
    fn bad_dns_is_rejected_with_the_field() {
        let bad = |t: &str| parse_case(Path::new("c.yaml"), "001-x", t).unwrap_err().to_string();
        let probe = "steps: [{probes: [{port: 80, protocol: TCP, host: a.test, matrix: {x/a: '1'}}]}]\n";
        assert!(bad(&format!("name: x\n{probe}")).contains("needs the case's dns"));
        let dns = |r: &str| format!("name: x\ndns: {{server: kube-system/dns, records: [{r}]}}\nsteps: []\n");
        assert!(bad(&dns("{name: 'a b', pod: z/a}")).contains("dns.records[0].name"));
        assert!(bad(&dns("{name: '*.a.test', pod: z/a}")).contains("dns.records[0].name: \"*.a.test\": one name, not a pattern"));
        assert!(bad(&dns("{name: a.test}")).contains("give pod, addresses or cname"));
        assert!(bad(&dns("{name: a.test, cname: b.test, pod: z/a}")).contains("a cname record takes no pod"));
        assert!(
            bad(&dns("{name: a.test, cname: b.test}, {name: A.test., pod: z/a}"))
                .contains("dns.records[1]: a.test has a cname and other records")
        );
        assert!(bad(&dns("{name: a.test, pod: za}")).contains("dns.records[0].pod"));
        assert!(bad("name: x\ndns: {server: dns}\nsteps: []\n").contains("dns.server"));
        assert!(bad("name: x\nsteps: [{wait: -1}]\n").contains("steps[0].wait"));
        let two_cells = "name: x\ndns: {server: a/b}\nsteps: [{probes: [{port: 80, protocol: TCP, host: a.test, matrix: {x/a: '11'}}]}]\n";
        assert!(bad(two_cells).contains("is not one cell: 1, 0, B, N or -"));
    }
}
