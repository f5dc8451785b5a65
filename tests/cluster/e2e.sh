#!/usr/bin/env bash
# The upstream suites, unchanged, on the cluster tests/cluster/up.sh started (docs/cluster.md):
#   tests/cluster/e2e.sh [--suite netpol|api|conformance|all] [--focus REGEX]
# Reports in target/cluster/e2e/; ends with "N passed, N failed, N skipped".
exec "$(dirname "$0")/fkc.sh" e2e "$@"
