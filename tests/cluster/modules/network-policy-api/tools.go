//go:build tools

// Package tools keeps the conformance suite's packages in this module's graph.
package tools

import _ "sigs.k8s.io/network-policy-api/conformance"
