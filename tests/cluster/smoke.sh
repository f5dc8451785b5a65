#!/usr/bin/env bash
# The named checks of flock on the running cluster; ends with 'N passed, N failed' (docs/cluster.md).
exec "$(dirname "$0")/fkc.sh" smoke "$@"
