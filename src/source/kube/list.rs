//! One list of every resource the agent reads, into a snapshot: flockctl's live mode. The
//! same conversion as the informers (`Kind`), page by page (each page converted and its API
//! objects dropped, so memory stays the snapshot's), an absent ClusterNetworkPolicy CRD an
//! empty list. An object flock cannot read is left out and named (a pod then is no peer:
//! fail closed, as in the agent).

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1 as net;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client};
use serde::de::DeserializeOwned;

use super::reflect::Kind;
use super::{NAMESPACES, NODES, Object, PODS, POLICIES, Resource, crd, upsert};
use crate::model::Snapshot;

/// Objects per list page (the agent's default).
const PAGE: u32 = 500;
/// Lists restarted from the first page when a continue token expires (410) midway.
const RESTARTS: usize = 3;

/// The cluster as one list of each resource saw it.
#[derive(Debug)]
pub struct Listed {
    pub snapshot: Snapshot,
    /// Objects left out because flock cannot read them, each named with why.
    pub unreadable: Vec<String>,
    /// Whether the API server serves ClusterNetworkPolicies.
    pub cluster_policies_served: bool,
}

/// Why the cluster could not be listed; names the resource.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error(
        "cannot list {resource} in all namespaces: the API server refused (RBAC: the user needs the `list` verb on {resource}, cluster-wide): {message}"
    )]
    Forbidden { resource: &'static str, message: String },
    #[error("cannot list {resource}: {source}")]
    Api {
        resource: &'static str,
        #[source]
        source: kube::Error,
    },
}

impl ListError {
    fn new(resource: Resource, e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) if s.code == 403 || s.code == 401 => Self::Forbidden { resource: resource.as_str(), message: s.message },
            source => Self::Api { resource: resource.as_str(), source },
        }
    }
}

/// Lists Pods, Namespaces, NetworkPolicies, Nodes and (when served) ClusterNetworkPolicies.
pub async fn list_cluster(client: &Client) -> Result<Listed, ListError> {
    let mut snapshot = Snapshot::default();
    let mut unreadable = Vec::new();
    for o in list_all(Api::<core::Namespace>::all(client.clone()), &NAMESPACES, Resource::Namespaces, &mut unreadable).await? {
        upsert(&mut snapshot, o);
    }
    for o in list_all(Api::<core::Node>::all(client.clone()), &NODES, Resource::Nodes, &mut unreadable).await? {
        upsert(&mut snapshot, o);
    }
    for o in list_all(Api::<net::NetworkPolicy>::all(client.clone()), &POLICIES, Resource::NetworkPolicies, &mut unreadable).await? {
        upsert(&mut snapshot, o);
    }
    for o in list_all(Api::<core::Pod>::all(client.clone()), &PODS, Resource::Pods, &mut unreadable).await? {
        upsert(&mut snapshot, o);
    }
    let served = crd::served(client).await.map_err(|e| ListError::new(Resource::ClusterNetworkPolicies, e))?;
    if served {
        let api = Api::<DynamicObject>::all_with(client.clone(), &crd::api_resource());
        for o in list_all(api, &crd::CLUSTER_POLICIES, Resource::ClusterNetworkPolicies, &mut unreadable).await? {
            upsert(&mut snapshot, o);
        }
    }
    Ok(Listed { snapshot, unreadable, cluster_policies_served: served })
}

/// Every object of one resource, converted, following continue tokens.
async fn list_all<K>(api: Api<K>, kind: &Kind<K>, resource: Resource, unreadable: &mut Vec<String>) -> Result<Vec<Object>, ListError>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut restarts = 0;
    'list: loop {
        let (mut objects, mut skipped) = (Vec::new(), Vec::new());
        let mut token: Option<String> = None;
        loop {
            let mut params = ListParams::default().limit(PAGE);
            if let Some(t) = &token {
                params = params.continue_token(t);
            }
            let page = match api.list(&params).await {
                Ok(page) => page,
                Err(kube::Error::Api(s)) if s.code == 410 && token.is_some() && restarts < RESTARTS => {
                    restarts += 1;
                    continue 'list;
                }
                Err(e) => return Err(ListError::new(resource, e)),
            };
            for item in &page.items {
                match (kind.convert)(item) {
                    Ok(o) => objects.push(o),
                    Err(e) => skipped.push(format!("{} {:?}: {e}", resource.as_str(), (kind.key)(item))),
                }
            }
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                unreadable.append(&mut skipped);
                return Ok(objects);
            }
        }
    }
}
