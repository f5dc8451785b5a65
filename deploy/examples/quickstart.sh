#!/usr/bin/env bash
# Quickstart: render the example cluster's node-1 ruleset and validate it with nft in an
# empty network namespace. Run as root on Debian with Rust.
set -euo pipefail
cd "$(dirname "$0")/../.."
tests/setup.sh
cargo build --quiet --release --bin flockctl
exec target/release/flockctl render --manifests deploy/examples/quickstart --node node-1 --check
