//! deploy/ is consistent with the binaries: every kustomization resource exists and is
//! readable, the DaemonSet and the Deployment have flock's install identity, their
//! environment variables are flags the binaries understand, and the RBAC grants only what
//! each uses (for flock-controller, tests/controller_reconcile.rs also checks every request
//! it makes against deploy/controller/rbac.yaml). The Dockerfile, which cannot be built
//! here, is checked by reading it: pinned bases, the dependency layer before the sources,
//! a controller image without nft that runs as a non-root user, an agent image with nft and
//! ip, stages that exist, and the images the manifests name built by one of its targets.
//! (Schema validation of the manifests, and hadolint, are tests/lint-deploy.sh.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "common/controller.rs"]
mod common;
use common::{grants, root, yaml_docs as docs};
use std::path::Path;

#[test]
fn kustomization_resources_exist_and_parse() {
    for dir in ["deploy/agent", "deploy/controller"] {
        let k = &docs(&root().join(dir).join("kustomization.yaml"))[0];
        for r in k["resources"].as_array().unwrap() {
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
    for env in c["env"].as_array().unwrap() {
        let name = env["name"].as_str().unwrap();
        assert!(help.contains(&format!("[env: {name}")), "flock-agent has no flag for {name}");
    }
    // Mounts for the socket, the state, the CNI config and binaries. Not /run/netns:
    // flock-cni enters pods' namespaces on the host, and the agent opens none.
    let mounts: Vec<&str> = c["volumeMounts"].as_array().unwrap().iter().map(|m| m["mountPath"].as_str().unwrap()).collect();
    for m in ["/run/flock", "/var/lib/flock", "/etc/cni/net.d", "/opt/cni/bin"] {
        assert!(mounts.contains(&m), "{m} not mounted");
    }
    assert!(!mounts.iter().any(|m| m.contains("netns")), "{mounts:?}");
    assert_eq!(spec["initContainers"][0]["name"], "install-cni");
    assert_eq!(spec["tolerations"][0]["operator"], "Exists");
    // Exactly the capabilities the agent uses: NET_ADMIN (nft, routes, conntrack, NFLOG,
    // transparent sockets) and NET_BIND_SERVICE (the DNS proxy answers from port 53 of the
    // resolver's address: without it every answer failed with EACCES on a real cluster).
    assert_eq!(c["securityContext"]["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(c["securityContext"]["capabilities"]["add"], serde_json::json!(["NET_ADMIN", "NET_BIND_SERVICE"]));
}

/// The socket keeper is its own DaemonSet that an agent rollout does not restart (OnDelete),
/// with no capability, host network or API token, and the agent is pointed at its socket.
#[test]
fn socket_keeper_outlives_agent_rollouts_with_nothing_it_does_not_need() {
    let ds = docs(&root().join("deploy/agent/socket-keeper.yaml")).remove(0);
    assert_eq!((ds["kind"].as_str(), ds["metadata"]["namespace"].as_str()), (Some("DaemonSet"), Some("flock-system")));
    assert_eq!(ds["spec"]["updateStrategy"]["type"], "OnDelete");
    let spec = &ds["spec"]["template"]["spec"];
    assert!(spec["hostNetwork"].is_null() || spec["hostNetwork"] == false);
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert_eq!(spec["tolerations"][0]["operator"], "Exists");
    let c = &spec["containers"][0];
    assert_eq!(c["command"][0], "/usr/local/bin/flock-socket-keeper");
    assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
    assert!(c["securityContext"]["capabilities"]["add"].is_null());
    let env = |c: &serde_json::Value, name: &str| -> Option<String> {
        c["env"].as_array()?.iter().find(|e| e["name"] == name).and_then(|e| e["value"].as_str().map(String::from))
    };
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_flock-socket-keeper")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for e in c["env"].as_array().unwrap() {
        let name = e["name"].as_str().unwrap();
        assert!(help.contains(&format!("[env: {name}")), "flock-socket-keeper has no flag for {name}");
    }
    let agent = docs(&root().join("deploy/agent/daemonset.yaml")).remove(0);
    let socket = env(c, "FLOCK_SOCKET_KEEPER").unwrap();
    assert_eq!(env(&agent["spec"]["template"]["spec"]["containers"][0], "FLOCK_DNS_SOCKET_KEEPER"), Some(socket.clone()));
    assert_eq!(socket, flock::dns_proxy::keeper::DEFAULT_SOCKET);
    // The same hostPath as the agent's /run/flock.
    assert_eq!(c["volumeMounts"][0]["mountPath"], "/run/flock");
    assert_eq!(spec["volumes"][0]["hostPath"]["path"], "/run/flock");
    // The agent and the keeper run as one user: the keeper serves only its own.
    assert_eq!(c["securityContext"]["runAsUser"], agent["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsUser"]);
}

#[test]
fn cluster_role_grants_only_what_the_agent_uses() {
    let got = grants("deploy/agent/rbac.yaml", &["ClusterRole", "Role"]);
    let mut want: Vec<String> =
        ["/pods", "/namespaces", "/nodes", "networking.k8s.io/networkpolicies", "policy.networking.k8s.io/clusternetworkpolicies"]
            .iter()
            .flat_map(|r| ["get", "list", "watch"].iter().map(move |v| format!("cluster {r}:{v}")))
            .chain(
                [
                    "cluster events.k8s.io/events:get",
                    "cluster events.k8s.io/events:create",
                    "cluster events.k8s.io/events:patch",
                    "cluster policy.networking.k8s.io/clusternetworkpolicies/status:patch",
                    "cluster flock.dev/flocknodes:create",
                    "cluster flock.dev/flocknodes:get",
                    "cluster flock.dev/flocknodes:patch",
                    "cluster flock.dev/flocknodes/status:patch",
                    "flock-system coordination.k8s.io/leases:create",
                    "flock-system coordination.k8s.io/leases:get/flock-agent-reporter",
                    "flock-system coordination.k8s.io/leases:update/flock-agent-reporter",
                    // Its own DaemonSet, watched to tell flock's removal from a restart.
                    "flock-system apps/daemonsets:get/flock-agent",
                    "flock-system apps/daemonsets:list/flock-agent",
                    "flock-system apps/daemonsets:watch/flock-agent",
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
    // Nothing to write, nothing to escalate to.
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
    assert!(c["securityContext"]["capabilities"]["add"].is_null());
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_flock-controller")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for env in c["env"].as_array().unwrap() {
        let name = env["name"].as_str().unwrap();
        assert!(help.contains(&format!("[env: {name}")), "flock-controller has no flag for {name}");
    }
    // The namespace is the agent's, byte for byte (either kustomization may come first).
    let read = |p: &str| std::fs::read_to_string(root().join(p)).unwrap();
    assert_eq!(read("deploy/controller/namespace.yaml"), read("deploy/agent/namespace.yaml"));
    // The generated CRDs and the binary agree.
    let crds = std::process::Command::new(env!("CARGO_BIN_EXE_flock-controller")).arg("--print-crds").output().unwrap();
    let crds = String::from_utf8_lossy(&crds.stdout);
    for f in [
        "controller/crds/runprofiles.flock.dev.yaml",
        "controller/crds/runs.flock.dev.yaml",
        "controller/crds/auditevents.flock.dev.yaml",
        "agent/crds/flocknodes.flock.dev.yaml",
    ] {
        assert!(crds.contains(&read(&format!("deploy/{f}"))), "{f} differs from --print-crds");
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
        "cluster flock.dev/runprofiles:list",
        "cluster flock.dev/runprofiles:watch",
        "cluster flock.dev/runprofiles/status:patch",
        "cluster /pods:list",
        "cluster /pods:watch",
        "cluster flock.dev/flocknodes:list",
        "cluster flock.dev/flocknodes:watch",
        "cluster flock.dev/auditevents:create",
        "cluster flock.dev/auditevents:list",
        "cluster flock.dev/auditevents:delete",
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

// ---- Dockerfile ---------------------------------------------------------------------------

/// One instruction, continuation lines joined (and comment lines inside them dropped).
#[derive(Debug)]
struct Instruction {
    keyword: String,
    args: String,
}

/// A build stage: `FROM base AS name` and its instructions.
#[derive(Debug)]
struct Stage {
    name: String,
    base: String,
    instructions: Vec<Instruction>,
}

impl Stage {
    fn all<'a>(&'a self, keyword: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.instructions.iter().filter(move |i| i.keyword == keyword).map(|i| i.args.as_str())
    }

    /// The index of the first instruction whose keyword and arguments match.
    fn position(&self, keyword: &str, f: impl Fn(&str) -> bool) -> Option<usize> {
        self.instructions.iter().position(|i| i.keyword == keyword && f(&i.args))
    }
}

struct Dockerfile {
    stages: Vec<Stage>,
    /// The header's `docker build [--target T] -t IMAGE[:TAG] .` lines, as (image, target).
    builds: Vec<(String, String)>,
}

impl Dockerfile {
    fn read() -> Self {
        let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
        let mut stages: Vec<Stage> = Vec::new();
        let mut builds = Vec::new();
        let mut pending = String::new();
        for line in text.lines() {
            let trimmed = line.trim();
            if let Some(comment) = trimmed.strip_prefix('#') {
                let words: Vec<&str> = comment.split_whitespace().collect();
                if words.starts_with(&["docker", "build"]) && pending.is_empty() {
                    let after = |flag: &str| words.iter().position(|w| *w == flag).map(|i| words[i + 1].to_string());
                    // A build without -t writes files out (the symbols), no image.
                    if let Some(image) = after("-t") {
                        let name = image.rsplit_once(':').map_or(image.as_str(), |(n, _)| n).to_string();
                        builds.push((name, after("--target").unwrap_or_else(|| "(default)".into())));
                    }
                }
                continue;
            }
            if trimmed.is_empty() {
                continue;
            }
            pending.push_str(trimmed.strip_suffix('\\').unwrap_or(trimmed));
            pending.push(' ');
            if trimmed.ends_with('\\') {
                continue;
            }
            let full = std::mem::take(&mut pending);
            let (keyword, args) = full.trim().split_once(' ').unwrap();
            let (keyword, args) = (keyword.to_uppercase(), args.trim().to_string());
            if keyword == "FROM" {
                let words: Vec<&str> = args.split_whitespace().collect();
                assert!(words.len() == 3 && words[1].eq_ignore_ascii_case("as"), "every stage is named: FROM {args}");
                stages.push(Stage { name: words[2].to_string(), base: words[0].to_string(), instructions: Vec::new() });
            } else {
                stages.last_mut().expect("FROM first").instructions.push(Instruction { keyword, args });
            }
        }
        assert!(pending.is_empty(), "a dangling continuation");
        // The default target is the last stage.
        let last = stages.last().unwrap().name.clone();
        for b in &mut builds {
            if b.1 == "(default)" {
                b.1 = last.clone();
            }
        }
        Self { stages, builds }
    }

    fn stage(&self, name: &str) -> &Stage {
        self.stages.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no stage {name}"))
    }

    /// `name` and the stages it is built on, base first.
    fn chain(&self, name: &str) -> Vec<&Stage> {
        let stage = self.stage(name);
        let mut chain = match self.stages.iter().any(|s| s.name == stage.base) {
            true => self.chain(&stage.base),
            false => Vec::new(),
        };
        chain.push(stage);
        chain
    }

    /// The files a stage has under /usr/local/bin: what its chain copies there.
    fn binaries(&self, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        for stage in self.chain(name) {
            for copy in stage.all("COPY") {
                let words: Vec<&str> = copy.split_whitespace().filter(|w| !w.starts_with("--")).collect();
                let (dest, sources) = words.split_last().unwrap();
                if let Some(dir) = dest.strip_suffix('/') {
                    out.extend(sources.iter().map(|s| format!("{dir}/{}", s.rsplit('/').next().unwrap())));
                } else {
                    out.push(dest.to_string());
                }
            }
        }
        out
    }
}

#[test]
fn dockerfile_bases_are_pinned_and_stages_exist() {
    let d = Dockerfile::read();
    let mut seen: Vec<&str> = Vec::new();
    for stage in &d.stages {
        assert!(!seen.contains(&stage.name.as_str()), "stage {} twice", stage.name);
        if !seen.contains(&stage.base.as_str()) {
            // An image: a version tag or a digest, never latest or none.
            let base = &stage.base;
            let tag = base.rsplit('/').next().unwrap().split_once(':').map(|(_, t)| t);
            // `scratch` is no image, only the empty start of one.
            let pinned =
                base == "scratch" || base.contains("@sha256:") || tag.is_some_and(|t| t.chars().next().is_some_and(|c| c.is_ascii_digit()));
            assert!(pinned && !base.contains("latest"), "stage {}: base image {base} is not pinned to a version or digest", stage.name);
        }
        for copy in stage.all("COPY") {
            if let Some(from) = copy.split_whitespace().find_map(|w| w.strip_prefix("--from=")) {
                assert!(seen.contains(&from), "stage {}: COPY --from={from} names no earlier stage", stage.name);
            }
        }
        seen.push(&stage.name);
    }
    // `docker build .` (deploy/kind/run.sh) builds the agent image.
    assert_eq!(d.stages.last().unwrap().name, "agent");
    // No version pins of Debian packages (they break with every point release).
    for stage in &d.stages {
        for run in stage.all("RUN").filter(|r| r.contains("apt-get install")) {
            assert!(!run.contains('='), "stage {}: apt packages are pinned by the suite, not by version: {run}", stage.name);
        }
    }
}

#[test]
fn dockerfile_builds_dependencies_before_copying_the_sources() {
    let d = Dockerfile::read();
    // The stage the images copy their binaries from.
    let from = d.stage("agent").all("COPY").find_map(|c| c.split_whitespace().find_map(|w| w.strip_prefix("--from="))).unwrap();
    let build = d.stage(from);
    let cook = build.position("RUN", |r| r.contains("cargo chef cook")).expect("a dependency layer (cargo chef cook)");
    let sources = build.position("COPY", |c| !c.contains("--from=")).expect("the sources copied");
    let compile = build.position("RUN", |r| r.contains("cargo build")).expect("cargo build");
    assert!(cook < sources && sources < compile, "dependencies, then sources, then the build: {:?}", build.instructions);
    assert!(
        build.instructions[..cook].iter().all(|i| i.keyword != "COPY" || i.args.contains("recipe.json")),
        "only the recipe before the dependency layer"
    );
    // The recipe is prepared from the whole context in a stage of its own.
    let recipe = build.all("COPY").find(|c| c.contains("recipe.json")).unwrap();
    let planner = d.stage(recipe.split_whitespace().find_map(|w| w.strip_prefix("--from=")).unwrap());
    assert!(planner.all("RUN").any(|r| r.contains("cargo chef prepare")));
    for flag in ["--release", "--locked"] {
        assert!(build.all("RUN").all(|r| !r.contains("cargo ") || r.contains("cargo install") || r.contains(flag)), "cargo without {flag}");
    }
    // What the images copy from it, it builds.
    let compile = &build.instructions[compile].args;
    for image in ["agent", "controller"] {
        for copy in d.stage(image).all("COPY").filter(|c| c.contains(&format!("--from={from}"))) {
            for src in copy.split_whitespace().filter(|w| w.starts_with("/out/")) {
                let bin = src.trim_start_matches("/out/");
                // Built, and split into the shipped binary and its debug info.
                let split = compile.split_once("deploy/split-debuginfo.sh target/release /out").map(|(_, bins)| bins);
                assert!(
                    compile.contains(&format!("--bin {bin}")) && split.is_some_and(|b| b.split_whitespace().any(|w| w == bin)),
                    "{bin} is not built"
                );
            }
        }
    }
}

#[test]
fn dockerfile_controller_image_has_no_nft_and_no_root() {
    let d = Dockerfile::read();
    let chain = d.chain("controller");
    for stage in &chain {
        for run in stage.all("RUN") {
            for tool in ["nftables", "nft", "iproute2"] {
                assert!(!run.split_whitespace().any(|w| w == tool), "the controller image installs {tool}: {run}");
            }
        }
    }
    let user = chain.iter().flat_map(|s| s.all("USER")).last().expect("the controller image sets USER");
    let uid = user.split(':').next().unwrap();
    assert!(uid != "root" && uid != "0", "USER {user}");
    assert_eq!(d.binaries("controller"), ["/usr/local/bin/flock-controller"]);
    assert!(chain.last().unwrap().all("ENTRYPOINT").last().unwrap().contains("/usr/local/bin/flock-controller"));
    // The Deployment runs it as the same user.
    let dep = docs(&root().join("deploy/controller/deployment.yaml")).remove(0);
    let run_as = dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"].as_u64().unwrap();
    assert_eq!(uid, run_as.to_string());
}

#[test]
fn dockerfile_agent_image_has_nft_and_ip() {
    let d = Dockerfile::read();
    let chain = d.chain("agent");
    let installs: Vec<&str> = chain.iter().flat_map(|s| s.all("RUN")).filter(|r| r.contains("apt-get install")).collect();
    for package in ["nftables", "iproute2"] {
        assert!(installs.iter().any(|r| r.split_whitespace().any(|w| w == package)), "the agent image lacks {package}");
    }
    let bins = d.binaries("agent");
    for bin in ["flock-agent", "flock-cni", "flockctl", "flock-socket-keeper"] {
        assert!(bins.contains(&format!("/usr/local/bin/{bin}")), "{bin} not in the agent image: {bins:?}");
    }
    assert!(!bins.iter().any(|b| b.ends_with("flock-controller")), "the controller has its own image");
    assert!(chain.last().unwrap().all("ENTRYPOINT").last().unwrap().contains("/usr/local/bin/flock-agent"));
    // glibc without fastbins: what `agent_scale` measures the pod ADD latency with.
    assert!(
        chain.iter().flat_map(|s| s.all("ENV")).any(|e| e.contains("GLIBC_TUNABLES=glibc.malloc.mxfast=0")),
        "the agent image does not set GLIBC_TUNABLES=glibc.malloc.mxfast=0"
    );
}

#[test]
fn dockerignore_keeps_build_outputs_and_git_out() {
    let text = std::fs::read_to_string(root().join(".dockerignore")).unwrap();
    let patterns: Vec<&str> =
        text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(|l| l.trim_matches('/')).collect();
    for must in [".git", "target"] {
        assert!(patterns.contains(&must), ".dockerignore does not exclude {must}: {patterns:?}");
    }
    // Nothing the build reads (the workspace members and what their sources include).
    for needed in ["Cargo.toml", "Cargo.lock", "src", "cni-plugin", "tests", "benches", "build.rs", "deploy"] {
        assert!(!patterns.iter().any(|p| p.split('/').next() == Some(needed) || *p == "*"), ".dockerignore excludes {needed}");
    }
}

/// Every flock image a manifest names is built by a Dockerfile target (the header's
/// `docker build` lines) that has the binaries its containers run; the kustomizations
/// retag only those images.
#[test]
fn manifests_name_images_the_dockerfile_builds() {
    let d = Dockerfile::read();
    let target_of = |image: &str| -> String {
        let name = image.rsplit_once(':').map_or(image, |(n, _)| n);
        let (_, target) = d.builds.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no docker build line for {name}"));
        d.stage(target);
        target.clone()
    };
    let mut used = std::collections::BTreeSet::new();
    for dir in ["deploy/agent", "deploy/controller"] {
        let k = &docs(&root().join(dir).join("kustomization.yaml"))[0];
        let mut names = std::collections::BTreeSet::new();
        for r in k["resources"].as_array().unwrap() {
            for doc in docs(&root().join(dir).join(r.as_str().unwrap())) {
                let spec = &doc["spec"]["template"]["spec"];
                let containers = spec["containers"].as_array().into_iter().chain(spec["initContainers"].as_array()).flatten();
                for c in containers {
                    let image = c["image"].as_str().unwrap();
                    if !image.starts_with("ghcr.io/flock-cni/") {
                        continue;
                    }
                    // The release's tag, never `latest` (kubelet's default pull policy for it is
                    // Always: an offline node could not start the pod), and never pulled when
                    // the node has it (tests/cluster runs these manifests on offline nodes).
                    let tag = image.rsplit_once(':').map(|(_, t)| t);
                    assert_eq!(tag, Some(env!("CARGO_PKG_VERSION")), "{dir}: {image} is not tagged with the release");
                    assert_eq!(c["imagePullPolicy"].as_str(), Some("IfNotPresent"), "{dir}: {} pulls {image} when present", c["name"]);
                    let target = target_of(image);
                    let bins = d.binaries(&target);
                    let command: Vec<&str> = c["command"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
                    for word in command.iter().flat_map(|a| a.split_whitespace()) {
                        if word.starts_with("/usr/local/bin/") {
                            assert!(
                                bins.iter().any(|b| b == word),
                                "{dir}: {} runs {word}, not in target {target}",
                                c["name"].as_str().unwrap()
                            );
                        }
                    }
                    names.insert(image.rsplit_once(':').map_or(image, |(n, _)| n).to_string());
                }
            }
        }
        for i in k["images"].as_array().unwrap() {
            let name = i["name"].as_str().unwrap();
            assert_eq!(i["newTag"].as_str(), Some(env!("CARGO_PKG_VERSION")), "{dir}/kustomization.yaml tags {name} with another release");
            assert!(names.contains(name), "{dir}/kustomization.yaml retags {name}, which none of its manifests uses ({names:?})");
            target_of(name);
        }
        used.extend(names);
    }
    assert_eq!(used.len(), 2, "the agent's image and the controller's: {used:?}");
}

/// The image build ships stripped binaries and keeps their debug info apart
/// (deploy/split-debuginfo.sh, run by the Dockerfile's build stage): here on a test build
/// of flockctl, which carries line tables as the release profile's do.
#[test]
fn release_binaries_ship_stripped_with_their_debug_info_kept() {
    let d = Dockerfile::read();
    let build = d.stage("build");
    assert!(build.all("RUN").any(|r| r.contains("deploy/split-debuginfo.sh target/release /out")), "the build stage splits the binaries");
    assert!(d.stage("symbols").all("COPY").any(|c| c.contains("/out/debug/")), "the symbols stage keeps the debug files");

    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let dir = Dir(std::env::temp_dir().join(format!("flock-split-{}", std::process::id())));
    let (from, out) = (dir.0.join("from"), dir.0.join("out"));
    std::fs::create_dir_all(&from).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_flockctl"), from.join("flockctl")).unwrap();
    let status = std::process::Command::new(root().join("deploy/split-debuginfo.sh")).args([&from, &out]).arg("flockctl").status().unwrap();
    assert!(status.success());

    let sections = |path: &Path| -> String {
        let o = std::process::Command::new("readelf").args(["-S", "-W"]).arg(path).output().unwrap();
        assert!(o.status.success(), "readelf {}", path.display());
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let (shipped, debug) = (out.join("flockctl"), out.join("debug/usr/lib/debug/usr/local/bin/flockctl.debug"));
    let s = sections(&shipped);
    // (`.debug_gdb_scripts` is loaded data, a pointer to pretty-printers: it stays.)
    for section in [".debug_info", ".debug_line", ".symtab"] {
        assert!(!s.contains(section), "the shipped binary keeps {section}:\n{s}");
    }
    assert!(s.contains(".gnu_debuglink"), "no link to the debug file:\n{s}");
    let link = std::process::Command::new("readelf").args(["--string-dump=.gnu_debuglink"]).arg(&shipped).output().unwrap();
    assert!(String::from_utf8_lossy(&link.stdout).contains("flockctl.debug"));
    let g = sections(&debug);
    assert!(g.contains(".debug_line") && g.contains(".symtab"), "the debug file lacks line tables or symbols:\n{g}");
    let (before, after) = (std::fs::metadata(from.join("flockctl")).unwrap().len(), std::fs::metadata(&shipped).unwrap().len());
    assert!(after < before, "stripping did not shrink flockctl ({before} -> {after} bytes)");
    // And it still runs.
    let help = std::process::Command::new(&shipped).arg("--help").output().unwrap();
    assert!(help.status.success() && String::from_utf8_lossy(&help.stdout).contains("Usage"));
}
