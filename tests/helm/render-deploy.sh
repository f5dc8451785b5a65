#!/usr/bin/env bash
# deploy/'s manifests are `helm template` of the chart deploy/helm/flock with its default
# values (one source of truth): with no argument this writes them, with --check it fails,
# naming each file, when deploy/ differs from the chart. The opt-in admission policy
# (agent.flockNodeAdmission) is rendered with that one value on. deploy/'s kustomizations
# and the files no template makes (the CNI config, the dashboard, examples) are left alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
check=false
case "${1:-}" in
  --check) check=true ;;
  "") ;;
  *) echo "usage: tests/helm/render-deploy.sh [--check]" >&2; exit 2 ;;
esac
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
render() { tests/helm/helm.sh template flock deploy/helm/flock --namespace flock-system "$@"; }
render --include-crds >"$out/default.yaml"
render --set agent.flockNodeAdmission=true --show-only templates/agent/flocknode-admission.yaml >"$out/admission.yaml"
python3 - "$out" "$check" <<'PY'
import os, re, sys
out, check = sys.argv[1], sys.argv[2] == "true"
# Where each source of the chart lands in deploy/.
def targets(source):
    if source == "crds/flocknodes.flock.dev.yaml":
        return ["deploy/agent/crds/flocknodes.flock.dev.yaml"]
    if source.startswith("crds/"):
        return ["deploy/controller/crds/" + source[len("crds/"):]]
    if source == "templates/namespace.yaml":
        return ["deploy/agent/namespace.yaml", "deploy/controller/namespace.yaml"]
    for part in ("agent", "controller"):
        if source.startswith(f"templates/{part}/"):
            return [f"deploy/{part}/" + source[len(f"templates/{part}/"):]]
    sys.exit(f"tests/helm/render-deploy.sh: no place in deploy/ for the chart's {source}")
files = {}
for name in ("default.yaml", "admission.yaml"):
    text = open(os.path.join(out, name)).read()
    # Each file of the chart: "---" then "# Source: flock/<path>", then its text.
    parts = re.split(r"^---\n# Source: flock/(\S+)\n", text, flags=re.M)
    if parts[0].strip():
        sys.exit(f"tests/helm/render-deploy.sh: unexpected text before the first source: {parts[0][:200]!r}")
    # A file of several documents comes as one source per document, in order.
    for source, body in zip(parts[1::2], parts[2::2]):
        for target in targets(source):
            files.setdefault(target, []).append(body.rstrip("\n") + "\n")
files = {target: "---\n".join(docs) for target, docs in files.items()}
stale = []
for target, body in sorted(files.items()):
    have = open(target).read() if os.path.exists(target) else None
    if have == body:
        continue
    if check:
        stale.append(target)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "w").write(body)
        print(f"wrote {target}")
if stale:
    for t in stale:
        print(f"tests/helm/render-deploy.sh: {t} is not what the chart renders (run tests/helm/render-deploy.sh)", file=sys.stderr)
    sys.exit(1)
PY
