package main

// up: a cluster from the cache, flock installed as docs/install.md tells users (or the ptp
// baseline), CoreDNS; it returns when every node, every flock pod and CoreDNS are Ready.

import (
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

//go:embed manifests/coredns.yaml
var corednsManifest string

type cluster struct {
	l    *layout
	st   *clusterState
	plan *clusterPlan
	pk   *pki
	k    kube

	flockImages []flockImage
	extraImages []string

	compMu sync.Mutex
	comps  map[string]component
}

func cmdUp(args []string) error {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	nodes := fs.Int("nodes", 2, "number of nodes")
	family := fs.String("family", "ipv4", "ipv4, ipv6 or dual")
	cni := fs.String("cni", "flock", "flock, or ptp (Debian's reference plugins: the baseline)")
	keep := fs.Bool("keep-on-failure", false, "leave what a failed up made running, for a look (down removes it)")
	if err := fs.Parse(args); err != nil {
		return exitCode(2)
	}
	plan, err := planCluster(*nodes, *family, *cni)
	if err != nil {
		return err
	}
	if err := plan.check(); err != nil {
		return err
	}
	l, err := newLayout()
	if err != nil {
		return err
	}
	if err := l.lock("up"); err != nil {
		return err
	}
	if _, err := os.Stat(statePath(l)); err == nil {
		return fmt.Errorf("a cluster is recorded in %s (running, or left by a crash): run tests/cluster/down.sh first", l.State())
	}
	t0 := time.Now()
	if err := l.build("cluster"); err != nil {
		return err
	}
	c := &cluster{l: l, plan: plan, comps: map[string]component{},
		k: kube{kubectl: l.Bin("kubectl"), kubeconfig: l.Kubeconfig()}}
	if plan.CNI == "flock" {
		imgs, err := l.buildFlockImages()
		if err != nil {
			return err
		}
		c.flockImages = imgs
	}
	tBuilt := time.Now()
	err = c.up()
	if err != nil {
		if *keep {
			progress("up failed; left running for a look (logs in %s); tests/cluster/down.sh removes it", l.Logs())
			return err
		}
		progress("up failed: %v", err)
		progress("removing what it made (logs kept in %s; --keep-on-failure keeps the cluster)", l.Logs())
		if derr := l.down(); derr != nil {
			return errors.Join(err, derr)
		}
		return err
	}
	progress("up: the cluster is ready in %.0f s (%.0f s after the build); KUBECONFIG=%s",
		time.Since(t0).Seconds(), time.Since(tBuilt).Seconds(), l.Kubeconfig())
	return writeFile(filepath.Join(l.Target, "up-seconds.json"),
		[]byte(fmt.Sprintf(`{"total_s": %.1f, "after_build_s": %.1f, "nodes": %d, "family": %q, "cni": %q}`+"\n",
			time.Since(t0).Seconds(), time.Since(tBuilt).Seconds(), len(plan.Nodes), plan.Family, plan.CNI)), 0o644)
}

func (c *cluster) up() error {
	// A new cluster, new logs (the last one's stay until then, for a post-mortem).
	if err := os.RemoveAll(c.l.Logs()); err != nil {
		return err
	}
	for _, d := range []string{c.l.State(), c.l.Logs()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	c.st = newState(c.l)
	if err := c.st.record(func(s *clusterState) {
		s.Nodes, s.Family, s.CNI = len(c.plan.Nodes), c.plan.Family, c.plan.CNI
	}); err != nil {
		return err
	}
	if err := c.recordSysctls(); err != nil {
		return err
	}
	own, err := ownCgroups()
	if err != nil {
		return err
	}
	base, err := cgroupBase(own)
	if err != nil {
		return err
	}
	if err := c.st.record(func(s *clusterState) { s.CgroupBase = base }); err != nil {
		return err
	}
	if err := makeCgroupBase(c.st, base); err != nil {
		return err
	}
	progress("up: cgroup %s in every hierarchy", base)

	if err := setupNetwork(c.st, c.plan); err != nil {
		return err
	}
	progress("up: network: %s (bridge %s), %s %s, %d node namespaces", underlayNS, bridgeName, hostLink, joinAddrs(c.plan.APIAddrs), len(c.plan.Nodes))

	c.pk, err = clusterCerts(c.l.PKI(), c.plan)
	if err != nil {
		return err
	}
	admin := kubeconfig(c.plan.apiURL(), c.pk.path("ca.crt"), c.pk.path("admin.crt"), c.pk.path("admin.key"), "kubernetes-admin")
	if err := writeFile(c.l.Kubeconfig(), []byte(admin), 0o600); err != nil {
		return err
	}
	progress("up: certificates in %s; kubeconfig %s", c.l.PKI(), c.l.Kubeconfig())

	if err := c.startControlPlane(); err != nil {
		return err
	}
	if err := c.createNodes(); err != nil {
		return err
	}
	if err := c.prepareNSDir(); err != nil {
		return err
	}
	for _, n := range c.plan.Nodes {
		if err := c.setupNodeNamespaces(n); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		if err := c.startNode(n); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
		progress("up: %s: containerd %s, kubelet and kube-proxy (nftables) started; %s", n.Name, containerdVersion, joinAddrs(n.IPs))
	}

	switch c.plan.CNI {
	case "ptp":
		for _, n := range c.plan.Nodes {
			if err := writeFile(c.nodeFile(n.Name, "/etc/cni/net.d/10-ptp.conflist"), []byte(ptpConflist(n)), 0o644); err != nil {
				return err
			}
		}
		if err := ptpRoutes(c.plan); err != nil {
			return err
		}
		progress("up: CNI: ptp + host-local (the baseline) on every node")
	case "flock":
		if err := c.installFlock(); err != nil {
			return err
		}
	}

	dns := strings.NewReplacer("{{IMAGE}}", corednsImage, "{{DNS_IP}}", c.plan.DNSIP.String()).Replace(corednsManifest)
	if err := c.k.apply(dns); err != nil {
		return err
	}
	var names []string
	for _, n := range c.plan.Nodes {
		names = append(names, n.Name)
	}
	if err := c.k.waitNodesReady(5*time.Minute, names); err != nil {
		return err
	}
	progress("up: nodes Ready: %s", strings.Join(names, ", "))
	if c.plan.CNI == "flock" {
		if err := c.k.waitPodsReady(5*time.Minute, "flock's pods", 2*len(names)+1, "-n", "flock-system"); err != nil {
			return err
		}
		progress("up: flock-agent, flock-socket-keeper and flock-controller Ready")
	}
	if err := c.k.waitPodsReady(3*time.Minute, "CoreDNS", 1, "-n", "kube-system", "-l", "k8s-app=kube-dns"); err != nil {
		return err
	}
	progress("up: CoreDNS %s Ready at %s", corednsVersion, c.plan.DNSIP)
	return c.st.record(func(s *clusterState) { s.Ready = true })
}

// installFlock installs flock as docs/install.md says: the ClusterNetworkPolicy CRD from
// network-policy-api's release, then deploy/agent and deploy/controller with kubectl's
// kustomize, the images pointed at the ones built here by an overlay of the user's own.
func (c *cluster) installFlock() error {
	crd, err := cnpCRD(c.l)
	if err != nil {
		return err
	}
	if _, err := c.k.run("", "apply", "-f", crd); err != nil {
		return err
	}
	if _, err := c.k.run("", "wait", "--for=condition=Established", "--timeout=60s", "crd/clusternetworkpolicies.policy.networking.k8s.io"); err != nil {
		return err
	}
	progress("up: ClusterNetworkPolicy CRD (network-policy-api %s, experimental channel) installed", networkPolicyAPIVersion)
	agent, controller, err := c.writeOverlays()
	if err != nil {
		return err
	}
	for _, dir := range []string{agent, controller} {
		if _, err := c.k.run("", "apply", "-k", dir); err != nil {
			return err
		}
	}
	var refs []string
	for _, img := range c.flockImages {
		refs = append(refs, img.Ref())
	}
	progress("up: kubectl apply -k deploy/agent, deploy/controller (images %s)", strings.Join(refs, ", "))
	return nil
}

const networkPolicyAPIVersion = "v0.3.0"

// cnpCRD is the ClusterNetworkPolicy CRD of the pinned network-policy-api module (its
// experimental channel: named ports, node and domain-name peers), from the module cache.
func cnpCRD(l *layout) (string, error) {
	dir, err := moduleDir(filepath.Join(l.Modules(), "network-policy-api"), "sigs.k8s.io/network-policy-api@"+networkPolicyAPIVersion)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "config/crd/experimental/policy.networking.k8s.io_clusternetworkpolicies.yaml"), nil
}

// moduleDir downloads a module (from the proxy, checked against go.sum) and returns its
// directory in the module cache.
func moduleDir(modDir, mod string) (string, error) {
	cmd := []string{"mod", "download", "-json", mod}
	out, err := outputIn(modDir, "go", cmd...)
	if err != nil {
		return "", err
	}
	var info struct{ Dir, Error string }
	if err := jsonUnmarshal(out, &info); err != nil {
		return "", err
	}
	if info.Error != "" || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %s", mod, info.Error)
	}
	return info.Dir, nil
}

// writeOverlays writes the kustomize overlays a user writes to point deploy/ at their
// images and ranges (docs/install.md): target/cluster/install/{agent,controller}.
func (c *cluster) writeOverlays() (string, string, error) {
	base := filepath.Join(c.l.Target, "install")
	rel := func(dir string) string {
		r, err := filepath.Rel(dir, filepath.Join(c.l.Repo, "deploy"))
		if err != nil {
			return filepath.Join(c.l.Repo, "deploy")
		}
		return r
	}
	tag := map[string]string{}
	for _, img := range c.flockImages {
		tag[img.Stage] = img.Tag
	}
	agent := filepath.Join(base, "agent")
	if err := writeFile(filepath.Join(agent, "kustomization.yaml"), []byte(fmt.Sprintf(`# Written by tests/cluster/up.sh, as docs/install.md tells users: deploy/agent with the
# images built here.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s/agent
images:
  - name: ghcr.io/flock-cni/flock
    newTag: %s
`, rel(agent), tag["agent"])), 0o644); err != nil {
		return "", "", err
	}
	controller := filepath.Join(base, "controller")
	if err := writeFile(filepath.Join(controller, "kustomization.yaml"), []byte(fmt.Sprintf(`# Written by tests/cluster/up.sh, as docs/install.md tells users: deploy/controller with
# the image built here and this cluster's pod and Service ranges.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s/controller
images:
  - name: ghcr.io/flock-cni/flock-controller
    newTag: %s
patches:
  - patch: |
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: flock-controller, namespace: flock-system}
      spec:
        template:
          spec:
            containers:
              - name: flock-controller
                env:
                  - {name: FLOCK_CLUSTER_POD_CIDRS, value: %q}
                  - {name: FLOCK_CLUSTER_SERVICE_CIDRS, value: %q}
`, rel(controller), tag["controller"], podCIDRList(c.plan), joinPrefixes(c.plan.ServiceCIDRs))), 0o644); err != nil {
		return "", "", err
	}
	return agent, controller, nil
}

// podCIDRList is every node's pod CIDR, comma-separated.
func podCIDRList(p *clusterPlan) string {
	var s []string
	for _, n := range p.Nodes {
		for _, c := range n.PodCIDRs {
			s = append(s, c.String())
		}
	}
	return strings.Join(s, ",")
}

// loadCluster reads the running cluster's state (for smoke, bench and restart).
func loadCluster() (*cluster, error) {
	l, err := newLayout()
	if err != nil {
		return nil, err
	}
	st, err := loadState(l)
	if err != nil {
		return nil, fmt.Errorf("no cluster is running (tests/cluster/up.sh starts one): %w", err)
	}
	plan, err := planCluster(st.Nodes, st.Family, st.CNI)
	if err != nil {
		return nil, err
	}
	c := &cluster{l: l, st: st, plan: plan, pk: &pki{Dir: l.PKI()}, comps: map[string]component{},
		k: kube{kubectl: l.Bin("kubectl"), kubeconfig: l.Kubeconfig()}}
	for _, comp := range st.Components {
		c.comps[comp.Name] = comp
	}
	return c, nil
}

// cmdRestart restarts one component as it was started (a debugging aid, and what the
// fault checks do).
func cmdRestart(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("usage: fkc restart COMPONENT (one of the names in target/cluster/logs)")
	}
	c, err := loadCluster()
	if err != nil {
		return err
	}
	if err := c.restartComponent(args[0], 10*time.Second); err != nil {
		return err
	}
	progress("restart: %s restarted", args[0])
	return nil
}
