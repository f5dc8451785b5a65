//! A cluster-sized list: 150,000 pods served in pages of 500 to the real kube client and to a
//! reflector. Timings are printed (`cargo test -p flock-test-apiserver --test scale --
//! --nocapture`), not asserted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use flock_test_apiserver::ApiServer;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::ListParams,
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::json;

const PODS: usize = 150_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_150k_pods_in_pages() {
    let server = ApiServer::start_temp().await.unwrap();
    let started = Instant::now();
    for i in 0..PODS {
        let (ns, node) = (format!("ns-{:03}", i % 200), format!("node-{:04}", i % 1000));
        let ip = format!("198.18.{}.{}", (i / 250) % 256, i % 250 + 1);
        server
            .apply(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("pod-{i:06}"), "namespace": ns, "uid": format!("uid-{i}"),
                             "labels": {"app": format!("app-{}", i % 50), "tier": "web"}},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.example/app:1",
                          "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}]},
                "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
            }))
            .unwrap();
    }
    let seeded = started.elapsed();

    let pods: Api<Pod> = Api::all(server.client());
    let started = Instant::now();
    let mut lp = ListParams::default().limit(500);
    let (mut count, mut pages) = (0, 0);
    loop {
        let page = pods.list(&lp).await.unwrap();
        count += page.items.len();
        pages += 1;
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
            _ => break,
        }
    }
    let listed = started.elapsed();
    assert_eq!((count, pages), (PODS, PODS / 500));
    let serving: Duration = server.requests().iter().map(|r| r.elapsed).sum();

    // What the agent does at start: a reflector's initial list (same page size), then a watch.
    let started = Instant::now();
    let (reader, writer) = reflector::store::<Pod>();
    let driver = tokio::spawn(watcher(pods.clone(), watcher::Config::default()).reflect(writer).for_each(|_| async {}));
    tokio::time::timeout(Duration::from_secs(600), reader.wait_until_ready()).await.unwrap().unwrap();
    let reflected = started.elapsed();
    assert_eq!(reader.len(), PODS);
    server.wait_for_watches(1, Duration::from_secs(30)).await.unwrap();

    // A node's pods, by field selector over the whole set (the agent's filtered list).
    let started = Instant::now();
    let on_node = pods.list(&ListParams::default().fields("spec.nodeName=node-0007").limit(500)).await.unwrap();
    let selected = started.elapsed();
    assert_eq!(on_node.items.len(), PODS / 1000);
    driver.abort();

    println!(
        "150k pods: seeded in {seeded:.2?}; listed in {pages} pages of 500 in {listed:.2?} \
         ({serving:.2?} of it in the server); \
         reflector ready in {reflected:.2?}; field-selected {} pods in {selected:.2?}",
        on_node.items.len()
    );
}
