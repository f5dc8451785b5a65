//! PodSlices, pure: which pods a slice shows and in which slice each pod goes
//! (flock-controller's [`plan`]), and what a reader gets back from a slice ([`decode`]).
//! No I/O: the writer is [`crate::controller::slices`].
//!
//! - A slice holds pods of one namespace that can be policy peers ([`Member::of`]: scheduled,
//!   with addresses, not host-networked, not terminal); anything else about a pod is left
//!   out, so a status-only update that changes none of it writes nothing.
//! - Placement is sticky: a pod stays in the slice that holds it while it lives, so one pod's
//!   change rewrites one slice. New pods fill the slices with room in name order, then new
//!   slices named `<namespace>-<n>` (the lowest free `n`). Slices are not rebalanced: one
//!   that empties is deleted; one that shrinks keeps its pods where they are.
//! - Output is deterministic: pods by name (then uid), label sets in the order the pods use
//!   them, so an unchanged namespace plans no write at all.
//! - [`decode`] trusts nothing in a slice: a pod whose address, label, port or label-set
//!   index does not parse is left out (in no peer set: fail closed) and named in a problem.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::crd::{PodSliceSpec, Protocol as CrdProtocol, SlicePhase, SlicePod, SlicePort};
use crate::model::{ContainerPort, Labels, Pod, PodPhase, Protocol, clip};
use crate::translate::selector::{validate_label_key, validate_label_value};

/// Pods per slice unless configured (EndpointSlice's and CiliumEndpointSlice's default).
pub const DEFAULT_MAX_PODS: usize = 100;

/// A pod as a slice shows it, before its labels become an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub uid: String,
    pub node: String,
    pub ips: Vec<IpAddr>,
    pub labels: BTreeMap<String, String>,
    pub phase: SlicePhase,
    pub ports: Vec<SlicePort>,
    pub created: Option<i64>,
}

impl Member {
    /// What a slice shows of `pod`, if it can be a peer; `None` also for an unscheduled pod.
    pub fn of(pod: &Pod) -> Option<Member> {
        if !pod.is_peer() {
            return None;
        }
        let node = pod.node.clone()?;
        let phase = match pod.phase {
            PodPhase::Pending => SlicePhase::Pending,
            PodPhase::Running => SlicePhase::Running,
            PodPhase::Unknown => SlicePhase::Unknown,
            PodPhase::Succeeded | PodPhase::Failed => return None,
        };
        let mut ports: Vec<SlicePort> = pod
            .ports
            .iter()
            .filter_map(|p| {
                let name = p.name.as_deref()?;
                let protocol = match p.protocol {
                    Protocol::Tcp => CrdProtocol::Tcp,
                    Protocol::Udp => CrdProtocol::Udp,
                    Protocol::Sctp => CrdProtocol::Sctp,
                };
                Some(SlicePort { name: name.to_string(), port: i32::from(p.port), protocol })
            })
            .collect();
        ports.sort();
        ports.dedup();
        Some(Member {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            node,
            ips: pod.ips.clone(),
            labels: pod.labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            phase,
            ports,
            created: pod.created,
        })
    }
}

/// One write of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// A new slice.
    Create { name: String, spec: PodSliceSpec },
    /// A slice whose pods changed.
    Update { name: String, spec: PodSliceSpec },
    /// A slice with no pods left.
    Delete { name: String },
}

impl Write {
    pub fn name(&self) -> &str {
        match self {
            Self::Create { name, .. } | Self::Update { name, .. } | Self::Delete { name } => name,
        }
    }
}

/// The writes that make `namespace`'s slices show `desired` (its peer pods by uid), from
/// `current` (its slices now, by name). `taken` says whether a slice of that name exists
/// anywhere in the cluster (a new slice's name is one no slice has). `max_pods` is clamped to
/// 1..=[`crate::crd::POD_SLICE_LIMIT`].
pub fn plan(
    namespace: &str,
    current: &BTreeMap<&str, &PodSliceSpec>,
    desired: &BTreeMap<String, Member>,
    taken: impl Fn(&str) -> bool,
    max_pods: usize,
) -> Vec<Write> {
    let max_pods = max_pods.clamp(1, crate::crd::POD_SLICE_LIMIT);
    // Sticky placement: each desired pod where a slice already holds it (the first such
    // slice, by name, should two claim it), up to the slice's capacity.
    let mut members: BTreeMap<&str, Vec<&Member>> = current.keys().map(|n| (*n, Vec::new())).collect();
    let mut placed: BTreeSet<&str> = BTreeSet::new();
    for (name, spec) in current {
        let Some(slot) = members.get_mut(name) else { continue };
        for pod in &spec.pods {
            if slot.len() >= max_pods {
                break;
            }
            if let Some(m) = desired.get(&pod.uid)
                && placed.insert(m.uid.as_str())
            {
                slot.push(m);
            }
        }
    }
    // New pods (and any a shrunk capacity pushed out), by name: into the slices with room,
    // in name order, then into new slices.
    let mut homeless: Vec<&Member> = desired.values().filter(|m| !placed.contains(m.uid.as_str())).collect();
    homeless.sort_by(|a, b| (&a.name, &a.uid).cmp(&(&b.name, &b.uid)));
    let mut homeless = homeless.into_iter().peekable();
    for slot in members.values_mut() {
        while slot.len() < max_pods {
            let Some(m) = homeless.next() else { break };
            slot.push(m);
        }
    }
    let mut next_index = 0usize;
    let mut fresh: Vec<(String, Vec<&Member>)> = Vec::new();
    while homeless.peek().is_some() {
        let name = loop {
            let candidate = format!("{namespace}-{next_index}");
            next_index += 1;
            if !taken(&candidate) && !current.contains_key(candidate.as_str()) {
                break candidate;
            }
        };
        fresh.push((name, homeless.by_ref().take(max_pods).collect()));
    }

    let mut writes = Vec::new();
    for (name, pods) in members {
        let spec = spec_of(namespace, pods);
        match current.get(name) {
            _ if spec.pods.is_empty() => writes.push(Write::Delete { name: name.to_string() }),
            Some(old) if **old == spec => {}
            _ => writes.push(Write::Update { name: name.to_string(), spec }),
        }
    }
    writes.extend(fresh.into_iter().map(|(name, pods)| Write::Create { name, spec: spec_of(namespace, pods) }));
    writes
}

/// A slice's spec for `pods`: by name, label sets in first use.
fn spec_of(namespace: &str, mut pods: Vec<&Member>) -> PodSliceSpec {
    pods.sort_by(|a, b| (&a.name, &a.uid).cmp(&(&b.name, &b.uid)));
    let mut label_sets: Vec<BTreeMap<String, String>> = Vec::new();
    let mut index: BTreeMap<&BTreeMap<String, String>, i32> = BTreeMap::new();
    let mut out = Vec::with_capacity(pods.len());
    for m in pods {
        let labels = *index.entry(&m.labels).or_insert_with(|| {
            label_sets.push(m.labels.clone());
            // At most POD_SLICE_LIMIT pods, so at most that many sets: fits in i32.
            i32::try_from(label_sets.len() - 1).unwrap_or(i32::MAX)
        });
        out.push(SlicePod {
            name: m.name.clone(),
            uid: m.uid.clone(),
            node: m.node.clone(),
            ips: m.ips.iter().map(IpAddr::to_string).collect(),
            labels,
            phase: m.phase,
            ports: m.ports.clone(),
            created: m.created,
        });
    }
    PodSliceSpec { namespace: namespace.to_string(), label_sets, pods: out }
}

/// Why a pod of a slice was left out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("PodSlice {slice}: pod {pod}: {why}")]
pub struct SliceProblem {
    pub slice: String,
    /// `namespace/name` as the slice gives it (clipped).
    pub pod: String,
    pub why: String,
}

/// The pods slice `name` shows, as the model's pods, and the ones it shows that cannot be
/// read (left out: in no peer set until a slice shows them whole).
pub fn decode(name: &str, spec: &PodSliceSpec) -> (Vec<Pod>, Vec<SliceProblem>) {
    let mut pods = Vec::with_capacity(spec.pods.len());
    let mut problems = Vec::new();
    let namespace_ok = is_dns_label(&spec.namespace);
    let label_sets: Vec<Result<Labels, String>> = spec.label_sets.iter().map(checked_labels).collect();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    for p in &spec.pods {
        let problem =
            |why: String| SliceProblem { slice: clip(name).to_string(), pod: format!("{}/{}", clip(&spec.namespace), clip(&p.name)), why };
        if !namespace_ok {
            problems.push(problem(format!("the namespace {:?} is not a namespace name", clip(&spec.namespace))));
            continue;
        }
        match decode_pod(&spec.namespace, p, &label_sets) {
            Ok(_) if !seen.insert(p.uid.as_str()) => problems.push(problem(format!("uid {} appears twice", clip(&p.uid)))),
            Ok(pod) => pods.push(pod),
            Err(why) => problems.push(problem(why)),
        }
    }
    (pods, problems)
}

/// A DNS-1123 label, as namespace names are.
fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

fn checked_labels(set: &BTreeMap<String, String>) -> Result<Labels, String> {
    for (k, v) in set {
        validate_label_key(k).map_err(|e| format!("label key {:?}: {e}", clip(k)))?;
        validate_label_value(v).map_err(|e| format!("label {}={:?}: {e}", clip(k), clip(v)))?;
    }
    Ok(set.iter().collect())
}

fn decode_pod(namespace: &str, p: &SlicePod, label_sets: &[Result<Labels, String>]) -> Result<Pod, String> {
    if p.name.is_empty() || p.uid.is_empty() || p.node.is_empty() {
        return Err("name, uid and node must not be empty".into());
    }
    let labels = match usize::try_from(p.labels).ok().and_then(|i| label_sets.get(i)) {
        Some(Ok(l)) => l.clone(),
        Some(Err(why)) => return Err(why.clone()),
        None => return Err(format!("label set {} does not exist ({} in the slice)", p.labels, label_sets.len())),
    };
    let mut ips: Vec<IpAddr> = Vec::with_capacity(p.ips.len());
    for ip in &p.ips {
        let addr: IpAddr = ip.parse().map_err(|_| format!("{:?} is not an IP address", clip(ip)))?;
        if ips.iter().any(|a| a.is_ipv4() == addr.is_ipv4()) {
            return Err("at most one address per family".into());
        }
        ips.push(addr);
    }
    if ips.is_empty() {
        return Err("no address".into());
    }
    let ports = p
        .ports
        .iter()
        .map(|port| {
            let Some(number) = u16::try_from(port.port).ok().filter(|n| *n != 0) else {
                return Err(format!("port {:?}: {} is not a port number (1-65535)", clip(&port.name), port.port));
            };
            let protocol = match port.protocol {
                CrdProtocol::Tcp => Protocol::Tcp,
                CrdProtocol::Udp => Protocol::Udp,
                CrdProtocol::Sctp => Protocol::Sctp,
            };
            Ok(ContainerPort { name: Some(crate::model::labels::intern(&port.name)), port: number, protocol })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let phase = match p.phase {
        SlicePhase::Pending => PodPhase::Pending,
        SlicePhase::Running => PodPhase::Running,
        SlicePhase::Unknown => PodPhase::Unknown,
    };
    Ok(Pod {
        namespace: namespace.to_string(),
        name: p.name.clone(),
        uid: p.uid.clone(),
        labels,
        node: Some(p.node.clone()),
        phase,
        ips,
        host_network: false,
        ports,
        created: p.created,
        unpublished: false,
    })
}

#[cfg(test)]
mod tests;
