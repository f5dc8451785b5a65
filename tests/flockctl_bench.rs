//! `flockctl bench` end to end on a tiny cluster: it runs and prints the JSON it promises,
//! `--dataplane` included (its overlay too), and leaves no namespace behind. (No timing is asserted; the
//! numbers are for people.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use flock::testkit::kernel::require_root;
use serde_json::Value;

fn bench(extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_flockctl"))
        .args(["bench", "--pods", "300", "--policies", "40", "--pods-per-node", "20", "--runs", "1"])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn prints_the_pipeline_numbers_as_json() {
    let v = bench(&["--no-apply"]);
    assert_eq!(v["node"]["local_pods"], 20);
    assert_eq!(v["cluster"]["family"], "ipv4");
    assert!(v["ruleset"]["rules"].as_u64().unwrap() > 20);
    assert!(v["ruleset"]["elements"].as_u64().unwrap() > 0);
    assert!(v["translate_ms"]["median"].is_number());
    assert_eq!(v["peer_doubling"]["rules_unchanged"], true);
    assert_eq!(v["apply"]["skipped"], "--no-apply");
    assert_eq!(v["node"]["policy_problems"], 0);
    assert_eq!(v["node_status"]["run_pods"], 20);
    assert!(v["node_status"]["run_policies"].as_u64().unwrap() > 0);
    assert!(v["node_status"]["ruleset_sha256_ms"]["median"].is_number());
}

#[test]
fn measures_nft_in_throwaway_namespaces() {
    if !require_root("measures_nft_in_throwaway_namespaces") {
        return;
    }
    let v = bench(&[]);
    let apply = &v["apply"];
    for key in ["raw_nft_f_ms", "full_apply_ms", "full_resync_ms"] {
        assert!(apply[key]["median"].as_f64().unwrap() > 0.0, "{key}: {apply}");
    }
    assert!(apply["one_pod_change"]["apply_ms"]["median"].as_f64().unwrap() > 0.0, "{apply}");
}

/// Tiny data-path sizes: a few policies, short rounds (the numbers are not the point here).
const DATAPLANE_TINY: [&str; 7] = ["--dataplane", "--dataplane-policies", "20", "--dataplane-blocks", "2", "--dataplane-seconds", "0.3"];

fn flockctl_bench(extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flockctl"));
    cmd.args(["bench", "--pods", "300", "--policies", "40", "--pods-per-node", "20"]).args(extra);
    cmd
}

/// The benchmark's namespaces of process `pid` still present.
fn dataplane_namespaces(pid: u32) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let mine = format!("flkt-{pid}-dp");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&mine))
        .map(String::from)
        .collect()
}

#[test]
fn measures_the_data_path_in_throwaway_namespaces() {
    if !require_root("measures_the_data_path_in_throwaway_namespaces") {
        return;
    }
    let mut args = DATAPLANE_TINY.to_vec();
    args.extend(["--dataplane-rounds", "2"]);
    let child = flockctl_bench(&args).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    let dp = &v["dataplane"];
    assert!(dp["ratio"].as_f64().is_some_and(|r| r > 0.0), "{dp}");
    assert_eq!(dp["rounds"], 2);
    let scenarios = dp["scenarios"].as_object().unwrap();
    assert_eq!(scenarios.keys().collect::<Vec<_>>(), ["admin_tiers", "ip_blocks", "pod_selectors", "pod_to_node", "synthetic_busiest"]);
    assert!(scenarios.contains_key(dp["worst"].as_str().unwrap()), "{dp}");
    for (name, s) in scenarios {
        for key in ["flock_conn_per_s", "conntrack_only_conn_per_s"] {
            assert!(s[key]["median"].as_f64().unwrap() > 0.0, "{name} {key}: {s}");
        }
        assert!(s["ratio"]["median"].as_f64().unwrap() > 0.0, "{name}: {s}");
        // The client is admitted by a rule of the pod's own chains (the server's; the
        // client's on the way to the node), which are not empty.
        assert!(s["ruleset"]["rules_in_pod_chains"].as_u64().unwrap() > 0, "{name}: {s}");
        assert!(s["client"]["rule_position"].as_u64().unwrap() > 0, "{name}: {s}");
        assert!(s["client"]["accepted_by"].is_string(), "{name}: {s}");
        // The hand-built policies drop a stranger, or the node's other port (the synthetic
        // pod may admit every source).
        match name.as_str() {
            "synthetic_busiest" => {}
            "pod_to_node" => assert!(s["server"]["denied_port_dropped"].is_u64(), "{name}: {s}"),
            _ => assert!(s["client"]["denied_source_dropped"].is_string(), "{name}: {s}"),
        }
    }
    // The overlay: pod to pod across two nodes, both modes measured, VXLAN's pods with the
    // encapsulation's MTU and its tables with the guard.
    let o = &dp["overlay"];
    for mode in ["host_gw", "vxlan"] {
        for key in ["conn_per_s", "bulk_gbit_per_s"] {
            assert!(o[mode][key]["median"].as_f64().unwrap() > 0.0, "overlay {mode} {key}: {o}");
        }
    }
    assert_eq!((o["host_gw"]["pod_mtu"].as_u64(), o["vxlan"]["pod_mtu"].as_u64()), (Some(1500), Some(1450)), "{o}");
    assert!(o["vxlan"]["rules_in_tables"].as_u64() > o["host_gw"]["rules_in_tables"].as_u64(), "{o}");
    assert!(o["vxlan_over_host_gw"]["bulk"]["median"].as_f64().unwrap() > 0.0, "{o}");
    assert!(dataplane_namespaces(pid).is_empty(), "left behind: {:?}", dataplane_namespaces(pid));
}

#[test]
fn an_interrupted_data_path_benchmark_removes_its_namespaces() {
    if !require_root("an_interrupted_data_path_benchmark_removes_its_namespaces") {
        return;
    }
    // Many rounds: it is still measuring when interrupted.
    let mut args = DATAPLANE_TINY.to_vec();
    args.extend(["--dataplane-rounds", "1000"]);
    let mut child = flockctl_bench(&args).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    // Interrupted once it is measuring (its last scenario's last namespace exists).
    let started = std::time::Instant::now();
    while !dataplane_namespaces(pid).iter().any(|n| n.contains("pod-to-node-ct-node")) {
        assert!(started.elapsed() < std::time::Duration::from_secs(60), "no namespaces after 60 s");
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            panic!("exited before it was interrupted: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(dataplane_namespaces(pid).is_empty(), "left behind: {:?}", dataplane_namespaces(pid));
}
