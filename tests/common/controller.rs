//! Helpers shared by flock-controller's integration tests (each test binary that uses them
//! includes this file as a module): the test API server set up like a cluster with flock's
//! CRDs, polling, and the grants of the RBAC manifests.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::{Duration, Instant};

use flock_test_apiserver::ApiServer;
use serde_json::{Value, json};

/// The repository root.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `default/kubernetes` EndpointSlice with one endpoint, `addr`:6443.
pub fn endpoint_slice(addr: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [addr], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
    })
}

/// A test API server with flock's CRDs (the committed files, so they are exercised) and
/// the API server's EndpointSlice (198.18.250.2:6443).
pub async fn api_server() -> ApiServer {
    let server = ApiServer::start_temp().await.unwrap();
    seed(&server);
    server
}

/// Gives `server` what [`api_server`] has: flock's CRDs and the API server's EndpointSlice.
pub fn seed(server: &ApiServer) {
    for file in [
        "controller/crds/runprofiles.flock.dev.yaml",
        "controller/crds/runs.flock.dev.yaml",
        "controller/crds/auditevents.flock.dev.yaml",
        "agent/crds/flocknodes.flock.dev.yaml",
        "controller/crds/podslices.flock.dev.yaml",
    ] {
        let text = std::fs::read_to_string(root().join("deploy").join(file)).unwrap();
        server.apply(serde_saphyr::from_str::<Value>(&text).unwrap()).unwrap();
    }
    server.apply(endpoint_slice("198.18.250.2")).unwrap();
}

/// Polls `f` every 10 ms until it returns `Some`, for at most `secs`.
pub async fn eventually<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The documents of a YAML file (empty ones left out).
pub fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every grant of the roles of `kinds` in a manifest, as `SCOPE GROUP/RESOURCE:VERB[/NAME]`
/// (scope: `cluster` or the Role's namespace; NAME when the rule has resourceNames), sorted.
pub fn grants(path: &str, kinds: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for role in yaml_docs(&root().join(path)).into_iter().filter(|d| kinds.contains(&d["kind"].as_str().unwrap())) {
        let scope = role["metadata"]["namespace"].as_str().unwrap_or("cluster").to_string();
        for r in role["rules"].as_array().unwrap() {
            let names: Vec<String> = r["resourceNames"]
                .as_array()
                .map(|n| n.iter().map(|v| format!("/{}", v.as_str().unwrap())).collect())
                .unwrap_or_else(|| vec![String::new()]);
            for g in r["apiGroups"].as_array().unwrap() {
                for res in r["resources"].as_array().unwrap() {
                    for v in r["verbs"].as_array().unwrap() {
                        for n in &names {
                            out.push(format!("{scope} {}/{}:{}{n}", g.as_str().unwrap(), res.as_str().unwrap(), v.as_str().unwrap()));
                        }
                    }
                }
            }
        }
    }
    out.sort();
    out
}

/// A running flock-controller (`controller::start` then `controller::run`), stopped by
/// [`Running::stop`].
pub struct Running {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    pub metrics: std::sync::Arc<flock::controller::metrics::Metrics>,
}

impl Running {
    pub async fn start(server: &ApiServer, opts: flock::controller::Options) -> Self {
        let client = server.client();
        let startup = flock::controller::start(&client, &opts).await.unwrap();
        let metrics = std::sync::Arc::new(flock::controller::metrics::Metrics::new());
        let (stop, rx) = tokio::sync::watch::channel(false);
        let m = metrics.clone();
        let task = tokio::spawn(async move { flock::controller::run(client, startup, &opts, m, rx).await });
        Self { stop, task, metrics }
    }

    pub async fn stop(self) {
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(10), self.task).await.expect("the controller stops").unwrap();
    }
}

/// A GET over a unix socket (an agent's health and metrics server): status code and body;
/// code 0 when nothing answers.
pub fn http_get(socket: &Path, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) else { return (0, String::new()) };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: flock\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (code, body)
}

/// A flock-agent daemon's options for tests: `agent`'s node, its health and metrics on a unix
/// socket under `dir`, no CNI config file, no Events, no FlockNode; tests change what they need.
pub fn daemon_options(agent: flock::agent::AgentConfig, dir: &Path) -> flock::daemon::DaemonOptions {
    let node = agent.node.clone();
    flock::daemon::DaemonOptions {
        agent,
        listen: flock::agent::http::ListenAddr::Unix(dir.join("metrics.sock")),
        cni_conf: None,
        cni_mtu: None,
        cni_host_ports: flock::agent::cniconf::HostPorts::Off,
        degraded_after: Duration::from_secs(5),
        disconnected_after: Duration::from_secs(60),
        source: flock::source::kube::SourceOptions::for_node(&node),
        events: false,
        instance: format!("flock-agent-{node}"),
        report: flock::report::ReportOptions::default(),
        max_sync_age: Duration::from_secs(90),
        node_status: None,
        removal: None,
    }
}
