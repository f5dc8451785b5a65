//! The `flock.dev/v1alpha1` API flock-controller serves: the cluster-scoped [`RunProfile`]
//! (the template an administrator writes: which egress a run gets) and the namespaced
//! [`Run`] (the request: a profile reference and the pods it covers), their statuses and
//! conditions, and the semantic checks that mirror the CRDs' CEL rules; and the
//! [`FlockNode`] each flock-agent keeps for its node (read by the controller), the
//! [`AuditEvent`]s the controller writes and the [`PodSlice`]s it batches every pod's
//! identity into (read by agents with `--pod-source slices`). The agent and the controller share these types;
//! neither owns them.
//!
//! The CRDs under `deploy/controller/crds/` are generated from these types ([`crd_files`]);
//! `tests/controller.rs` fails when they are stale (`FLOCK_BLESS=1` rewrites them). The API
//! server enforces the schema and the CEL rules; the controller checks the same things again
//! ([`RunProfileSpec::problems`], [`RunSpec::problems`]) because objects can predate a
//! CRD upgrade and because a test API server runs no CEL. Everything the controller renders
//! is derived from checked input only.

// KubeSchema's derive copies each schema struct into a private scope with its visibility: the
// copies of the `pub` specs (pub because CustomResource gives the resource types their
// visibility, and tests name `Run`) would trip the lint.
#![allow(unreachable_pub)]

use std::collections::BTreeMap;

use ipnet::IpNet;
use kube::core::crd::CustomResourceExt;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::dns::DomainPattern;
use crate::model::RUN_LABEL;
use crate::translate::selector::{validate_label_key, validate_label_value};

/// The API group.
pub(crate) const GROUP: &str = "flock.dev";
/// The API version.
pub(crate) const VERSION: &str = "v1alpha1";

/// Which egress (and optionally ingress) a run gets: the template. Cluster-scoped, written
/// by administrators. Rules are rendered in a fixed order: DNS, internet, API server,
/// services, CIDRs, then domains (sorted by name).
// Triggered by kube's derive: its printcolumn expansions repeat `type_`.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[kube(
    group = "flock.dev",
    version = "v1alpha1",
    kind = "RunProfile",
    plural = "runprofiles",
    shortname = "rprof",
    category = "flock",
    status = "RunProfileStatus",
    derive = "PartialEq",
    doc = "RunProfile: the egress a sandboxed run gets (a template written by administrators). flock-controller renders it into one NetworkPolicy per Run.",
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.domains) || size(self.domains) == 0 || !has(self.dns) || self.dns").message("domains need dns: names are learned from the run's DNS answers"))]
pub struct RunProfileSpec {
    /// Egress to the cluster DNS pods only (UDP and TCP 53, to the pods the controller is
    /// configured with, kube-system/k8s-app=kube-dns by default). Default true.
    #[serde(default = "default_true")]
    pub(crate) dns: bool,
    /// Egress to the internet (0.0.0.0/0 and ::/0) on the listed ports, except private and
    /// link-local ranges and the cluster's pod and service CIDRs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) internet: Option<InternetEgress>,
    /// Egress to the Kubernetes API server: its Service address and its endpoints'
    /// addresses, each on its own port. Default false.
    #[serde(default)]
    pub(crate) api_server: bool,
    /// Egress to in-cluster services, named by the pods behind them (policies match after
    /// the Service's DNAT, so the pods are what counts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = kube::core::Rule::new("self.all(s, self.exists_one(t, t.name == s.name))").message("service names must be unique"))]
    #[schemars(length(max = 64))]
    pub(crate) services: Vec<ServiceEgress>,
    /// Egress to extra CIDRs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub(crate) cidrs: Vec<CidrEgress>,
    /// Egress to domain names (NPEP-133), each on its ports. Needs `dns`: the addresses are
    /// the ones the run's DNS answers give for the names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(validation = kube::core::Rule::new("self.all(d, self.exists_one(e, e.name == d.name))").message("domain names must be unique"))]
    #[schemars(length(max = 64))]
    pub(crate) domains: Vec<DomainEgress>,
    /// Ingress to the run's pods. Absent: ingress is not restricted. Present: only these
    /// peers may connect (an empty list admits nobody).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub(crate) ingress: Option<Vec<IngressPeer>>,
}

fn default_true() -> bool {
    true
}

/// Internet egress.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct InternetEgress {
    /// The ports allowed (at least one).
    #[schemars(length(min = 1, max = 64))]
    pub(crate) ports: Vec<PortSpec>,
    /// More ranges to except, besides the private, link-local and cluster ranges the
    /// controller always excepts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 64)))]
    #[x_kube(validation = kube::core::Rule::new("self.all(c, isCIDR(c) && cidr(c).prefixLength() > 0)").message("every except entry must be a CIDR narrower than /0"))]
    pub(crate) except: Vec<String>,
}

/// Egress to the pods behind an in-cluster service.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ServiceEgress {
    /// A name for this entry (unique in the profile), for people reading the policy.
    #[schemars(length(min = 1, max = 63))]
    pub(crate) name: String,
    /// The service's namespace. Absent: the run's own namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub(crate) namespace: Option<String>,
    /// The service's pods (its selector). Empty: every pod of the namespace.
    #[serde(default)]
    pub(crate) pod_selector: Selector,
    /// The ports allowed (the pods' ports, i.e. the Service's targetPorts; at least one).
    #[schemars(length(min = 1, max = 64))]
    pub(crate) ports: Vec<PortSpec>,
}

/// Egress to a CIDR.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.except) || self.except.all(e, isCIDR(e) && cidr(self.cidr).containsCIDR(e))").message("every except entry must be a CIDR inside cidr"))]
pub(crate) struct CidrEgress {
    /// An IPv4 or IPv6 CIDR.
    #[x_kube(validation = kube::core::Rule::new("isCIDR(self)").message("must be a CIDR such as 198.51.100.0/24 or 2001:db8::/32"))]
    #[schemars(length(min = 1, max = 64))]
    pub(crate) cidr: String,
    /// Ranges inside `cidr` to except.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 64)))]
    pub(crate) except: Vec<String>,
    /// The ports allowed. Empty: every port of every protocol.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub(crate) ports: Vec<PortSpec>,
}

/// The shape of a domain name as the schema checks it (the controller parses it with
/// [`crate::dns::DomainPattern`], which also bounds the name to 253 characters): an optional
/// `*.`, two or more labels of letters, digits, `-` and `_` (1–63, not starting or ending
/// with `-`), an optional trailing dot.
pub(crate) const DOMAIN_NAME_PATTERN: &str =
    r"^(\*\.)?([a-zA-Z0-9_]([-a-zA-Z0-9_]{0,61}[a-zA-Z0-9_])?\.)+[a-zA-Z0-9_]([-a-zA-Z0-9_]{0,61}[a-zA-Z0-9_])?\.?$";

/// Egress to a domain name.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DomainEgress {
    /// An exact name (`github.com`) or `*.` and a name (`*.pypi.org`: one or more whole
    /// labels before `pypi.org`, never `pypi.org` itself). Case-insensitive; a trailing dot
    /// is ignored. Unique in the profile.
    #[schemars(length(min = 1, max = 256), pattern(DOMAIN_NAME_PATTERN))]
    pub(crate) name: String,
    /// The ports allowed (at least one: there is no "every port" for names).
    #[schemars(length(min = 1, max = 64))]
    pub(crate) ports: Vec<PortSpec>,
}

/// Pods allowed to connect to the run's pods.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct IngressPeer {
    /// A name for this entry, for people reading the policy.
    #[schemars(length(min = 1, max = 63))]
    pub(crate) name: String,
    /// The peers' namespace. Absent: the run's own namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub(crate) namespace: Option<String>,
    /// The peer pods. Empty: every pod of the namespace.
    #[serde(default)]
    pub(crate) pod_selector: Selector,
    /// The run's ports they may connect to. Empty: every port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub(crate) ports: Vec<PortSpec>,
}

/// A port or a range of ports of one protocol.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.endPort) || self.endPort >= self.port").message("endPort must not be below port"))]
pub(crate) struct PortSpec {
    /// TCP (default), UDP or SCTP.
    #[serde(default)]
    pub(crate) protocol: Protocol,
    /// The port (1–65535).
    #[schemars(range(min = 1, max = 65535))]
    pub(crate) port: i32,
    /// The last port of a range (inclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub(crate) end_port: Option<i32>,
}

/// A transport protocol.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Protocol {
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
    #[serde(rename = "SCTP")]
    Sctp,
}

impl Protocol {
    /// The name NetworkPolicy and CiliumNetworkPolicy use.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
            Self::Sctp => "SCTP",
        }
    }
}

/// A label selector (the Kubernetes `LabelSelector`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Selector {
    /// Labels the pods must carry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) match_labels: BTreeMap<String, String>,
    /// Requirements the pods' labels must meet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub(crate) match_expressions: Vec<SelectorRequirement>,
}

impl Selector {
    /// Whether the selector selects everything.
    pub(crate) fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.match_expressions.is_empty()
    }
}

/// One `matchExpressions` requirement.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)").message("In and NotIn need values; Exists and DoesNotExist take none"))]
pub(crate) struct SelectorRequirement {
    /// The label key.
    #[schemars(length(min = 1, max = 317))]
    pub(crate) key: String,
    /// In, NotIn, Exists or DoesNotExist.
    pub(crate) operator: SelectorOperator,
    /// The values (In, NotIn).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 63)))]
    pub(crate) values: Vec<String>,
}

/// A selector requirement's operator.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl SelectorOperator {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::In => "In",
            Self::NotIn => "NotIn",
            Self::Exists => "Exists",
            Self::DoesNotExist => "DoesNotExist",
        }
    }
}

/// What the controller reports about a profile.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RunProfileStatus {
    /// The generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) observed_generation: Option<i64>,
    /// `Ready`: whether runs can use the profile, and why not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A sandboxed run: the pods it covers get the egress its profile describes, as their own
/// NetworkPolicy `<run>-egress`.
// Triggered by kube's derive: its printcolumn expansions repeat `type_`.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[kube(
    group = "flock.dev",
    version = "v1alpha1",
    kind = "Run",
    plural = "runs",
    namespaced,
    category = "flock",
    status = "RunStatus",
    derive = "PartialEq",
    doc = "Run: a sandboxed run whose pods get the egress of a RunProfile, as their own NetworkPolicy <run>-egress owned by the Run.",
    printcolumn(name = "Profile", type_ = "string", json_path = ".spec.profile"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Enforced", type_ = "string", json_path = ".status.conditions[?(@.type==\"Enforced\")].status"),
    printcolumn(name = "Policy", type_ = "string", json_path = ".status.conditions[?(@.type==\"NetworkPolicyReady\")].reason"),
    printcolumn(name = "Expires", type_ = "string", json_path = ".status.expiresAt"),
    printcolumn(name = "Enforcement", type_ = "boolean", priority = 1, json_path = ".status.enforcement.enabled"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct RunSpec {
    /// The RunProfile (cluster-scoped) this run uses.
    #[schemars(length(min = 1, max = 253))]
    pub profile: String,
    /// The run's pods. Default: the pods labelled `flock.dev/run: <run name>` (names longer
    /// than 63 characters are shortened with a hash, see `flock.dev/run` in docs/reference.md). A
    /// custom selector must select only this run's pods: `flock.dev/run` pinned to that value
    /// (in `matchLabels`, or a `matchExpressions` entry `In` with that one value; the schema
    /// asks for the label, the controller for the value): flock-agent isolates such pods from
    /// their creation, so none is open before the policy exists, and no run's profile reaches
    /// another run's pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("(has(self.matchLabels) && 'flock.dev/run' in self.matchLabels) || (has(self.matchExpressions) && self.matchExpressions.exists(e, e.key == 'flock.dev/run' && (e.operator == 'In' || e.operator == 'Exists')))").message("podSelector must require the flock.dev/run label (pods without it would be open until the run's policy exists)"))]
    pub(crate) pod_selector: Option<Selector>,
    /// How long the run may use its egress, in seconds from its creation. When it passes,
    /// the controller rewrites the run's policy to allow nothing (its pods stay isolated,
    /// both ways) and sets `Expired`. Raising it extends the run, also after expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub(crate) active_deadline_seconds: Option<i64>,
}

/// What the controller reports about a run.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(oldSelf.enforcement) || (has(self.enforcement) && self.enforcement == oldSelf.enforcement)").message("the enforcement decision is pinned on the first reconcile and never changes"))]
pub struct RunStatus {
    /// The generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Whether the run's policy is enforced: decided on the first reconcile and pinned, so
    /// changing the controller's `--enforce` mode affects new runs only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforcement: Option<Enforcement>,
    /// The policy applied for the run (set once it was applied; a policy found missing
    /// afterwards was withdrawn, and is re-created with a `NetworkPolicyWithdrawn` event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<AppliedPolicy>,
    /// When the run's egress expires (`spec.activeDeadlineSeconds` after its creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub expires_at: Option<String>,
    /// The egress last recorded in an `AuditEvent` (what the run was granted, as the audit
    /// trail knows it): the next change is recorded against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<Grant>,
    /// `NetworkPolicyReady`, `Enforced`, `Expired` and `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The egress recorded last for a run (see `AuditEvent`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    /// The sequence number of the last `AuditEvent` written for the run (1, 2, …).
    pub sequence: i64,
    /// The destinations granted (none once expired). Always written: status is merge-patched,
    /// and an absent list would keep the old one.
    #[serde(default)]
    #[schemars(length(max = 512), inner(length(max = 1024)))]
    pub destinations: Vec<String>,
    /// Whether the run had expired.
    #[serde(default)]
    pub expired: bool,
    /// The expiry then in force.
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub(crate) expires_at: Option<String>,
}

/// The pinned enforcement decision.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Enforcement {
    /// Whether the run's policy is applied.
    pub enabled: bool,
    /// The controller's mode when the decision was made: auto, on or off.
    #[schemars(length(max = 8))]
    pub mode: String,
    /// Why (the mode, or what the auto probe found).
    #[schemars(length(max = 1024))]
    pub(crate) reason: String,
}

/// The policy object applied for a run.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AppliedPolicy {
    /// `networking.k8s.io/v1` or `cilium.io/v2`.
    pub(crate) api_version: String,
    /// `NetworkPolicy` or `CiliumNetworkPolicy`.
    pub kind: String,
    pub(crate) name: String,
    pub uid: String,
    /// The policy's `metadata.generation` as applied (what nodes must report enforcing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

/// FlockNode: what flock-agent enforces on one node. Cluster-scoped, named after the Node
/// and owned by it (deleted with it); its status is written by that node's agent only, when
/// something in it changes and at most once per 10 s: no timestamps (times are metrics).
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[kube(
    group = "flock.dev",
    version = "v1alpha1",
    kind = "FlockNode",
    plural = "flocknodes",
    shortname = "fnode",
    category = "flock",
    status = "FlockNodeStatus",
    derive = "PartialEq",
    doc = "FlockNode: what flock-agent enforces on one node (named after the Node, written by its agent).",
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version"),
    printcolumn(name = "API", type_ = "string", json_path = ".status.api"),
    printcolumn(name = "Endpoints", type_ = "integer", json_path = ".status.ruleset.localEndpoints"),
    printcolumn(name = "Rules", type_ = "integer", json_path = ".status.ruleset.rules"),
    printcolumn(name = "Elements", type_ = "integer", json_path = ".status.ruleset.setElements"),
    printcolumn(name = "Hash", type_ = "string", priority = 1, json_path = ".status.ruleset.hash"),
    printcolumn(name = "Error", type_ = "string", json_path = ".status.lastError"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FlockNodeSpec {}

/// What a node's agent reports.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FlockNodeStatus {
    /// flock-agent's version.
    #[schemars(length(max = 64))]
    pub(crate) version: String,
    /// The API server as the agent sees it: Connected, Degraded or Disconnected.
    #[schemars(length(max = 32))]
    pub(crate) api: String,
    /// The ruleset of the last committed sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ruleset: Option<NodeRuleset>,
    /// Why the last sync failed (empty when it committed; the last committed ruleset stays).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 4096))]
    pub(crate) last_error: String,
    /// The NetworkPolicies that select a run pod (labelled `flock.dev/run`) scheduled on this
    /// node, each with the `metadata.generation` the last committed sync enforces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub(crate) run_policies: Vec<EnforcedPolicy>,
    /// The flock-agent pod that wrote this status (`flockctl status` compares it with the
    /// pod running on the node now: another one has not written, so the status is stale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) agent_pod: Option<AgentPod>,
}

/// A flock-agent pod.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AgentPod {
    /// `namespace/name`.
    #[schemars(length(max = 317))]
    pub name: String,
    #[schemars(length(max = 64))]
    pub uid: String,
}

/// The last committed ruleset of a node.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NodeRuleset {
    /// SHA-256 of the ruleset (its structure, as rendered; equal rulesets, equal hashes).
    #[schemars(length(max = 64))]
    pub(crate) hash: String,
    pub(crate) rules: i64,
    pub(crate) set_elements: i64,
    /// Local pod endpoints the ruleset covers.
    pub(crate) local_endpoints: i64,
}

/// A policy a node enforces, at a generation.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EnforcedPolicy {
    /// `namespace/name`.
    #[schemars(length(min = 1, max = 317))]
    pub(crate) name: String,
    pub(crate) generation: i64,
}

/// The most pods one PodSlice holds (flock-controller's `--pod-slice-max-pods` is at most this).
pub const POD_SLICE_LIMIT: usize = 1000;

/// PodSlice: the pod identities flock-agents read instead of every Pod — up to
/// `--pod-slice-max-pods` pods of one namespace, each with only what policy needs (name, uid,
/// node, addresses, labels as an index into the slice's shared label sets, named container
/// ports, creation time), like an EndpointSlice or Cilium's CiliumEndpointSlice.
/// Cluster-scoped, written by flock-controller alone (its RBAC and an admission policy); it
/// holds only the pods that can be policy peers (scheduled, with addresses, not
/// host-networked, not terminal): a pod that ends leaves its slice.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[kube(
    group = "flock.dev",
    version = "v1alpha1",
    kind = "PodSlice",
    plural = "podslices",
    shortname = "fps",
    category = "flock",
    derive = "PartialEq",
    doc = "PodSlice: the policy identities of up to a few hundred pods of one namespace, batched by flock-controller for flock-agents.",
    printcolumn(name = "Namespace", type_ = "string", json_path = ".spec.namespace"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct PodSliceSpec {
    /// The namespace of every pod in the slice.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// The label sets of the slice's pods; each pod names one by its index (pods of one
    /// workload share theirs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    pub label_sets: Vec<BTreeMap<String, String>>,
    /// The pods, by name.
    #[serde(default)]
    #[schemars(length(max = 1000))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["uid"]))]
    pub pods: Vec<SlicePod>,
}

/// One pod of a PodSlice.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SlicePod {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// `metadata.uid`: an address names its pod by uid, so a re-created pod is another one.
    #[schemars(length(min = 1, max = 64))]
    pub uid: String,
    /// `spec.nodeName`.
    #[schemars(length(min = 1, max = 253))]
    pub node: String,
    /// `status.podIPs` (one per family).
    #[schemars(length(min = 1, max = 2), inner(length(max = 45)))]
    pub ips: Vec<String>,
    /// The index of the pod's labels in `labelSets`.
    #[schemars(range(min = 0, max = 999))]
    pub labels: i32,
    /// `status.phase` (a terminal pod is in no slice).
    pub phase: SlicePhase,
    /// The named container ports (named ports of policies resolve on them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub ports: Vec<SlicePort>,
    /// `metadata.creationTimestamp`, seconds since the Unix epoch: of two live pods reporting
    /// one address, the newer owns it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<i64>,
}

/// The phase of a pod in a slice.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SlicePhase {
    #[default]
    Pending,
    Running,
    Unknown,
}

/// A named container port.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct SlicePort {
    #[schemars(length(min = 1, max = 15))]
    pub name: String,
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    #[serde(default)]
    pub protocol: Protocol,
}

/// AuditEvent: one grant, change, withdrawal or expiry of a run's egress, written by
/// flock-controller. Durable: not owned by the Run (it outlives it), immutable, removed only
/// by the controller's retention (by age and by count per run).
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[kube(
    group = "flock.dev",
    version = "v1alpha1",
    kind = "AuditEvent",
    plural = "auditevents",
    namespaced,
    category = "flock",
    derive = "PartialEq",
    doc = "AuditEvent: a grant, change, withdrawal or expiry of a run's egress (durable, immutable; written by flock-controller).",
    printcolumn(name = "Run", type_ = "string", json_path = ".spec.run.name"),
    printcolumn(name = "Action", type_ = "string", json_path = ".spec.action"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".spec.reason"),
    printcolumn(name = "Time", type_ = "string", json_path = ".spec.time")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("self == oldSelf").message("audit events are immutable"))]
pub struct AuditEventSpec {
    pub run: AuditRun,
    pub profile: AuditProfile,
    pub policy: AuditPolicy,
    /// The run's `AuditEvent` sequence number (1 for its first).
    pub sequence: i64,
    pub action: AuditAction,
    /// Why (CamelCase).
    #[schemars(length(min = 1, max = 128))]
    pub reason: String,
    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 4096))]
    pub message: String,
    /// Destinations granted by this change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 512), inner(length(max = 1024)))]
    pub added: Vec<String>,
    /// Destinations taken away by this change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 512), inner(length(max = 1024)))]
    pub removed: Vec<String>,
    /// When the run's egress expires (after this change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub expires_at: Option<String>,
    /// When the controller recorded it (RFC 3339).
    #[schemars(length(min = 1, max = 64))]
    pub(crate) time: String,
}

/// The run an `AuditEvent` is about.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AuditRun {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 64))]
    pub uid: String,
}

/// The profile of an `AuditEvent`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AuditProfile {
    #[schemars(length(max = 253))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

/// The run's policy in an `AuditEvent`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AuditPolicy {
    #[schemars(length(max = 64))]
    pub(crate) kind: String,
    #[schemars(length(max = 253))]
    pub(crate) name: String,
    /// Its generation after the change (absent when the change was recorded before it was
    /// applied: grants are recorded first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

/// What happened to a run's egress.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuditAction {
    /// First granted.
    Granted,
    /// The destinations or the deadline changed.
    Changed,
    /// The applied policy was found deleted (and was re-created).
    Withdrawn,
    /// The deadline passed: the policy now allows nothing.
    Expired,
    /// The deadline was raised after expiry: the egress is granted again.
    Extended,
}

impl AuditAction {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Granted => "Granted",
            Self::Changed => "Changed",
            Self::Withdrawn => "Withdrawn",
            Self::Expired => "Expired",
            Self::Extended => "Extended",
        }
    }
}

/// A status condition (the shape of `metav1.Condition`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready`, `NetworkPolicyReady`.
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 316))]
    pub(crate) type_: String,
    /// True, False or Unknown.
    #[schemars(length(min = 1, max = 7))]
    pub status: String,
    /// CamelCase reason.
    #[schemars(length(min = 1, max = 1024))]
    pub reason: String,
    /// Human-readable detail.
    #[serde(default)]
    #[schemars(length(max = 32768))]
    pub message: String,
    /// When the status last changed (RFC 3339).
    #[schemars(length(min = 1, max = 64))]
    pub(crate) last_transition_time: String,
    /// The generation the condition describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) observed_generation: Option<i64>,
}

/// Condition status strings.
pub(crate) const TRUE: &str = "True";
pub(crate) const FALSE: &str = "False";
pub(crate) const UNKNOWN: &str = "Unknown";

/// Sets condition `type_` in `conditions`: `lastTransitionTime` changes only when the status
/// does (a reason or message change keeps it), so a no-op pass leaves the list equal.
pub(crate) fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &str,
) {
    set_condition_status(conditions, type_, if status { TRUE } else { FALSE }, reason, message, generation, now);
}

/// [`set_condition`] with the status as a string (`True`, `False`, `Unknown`).
pub(crate) fn set_condition_status(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &str,
) {
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.status = status.to_string();
                c.last_transition_time = now.to_string();
            }
            c.reason = reason.to_string();
            c.message = message.to_string();
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
            last_transition_time: now.to_string(),
            observed_generation: generation,
        }),
    }
}

/// The condition of type `type_`, if set.
pub fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// One thing wrong with a spec: the field (a JSON path from `spec`) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub(crate) field: String,
    pub(crate) message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Problems joined for a condition message.
pub(crate) fn describe(problems: &[Problem]) -> String {
    problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

impl RunProfileSpec {
    /// A profile that grants nothing (what an expired run's policy is rendered from when its
    /// own profile is gone or invalid).
    pub(crate) fn withdrawn() -> Self {
        Self {
            dns: false,
            internet: None,
            api_server: false,
            services: Vec::new(),
            cidrs: Vec::new(),
            domains: Vec::new(),
            ingress: Some(Vec::new()),
        }
    }

    /// What the API server's schema and CEL rules would reject, checked again (see the
    /// module doc). Empty when the profile is usable.
    pub fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        if let Some(internet) = &self.internet {
            if internet.ports.is_empty() {
                out.push(problem("spec.internet.ports", "at least one port is required"));
            }
            check_ports(&internet.ports, "spec.internet.ports", &mut out);
            for (i, e) in internet.except.iter().enumerate() {
                match parse_cidr(e) {
                    Some(net) if net.prefix_len() > 0 => {}
                    Some(_) => out.push(problem(format!("spec.internet.except[{i}]"), format!("{e} would except everything"))),
                    None => out.push(problem(format!("spec.internet.except[{i}]"), format!("{e:?} is not a CIDR"))),
                }
            }
        }
        for (i, s) in self.services.iter().enumerate() {
            let at = format!("spec.services[{i}]");
            check_name(&s.name, &format!("{at}.name"), &mut out);
            if self.services[..i].iter().any(|t| t.name == s.name) {
                out.push(problem(format!("{at}.name"), format!("{:?} is used twice", s.name)));
            }
            if let Some(ns) = &s.namespace {
                check_name(ns, &format!("{at}.namespace"), &mut out);
            }
            check_selector(&s.pod_selector, &format!("{at}.podSelector"), &mut out);
            if s.ports.is_empty() {
                out.push(problem(format!("{at}.ports"), "at least one port is required"));
            }
            check_ports(&s.ports, &format!("{at}.ports"), &mut out);
        }
        for (i, c) in self.cidrs.iter().enumerate() {
            let at = format!("spec.cidrs[{i}]");
            match parse_cidr(&c.cidr) {
                None => out.push(problem(format!("{at}.cidr"), format!("{:?} is not a CIDR", c.cidr))),
                Some(net) => {
                    for (j, e) in c.except.iter().enumerate() {
                        match parse_cidr(e) {
                            Some(inner) if net.contains(&inner) && inner != net => {}
                            Some(_) => out.push(problem(format!("{at}.except[{j}]"), format!("{e} is not strictly inside {net}"))),
                            None => out.push(problem(format!("{at}.except[{j}]"), format!("{e:?} is not a CIDR"))),
                        }
                    }
                }
            }
            check_ports(&c.ports, &format!("{at}.ports"), &mut out);
        }
        let mut names: Vec<DomainPattern> = Vec::new();
        for (i, d) in self.domains.iter().enumerate() {
            let at = format!("spec.domains[{i}]");
            match DomainPattern::parse(&d.name) {
                // Compared as parsed: `GitHub.com.` and `github.com` are the same name.
                Ok(name) if names.contains(&name) => {
                    out.push(problem(format!("{at}.name"), format!("{:?} is used twice (as {name})", d.name)))
                }
                Ok(name) => names.push(name),
                Err(why) => out.push(problem(format!("{at}.name"), format!("{:?} is not a domain name: {why}", d.name))),
            }
            if d.ports.is_empty() {
                out.push(problem(format!("{at}.ports"), "at least one port is required"));
            }
            check_ports(&d.ports, &format!("{at}.ports"), &mut out);
        }
        if !self.domains.is_empty() && !self.dns {
            // Egress by name admits the addresses the run's DNS answers give: without DNS
            // there are none, and a profile that looks like it grants them would mislead.
            out.push(problem("spec.domains", "domains need dns (spec.dns is false): names are learned from the run's DNS answers"));
        }
        for (i, p) in self.ingress.iter().flatten().enumerate() {
            let at = format!("spec.ingress[{i}]");
            check_name(&p.name, &format!("{at}.name"), &mut out);
            if let Some(ns) = &p.namespace {
                check_name(ns, &format!("{at}.namespace"), &mut out);
            }
            check_selector(&p.pod_selector, &format!("{at}.podSelector"), &mut out);
            check_ports(&p.ports, &format!("{at}.ports"), &mut out);
        }
        out
    }
}

impl RunSpec {
    /// What the API server would reject in a run, checked again.
    pub fn problems(&self) -> Vec<Problem> {
        let mut out = Vec::new();
        if self.profile.is_empty() {
            out.push(problem("spec.profile", "required"));
        }
        if let Some(sel) = &self.pod_selector {
            if sel.is_empty() {
                out.push(problem("spec.podSelector", "must not be empty (it would isolate every pod of the namespace)"));
            }
            check_selector(sel, "spec.podSelector", &mut out);
            if !requires_run_label(sel) {
                out.push(problem(
                    "spec.podSelector",
                    format!("must require the {RUN_LABEL} label (matchLabels, or matchExpressions In or Exists): pods without it would be open until the run's policy exists"),
                ));
            }
        }
        if let Some(d) = self.active_deadline_seconds
            && d < 1
        {
            out.push(problem("spec.activeDeadlineSeconds", format!("{d} is not a positive number of seconds")));
        }
        out
    }
}

/// Whether every pod `sel` selects carries the `flock.dev/run` label.
pub(crate) fn requires_run_label(sel: &Selector) -> bool {
    sel.match_labels.contains_key(RUN_LABEL)
        || sel.match_expressions.iter().any(|e| e.key == RUN_LABEL && matches!(e.operator, SelectorOperator::In | SelectorOperator::Exists))
}

fn problem(field: impl Into<String>, message: impl Into<String>) -> Problem {
    Problem { field: field.into(), message: message.into() }
}

/// A CIDR in canonical form (`198.51.100.0/24`); host bits set are rejected as the API
/// server's `isCIDR` accepts them but NetworkPolicy validation does not.
pub(crate) fn parse_cidr(s: &str) -> Option<IpNet> {
    let net: IpNet = s.parse().ok()?;
    (net.trunc() == net).then_some(net)
}

fn check_ports(ports: &[PortSpec], at: &str, out: &mut Vec<Problem>) {
    for (i, p) in ports.iter().enumerate() {
        if !(1..=65535).contains(&p.port) {
            out.push(problem(format!("{at}[{i}].port"), format!("{} is outside 1-65535", p.port)));
        }
        if let Some(end) = p.end_port {
            if !(1..=65535).contains(&end) {
                out.push(problem(format!("{at}[{i}].endPort"), format!("{end} is outside 1-65535")));
            } else if end < p.port {
                out.push(problem(format!("{at}[{i}].endPort"), format!("{end} is below port {}", p.port)));
            }
        }
    }
}

/// A DNS label (namespace names, entry names).
fn check_name(name: &str, at: &str, out: &mut Vec<Problem>) {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if !ok {
        out.push(problem(at, format!("{name:?} is not a DNS label (lowercase letters, digits and '-', at most 63)")));
    }
}

fn check_selector(sel: &Selector, at: &str, out: &mut Vec<Problem>) {
    for (k, v) in &sel.match_labels {
        if let Err(e) = validate_label_key(k) {
            out.push(problem(format!("{at}.matchLabels"), format!("{k:?} is not a label key: {e}")));
        }
        if let Err(e) = validate_label_value(v) {
            out.push(problem(format!("{at}.matchLabels[{k}]"), format!("{v:?} is not a label value: {e}")));
        }
    }
    for (i, r) in sel.match_expressions.iter().enumerate() {
        if let Err(e) = validate_label_key(&r.key) {
            out.push(problem(format!("{at}.matchExpressions[{i}].key"), format!("{:?} is not a label key: {e}", r.key)));
        }
        let needs_values = matches!(r.operator, SelectorOperator::In | SelectorOperator::NotIn);
        if needs_values == r.values.is_empty() {
            out.push(problem(
                format!("{at}.matchExpressions[{i}].values"),
                format!("{} {}", r.operator.as_str(), if needs_values { "needs values" } else { "takes no values" }),
            ));
        }
        for v in &r.values {
            if let Err(e) = validate_label_value(v) {
                out.push(problem(format!("{at}.matchExpressions[{i}].values"), format!("{v:?} is not a label value: {e}")));
            }
        }
    }
}

/// `value` as YAML, the way flock writes it: long strings (CEL rules) stay on one line,
/// multi-line ones are literal blocks.
pub fn to_yaml<T: serde::Serialize>(value: &T) -> Result<String, serde_saphyr::SerializeError> {
    serde_saphyr::to_string_with_options(value, serde_saphyr::ser_options! { folded_wrap_chars: usize::MAX })
}

/// The generated CRDs as (path under `deploy/`, YAML text): the controller's (RunProfile,
/// Run, AuditEvent, PodSlice) under `controller/crds/`, FlockNode (the agent writes it) under
/// `agent/crds/`.
pub fn crd_files() -> Result<Vec<(String, String)>, serde_saphyr::SerializeError> {
    let header = "# Generated from the Rust types in src/crd.rs: do not edit.\n\
                  # Regenerate with FLOCK_BLESS=1 cargo test --test controller crds_are_up_to_date\n\
                  # (or `flock-controller --print-crds`).\n";
    let mut out = Vec::new();
    for (dir, crd) in [
        ("controller", RunProfile::crd()),
        ("controller", Run::crd()),
        ("controller", AuditEvent::crd()),
        ("agent", FlockNode::crd()),
        ("controller", PodSlice::crd()),
    ] {
        let name = crd.metadata.name.clone().unwrap_or_default();
        out.push((format!("{dir}/crds/{name}.yaml"), format!("{header}{}", to_yaml(&crd)?)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(p: i32) -> PortSpec {
        PortSpec { protocol: Protocol::Tcp, port: p, end_port: None }
    }

    #[test]
    fn defaults_and_round_trip() {
        let spec: RunProfileSpec = serde_json::from_value(serde_json::json!({})).unwrap();
        assert!(spec.dns && !spec.api_server && spec.internet.is_none() && spec.ingress.is_none());
        let p: PortSpec = serde_json::from_value(serde_json::json!({"port": 443})).unwrap();
        assert_eq!(p, port(443));
        let back = serde_json::to_value(&spec).unwrap();
        assert_eq!(back, serde_json::json!({"dns": true, "apiServer": false}));
    }

    #[test]
    fn profile_problems_name_the_field() {
        let spec = RunProfileSpec {
            dns: true,
            internet: Some(InternetEgress { ports: vec![port(0)], except: vec!["nope".into()] }),
            api_server: false,
            services: vec![
                ServiceEgress { name: "db".into(), namespace: Some("Bad_NS".into()), pod_selector: Selector::default(), ports: vec![] },
                ServiceEgress { name: "db".into(), namespace: None, pod_selector: Selector::default(), ports: vec![port(5432)] },
            ],
            cidrs: vec![CidrEgress { cidr: "198.51.100.0/24".into(), except: vec!["203.0.113.0/24".into()], ports: vec![] }],
            domains: vec![],
            ingress: Some(vec![IngressPeer {
                name: "adapter".into(),
                namespace: None,
                pod_selector: Selector {
                    match_labels: BTreeMap::new(),
                    match_expressions: vec![SelectorRequirement { key: "app".into(), operator: SelectorOperator::In, values: vec![] }],
                },
                ports: vec![PortSpec { protocol: Protocol::Tcp, port: 90, end_port: Some(80) }],
            }]),
        };
        let fields: Vec<String> = spec.problems().into_iter().map(|p| p.field).collect();
        assert_eq!(
            fields,
            [
                "spec.internet.ports[0].port",
                "spec.internet.except[0]",
                "spec.services[0].namespace",
                "spec.services[0].ports",
                "spec.services[1].name",
                "spec.cidrs[0].except[0]",
                "spec.ingress[0].podSelector.matchExpressions[0].values",
                "spec.ingress[0].ports[0].endPort",
            ]
        );
    }

    #[test]
    fn domain_problems_name_the_entry_and_why() {
        let domain = |name: &str, ports: Vec<PortSpec>| DomainEgress { name: name.into(), ports };
        let mut spec = RunProfileSpec::withdrawn();
        spec.dns = true;
        spec.domains = vec![
            domain("github.com", vec![port(443)]),
            domain("a.*.example.com", vec![port(443)]),
            domain("GitHub.COM.", vec![port(22)]),
            domain("*.pypi.org", vec![]),
            domain("com", vec![port(70000)]),
        ];
        let problems = spec.problems();
        let got: Vec<(&str, &str)> = problems.iter().map(|p| (p.field.as_str(), p.message.as_str())).collect();
        assert_eq!(got.len(), 5, "{got:#?}");
        assert_eq!(got[0].0, "spec.domains[1].name");
        assert!(got[0].1.contains("\"a.*.example.com\" is not a domain name: '*' may only be the first label"), "{}", got[0].1);
        assert_eq!(got[1], ("spec.domains[2].name", "\"GitHub.COM.\" is used twice (as github.com)"));
        assert_eq!(got[2], ("spec.domains[3].ports", "at least one port is required"));
        assert_eq!(got[3].0, "spec.domains[4].name");
        assert!(got[3].1.contains("at least two labels"), "{}", got[3].1);
        assert_eq!(got[4].0, "spec.domains[4].ports[0].port");

        // Names need DNS: the one problem of an otherwise valid profile without it.
        spec.domains = vec![domain("github.com", vec![port(443)])];
        assert!(spec.problems().is_empty());
        spec.dns = false;
        let problems = spec.problems();
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].field, "spec.domains");
        assert!(problems[0].message.starts_with("domains need dns"), "{}", problems[0]);
    }

    #[test]
    fn host_bits_are_not_a_cidr() {
        assert!(parse_cidr("198.51.100.0/24").is_some());
        assert!(parse_cidr("198.51.100.1/24").is_none());
        assert!(parse_cidr("2001:db8::/32").is_some());
        assert!(parse_cidr("2001:db8::").is_none());
    }

    #[test]
    fn conditions_keep_their_transition_time_while_the_status_holds() {
        let mut c = Vec::new();
        set_condition(&mut c, "Ready", false, "ProfileNotFound", "x", Some(1), "t1");
        set_condition(&mut c, "Ready", false, "ProfileInvalid", "y", Some(2), "t2");
        assert_eq!((c[0].reason.as_str(), c[0].last_transition_time.as_str(), c[0].observed_generation), ("ProfileInvalid", "t1", Some(2)));
        set_condition(&mut c, "Ready", true, "Applied", "", Some(2), "t3");
        assert_eq!(c[0].last_transition_time, "t3");
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn the_crds_carry_schema_and_cel_rules() {
        let files = crd_files().unwrap();
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "controller/crds/runprofiles.flock.dev.yaml",
                "controller/crds/runs.flock.dev.yaml",
                "controller/crds/auditevents.flock.dev.yaml",
                "agent/crds/flocknodes.flock.dev.yaml",
                "controller/crds/podslices.flock.dev.yaml"
            ]
        );
        // A slice's pods are a list-map by uid (the API server refuses a uid twice), within
        // the documented bounds.
        let slices = &files[4].1;
        for want in ["x-kubernetes-list-map-keys:", "- uid", "maxItems: 1000", "maximum: 65535"] {
            assert!(slices.contains(want), "{want} missing in\n{slices}");
        }
        let profile = &files[0].1;
        assert!(profile.contains("scope: Cluster"), "{profile}");
        assert!(profile.contains("isCIDR(self)"));
        assert!(profile.contains("x-kubernetes-list-type: map"));
        let run = &files[1].1;
        assert!(run.contains("scope: Namespaced"));
        assert!(run.contains("podSelector must require the flock.dev/run label"));
        assert!(run.contains("the enforcement decision is pinned"));
        assert!(run.contains("status: {}"), "status subresource:\n{run}");
        let audit = &files[2].1;
        assert!(audit.contains("audit events are immutable") && !audit.contains("status: {}"), "{audit}");
        let node = &files[3].1;
        assert!(node.contains("scope: Cluster") && node.contains("status: {}") && node.contains("- name"), "{node}");
    }
}
