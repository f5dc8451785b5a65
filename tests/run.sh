#!/usr/bin/env bash
# The whole test suite: unit, golden, tracer, real-kernel (network namespaces + nft) and
# end-to-end tests. Run as root on Debian with Rust; kernel tests fail (not skip) here.
set -euo pipefail
cd "$(dirname "$0")/.."
tests/setup.sh
export FLOCK_REQUIRE_ROOT=1
cargo test --workspace --all-targets "$@"
cargo test --workspace --doc
tests/lint-deploy.sh
