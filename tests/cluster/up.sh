#!/usr/bin/env bash
# Starts a real Kubernetes cluster on this machine with flock installed from deploy/ (docs/cluster.md):
#   tests/cluster/up.sh [--nodes N] [--family ipv4|ipv6|dual] [--cni flock|ptp]
exec "$(dirname "$0")/fkc.sh" up "$@"
