//! The pure part of flock-controller: (run, profile, cluster configuration) → the run's
//! policy. No I/O, no clock, no hash-map order: equal input gives byte-equal output.
//!
//! [`plan`] decides *what* the run may reach, in a fixed rule order — DNS, internet, API
//! server, services (profile order), CIDRs (profile order), then domain names (sorted);
//! ingress peers in profile order — and both policy kinds are written from that one plan:
//! [`network_policy`] (`networking.k8s.io/v1`, what flock-agent enforces) and
//! [`cilium_network_policy`] (`cilium.io/v2`, emitted instead where Cilium serves it; never
//! both).
//!
//! Domain names cannot be said in a NetworkPolicy: there they are the annotation
//! [`EGRESS_DOMAINS_ANNOTATION`] (JSON), which flock-agent reads; an agent that does not
//! read it admits nothing by name (fail closed). Cilium gets `toFQDNs` rules, and its DNS
//! rule asks its DNS proxy to see every answer (it learns the names' addresses from them).
//!
//! Both address families are handled: the internet rule allows `0.0.0.0/0` and `::/0`, each
//! minus the private, shared and link-local ranges of its family and the IPv6 ranges that
//! embed IPv4 addresses ([`PRIVATE_V4`], [`PRIVATE_V6`]),
//! the cluster's pod and service CIDRs of that family, and the profile's extra excepts; API
//! server addresses of either family become `/32` or `/128` blocks. Loopback needs no rule:
//! flock filters in the forward hook, which loopback traffic never crosses.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1 as net;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{FIELD_MANAGER, PROFILE_ANNOTATION};
use crate::crd::{self, PortSpec, Problem, Protocol, Run, RunProfile, Selector};
use crate::dns::DomainPattern;
use crate::model::EGRESS_DOMAINS_ANNOTATION;
use crate::model::RUN_LABEL;
use crate::translate::selector::validate_label_value;

/// Private (RFC 1918), shared (RFC 6598: carrier-grade NAT, and many clusters' and VPCs'
/// internal ranges) and link-local IPv4 ranges, always excepted from the internet rule.
pub(crate) const PRIVATE_V4: [&str; 5] = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16"];
/// Unique-local (the IPv6 private range) and link-local IPv6 ranges, always excepted, and the
/// IPv6 ranges that carry an IPv4 address inside (so that "the internet" over IPv6 is not a
/// way back to the private IPv4 ranges): NAT64's well-known and local-use prefixes
/// (RFC 6052, RFC 8215) and 6to4. (IPv4-mapped addresses never leave a host as IPv6: a
/// socket sends them as IPv4, under the IPv4 rule.)
pub(crate) const PRIVATE_V6: [&str; 5] = ["fc00::/7", "fe80::/10", "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16"];

/// The namespace label the API server sets on every namespace (immutable, its name).
const NAMESPACE_LABEL: &str = crate::model::convert::NAMESPACE_NAME_LABEL;
/// How Cilium names a pod's namespace in endpoint selectors.
const CILIUM_NAMESPACE_LABEL: &str = "k8s:io.kubernetes.pod.namespace";
/// The suffix of a run's policy name.
pub(crate) const POLICY_SUFFIX: &str = "-egress";

/// What the controller knows about the cluster (its flags and the API server's addresses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The cluster's pod CIDRs (both families on dual-stack clusters).
    pub pod_cidrs: Vec<IpNet>,
    /// The cluster's Service CIDRs.
    pub service_cidrs: Vec<IpNet>,
    /// Where the cluster DNS pods are.
    pub dns: DnsConfig,
    /// The API server: its Service address (the client configuration) and its endpoints
    /// (the `default/kubernetes` EndpointSlices), each with its port.
    pub api_server: BTreeSet<ApiEndpoint>,
}

/// The cluster DNS pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsConfig {
    pub namespace: String,
    pub pod_labels: BTreeMap<String, String>,
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self { namespace: "kube-system".into(), pod_labels: BTreeMap::from([("k8s-app".to_string(), "kube-dns".to_string())]) }
    }
}

/// One address and port the API server answers on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ApiEndpoint {
    pub addr: IpAddr,
    pub port: u16,
}

impl std::fmt::Display for ApiEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.addr {
            IpAddr::V4(a) => write!(f, "{a}:{}", self.port),
            IpAddr::V6(a) => write!(f, "[{a}]:{}", self.port),
        }
    }
}

/// Why a run's policy cannot be rendered. `Run` and `Profile` are the user's to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The run object lacks what an owned object needs (never the case for objects read
    /// from the API server).
    #[error("run {run}: {field} is missing")]
    Incomplete { run: String, field: &'static str },
    #[error("run {run} is invalid: {}", crd::describe(problems))]
    Run { run: String, problems: Vec<Problem> },
    #[error("RunProfile {profile} is invalid: {}", crd::describe(problems))]
    Profile { profile: String, problems: Vec<Problem> },
}

/// The name of a run's policy: `<run>-egress`, shortened with a hash when that would exceed
/// the 253 characters of an object name.
pub(crate) fn policy_name(run: &str) -> String {
    const MAX: usize = 253;
    if run.len() + POLICY_SUFFIX.len() <= MAX {
        return format!("{run}{POLICY_SUFFIX}");
    }
    let keep = MAX - POLICY_SUFFIX.len() - 11;
    format!("{}-{}{POLICY_SUFFIX}", trim_to(run, keep), short_hash(run))
}

/// The `flock.dev/run` label value of a run's pods: the run's name, or (past the 63
/// characters of a label value) its first characters, `_` and a hash. Workload builders stamp
/// this on the run's pod template. The `_` keeps the two kinds apart: no run name has one
/// (names are DNS subdomains), so no run can be named another's shortened value and select
/// that run's pods.
pub(crate) fn run_label_value(run: &str) -> String {
    if validate_label_value(run).is_ok() {
        return run.to_string();
    }
    format!("{}_{}", trim_to(run, 52), short_hash(run))
}

/// The first `n` bytes of a DNS name, ending alphanumeric.
fn trim_to(name: &str, n: usize) -> &str {
    let cut = name.get(..n.min(name.len())).unwrap_or(name);
    cut.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
}

fn short_hash(s: &str) -> String {
    Sha256::digest(s.as_bytes()).iter().take(5).map(|b| format!("{b:02x}")).collect()
}

/// A peer of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Peer {
    /// Pods of one namespace.
    Pods { namespace: String, selector: Selector },
    /// A CIDR minus excepts.
    Cidr { cidr: IpNet, except: Vec<IpNet> },
}

/// What a rule is for (the API server rule renders differently for Cilium).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Purpose {
    Dns,
    Internet,
    ApiServer,
    Service,
    Cidr,
    Ingress,
}

/// One allow rule: any of the peers, on any of the ports (none: every port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub(crate) purpose: Purpose,
    pub(crate) peers: Vec<Peer>,
    pub(crate) ports: Vec<PortSpec>,
}

/// Egress to a domain name on some ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DomainRule {
    pub(crate) name: DomainPattern,
    /// Sorted by protocol (TCP, UDP, SCTP), port and end port; never empty.
    pub(crate) ports: Vec<PortSpec>,
}

/// A run's policy, independent of the kind that expresses it.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub(crate) name: String,
    pub(crate) namespace: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) annotations: BTreeMap<String, String>,
    pub(crate) owner: meta::OwnerReference,
    /// The run's pods.
    pub(crate) selector: Selector,
    pub(crate) egress: Vec<Rule>,
    /// Egress by name, sorted by name (as written, lowercase, no trailing dot).
    pub(crate) domains: Vec<DomainRule>,
    /// `None`: ingress is not restricted.
    pub(crate) ingress: Option<Vec<Rule>>,
}

/// The labels of every object the controller renders for `run`.
pub(crate) fn labels(run: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), "flock".to_string()),
        ("app.kubernetes.io/component".to_string(), "run-egress".to_string()),
        ("app.kubernetes.io/managed-by".to_string(), FIELD_MANAGER.to_string()),
        (RUN_LABEL.to_string(), run_label_value(run)),
    ])
}

/// The label selector of the policies the controller manages (for its watch).
pub(crate) fn managed_selector() -> String {
    format!("app.kubernetes.io/managed-by={FIELD_MANAGER}")
}

/// The run's pod selector: its own, or `flock.dev/run: <label value>`.
pub(crate) fn run_selector(run: &Run) -> Result<Selector, RenderError> {
    let mut problems = run.spec.problems();
    problems.extend(pinning_problem(run));
    if !problems.is_empty() {
        return Err(RenderError::Run { run: run_key(run), problems });
    }
    Ok(run.spec.pod_selector.clone().unwrap_or_else(|| default_selector(run)))
}

/// The selector of a run without its own: `flock.dev/run: <label value>`.
pub(crate) fn default_selector(run: &Run) -> Selector {
    Selector {
        match_labels: BTreeMap::from([(RUN_LABEL.to_string(), run_label_value(run.meta().name.as_deref().unwrap_or_default()))]),
        ..Selector::default()
    }
}

/// The run's pod selector when that part of the run is valid, whatever else is wrong with
/// it (an invalid run past its deadline still gets a policy that allows nothing).
pub(crate) fn own_selector(run: &Run) -> Option<Selector> {
    let bad = run.spec.problems().iter().chain(&pinning_problem(run)).any(|p| p.field.starts_with("spec.podSelector"));
    (!bad).then(|| run.spec.pod_selector.clone().unwrap_or_else(|| default_selector(run)))
}

/// A run's own selector must select only the run's own pods: `flock.dev/run` pinned to its
/// label value (`matchLabels`, or `In` with that one value). The schema can only ask for
/// the label (it cannot compute a long name's value): `Exists`, or another run's value, would
/// extend this run's profile to that run's pods (NetworkPolicies add up).
fn pinning_problem(run: &Run) -> Option<Problem> {
    let sel = run.spec.pod_selector.as_ref()?;
    let own = run_label_value(run.meta().name.as_deref().unwrap_or_default());
    let pinned = sel.match_labels.get(RUN_LABEL) == Some(&own)
        || sel.match_expressions.iter().any(|e| e.key == RUN_LABEL && e.operator == crd::SelectorOperator::In && e.values == [own.clone()]);
    (!pinned).then(|| Problem {
        field: "spec.podSelector".into(),
        message: format!(
            "must select only this run's pods: {RUN_LABEL}: {own} (in matchLabels, or matchExpressions In with that one value)"
        ),
    })
}

fn run_key(run: &Run) -> String {
    format!("{}/{}", run.meta().namespace.as_deref().unwrap_or_default(), run.meta().name.as_deref().unwrap_or_default())
}

/// Decides what `run` may reach under `profile` (see the module doc for the order).
pub fn plan(run: &Run, profile: &RunProfile, cluster: &ClusterConfig) -> Result<Plan, RenderError> {
    plan_for(run, run_selector, profile, cluster)
}

/// [`plan`] for the pods `selector` selects rather than the run's own, which is not checked:
/// the withdrawal of an invalid run past its deadline (with a profile that grants nothing).
pub(crate) fn plan_with_selector(
    run: &Run,
    selector: Selector,
    profile: &RunProfile,
    cluster: &ClusterConfig,
) -> Result<Plan, RenderError> {
    plan_for(run, |_| Ok(selector), profile, cluster)
}

fn plan_for(
    run: &Run,
    selector: impl FnOnce(&Run) -> Result<Selector, RenderError>,
    profile: &RunProfile,
    cluster: &ClusterConfig,
) -> Result<Plan, RenderError> {
    let key = run_key(run);
    let meta = run.meta();
    let name = meta.name.clone().ok_or(RenderError::Incomplete { run: key.clone(), field: "metadata.name" })?;
    let namespace = meta.namespace.clone().ok_or(RenderError::Incomplete { run: key.clone(), field: "metadata.namespace" })?;
    let uid = meta.uid.clone().ok_or(RenderError::Incomplete { run: key.clone(), field: "metadata.uid" })?;
    let selector = selector(run)?;
    let profile_name = profile.meta().name.clone().unwrap_or_default();
    let spec = &profile.spec;
    let problems = spec.problems();
    if !problems.is_empty() {
        return Err(RenderError::Profile { profile: profile_name, problems });
    }

    let mut egress = Vec::new();
    if spec.dns {
        egress.push(Rule {
            purpose: Purpose::Dns,
            peers: vec![Peer::Pods {
                namespace: cluster.dns.namespace.clone(),
                selector: Selector { match_labels: cluster.dns.pod_labels.clone(), ..Selector::default() },
            }],
            ports: [Protocol::Udp, Protocol::Tcp].into_iter().map(|protocol| PortSpec { protocol, port: 53, end_port: None }).collect(),
        });
    }
    if let Some(internet) = &spec.internet {
        let extra: Vec<IpNet> = internet.except.iter().filter_map(|c| crd::parse_cidr(c)).collect();
        let peers = [("0.0.0.0/0", &PRIVATE_V4[..]), ("::/0", &PRIVATE_V6[..])]
            .into_iter()
            .filter_map(|(all, private)| {
                let all: IpNet = all.parse().ok()?;
                let same_family = |n: &&IpNet| matches!((n, &all), (IpNet::V4(_), IpNet::V4(_)) | (IpNet::V6(_), IpNet::V6(_)));
                let mut except: Vec<IpNet> = Vec::new();
                let fixed = private.iter().filter_map(|c| c.parse::<IpNet>().ok());
                let cluster_ranges = cluster.pod_cidrs.iter().chain(&cluster.service_cidrs).chain(&extra).filter(same_family).copied();
                for n in fixed.chain(cluster_ranges) {
                    if !except.contains(&n) {
                        except.push(n);
                    }
                }
                Some(Peer::Cidr { cidr: all, except })
            })
            .collect();
        egress.push(Rule { purpose: Purpose::Internet, peers, ports: internet.ports.clone() });
    }
    if spec.api_server {
        // One rule per port, so each address is admitted on its own port only (the Service
        // address on 443, the endpoints on 6443, typically).
        let mut by_port: BTreeMap<u16, BTreeSet<IpAddr>> = BTreeMap::new();
        for e in &cluster.api_server {
            by_port.entry(e.port).or_default().insert(e.addr);
        }
        for (port, addrs) in by_port {
            egress.push(Rule {
                purpose: Purpose::ApiServer,
                peers: addrs.into_iter().map(|a| Peer::Cidr { cidr: IpNet::from(a), except: Vec::new() }).collect(),
                ports: vec![PortSpec { protocol: Protocol::Tcp, port: i32::from(port), end_port: None }],
            });
        }
    }
    for s in &spec.services {
        egress.push(Rule {
            purpose: Purpose::Service,
            peers: vec![Peer::Pods {
                namespace: s.namespace.clone().unwrap_or_else(|| namespace.clone()),
                selector: s.pod_selector.clone(),
            }],
            ports: s.ports.clone(),
        });
    }
    for c in &spec.cidrs {
        let Some(cidr) = crd::parse_cidr(&c.cidr) else { continue };
        egress.push(Rule {
            purpose: Purpose::Cidr,
            peers: vec![Peer::Cidr { cidr, except: c.except.iter().filter_map(|e| crd::parse_cidr(e)).collect() }],
            ports: c.ports.clone(),
        });
    }
    let mut domains: Vec<DomainRule> = spec
        .domains
        .iter()
        .filter_map(|d| {
            // Checked above: every name parses.
            let name = DomainPattern::parse(&d.name).ok()?;
            let mut ports = d.ports.clone();
            ports.sort_by_key(|p| (p.protocol, p.port, p.end_port));
            ports.dedup();
            Some(DomainRule { name, ports })
        })
        .collect();
    domains.sort_by_key(|d| d.name.to_string());
    let mut annotations = BTreeMap::from([(PROFILE_ANNOTATION.to_string(), profile_name.clone())]);
    if !domains.is_empty() {
        let text = domains_annotation(&domains).map_err(|e| RenderError::Profile {
            profile: profile_name.clone(),
            problems: vec![Problem {
                field: "spec.domains".into(),
                message: format!("cannot be written as the {EGRESS_DOMAINS_ANNOTATION} annotation: {e}"),
            }],
        })?;
        annotations.insert(EGRESS_DOMAINS_ANNOTATION.to_string(), text);
    }
    let ingress = spec.ingress.as_ref().map(|peers| {
        peers
            .iter()
            .map(|p| Rule {
                purpose: Purpose::Ingress,
                peers: vec![Peer::Pods {
                    namespace: p.namespace.clone().unwrap_or_else(|| namespace.clone()),
                    selector: p.pod_selector.clone(),
                }],
                ports: p.ports.clone(),
            })
            .collect()
    });

    Ok(Plan {
        name: policy_name(&name),
        namespace,
        labels: labels(&name),
        annotations,
        owner: meta::OwnerReference {
            api_version: Run::api_version(&()).into_owned(),
            kind: Run::kind(&()).into_owned(),
            name,
            uid,
            controller: Some(true),
            block_owner_deletion: Some(true),
        },
        selector,
        egress,
        domains,
        ingress,
    })
}

/// One entry of the [`EGRESS_DOMAINS_ANNOTATION`] value (field order as the agent reads it).
#[derive(serde::Serialize)]
struct AnnotatedDomain {
    name: String,
    ports: Vec<AnnotatedPort>,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct AnnotatedPort {
    protocol: &'static str,
    port: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    end_port: Option<i32>,
}

/// The value of [`EGRESS_DOMAINS_ANNOTATION`] for `domains` (sorted as the plan keeps them):
/// compact JSON, `[{"name":"github.com","ports":[{"protocol":"TCP","port":443}]}]`.
pub(crate) fn domains_annotation(domains: &[DomainRule]) -> Result<String, serde_json::Error> {
    let entries: Vec<AnnotatedDomain> = domains
        .iter()
        .map(|d| AnnotatedDomain {
            name: d.name.to_string(),
            ports: d.ports.iter().map(|p| AnnotatedPort { protocol: p.protocol.as_str(), port: p.port, end_port: p.end_port }).collect(),
        })
        .collect();
    serde_json::to_string(&entries)
}

/// The annotation on a policy whose run expired: when (the policy then allows nothing).
pub(crate) const EXPIRED_ANNOTATION: &str = "flock.dev/expired";

impl Plan {
    /// The run expired at `at`: the policy allows nothing, both ways (it stays, so the run's
    /// pods stay isolated rather than open).
    pub fn withdraw(&mut self, at: &str) {
        self.egress.clear();
        self.domains.clear();
        self.annotations.remove(EGRESS_DOMAINS_ANNOTATION);
        self.ingress = Some(Vec::new());
        self.annotations.insert(EXPIRED_ANNOTATION.to_string(), at.to_string());
    }

    /// What the run may reach, one line per (rule, peer), sorted: what an `AuditEvent`
    /// compares and records.
    pub fn destinations(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in &self.egress {
            let purpose = match r.purpose {
                Purpose::Dns => "dns",
                Purpose::Internet => "internet",
                Purpose::ApiServer => "api-server",
                Purpose::Service => "service",
                Purpose::Cidr => "cidr",
                Purpose::Ingress => "ingress",
            };
            let ports = describe_ports(&r.ports);
            for p in &r.peers {
                out.push(format!("{purpose}: {} on {ports}", describe_peer(p)));
            }
        }
        for d in &self.domains {
            out.push(format!("domain: {} on {}", d.name, describe_ports(&d.ports)));
        }
        out.sort();
        out.dedup();
        out
    }
}

fn describe_peer(p: &Peer) -> String {
    match p {
        Peer::Pods { namespace, selector } => {
            let mut terms: Vec<String> = selector.match_labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            terms.extend(selector.match_expressions.iter().map(|e| match e.values.is_empty() {
                true => format!("{} {}", e.key, e.operator.as_str()),
                false => format!("{} {} ({})", e.key, e.operator.as_str(), e.values.join(",")),
            }));
            if terms.is_empty() { format!("pods {namespace}/*") } else { format!("pods {namespace}/{}", terms.join(",")) }
        }
        Peer::Cidr { cidr, except } if except.is_empty() => cidr.to_string(),
        Peer::Cidr { cidr, except } => {
            format!("{cidr} except {}", except.iter().map(ToString::to_string).collect::<Vec<_>>().join(","))
        }
    }
}

fn describe_ports(ports: &[PortSpec]) -> String {
    if ports.is_empty() {
        return "all ports".into();
    }
    ports
        .iter()
        .map(|p| match p.end_port {
            Some(end) if end != p.port => format!("{}/{}-{end}", p.protocol.as_str(), p.port),
            _ => format!("{}/{}", p.protocol.as_str(), p.port),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The run's `networking.k8s.io/v1` NetworkPolicy.
pub fn render(run: &Run, profile: &RunProfile, cluster: &ClusterConfig) -> Result<net::NetworkPolicy, RenderError> {
    plan(run, profile, cluster).map(|p| network_policy(&p))
}

/// The run's `cilium.io/v2` CiliumNetworkPolicy, as JSON.
pub fn render_cilium(run: &Run, profile: &RunProfile, cluster: &ClusterConfig) -> Result<Value, RenderError> {
    plan(run, profile, cluster).map(|p| cilium_network_policy(&p))
}

fn metadata(plan: &Plan) -> meta::ObjectMeta {
    meta::ObjectMeta {
        name: Some(plan.name.clone()),
        namespace: Some(plan.namespace.clone()),
        labels: Some(plan.labels.clone()),
        annotations: Some(plan.annotations.clone()),
        owner_references: Some(vec![plan.owner.clone()]),
        ..meta::ObjectMeta::default()
    }
}

fn label_selector(s: &Selector) -> meta::LabelSelector {
    meta::LabelSelector {
        match_labels: (!s.match_labels.is_empty()).then(|| s.match_labels.clone()),
        match_expressions: (!s.match_expressions.is_empty()).then(|| {
            s.match_expressions
                .iter()
                .map(|r| meta::LabelSelectorRequirement {
                    key: r.key.clone(),
                    operator: r.operator.as_str().to_string(),
                    values: (!r.values.is_empty()).then(|| r.values.clone()),
                })
                .collect()
        }),
    }
}

fn np_peer(p: &Peer) -> net::NetworkPolicyPeer {
    match p {
        Peer::Pods { namespace, selector } => net::NetworkPolicyPeer {
            namespace_selector: Some(meta::LabelSelector {
                match_labels: Some(BTreeMap::from([(NAMESPACE_LABEL.to_string(), namespace.clone())])),
                match_expressions: None,
            }),
            pod_selector: Some(label_selector(selector)),
            ip_block: None,
        },
        Peer::Cidr { cidr, except } => net::NetworkPolicyPeer {
            ip_block: Some(net::IPBlock {
                cidr: cidr.to_string(),
                except: (!except.is_empty()).then(|| except.iter().map(ToString::to_string).collect()),
            }),
            ..net::NetworkPolicyPeer::default()
        },
    }
}

fn np_ports(ports: &[PortSpec]) -> Option<Vec<net::NetworkPolicyPort>> {
    (!ports.is_empty()).then(|| {
        ports
            .iter()
            .map(|p| net::NetworkPolicyPort {
                protocol: Some(p.protocol.as_str().to_string()),
                port: Some(IntOrString::Int(p.port)),
                end_port: p.end_port,
            })
            .collect()
    })
}

/// The plan as a NetworkPolicy: `policyTypes` is `[Egress]`, or `[Ingress, Egress]` when
/// the profile restricts ingress.
pub fn network_policy(plan: &Plan) -> net::NetworkPolicy {
    let egress: Vec<net::NetworkPolicyEgressRule> = plan
        .egress
        .iter()
        .map(|r| net::NetworkPolicyEgressRule { to: Some(r.peers.iter().map(np_peer).collect()), ports: np_ports(&r.ports) })
        .collect();
    let ingress: Option<Vec<net::NetworkPolicyIngressRule>> = plan.ingress.as_ref().map(|rules| {
        rules
            .iter()
            .map(|r| net::NetworkPolicyIngressRule { from: Some(r.peers.iter().map(np_peer).collect()), ports: np_ports(&r.ports) })
            .collect()
    });
    let mut types = Vec::new();
    if plan.ingress.is_some() {
        types.push("Ingress".to_string());
    }
    types.push("Egress".to_string());
    net::NetworkPolicy {
        metadata: metadata(plan),
        spec: Some(net::NetworkPolicySpec {
            pod_selector: Some(label_selector(&plan.selector)),
            policy_types: Some(types),
            egress: (!egress.is_empty()).then_some(egress),
            ingress: ingress.filter(|i| !i.is_empty()),
        }),
    }
}

fn cilium_selector(namespace: Option<&str>, s: &Selector) -> Value {
    let mut labels: BTreeMap<String, String> = s.match_labels.clone();
    if let Some(ns) = namespace {
        labels.insert(CILIUM_NAMESPACE_LABEL.to_string(), ns.to_string());
    }
    let mut out = serde_json::Map::new();
    if !labels.is_empty() {
        out.insert("matchLabels".into(), json!(labels));
    }
    if let Some(exprs) = label_selector(s).match_expressions {
        out.insert("matchExpressions".into(), json!(exprs));
    }
    Value::Object(out)
}

fn cilium_ports(ports: &[PortSpec]) -> Option<Value> {
    (!ports.is_empty()).then(|| {
        let ports: Vec<Value> = ports
            .iter()
            .map(|p| {
                let mut v = json!({"port": p.port.to_string(), "protocol": p.protocol.as_str()});
                if let (Some(end), Some(map)) = (p.end_port, v.as_object_mut()) {
                    map.insert("endPort".into(), json!(end));
                }
                v
            })
            .collect();
        json!([{"ports": ports}])
    })
}

/// One CNP rule: `to`/`from` is the direction's prefix (`toEndpoints`, `fromEndpoints`…).
/// `see_dns`: the DNS rule sends the run's DNS through Cilium's DNS proxy, allowing every
/// name, so that `toFQDNs` rules learn the addresses of the names they allow.
fn cilium_rule(r: &Rule, dir: &str, see_dns: bool) -> Value {
    let mut rule = serde_json::Map::new();
    if r.purpose == Purpose::ApiServer {
        // Cilium does not apply CIDR rules to host-network destinations such as a
        // control-plane node's API server; its `kube-apiserver` entity matches them.
        rule.insert(format!("{dir}Entities"), json!(["kube-apiserver"]));
    } else {
        let endpoints: Vec<Value> = r
            .peers
            .iter()
            .filter_map(|p| match p {
                Peer::Pods { namespace, selector } => Some(cilium_selector(Some(namespace), selector)),
                Peer::Cidr { .. } => None,
            })
            .collect();
        let cidrs: Vec<Value> = r
            .peers
            .iter()
            .filter_map(|p| match p {
                Peer::Cidr { cidr, except } if except.is_empty() => Some(json!({"cidr": cidr.to_string()})),
                Peer::Cidr { cidr, except } => {
                    Some(json!({"cidr": cidr.to_string(), "except": except.iter().map(ToString::to_string).collect::<Vec<_>>()}))
                }
                Peer::Pods { .. } => None,
            })
            .collect();
        if !endpoints.is_empty() {
            rule.insert(format!("{dir}Endpoints"), Value::Array(endpoints));
        }
        if !cidrs.is_empty() {
            rule.insert(format!("{dir}CIDRSet"), Value::Array(cidrs));
        }
    }
    if let Some(mut ports) = cilium_ports(&r.ports) {
        if see_dns
            && r.purpose == Purpose::Dns
            && let Some(entry) = ports.get_mut(0).and_then(Value::as_object_mut)
        {
            entry.insert("rules".into(), json!({"dns": [{"matchPattern": "*"}]}));
        }
        rule.insert("toPorts".into(), ports);
    }
    Value::Object(rule)
}

/// A `toFQDNs` rule. An exact name is a `matchName`; `*.name` is `matchPattern: "**.name"`:
/// Cilium's `**.` prefix matches one or more whole labels, as NPEP-133's `*.` does, where
/// its `*` would match within one label only. Cilium before 1.19 reads `**.` as `*.` (one
/// label): narrower, never wider.
fn cilium_domain_rule(d: &DomainRule) -> Value {
    let selector =
        if d.name.is_wildcard() { json!({"matchPattern": format!("*{}", d.name)}) } else { json!({"matchName": d.name.to_string()}) };
    let mut rule = serde_json::Map::new();
    rule.insert("toFQDNs".into(), json!([selector]));
    if let Some(ports) = cilium_ports(&d.ports) {
        rule.insert("toPorts".into(), ports);
    }
    Value::Object(rule)
}

/// The plan as a CiliumNetworkPolicy. The API server rule becomes the `kube-apiserver`
/// entity; domain names become `toFQDNs` rules after the others (and the DNS rule lets
/// Cilium's DNS proxy see the answers); a direction with no allow rule is `[{}]` (Cilium's
/// "isolated, nothing allowed").
pub fn cilium_network_policy(plan: &Plan) -> Value {
    let see_dns = !plan.domains.is_empty();
    let rules = |rules: &[Rule], dir: &str, extra: Vec<Value>| -> Value {
        let mut out: Vec<Value> = rules.iter().map(|r| cilium_rule(r, dir, see_dns)).collect();
        out.extend(extra);
        if out.is_empty() { json!([{}]) } else { Value::Array(out) }
    };
    // API server rules differ only by port for NetworkPolicy; Cilium's entity rule takes
    // them all at once.
    let mut egress: Vec<Rule> = Vec::new();
    for r in &plan.egress {
        match egress.last_mut() {
            Some(last) if last.purpose == Purpose::ApiServer && r.purpose == Purpose::ApiServer => {
                last.ports.extend(r.ports.iter().cloned())
            }
            _ => egress.push(r.clone()),
        }
    }
    let mut spec = serde_json::Map::new();
    spec.insert("endpointSelector".into(), cilium_selector(None, &plan.selector));
    spec.insert("egress".into(), rules(&egress, "to", plan.domains.iter().map(cilium_domain_rule).collect()));
    if let Some(ingress) = &plan.ingress {
        spec.insert("ingress".into(), rules(ingress, "from", Vec::new()));
    }
    let mut object = json!({
        "apiVersion": super::CILIUM_API_VERSION,
        "kind": super::CILIUM_KIND,
        "spec": Value::Object(spec),
    });
    let mut meta = metadata(plan);
    // The annotation is flock-agent's way of reading names; Cilium has them as rules.
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(EGRESS_DOMAINS_ANNOTATION);
    }
    if let (Ok(meta), Some(map)) = (serde_json::to_value(meta), object.as_object_mut()) {
        map.insert("metadata".into(), meta);
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_their_limits_and_are_stable() {
        assert_eq!(policy_name("job-1"), "job-1-egress");
        let long = "a".repeat(253);
        let n = policy_name(&long);
        assert!(n.len() <= 253 && n.ends_with("-egress"), "{n}");
        assert_eq!(n, policy_name(&long));
        assert_ne!(n, policy_name(&format!("{}b", "a".repeat(252))));
        assert_eq!(run_label_value("job-1"), "job-1");
        let v = run_label_value(&format!("{}.x-y", "r".repeat(70)));
        assert!(validate_label_value(&v).is_ok() && v.len() <= 63, "{v}");
        // A cut that would end on '.' or '-' backs off to an alphanumeric.
        let v = run_label_value(&format!("{}-{}", "r".repeat(51), "s".repeat(20)));
        assert!(validate_label_value(&v).is_ok(), "{v}");
        // The attack: a run named as another's shortened value (the old `-` form was a valid
        // run name) would select that run's pods. The shortened value has a `_`, which no
        // run name can.
        let long = format!("{}.x-y", "r".repeat(70));
        let short = run_label_value(&long);
        assert_eq!(short.matches('_').count(), 1, "{short}");
        let as_name = short.replace('_', "-");
        assert_ne!(run_label_value(&as_name), short);
    }

    fn run_selecting(name: &str, selector: Value) -> Run {
        serde_json::from_value(json!({"apiVersion": "flock.dev/v1alpha1", "kind": "Run",
            "metadata": {"name": name, "namespace": "a", "uid": "u1"}, "spec": {"profile": "p", "podSelector": selector}}))
        .unwrap()
    }

    /// The attack: run `a` selects the pods of run `b` (or of every run) with a selector the
    /// schema takes, so that a's profile adds to what b's pods may reach.
    #[test]
    fn a_run_selects_only_its_own_pods() {
        let refused = [
            json!({"matchExpressions": [{"key": RUN_LABEL, "operator": "Exists"}]}),
            json!({"matchLabels": {RUN_LABEL: "b"}}),
            json!({"matchExpressions": [{"key": RUN_LABEL, "operator": "In", "values": ["a", "b"]}]}),
            json!({"matchLabels": {"app": "x"}, "matchExpressions": [{"key": RUN_LABEL, "operator": "In", "values": ["b"]}]}),
        ];
        for sel in refused {
            let run = run_selecting("a", sel.clone());
            let e = run_selector(&run).unwrap_err().to_string();
            assert!(e.contains("must select only this run's pods: flock.dev/run: a"), "{sel}: {e}");
            // Its withdrawal (or deny-all) then uses the default selector, not this one.
            assert_eq!(own_selector(&run), None, "{sel}");
        }
        for sel in [
            json!({"matchLabels": {RUN_LABEL: "a", "app": "x"}}),
            json!({"matchExpressions": [{"key": RUN_LABEL, "operator": "In", "values": ["a"]}, {"key": RUN_LABEL, "operator": "Exists"}]}),
        ] {
            let run = run_selecting("a", sel.clone());
            assert!(run_selector(&run).is_ok(), "{sel}");
            assert!(own_selector(&run).is_some(), "{sel}");
        }
        // A long name's value is its shortened form.
        let long = "r".repeat(70);
        let run = run_selecting(&long, json!({"matchLabels": {RUN_LABEL: run_label_value(&long)}}));
        assert!(run_selector(&run).is_ok());
        let run = run_selecting(&long, json!({"matchLabels": {RUN_LABEL: "r".repeat(63)}}));
        assert!(run_selector(&run).is_err());
    }
}
