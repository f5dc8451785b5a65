#!/usr/bin/env bash
# Fills the cache with the real cluster's pinned binaries and images (docs/cluster.md).
exec "$(dirname "$0")/fkc.sh" build "$@"
