//! Which resources the server serves, and the discovery documents that list them.
//!
//! A [`ResourceDef`] describes one resource (group, version, kind, plural, scope, whether it
//! has a `/status` subresource, which field selectors it accepts). The [`Registry`] holds the
//! built-in ones (pods, namespaces, nodes, events, networkpolicies, daemonsets,
//! endpointslices, leases, customresourcedefinitions) plus whatever tests or CRD objects
//! register, and renders `/api`, `/api/v1`, `/apis`, `/apis/{group}`,
//! `/apis/{group}/{version}` and the aggregated (`apidiscovery.k8s.io/v2`) variants of `/api`
//! and `/apis`, so `kube::discovery` works unchanged.

use std::{collections::BTreeMap, sync::Arc};

use serde_json::{Value, json};

/// Group, version and plural resource name: the key objects are stored under.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gvr {
    /// API group (`""` for the core group).
    pub group: String,
    /// API version (`v1`, `v1alpha1`, …).
    pub version: String,
    /// Plural resource name (`pods`).
    pub resource: String,
}

/// One served resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceDef {
    /// API group (`""` for the core group).
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind (`Pod`).
    pub kind: String,
    /// Plural resource name (`pods`), used in paths.
    pub plural: String,
    /// Singular name (`pod`), used in discovery.
    pub singular: String,
    /// Namespaced (`true`) or cluster-scoped.
    pub namespaced: bool,
    /// Whether `/status` is a subresource: then writes to the main resource keep `.status`,
    /// writes to `/status` change only `.status`, and API creates drop `.status`.
    pub status_subresource: bool,
    /// Short names listed in discovery.
    pub short_names: Vec<String>,
    /// Field selectors accepted besides `metadata.name` and `metadata.namespace`.
    pub selectable_fields: Vec<String>,
    /// Lists that server-side apply merges by a key field, as `x-kubernetes-list-type: map`
    /// with one `x-kubernetes-list-map-keys` entry: (path of the list, key field), e.g.
    /// (`["status", "conditions"]`, `"type"`). Read from a CRD's schema.
    pub list_maps: Vec<(Vec<String>, String)>,
}

impl ResourceDef {
    /// A resource with a `/status` subresource and no extra field selectors.
    pub fn new(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            singular: kind.to_ascii_lowercase(),
            namespaced,
            status_subresource: true,
            short_names: Vec::new(),
            selectable_fields: Vec::new(),
            list_maps: Vec::new(),
        }
    }

    fn without_status(mut self) -> Self {
        self.status_subresource = false;
        self
    }

    fn short(mut self, names: &[&str]) -> Self {
        self.short_names = names.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    fn fields(mut self, fields: &[&str]) -> Self {
        self.selectable_fields = fields.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    /// The storage key of this resource.
    pub fn gvr(&self) -> Gvr {
        Gvr { group: self.group.clone(), version: self.version.clone(), resource: self.plural.clone() }
    }

    /// `pods` or `daemonsets.apps`, as used in messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() { self.plural.clone() } else { format!("{}.{}", self.plural, self.group) }
    }

    /// Whether `fieldSelector` may name this field.
    pub fn field_selectable(&self, field: &str) -> bool {
        matches!(field, "metadata.name" | "metadata.namespace") || self.selectable_fields.iter().any(|f| f == field)
    }
}

const VERBS: [&str; 8] = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];
const STATUS_VERBS: [&str; 3] = ["get", "patch", "update"];

/// The served resources, in registration order per group.
#[derive(Debug, Clone, Default)]
pub(crate) struct Registry {
    defs: BTreeMap<Gvr, (u64, Arc<ResourceDef>)>,
    next_order: u64,
}

impl Registry {
    /// The built-in resources of a Kubernetes 1.33 server that flock uses.
    pub fn builtin() -> Self {
        let mut registry = Self::default();
        let defs = [
            ResourceDef::new("", "v1", "Namespace", "namespaces", false).short(&["ns"]).fields(&["status.phase"]),
            ResourceDef::new("", "v1", "Node", "nodes", false).short(&["no"]).fields(&["spec.unschedulable"]),
            ResourceDef::new("", "v1", "Pod", "pods", true).short(&["po"]).fields(&[
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ]),
            ResourceDef::new("", "v1", "Event", "events", true).without_status().short(&["ev"]).fields(&[
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ]),
            ResourceDef::new("events.k8s.io", "v1", "Event", "events", true).without_status().short(&["ev"]),
            ResourceDef::new("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", true).without_status().short(&["netpol"]),
            ResourceDef::new("apps", "v1", "DaemonSet", "daemonsets", true).short(&["ds"]),
            ResourceDef::new("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", true).without_status(),
            ResourceDef::new("coordination.k8s.io", "v1", "Lease", "leases", true).without_status(),
            ResourceDef::new("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", false)
                .short(&["crd", "crds"]),
        ];
        for def in defs {
            registry.register(def);
        }
        registry
    }

    /// Adds or replaces a resource.
    pub fn register(&mut self, def: ResourceDef) -> Arc<ResourceDef> {
        let gvr = def.gvr();
        let def = Arc::new(def);
        let order = match self.defs.get(&gvr) {
            Some((order, _)) => *order,
            None => {
                self.next_order += 1;
                self.next_order
            }
        };
        self.defs.insert(gvr, (order, def.clone()));
        def
    }

    /// Stops serving a resource.
    pub fn unregister(&mut self, gvr: &Gvr) {
        self.defs.remove(gvr);
    }

    /// The resource served at `group/version/plural`.
    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceDef>> {
        let gvr = Gvr { group: group.into(), version: version.into(), resource: plural.into() };
        self.defs.get(&gvr).map(|(_, def)| def.clone())
    }

    /// The resource of an object's `apiVersion` and `kind`.
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceDef>> {
        let (group, version) = split_api_version(api_version);
        self.defs.values().map(|(_, def)| def).find(|d| d.group == group && d.version == version && d.kind == kind).cloned()
    }

    fn in_order(&self) -> Vec<&ResourceDef> {
        let mut defs: Vec<_> = self.defs.values().collect();
        defs.sort_by_key(|(order, _)| *order);
        defs.into_iter().map(|(_, def)| def.as_ref()).collect()
    }

    /// Groups (not the core group) with their versions, in registration order.
    fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for def in self.in_order() {
            if def.group.is_empty() {
                continue;
            }
            match groups.iter_mut().find(|(g, _)| *g == def.group) {
                Some((_, versions)) => {
                    if !versions.contains(&def.version) {
                        versions.push(def.version.clone());
                    }
                }
                None => groups.push((def.group.clone(), vec![def.version.clone()])),
            }
        }
        groups.sort_by(|a, b| a.0.cmp(&b.0));
        groups
    }

    fn resources_of(&self, group: &str, version: &str) -> Vec<&ResourceDef> {
        self.in_order().into_iter().filter(|d| d.group == group && d.version == version).collect()
    }

    /// `GET /api`: `APIVersions`.
    pub fn api_versions(&self) -> Value {
        json!({
            "kind": "APIVersions",
            "apiVersion": "v1",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "unix"}],
        })
    }

    /// `GET /apis`: `APIGroupList`.
    pub fn group_list(&self) -> Value {
        let groups: Vec<Value> = self.groups().iter().map(|(g, versions)| group_doc(g, versions)).collect();
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
    }

    /// `GET /apis/{group}`: `APIGroup`, or `None` when nothing of the group is served.
    pub fn group(&self, group: &str) -> Option<Value> {
        let groups = self.groups();
        let (name, versions) = groups.iter().find(|(g, _)| g == group)?;
        let mut doc = group_doc(name, versions);
        if let Some(map) = doc.as_object_mut() {
            map.insert("kind".into(), "APIGroup".into());
            map.insert("apiVersion".into(), "v1".into());
        }
        Some(doc)
    }

    /// `GET /api/v1` or `/apis/{group}/{version}`: `APIResourceList`, or `None`.
    pub fn resource_list(&self, group: &str, version: &str) -> Option<Value> {
        let defs = self.resources_of(group, version);
        if defs.is_empty() {
            return None;
        }
        let mut resources = Vec::new();
        for def in defs {
            resources.push(json!({
                "name": def.plural,
                "singularName": def.singular,
                "namespaced": def.namespaced,
                "kind": def.kind,
                "verbs": VERBS,
                "shortNames": def.short_names,
            }));
            if def.status_subresource {
                resources.push(json!({
                    "name": format!("{}/status", def.plural),
                    "singularName": "",
                    "namespaced": def.namespaced,
                    "kind": def.kind,
                    "verbs": STATUS_VERBS,
                }));
            }
        }
        let group_version = if group.is_empty() { version.to_owned() } else { format!("{group}/{version}") };
        Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}))
    }

    /// Aggregated discovery (`apidiscovery.k8s.io/v2` `APIGroupDiscoveryList`) of the core
    /// group (`core = true`, for `/api`) or of every other group (`/apis`).
    pub fn aggregated(&self, core: bool) -> Value {
        let groups = if core { vec![(String::new(), vec!["v1".to_owned()])] } else { self.groups() };
        let items: Vec<Value> = groups
            .iter()
            .map(|(group, versions)| {
                let versions: Vec<Value> = versions
                    .iter()
                    .map(|version| {
                        let resources: Vec<Value> = self.resources_of(group, version).into_iter().map(aggregated_resource).collect();
                        json!({"version": version, "resources": resources, "freshness": "Current"})
                    })
                    .collect();
                json!({"metadata": {"name": group}, "versions": versions})
            })
            .collect();
        json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
    }
}

fn aggregated_resource(def: &ResourceDef) -> Value {
    let response_kind = json!({"group": def.group, "version": def.version, "kind": def.kind});
    let subresources: Vec<Value> = if def.status_subresource {
        vec![json!({"subresource": "status", "responseKind": response_kind, "verbs": STATUS_VERBS})]
    } else {
        Vec::new()
    };
    json!({
        "resource": def.plural,
        "responseKind": response_kind,
        "scope": if def.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": def.singular,
        "verbs": VERBS,
        "shortNames": def.short_names,
        "subresources": subresources,
    })
}

fn group_doc(group: &str, versions: &[String]) -> Value {
    let versions: Vec<Value> = versions.iter().map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v})).collect();
    let preferred = versions.first().cloned().unwrap_or(Value::Null);
    json!({"name": group, "versions": versions, "preferredVersion": preferred})
}

/// `apps/v1` → (`apps`, `v1`); `v1` → (`""`, `v1`).
pub(crate) fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    }
}

/// The resources a `CustomResourceDefinition` object defines (one per served version).
pub(crate) fn defs_from_crd(crd: &Value) -> Vec<ResourceDef> {
    let spec = &crd["spec"];
    let (Some(group), Some(kind), Some(plural)) =
        (spec["group"].as_str(), spec["names"]["kind"].as_str(), spec["names"]["plural"].as_str())
    else {
        return Vec::new();
    };
    let namespaced = spec["scope"].as_str() != Some("Cluster");
    let mut defs = Vec::new();
    for version in spec["versions"].as_array().into_iter().flatten() {
        let Some(name) = version["name"].as_str() else { continue };
        if version["served"].as_bool() == Some(false) {
            continue;
        }
        let mut def = ResourceDef::new(group, name, kind, plural, namespaced);
        def.status_subresource = version["subresources"].get("status").is_some();
        if let Some(singular) = spec["names"]["singular"].as_str() {
            def.singular = singular.to_owned();
        }
        def.short_names =
            spec["names"]["shortNames"].as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_owned)).collect();
        list_maps(&version["schema"]["openAPIV3Schema"], &mut Vec::new(), &mut def.list_maps);
        defs.push(def);
    }
    defs
}

/// The list-maps of a structural schema (not inside other lists): lists with
/// `x-kubernetes-list-type: map` and exactly one `x-kubernetes-list-map-keys` entry.
fn list_maps(schema: &Value, path: &mut Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
    if schema["x-kubernetes-list-type"] == "map"
        && let Some([key]) = schema["x-kubernetes-list-map-keys"].as_array().map(Vec::as_slice)
        && let Some(key) = key.as_str()
    {
        out.push((path.clone(), key.to_owned()));
    }
    for (name, property) in schema["properties"].as_object().into_iter().flatten() {
        path.push(name.clone());
        list_maps(property, path, out);
        path.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_and_discovery() {
        let registry = Registry::builtin();
        assert!(registry.get("", "v1", "pods").is_some_and(|d| d.namespaced));
        assert!(registry.get("", "v1", "nodes").is_some_and(|d| !d.namespaced));
        assert!(registry.by_kind("events.k8s.io/v1", "Event").is_some());
        assert!(registry.by_kind("v1", "Event").is_some());
        let groups = registry.group_list();
        let names: Vec<&str> = groups["groups"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap()).collect();
        assert!(names.contains(&"apps") && names.contains(&"networking.k8s.io"));
        let core = registry.resource_list("", "v1").unwrap();
        assert!(core["resources"].as_array().unwrap().iter().any(|r| r["name"] == "pods/status"));
        assert!(registry.resource_list("cilium.io", "v2").is_none());
    }

    #[test]
    fn crd_objects_define_resources() {
        let crd = json!({"spec": {
            "group": "flock.dev", "scope": "Namespaced",
            "names": {"kind": "Run", "plural": "runs", "singular": "run"},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true, "subresources": {"status": {}}}]
        }});
        let defs = defs_from_crd(&crd);
        assert_eq!(defs.len(), 1);
        assert_eq!(defs[0].api_version(), "flock.dev/v1alpha1");
        assert!(defs[0].status_subresource && defs[0].namespaced);
        assert!(defs[0].list_maps.is_empty());
        let crd = json!({"spec": {
            "group": "policy.networking.k8s.io", "scope": "Cluster",
            "names": {"kind": "ClusterNetworkPolicy", "plural": "clusternetworkpolicies"},
            "versions": [{"name": "v1alpha2", "served": true, "subresources": {"status": {}}, "schema": {"openAPIV3Schema": {
                "properties": {"status": {"properties": {"conditions": {
                    "type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}}}}}}}]
        }});
        assert_eq!(defs_from_crd(&crd)[0].list_maps, [(vec!["status".to_owned(), "conditions".to_owned()], "type".to_owned())]);
    }
}
