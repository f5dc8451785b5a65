//! The simulated cluster end to end (root): the whole conformance suite through
//! `flockctl conformance`, what `flockctl sim` and `conformance` print, cleanup after
//! normal, interrupted, killed and kept runs, probe outcomes, and policy changes under
//! running pods.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use flock::agent::routes::Routing;
use flock::model::{Family, Protocol};
use flock::sim::probe::{Outcome, Task, probe};
use flock::sim::{ProbeSpec, Sim, SimOptions, Underlay, UnderlaySpoofing};
use flock::testkit::kernel::{NetnsGuard, flock_cni_binary, require_root};
use flock::testkit::{self, policies};

fn flockctl(args: &[&str]) -> Output {
    let cni_dir = flock_cni_binary().parent().unwrap().to_path_buf();
    Command::new(env!("CARGO_BIN_EXE_flockctl"))
        .args(args)
        .args(["--cni-bin-dir", cni_dir.to_str().unwrap()])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

/// Simulation namespaces of a process (`flks-<pid>-…`).
fn leftovers(pid: u32) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("flks-{pid}-")))
        .map(str::to_string)
        .collect()
}

fn work_dirs(pid: u32) -> Vec<PathBuf> {
    std::fs::read_dir("/run/flock-sim")
        .map(|r| {
            r.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{pid}-"))))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_whole_conformance_suite_passes_on_real_kernels() {
    if !require_root("the_whole_conformance_suite_passes_on_real_kernels") {
        return;
    }
    let started = Instant::now();
    let out = flockctl(&["conformance", "tests/conformance"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}conformance took {:.1}s", started.elapsed().as_secs_f64());
    assert!(out.status.success(), "conformance failed:\n{stdout}\n{stderr}");
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(summary.contains(" passed, 0 failed, "), "{summary}");
    let passed: usize = summary.split_whitespace().next().unwrap().parse().unwrap();
    assert!(passed >= 50, "{summary}");
    // Domain rules, through the agents' DNS proxies and the cases' DNS servers.
    let dns = stdout.lines().filter(|l| l.starts_with("PASS 3") && l.contains("-dns-")).count();
    assert!(dns >= 8, "{stdout}");
    for line in stdout.lines().filter(|l| l.starts_with("SKIP")) {
        // Only SCTP cases may be skipped (this kernel has no SCTP), and they say so.
        assert!(line.contains("sctp") && line.ends_with("(SCTP not available in this kernel)"), "{line}");
    }
    // Policies the API server would reject are reported by name, field and reason; the case
    // goes on (and passes: it checks what flock enforces for them).
    assert!(
        stderr.lines().any(|l| l
            .starts_with("warning: 106-invalid-podselector-allows-nothing: NetworkPolicy x/bad: spec.podSelector.matchLabels[pod]")
            && l.contains("allowing nothing")),
        "{stderr}"
    );
    assert!(
        stderr.contains("warning: 107-invalid-peer-rule-allows-nothing: NetworkPolicy y/a-from-b: spec.ingress[0].from[0].ipBlock.cidr"),
        "{stderr}"
    );
}

/// Whether this kernel can open an SCTP socket.
fn kernel_has_sctp() -> bool {
    use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType, socket};
    socket(AddressFamily::Inet, SockType::Stream, SockFlag::empty(), SockProtocol::Sctp).is_ok()
}

#[test]
fn the_cluster_policy_cases_pass_on_an_ipv6_cluster() {
    if !require_root("the_cluster_policy_cases_pass_on_an_ipv6_cluster") {
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let cases = flock::source::files::ipv6_cluster_policy_cases(&root.join("conformance"), &root.join("conformance-v6")).unwrap();
    let mut args: Vec<String> = vec!["conformance".into(), "--base".into(), "tests/conformance-v6/base-cluster.yaml".into()];
    args.extend(cases.iter().map(|c| c.display().to_string()));
    let out = flockctl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "conformance failed:\n{stdout}\n{stderr}");
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(summary.contains(" passed, 0 failed, "), "{summary}");
    let run: usize = stdout.lines().filter(|l| l.starts_with("PASS")).count();
    let skipped: Vec<&str> = stdout.lines().filter(|l| l.starts_with("SKIP")).collect();
    assert_eq!(run + skipped.len(), cases.len(), "{stdout}");
    assert!(stdout.lines().filter(|l| l.starts_with("PASS 3") && l.contains("-dns-")).count() >= 8, "{stdout}");
    for line in skipped {
        assert!(line.ends_with("(SCTP not available in this kernel)"), "{line}");
    }
}

/// A DNS case fails when what it says is wrong: a name not admitted said to connect, an
/// address learned said blocked, a lookup that got no answer said to resolve, and a server the agents do not trust (its answers would
/// teach nothing) is an error, not a pass.
#[test]
fn dns_cases_fail_when_they_are_wrong() {
    if !require_root("dns_cases_fail_when_they_are_wrong") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("flock-dns-cases-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let copy = |from: &str, to: &str, edits: &[(&str, &str)]| {
        let mut text = std::fs::read_to_string(format!("tests/conformance/{from}/case.yaml")).unwrap();
        for (a, b) in edits {
            assert!(text.contains(a), "{from}: {a}");
            text = text.replacen(a, b, 1);
        }
        let name = to.split_once('-').unwrap().1;
        text = text.replacen(&format!("name: {}", from.split_once('-').unwrap().1), &format!("name: {name}"), 1);
        std::fs::create_dir_all(dir.join(to)).unwrap();
        std::fs::write(dir.join(to).join("case.yaml"), text).unwrap();
    };
    copy(
        "301-dns-exact-name",
        "901-dns-not-admitted-said-open",
        &[("host: other.example.test\n    matrix:\n      x/a: \"B\"", "host: other.example.test\n    matrix:\n      x/a: \"1\"")],
    );
    copy("305-dns-many-addresses", "902-dns-learned-said-closed", &[("x/a: \"-110\"", "x/a: \"-100\"")]);
    copy("301-dns-exact-name", "903-dns-untrusted-server", &[("labels: {k8s-app: kube-dns}", "labels: {k8s-app: not-dns}")]);
    copy("306-dns-not-admitted-learns-nothing", "904-dns-unresolved-said-blocked", &[("x/a: \"N\"", "x/a: \"B\"")]);
    let out = flockctl(&["conformance", "--base", "tests/conformance/base-cluster.yaml", dir.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("FAIL 901-dns-not-admitted-said-open (1 cells differ; step 1 other.example.test TCP/80 x/a -> other.example.test: expected to connect, resolved, was blocked"), "{stdout}");
    assert!(
        lines[1].starts_with("FAIL 902-dns-learned-said-closed (1 cells differ; step 1 TCP/80 x/a -> z/b: expected blocked, connected"),
        "{stdout}"
    );
    assert!(
        lines[2]
            .contains("dns.server kube-system/coredns is not a resolver the agents trust (they trust pods kube-system/k8s-app=kube-dns)"),
        "{stdout}"
    );
    assert!(
        lines[3].starts_with(
            "FAIL 904-dns-unresolved-said-blocked (1 cells differ; step 1 api.example.test TCP/80 x/a -> api.example.test: expected to resolve and be blocked, did not resolve"
        ),
        "{stdout}"
    );
    assert_eq!(lines[4], "0 passed, 4 failed, 0 skipped", "{stdout}");
}

#[test]
fn conformance_says_why_a_case_is_skipped() {
    if !require_root("conformance_says_why_a_case_is_skipped") {
        return;
    }
    let out =
        flockctl(&["conformance", "--base", "tests/conformance/base-cluster.yaml", "tests/conformance/055-sctp-default-deny-ingress"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().next().unwrap_or_default();
    if kernel_has_sctp() {
        assert_eq!(line, "PASS 055-sctp-default-deny-ingress", "{stdout}");
    } else {
        assert_eq!(line, "SKIP 055-sctp-default-deny-ingress (SCTP not available in this kernel)", "{stdout}");
    }
}

#[test]
fn sim_tables_label_their_axes_and_explain_their_symbols() {
    if !require_root("sim_tables_label_their_axes_and_explain_their_symbols") {
        return;
    }
    let out = flockctl(&[
        "sim",
        "-f",
        "deploy/examples/quickstart/cluster.yaml",
        "--probe",
        "5432/TCP",
        "--probe",
        "8080/TCP/IPv6",
        "--timeout-ms",
        "300",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The tables, then the summary of the kernel's denials (none without a policy).
    let tables: Vec<&str> = stdout.split("\n\n").filter(|t| !t.trim().is_empty() && !t.starts_with("denied")).collect();
    assert_eq!(tables.len(), 2, "{stdout}");
    assert!(stdout.trim_end().ends_with("denied: the kernel logged no denial during the probes"), "{stdout}");
    // Without a family the pods' addresses decide: all IPv4 here, and the title says so.
    let lines: Vec<&str> = tables[0].lines().collect();
    assert_eq!(lines[0], "TCP port 5432, IPv4", "{stdout}");
    assert!(lines[1].starts_with("from \\ to ") && lines[1].ends_with("shop/db    shop/web tools/debug"), "{stdout}");
    assert!(lines[2].starts_with("shop/db ") && lines[2].ends_with("-           R           R"), "{stdout}");
    assert!(lines[3].starts_with("shop/web ") && lines[3].contains(" .  "), "{stdout}");
    // The legend: once, under the table, only the symbols the table uses.
    let legend: Vec<&str> = lines[5..].to_vec();
    assert_eq!(legend.len(), 3, "{stdout}");
    assert!(legend[0].starts_with("  .  connected"), "{stdout}");
    assert!(legend[1].starts_with("  R  refused"), "{stdout}");
    assert!(legend[2].starts_with("  -  not probed: the pod itself"), "{stdout}");
    // The quickstart pods have no IPv6 address: nothing probed, and the legend says why.
    let v6: Vec<&str> = tables[1].lines().collect();
    assert_eq!(v6[0], "TCP port 8080, IPv6", "{stdout}");
    assert!(v6[2].ends_with("-           ~           ~"), "{stdout}");
    assert!(tables[1].contains("  ~  not probed: no address of this family on one side"), "{stdout}");
    assert!(!stdout.contains("first address family"), "{stdout}");
}

/// `flockctl sim` on the base cluster, probing slowly enough to be caught while probing.
fn spawn_sim(extra: &[&str]) -> std::process::Child {
    let cni_dir = flock_cni_binary().parent().unwrap().to_path_buf();
    Command::new(env!("CARGO_BIN_EXE_flockctl"))
        .args(["sim", "-f", "tests/conformance/base-cluster.yaml", "--probe", "80/TCP", "--timeout-ms", "3000"])
        .args(["--cni-bin-dir", cni_dir.to_str().unwrap()])
        .args(extra)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until the simulation of `pid` has its namespaces (fabric, 2 nodes, 9 pods).
fn wait_built(pid: u32) {
    let t = Instant::now();
    while leftovers(pid).len() < 12 && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(leftovers(pid).len() >= 12, "the simulation never came up");
}

/// The two tests that look at what runs leave behind sweep (`--cleanup`) and rely on
/// leftovers (a killed run's): one at a time.
static LEFTOVERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn sim_leaves_nothing_behind_after_normal_interrupted_and_killed_runs() {
    if !require_root("sim_leaves_nothing_behind_after_normal_interrupted_and_killed_runs") {
        return;
    }
    let _serial = LEFTOVERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // A normal run.
    let child = spawn_sim(&[]);
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(leftovers(pid).is_empty(), "{:?}", leftovers(pid));
    assert!(work_dirs(pid).is_empty());

    // Interrupted while probing: a closed terminal (SIGHUP), Ctrl-C (SIGINT), a stop
    // (SIGTERM); also a kept simulation (an interrupted run is not worth inspecting).
    use nix::sys::signal::Signal;
    for (signal, keep) in [(Signal::SIGHUP, false), (Signal::SIGINT, false), (Signal::SIGTERM, true)] {
        let child =
            spawn_sim(if keep { &["--host", "internet=198.18.200.1", "--keep"][..] } else { &["--host", "internet=198.18.200.1"][..] });
        let pid = child.id();
        wait_built(pid);
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).unwrap();
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&format!("interrupted ({signal})")), "{signal}: {stderr}");
        assert_eq!(out.status.code(), Some(128 + signal as i32), "{signal}: {stderr}");
        assert!(leftovers(pid).is_empty(), "after {signal}: {:?}", leftovers(pid));
        assert!(work_dirs(pid).is_empty(), "after {signal}: {:?}", work_dirs(pid));
    }

    // Killed: everything stays until the next run sweeps it.
    let mut child = spawn_sim(&[]);
    let pid = child.id();
    wait_built(pid);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!leftovers(pid).is_empty(), "a killed run cannot clean up");
    let out = flockctl(&["sim", "-f", "tests/conformance/base-cluster.yaml", "--probe", "81/UDP"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(leftovers(pid).is_empty(), "the next run did not sweep: {:?}", leftovers(pid));
    assert!(work_dirs(pid).is_empty());
}

#[test]
fn sim_keep_is_left_by_later_runs_until_cleanup() {
    if !require_root("sim_keep_is_left_by_later_runs_until_cleanup") {
        return;
    }
    let _serial = LEFTOVERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // --keep leaves the simulation for inspection, and later runs leave it too (they say
    // so); only --cleanup removes it.
    let child = spawn_sim(&["--keep", "--show-ruleset", "node-1"]);
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("table inet flock"));
    let kept = leftovers(pid);
    assert!(kept.len() >= 12, "{kept:?}");
    // It says which namespace is which: every kept one, with its node, pod or host.
    let stderr = String::from_utf8_lossy(&out.stderr);
    for ns in &kept {
        assert!(
            stderr
                .lines()
                .any(|l| l.ends_with(&format!(": {ns}"))
                    && ["node ", "pod ", "host ", "fabric"].iter().any(|r| l.trim_start().starts_with(r))),
            "{ns}: {stderr}"
        );
    }
    assert!(stderr.contains("  node node-1: ") && stderr.contains("  pod x/a: "), "{stderr}");
    let out = flockctl(&["sim", "-f", "tests/conformance/base-cluster.yaml", "--probe", "81/UDP"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(leftovers(pid), kept, "the next run swept a kept simulation");
    assert_eq!(work_dirs(pid).len(), 1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("flks-{pid}-0-* ({} namespaces)", kept.len())) && stderr.contains("--cleanup"), "{stderr}");
    let out = flockctl(&["sim", "--cleanup"]);
    assert!(out.status.success());
    assert!(leftovers(pid).is_empty(), "{:?}", leftovers(pid));
    assert!(work_dirs(pid).is_empty());
}

#[test]
fn sim_json_and_hosts() {
    if !require_root("sim_json_and_hosts") {
        return;
    }
    let out = flockctl(&[
        "sim",
        "-f",
        "tests/conformance/base-cluster.yaml",
        "--probe",
        "80/TCP",
        "--probe",
        "81/UDP/IPv4",
        "--host",
        "internet=198.18.200.1",
        "-o",
        "json",
        "--show-ruleset",
        "node-1",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // stdout is exactly one JSON document, the ruleset listing inside it.
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{}", String::from_utf8_lossy(&out.stdout)));
    let listing = v["rulesets"]["node-1"].as_str().unwrap();
    assert!(listing.starts_with("table inet flock {"), "{listing}");
    let probes = v["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 2);
    assert_eq!(probes[0]["protocol"], "TCP");
    assert_eq!(probes[1]["family"], "IPv4");
    let results = probes[0]["results"].as_array().unwrap();
    // 9 sources × (8 other pods + 1 host).
    assert_eq!(results.len(), 81);
    assert!(results.iter().all(|r| r["connected"] == true && r["outcome"] == "connected"), "{results:?}");
    assert!(results.iter().any(|r| r["to"] == "host/internet"));
    assert_eq!(v["denied"], serde_json::json!([]), "no policy: nothing denied");
}

#[test]
fn sim_collects_the_kernels_denials() {
    if !require_root("sim_collects_the_kernels_denials") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("flock-sim-denials-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("deny.yaml");
    std::fs::write(&policy, "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: x}\nspec: {podSelector: {matchLabels: {pod: a}}}\n").unwrap();
    let args = ["sim", "-f", "tests/conformance/base-cluster.yaml", "-f", policy.to_str().unwrap(), "--probe", "80/TCP"];
    let out = flockctl(&[&args[..], &["-o", "json"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let denied = v["denied"].as_array().unwrap();
    // Eight pods probe x/a: each probe's SYN is denied at x/a's ingress and logged.
    let into_xa: Vec<&serde_json::Value> = denied.iter().filter(|d| d["pod"] == "x/a" && d["direction"] == "ingress").collect();
    let mut sources: Vec<&str> = into_xa.iter().filter_map(|d| d["from"].as_str()).collect();
    sources.sort();
    sources.dedup();
    assert_eq!(sources, ["x/b", "x/c", "y/a", "y/b", "y/c", "z/a", "z/b", "z/c"], "{denied:#?}");
    for d in &into_xa {
        assert_eq!((d["reason"].as_str(), d["protocol"].as_str(), d["port"].as_u64()), (Some("policy"), Some("TCP"), Some(80)));
        assert_eq!(d["policies"], serde_json::json!(["policy x/deny"]));
        assert!(d["count"].as_u64().unwrap() >= 1 && d["node"].is_string());
    }
    assert!(denied.iter().all(|d| d["pod"] == "x/a"), "only x/a denies: {denied:#?}");
    // The table output summarises them under the matrix.
    let out = flockctl(&args);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("denied (logged by the kernel during the probes"), "{text}");
    assert!(text.contains("ingress of x/a (node node-1): ") && text.contains("8 peers; policy x/deny"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn sim_options() -> SimOptions {
    SimOptions::new(flock_cni_binary().parent().unwrap().to_path_buf())
}

/// On a routed underlay (each node behind a router), pods reach the other node's pods over
/// VXLAN (and `auto`, which finds no node on-link), and not with host-gw, whose routes cannot
/// be made there: the underlay is really routed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_cross_a_routed_underlay_over_vxlan_and_not_over_host_gw() {
    if !require_root("pods_cross_a_routed_underlay_over_vxlan_and_not_over_host_gw") {
        return;
    }
    let spec = ProbeSpec { port: 80, protocol: Protocol::Tcp, family: None };
    for routing in [Routing::Vxlan, Routing::Auto, Routing::HostGw] {
        let mut opts = sim_options();
        opts.underlay = Underlay::Routed;
        opts.routing.routing = routing;
        let snap = testkit::base_cluster();
        let node_of: std::collections::BTreeMap<String, Option<String>> =
            snap.pods().map(|p| (p.key().to_string(), p.node.clone())).collect();
        let sim = Sim::build(snap, opts).await.unwrap();
        let pods = sim.pod_names();
        let cells = sim.probe(spec, &pods, &pods).unwrap();
        let cross: Vec<_> = cells.iter().filter(|c| node_of[&c.from] != node_of[&c.to]).collect();
        assert!(!cross.is_empty());
        let connected = cross.iter().filter(|c| c.outcome == Some(Outcome::Connected)).count();
        if routing == Routing::HostGw {
            assert_eq!(connected, 0, "host-gw crossed a routed underlay");
        } else {
            assert_eq!(
                connected,
                cross.len(),
                "{routing}: {:?}",
                cross.iter().filter(|c| c.outcome != Some(Outcome::Connected)).collect::<Vec<_>>()
            );
        }
        sim.teardown().await.unwrap();
    }
}

/// A VXLAN frame (VNI 1) from VTEP `from` to VTEP `to` carrying a UDP datagram `src` →
/// `dst`:9999 (IPv4), as a node's device would send it.
fn vxlan_frame(
    from: std::net::Ipv4Addr,
    to: std::net::Ipv4Addr,
    src: std::net::Ipv4Addr,
    dst: std::net::Ipv4Addr,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = vec![0x08, 0, 0, 0, 0, 0, 1, 0];
    f.extend(flock::agent::routes::vtep_mac(to.into()));
    f.extend(flock::agent::routes::vtep_mac(from.into()));
    f.extend([0x08, 0x00]);
    let udp_len = (8 + payload.len()) as u16;
    let total = 20 + udp_len;
    let mut ip = vec![0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0x40, 0, 64, 17, 0, 0];
    ip.extend(src.octets());
    ip.extend(dst.octets());
    let mut sum: u32 = ip.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], c[1]]))).sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f.extend(ip);
    f.extend([0x15, 0xb3, 0x27, 0x0f]);
    f.extend(udp_len.to_be_bytes());
    f.extend([0, 0]);
    f.extend(payload);
    f
}

/// The forged-outer attack (issue 58, item 2): from node-2's namespace — what the node, or a
/// host-network pod with CAP_NET_RAW there, can send — a VXLAN frame with node-3's address as
/// its outer source and a node-3 pod's as its inner one, to node-1, whose guard takes it for
/// node-3's. An underlay that forwards forged sources (`allowed`) delivers it to node-1's pod;
/// the default, validating underlay drops it at the router. node-2's frame as itself reaches
/// the pod on both (the path works).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_sending_vxlan_as_another_is_stopped_by_a_validating_underlay() {
    if !require_root("a_node_sending_vxlan_as_another_is_stopped_by_a_validating_underlay") {
        return;
    }
    for spoofing in [UnderlaySpoofing::Allowed, UnderlaySpoofing::Validated] {
        let mut opts = sim_options();
        opts.underlay = Underlay::Routed;
        opts.underlay_spoofing = spoofing;
        opts.routing.routing = Routing::Vxlan;
        let mut snap = testkit::base_cluster();
        let mut third = snap.node("node-1").unwrap().clone();
        third.name = "node-3".into();
        third.pod_cidrs = vec!["198.18.3.0/24".parse().unwrap()];
        third.internal_ips = vec!["198.18.0.3".parse().unwrap()];
        third.addresses = third.internal_ips.clone();
        snap.upsert_node(third);
        let sim = Sim::build(snap, opts).await.unwrap();
        let snap = sim.snapshot();
        let v4 = |node: &str| match snap.node(node).unwrap().internal_ips.iter().find(|a| a.is_ipv4()) {
            Some(std::net::IpAddr::V4(a)) => *a,
            other => panic!("{node}: {other:?}"),
        };
        let target = snap.pods().find(|p| p.node.as_deref() == Some("node-1")).unwrap().clone();
        let std::net::IpAddr::V4(target_ip) = target.ips[0] else { panic!("{target:?}") };
        let sink = flock_cni::netns::run_in(&flock::netns::Netns::named(&sim.pod_netns(&target.key().to_string()).unwrap()), || {
            let s = std::net::UdpSocket::bind("0.0.0.0:9999").unwrap();
            s.set_read_timeout(Some(Duration::from_millis(1000))).unwrap();
            s
        })
        .unwrap();
        let node2 = sim.node_netns("node-2").unwrap();
        // node-3's address on node-2's loopback (as a raw socket would write it): packets from
        // it leave node-2's uplink with that source.
        let ran = Command::new("ip").args(["-n", &node2, "addr", "add", &format!("{}/32", v4("node-3")), "dev", "lo"]).status().unwrap();
        assert!(ran.success());
        // A frame from node-2's namespace with `outer` as its source, carrying `inner`.
        let send = |outer: std::net::Ipv4Addr, inner: std::net::Ipv4Addr, tag: &str| {
            let frame = vxlan_frame(outer, v4("node-1"), inner, target_ip, tag.as_bytes());
            flock_cni::netns::run_in(&flock::netns::Netns::named(&node2), || {
                let s = std::net::UdpSocket::bind(SocketAddr::from((outer, 0))).unwrap();
                s.send_to(&frame, SocketAddr::from((v4("node-1"), 4789))).unwrap();
            })
            .unwrap();
            let mut buf = [0u8; 64];
            sink.recv(&mut buf).ok().map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
        };
        let own = send(v4("node-2"), "198.18.2.9".parse().unwrap(), "as itself");
        assert_eq!(own.as_deref(), Some("as itself"), "{spoofing}: node-2's own frame did not arrive: the path is broken");
        let forged = send(v4("node-3"), "198.18.3.9".parse().unwrap(), "as node-3");
        match spoofing {
            UnderlaySpoofing::Allowed => {
                assert_eq!(forged.as_deref(), Some("as node-3"), "the attack did not work on a spoofing underlay: the test proves nothing")
            }
            UnderlaySpoofing::Validated => assert_eq!(forged, None, "a frame as node-3 crossed a validating underlay"),
        }
        sim.teardown().await.unwrap();
    }
}

/// The base cluster on an IPv6 underlay: every node's InternalIP is `2001:db8:ff::<n>`, its
/// pod CIDR `2001:db8:<n>::/64`, and (`dual`) its IPv4 InternalIP and pod CIDR kept, each pod
/// `198.18.<n>.<m>` also (or only) `2001:db8:<n>::<m>`.
fn on_an_ipv6_underlay(dual: bool) -> flock::model::Snapshot {
    let mut s = testkit::base_cluster();
    let v6 = |ip: &std::net::IpAddr| -> std::net::IpAddr {
        let std::net::IpAddr::V4(a) = ip else { panic!("{ip}") };
        let [_, _, n, m] = a.octets();
        std::net::IpAddr::from([0x2001, 0xdb8, u16::from(n), 0, 0, 0, 0, u16::from(m)])
    };
    for mut n in s.nodes().cloned().collect::<Vec<_>>() {
        let i: u16 = n.name.trim_start_matches("node-").parse().unwrap();
        let (ip, cidr) = (format!("2001:db8:ff::{i}").parse().unwrap(), format!("2001:db8:{i}::/64").parse().unwrap());
        if dual {
            n.internal_ips.push(ip);
            n.pod_cidrs.push(cidr);
        } else {
            (n.internal_ips, n.pod_cidrs) = (vec![ip], vec![cidr]);
        }
        s.upsert_node(n);
    }
    for mut p in s.pods().cloned().collect::<Vec<_>>() {
        let ips: Vec<std::net::IpAddr> = p.ips.iter().map(v6).collect();
        if dual {
            p.ips.extend(ips);
        } else {
            p.ips = ips;
        }
        s.upsert_pod(p);
    }
    s
}

/// On a routed IPv6 underlay (nodes known by IPv6 InternalIPs only, or dual stack), IPv6 pods
/// cross over the IPv6 VXLAN device (`flock.vxlan6`, forwarding entries to the nodes' IPv6
/// addresses) and, in dual stack, IPv4 pods over the IPv4 one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_cross_a_routed_ipv6_underlay_over_vxlan() {
    if !require_root("pods_cross_a_routed_ipv6_underlay_over_vxlan") {
        return;
    }
    for dual in [false, true] {
        let mut opts = sim_options();
        opts.underlay = Underlay::Routed;
        opts.routing.routing = Routing::Vxlan;
        let snap = on_an_ipv6_underlay(dual);
        let node_of: std::collections::BTreeMap<String, Option<String>> =
            snap.pods().map(|p| (p.key().to_string(), p.node.clone())).collect();
        let sim = Sim::build(snap, opts).await.unwrap();
        let pods = sim.pod_names();
        let families = if dual { vec![Family::V4, Family::V6] } else { vec![Family::V6] };
        for family in families {
            let spec = ProbeSpec { port: 80, protocol: Protocol::Tcp, family: Some(family) };
            let cells = sim.probe(spec, &pods, &pods).unwrap();
            let cross: Vec<_> = cells.iter().filter(|c| node_of[&c.from] != node_of[&c.to]).collect();
            assert_eq!(cross.len(), 2 * 4 * 5, "dual {dual}, {family:?}: every pair across the nodes is probed");
            let failed: Vec<_> = cross.iter().filter(|c| c.outcome != Some(Outcome::Connected)).collect();
            assert!(failed.is_empty(), "dual {dual}, {family:?}: {failed:?}");
        }
        let ns = sim.node_netns("node-1").unwrap();
        let show = |args: &[&str]| {
            let out = Command::new("ip").args(["netns", "exec", &ns]).args(args).output().unwrap();
            (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
        };
        let (_, fdb) = show(&["bridge", "fdb", "show", "dev", "flock.vxlan6"]);
        assert!(fdb.contains("dst 2001:db8:ff::2"), "dual {dual}: node-2 is not reached over IPv6: {fdb}");
        let (_, routes) = show(&["ip", "-6", "route", "show", "proto", "70"]);
        assert!(routes.contains("2001:db8:2::/64 via 2001:db8:2:: dev flock.vxlan6"), "dual {dual}: {routes}");
        let (v4_device, _) = show(&["ip", "link", "show", "flock.vxlan"]);
        assert_eq!(v4_device, dual, "dual {dual}: the IPv4 device is there only with IPv4 InternalIPs");
        sim.teardown().await.unwrap();
    }
}

/// A sample of the conformance suite, IPv4 and dual stack, over VXLAN on a routed underlay
/// (`flockctl conformance --underlay routed --routing vxlan`; the whole suite passes there
/// too, docs/architecture.md#routing-between-nodes).
#[test]
fn conformance_cases_pass_over_vxlan_on_a_routed_underlay() {
    if !require_root("conformance_cases_pass_over_vxlan_on_a_routed_underlay") {
        return;
    }
    let out = flockctl(&[
        "conformance",
        "--underlay",
        "routed",
        "--routing",
        "vxlan",
        "tests/conformance/011-default-deny-all",
        "tests/conformance/012-allow-from-pods-in-server-namespace-by-podselector",
        "tests/conformance/103-dual-stack-ipv6",
        "tests/conformance/224-egress-deny-all-covers-own-node",
        "tests/conformance/301-dns-exact-name",
    ]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("5 passed, 0 failed"), "{text}");
}

/// `nft` in the simulation namespace `ns`; its standard output.
fn nft_in(ns: &str, args: &[&str]) -> String {
    let out = Command::new("ip").args(["netns", "exec", ns, "nft"]).args(args).output().unwrap();
    assert!(out.status.success(), "nft {args:?} in {ns}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A case's probes by name start only once its DNS server answers. The server pod comes up in
/// the step (case 301's CoreDNS, 198.18.1.53 on node-1) and its path drops DNS at first, as a
/// new pod's link does until the kernel activates it (what failed the case once in CI, under
/// load): here a rule of node-1 drops DNS to the server, and is lifted 2.5 s after it first
/// dropped something — longer than a probe's lookup waits (2 attempts of 1 s). Probing at
/// once, every lookup of the step's first probe would fail; waiting for the server, the case
/// passes. A server that never answers fails the step, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn probes_by_name_wait_for_the_case_dns_server_to_answer() {
    if !require_root("probes_by_name_wait_for_the_case_dns_server_to_answer") {
        return;
    }
    use flock::sim::runner::{Verdict, run_case};
    let mut opts = sim_options().with_cluster_dns();
    opts.ready_timeout = Duration::from_secs(6);
    let mut sim = Sim::build(testkit::base_cluster(), opts).await.unwrap();
    let base = sim.snapshot();
    let case =
        flock::source::files::load_case(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/301-dns-exact-name")).unwrap();
    let node1 = sim.node_netns("node-1").unwrap();
    // Postrouting: the node's own queries, the DNS proxy's and those forwarded from pods.
    let block = "add table inet flksim-block { chain out { type filter hook postrouting priority 0; \
                 ip daddr 198.18.1.53 meta l4proto { udp, tcp } th dport 53 counter drop; }; }";
    let dropped = |ns: &str| -> u64 {
        let listing = nft_in(ns, &["list", "table", "inet", "flksim-block"]);
        let words: Vec<&str> = listing.split_whitespace().collect();
        words.windows(2).find(|w| w[0] == "packets").and_then(|w| w[1].parse().ok()).unwrap_or(0)
    };

    nft_in(&node1, &[block]);
    let lifter = {
        let node1 = node1.clone();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            while dropped(&node1) == 0 {
                assert!(Instant::now() < deadline, "nothing asked the DNS server");
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(Duration::from_millis(2500));
            nft_in(&node1, &["delete", "table", "inet", "flksim-block"]);
        })
    };
    let o = run_case(&mut sim, &base, &case).await;
    lifter.join().unwrap();
    assert_eq!(o.verdict, Verdict::Pass, "{o:#?}");

    nft_in(&node1, &[block]);
    let started = Instant::now();
    let o = run_case(&mut sim, &base, &case).await;
    let took = started.elapsed();
    nft_in(&node1, &["delete", "table", "inet", "flksim-block"]);
    assert_eq!(o.verdict, Verdict::Fail, "{o:#?}");
    assert_eq!(o.probes_run, 0, "nothing is probed: {o:#?}");
    let said = o.errors.join("\n");
    assert!(
        said.contains("step 1: pod kube-system/coredns: its DNS server on 198.18.1.53:53 did not answer within 6.0s")
            && said.contains("asked from node node-1"),
        "{said}"
    );
    assert!(took >= Duration::from_secs(6), "{took:?}");
    sim.teardown().await.unwrap();
}

/// A probe by name resolves as a stub resolver does: it sends its query again when no answer
/// came within the probe's timeout, and takes the answer to either; a server that answers
/// neither leaves the name unresolved after both.
#[test]
fn probes_by_name_ask_again_as_a_stub_resolver() {
    use hickory_proto::op::{Message, MessageType};
    use hickory_proto::rr::{RData, Record, rdata::A};
    let target = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = target.local_addr().unwrap().port();
    // Drops the first `ignore` queries, answers the next with 127.0.0.1; how many came.
    let server = |ignore: usize| {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = s.local_addr().unwrap();
        s.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            let mut seen = 0;
            while let Ok((n, from)) = s.recv_from(&mut buf) {
                seen += 1;
                if seen <= ignore {
                    continue;
                }
                let q = Message::from_vec(&buf[..n]).unwrap();
                let mut r = Message::new();
                r.set_id(q.id());
                r.set_message_type(MessageType::Response);
                r.add_queries(q.queries().iter().cloned());
                r.add_answer(Record::from_rdata(q.queries()[0].name().clone(), 30, RData::A(A(std::net::Ipv4Addr::LOCALHOST))));
                s.send_to(&r.to_vec().unwrap(), from).unwrap();
            }
            seen
        });
        (addr, thread)
    };
    let timeout = Duration::from_millis(500);
    let task = |resolver: SocketAddr| Task {
        src: flock::netns::Netns::Current,
        dst: flock::sim::probe::Dest::Name { name: "api.example.test".into(), v6: false, resolver, port },
        protocol: Protocol::Tcp,
    };

    let (resolver, seen) = server(1);
    assert_eq!(probe(&task(resolver), timeout), Outcome::Connected);
    assert_eq!(seen.join().unwrap(), 2, "the first query went unanswered, the second was answered");

    let (resolver, seen) = server(usize::MAX);
    let started = Instant::now();
    assert_eq!(probe(&task(resolver), timeout), Outcome::Unresolved);
    assert!(started.elapsed() >= 2 * timeout, "{:?}", started.elapsed());
    assert_eq!(seen.join().unwrap(), 2, "asked twice, then gave up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_policy_change_is_enforced_under_running_pods() {
    if !require_root("a_policy_change_is_enforced_under_running_pods") {
        return;
    }
    let mut sim = Sim::build(testkit::base_cluster(), sim_options()).await.unwrap();
    let spec = ProbeSpec { port: 80, protocol: Protocol::Tcp, family: None };
    let pods = sim.pod_names();
    let netns_before: Vec<Option<String>> = pods.iter().map(|p| sim.pod_netns(p)).collect();
    let connected = |sim: &Sim, from: &str, to: &str| {
        let c = sim.probe(spec, &[from.to_string()], &[to.to_string()]).unwrap();
        c[0].outcome == Some(Outcome::Connected)
    };
    assert!(connected(&sim, "y/a", "x/b"));
    let deny =
        policies("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: x}\nspec: {podSelector: {}}\n");
    sim.apply(|s| s.upsert_policy(deny[0].clone())).await.unwrap();
    assert!(!connected(&sim, "y/a", "x/b"));
    assert!(connected(&sim, "x/b", "y/a"));
    sim.apply(|s| {
        s.remove_policy(&flock::model::ObjectRef::new("x", "deny"));
    })
    .await
    .unwrap();
    assert!(connected(&sim, "y/a", "x/b"));
    let netns_after: Vec<Option<String>> = pods.iter().map(|p| sim.pod_netns(p)).collect();
    assert_eq!(netns_before, netns_after, "pods were restarted");
    sim.teardown().await.unwrap();
}

#[test]
fn probes_tell_connected_refused_timeout_and_unreachable_apart() {
    if !require_root("probes_tell_connected_refused_timeout_and_unreachable_apart") {
        return;
    }
    // Two namespaces on a veth: a server side with one TCP and one UDP listener, and an
    // nft rule dropping port 9 (a policy drop is silent).
    let (a, b) = (NetnsGuard::new("pa"), NetnsGuard::new("pb"));
    a.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", &b.name]);
    a.ip(&["addr", "add", "198.18.90.1/24", "dev", "eth0"]);
    b.ip(&["addr", "add", "198.18.90.2/24", "dev", "eth0"]);
    a.ip(&["link", "set", "eth0", "up"]);
    b.ip(&["link", "set", "eth0", "up"]);
    b.exec(&["nft", "add table inet t { chain in { type filter hook input priority 0; tcp dport 9 drop; udp dport 9 drop; }; }"]);
    let _servers = flock::sim::servers::Servers::start(
        b.netns(),
        vec![(80, Protocol::Tcp), (80, Protocol::Udp), (9, Protocol::Tcp), (9, Protocol::Udp)],
    )
    .unwrap();
    let t = |dst: &str, protocol: Protocol| {
        probe(
            &Task { src: a.netns(), dst: flock::sim::probe::Dest::Address(dst.parse::<SocketAddr>().unwrap()), protocol },
            Duration::from_millis(500),
        )
    };
    assert_eq!(t("198.18.90.2:80", Protocol::Tcp), Outcome::Connected);
    assert_eq!(t("198.18.90.2:80", Protocol::Udp), Outcome::Connected);
    assert_eq!(t("198.18.90.2:81", Protocol::Tcp), Outcome::Refused);
    assert_eq!(t("198.18.90.2:81", Protocol::Udp), Outcome::Refused);
    assert_eq!(t("198.18.90.2:9", Protocol::Tcp), Outcome::Timeout);
    assert_eq!(t("198.18.90.2:9", Protocol::Udp), Outcome::Timeout);
    // No route at all.
    assert_eq!(t("198.19.1.1:80", Protocol::Tcp), Outcome::Unreachable);
    assert_eq!(t("[2001:db8::1]:80", Protocol::Udp), Outcome::Unreachable);
    // SCTP: unavailable on kernels without it, otherwise a real outcome.
    let s = t("198.18.90.2:80", Protocol::Sctp);
    assert!(matches!(s, Outcome::Unavailable | Outcome::Refused | Outcome::Connected), "{s:?}");
}
