//! Generated conformance cases on real kernels (root): 200 random cases
//! (`flock::testkit::cases`: policies, changes, relabels, deletions on the x/y/z model,
//! expectations from the reference evaluator) through one `flockctl conformance` run, in a
//! shuffled order — the cluster and its connections carry over from case to case, so this
//! also checks that no outcome depends on what ran before.
//!
//! `FLOCK_RANDOM_CASES_SEED` and `FLOCK_RANDOM_ORDER_SEED` reproduce a run (both are printed).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use flock::testkit::cases::generate;
use flock::testkit::kernel::{flock_cni_binary, require_root};
use flock::testkit::{self, BASE_CLUSTER_YAML};

const CASES: usize = 200;

fn seed(var: &str, default: u64) -> u64 {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn two_hundred_random_cases_pass_in_a_shuffled_order() {
    if !require_root("two_hundred_random_cases_pass_in_a_shuffled_order") {
        return;
    }
    // The cases are fixed (a failure is reproducible from the source alone); the order is
    // new every run.
    let cases_seed = seed("FLOCK_RANDOM_CASES_SEED", 2026);
    let clock = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1);
    let order_seed = seed("FLOCK_RANDOM_ORDER_SEED", clock);
    eprintln!("FLOCK_RANDOM_CASES_SEED={cases_seed} FLOCK_RANDOM_ORDER_SEED={order_seed}");

    let dir = std::env::temp_dir().join(format!("flock-random-cases-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("base-cluster.yaml"), BASE_CLUSTER_YAML).unwrap();
    let cases = generate(&testkit::base_cluster(), cases_seed, CASES);
    for c in &cases {
        c.write(&dir).unwrap();
    }

    let started = Instant::now();
    let cni_dir = flock_cni_binary().parent().unwrap().to_path_buf();
    let out = Command::new(env!("CARGO_BIN_EXE_flockctl"))
        .args(["conformance", dir.to_str().unwrap(), "--shuffle", &order_seed.to_string(), "--timeout-ms", "300"])
        .args(["--cni-bin-dir", cni_dir.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let failures: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
    eprintln!("{} cases in {:.1}s; {}", CASES, started.elapsed().as_secs_f64(), stdout.lines().last().unwrap_or_default());
    assert!(
        out.status.success() && failures.is_empty(),
        "random cases failed (cases kept in {}; FLOCK_RANDOM_CASES_SEED={cases_seed} FLOCK_RANDOM_ORDER_SEED={order_seed}):\n{}\n{stderr}",
        dir.display(),
        failures.join("\n")
    );
    assert!(stdout.contains(&format!("{CASES} passed, 0 failed, 0 skipped")), "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}
