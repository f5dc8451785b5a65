//! Every binary prints the error it exits with as one chain, each cause once: a missing
//! file is `…: No such file or directory (os error 2)`, not that text once per layer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

/// The last line of stderr (the daemons log before they fail), checked to name the failure
/// and hold the missing file's error exactly once.
fn failure(out: &Output, what: &str) -> String {
    assert!(!out.status.success(), "{what} did not fail");
    let err = text(&out.stderr);
    let last = err.lines().last().unwrap_or_default().to_string();
    assert!(last.contains(what), "{err}");
    assert_eq!(last.matches("(os error 2)").count(), 1, "{last}");
    last
}

/// A daemon run outside a cluster, with `KUBECONFIG` naming a file that does not exist.
fn daemon_without_kubeconfig(exe: &str, args: &[&str]) -> Output {
    let dir = std::env::temp_dir().join(format!("flock-error-chains-{}", std::process::id()));
    Command::new(exe)
        .args(args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("KUBECONFIG", dir.join("no-such-kubeconfig"))
        .env("FLOCK_LOG_FORMAT", "text")
        .output()
        .unwrap()
}

#[test]
fn flockctl_prints_each_cause_once() {
    let exe = env!("CARGO_BIN_EXE_flockctl");
    let out = Command::new(exe).args(["render", "-f", "/nonexistent/flock/pods.yaml", "--node", "n"]).output().unwrap();
    let last = failure(&out, "error: reading manifests: cannot read /nonexistent/flock/pods.yaml");
    assert!(last.ends_with("No such file or directory (os error 2)"), "{last}");
    let out = Command::new(exe).args(["conformance", "/nonexistent/flock/cases"]).output().unwrap();
    if nix::unistd::geteuid().is_root() {
        // (Without root, the preflight fails first.)
        failure(&out, "error: cannot read /nonexistent/flock/cases");
    }
    // On a real cluster: the kubeconfig, and a prefix the API would refuse, are named
    // before anything is created.
    let cases = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/conformance/001-deny-all-ingress-in-x");
    let out = Command::new(exe).args(["conformance", "--kubeconfig", "/nonexistent/flock/kubeconfig", cases]).output().unwrap();
    failure(&out, "kubeconfig /nonexistent/flock/kubeconfig");
    let out = Command::new(exe).args(["conformance", "--kubeconfig", "/dev/null", "--namespace-prefix", "Bad_", cases]).output().unwrap();
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("error: --namespace-prefix \"Bad_\": lowercase letters"), "{}", text(&out.stderr));
}

#[test]
fn flock_agent_prints_each_cause_once() {
    let out = daemon_without_kubeconfig(env!("CARGO_BIN_EXE_flock-agent"), &["--node-name", "n1"]);
    let last = failure(&out, "flock-agent failed: building the Kubernetes client");
    assert!(last.contains("no-such-kubeconfig"), "{last}");
}

#[test]
fn flock_controller_prints_each_cause_once() {
    let out = daemon_without_kubeconfig(env!("CARGO_BIN_EXE_flock-controller"), &[]);
    let last = failure(&out, "flock-controller failed: reading the Kubernetes client configuration");
    assert!(last.contains("no-such-kubeconfig"), "{last}");
}
