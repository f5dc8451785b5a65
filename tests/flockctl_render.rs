//! `flockctl render` end to end through the built binary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

use flock::testkit::kernel::require_root;

fn flockctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flockctl")).args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

#[test]
fn renders_the_quickstart_like_the_library() {
    let out = flockctl(&["render", "--manifests", "deploy/examples/quickstart", "--node", "node-1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let m = flock::source::files::load_manifests(&[Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/quickstart")]).unwrap();
    let s = m.to_snapshot();
    let want = flock::render::render(&flock::translate::translate(&s, &s.derived_endpoints("node-1"), &Default::default())).to_text();
    assert_eq!(stdout, want);
    assert!(stdout.contains("ingress policy of pod shop/db"));
}

#[test]
fn repeatable_manifests_and_the_base_cluster() {
    let dir = tempdir("repeat");
    std::fs::write(
        dir.join("p.yaml"),
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: x}\nspec: {podSelector: {}}\n",
    )
    .unwrap();
    let p = dir.join("p.yaml");
    let out = flockctl(&["render", "-f", "tests/conformance/base-cluster.yaml", "-f", p.to_str().unwrap(), "--node", "node-2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("ingress policy of pod x/b"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_input_names_file_document_and_field() {
    let dir = tempdir("bad");
    let f = dir.join("bad.yaml");
    std::fs::write(
        &f,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: x}\nspec: {containers: [{name: c, ports: [{containerPort: http}]}]}\n",
    )
    .unwrap();
    let out = flockctl(&["render", "-f", f.to_str().unwrap(), "--node", "n"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "nothing rendered on error");
    let err = text(&out.stderr);
    assert!(err.contains("bad.yaml: document 2: Pod a: spec.containers[0].ports[0].containerPort"), "{err}");

    let out = flockctl(&["render", "-f", dir.join("missing.yaml").to_str().unwrap(), "--node", "n"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("missing.yaml"), "{err}");
    // The cause once, not once per layer of the error chain.
    assert_eq!(err.matches("(os error 2)").count(), 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    let out = flockctl(&["render", "-f", "tests/conformance/base-cluster.yaml", "--node", "node-9"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("known nodes: node-1, node-2"), "{}", text(&out.stderr));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn policy_problems_are_warnings_and_still_isolate() {
    let dir = tempdir("warn");
    let f = dir.join("p.yaml");
    std::fs::write(
        &f,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: broken, namespace: x}\nspec:\n  podSelector: {matchLabels: {pod: a}}\n  ingress: [{ports: [{port: 80, endPort: 70}]}]\n",
    )
    .unwrap();
    let out = flockctl(&["render", "-f", "tests/conformance/base-cluster.yaml", "-f", f.to_str().unwrap(), "--node", "node-1"]);
    assert!(out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("warning: NetworkPolicy x/broken: spec.ingress[0].ports[0].endPort: 70 must be greater"), "{err}");
    let stdout = text(&out.stdout);
    assert!(stdout.contains("ingress policy of pod x/a"), "x/a stays isolated");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn check_validates_with_nft_in_an_empty_namespace() {
    if !require_root("check_validates_with_nft_in_an_empty_namespace") {
        return;
    }
    let out = flockctl(&[
        "render",
        "-f",
        "tests/conformance/base-cluster.yaml",
        "-f",
        "deploy/examples/quickstart/policies.yaml",
        "--node",
        "node-1",
        "--check",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("nft -c: ok"), "{}", text(&out.stderr));
}

fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("flockctl-test-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
