#!/usr/bin/env bash
# The whole test suite: unit, golden, tracer, real-kernel (network namespaces + nft) and
# end-to-end tests, then the offline checks of deploy/. Run as root on Debian with Rust;
# kernel tests fail (not skip) here. Every step runs even when an earlier one failed
# (`--no-fail-fast`), and the last line sums it all up.
set -uo pipefail
cd "$(dirname "$0")/.."
tests/setup.sh || exit 1
export FLOCK_REQUIRE_ROOT=1
mkdir -p target
log=target/test-run.log
export FLOCK_KERNEL_TEST_LOG="$PWD/target/kernel-tests.log"
: >"$log"
: >"$FLOCK_KERNEL_TEST_LOG"
failed_steps=()

cargo test --workspace --all-targets --no-fail-fast "$@" 2>&1 | tee -a "$log" || failed_steps+=("cargo test")
cargo test --workspace --doc --no-fail-fast 2>&1 | tee -a "$log" || failed_steps+=("doc tests")
tests/lint-deploy.sh || failed_steps+=("lint-deploy")

sum() { grep -E '^test result: ' "$log" | grep -oE "[0-9]+ $1" | awk '{s += $1} END {print s + 0}'; }
ran=$(grep -c '^RAN ' "$FLOCK_KERNEL_TEST_LOG")
skipped=$(grep -c '^SKIPPED ' "$FLOCK_KERNEL_TEST_LOG")
status=ok
[ ${#failed_steps[@]} -eq 0 ] || status="FAILED: ${failed_steps[*]}"
if [ "$ran" -eq 0 ] && [ ${#failed_steps[@]} -eq 0 ]; then
  status="FAILED: no kernel test ran"
  failed_steps+=("kernel tests")
fi
echo "tests/run.sh: $(sum passed) passed, $(sum failed) failed, $(sum ignored) ignored; $ran kernel tests ran, $skipped skipped; $status"
[ ${#failed_steps[@]} -eq 0 ]
