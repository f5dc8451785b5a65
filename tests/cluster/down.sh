#!/usr/bin/env bash
# Removes everything tests/cluster/up.sh made, also after a crash (docs/cluster.md).
exec "$(dirname "$0")/fkc.sh" down "$@"
