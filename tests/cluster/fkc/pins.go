package main

// The pinned components: which module each binary comes from, its main package and how it
// is stamped with its version. The versions themselves live in the modules' go.mod files
// (tests/cluster/modules/*); the cache directory is named by a hash of those files and of
// this recipe, so changing either builds into a new directory.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// Versions of the pinned releases, as their go.mod files require them. pinsMatchModules
// (a unit test) keeps the two in step.
const (
	kubernetesVersion = "v1.37.2"
	etcdVersion       = "v3.6.16"
	containerdVersion = "v2.2.9"
	crictlVersion     = "v1.37.0"
	corednsVersion    = "v1.14.7"
	cniPluginsVersion = "v1.10.0"
	// The agnhost image tag Kubernetes v1.37.2's e2e framework names
	// (test/utils/image/manifest.go); agnhost is built from that same module.
	agnhostVersion = "2.66.1"
	// recipeVersion changes when something about how binaries are built changes that the
	// table below does not show (flags, environment).
	recipeVersion = "5"
)

// A binary of the cluster and how it is built.
type binary struct {
	Name    string // file name under bin/
	Module  string // directory under tests/cluster/modules
	Package string // main package
	Version string // what the binary reports
	// Test builds it with `go test -c` (e2e.test is a test binary).
	Test bool
	// Stamp is the -X flags setting the version variables.
	Stamp []string
	// Set names the group the binary belongs to: "cluster" (build.sh, up.sh) or "e2e"
	// (e2e.sh builds those on demand).
	Set string
}

func kubeStamp() []string {
	major, minor := "1", "37"
	vars := []string{}
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		vars = append(vars,
			pkg+".gitVersion="+kubernetesVersion,
			pkg+".gitMajor="+major,
			pkg+".gitMinor="+minor,
			pkg+".gitTreeState=clean",
			pkg+".gitCommit=module-"+kubernetesVersion,
			pkg+".buildDate=1970-01-01T00:00:00Z",
		)
	}
	return vars
}

func binaries() []binary {
	k8s := func(name, pkg string) binary {
		return binary{Name: name, Module: "kubernetes", Package: pkg, Version: kubernetesVersion, Stamp: kubeStamp(), Set: "cluster"}
	}
	cni := func(name, pkg string) binary {
		return binary{Name: name, Module: "cni-plugins", Package: "github.com/containernetworking/plugins/plugins/" + pkg,
			Version: cniPluginsVersion, Set: "cluster",
			Stamp: []string{"github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=" + cniPluginsVersion}}
	}
	ctrd := func(name string) binary {
		return binary{Name: name, Module: "containerd", Package: "github.com/containerd/containerd/v2/cmd/" + name,
			Version: containerdVersion, Set: "cluster",
			Stamp: []string{
				"github.com/containerd/containerd/v2/version.Version=" + containerdVersion,
				"github.com/containerd/containerd/v2/version.Revision=module-" + containerdVersion,
			}}
	}
	list := []binary{
		k8s("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
		k8s("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"),
		k8s("kube-scheduler", "k8s.io/kubernetes/cmd/kube-scheduler"),
		k8s("kubelet", "k8s.io/kubernetes/cmd/kubelet"),
		k8s("kube-proxy", "k8s.io/kubernetes/cmd/kube-proxy"),
		k8s("kubectl", "k8s.io/kubernetes/cmd/kubectl"),
		{Name: "agnhost", Module: "kubernetes", Package: "k8s.io/kubernetes/test/images/agnhost", Version: agnhostVersion, Set: "cluster"},
		{Name: "etcd", Module: "etcd", Package: "./cmd/etcd", Version: etcdVersion, Set: "cluster"},
		{Name: "etcdctl", Module: "etcd", Package: "go.etcd.io/etcd/etcdctl/v3", Version: etcdVersion, Set: "cluster"},
		ctrd("containerd"),
		ctrd("containerd-shim-runc-v2"),
		ctrd("ctr"),
		{Name: "crictl", Module: "crictl", Package: "sigs.k8s.io/cri-tools/cmd/crictl", Version: crictlVersion, Set: "cluster",
			Stamp: []string{"sigs.k8s.io/cri-tools/pkg/version.Version=" + strings.TrimPrefix(crictlVersion, "v")}},
		{Name: "coredns", Module: "coredns", Package: "./cmd/coredns", Version: corednsVersion, Set: "cluster"},
		cni("loopback", "main/loopback"),
		cni("host-local", "ipam/host-local"),
		cni("ptp", "main/ptp"),
		cni("portmap", "meta/portmap"),
		{Name: "e2e.test", Module: "kubernetes", Package: "k8s.io/kubernetes/test/e2e", Version: kubernetesVersion, Test: true, Stamp: kubeStamp(), Set: "e2e"},
		{Name: "ginkgo", Module: "kubernetes", Package: "github.com/onsi/ginkgo/v2/ginkgo", Version: "(k8s " + kubernetesVersion + "'s)", Set: "e2e"},
		// network-policy-api's conformance suite, as its CI runs it (go test), compiled.
		{Name: "npapi-conformance.test", Module: "network-policy-api", Package: "sigs.k8s.io/network-policy-api/conformance", Version: networkPolicyAPIVersion, Test: true, Set: "e2e"},
	}
	return list
}

// pinsHash names the cache directory: the modules' go.mod and go.sum, the recipe's version
// and the Go toolchain. Each binary's own recipe (module, package, flags) is in its stamp,
// so a binary added to the table builds into the same cache without rebuilding the others.
func pinsHash(modulesDir string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "recipe %s\ngo %s\n", recipeVersion, runtime.Version())
	entries, err := os.ReadDir(modulesDir)
	if err != nil {
		return "", fmt.Errorf("reading the pinned modules in %s: %w", modulesDir, err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	for _, name := range names {
		for _, file := range []string{"go.mod", "go.sum"} {
			data, err := os.ReadFile(filepath.Join(modulesDir, name, file))
			if err != nil {
				return "", fmt.Errorf("reading the pins of module %s: %w", name, err)
			}
			fmt.Fprintf(h, "== %s/%s %d\n", name, file, len(data))
			h.Write(data)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// recipe is what a binary's stamp must match for the cached file to be reused.
func (b binary) recipe() string {
	return fmt.Sprintf("%s %s %s %v %s", b.Module, b.Package, b.Version, b.Test, strings.Join(b.Stamp, ","))
}
