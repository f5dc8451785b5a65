#!/usr/bin/env bash
# Builds fkc, the real cluster's tool (tests/cluster/fkc: Go, standard library only), into
# target/cluster/fkc and runs it from the repository's root: the other scripts here call it.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v go >/dev/null || { echo "tests/cluster: Go is needed (Go 1.26 on the project's machines)" >&2; exit 1; }
mkdir -p target/cluster
(cd tests/cluster/fkc && GOTOOLCHAIN=local GOWORK=off go build -o ../../../target/cluster/fkc .)
exec target/cluster/fkc "$@"
