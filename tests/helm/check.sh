#!/usr/bin/env bash
# The chart deploy/helm/flock, offline: helm lint (strict); deploy/ equals its render with
# default values (render-deploy.sh --check); misspelt, unknown and wrongly typed values are
# refused by values.schema.json with a message naming them; renders with other values are
# valid manifests (kubernetes-validate, strict: the path to it is the first argument) and
# carry what was asked; the ServiceMonitor only where its CRD is served.
set -euo pipefail
cd "$(dirname "$0")/../.."
validate=${1:?usage: tests/helm/check.sh KUBERNETES-VALIDATE}
helm=tests/helm/helm.sh
chart=deploy/helm/flock
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "tests/helm/check.sh: $*" >&2; exit 1; }
template() { "$helm" template flock "$chart" --namespace flock-system "$@"; }

"$helm" lint --strict "$chart" >"$out/lint" 2>&1 || { cat "$out/lint" >&2; fail "helm lint --strict failed"; }
tests/helm/render-deploy.sh --check
echo "helm: lint clean; deploy/ is the chart's render with default values"

# Refused values: each must fail, and the error must name the value.
refused=0
while read -r set name; do
  if template --set "$set" >"$out/bad.yaml" 2>"$out/bad.err"; then
    fail "--set $set was accepted"
  fi
  grep -q -- "$name" "$out/bad.err" || fail "--set $set failed without naming $name: $(cat "$out/bad.err")"
  refused=$((refused + 1))
done <<'LIST'
agent.routng=vxlan routng
agent.routing=bgp routing
agent.metrics.port=ninety metrics
agent.vxlan.port=70000 port
agent.vxlan.mtu=1400 mtu
agent.image.pullPolicy=Sometimes pullPolicy
agent.mtu=100 mtu
agent.extraArgs[0]=-v extraArgs
agent.denialLogging.rate=0 rate
controller.replicas=0 replicas
controller.enforce=yes enforce
controler.enabled=false controler
controller.podSlices.maxPods=1001 maxPods
controller.podSlices.enabled=yes enabled
controller.podSlices.window=5 window
agent.podSource=typha podSource
agent.podSource=slices podSlices.enabled
LIST
echo "helm: $refused bad values refused, each by name"

# Other values: valid manifests carrying them.
template --include-crds \
  --set agent.routing=vxlan --set agent.vxlan.port=4790 --set agent.vxlan.vni=7 --set agent.mtu=1400 \
  --set agent.denialLogging.enabled=false --set agent.auditMode=true --set agent.dnsProxy.enabled=false \
  --set 'agent.extraArgs[0]=--resync-period=60s' --set 'agent.extraEnv[0].name=FLOCK_LOG' --set 'agent.extraEnv[0].value=debug' \
  --set agent.image.tag=0.2.0 --set agent.image.pullPolicy=Always --set agent.metrics.port=9791 \
  --set agent.flockNodeAdmission=true --set controller.replicas=1 --set controller.enforce=on \
  --set 'controller.clusterPodCIDRs={198.18.0.0/16,2001:db8:1::/48}' \
  --set controller.podSlices.enabled=true --set controller.podSlices.maxPods=250 --set agent.podSource=slices >"$out/other.yaml"
"$validate" --quiet --strict -k 1.33.0 "$out/other.yaml" || fail "the render with other values is not valid"
for want in '{name: FLOCK_ROUTING, value: vxlan}' '{name: FLOCK_VXLAN_PORT, value: "4790"}' '{name: FLOCK_VXLAN_VNI, value: "7"}' \
  '{name: FLOCK_CNI_MTU, value: "1400"}' '{name: FLOCK_DENY_LOG_GROUP, value: "0"}' '{name: FLOCK_ALLOW_AUDIT_MODE, value: "true"}' \
  '{name: FLOCK_DNS_PROXY, value: "false"}' '- --resync-period=60s' 'name: FLOCK_LOG' 'image: ghcr.io/flock-cni/flock:0.2.0' \
  'imagePullPolicy: Always' 'containerPort: 9791' 'kind: ValidatingAdmissionPolicy' 'replicas: 1' '{name: FLOCK_ENFORCE, value: "on"}' \
  '{name: FLOCK_CLUSTER_POD_CIDRS, value: "198.18.0.0/16,2001:db8:1::/48"}' '{name: FLOCK_POD_SLICES, value: "true"}' \
  '{name: FLOCK_POD_SLICE_MAX_PODS, value: "250"}' 'name: flock-podslice-writer' 'resources: [podslices]' \
  '{name: FLOCK_POD_SOURCE, value: slices}'; do
  grep -qF -- "$want" "$out/other.yaml" || fail "the render with other values lacks: $want"
done
# Numbers from a values file are floats to Helm: large ones still render as integers.
cat >"$out/big.yaml" <<'VALUES'
agent: {vxlan: {vni: 1000000}, metrics: {port: 9781}, resources: {requests: {cpu: 0.5}}}
controller: {enforcedTimeoutSeconds: 1000000, audit: {maxAgeDays: 3650}}
VALUES
template -f "$out/big.yaml" >"$out/big-render.yaml"
"$validate" --quiet --strict -k 1.33.0 "$out/big-render.yaml" || fail "the render of a values file is not valid"
for want in '{name: FLOCK_VXLAN_VNI, value: "1000000"}' '{name: FLOCK_ENFORCED_TIMEOUT_SECONDS, value: "1000000"}' 'cpu: 0.5'; do
  grep -qF -- "$want" "$out/big-render.yaml" || fail "the render of a values file lacks: $want"
done
# PodSlices off (the default): no writer's flags, grant or admission policy.
template >"$out/default.yaml"
grep -q 'kind: Deployment' "$out/default.yaml" || fail "the default render has no Deployment"
! grep -q 'FLOCK_POD_SLICES\|FLOCK_POD_SOURCE\|podslice-writer\|resources: \[podslices\]' "$out/default.yaml" || fail "PodSlice objects without controller.podSlices.enabled"
# Without the DNS proxy there is no socket keeper, nor the agent's setting for it.
! grep -q 'flock-socket-keeper' "$out/other.yaml" || fail "a socket keeper without the DNS proxy"
template --set controller.enabled=false --set namespace.create=false >"$out/agent-only.yaml"
"$validate" --quiet --strict -k 1.33.0 "$out/agent-only.yaml" || fail "the agent-only render is not valid"
! grep -q 'flock-controller\|kind: Namespace' "$out/agent-only.yaml" || fail "controller.enabled=false or namespace.create=false left objects behind"
echo "helm: renders with other values valid and carrying them"

# The ServiceMonitor: only where the Prometheus Operator's CRD is served.
template >"$out/unmonitored.yaml"
! grep -q 'kind: ServiceMonitor' "$out/unmonitored.yaml" || fail "a ServiceMonitor without its CRD"
template --api-versions monitoring.coreos.com/v1/ServiceMonitor >"$out/monitored.yaml"
grep -q 'kind: ServiceMonitor' "$out/monitored.yaml" || fail "no ServiceMonitor where its CRD is served"
echo "helm: the ServiceMonitor only where its CRD is served"
