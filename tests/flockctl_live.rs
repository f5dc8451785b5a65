//! flockctl on a live cluster, end to end through the binaries: `flock-test-apiserver`
//! serves manifests on an address inside a network namespace, and `explain` and `render`
//! read it through the kubeconfig the server writes — the same answers as from the
//! manifests themselves. Also `kubectl flock` (the plugin name).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/explain_policies.rs"]
mod explain_policies;
#[path = "common/uids.rs"]
mod uids;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use explain_policies::POLICIES;
use flock::testkit::kernel::{NetnsGuard, require_root, sweep, workspace_binary};

const BASE: &str = "tests/conformance/base-cluster.yaml";

/// A change for whatif: z may no longer reach y.
const CHANGE: &str = r#"
apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: guard-y}
spec:
  tier: Admin
  priority: 20
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: y}}}
  ingress:
    - {name: no-z, action: Deny, from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}}]}
"#;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

/// A scratch directory with the policies, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let d = std::env::temp_dir().join(format!("flock-live-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("policies.yaml"), POLICIES).unwrap();
        // The base cluster with its pods' uids written out: the API server would assign
        // others, and interface names (in explanations and rulesets) follow uids.
        let base = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(BASE)).unwrap();
        std::fs::write(d.join("base.yaml"), uids::with_derived_uids(&base)).unwrap();
        Self(d)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The API server process, ended with SIGTERM on drop.
struct Server(Option<Child>);

impl Server {
    fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.0.take()?;
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.terminate();
    }
}

fn flockctl() -> &'static str {
    env!("CARGO_BIN_EXE_flockctl")
}

/// `flockctl args…` inside `ns` (the API server's address is only there).
fn flockctl_in(ns: &NetnsGuard, args: &[&str]) -> Output {
    let mut full = vec!["netns", "exec", ns.name.as_str(), flockctl()];
    full.extend_from_slice(args);
    Command::new("ip").args(&full).current_dir(env!("CARGO_MANIFEST_DIR")).env("HOME", "/nonexistent").output().unwrap()
}

fn flockctl_here(args: &[&str]) -> Output {
    Command::new(flockctl()).args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap()
}

/// Starts the server in `ns` on 198.18.0.1, port 0, with the manifests; waits for its
/// kubeconfig.
fn serve(ns: &NetnsGuard, s: &Scratch, manifests: &[&str]) -> (Server, String) {
    ns.ip(&["addr", "add", "198.18.0.1/32", "dev", "lo"]);
    let kubeconfig = s.path("kubeconfig");
    let bin = workspace_binary("flock-test-apiserver", "flock-test-apiserver");
    let mut args = vec!["netns".to_string(), "exec".into(), ns.name.clone(), bin.to_str().unwrap().into()];
    args.extend(["--listen", "198.18.0.1:0", "--kubeconfig-out", &kubeconfig].map(String::from));
    for m in manifests {
        args.extend(["--manifests".to_string(), m.to_string()]);
    }
    let child = Command::new("ip").args(&args).current_dir(env!("CARGO_MANIFEST_DIR")).stderr(Stdio::inherit()).spawn().unwrap();
    let mut server = Server(Some(child));
    // Readiness, not timing: the file appears once the server serves.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !Path::new(&kubeconfig).exists() {
        if let Some(Ok(Some(status))) = server.0.as_mut().map(Child::try_wait) {
            panic!("flock-test-apiserver exited early: {status}");
        }
        assert!(Instant::now() < deadline, "flock-test-apiserver wrote no kubeconfig");
        std::thread::sleep(Duration::from_millis(20));
    }
    (server, kubeconfig)
}

#[test]
fn live_explain_and_render_answer_as_the_manifests_do() {
    if !require_root("live_explain_and_render_answer_as_the_manifests_do") {
        return;
    }
    sweep();
    let s = Scratch::new("explain");
    let policies = s.path("policies.yaml");
    let ns = NetnsGuard::new("live");
    let (mut server, kubeconfig) = serve(&ns, &s, &[&s.path("base.yaml"), &policies]);
    assert!(std::fs::read_to_string(&kubeconfig).unwrap().contains("server: http://198.18.0.1:"));

    let mut compared = 0;
    for from in flock::testkit::BASE_PODS {
        for to in flock::testkit::BASE_PODS {
            if from == to {
                continue;
            }
            for (port, protocol) in [("80", "TCP"), ("81", "UDP")] {
                let common = ["explain", "--from", from, "--to", to, "--port", port, "--protocol", protocol, "-o", "json"];
                let live = flockctl_in(&ns, &[&common[..], &["--kubeconfig", &kubeconfig]].concat());
                assert!(live.status.success(), "live {from} → {to}: {}", text(&live.stderr));
                let offline = flockctl_here(&[&common[..], &["-f", BASE, "-f", &policies]].concat());
                assert!(offline.status.success(), "{}", text(&offline.stderr));
                let (live, offline): (serde_json::Value, serde_json::Value) =
                    (serde_json::from_slice(&live.stdout).unwrap(), serde_json::from_slice(&offline.stdout).unwrap());
                assert_eq!(live, offline, "{from} → {to} {port}/{protocol}");
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 9 * 8 * 2);

    // The context by name, and a node's ruleset.
    for node in ["node-1", "node-2"] {
        let live = flockctl_in(&ns, &["render", "--kubeconfig", &kubeconfig, "--context", "flock-test", "--node", node]);
        assert!(live.status.success(), "{}", text(&live.stderr));
        let offline = flockctl_here(&["render", "-f", BASE, "-f", &policies, "--node", node]);
        assert!(offline.status.success(), "{}", text(&offline.stderr));
        assert_eq!(text(&live.stdout), text(&offline.stdout), "render --node {node}");
    }

    // whatif reads the live cluster as it reads the manifests.
    let change = s.path("change.yaml");
    std::fs::write(&change, CHANGE).unwrap();
    let live =
        flockctl_in(&ns, &["whatif", "--kubeconfig", &kubeconfig, "--apply", &change, "--delete", "networkpolicy/x/web", "-o", "json"]);
    assert!(live.status.success(), "{}", text(&live.stderr));
    let offline =
        flockctl_here(&["whatif", "-f", BASE, "-f", &policies, "--apply", &change, "--delete", "networkpolicy/x/web", "-o", "json"]);
    assert!(offline.status.success(), "{}", text(&offline.stderr));
    let (live, offline): (serde_json::Value, serde_json::Value) =
        (serde_json::from_slice(&live.stdout).unwrap(), serde_json::from_slice(&offline.stdout).unwrap());
    assert_eq!(live, offline);
    assert!(live["total"].as_u64().unwrap() > 0, "{live}");

    // An unknown context and a refused connection are errors naming what failed (exit 2).
    let bad = flockctl_in(&ns, &["render", "--kubeconfig", &kubeconfig, "--context", "nope", "--node", "node-1"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("nope"), "{}", text(&bad.stderr));

    // SIGTERM ends the server cleanly.
    let status = server.terminate().expect("flock-test-apiserver did not stop on SIGTERM");
    assert!(status.success(), "{status}");
    let gone = flockctl_in(&ns, &["explain", "--kubeconfig", &kubeconfig, "--from", "x/a", "--to", "x/b", "--port", "80"]);
    assert_eq!(gone.status.code(), Some(2));
    assert!(text(&gone.stderr).contains("explain: reading the cluster"), "{}", text(&gone.stderr));
    // It names the server it could not reach (a wrong kubeconfig is otherwise a bare
    // "client error (Connect)").
    let server = std::fs::read_to_string(&kubeconfig).unwrap();
    let url = server.lines().find_map(|l| l.trim().strip_prefix("server: ")).unwrap().trim().trim_matches('"').to_string();
    let host = url.trim_start_matches("http://").trim_end_matches('/');
    assert!(text(&gone.stderr).contains(host), "the error does not name {host}: {}", text(&gone.stderr));
}

#[test]
fn whatif_lists_the_flows_a_change_opens_and_closes() {
    let s = Scratch::new("whatif");
    let change = s.path("change.yaml");
    std::fs::write(&change, CHANGE).unwrap();
    let policies = s.path("policies.yaml");
    let out = flockctl_here(&["whatif", "-f", BASE, "-f", &policies, "--apply", &change, "--port", "80", "-o", "json", "--exit-code"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let w: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Every z pod to every y pod closes (nothing else changes): 3 × 3 flows.
    assert_eq!((w["total"].as_u64(), w["closed"].as_u64(), w["opened"].as_u64()), (Some(9), Some(9), Some(0)), "{w}");
    for c in w["changes"].as_array().unwrap() {
        assert!(c["from"].as_str().unwrap().starts_with("z/") && c["to"].as_str().unwrap().starts_with("y/"), "{c}");
        assert_eq!((c["before"].as_str(), c["after"].as_str(), c["port"].as_u64()), (Some("Allow"), Some("Deny"), Some(80)));
        assert!(c["decided_after"].to_string().contains("guard-y"), "{c}");
        // Each change is what explain says of the flow.
        let e = flockctl_here(&[
            "explain",
            "-f",
            BASE,
            "-f",
            &policies,
            "-f",
            &change,
            "--from",
            c["from"].as_str().unwrap(),
            "--to",
            c["to"].as_str().unwrap(),
            "--port",
            "80",
            "-o",
            "json",
        ]);
        let e: serde_json::Value = serde_json::from_slice(&e.stdout).unwrap();
        assert_eq!(e["verdict"], "Deny");
    }
    // Deleting what is not there is an error naming it; table output sums up.
    let missing = flockctl_here(&["whatif", "-f", BASE, "--delete", "networkpolicy/x/nope"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(text(&missing.stderr).contains("no NetworkPolicy x/nope"), "{}", text(&missing.stderr));
    let table = flockctl_here(&["whatif", "-f", BASE, "-f", &policies, "--delete", "networkpolicy/x/web"]);
    assert!(table.status.success(), "{}", text(&table.stderr));
    assert!(text(&table.stdout).contains("Deny → Allow"), "{}", text(&table.stdout));

    // A change that names a port no pod declares: without --port it is not judged, and the
    // output says so (it would otherwise read as "nothing changes").
    let port_change = s.path("port-change.yaml");
    std::fs::write(
        &port_change,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: only-9090, namespace: y}\n\
         spec: {podSelector: {}, policyTypes: [Ingress], ingress: [{ports: [{port: 9090}]}]}\n",
    )
    .unwrap();
    let out = flockctl_here(&["whatif", "-f", BASE, "--apply", &port_change]);
    let out = text(&out.stdout);
    assert!(out.contains("not judged: 9090/TCP (named by the change, declared by no pod"), "{out}");
    let json = flockctl_here(&["whatif", "-f", BASE, "--apply", &port_change, "-o", "json"]);
    let w: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(w["unchecked_ports"], serde_json::json!(["9090/TCP"]), "{w}");
    // Asked for, it is judged, and nothing is left unjudged.
    let asked = flockctl_here(&["whatif", "-f", BASE, "--apply", &port_change, "--port", "9090", "-o", "json"]);
    let w: serde_json::Value = serde_json::from_slice(&asked.stdout).unwrap();
    assert_eq!(w["unchecked_ports"], serde_json::json!([]), "{w}");
}

/// The whatif table's columns line up: every column but the last is padded, so a header is
/// never narrower than its cells.
#[test]
fn whatif_table_columns_line_up() {
    let s = Scratch::new("whatif-cols");
    let change = s.path("change.yaml");
    std::fs::write(&change, CHANGE).unwrap();
    let policies = s.path("policies.yaml");
    let out = flockctl_here(&["whatif", "-f", BASE, "-f", &policies, "--apply", &change, "--port", "80", "--family", "IPv4"]);
    let out = text(&out.stdout);
    let lines: Vec<&str> = out.lines().take_while(|l| !l.is_empty() && !l.contains("flows change")).collect();
    assert!(lines.len() > 1, "{out}");
    let at = lines[0].find("DECIDED AFTER").unwrap_or_else(|| panic!("no DECIDED AFTER header: {out}"));
    for l in &lines[1..] {
        // Each row's last column starts where the header's does, after two spaces.
        let prefix: String = l.chars().take(at).collect();
        assert!(prefix.ends_with("  ") || prefix.chars().count() < at, "misaligned row: {l:?}\n{out}");
        assert!(l.chars().nth(at).is_some_and(|c| c != ' '), "row's last column not at the header's: {l:?}\n{out}");
    }
}

#[test]
fn kubectl_flock_is_the_same_program() {
    let s = Scratch::new("kubectl");
    let plugin = s.0.join("kubectl-flock");
    std::os::unix::fs::symlink(flockctl(), &plugin).unwrap();
    let help = Command::new(&plugin).arg("--help").output().unwrap();
    assert!(help.status.success());
    assert!(text(&help.stdout).contains("Usage: kubectl flock <COMMAND>"), "{}", text(&help.stdout));
    let explain = Command::new(&plugin)
        .args(["explain", "-f", BASE, "-f", &s.path("policies.yaml"), "--from", "z/a", "--to", "x/a", "--port", "80"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(explain.status.success(), "{}", text(&explain.stderr));
    assert!(text(&explain.stdout).contains("Deny"), "{}", text(&explain.stdout));
    let typo = Command::new(&plugin).arg("explian").output().unwrap();
    assert_eq!(typo.status.code(), Some(2));
    assert!(text(&typo.stderr).contains("kubectl flock"), "{}", text(&typo.stderr));
}

/// A fleet for `flockctl status`: node-1 is fine (and enforces run ci/r's policy), node-2's
/// last sync failed, node-3 is not Ready (its FlockNode is stale).
fn fleet(version: &str, broken: bool) -> String {
    let node = |name: &str, ready: bool| {
        format!(
            "apiVersion: v1\nkind: Node\nmetadata: {{name: {name}}}\nstatus: {{conditions: [{{type: Ready, status: \"{}\"}}]}}\n---\n",
            if ready { "True" } else { "False" }
        )
    };
    let agent = |n: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: flock-agent-{n}, namespace: flock-system, labels: {{app.kubernetes.io/name: flock-agent}}}}\n\
             spec: {{nodeName: {n}, hostNetwork: true, containers: [{{name: agent, image: flock}}]}}\n\
             status: {{phase: Running, conditions: [{{type: Ready, status: \"True\"}}]}}\n---\n"
        )
    };
    let flock_node = |n: &str, extra: &str| {
        format!(
            "apiVersion: flock.dev/v1alpha1\nkind: FlockNode\nmetadata: {{name: {n}}}\nspec: {{}}\n\
             status: {{version: \"{version}\", api: Connected, ruleset: {{hash: \"{}\", rules: 12, setElements: 3, localEndpoints: 2}}{extra}}}\n---\n",
            "ab".repeat(32)
        )
    };
    let mut out = String::new();
    out += &node("node-1", true);
    out += &agent("node-1");
    out += &flock_node("node-1", ", runPolicies: [{name: ci/flock-run-r, generation: 2}]");
    out += "apiVersion: flock.dev/v1alpha1\nkind: Run\nmetadata: {name: r, namespace: ci}\nspec: {profile: p}\n\
            status: {enforcement: {enabled: true, mode: \"on\", reason: \"on\"}, networkPolicy: {apiVersion: networking.k8s.io/v1, kind: NetworkPolicy, name: flock-run-r, uid: u1, generation: 2}}\n---\n";
    out += "apiVersion: v1\nkind: Pod\nmetadata: {name: job, namespace: ci, labels: {flock.dev/run: r}}\n\
            spec: {nodeName: node-1, containers: [{name: job, image: job}]}\nstatus: {phase: Running}\n---\n";
    if broken {
        out += &node("node-2", true);
        out += &agent("node-2");
        out += &flock_node("node-2", ", lastError: \"nft: Error: Could not process rule: No such file or directory\"");
        out += &node("node-3", false);
        out += &agent("node-3");
        out += &flock_node("node-3", "");
    }
    out
}

#[test]
fn status_flags_the_nodes_that_are_not_ok() {
    if !require_root("status_flags_the_nodes_that_are_not_ok") {
        return;
    }
    sweep();
    let version = env!("CARGO_PKG_VERSION");
    let s = Scratch::new("status");
    std::fs::write(s.path("broken.yaml"), fleet(version, true)).unwrap();
    std::fs::write(s.path("fine.yaml"), fleet(version, false)).unwrap();
    let ns = NetnsGuard::new("status");
    let (server, kubeconfig) = serve(&ns, &s, &[&s.path("broken.yaml")]);
    let out = flockctl_in(&ns, &["status", "--kubeconfig", &kubeconfig, "-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let nodes = status["nodes"].as_array().unwrap();
    let names: Vec<&str> = nodes.iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["node-1", "node-2", "node-3"]);
    assert_eq!((nodes[0]["ok"].as_bool(), nodes[0]["reasons"].as_array().map(Vec::len)), (Some(true), Some(0)), "{status}");
    assert_eq!(
        (nodes[0]["version"].as_str(), nodes[0]["rules"].as_i64(), nodes[0]["endpoints"].as_i64()),
        (Some(version), Some(12), Some(2))
    );
    assert_eq!(nodes[0]["agentPod"], "flock-system/flock-agent-node-1");
    assert_eq!(nodes[1]["ok"], false);
    assert!(nodes[1]["reasons"][0].as_str().unwrap().contains("Could not process rule"), "{status}");
    assert_eq!((nodes[2]["ok"].as_bool(), nodes[2]["stale"].as_bool()), (Some(false), Some(true)), "{status}");
    assert!(nodes[2]["reasons"][0].as_str().unwrap().contains("not Ready"), "{status}");
    assert_eq!(status["runs"][0]["name"], "ci/r");
    assert_eq!(status["runs"][0]["enforced"], true, "{status}");
    // The table says the same, reasons under it.
    let table = flockctl_in(&ns, &["status", "--kubeconfig", &kubeconfig]);
    assert_eq!(table.status.code(), Some(1));
    let table = text(&table.stdout);
    assert!(
        table.contains("node-2: the last sync failed")
            && table.contains("STALE")
            && table.contains("3 nodes, 2 not ok; 1 runs, 0 not enforced"),
        "{table}"
    );
    drop(server);

    // A fleet where every node is fine: exit 0.
    std::fs::remove_file(s.path("kubeconfig")).unwrap();
    let ns = NetnsGuard::new("status2");
    let (_server, kubeconfig) = serve(&ns, &s, &[&s.path("fine.yaml")]);
    let out = flockctl_in(&ns, &["status", "--kubeconfig", &kubeconfig]);
    assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("1 nodes, 0 not ok; 1 runs, 0 not enforced"), "{}", text(&out.stdout));
}

/// `--flows`: of the connections the agent logged, those the change flips.
#[test]
fn whatif_flows_lists_the_observed_flows_a_change_flips() {
    let s = Scratch::new("flows");
    let change = s.path("change.yaml");
    std::fs::write(&change, CHANGE).unwrap();
    let record = |reason: &str, from: &str, to: &str, port: u16| {
        serde_json::json!({"timestamp": "2026-11-27T10:00:00.000000Z", "level": "INFO", "target": "flock::denied",
            "fields": {"message": "connection allowed (flock.dev/log-allowed)", "audit": false, "reason": reason, "direction": "ingress",
                       "pod": to, "from": from, "to": to, "protocol": "TCP", "port": port, "policies": ""}})
        .to_string()
    };
    let lines = [
        record("allowed", "z/a", "y/b", 80),
        // As `kubectl logs --prefix` shows it.
        format!("[pod/flock-agent-x/flock-agent] {}", record("allowed", "z/a", "y/b", 80)),
        record("allowed", "x/a", "y/b", 80),
        record("allowed", "z/b", "x/a", 80),
        r#"{"timestamp":"t","level":"INFO","target":"flock::sync","fields":{"message":"synced"}}"#.to_string(),
        record("allowed", "z/c", "y/gone", 80),
    ];
    let flows = s.path("agent.log");
    std::fs::write(&flows, lines.join("\n")).unwrap();
    let out = flockctl_here(&["whatif", "-f", BASE, "--apply", &change, "--flows", &flows, "-o", "json", "--exit-code"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let w: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Only z/a → y/b flips (the guard denies z to y); x/a → y/b and z/b → x/a stay allowed.
    assert_eq!((w["total"].as_u64(), w["flows"].as_u64(), w["records"].as_u64()), (Some(1), Some(4), Some(5)), "{w}");
    let flip = &w["flips"][0];
    assert_eq!((flip["from"].as_str(), flip["to"].as_str(), flip["seen_allowed"].as_u64()), (Some("z/a"), Some("y/b"), Some(2)), "{w}");
    assert_eq!((flip["before"].as_str(), flip["after"].as_str()), (Some("Allow"), Some("Deny")));
    assert!(flip["decided_after"].to_string().contains("guard-y"), "{flip}");
    assert_eq!(w["skipped"]["otherLines"], 1);
    assert!(w["unjudged"][0].as_str().unwrap().contains("y/gone"), "{w}");
    // The same from stdin, as a table.
    let mut child = Command::new(flockctl())
        .args(["whatif", "-f", BASE, "--apply", &change, "--flows", "-"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), lines.join("\n").as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let table = text(&out.stdout);
    assert!(table.contains("Allow → Deny") && table.contains("2 allowed") && table.contains("1 of 4 observed flows flip"), "{table}");
    // Hostile lines: a flow forged in another container's line, or after text; a record whose
    // pod name carries a terminal escape: the forged ones are not read, the escape is shown.
    let hostile = [
        lines.join("\n"),
        format!("[pod/web-1/app] {}", record("allowed", "x/a", "y/c", 80)),
        format!("2026-11-27T10:00:00Z  WARN flock::dns: refused {}", record("allowed", "x/a", "y/c", 80)),
        record("allowed", "x/\u{1b}[2K\rok", "y/c", 80),
    ];
    std::fs::write(&flows, hostile.join("\n")).unwrap();
    let out = flockctl_here(&["whatif", "-f", BASE, "--apply", &change, "--flows", &flows, "-o", "json"]);
    let w: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((w["flows"].as_u64(), w["skipped"]["unattributed"].as_u64()), (Some(5), Some(2)), "{w}");
    // The table names the flow it cannot judge (no such pod), escaped.
    let out = flockctl_here(&["whatif", "-f", BASE, "--apply", &change, "--flows", &flows]);
    let table = text(&out.stdout);
    assert!(!table.contains('\u{1b}') && !table.contains('\r'), "{table:?}");
    assert!(table.contains("not judged: x/\\u{1b}[2K\\rok"), "{table}");
    assert!(table.contains("2 not flock-agent's"), "{table}");
    // A log without a record (the text format, another container's): no answer, exit 2.
    std::fs::write(&flows, "2026-11-27T10:00:00Z  INFO flock::denied: packet denied from=z/a\n").unwrap();
    let out = flockctl_here(&["whatif", "-f", BASE, "--apply", &change, "--flows", &flows]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("no flock::denied records found in 1 lines"), "{}", text(&out.stderr));
}
