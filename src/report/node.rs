//! This node's FlockNode (`flock.dev/v1alpha1`, cluster-scoped, named after the Node): what
//! the agent enforces here, for operators (`kubectl get flocknodes`) and for flock-controller
//! (which generation of a run's policy the nodes running its pods enforce).
//!
//! Every agent writes its own node's, and only its status. The desired status ([`desired`])
//! comes from the sync loop's [`SyncStatus`] and the API health: flock-agent's version, the
//! API state, the committed ruleset (its SHA-256, rules, set elements, local endpoints), the
//! last sync's error, and the NetworkPolicies selecting this node's run pods with their
//! generations. Nothing is written before the agent's first commit; afterwards only when the
//! desired status differs from what was last written, and at most once per
//! [`NodeStatusOptions::interval`] (the first write goes at once). No timestamps: a status
//! that does not change is not rewritten; the times go to metrics
//! (`flock_node_status_last_write_timestamp_seconds`).
//!
//! The object is created when missing, owned by the Node (garbage-collected with it); the
//! Node's uid is read first, and without a Node nothing is created (retried later: an
//! owner-less FlockNode would outlive its node). A restarted agent reads the object first and
//! writes nothing if its status already says the same. An existing object that is not owned
//! by the Node as it is now (no ownerReference to it, or one with a stale uid: made by hand,
//! or before the Node was re-created) gets the reference first, by a merge patch of
//! `metadata.ownerReferences` conditional on the resourceVersion read (other owners stay);
//! until that succeeds its status is not written either. The status is written with a JSON
//! merge patch of the whole status on the `status` subresource, fields that went away set to
//! null: the agent is the status's only writer, so server-side apply's field ownership would
//! buy nothing but a managedFields entry to keep. An object deleted meanwhile (404) is created
//! again. Failures are logged and retried after a backoff; enforcement never waits for this.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::agent::SyncStatus;
use crate::agent::metrics::Metrics;
use crate::crd::{AgentPod, EnforcedPolicy, FlockNode, FlockNodeSpec, FlockNodeStatus, NodeRuleset};
use crate::source::kube::{ApiHealth, HealthState};

/// The field manager of the status writes.
pub(crate) const FIELD_MANAGER: &str = "flock-agent";
/// The longest `lastError` (the CRD's limit), in bytes.
pub(crate) const MAX_ERROR: usize = 4096;
/// How long a write waits for the digest of a ruleset committed just before it (see
/// [`crate::agent::RulesetDigest`]), so that hash and run policies describe one commit.
const DIGEST_WAIT: Duration = Duration::from_secs(3);

/// How this node's FlockNode is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatusOptions {
    /// This agent's pod (from the downward API), written into the status.
    pub agent_pod: Option<AgentPod>,
    /// At most one status write per this long.
    pub interval: Duration,
    /// A failed attempt is retried after this, doubling up to `max_retry`.
    pub retry: Duration,
    pub max_retry: Duration,
}

impl Default for NodeStatusOptions {
    fn default() -> Self {
        Self { agent_pod: None, interval: Duration::from_secs(10), retry: Duration::from_secs(5), max_retry: Duration::from_secs(60) }
    }
}

/// Why this node's FlockNode could not be written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NodeStatusError {
    #[error("cannot read FlockNode {name}: {source}")]
    Read { name: String, source: kube::Error },
    #[error("cannot read Node {name} (the FlockNode's owner): {source}")]
    ReadNode { name: String, source: kube::Error },
    #[error("Node {name} does not exist (yet): FlockNode {name} is created, owned by it, once it does")]
    NoNode { name: String },
    #[error("cannot create FlockNode {name}: {source}")]
    Create { name: String, source: kube::Error },
    #[error("cannot make Node {name} the owner of FlockNode {name}: {source}")]
    Adopt { name: String, source: kube::Error },
    #[error("cannot write the status of FlockNode {name}: {source}")]
    Patch { name: String, source: kube::Error },
    #[error("FlockNode {name} was deleted; it is created again")]
    Gone { name: String },
    #[error("cannot encode the status of FlockNode {name}: {source}")]
    Encode { name: String, source: serde_json::Error },
}

/// The status this node's FlockNode should have; `None` before the agent's first commit.
pub(crate) fn desired(sync: &SyncStatus, api: HealthState, agent_pod: Option<&AgentPod>) -> Option<FlockNodeStatus> {
    if !sync.ready {
        return None;
    }
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    Some(FlockNodeStatus {
        version: env!("CARGO_PKG_VERSION").into(),
        api: api.as_str().into(),
        ruleset: sync.ruleset_digest.as_ref().map(|d| NodeRuleset {
            hash: d.sha256.clone(),
            rules: count(d.stats.rules),
            set_elements: count(d.stats.elements),
            local_endpoints: count(d.endpoints),
        }),
        last_error: sync.error.as_deref().map(|e| super::truncate(e, MAX_ERROR).to_string()).unwrap_or_default(),
        run_policies: sync
            .run_policies
            .iter()
            .map(|(name, generation)| EnforcedPolicy { name: name.to_string(), generation: *generation })
            .collect(),
        agent_pod: agent_pod.cloned(),
    })
}

/// Whether the digest of the last ruleset the table changed to is still being computed.
fn digest_pending(sync: &SyncStatus) -> bool {
    sync.ready && sync.ruleset_digest.as_ref().is_none_or(|d| d.generation < sync.last_applied)
}

/// The body of the merge patch that makes the status `status`: every field, those it lacks
/// as null (a merge patch leaves out what it does not name).
pub(crate) fn merge_patch(status: &FlockNodeStatus) -> Result<Value, serde_json::Error> {
    let mut value = serde_json::to_value(status)?;
    if let Value::Object(map) = &mut value {
        for key in ["ruleset", "lastError", "runPolicies"] {
            map.entry(key).or_insert(Value::Null);
        }
    }
    Ok(json!({ "status": value }))
}

/// Writes this node's FlockNode.
pub struct NodeStatusWriter {
    client: Client,
    node: String,
    opts: NodeStatusOptions,
    metrics: Arc<Metrics>,
    /// The object is known to exist.
    exists: bool,
    /// The status as last written or read (`None`: unknown).
    written: Option<FlockNodeStatus>,
}

impl NodeStatusWriter {
    pub fn new(client: Client, node: &str, opts: NodeStatusOptions, metrics: Arc<Metrics>) -> Self {
        Self { client, node: node.into(), opts, metrics, exists: false, written: None }
    }

    /// Keeps the FlockNode current until `stop`.
    pub async fn run(mut self, mut sync: watch::Receiver<SyncStatus>, health: Arc<ApiHealth>, mut stop: watch::Receiver<bool>) {
        let mut next_write = Instant::now();
        let mut retry_at: Option<Instant> = None;
        let mut failures = 0u32;
        let mut digest_since: Option<Instant> = None;
        // The API state changes with time alone.
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if *stop.borrow() {
                return;
            }
            let (want, pending) = {
                let s = sync.borrow_and_update();
                (desired(&s, health.state(), self.opts.agent_pod.as_ref()), digest_pending(&s))
            };
            digest_since = if pending { digest_since.or_else(|| Some(Instant::now())) } else { None };
            let due = match &want {
                Some(w) if self.written.as_ref() != Some(w) => {
                    let mut at = next_write.max(retry_at.unwrap_or(next_write));
                    if let Some(t) = digest_since {
                        at = at.max(t + DIGEST_WAIT);
                    }
                    Some(at)
                }
                _ => None,
            };
            if let (Some(at), Some(want)) = (due, &want)
                && at <= Instant::now()
            {
                let result = tokio::select! {
                    r = self.write(want) => r,
                    _ = stop.changed() => return,
                };
                // The interval counts from the answer: two writes never reach the server
                // closer than that.
                let done = Instant::now();
                match result {
                    Ok(wrote) => {
                        failures = 0;
                        retry_at = None;
                        if wrote {
                            next_write = done + self.opts.interval;
                        }
                    }
                    Err((e, patched)) => {
                        failures = failures.saturating_add(1);
                        let delay = self.opts.retry.saturating_mul(1 << failures.saturating_sub(1).min(16)).min(self.opts.max_retry);
                        retry_at = Some(done + delay);
                        if patched {
                            next_write = done + self.opts.interval;
                        }
                        self.metrics.node_status_write(false);
                        tracing::warn!(flocknode = %self.node, error = %e, retry_in = ?delay, "cannot write this node's FlockNode");
                    }
                }
                continue;
            }
            let sleep = async {
                match due {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = sleep => {}
                r = sync.changed() => if r.is_err() { return },
                _ = tick.tick() => {}
                r = stop.changed() => if r.is_err() { return },
            }
        }
    }

    /// Makes the server's status `want`: `Ok(true)` when it wrote it, `Ok(false)` when the
    /// server already had it. The error says whether a status write was sent.
    async fn write(&mut self, want: &FlockNodeStatus) -> Result<bool, (NodeStatusError, bool)> {
        let api: Api<FlockNode> = Api::all(self.client.clone());
        let name = self.node.clone();
        if !self.exists {
            match api.get_opt(&name).await {
                Ok(Some(found)) => {
                    let uid = self.node_uid().await.map_err(|e| (e, false))?;
                    self.adopt(&api, &found, &uid).await.map_err(|e| (e, false))?;
                    self.exists = true;
                    self.written = found.status;
                    if self.written.as_ref() == Some(want) {
                        tracing::debug!(flocknode = %name, "this node's FlockNode is up to date");
                        return Ok(false);
                    }
                }
                Ok(None) => self.create(&api).await.map_err(|e| (e, false))?,
                Err(source) => return Err((NodeStatusError::Read { name, source }, false)),
            }
        }
        let body = merge_patch(want).map_err(|source| (NodeStatusError::Encode { name: name.clone(), source }, false))?;
        let pp = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..PatchParams::default() };
        match api.patch_status(&name, &pp, &Patch::Merge(&body)).await {
            Ok(_) => {
                self.written = Some(want.clone());
                self.metrics.node_status_write(true);
                tracing::debug!(flocknode = %name, api = %want.api, run_policies = want.run_policies.len(), "this node's FlockNode written");
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                self.exists = false;
                self.written = None;
                Err((NodeStatusError::Gone { name }, true))
            }
            Err(source) => Err((NodeStatusError::Patch { name, source }, true)),
        }
    }

    /// The uid of this node's Node.
    async fn node_uid(&self) -> Result<String, NodeStatusError> {
        let name = self.node.clone();
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = match nodes.get_opt(&name).await {
            Ok(Some(n)) => n,
            Ok(None) => return Err(NodeStatusError::NoNode { name }),
            Err(source) => return Err(NodeStatusError::ReadNode { name, source }),
        };
        node.metadata.uid.ok_or(NodeStatusError::NoNode { name })
    }

    /// Makes the Node (uid `uid`) an owner of `found` when it is not: without that reference
    /// the FlockNode would outlive its node.
    async fn adopt(&self, api: &Api<FlockNode>, found: &FlockNode, uid: &str) -> Result<(), NodeStatusError> {
        let name = self.node.clone();
        let current = found.metadata.owner_references.as_deref().unwrap_or_default();
        let Some(owners) = fixed_owners(current, &name, uid) else { return Ok(()) };
        // Conditional on what was read: a list in a merge patch replaces the whole list, so
        // an owner added meanwhile would be lost (a conflict is retried after a new read).
        let mut metadata = json!({ "ownerReferences": owners });
        if let (Some(rv), Value::Object(map)) = (&found.metadata.resource_version, &mut metadata) {
            map.insert("resourceVersion".into(), json!(rv));
        }
        let pp = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..PatchParams::default() };
        match api.patch(&name, &pp, &Patch::Merge(json!({ "metadata": metadata }))).await {
            Ok(_) => {
                tracing::info!(flocknode = %name, node_uid = %uid, "this node's FlockNode is now owned by its Node");
                Ok(())
            }
            Err(source) => Err(NodeStatusError::Adopt { name, source }),
        }
    }

    /// Creates the FlockNode, owned by the Node.
    async fn create(&mut self, api: &Api<FlockNode>) -> Result<(), NodeStatusError> {
        let name = self.node.clone();
        let uid = self.node_uid().await?;
        let object = FlockNode {
            metadata: ObjectMeta { name: Some(name.clone()), owner_references: Some(vec![owner(&name, &uid)]), ..ObjectMeta::default() },
            spec: FlockNodeSpec {},
            status: None,
        };
        let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
        match api.create(&pp, &object).await {
            Ok(_) => tracing::info!(flocknode = %name, node_uid = %uid, "created this node's FlockNode"),
            // Someone made it since the read: owned by the Node too, then its status.
            Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(&name).await {
                Ok(Some(found)) => self.adopt(api, &found, &uid).await?,
                Ok(None) => return Err(NodeStatusError::Gone { name }),
                Err(source) => return Err(NodeStatusError::Read { name, source }),
            },
            Err(source) => return Err(NodeStatusError::Create { name, source }),
        }
        self.exists = true;
        self.written = None;
        Ok(())
    }
}

/// The ownerReference to the Node `name` (not a controller, not blocking the Node's deletion:
/// that would need the right to update Nodes' finalizers).
pub(crate) fn owner(name: &str, uid: &str) -> OwnerReference {
    OwnerReference { api_version: "v1".into(), kind: "Node".into(), name: name.into(), uid: uid.into(), ..OwnerReference::default() }
}

/// The ownerReferences a FlockNode with `current` needs to be owned by the Node `name` with
/// uid `uid`; `None` when it is, and by no other Node. Owners that are not Nodes stay; a
/// Node reference with another uid (a Node deleted and created again under the name) or name
/// goes.
pub(crate) fn fixed_owners(current: &[OwnerReference], name: &str, uid: &str) -> Option<Vec<OwnerReference>> {
    let is_node = |o: &OwnerReference| o.api_version == "v1" && o.kind == "Node";
    let mut nodes = current.iter().filter(|o| is_node(o));
    if nodes.next().is_some_and(|o| o.name == name && o.uid == uid) && nodes.next().is_none() {
        return None;
    }
    let mut out: Vec<OwnerReference> = current.iter().filter(|o| !is_node(o)).cloned().collect();
    out.push(owner(name, uid));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::RulesetDigest;
    use crate::render::Stats;

    fn committed() -> SyncStatus {
        let mut s = SyncStatus { ready: true, committed: 4, last_applied: 4, ..SyncStatus::default() };
        s.ruleset_digest = Some(RulesetDigest {
            generation: 4,
            sha256: "ab".repeat(32),
            stats: Stats { chains: 3, rules: 12, sets: 2, elements: 7 },
            endpoints: 2,
        });
        s.run_policies = Arc::new([(Arc::from("b/p"), 2), (Arc::from("a/q"), 0)].into());
        s
    }

    #[test]
    fn written_at_most_every_10_seconds_by_default() {
        let d = NodeStatusOptions::default();
        assert_eq!((d.interval, d.retry, d.max_retry), (Duration::from_secs(10), Duration::from_secs(5), Duration::from_secs(60)));
    }

    #[test]
    fn nothing_before_the_first_commit() {
        assert_eq!(desired(&SyncStatus::default(), HealthState::Connected, None), None);
        assert!(!digest_pending(&SyncStatus::default()));
    }

    #[test]
    fn the_desired_status_of_a_commit() {
        let d = desired(&committed(), HealthState::Degraded, None).unwrap();
        assert_eq!(d.version, env!("CARGO_PKG_VERSION"));
        assert_eq!(d.api, "Degraded");
        assert_eq!(d.ruleset, Some(NodeRuleset { hash: "ab".repeat(32), rules: 12, set_elements: 7, local_endpoints: 2 }));
        assert_eq!(d.last_error, "");
        // Sorted by name.
        let names: Vec<(&str, i64)> = d.run_policies.iter().map(|p| (p.name.as_str(), p.generation)).collect();
        assert_eq!(names, [("a/q", 0), ("b/p", 2)]);
        assert!(!digest_pending(&committed()));
        // The same inputs, the same status: nothing to write.
        assert_eq!(desired(&committed(), HealthState::Degraded, None), Some(d));
    }

    #[test]
    fn a_failed_sync_shows_its_error_cut_on_a_character_boundary() {
        let mut s = committed();
        s.error = Some(format!("nft refused: {}", "é".repeat(3000)));
        let d = desired(&s, HealthState::Connected, None).unwrap();
        assert!(d.last_error.len() <= MAX_ERROR && d.last_error.len() > MAX_ERROR - 2, "{}", d.last_error.len());
        assert!(d.last_error.starts_with("nft refused: é"));
        // The last committed ruleset stays.
        assert!(d.ruleset.is_some());
    }

    #[test]
    fn a_digest_still_being_computed_is_pending() {
        let mut s = committed();
        s.last_applied = 5;
        assert!(digest_pending(&s));
        s.ruleset_digest = None;
        assert!(digest_pending(&s));
        assert_eq!(desired(&s, HealthState::Connected, None).unwrap().ruleset, None);
    }

    #[test]
    fn the_merge_patch_clears_what_went_away() {
        let d = desired(&committed(), HealthState::Connected, None).unwrap();
        let full = merge_patch(&d).unwrap();
        assert_eq!(full["status"]["ruleset"]["setElements"], 7);
        assert_eq!(full["status"]["runPolicies"][0], json!({"name": "a/q", "generation": 0}));
        assert_eq!(full["status"]["lastError"], Value::Null);
        let bare = FlockNodeStatus { version: "v".into(), api: "Connected".into(), ..FlockNodeStatus::default() };
        let cleared = merge_patch(&bare).unwrap();
        assert_eq!(
            cleared,
            json!({"status": {"version": "v", "api": "Connected", "ruleset": null, "lastError": null, "runPolicies": null}})
        );
    }

    #[test]
    fn the_owner_is_the_node() {
        let o = owner("n1", "u-1");
        assert_eq!((o.api_version.as_str(), o.kind.as_str(), o.name.as_str(), o.uid.as_str()), ("v1", "Node", "n1", "u-1"));
        assert_eq!((o.controller, o.block_owner_deletion), (None, None));
    }

    #[test]
    fn owners_are_fixed_to_the_node_as_it_is() {
        assert_eq!(fixed_owners(&[], "n1", "u-2"), Some(vec![owner("n1", "u-2")]));
        assert_eq!(fixed_owners(&[owner("n1", "u-2")], "n1", "u-2"), None);
        // A stale uid (the Node was created again) or another node's name is replaced.
        assert_eq!(fixed_owners(&[owner("n1", "u-1")], "n1", "u-2"), Some(vec![owner("n1", "u-2")]));
        assert_eq!(fixed_owners(&[owner("n0", "u-2")], "n1", "u-2"), Some(vec![owner("n1", "u-2")]));
        assert_eq!(fixed_owners(&[owner("n1", "u-2"), owner("n1", "u-1")], "n1", "u-2"), Some(vec![owner("n1", "u-2")]));
        // Someone else's owner stays.
        let other = OwnerReference {
            api_version: "example.dev/v1".into(),
            kind: "Fleet".into(),
            name: "f".into(),
            uid: "u-9".into(),
            ..OwnerReference::default()
        };
        assert_eq!(fixed_owners(&[other.clone(), owner("n1", "u-2")], "n1", "u-2"), None);
        assert_eq!(fixed_owners(std::slice::from_ref(&other), "n1", "u-2"), Some(vec![other, owner("n1", "u-2")]));
    }
}
