#!/usr/bin/env bash
# Timings and memory of the running cluster, as JSON (docs/cluster.md).
exec "$(dirname "$0")/fkc.sh" bench "$@"
