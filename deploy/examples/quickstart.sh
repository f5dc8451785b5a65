#!/usr/bin/env bash
# Quickstart: a two-node cluster simulated with network namespaces on this machine — pods
# wired by flock-cni, rules applied with nft by the node agent — probed before and after a
# NetworkPolicy. Run as root on Debian with Rust.
set -euo pipefail
cd "$(dirname "$0")/../.."
tests/setup.sh
cargo build --quiet --release --bin flockctl -p flock --bin flock-cni -p flock-cni
flockctl=target/release/flockctl
ex=deploy/examples/quickstart
echo "== before: no NetworkPolicy, every pod reaches every port"
"$flockctl" sim -f "$ex/cluster.yaml" --probe 5432/TCP --probe 8080/TCP
echo "== after: shop/db accepts only shop/web, on its 'pg' port"
cat "$ex/policies.yaml"
echo
"$flockctl" sim -f "$ex/cluster.yaml" -f "$ex/policies.yaml" --probe 5432/TCP --probe 8080/TCP --show-ruleset node-1
