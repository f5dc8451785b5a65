#!/usr/bin/env bash
# The fuzz smoke run (CI runs it after the test suite): builds every cargo-fuzz target of
# fuzz/ and runs each for FLOCK_FUZZ_SECONDS (default 20) from a copy of its committed corpus
# (pipeline_full from pipeline's), one core, without a sanitizer: flock forbids unsafe code,
# so what the smoke run can find is a panic — a check that fails or a bug — and that is fast
# to find without ASan. A crash fails the run; its input stays in
# target/fuzz-smoke/artifacts/<target>/ and the command that replays it is printed.
# Installs cargo-fuzz from crates.io when it is missing. Needs only the stable toolchain
# (RUSTC_BOOTSTRAP=1 lets it take the instrumentation flags).
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${FLOCK_FUZZ_SECONDS:-20}
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "fuzz-smoke: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked --version 0.13.2 || exit 1
fi
work=$PWD/target/fuzz-smoke
rm -rf "$work"
mkdir -p "$work"
cd fuzz || exit 1
export RUSTC_BOOTSTRAP=1
started=$(date +%s)
cargo fuzz build -O -s none || { echo "fuzz-smoke: the fuzz targets do not build" >&2; exit 1; }
echo "fuzz-smoke: built in $(($(date +%s) - started)) s" >&2
failed=()
for target in $(cargo fuzz list); do
  corpus=corpus/$target
  [ "$target" = pipeline_full ] && corpus=corpus/pipeline
  mkdir -p "$work/corpus/$target" "$work/artifacts/$target"
  cp -r "$corpus/." "$work/corpus/$target/"
  extra=()
  case $target in
    manifest) extra=(-max_len=2048) ;;
    dns_answer | dns_exchange) extra=(-max_len=1024) ;;
  esac
  log=$work/$target.log
  if cargo fuzz run -O -s none "$target" "$work/corpus/$target" -- \
    -max_total_time="$seconds" -artifact_prefix="$work/artifacts/$target/" "${extra[@]}" >"$log" 2>&1; then
    # "Done 12345 runs in 20 second(s)"
    echo "fuzz-smoke: $target: $(grep -E '^Done [0-9]+ runs' "$log" | tail -1)" >&2
  else
    failed+=("$target")
    tail -n 60 "$log" >&2
    for crash in "$work/artifacts/$target"/*; do
      [ -e "$crash" ] || continue
      echo "fuzz-smoke: $target crashed; replay with: (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run -O -s none $target $crash)" >&2
    done
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz-smoke: FAILED: ${failed[*]} (logs in $work)" >&2
  exit 1
fi
echo "fuzz-smoke: every target ran ${seconds} s from its corpus without a crash ($(($(date +%s) - started)) s in all)" >&2
