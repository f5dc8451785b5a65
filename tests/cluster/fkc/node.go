package main

// A node: a network namespace (net.go), a mount namespace in which the paths a node owns
// (nodePaths) are bind mounts of the node's own directories, a UTS namespace with its
// name, and in them containerd, a kubelet and kube-proxy.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func (c *cluster) nodeRoot(node string) string { return filepath.Join(c.l.State(), "nodes", node) }

// nodeFile is where a node's path (say /run/containerd/containerd.sock) is on the host.
func (c *cluster) nodeFile(node, path string) string { return filepath.Join(c.nodeRoot(node), path) }

// prepareNSDir makes state/ns a private mount, so that namespace files can be bound in it
// (a namespace file may not be bound on a shared mount).
func (c *cluster) prepareNSDir() error {
	dir := filepath.Join(c.l.State(), "ns")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := run(nil, "mount", "--bind", dir, dir); err != nil {
		return err
	}
	if err := c.st.record(func(s *clusterState) { s.Mounts = append(s.Mounts, dir) }); err != nil {
		return err
	}
	return run(nil, "mount", "--make-private", dir)
}

// mkdirHost makes a mount point on the host's file system when it is missing, and records
// every directory it made (down removes them: they hold nothing).
func (c *cluster) mkdirHost(path string) error {
	var made []string
	for p := path; p != "/"; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil {
			break
		}
		made = append(made, p)
	}
	for i := len(made) - 1; i >= 0; i-- {
		if err := os.Mkdir(made[i], 0o755); err != nil && !os.IsExist(err) {
			return err
		}
		d := made[i]
		if err := c.st.record(func(s *clusterState) { s.Dirs = append(s.Dirs, d) }); err != nil {
			return err
		}
	}
	return nil
}

// setupNodeNamespaces makes a node's mount and UTS namespaces and its bind mounts.
func (c *cluster) setupNodeNamespaces(n nodePlan) error {
	ns := c.nodeNS(n.Name)
	root := c.nodeRoot(n.Name)
	var script []string
	// The node's mount namespace holds no copy of the other nodes' namespace files.
	script = append(script, "umount -l "+shellQuote(filepath.Join(c.l.State(), "ns")))
	for _, p := range nodePaths {
		src := filepath.Join(root, p)
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		if err := c.mkdirHost(p); err != nil {
			return err
		}
		script = append(script,
			fmt.Sprintf("mount --bind %s %s", shellQuote(src), shellQuote(p)),
			// Shared inside the node (the kubelet's volumes reach the containers), never
			// with the host: the namespace itself is a slave of the host's.
			fmt.Sprintf("mount --make-rshared %s", shellQuote(p)))
	}
	resolv := filepath.Join(root, "resolv.conf")
	if err := writeFile(resolv, []byte(resolvConf(c.plan)), 0o644); err != nil {
		return err
	}
	script = append(script, fmt.Sprintf("mount --bind %s /etc/resolv.conf", shellQuote(resolv)))
	script = append(script, "hostname "+n.Name)

	for _, f := range []string{ns.Mount, ns.UTS} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			return err
		}
	}
	// unshare binds the new namespaces to the files, which keep them after it exits.
	if err := run(nil, "unshare", "--mount="+ns.Mount, "--uts="+ns.UTS, "--propagation=slave", "true"); err != nil {
		return err
	}
	if err := c.st.record(func(s *clusterState) { s.Mounts = append(s.Mounts, ns.Mount, ns.UTS) }); err != nil {
		return err
	}
	return run(nil, "nsenter", "--mount="+ns.Mount, "--uts="+ns.UTS, "--", "/bin/sh", "-ec", strings.Join(script, "\n"))
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// startNode brings a node up to a running kubelet and kube-proxy.
func (c *cluster) startNode(n nodePlan) error {
	root := c.nodeRoot(n.Name)
	// The node's image: the reference CNI plugins every kubelet node has beside the
	// runtime (flock-cni comes from flock's DaemonSet).
	for _, plugin := range []string{"loopback", "host-local", "ptp", "portmap"} {
		if err := copyFile(c.l.Bin(plugin), c.nodeFile(n.Name, "/opt/cni/bin/"+plugin), 0o755); err != nil {
			return err
		}
	}
	conf := filepath.Join(root, "etc/kubernetes")
	if err := writeFile(filepath.Join(conf, "containerd.toml"), []byte(containerdConfig("/usr/sbin/runc", agnhostImage, !hasCapability(capSysResource))), 0o644); err != nil {
		return err
	}
	if err := c.startComponent(component{Name: n.Name + "-containerd", Node: n.Name, Bin: c.l.Bin("containerd"),
		Args: []string{"--config", "/etc/kubernetes/containerd.toml", "--log-level", "warn"}}); err != nil {
		return err
	}
	sock := c.nodeFile(n.Name, "/run/containerd/containerd.sock")
	if err := waitFor(60*time.Second, n.Name+"'s containerd", func() error {
		_, err := output(c.l.Bin("ctr"), "--address", sock, "version")
		return err
	}); err != nil {
		return err
	}
	if err := c.importImages(n); err != nil {
		return err
	}

	// The kubelet: its cgroup root is the node's own under fkc's cgroup.
	cgroupRoot := filepath.Join(c.st.CgroupBase, n.Name)
	if err := c.makeNodeCgroup(cgroupRoot); err != nil {
		return err
	}
	kc := filepath.Join(conf, "kubelet.kubeconfig")
	if err := writeFile(kc, []byte(kubeconfig(c.plan.apiURL(), c.pk.path("ca.crt"), c.pk.path(n.Name+"-kubelet-client.crt"),
		c.pk.path(n.Name+"-kubelet-client.key"), "system:node:"+n.Name)), 0o600); err != nil {
		return err
	}
	kcfg := filepath.Join(conf, "kubelet.yaml")
	if err := writeFile(kcfg, []byte(kubeletConfig(c.plan, n, c.pk, cgroupRoot, "/etc/resolv.conf")), 0o644); err != nil {
		return err
	}
	if err := c.startComponent(component{Name: n.Name + "-kubelet", Node: n.Name, Bin: c.l.Bin("kubelet"),
		Args: kubeletArgs(n, "/etc/kubernetes/kubelet.yaml", "/etc/kubernetes/kubelet.kubeconfig")}); err != nil {
		return err
	}

	pkc := filepath.Join(conf, "kube-proxy.kubeconfig")
	if err := writeFile(pkc, []byte(kubeconfig(c.plan.apiURL(), c.pk.path("ca.crt"), c.pk.path("kube-proxy.crt"),
		c.pk.path("kube-proxy.key"), "system:kube-proxy")), 0o600); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(conf, "kube-proxy.yaml"), []byte(kubeProxyConfig(n, "/etc/kubernetes/kube-proxy.kubeconfig")), 0o644); err != nil {
		return err
	}
	return c.startComponent(component{Name: n.Name + "-kube-proxy", Node: n.Name, Bin: c.l.Bin("kube-proxy"),
		Args: []string{"--config=/etc/kubernetes/kube-proxy.yaml", "--v=1"}})
}

// makeNodeCgroup makes a kubelet's cgroup root in every hierarchy (the kubelet checks that
// it exists in each), with the CPUs and memory nodes of its parent.
func (c *cluster) makeNodeCgroup(rel string) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		dir := filepath.Join(h.Dir, rel)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating cgroup %s: %w", dir, err)
		}
		if err := inheritCpuset(h, dir); err != nil {
			return err
		}
	}
	return nil
}

// importImages loads every image a node needs into its containerd, under the names the
// manifests and tests use: nothing is ever pulled.
func (c *cluster) importImages(n nodePlan) error {
	tars := []string{filepath.Join(c.l.Cache, "images", "agnhost.tar"), filepath.Join(c.l.Cache, "images", "coredns.tar")}
	for _, img := range c.flockImages {
		tars = append(tars, img.Tar)
	}
	tars = append(tars, c.extraImages...)
	for _, t := range tars {
		if err := c.importTar(n, t); err != nil {
			return err
		}
	}
	return nil
}

// importTar loads one image archive into a node's containerd (the namespace kubelet's CRI
// uses).
func (c *cluster) importTar(n nodePlan, tar string) error {
	sock := c.nodeFile(n.Name, "/run/containerd/containerd.sock")
	if err := run(nil, c.l.Bin("ctr"), "--address", sock, "-n", "k8s.io", "images", "import", "--snapshotter", "overlayfs", tar); err != nil {
		return fmt.Errorf("importing %s into %s: %w", filepath.Base(tar), n.Name, err)
	}
	return nil
}

const capSysResource = 24

// hasCapability reads this process's effective capabilities.
func hasCapability(bit uint) bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && n&(1<<bit) != 0
		}
	}
	return false
}

func copyFile(src, dst string, mode os.FileMode) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return writeFile(dst, data, mode)
}

// waitFor polls until check succeeds, for at most timeout; the error names what was
// awaited and the last failure.
func waitFor(timeout time.Duration, what string, check func() error) error {
	deadline := time.Now().Add(timeout)
	delay := 100 * time.Millisecond
	for {
		err := check()
		if err == nil {
			return nil
		}
		if interrupted.Load() {
			return errInterrupted
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %w", what, timeout, err)
		}
		time.Sleep(delay)
		if delay < time.Second {
			delay *= 2
		}
	}
}
