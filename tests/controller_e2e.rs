//! flock-controller end to end (root): the real controller reconciles a Run against the
//! in-repo API server (unix socket), and the NetworkPolicy it applies there is fed to the
//! simulated cluster as flock-agent would see it — real flock-cni pods, real nft rules.
//!
//! The cluster: the conformance base (x/y/z, pods a/b/c; node-1 198.18.1.0/24 and
//! 2001:db8:1::/64, node-2 198.18.2.0/24), cluster pod CIDRs 198.18.0.0/20 and
//! 2001:db8:1::/48, Service CIDR 198.18.240.0/20; kube-system/coredns (k8s-app=kube-dns) and
//! kube-system/other on 53; the run's pod x/runner (dual-stack); hosts: "internet"
//! 198.19.100.1 and 2001:db8:100::1, a listener in the Service CIDR 198.18.240.10, the API
//! server endpoint 198.18.250.2 (the `default/kubernetes` EndpointSlice) and a decoy
//! 198.18.250.3 — each serving TCP 22, 80, 443, 6443 and UDP 443.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use flock::controller::metrics::Metrics;
use flock::controller::probe::{AgentRef, EnforceMode};
use flock::controller::render::{ClusterConfig, DnsConfig};
use flock::controller::{self, Options};
use flock::model::Protocol;
use flock::sim::{HostSpec, Outcome, ProbeSpec, Sim, SimOptions};
use flock::testkit::kernel::{flock_cni_binary, require_root};
use flock::testkit::{self, parse_manifests};
use flock_test_apiserver::ApiServer;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};

#[path = "common/controller.rs"]
mod common;

const EXTRA: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: node-1}
spec:
  podCIDR: 198.18.1.0/24
  podCIDRs: [198.18.1.0/24, "2001:db8:1::/64"]
status:
  addresses: [{type: InternalIP, address: 198.18.0.1}]
---
apiVersion: v1
kind: Namespace
metadata: {name: kube-system}
---
apiVersion: v1
kind: Pod
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  nodeName: node-2
  containers:
  - name: dns
    image: dns
    ports: [{containerPort: 53, protocol: UDP, name: dns}, {containerPort: 53, protocol: TCP, name: dns-tcp}]
status:
  phase: Running
  podIPs: [{ip: 198.18.2.53}]
---
apiVersion: v1
kind: Pod
metadata: {name: other, namespace: kube-system, labels: {k8s-app: other}}
spec:
  nodeName: node-2
  containers:
  - name: dns
    image: dns
    ports: [{containerPort: 53, protocol: UDP, name: dns}, {containerPort: 53, protocol: TCP, name: dns-tcp}]
status:
  phase: Running
  podIPs: [{ip: 198.18.2.54}]
---
apiVersion: v1
kind: Pod
metadata: {name: runner, namespace: x, labels: {flock.dev/run: job-e2e}}
spec:
  nodeName: node-1
  containers: [{name: agent, image: agent}]
status:
  phase: Running
  podIPs: [{ip: 198.18.1.50}, {ip: "2001:db8:1::50"}]
"#;

async fn controller_policy() -> (NetworkPolicy, ApiServer, Duration) {
    // The API server's endpoint is 198.18.250.2:6443 (its EndpointSlice).
    let server = common::api_server().await;
    server
        .apply(json!({
            "apiVersion": "flock.dev/v1alpha1", "kind": "RunProfile", "metadata": {"name": "agent"},
            "spec": {
                "internet": {"ports": [{"port": 443}, {"port": 80}]},
                "apiServer": true,
                "services": [{"name": "web", "namespace": "y", "podSelector": {"matchLabels": {"pod": "a"}}, "ports": [{"port": 80}]}],
            },
        }))
        .unwrap();
    let cluster = ClusterConfig {
        pod_cidrs: vec!["198.18.0.0/20".parse().unwrap(), "2001:db8:1::/48".parse().unwrap()],
        service_cidrs: vec!["198.18.240.0/20".parse().unwrap()],
        dns: DnsConfig::default(),
        api_server: Default::default(),
    };
    let opts = Options { agent: AgentRef::default(), instance: "e2e".into(), ..Options::new(EnforceMode::On, cluster) };
    let client = server.client();
    let startup = controller::start(&client, &opts).await.unwrap();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move { controller::run(client, startup, &opts, Arc::new(Metrics::new()), rx).await });
    let t0 = Instant::now();
    let run: Value = json!({"apiVersion": "flock.dev/v1alpha1", "kind": "Run", "metadata": {"name": "job-e2e", "namespace": "x"}, "spec": {"profile": "agent"}});
    kube::Api::<flock::crd::Run>::namespaced(server.client(), "x")
        .create(&Default::default(), &serde_json::from_value(run).unwrap())
        .await
        .unwrap();
    let np =
        common::eventually(10, "the run's policy", || server.get_resource::<NetworkPolicy>(Some("x"), "job-e2e-egress").unwrap()).await;
    let took = t0.elapsed();
    let _ = stop.send(true);
    task.await.unwrap();
    (np, server, took)
}

fn host(name: &str, addrs: &str) -> HostSpec {
    format!("{name}={addrs}").parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runs_pod_reaches_what_its_profile_allows_and_nothing_else() {
    if !require_root("a_runs_pod_reaches_what_its_profile_allows_and_nothing_else") {
        return;
    }
    let (np, _server, took) = controller_policy().await;
    eprintln!("controller: Run created → NetworkPolicy applied in {:.1} ms", took.as_secs_f64() * 1e3);

    let mut snapshot = testkit::base_cluster();
    for o in parse_manifests(EXTRA).objects {
        o.apply_to(&mut snapshot);
    }
    let mut opts = SimOptions::new(flock_cni_binary().parent().unwrap().to_path_buf());
    opts.hosts = vec![
        host("internet", "198.19.100.1,2001:db8:100::1"),
        host("svc-listener", "198.18.240.10"),
        host("apiserver", "198.18.250.2"),
        host("decoy", "198.18.250.3"),
    ];
    opts.host_ports = vec![(22, Protocol::Tcp), (80, Protocol::Tcp), (443, Protocol::Tcp), (6443, Protocol::Tcp), (443, Protocol::Udp)];
    opts.probe_timeout = Duration::from_millis(700);
    let mut sim = Sim::build(snapshot, opts).await.unwrap();

    let probe = |sim: &Sim, from: &str, to: &str, port: u16, protocol: Protocol, v6: bool| -> Outcome {
        let family = Some(if v6 { flock::model::Family::V6 } else { flock::model::Family::V4 });
        let cells = sim.probe(ProbeSpec { port, protocol, family }, &[from.to_string()], &[to.to_string()]).unwrap();
        cells[0].outcome.unwrap_or_else(|| panic!("{from} → {to}: not probed"))
    };
    let (tcp, udp) = (Protocol::Tcp, Protocol::Udp);
    const RUNNER: &str = "x/runner";

    // Before the policy exists the run's pod is closed (flock-agent isolates pods labelled
    // flock.dev/run until their policy arrives), while other pods are open.
    assert_eq!(probe(&sim, RUNNER, "host/internet", 443, tcp, false), Outcome::Timeout);
    assert_eq!(probe(&sim, "x/a", "host/internet", 22, tcp, false), Outcome::Connected);

    // The controller's policy, as flock-agent's informer would convert it.
    let model = flock::model::convert::network_policy(&np).unwrap();
    sim.apply(|s| s.upsert_policy(model)).await.unwrap();

    let cases: &[(&str, u16, Protocol, bool, Outcome, &str)] = &[
        ("kube-system/coredns", 53, udp, false, Outcome::Connected, "DNS over UDP"),
        ("kube-system/coredns", 53, tcp, false, Outcome::Connected, "DNS over TCP"),
        ("kube-system/other", 53, udp, false, Outcome::Timeout, "another kube-system pod on 53"),
        ("host/internet", 443, tcp, false, Outcome::Connected, "internet 443"),
        ("host/internet", 80, tcp, false, Outcome::Connected, "internet 80"),
        ("host/internet", 443, tcp, true, Outcome::Connected, "internet 443 over IPv6"),
        ("host/internet", 22, tcp, false, Outcome::Timeout, "internet 22 (not listed)"),
        ("host/internet", 22, tcp, true, Outcome::Timeout, "internet 22 over IPv6"),
        ("host/internet", 443, udp, false, Outcome::Timeout, "internet UDP 443 (QUIC, not listed)"),
        ("host/svc-listener", 443, tcp, false, Outcome::Timeout, "a Service-CIDR address on an internet port"),
        ("host/apiserver", 6443, tcp, false, Outcome::Connected, "the API server endpoint"),
        ("host/decoy", 6443, tcp, false, Outcome::Timeout, "another address on the API server's port"),
        ("host/apiserver", 22, tcp, false, Outcome::Timeout, "the API server endpoint on another port"),
        ("y/a", 80, tcp, false, Outcome::Connected, "the named service's pods on its port"),
        ("y/a", 81, tcp, false, Outcome::Timeout, "the named service's pods on another port"),
        ("y/b", 80, tcp, false, Outcome::Timeout, "another pod of the service's namespace"),
        ("x/b", 80, tcp, false, Outcome::Timeout, "a pod of the run's own namespace"),
    ];
    let mut failures = Vec::new();
    let (mut allowed, mut blocked) = (0, 0);
    for (to, port, proto, v6, want, what) in cases {
        let got = probe(&sim, RUNNER, to, *port, *proto, *v6);
        eprintln!("{RUNNER} → {to} {port}/{proto:?}{}: {} ({what})", if *v6 { " IPv6" } else { "" }, got.as_str());
        if got != *want {
            failures.push(format!("{what}: {to} {port}/{proto:?}: want {want:?}, got {got:?}"));
        }
        if *want == Outcome::Connected { allowed += 1 } else { blocked += 1 }
    }
    // The blocks are the policy's: a pod without it reaches the same places.
    for (to, port) in [("host/internet", 22), ("host/decoy", 6443), ("host/svc-listener", 443), ("x/b", 80)] {
        let got = probe(&sim, "x/a", to, port, tcp, false);
        if got != Outcome::Connected {
            failures.push(format!("control x/a → {to} {port}: {got:?}"));
        }
    }
    eprintln!("{allowed} allowed and {blocked} blocked flows as expected: {}", failures.is_empty());
    sim.teardown().await.unwrap();
    assert!(failures.is_empty(), "{failures:#?}");
}
