//! deploy/ is consistent with the binaries: every kustomization resource exists and is
//! readable, the DaemonSet and the Deployment have flock's install identity, their
//! environment variables are flags the binaries understand, and the RBAC grants only what
//! each uses (for flock-controller, tests/controller_reconcile.rs also checks every request
//! it makes against deploy/controller/rbac.yaml). (Schema validation of the manifests is
//! tests/lint-deploy.sh.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/controller.rs"]
mod common;
use common::{grants, root, yaml_docs as docs};

#[test]
fn kustomization_resources_exist_and_parse() {
    for dir in ["deploy/agent", "deploy/controller"] {
        let k = &docs(&root().join(dir).join("kustomization.yaml"))[0];
        for r in k["resources"].as_sequence().unwrap() {
            let p = root().join(dir).join(r.as_str().unwrap());
            assert!(!docs(&p).is_empty(), "{} is empty", p.display());
        }
    }
}

#[test]
fn daemonset_has_the_install_identity_and_known_flags() {
    let ds = docs(&root().join("deploy/agent/daemonset.yaml")).remove(0);
    assert_eq!(ds["metadata"]["namespace"], "flock-system");
    assert_eq!(ds["metadata"]["name"], "flock-agent");
    assert_eq!(ds["metadata"]["labels"]["app.kubernetes.io/name"], "flock-agent");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"], true);
    let c = &spec["containers"][0];
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_flock-agent")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for env in c["env"].as_sequence().unwrap() {
        let name = env["name"].as_str().unwrap();
        assert!(help.contains(&format!("[env: {name}")), "flock-agent has no flag for {name}");
    }
    // Mounts for the socket, the state, the CNI config and binaries, and /run/netns.
    let mounts: Vec<&str> = c["volumeMounts"].as_sequence().unwrap().iter().map(|m| m["mountPath"].as_str().unwrap()).collect();
    for m in ["/run/flock", "/var/lib/flock", "/etc/cni/net.d", "/opt/cni/bin", "/run/netns"] {
        assert!(mounts.contains(&m), "{m} not mounted");
    }
    assert_eq!(spec["initContainers"][0]["name"], "install-cni");
    assert_eq!(spec["tolerations"][0]["operator"], "Exists");
}

#[test]
fn cluster_role_grants_only_what_the_agent_uses() {
    let got = grants("deploy/agent/rbac.yaml", &["ClusterRole", "Role"]);
    let mut want: Vec<String> = ["/pods", "/namespaces", "/nodes", "networking.k8s.io/networkpolicies"]
        .iter()
        .flat_map(|r| ["get", "list", "watch"].iter().map(move |v| format!("cluster {r}:{v}")))
        .chain(
            [
                "cluster events.k8s.io/events:get",
                "cluster events.k8s.io/events:create",
                "cluster events.k8s.io/events:patch",
                "flock-system coordination.k8s.io/leases:create",
                "flock-system coordination.k8s.io/leases:get/flock-agent-reporter",
                "flock-system coordination.k8s.io/leases:update/flock-agent-reporter",
            ]
            .map(String::from),
        )
        .collect();
    want.sort();
    assert_eq!(got, want);
    // Every role is bound to the agent's ServiceAccount, in the role's namespace.
    let all = docs(&root().join("deploy/agent/rbac.yaml"));
    for role in all.iter().filter(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole") {
        let binding_kind = if role["kind"] == "Role" { "RoleBinding" } else { "ClusterRoleBinding" };
        let b = all
            .iter()
            .find(|b| {
                b["kind"] == binding_kind
                    && b["roleRef"]["name"] == role["metadata"]["name"]
                    && b["metadata"]["namespace"] == role["metadata"]["namespace"]
            })
            .unwrap_or_else(|| panic!("no binding for {:?}", role["metadata"]["name"]));
        assert_eq!(b["subjects"][0]["name"], "flock-agent");
        assert_eq!(b["subjects"][0]["namespace"], "flock-system");
    }
}

#[test]
fn controller_deployment_has_the_install_identity_and_known_flags() {
    let d = docs(&root().join("deploy/controller/deployment.yaml")).remove(0);
    assert_eq!(d["kind"], "Deployment");
    assert_eq!(d["metadata"]["namespace"], "flock-system");
    assert_eq!(d["metadata"]["name"], "flock-controller");
    assert_eq!(d["metadata"]["labels"]["app.kubernetes.io/name"], "flock-controller");
    let spec = &d["spec"]["template"]["spec"];
    assert_eq!(spec["serviceAccountName"], "flock-controller");
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    let c = &spec["containers"][0];
    assert_eq!(c["command"][0], "/usr/local/bin/flock-controller");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_flock-controller")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for env in c["env"].as_sequence().unwrap() {
        let name = env["name"].as_str().unwrap();
        assert!(help.contains(&format!("[env: {name}")), "flock-controller has no flag for {name}");
    }
    // The namespace is the agent's, byte for byte (either kustomization may come first).
    let read = |p: &str| std::fs::read_to_string(root().join(p)).unwrap();
    assert_eq!(read("deploy/controller/namespace.yaml"), read("deploy/agent/namespace.yaml"));
    // The generated CRDs and the binary agree.
    let crds = std::process::Command::new(env!("CARGO_BIN_EXE_flock-controller")).arg("--print-crds").output().unwrap();
    let crds = String::from_utf8_lossy(&crds.stdout);
    for f in ["runprofiles.flock.dev.yaml", "runs.flock.dev.yaml"] {
        assert!(crds.contains(&read(&format!("deploy/controller/crds/{f}"))), "{f} differs from --print-crds");
    }
}

#[test]
fn controller_rbac_grants_only_what_it_uses() {
    let got = grants("deploy/controller/rbac.yaml", &["ClusterRole", "Role"]);
    let mut want: Vec<String> = [
        "cluster flock.dev/runs:get",
        "cluster flock.dev/runs:list",
        "cluster flock.dev/runs:watch",
        "cluster flock.dev/runs/status:patch",
        "cluster flock.dev/runprofiles:get",
        "cluster flock.dev/runprofiles:list",
        "cluster flock.dev/runprofiles:watch",
        "cluster flock.dev/runprofiles/status:patch",
        "cluster events.k8s.io/events:create",
        "flock-system coordination.k8s.io/leases:create",
        "flock-system coordination.k8s.io/leases:get/flock-controller",
        "flock-system coordination.k8s.io/leases:update/flock-controller",
        "flock-system apps/daemonsets:get/flock-agent",
        "kube-system /pods:list",
        "default discovery.k8s.io/endpointslices:list",
        "default discovery.k8s.io/endpointslices:watch",
    ]
    .iter()
    .map(ToString::to_string)
    .chain(
        ["networking.k8s.io/networkpolicies", "cilium.io/ciliumnetworkpolicies"]
            .iter()
            .flat_map(|r| ["get", "list", "watch", "create", "patch", "delete"].iter().map(move |v| format!("cluster {r}:{v}"))),
    )
    .collect();
    want.sort();
    assert_eq!(got, want);
    // Every role is bound to the controller's ServiceAccount, in the role's namespace.
    let all = docs(&root().join("deploy/controller/rbac.yaml"));
    for role in all.iter().filter(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole") {
        let binding_kind = if role["kind"] == "Role" { "RoleBinding" } else { "ClusterRoleBinding" };
        let b = all
            .iter()
            .find(|b| {
                b["kind"] == binding_kind
                    && b["roleRef"]["name"] == role["metadata"]["name"]
                    && b["metadata"]["namespace"] == role["metadata"]["namespace"]
            })
            .unwrap_or_else(|| panic!("no binding for {:?}", role["metadata"]["name"]));
        assert_eq!(b["subjects"][0]["name"], "flock-controller");
        assert_eq!(b["subjects"][0]["namespace"], "flock-system");
    }
}
