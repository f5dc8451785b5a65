#!/usr/bin/env bash
# Runs the pinned helm (tests/helm/go.mod), built first from the Go module proxy into
# target/helm/ when this version is not there yet (docs/development.md: its cold build time).
# Usage: tests/helm/helm.sh ARGS...
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
version=$(awk '$1 == "require" && $2 == "helm.sh/helm/v4" {print $3}' "$here/go.mod")
[ -n "$version" ] || { echo "tests/helm/helm.sh: no helm.sh/helm/v4 requirement in $here/go.mod" >&2; exit 1; }
# Named by the version and the module sums: a change of either builds anew.
bin="$root/target/helm/helm-$version-$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)"
if [ ! -x "$bin" ]; then
  command -v go >/dev/null || { echo "tests/helm/helm.sh: Go is needed to build helm $version" >&2; exit 1; }
  mkdir -p "$root/target/helm"
  echo "tests/helm/helm.sh: building helm $version from the Go module proxy (once)" >&2
  start=$(date +%s)
  (cd "$here" && GOTOOLCHAIN=local GOWORK=off CGO_ENABLED=0 go build -trimpath -o "$bin.tmp" \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version" helm.sh/helm/v4/cmd/helm)
  mv "$bin.tmp" "$bin"
  echo "tests/helm/helm.sh: built helm $version in $(( $(date +%s) - start )) s" >&2
fi
exec "$bin" "$@"
