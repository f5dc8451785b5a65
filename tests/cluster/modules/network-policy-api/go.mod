// network-policy-api: the ClusterNetworkPolicy CRD the cluster installs (from the module,
// not a download) and the upstream conformance suite (tests/cluster/e2e.sh --suite api).
module flock.test/cluster/network-policy-api

go 1.26.6

require sigs.k8s.io/network-policy-api v0.3.0
