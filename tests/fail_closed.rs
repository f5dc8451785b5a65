//! The fail-closed property (`flock::fuzzing::fail_closed`): a policy flock cannot fully
//! understand isolates what it would select and opens nothing beyond its own valid rules.
//! Random inputs from a fixed-seed generator (`FLOCK_PROPTEST_CASES`, default 300), and two
//! checks that the property has teeth: a translator that ignored the broken policy, or kept
//! its rules under a widened selector, would fail it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use flock::fuzzing::fail_closed::{
    Corrupted, Corruption, Enforced, FailClosedInput, GenPolicy, GenRule, GenSelector, SelectorCorruption, Verdicts, base, fail_closed,
};
use flock::model::{LabelSelector, NetworkPolicy};

/// splitmix64: a tiny, well-known generator; enough for test inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn bytes(&mut self) -> Vec<u8> {
        let len = 16 + (self.next() % 400) as usize;
        (0..len).map(|_| self.next() as u8).collect()
    }
}

#[test]
fn random_policy_sets_with_one_broken_policy_fail_closed() {
    let cases: usize = std::env::var("FLOCK_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
    let mut rng = Rng(0x5EED_F10C);
    let start = std::time::Instant::now();
    for i in 0..cases {
        let data = rng.bytes();
        if let Err(e) = std::panic::catch_unwind(|| fail_closed(&data)) {
            let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
            panic!("case {i} (input {data:02x?}):\n{msg}");
        }
    }
    eprintln!("{cases} cases in {:?}", start.elapsed());
}

/// A broken podSelector in x with rules that would open everything, and no other policy.
fn open_everything_with_a_broken_selector() -> (FailClosedInput, Corrupted) {
    let input = FailClosedInput {
        valid: vec![],
        corrupted: GenPolicy {
            namespace: 0,
            selector: GenSelector(vec![]),
            types: 3,
            ingress: vec![GenRule { peers: vec![], ports: vec![] }],
            egress: vec![GenRule { peers: vec![], ports: vec![] }],
        },
        corruption: Corruption::PodSelector(SelectorCorruption::BadValue),
    };
    let q = input.corrupted(base());
    assert_eq!(q.would_select, ["x/a", "x/b", "x/c"]);
    (input, q)
}

fn enforce(policies: &[NetworkPolicy]) -> Enforced {
    let mut s = base().clone();
    for p in policies {
        s.upsert_policy(p.clone());
    }
    Enforced::build(&s)
}

#[test]
fn the_real_pipeline_holds_the_property_for_the_issue_reproducer() {
    let (input, q) = open_everything_with_a_broken_selector();
    Verdicts::build(base(), &input.valid_policies(), &q).check(&q).unwrap();
}

#[test]
fn ignoring_the_broken_policy_fails_the_property() {
    let (input, q) = open_everything_with_a_broken_selector();
    let p = input.valid_policies();
    // What a translator that skipped Q would enforce.
    let v = Verdicts { with_q: enforce(&p), without_q: enforce(&p), valid_part: None };
    let err = v.check(&q).unwrap_err();
    assert!(err.0.starts_with("(b)") && err.0.contains("not isolated"), "{err:?}");
}

#[test]
fn keeping_the_rules_under_a_widened_selector_fails_the_property() {
    let (input, q) = open_everything_with_a_broken_selector();
    let p = input.valid_policies();
    // What flock did before issue 11: the selector widened to the namespace, rules kept.
    let mut widened = q.q.clone();
    widened.pod_selector = LabelSelector::default();
    let mut with = p.clone();
    with.push(widened);
    let v = Verdicts { with_q: enforce(&with), without_q: enforce(&p), valid_part: None };
    let err = v.check(&q).unwrap_err();
    assert!(err.0.starts_with("(b)") && err.0.contains("no rule of P or of Q's valid part admits it"), "{err:?}");
}

/// The issue's reproducer on real kernels, through `flockctl sim`: the quickstart plus a
/// policy in `shop` whose podSelector is invalid and whose rule would admit everyone.
/// `tools/debug` must not reach `shop/db`, and the policy is reported on stderr.
#[test]
fn an_invalid_policy_opens_nothing_in_the_simulated_quickstart() {
    use flock::testkit::kernel::{flock_cni_binary, require_root};
    if !require_root("an_invalid_policy_opens_nothing_in_the_simulated_quickstart") {
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = flock::testkit::kernel::TempDir::new("fail-closed");
    let bad = dir.join("open-shop.yaml");
    std::fs::write(
        &bad,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: open-shop, namespace: shop}\n\
         spec:\n  podSelector: {matchLabels: {app: \"web-\"}}\n  ingress: [{}]\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flockctl"))
        .args(["sim", "--manifests"])
        .arg(root.join("deploy/examples/quickstart"))
        .arg("--manifests")
        .arg(&bad)
        .args(["--probe", "5432/TCP", "-o", "json", "--cni-bin-dir"])
        .arg(flock_cni_binary().parent().unwrap())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("warning: NetworkPolicy shop/open-shop: spec.podSelector.matchLabels[app]") && stderr.contains("allowing nothing"),
        "{stderr}"
    );
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let connected = |from: &str, to: &str| {
        doc["probes"][0]["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["from"] == from && r["to"] == to)
            .map(|r| r["connected"].as_bool().unwrap())
            .unwrap()
    };
    // Before the fix the widened selector carried `ingress: [{}]`: debug reached the db.
    assert!(!connected("tools/debug", "shop/db"), "{stdout}");
    // The valid policy of the quickstart still admits the web pod.
    assert!(connected("shop/web", "shop/db"), "{stdout}");
}
