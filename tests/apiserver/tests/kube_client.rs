//! The real kube client against the test API server: CRUD, patches, server-side apply,
//! `/status`, selectors, pagination, discovery and request-level faults.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use flock_test_apiserver::{ApiServer, FailRule};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams},
    discovery::{self, Discovery},
};
use serde_json::{Value, json};

fn pod(ns: &str, name: &str, node: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap()
}

fn api_code(err: &kube::Error) -> Option<(u16, String)> {
    match err {
        kube::Error::Api(status) => Some((status.code, status.reason.clone())),
        _ => None,
    }
}

#[tokio::test]
async fn crud_with_the_real_client() {
    let server = ApiServer::start_temp().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");

    let created = pods.create(&PostParams::default(), &pod("shop", "web", "node-1", json!({"app": "web"}))).await.unwrap();
    assert!(created.uid().is_some());
    assert!(created.creation_timestamp().is_some());
    assert_eq!(created.metadata.generation, Some(1));
    let rv: u64 = created.resource_version().unwrap().parse().unwrap();
    assert_eq!(rv, server.resource_version());
    // API creates drop the status (it has a subresource); pods start Pending.
    assert_eq!(created.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Pending"));

    let again = pods.create(&PostParams::default(), &pod("shop", "web", "node-1", json!({}))).await.unwrap_err();
    assert_eq!(api_code(&again), Some((409, "AlreadyExists".into())));

    let got = pods.get("web").await.unwrap();
    assert_eq!(got, created);
    let missing = pods.get("nope").await.unwrap_err();
    assert_eq!(api_code(&missing), Some((404, "NotFound".into())));
    assert_eq!(pods.get_opt("nope").await.unwrap(), None);

    let mut changed = got.clone();
    changed.labels_mut().insert("tier".into(), "front".into());
    let replaced = pods.replace("web", &PostParams::default(), &changed).await.unwrap();
    assert_eq!(replaced.labels().get("tier").map(String::as_str), Some("front"));
    assert_ne!(replaced.resource_version(), got.resource_version());
    assert_eq!(replaced.metadata.generation, Some(1), "metadata changes keep the generation");
    // `changed` still carries the old resourceVersion.
    let stale = pods.replace("web", &PostParams::default(), &changed).await.unwrap_err();
    assert_eq!(api_code(&stale), Some((409, "Conflict".into())));

    let mut spec_change = replaced.clone();
    spec_change.spec.as_mut().unwrap().node_name = Some("node-2".into());
    let bumped = pods.replace("web", &PostParams::default(), &spec_change).await.unwrap();
    assert_eq!(bumped.metadata.generation, Some(2));

    assert_eq!(pods.list(&ListParams::default()).await.unwrap().items.len(), 1);
    let all: Api<Pod> = Api::all(server.client());
    assert_eq!(all.list(&ListParams::default()).await.unwrap().items.len(), 1);

    let deleted = pods.delete("web", &DeleteParams::default()).await.unwrap();
    let deleted = deleted.left().expect("the deleted object");
    assert_eq!(deleted.name_any(), "web");
    let gone = pods.delete("web", &DeleteParams::default()).await.unwrap_err();
    assert_eq!(api_code(&gone), Some((404, "NotFound".into())));
    assert!(server.get("v1", "Pod", Some("shop"), "web").unwrap().is_none());

    // Cluster-scoped kinds.
    let nodes: Api<Node> = Api::all(server.client());
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-1"}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    assert_eq!(nodes.get("node-1").await.unwrap().name_any(), "node-1");
    let namespaces: Api<Namespace> = Api::all(server.client());
    let ns =
        namespaces.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "shop"}})).unwrap()).await.unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Active"));

    let version = server.client().apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
    server.shutdown().await;
}

#[tokio::test]
async fn explicit_socket_path_and_shutdown() {
    let dir = std::env::temp_dir().join(format!("flock-test-apiserver-explicit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("api.sock");
    let server = ApiServer::start(&socket).await.unwrap();
    assert_eq!(server.socket_path(), socket);
    let namespaces: Api<Namespace> = Api::all(server.client());
    assert!(namespaces.list(&ListParams::default()).await.unwrap().items.is_empty());
    // A second server cannot take the same socket.
    assert!(ApiServer::start(&socket).await.is_err());
    server.shutdown().await;
    assert!(!socket.exists());
    assert!(namespaces.list(&ListParams::default()).await.is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn merge_strategic_and_json_patches() {
    let server = ApiServer::start_temp().await.unwrap();
    let client = server.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    pods.create(&PostParams::default(), &pod("shop", "web", "node-1", json!({"app": "web", "old": "x"}))).await.unwrap();

    let merge = json!({"metadata": {"labels": {"old": null, "new": "y"}}});
    let patched = pods.patch("web", &PatchParams::default(), &Patch::Merge(&merge)).await.unwrap();
    assert_eq!(patched.labels().get("new").map(String::as_str), Some("y"));
    assert!(!patched.labels().contains_key("old"));

    let strategic = json!({"metadata": {"annotations": {"a": "1"}}});
    let patched = pods.patch("web", &PatchParams::default(), &Patch::Strategic(&strategic)).await.unwrap();
    assert_eq!(patched.annotations().get("a").map(String::as_str), Some("1"));

    // A merge patch carrying a stale resourceVersion is a precondition: 409.
    let stale = json!({"metadata": {"resourceVersion": "1", "labels": {"z": "z"}}});
    let err = pods.patch("web", &PatchParams::default(), &Patch::Merge(&stale)).await.unwrap_err();
    assert_eq!(api_code(&err), Some((409, "Conflict".into())));

    // JSON patch (kube's Patch::Json needs the `jsonpatch` feature; send it by hand through
    // the same client stack).
    let ops = json!([
        {"op": "add", "path": "/metadata/labels/added", "value": "1"},
        {"op": "replace", "path": "/spec/nodeName", "value": "node-9"},
        {"op": "remove", "path": "/metadata/labels/new"},
    ]);
    let req = http::Request::patch("/api/v1/namespaces/shop/pods/web")
        .header(http::header::CONTENT_TYPE, "application/json-patch+json")
        .body(serde_json::to_vec(&ops).unwrap())
        .unwrap();
    let patched: Pod = client.request(req).await.unwrap();
    assert_eq!(patched.labels().get("added").map(String::as_str), Some("1"));
    assert!(!patched.labels().contains_key("new"));
    assert_eq!(patched.spec.unwrap().node_name.as_deref(), Some("node-9"));
    assert_eq!(patched.metadata.generation, Some(2));

    let bad = http::Request::patch("/api/v1/namespaces/shop/pods/web")
        .header(http::header::CONTENT_TYPE, "application/json-patch+json")
        .body(br#"[{"op": "remove", "path": "/nope"}]"#.to_vec())
        .unwrap();
    let err = client.request::<Pod>(bad).await.unwrap_err();
    assert_eq!(api_code(&err).map(|c| c.0), Some(422));
    let unsupported = http::Request::patch("/api/v1/namespaces/shop/pods/web")
        .header(http::header::CONTENT_TYPE, "text/plain")
        .body(b"x".to_vec())
        .unwrap();
    assert_eq!(api_code(&client.request::<Pod>(unsupported).await.unwrap_err()).map(|c| c.0), Some(415));
    let missing = pods.patch("nope", &PatchParams::default(), &Patch::Merge(&merge)).await.unwrap_err();
    assert_eq!(api_code(&missing).map(|c| c.0), Some(404));
}

#[tokio::test]
async fn server_side_apply_with_field_managers() {
    let server = ApiServer::start_temp().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let applied = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "labels": {"a": "1", "b": "2"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    });
    // Create through apply.
    let created = pods.patch("web", &PatchParams::apply("flock-agent"), &Patch::Apply(&applied)).await.unwrap();
    assert_eq!(created.labels().len(), 2);
    let managed = created.metadata.managed_fields.clone().unwrap();
    assert_eq!(managed.len(), 1);
    assert_eq!(managed[0].manager.as_deref(), Some("flock-agent"));
    assert_eq!(managed[0].operation.as_deref(), Some("Apply"));

    // Another manager setting a field flock-agent owns to another value conflicts...
    let other = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "labels": {"a": "other"}}});
    let err = pods.patch("web", &PatchParams::apply("someone-else"), &Patch::Apply(&other)).await.unwrap_err();
    assert_eq!(api_code(&err), Some((409, "Conflict".into())));
    // ... unless forced, which moves ownership.
    let forced = pods.patch("web", &PatchParams::apply("someone-else").force(), &Patch::Apply(&other)).await.unwrap();
    assert_eq!(forced.labels().get("a").map(String::as_str), Some("other"));
    assert_eq!(forced.metadata.managed_fields.as_ref().unwrap().len(), 2);

    // A field a manager stops applying is removed (b), one it lost is kept (a).
    let fewer = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    let after = pods.patch("web", &PatchParams::apply("flock-agent"), &Patch::Apply(&fewer)).await.unwrap();
    assert!(!after.labels().contains_key("b"));
    assert_eq!(after.labels().get("a").map(String::as_str), Some("other"));

    // Applying the same configuration again is a no-op: same resourceVersion.
    let rv = server.resource_version();
    pods.patch("web", &PatchParams::apply("flock-agent"), &Patch::Apply(&fewer)).await.unwrap();
    assert_eq!(server.resource_version(), rv, "a no-op apply writes nothing");

    // Apply requires a field manager.
    let req = http::Request::patch("/api/v1/namespaces/shop/pods/web")
        .header(http::header::CONTENT_TYPE, "application/apply-patch+yaml")
        .body(serde_json::to_vec(&fewer).unwrap())
        .unwrap();
    let err = server.client().request::<Pod>(req).await.unwrap_err();
    assert_eq!(api_code(&err).map(|c| c.0), Some(400));
    // YAML bodies work too.
    let yaml = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: yaml\nspec:\n  containers: []\n";
    let req = http::Request::patch("/api/v1/namespaces/shop/pods/yaml?fieldManager=kubectl")
        .header(http::header::CONTENT_TYPE, "application/apply-patch+yaml")
        .body(yaml.as_bytes().to_vec())
        .unwrap();
    assert_eq!(server.client().request::<Pod>(req).await.unwrap().name_any(), "yaml");
}

#[tokio::test]
async fn status_subresource() {
    let server = ApiServer::start_temp().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let created = pods.create(&PostParams::default(), &pod("shop", "web", "node-1", json!({}))).await.unwrap();

    let status = json!({"status": {"phase": "Running", "podIP": "198.18.0.10"}, "spec": {"nodeName": "ignored"}});
    let patched = pods.patch_status("web", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    assert_eq!(patched.status.as_ref().unwrap().pod_ip.as_deref(), Some("198.18.0.10"));
    assert_eq!(patched.spec.as_ref().unwrap().node_name.as_deref(), Some("node-1"), "status writes change only .status");
    assert_eq!(patched.metadata.generation, created.metadata.generation);

    // Writes to the main resource keep .status.
    let mut replacement = patched.clone();
    replacement.status.as_mut().unwrap().phase = Some("Failed".into());
    replacement.labels_mut().insert("x".into(), "y".into());
    let replaced = pods.replace("web", &PostParams::default(), &replacement).await.unwrap();
    assert_eq!(replaced.status.as_ref().unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(replaced.labels().get("x").map(String::as_str), Some("y"));

    // Status apply by a manager.
    let applied = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"}, "status": {"phase": "Succeeded"}});
    let applied = pods.patch_status("web", &PatchParams::apply("kubelet"), &Patch::Apply(&applied)).await.unwrap();
    assert_eq!(applied.status.unwrap().phase.as_deref(), Some("Succeeded"));
    let managed = applied.metadata.managed_fields.unwrap();
    assert!(managed.iter().any(|m| m.manager.as_deref() == Some("kubelet") && m.subresource.as_deref() == Some("status")));

    let got = pods.get_status("web").await.unwrap();
    assert_eq!(got.status.unwrap().phase.as_deref(), Some("Succeeded"));
    let err = pods.patch_status("nope", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap_err();
    assert_eq!(api_code(&err).map(|c| c.0), Some(404));
}

#[tokio::test]
async fn finalizers_dry_run_and_delete_collection() {
    let server = ApiServer::start_temp().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let mut guarded = pod("shop", "guarded", "node-1", json!({"app": "x"}));
    guarded.metadata.finalizers = Some(vec!["flock.dev/cleanup".into()]);
    pods.create(&PostParams::default(), &guarded).await.unwrap();

    let deleting = pods.delete("guarded", &DeleteParams::default()).await.unwrap().left().unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert!(pods.get("guarded").await.is_ok(), "kept while finalizers remain");
    let clear = json!({"metadata": {"finalizers": null}});
    pods.patch("guarded", &PatchParams::default(), &Patch::Merge(&clear)).await.unwrap();
    assert!(pods.get_opt("guarded").await.unwrap().is_none());

    let rv = server.resource_version();
    let dry = PostParams { dry_run: true, ..Default::default() };
    pods.create(&dry, &pod("shop", "dry", "node-1", json!({}))).await.unwrap();
    assert!(pods.get_opt("dry").await.unwrap().is_none());
    assert_eq!(server.resource_version(), rv);

    for i in 0..4 {
        let app = if i % 2 == 0 { "even" } else { "odd" };
        pods.create(&PostParams::default(), &pod("shop", &format!("p{i}"), "node-1", json!({"app": app}))).await.unwrap();
    }
    let deleted = pods.delete_collection(&DeleteParams::default(), &ListParams::default().labels("app=even")).await.unwrap();
    assert_eq!(deleted.left().unwrap().items.len(), 2);
    assert_eq!(pods.list(&ListParams::default()).await.unwrap().items.len(), 2);

    // Preconditions.
    let pre = DeleteParams {
        preconditions: Some(kube::api::Preconditions { uid: Some("wrong".into()), resource_version: None }),
        ..Default::default()
    };
    let err = pods.delete("p1", &pre).await.unwrap_err();
    assert_eq!(api_code(&err).map(|c| c.0), Some(409));
}

#[tokio::test]
async fn selectors_and_pagination() {
    let server = ApiServer::start_temp().await.unwrap();
    for i in 0..25 {
        let ns = if i < 15 { "a" } else { "b" };
        let tier = ["front", "back", "db"][i % 3];
        server
            .apply_resource(&pod(ns, &format!("p{i:02}"), &format!("node-{}", i % 2), json!({"tier": tier, "idx": i.to_string()})))
            .unwrap();
    }
    let all: Api<Pod> = Api::all(server.client());
    let names = |list: kube::api::ObjectList<Pod>| list.items.iter().map(ResourceExt::name_any).collect::<Vec<_>>();

    let mut lp = ListParams::default().limit(10);
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = all.list(&lp).await.unwrap();
        pages += 1;
        assert!(page.items.len() <= 10);
        seen.extend(page.items.iter().map(|p| (p.namespace().unwrap(), p.name_any())));
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
            _ => break,
        }
    }
    assert_eq!((seen.len(), pages), (25, 3));
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted);

    let select = |s: &str| ListParams::default().labels(s);
    assert_eq!(all.list(&select("tier=front")).await.unwrap().items.len(), 9);
    assert_eq!(all.list(&select("tier in (front,db)")).await.unwrap().items.len(), 17);
    assert_eq!(all.list(&select("tier notin (front),idx!=1")).await.unwrap().items.len(), 15);
    assert_eq!(all.list(&select("tier,!nothing")).await.unwrap().items.len(), 25);
    assert_eq!(all.list(&select("!tier")).await.unwrap().items.len(), 0);
    let by_node = all.list(&ListParams::default().fields("spec.nodeName=node-1")).await.unwrap();
    assert_eq!(by_node.items.len(), 12);
    let one = all.list(&ListParams::default().fields("metadata.namespace=b,metadata.name=p20")).await.unwrap();
    assert_eq!(names(one), vec!["p20"]);
    let in_b: Api<Pod> = Api::namespaced(server.client(), "b");
    assert_eq!(in_b.list(&select("tier=db")).await.unwrap().items.len(), 3);

    let bad = all.list(&select("tier in front")).await.unwrap_err();
    assert_eq!(api_code(&bad).map(|c| c.0), Some(400));
    let unsupported = all.list(&ListParams::default().fields("spec.unknown=x")).await.unwrap_err();
    assert_eq!(api_code(&unsupported).map(|c| c.0), Some(400));

    // resourceVersion semantics.
    let rv = server.resource_version();
    let any = all.list(&ListParams::default().match_any()).await.unwrap();
    assert_eq!(any.metadata.resource_version, Some(rv.to_string()));
    let exact = ListParams::default().at(&rv.to_string()).matching(kube::api::VersionMatch::Exact);
    assert_eq!(all.list(&exact).await.unwrap().items.len(), 25);
    let future = ListParams::default().at(&(rv + 100).to_string()).matching(kube::api::VersionMatch::NotOlderThan);
    assert_eq!(api_code(&all.list(&future).await.unwrap_err()).map(|c| c.0), Some(504));
}

#[tokio::test]
async fn discovery_finds_registered_and_crd_groups() {
    let server = ApiServer::start_temp().await.unwrap();
    let client = server.client();
    assert!(!Discovery::new(client.clone()).run().await.unwrap().has_group("cilium.io"));

    server.register("cilium.io", "v2", "CiliumNetworkPolicy", "ciliumnetworkpolicies", true);
    let found = Discovery::new(client.clone()).run().await.unwrap();
    assert!(found.has_group("cilium.io"));
    assert!(found.has_group("networking.k8s.io"));
    let (cnp, caps) = found.get("cilium.io").unwrap().recommended_kind("CiliumNetworkPolicy").unwrap();
    assert_eq!(cnp.plural, "ciliumnetworkpolicies");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    let core = found.get("").unwrap();
    assert!(core.recommended_kind("Pod").is_some());
    let aggregated = Discovery::new(client.clone()).run_aggregated().await.unwrap();
    assert!(aggregated.has_group("cilium.io") && aggregated.has_group(""));
    let group = discovery::group(&client, "cilium.io").await.unwrap();
    assert_eq!(group.preferred_version_or_latest(), "v2");

    // Creating a CRD object serves its kind, with the Established condition set.
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> = Api::all(client.clone());
    let crd = serde_json::from_value(json!({
        "metadata": {"name": "runs.flock.dev"},
        "spec": {
            "group": "flock.dev", "scope": "Namespaced",
            "names": {"kind": "Run", "plural": "runs", "singular": "run", "listKind": "RunList"},
            "versions": [{"name": "v1alpha1", "served": true, "storage": true, "subresources": {"status": {}},
                          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    }))
    .unwrap();
    let created = crds.create(&PostParams::default(), &crd).await.unwrap();
    let conditions = created.status.unwrap().conditions.unwrap();
    assert!(conditions.iter().any(|c| c.type_ == "Established" && c.status == "True"));
    let gvk = GroupVersionKind::gvk("flock.dev", "v1alpha1", "Run");
    let (ar, _) = discovery::pinned_kind(&client, &gvk).await.unwrap();
    let runs: Api<DynamicObject> = Api::namespaced_with(client.clone(), "shop", &ar);
    let run = DynamicObject::new("r1", &ApiResource::from_gvk(&gvk)).data(json!({"spec": {"profile": "smoke"}}));
    runs.create(&PostParams::default(), &run).await.unwrap();
    let listed = runs.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].data["spec"]["profile"], "smoke");
    assert_eq!(server.list("flock.dev/v1alpha1", "Run", Some("shop")).unwrap().len(), 1);
}

#[tokio::test]
async fn request_faults_and_the_log() {
    let server = ApiServer::start_temp().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let lp = ListParams::default();

    server.fail_next(2, 500);
    for _ in 0..2 {
        let err = pods.list(&lp).await.unwrap_err();
        assert_eq!(api_code(&err), Some((500, "InternalError".into())));
    }
    pods.list(&lp).await.unwrap();

    server.fail_requests(FailRule::new(1, 429).method(http::Method::POST).path_contains("/pods"));
    pods.list(&lp).await.unwrap();
    let err = pods.create(&PostParams::default(), &pod("shop", "x", "n", json!({}))).await.unwrap_err();
    assert_eq!(api_code(&err), Some((429, "TooManyRequests".into())));
    pods.create(&PostParams::default(), &pod("shop", "x", "n", json!({}))).await.unwrap();

    server.unavailable(true);
    let err = pods.list(&lp).await.unwrap_err();
    assert_eq!(api_code(&err), Some((503, "ServiceUnavailable".into())));
    server.unavailable(false);
    pods.list(&lp).await.unwrap();

    server.garbage(true);
    assert!(matches!(pods.list(&lp).await.unwrap_err(), kube::Error::SerdeError(_)));
    assert!(matches!(pods.get("x").await.unwrap_err(), kube::Error::SerdeError(_)));
    server.garbage(false);
    pods.list(&lp).await.unwrap();

    server.slow(Some(Duration::from_millis(200)));
    let started = Instant::now();
    pods.list(&lp).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(200));
    server.slow(None);

    let log = server.requests();
    let statuses: Vec<u16> = log.iter().map(|r| r.status).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 500).count(), 2);
    assert!(log.iter().all(|r| r.path.starts_with("/api/v1/namespaces/shop/pods")));
    assert!(log.last().unwrap().elapsed >= Duration::from_millis(200));
    server.clear_requests();
    assert!(server.requests().is_empty());

    // Unknown paths are 404 Status bodies.
    let client: Client = server.client();
    let req = http::Request::get("/apis/nothing.example/v1/things").body(Vec::new()).unwrap();
    let err = client.request::<Value>(req).await.unwrap_err();
    assert_eq!(api_code(&err), Some((404, "NotFound".into())));
}

#[tokio::test]
async fn responses_are_json_with_the_right_codes() {
    use http_body_util::BodyExt;
    let server = ApiServer::start_temp().await.unwrap();
    let client = server.client();
    let cases = [
        ("GET", "/api/v1/namespaces/shop/pods", 200, "PodList"),
        ("GET", "/api/v1/namespaces/shop/pods/missing", 404, "Status"),
        ("GET", "/api/v1/nodes/node-1/status", 404, "Status"),
        ("GET", "/apis/networking.k8s.io/v1/networkpolicies?labelSelector=a+in+b", 400, "Status"),
        ("POST", "/api/v1/namespaces/shop/pods", 400, "Status"),
        ("PUT", "/api/v1/namespaces/shop/pods", 405, "Status"),
        ("GET", "/api", 200, "APIVersions"),
        ("GET", "/apis/apps", 200, "APIGroup"),
        ("GET", "/apis/apps/v1", 200, "APIResourceList"),
        ("GET", "/nothing", 404, "Status"),
    ];
    for (method, path, code, kind) in cases {
        let req = http::Request::builder().method(method).uri(path).body(kube::client::Body::from(b"not json".to_vec())).unwrap();
        let response = client.send(req).await.unwrap();
        assert_eq!(response.status().as_u16(), code, "{method} {path}");
        assert_eq!(response.headers()[http::header::CONTENT_TYPE], "application/json", "{method} {path}");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["kind"], kind, "{method} {path}");
        if kind == "Status" {
            assert_eq!(body["code"], code);
            assert_eq!(body["status"], "Failure");
        }
    }
}
