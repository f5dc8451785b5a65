//go:build tools

// Package tools names helm's main package.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
