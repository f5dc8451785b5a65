#!/usr/bin/env bash
# Quickstart: a two-node cluster simulated with network namespaces on this machine — pods
# wired by flock-cni, rules applied with nft by the node agent — probed before and after a
# NetworkPolicy. Run as root on Debian with Rust.
set -euo pipefail
cd "$(dirname "$0")/../.."
tests/setup.sh
# Not --quiet: a first build compiles about 240 crates and takes minutes (11.5 min on a
# 2-core VM shared with other jobs), and cargo's progress shows it is under way.
echo "== building flockctl and flock-cni (release): the first build takes several minutes,"
echo "   later runs reuse it; cargo shows its progress"
cargo build --release --bin flockctl -p flock --bin flock-cni -p flock-cni
flockctl=target/release/flockctl
ex=deploy/examples/quickstart
probes=(--probe 5432/TCP --probe 8080/TCP)
echo "== before: no NetworkPolicy"
echo "   Probes over IPv4 from every pod to every other pod, on TCP 5432 (shop/db's 'pg' port)"
echo "   and TCP 8080 (the 'http' port of shop/web and tools/debug): each pod reaches every"
echo "   port another pod serves."
"$flockctl" sim -f "$ex/cluster.yaml" "${probes[@]}"
echo "== after: shop/db accepts only shop/web, on its 'pg' port"
cat "$ex/policies.yaml"
echo
echo "   The same probes: shop/db now answers only shop/web, on TCP 5432; everything else sent"
echo "   to shop/db is dropped (X); connections between the other pods are unchanged."
"$flockctl" sim -f "$ex/cluster.yaml" -f "$ex/policies.yaml" "${probes[@]}" --show-ruleset node-1
