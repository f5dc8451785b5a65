#!/usr/bin/env bash
# Runs flock for real on a local kind cluster (needs docker, kind and kubectl; not run in
# CI — these machines have no container engine). Creates a two-node cluster without a
# default CNI, builds and loads the image, installs flock-agent, and checks that pods get
# networking and that a NetworkPolicy is enforced.
#
#   deploy/kind/run.sh            # create, install, smoke-test
#   deploy/kind/run.sh delete     # remove the cluster
set -euo pipefail
cd "$(dirname "$0")/../.."
cluster=${FLOCK_KIND_CLUSTER:-flock}
image=ghcr.io/flock-cni/flock:dev

if [ "${1:-}" = delete ]; then
  kind delete cluster --name "$cluster"
  exit 0
fi

cat <<YAML | kind create cluster --name "$cluster" --config=-
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  disableDefaultCNI: true
  kubeProxyMode: nftables
nodes:
  - role: control-plane
  - role: worker
YAML

docker build -t "$image" .
kind load docker-image "$image" --name "$cluster"
kubectl kustomize deploy/agent | sed "s#ghcr.io/flock-cni/flock:0.1.0#$image#" | kubectl apply -f -
kubectl -n flock-system rollout status daemonset/flock-agent --timeout=180s
kubectl wait --for=condition=Ready nodes --all --timeout=180s

# Smoke test: two pods talk; after a default-deny, they do not.
kubectl create namespace smoke --dry-run=client -o yaml | kubectl apply -f -
kubectl -n smoke run server --image=registry.k8s.io/e2e-test-images/agnhost:2.53 --labels=app=server --port=8080 -- /agnhost netexec --http-port=8080
kubectl -n smoke wait --for=condition=Ready pod/server --timeout=120s
ip=$(kubectl -n smoke get pod server -o jsonpath='{.status.podIP}')
kubectl -n smoke run client --rm -i --restart=Never --image=registry.k8s.io/e2e-test-images/agnhost:2.53 -- /agnhost connect "$ip:8080" --timeout=5s
cat <<YAML | kubectl apply -f -
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: smoke}
spec: {podSelector: {matchLabels: {app: server}}, policyTypes: [Ingress]}
YAML
sleep 2
if kubectl -n smoke run client2 --rm -i --restart=Never --image=registry.k8s.io/e2e-test-images/agnhost:2.53 -- /agnhost connect "$ip:8080" --timeout=5s; then
  echo "FAIL: the NetworkPolicy was not enforced" >&2
  exit 1
fi
echo "OK: pods are networked by flock and the NetworkPolicy is enforced"
kubectl -n flock-system exec ds/flock-agent -- nft list table inet flock | head -40
