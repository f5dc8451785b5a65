#!/usr/bin/env bash
# CI's part of the real cluster (docs/cluster.md): fkc's own checks always (go vet, its unit
# tests: standard library only, no cache needed); the cluster smoke — up, smoke, the first of
# flock's cases through flockctl conformance --kubeconfig, down — only
# where the binary cache is already filled, so that a cold cache never turns CI red. It says
# which, either way.
set -uo pipefail
cd "$(dirname "$0")/../.."
if ! command -v go >/dev/null; then
  echo "tests/cluster/ci.sh: no Go on this machine: the real cluster's checks are skipped"
  exit 0
fi
status=0
unformatted=$(cd tests/cluster/fkc && gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "tests/cluster/ci.sh: not gofmt-formatted: $unformatted" >&2
  status=1
fi
(cd tests/cluster/fkc && GOTOOLCHAIN=local GOWORK=off go vet ./... && GOTOOLCHAIN=local GOWORK=off go test -count=1 ./...) || status=1
[ $status -eq 0 ] || exit $status

cache=$(tests/cluster/fkc.sh env | sed -n 's/^FKC_CACHE=//p')
if ! tests/cluster/fkc.sh cached >/dev/null 2>&1; then
  echo "tests/cluster/ci.sh: the cluster smoke is skipped: the binary cache $cache is not filled (tests/cluster/build.sh fills it; docs/cluster.md)"
  exit 0
fi
echo "tests/cluster/ci.sh: the binary cache $cache is filled: running the cluster smoke (IPv4)"
# A crash, a failed check or an interrupt all end with the cluster removed.
trap 'tests/cluster/down.sh || exit 1' EXIT
tests/cluster/down.sh >/dev/null 2>&1 || true
tests/cluster/up.sh --family ipv4 || exit 1
tests/cluster/smoke.sh || status=1
# flockctl conformance --kubeconfig on the real cluster: the first cases of the corpus (the
# whole corpus is `e2e.sh --suite cases`, about 9 minutes here).
tests/cluster/e2e.sh --suite cases --focus '^0[0-2]' || status=1
exit $status
