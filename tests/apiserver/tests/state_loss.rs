//! The API server losing state, as after an etcd restore, seen through the real kube client:
//! objects go back to the backup, resourceVersions go backwards (or jump ahead when the
//! restore bumps them), a watch from a resourceVersion the server no longer has gets 410
//! Expired, and a list or watch from one it has not reached gets 504 "Too large resource
//! version". Also what kube-runtime's own watcher does with the latter.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use flock_test_apiserver::{ApiServer, Config, FailRule};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, ResourceExt,
    api::{ListParams, VersionMatch, WatchEvent, WatchParams},
    core::Status,
    runtime::watcher,
};
use serde_json::json;

fn pod(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "shop"}, "spec": {"nodeName": "node-1"}})
}

async fn names(pods: &Api<Pod>) -> Vec<String> {
    pods.list(&ListParams::default()).await.unwrap().items.iter().map(ResourceExt::name_any).collect()
}

/// The first event of a watch from `rv`, which must be an ERROR.
async fn watch_error(pods: &Api<Pod>, rv: &str) -> Status {
    let mut stream = pods.watch(&WatchParams::default().timeout(5), rv).await.unwrap().boxed();
    match tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap() {
        Some(Ok(WatchEvent::Error(status))) => *status,
        other => panic!("expected an ERROR event from {rv}, got {other:?}"),
    }
}

fn is_too_large(status: &Status) -> bool {
    status.code == 504
        && status.reason == "Timeout"
        && status.message.contains("Too large resource version")
        && status.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == "ResourceVersionTooLarge"))
}

#[tokio::test]
async fn a_restore_brings_the_backup_back_and_resource_versions_go_backwards() {
    // No periodic bookmarks: the open watch must see nothing but its end.
    let server = ApiServer::start_temp_with(Config { bookmark_interval: None, ..Config::default() }).await.unwrap();
    server.apply(pod("kept")).unwrap();
    server.apply(pod("deleted-later")).unwrap();
    let backup = server.backup();
    server.apply(pod("created-later")).unwrap();
    server.delete("v1", "Pod", Some("shop"), "deleted-later").unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    assert_eq!(names(&pods).await, ["created-later", "kept"]);
    let seen = server.resource_version().to_string();
    let mut open = pods.watch(&WatchParams::default(), &seen).await.unwrap().boxed();
    server.wait_for_watches(1, Duration::from_secs(5)).await.unwrap();

    server.restore(&backup);
    // The open watch ends without a word; the objects are the backup's.
    assert!(tokio::time::timeout(Duration::from_secs(5), open.next()).await.unwrap().is_none());
    assert_eq!(server.resource_version(), backup.resource_version());
    assert_eq!(names(&pods).await, ["deleted-later", "kept"]);

    // From the resourceVersion a client saw last: 504 Too large, on a watch (an ERROR
    // event) and on a NotOlderThan list (the response).
    assert!(is_too_large(&watch_error(&pods, &seen).await));
    let lp = ListParams { resource_version: Some(seen.clone()), version_match: Some(VersionMatch::NotOlderThan), ..Default::default() };
    match pods.list(&lp).await.unwrap_err() {
        kube::Error::Api(status) => assert!(is_too_large(&status), "{status:?}"),
        other => panic!("expected a 504 Status, got {other:?}"),
    }
    // From before the backup: 410 Expired. From the backup's own: a normal watch.
    let older = (backup.resource_version() - 1).to_string();
    let expired = watch_error(&pods, &older).await;
    assert_eq!((expired.code, expired.reason.as_str()), (410, "Expired"));
    let current = backup.resource_version().to_string();
    let mut live = pods.watch(&WatchParams::default(), &current).await.unwrap().boxed();
    server.apply(pod("after")).unwrap();
    match tokio::time::timeout(Duration::from_secs(5), live.next()).await.unwrap() {
        Some(Ok(WatchEvent::Added(p))) => {
            assert_eq!(p.name_any(), "after");
            // New writes reuse resourceVersions clients saw before the restore.
            assert_eq!(p.resource_version().unwrap(), (backup.resource_version() + 1).to_string());
        }
        other => panic!("expected ADDED, got {other:?}"),
    }
}

#[tokio::test]
async fn a_bumped_restore_expires_every_watch() {
    let server = ApiServer::start_temp().await.unwrap();
    server.apply(pod("kept")).unwrap();
    let backup = server.backup();
    server.apply(pod("created-later")).unwrap();
    let seen = server.resource_version();
    server.restore_bumped(&backup, 1000);
    assert_eq!(server.resource_version(), backup.resource_version() + 1000);
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let expired = watch_error(&pods, &seen.to_string()).await;
    assert_eq!((expired.code, expired.reason.as_str()), (410, "Expired"));
    let list = pods.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.metadata.resource_version, Some((backup.resource_version() + 1000).to_string()));
    assert_eq!(list.items.len(), 1);
}

/// kube-runtime 5's watcher relists on 410 but not on 504 Too large: it re-watches from the
/// same resourceVersion for ever, so a client that relies on it never sees the restored
/// state. (flock's informer source relists itself; if this test starts failing, kube-runtime
/// has changed and that code can be revisited.)
#[tokio::test]
async fn kube_runtime_watcher_keeps_rewatching_after_too_large() {
    let server = ApiServer::start_temp_with(Config { bookmark_interval: None, ..Config::default() }).await.unwrap();
    server.apply(pod("kept")).unwrap();
    let backup = server.backup();
    server.apply(pod("created-later")).unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let mut stream = watcher(pods, watcher::Config::default()).boxed();
    let mut listed = Vec::new();
    loop {
        match stream.next().await.unwrap().unwrap() {
            watcher::Event::InitApply(p) => listed.push(p.name_any()),
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(listed, ["created-later", "kept"]);
    // Let the watch open, then lose the state.
    let first = tokio::time::timeout(Duration::from_millis(200), stream.next()).await;
    assert!(first.is_err(), "no event expected yet: {first:?}");
    server.restore(&backup);
    for _ in 0..5 {
        match tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap().unwrap() {
            Err(watcher::Error::WatchError(status)) => assert!(is_too_large(&status), "{status:?}"),
            other => panic!("expected the watcher to keep failing with 504, got {other:?}"),
        }
    }
    let lists = server.requests().iter().filter(|r| !r.watch && r.path.ends_with("/pods")).count();
    assert_eq!(lists, 1, "kube's watcher relisted after 504");
}

#[tokio::test]
async fn fail_rules_can_target_watches_and_be_cleared() {
    let server = ApiServer::start_temp().await.unwrap();
    server.apply(pod("a")).unwrap();
    server.fail_requests(FailRule::new(100, 500).watch(true).path_contains("/pods"));
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let list = pods.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    match pods.watch(&WatchParams::default(), &rv).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 500),
        Err(other) => panic!("expected a 500, got {other:?}"),
        Ok(_) => panic!("expected a 500, got a watch"),
    }
    server.clear_failures();
    assert!(pods.watch(&WatchParams::default(), &rv).await.is_ok());
}
