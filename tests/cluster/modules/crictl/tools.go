//go:build tools

// Package tools names crictl's main package.
package tools

import _ "sigs.k8s.io/cri-tools/cmd/crictl"
