//! `flockctl bench` end to end on a tiny cluster: it runs and prints the JSON it promises.
//! (No timing is asserted; the numbers are for people.)

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
