//! kube-runtime's `watcher` and `reflector` against the test API server, through the faults
//! flock's agent and controller must survive: dropped watches, expired history (410 and a
//! relist), an unavailable server, malformed lines, and bookmarks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, time::Duration};

use flock_test_apiserver::{ApiServer, Config};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::json;
use tokio::sync::mpsc;

/// A watcher driven by its own task (as in a real program, so its next request is made
/// while the test waits), its items forwarded in order. After an error the task pauses
/// 20 ms, like a backoff, since the bare watcher retries at once.
struct Events {
    rx: mpsc::UnboundedReceiver<Result<watcher::Event<Pod>, watcher::Error>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Events {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn spawn_watcher(api: Api<Pod>, config: watcher::Config) -> Events {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, config).boxed();
        while let Some(item) = stream.next().await {
            let failed = item.is_err();
            if tx.send(item).is_err() {
                return;
            }
            if failed {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    Events { rx, task }
}

fn pod(name: &str, labels: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "shop", "labels": labels},
        "spec": {"nodeName": "node-1", "containers": []},
    }))
    .unwrap()
}

async fn next(events: &mut Events) -> Result<watcher::Event<Pod>, watcher::Error> {
    tokio::time::timeout(Duration::from_secs(10), events.rx.recv()).await.expect("no watcher event within 10 s").expect("stream ended")
}

/// The next event that is not an error (errors are collected).
async fn next_ok(events: &mut Events, errors: &mut Vec<watcher::Error>) -> watcher::Event<Pod> {
    loop {
        match next(events).await {
            Ok(event) => return event,
            Err(err) => errors.push(err),
        }
    }
}

fn describe(event: &watcher::Event<Pod>) -> String {
    match event {
        watcher::Event::Init => "Init".into(),
        watcher::Event::InitApply(p) => format!("InitApply({})", p.name_any()),
        watcher::Event::InitDone => "InitDone".into(),
        watcher::Event::Apply(p) => format!("Apply({})", p.name_any()),
        watcher::Event::Delete(p) => format!("Delete({})", p.name_any()),
    }
}

/// Reads events up to and including the next InitDone.
async fn through_init(events: &mut Events, errors: &mut Vec<watcher::Error>) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let event = next_ok(events, errors).await;
        seen.push(describe(&event));
        if matches!(event, watcher::Event::InitDone) {
            return seen;
        }
    }
}

fn watch_requests(server: &ApiServer) -> usize {
    server.requests().iter().filter(|r| r.watch).count()
}

fn list_requests(server: &ApiServer) -> usize {
    server.requests().iter().filter(|r| !r.watch && r.method == http::Method::GET).count()
}

#[tokio::test]
async fn watcher_lists_then_follows_changes() {
    let server = ApiServer::start_temp().await.unwrap();
    for name in ["a", "b", "c"] {
        server.apply_resource(&pod(name, json!({}))).unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let mut events = spawn_watcher(pods.clone(), watcher::Config::default());
    let mut errors = Vec::new();
    assert_eq!(through_init(&mut events, &mut errors).await, ["Init", "InitApply(a)", "InitApply(b)", "InitApply(c)", "InitDone"]);
    server.wait_for_watches(1, Duration::from_secs(5)).await.unwrap();

    pods.create(&PostParams::default(), &pod("d", json!({}))).await.unwrap();
    assert_eq!(describe(&next_ok(&mut events, &mut errors).await), "Apply(d)");
    let label = json!({"metadata": {"labels": {"x": "1"}}});
    pods.patch("a", &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
    let event = next_ok(&mut events, &mut errors).await;
    assert_eq!(describe(&event), "Apply(a)");
    pods.delete("b", &DeleteParams::default()).await.unwrap();
    assert_eq!(describe(&next_ok(&mut events, &mut errors).await), "Delete(b)");
    // Direct store writes produce the same events.
    server.delete("v1", "Pod", Some("shop"), "c").unwrap();
    assert_eq!(describe(&next_ok(&mut events, &mut errors).await), "Delete(c)");
    assert!(errors.is_empty(), "{errors:?}");

    // The watcher lists with the default page size and watches with bookmarks.
    let log = server.requests();
    let list = log.iter().find(|r| !r.watch).unwrap();
    assert!(list.query.contains("limit=500"), "{}", list.query);
    let watch = log.iter().find(|r| r.watch).unwrap();
    assert!(watch.query.contains("allowWatchBookmarks=true"), "{}", watch.query);
}

#[tokio::test]
async fn watcher_resumes_after_dropped_watches() {
    let server = ApiServer::start_temp().await.unwrap();
    server.apply_resource(&pod("a", json!({}))).unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let mut events = spawn_watcher(pods.clone(), watcher::Config::default());
    let mut errors = Vec::new();
    through_init(&mut events, &mut errors).await;
    server.wait_for_watches(1, Duration::from_secs(5)).await.unwrap();

    for round in 0..3 {
        server.drop_watches();
        assert_eq!(server.open_watches(), 0);
        let name = format!("after-drop-{round}");
        // Written while no watch is open: the re-watch replays it from history.
        server.apply_resource(&pod(&name, json!({}))).unwrap();
        assert_eq!(describe(&next_ok(&mut events, &mut errors).await), format!("Apply({name})"));
    }
    server.wait_for_watches(1, Duration::from_secs(5)).await.unwrap();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(list_requests(&server), 1, "resuming needs no relist");
    assert_eq!(watch_requests(&server), 4);
}

#[tokio::test]
async fn watcher_relists_after_410_expired() {
    // No periodic bookmarks: they would move the watcher past the compaction.
    let config = Config { bookmark_interval: None, ..Config::default() };
    let server = ApiServer::start_temp_with(config).await.unwrap();
    server.apply_resource(&pod("a", json!({}))).unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let mut events = spawn_watcher(pods.clone(), watcher::Config::default());
    let mut errors = Vec::new();
    through_init(&mut events, &mut errors).await;
    server.wait_for_watches(1, Duration::from_secs(5)).await.unwrap();

    server.expire_history();
    server.drop_watches();
    server.apply_resource(&pod("b", json!({}))).unwrap();
    let relisted = through_init(&mut events, &mut errors).await;
    assert_eq!(relisted, ["Init", "InitApply(a)", "InitApply(b)", "InitDone"]);
    assert_eq!(errors.len(), 1, "{errors:?}");
    match &errors[0] {
        watcher::Error::WatchError(status) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        other => panic!("expected a 410 watch error, got {other:?}"),
    }
    assert_eq!(list_requests(&server), 2);

    // And it follows changes again.
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(describe(&next_ok(&mut events, &mut errors).await), "Delete(a)");
}

#[tokio::test]
async fn watcher_recovers_from_an_unavailable_server() {
    let server = ApiServer::start_temp().await.unwrap();
    server.apply_resource(&pod("a", json!({}))).unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let mut events = spawn_watcher(pods.clone(), watcher::Config::default());
    let mut errors = Vec::new();
    through_init(&mut events, &mut errors).await;
    server.wait_for_watches(1, Duration::from_secs(5)).await.unwrap();

    server.unavailable(true);
    server.apply_resource(&pod("while-down", json!({}))).unwrap();
    for _ in 0..3 {
        match next(&mut events).await {
            Err(watcher::Error::WatchStartFailed(kube::Error::Api(status))) => assert_eq!(status.code, 503),
            other => panic!("expected a 503, got {:?}", other.map(|e| describe(&e))),
        }
    }
    server.unavailable(false);
    assert_eq!(describe(&next_ok(&mut events, &mut errors).await), "Apply(while-down)");
    assert!(server.requests().iter().any(|r| r.status == 503));
}

#[tokio::test]
async fn malformed_lines_do_not_break_the_watch() {
    let server = ApiServer::start_temp().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let mut events = spawn_watcher(pods.clone(), watcher::Config::default());
    let mut errors = Vec::new();
    through_init(&mut events, &mut errors).await;
    server.wait_for_watches(1, Duration::from_secs(5)).await.unwrap();

    server.garbage(true);
    server.apply_resource(&pod("a", json!({}))).unwrap();
    assert_eq!(describe(&next_ok(&mut events, &mut errors).await), "Apply(a)");
    server.garbage(false);
    assert!(errors.iter().all(|e| matches!(e, watcher::Error::WatchFailed(kube::Error::SerdeError(_)))), "{errors:?}");
    assert!(!errors.is_empty());
    server.apply_resource(&pod("b", json!({}))).unwrap();
    assert_eq!(describe(&next_ok(&mut events, &mut errors).await), "Apply(b)");
}

#[tokio::test]
async fn bookmarks_keep_the_watch_resumable() {
    // A tiny history: writes to other resources compact it quickly.
    let config = Config { history_limit: 5, bookmark_interval: None, ..Config::default() };
    let server = ApiServer::start_temp_with(config).await.unwrap();
    server.apply_resource(&pod("a", json!({}))).unwrap();

    // The raw watch shows the bookmark itself.
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let rv = server.resource_version().to_string();
    let raw = pods.watch(&WatchParams { bookmarks: true, ..WatchParams::default() }, &rv).await.unwrap();
    let mut raw = Box::pin(raw);
    server.wait_for_watches(1, Duration::from_secs(5)).await.unwrap();
    server.send_bookmarks();
    match tokio::time::timeout(Duration::from_secs(5), raw.next()).await.unwrap().unwrap().unwrap() {
        WatchEvent::Bookmark(bookmark) => assert_eq!(bookmark.metadata.resource_version, rv),
        _ => panic!("expected a bookmark"),
    }
    drop(raw);

    // With bookmarks the watcher's resourceVersion follows the server's, so after the
    // history moves on (other resources written) a dropped watch resumes without 410.
    let mut events = spawn_watcher(pods.clone(), watcher::Config::default());
    let mut errors = Vec::new();
    through_init(&mut events, &mut errors).await;
    server.wait_for_watches(1, Duration::from_secs(5)).await.unwrap();
    let namespaces: Api<Namespace> = Api::all(server.client());
    for i in 0..10 {
        let ns = serde_json::from_value(json!({"metadata": {"name": format!("ns-{i}")}})).unwrap();
        namespaces.create(&PostParams::default(), &ns).await.unwrap();
    }
    server.send_bookmarks();
    // The bookmark is consumed inside the watcher; give it a moment to be read.
    let idle = tokio::time::timeout(Duration::from_millis(300), events.rx.recv()).await;
    assert!(idle.is_err(), "bookmarks are not surfaced as events");
    server.drop_watches();
    server.apply_resource(&pod("b", json!({}))).unwrap();
    assert_eq!(describe(&next_ok(&mut events, &mut errors).await), "Apply(b)");
    assert!(errors.is_empty(), "{errors:?}");

    // Without bookmarks the same sequence costs a 410 and a relist.
    let mut events = spawn_watcher(pods.clone(), watcher::Config::default().disable_bookmarks());
    through_init(&mut events, &mut errors).await;
    server.wait_for_watches(1, Duration::from_secs(5)).await.unwrap();
    for i in 10..20 {
        let ns = serde_json::from_value(json!({"metadata": {"name": format!("ns-{i}")}})).unwrap();
        namespaces.create(&PostParams::default(), &ns).await.unwrap();
    }
    server.drop_watches();
    assert_eq!(through_init(&mut events, &mut errors).await, ["Init", "InitApply(a)", "InitApply(b)", "InitDone"]);
    assert!(matches!(&errors[..], [watcher::Error::WatchError(status)] if status.code == 410), "{errors:?}");
}

#[tokio::test]
async fn periodic_bookmarks_are_sent() {
    let config = Config { bookmark_interval: Some(Duration::from_millis(100)), ..Config::default() };
    let server = ApiServer::start_temp_with(config).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let raw = pods.watch(&WatchParams { bookmarks: true, ..WatchParams::default() }, "0").await.unwrap();
    let mut raw = Box::pin(raw);
    let before = server.resource_version();
    server.apply_resource(&pod("a", json!({}))).unwrap();
    let rv = server.resource_version();
    // Bookmarks may tick before the ADDED (at the older resourceVersion); after it, they
    // carry the current one.
    let bookmarks_after_added = |saw: &[String]| saw.iter().skip_while(|e| *e != "ADDED a").filter(|e| e.starts_with("BOOKMARK")).count();
    let mut saw = Vec::new();
    while bookmarks_after_added(&saw) < 2 {
        match tokio::time::timeout(Duration::from_secs(5), raw.next()).await.unwrap().unwrap().unwrap() {
            WatchEvent::Added(p) => saw.push(format!("ADDED {}", p.name_any())),
            WatchEvent::Bookmark(b) => saw.push(format!("BOOKMARK {}", b.metadata.resource_version)),
            _ => panic!("unexpected event"),
        }
    }
    let added = saw.iter().position(|e| e == "ADDED a").unwrap();
    assert!(saw[..added].iter().all(|e| *e == format!("BOOKMARK {before}")), "{saw:?}");
    assert!(saw[added + 1..].iter().all(|e| *e == format!("BOOKMARK {rv}")), "{saw:?}");
}

#[tokio::test]
async fn selector_watches_see_objects_enter_and_leave() {
    let server = ApiServer::start_temp().await.unwrap();
    server.apply_resource(&pod("a", json!({"app": "web"}))).unwrap();
    server.apply_resource(&pod("b", json!({"app": "db"}))).unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let config = watcher::Config::default().labels("app=web");
    let mut events = spawn_watcher(pods.clone(), config);
    let mut errors = Vec::new();
    assert_eq!(through_init(&mut events, &mut errors).await, ["Init", "InitApply(a)", "InitDone"]);
    server.wait_for_watches(1, Duration::from_secs(5)).await.unwrap();

    let to = |app: &str| json!({"metadata": {"labels": {"app": app}}});
    pods.patch("a", &PatchParams::default(), &Patch::Merge(&to("db"))).await.unwrap();
    assert_eq!(describe(&next_ok(&mut events, &mut errors).await), "Delete(a)");
    pods.patch("b", &PatchParams::default(), &Patch::Merge(&to("web"))).await.unwrap();
    assert_eq!(describe(&next_ok(&mut events, &mut errors).await), "Apply(b)");

    // Field selectors too (the agent watches its node's pods).
    let mut on_node = spawn_watcher(pods.clone(), watcher::Config::default().fields("spec.nodeName=node-2"));
    assert_eq!(through_init(&mut on_node, &mut errors).await, ["Init", "InitDone"]);
    server.wait_for_watches(2, Duration::from_secs(5)).await.unwrap();
    let moved = json!({"spec": {"nodeName": "node-2"}});
    pods.patch("a", &PatchParams::default(), &Patch::Merge(&moved)).await.unwrap();
    assert_eq!(describe(&next_ok(&mut on_node, &mut errors).await), "Apply(a)");
    assert!(errors.is_empty(), "{errors:?}");
}

#[tokio::test]
async fn streaming_list_initial_events() {
    let server = ApiServer::start_temp().await.unwrap();
    server.apply_resource(&pod("a", json!({}))).unwrap();
    server.apply_resource(&pod("b", json!({}))).unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let mut events = spawn_watcher(pods.clone(), watcher::Config::default().streaming_lists());
    let mut errors = Vec::new();
    assert_eq!(through_init(&mut events, &mut errors).await, ["Init", "InitApply(a)", "InitApply(b)", "InitDone"]);
    pods.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(describe(&next_ok(&mut events, &mut errors).await), "Delete(a)");
    assert_eq!(list_requests(&server), 0);
}

#[tokio::test]
async fn reflector_store_stays_consistent_through_faults() {
    let server = ApiServer::start_temp_with(Config { history_limit: 50, ..Config::default() }).await.unwrap();
    for i in 0..20 {
        server.apply_resource(&pod(&format!("seed-{i}"), json!({"i": i.to_string()}))).unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let (reader, writer) = reflector::store::<Pod>();
    let backoff =
        watcher(pods.clone(), watcher::Config::default()).default_backoff().reflect(writer).for_each(|_| futures::future::ready(()));
    let driver = tokio::spawn(backoff);
    tokio::time::timeout(Duration::from_secs(10), reader.wait_until_ready()).await.unwrap().unwrap();

    let server_state = || -> BTreeMap<String, String> {
        server.list_resources::<Pod>(Some("shop")).unwrap().iter().map(|p| (p.name_any(), p.resource_version().unwrap())).collect()
    };
    let reader_state =
        || -> BTreeMap<String, String> { reader.state().iter().map(|p| (p.name_any(), p.resource_version().unwrap())).collect() };
    // kube's default backoff grows across the rounds (up to 30 s, reset only after two quiet
    // minutes), so convergence may take a while on a loaded machine.
    let converge = || async {
        for _ in 0..800 {
            if reader_state() == server_state() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(reader_state(), server_state(), "the reflector did not converge");
    };
    converge().await;

    for round in 0..6 {
        // Some changes through the API and some directly.
        for i in 0..5 {
            let name = format!("r{round}-{i}");
            pods.create(&PostParams::default(), &pod(&name, json!({}))).await.unwrap();
        }
        pods.delete(&format!("seed-{round}"), &DeleteParams::default()).await.unwrap();
        let label = json!({"metadata": {"labels": {"round": round.to_string()}}});
        pods.patch(&format!("seed-{}", round + 10), &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
        match round {
            0 => server.drop_watches(),
            1 => {
                server.expire_history();
                server.drop_watches();
            }
            2 => {
                server.unavailable(true);
                server.apply_resource(&pod("written-while-down", json!({}))).unwrap();
                tokio::time::sleep(Duration::from_millis(300)).await;
                server.unavailable(false);
            }
            3 => {
                // More writes than the history keeps, while the watch is down.
                server.drop_watches();
                server.fail_next(2, 500);
                for i in 0..60 {
                    server.apply_resource(&pod(&format!("burst-{i}"), json!({}))).unwrap();
                }
            }
            4 => {
                server.garbage(true);
                server.apply_resource(&pod("during-garbage", json!({}))).unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
                server.garbage(false);
            }
            _ => {
                server.delete("v1", "Pod", Some("shop"), "burst-0").unwrap();
            }
        }
        converge().await;
    }
    driver.abort();
}

#[tokio::test]
async fn watches_end_at_their_timeout_and_when_clients_leave() {
    let server = ApiServer::start_temp().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let started = std::time::Instant::now();
    let short = pods.watch(&WatchParams::default().timeout(1), "0").await.unwrap();
    let mut short = Box::pin(short);
    // Only bookmarks can arrive before the server ends the stream.
    while let Some(event) = tokio::time::timeout(Duration::from_secs(10), short.next()).await.unwrap() {
        assert!(matches!(event.unwrap(), WatchEvent::Bookmark(_)));
    }
    assert!(started.elapsed() >= Duration::from_secs(1));

    let open = pods.watch(&WatchParams::default(), "0").await.unwrap();
    server.wait_for_watches(1, Duration::from_secs(5)).await.unwrap();
    drop(open);
    for _ in 0..100 {
        if server.open_watches() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.open_watches(), 0, "a client that goes away unregisters its watch");
}

#[tokio::test]
async fn metadata_watcher_and_list_metadata() {
    let server = ApiServer::start_temp().await.unwrap();
    server.apply_resource(&pod("a", json!({"app": "web"}))).unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");
    let metas = pods.list_metadata(&kube::api::ListParams::default()).await.unwrap();
    assert_eq!(metas.items[0].metadata.labels.as_ref().unwrap()["app"], "web");
    assert_eq!(metas.items[0].types.as_ref().unwrap().kind, "PartialObjectMetadata");
    assert_eq!(pods.get_metadata("a").await.unwrap().types.unwrap().kind, "PartialObjectMetadata");
    // Metadata-only requests (Accept: …;as=PartialObjectMetadata…) get metadata only.
    let metas: Api<kube::core::PartialObjectMeta<Pod>> = Api::namespaced(server.client(), "shop");
    let mut stream = watcher(metas, watcher::Config::default()).boxed();
    let mut names = Vec::new();
    while let Some(event) = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap() {
        match event.unwrap() {
            watcher::Event::InitApply(meta) => names.push(meta.name_any()),
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(names, ["a"]);
}

#[tokio::test]
async fn a_controller_reconciles_against_the_server() {
    use std::sync::Arc;

    use kube::runtime::controller::{Action, Controller};

    let server = ApiServer::start_temp().await.unwrap();
    server.apply_resource(&pod("a", json!({}))).unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "shop");

    async fn reconcile(pod: Arc<Pod>, pods: Arc<Api<Pod>>) -> Result<Action, kube::Error> {
        if !pod.labels().contains_key("reconciled") {
            let applied =
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod.name_any(), "labels": {"reconciled": "true"}}});
            pods.patch(&pod.name_any(), &PatchParams::apply("test-controller"), &Patch::Apply(&applied)).await?;
        }
        Ok(Action::await_change())
    }
    fn error_policy(_: Arc<Pod>, _: &kube::Error, _: Arc<Api<Pod>>) -> Action {
        Action::requeue(Duration::from_millis(50))
    }

    let controller = Controller::new(pods.clone(), watcher::Config::default())
        .run(reconcile, error_policy, Arc::new(pods.clone()))
        .for_each(|_| futures::future::ready(()));
    let driver = tokio::spawn(controller);
    server.fail_next(1, 500); // the controller's first request fails; it retries
    let labelled = |server: &ApiServer, name: &str| {
        server.get_resource::<Pod>(Some("shop"), name).unwrap().is_some_and(|p| p.labels().contains_key("reconciled"))
    };
    for name in ["a", "b"] {
        if name == "b" {
            pods.create(&PostParams::default(), &pod("b", json!({}))).await.unwrap();
        }
        let mut done = false;
        for _ in 0..200 {
            if labelled(&server, name) {
                done = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(done, "{name} was not reconciled");
    }
    driver.abort();
}

#[tokio::test]
async fn watching_one_object_by_path() {
    let server = ApiServer::start_temp().await.unwrap();
    server.apply_resource(&pod("a", json!({}))).unwrap();
    server.apply_resource(&pod("b", json!({}))).unwrap();
    let req = http::Request::get("/api/v1/namespaces/shop/pods/b?watch=true").body(Vec::new()).unwrap();
    let events = server.client().request_events::<Pod>(req).await.unwrap();
    let mut events = Box::pin(events);
    match tokio::time::timeout(Duration::from_secs(5), events.next()).await.unwrap().unwrap().unwrap() {
        WatchEvent::Added(p) => assert_eq!(p.name_any(), "b"),
        _ => panic!("expected ADDED b"),
    }
}
