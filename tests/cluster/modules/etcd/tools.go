//go:build tools

// Package tools keeps etcdctl's main package in this module's graph.
package tools

import _ "go.etcd.io/etcd/etcdctl/v3"
