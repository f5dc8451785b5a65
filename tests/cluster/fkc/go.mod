// fkc brings up, checks and removes flock's real Kubernetes cluster on one machine
// (tests/cluster/*.sh are its entry points). Standard library only, so that CI can vet and
// test it without the cluster's module cache.
module flock.test/cluster/fkc

go 1.26.0
