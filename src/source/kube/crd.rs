//! The ClusterNetworkPolicy watch, which can exist only while its CRD is installed (flock does
//! not own the CRD; the cluster administrator installs network-policy-api's). Discovery
//! (`/apis/policy.networking.k8s.io/v1alpha2`) says whether `clusternetworkpolicies` is
//! served.
//!
//! - Not served: normal. Logged once (info) per absence; the snapshot holds no
//!   ClusterNetworkPolicy (a CRD that was deleted takes its policies with it: the resource is
//!   "relisted" empty); the resource counts as listed, so an absent CRD never holds back
//!   readiness; discovery is asked again after `discovery_interval` plus up to as much
//!   (jittered per node): one small GET per node every 30–60 s by default.
//! - Served: the ordinary reflector lists and watches it, as `DynamicObject` — the raw JSON
//!   goes to `cnp::from_json`, so what flock cannot read stays in the snapshot as `Invalid`
//!   and fails closed, never vanishes. Its initial list must complete before the source is
//!   complete, like every other resource's. When the resource answers 404 (its CRD was
//!   deleted) the reflector ends and discovery is asked again after a backoff (discovery may
//!   lag behind the 404: no hot loop).
//! - A failed discovery request is a watch failure for health, retried with backoff; the
//!   last-known policies stay in force meanwhile.

use std::sync::Arc;
use std::time::Instant;

use kube::api::{ApiResource, DynamicObject};
use kube::{Api, Client};
use tokio::sync::mpsc;

use super::SourceMetrics;
use super::health::{ApiHealth, unit_jitter};
use super::reflect::{self, Backoff, Ended, Kind, Options, Reflector};
use super::{Change, Key, Object, Resource};
use crate::model::cnp;
use crate::model::convert::ConvertError;

const RESOURCE: Resource = Resource::ClusterNetworkPolicies;

/// The raw object to flock's reading of it. Only an object without a name or with a `spec`
/// that is not an object fails (the API server stores neither); its earlier version then
/// stays, since dropping a policy could open what it denies.
pub(super) const CLUSTER_POLICIES: Kind<DynamicObject> = Kind {
    convert: |o| {
        let json = serde_json::to_value(o).map_err(|e| ConvertError::new("", e.to_string()))?;
        cnp::from_json(&json).map(Object::ClusterPolicy)
    },
    key: |o| Key::ClusterPolicy(o.metadata.name.clone().unwrap_or_default()),
    drop_unreadable: false,
    optional: true,
};

pub(super) fn api_resource() -> ApiResource {
    ApiResource {
        group: cnp::GROUP.into(),
        version: cnp::VERSION.into(),
        api_version: cnp::API_VERSION.into(),
        kind: cnp::KIND.into(),
        plural: cnp::PLURAL.into(),
    }
}

/// Whether the API server serves ClusterNetworkPolicies (v1alpha2).
pub(super) async fn served(client: &Client) -> Result<bool, kube::Error> {
    match client.list_api_group_resources(cnp::API_VERSION).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == cnp::PLURAL)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Follows the CRD's presence and watches ClusterNetworkPolicies while it is there, until the
/// snapshot side goes away.
pub(super) async fn run(
    client: Client,
    opts: Options,
    tx: mpsc::Sender<(Resource, Change)>,
    health: Arc<ApiHealth>,
    metrics: Arc<dyn SourceMetrics>,
) {
    let mut backoff = Backoff::new(&opts, RESOURCE);
    let seed = opts.seed ^ super::health::seed_from("discovery");
    // What discovery said last (`None`: nothing yet).
    let mut known: Option<bool> = None;
    let mut checks: u64 = 0;
    loop {
        let found = served(&client).await;
        match found {
            Err(e) => {
                let e = format!("discovery of {}: {}", cnp::API_VERSION, reflect::describe(&e));
                if health.watch_error(RESOURCE, &e) {
                    tracing::warn!(resource = RESOURCE.as_str(), error = %e, "cannot tell whether ClusterNetworkPolicies are served; last-known ones stay in force");
                }
                metrics.watch_error(RESOURCE.as_str());
                tokio::time::sleep(backoff.next_wait()).await;
            }
            Ok(false) => {
                backoff.reset();
                if health.watch_ok(RESOURCE).watch_recovered {
                    metrics.watch_reconnected(RESOURCE.as_str());
                }
                metrics.resource_served(RESOURCE.as_str(), false);
                if known != Some(false) {
                    tracing::info!(
                        resource = RESOURCE.as_str(),
                        api_version = cnp::API_VERSION,
                        recheck = ?opts.discovery_interval,
                        "the ClusterNetworkPolicy CRD is not installed: none to enforce; checking again periodically"
                    );
                    // Level-triggered: whatever the snapshot held of it is gone with it.
                    if tx.send((RESOURCE, Change::Relisted(Vec::new()))).await.is_err() {
                        return;
                    }
                    known = Some(false);
                }
                checks += 1;
                let wait = opts.discovery_interval + opts.discovery_interval.mul_f64(unit_jitter(seed, checks));
                tracing::debug!(resource = RESOURCE.as_str(), ?wait, "not served; asking discovery again later");
                tokio::time::sleep(wait).await;
            }
            Ok(true) => {
                if known != Some(true) {
                    tracing::info!(
                        resource = RESOURCE.as_str(),
                        api_version = cnp::API_VERSION,
                        "the ClusterNetworkPolicy CRD is installed: watching"
                    );
                }
                known = Some(true);
                metrics.resource_served(RESOURCE.as_str(), true);
                let reflector = Reflector {
                    api: Api::<DynamicObject>::all_with(client.clone(), &api_resource()),
                    resource: RESOURCE,
                    kind: CLUSTER_POLICIES,
                    tx: tx.clone(),
                    health: health.clone(),
                    metrics: metrics.clone(),
                    opts: opts.clone(),
                    fields: None,
                };
                let started = Instant::now();
                match reflector.run().await {
                    Ended::Stopped => return,
                    Ended::NotServed => {
                        tracing::info!(resource = RESOURCE.as_str(), "no longer served (404); asking discovery again");
                        if started.elapsed() > opts.backoff_max {
                            backoff.reset();
                        }
                        tokio::time::sleep(backoff.next_wait()).await;
                    }
                }
            }
        }
    }
}
