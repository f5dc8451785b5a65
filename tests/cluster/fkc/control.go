package main

// The control plane, in the root namespaces: etcd on loopback, kube-apiserver on the
// control plane's link (198.18.0.254 / 2001:db8::fe) with TLS, service account tokens,
// Node and RBAC authorization and the default admission plugins (NodeRestriction added),
// kube-controller-manager and kube-scheduler.

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

func (c *cluster) componentKubeconfig(name, user string) (string, error) {
	path := filepath.Join(c.l.State(), "kubeconfigs", name+".kubeconfig")
	return path, writeFile(path, []byte(kubeconfig(c.plan.apiURL(), c.pk.path("ca.crt"), c.pk.path(name+".crt"), c.pk.path(name+".key"), user)), 0o600)
}

func (c *cluster) etcdComponent() component {
	return component{Name: "etcd", Bin: c.l.Bin("etcd"), Args: etcdArgs(filepath.Join(c.l.State(), "etcd"))}
}

func (c *cluster) etcdctl(args ...string) (string, error) {
	full := append([]string{fmt.Sprintf("--endpoints=http://127.0.0.1:%d", etcdClientPort), "--command-timeout=20s"}, args...)
	return output(c.l.Bin("etcdctl"), full...)
}

func (c *cluster) waitEtcd() error {
	return waitFor(60*time.Second, "etcd", func() error {
		_, err := c.etcdctl("endpoint", "health")
		return err
	})
}

func (c *cluster) waitAPIServer(timeout time.Duration) error {
	return waitFor(timeout, "kube-apiserver", func() error {
		out, err := c.k.runTimeout(5*time.Second, "", "get", "--raw", "/readyz")
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) != "ok" {
			return fmt.Errorf("/readyz: %s", out)
		}
		return nil
	})
}

func (c *cluster) startControlPlane() error {
	if err := c.startComponent(c.etcdComponent()); err != nil {
		return err
	}
	if err := c.waitEtcd(); err != nil {
		return err
	}
	progress("up: etcd %s ready on 127.0.0.1:%d", etcdVersion, etcdClientPort)

	audit := filepath.Join(c.l.State(), "audit-policy.yaml")
	if err := writeFile(audit, []byte(auditPolicyText), 0o644); err != nil {
		return err
	}
	if err := c.startComponent(component{Name: "kube-apiserver", Bin: c.l.Bin("kube-apiserver"), Args: apiserverArgs(c.plan, c.pk, audit)}); err != nil {
		return err
	}
	if err := c.waitAPIServer(120 * time.Second); err != nil {
		return err
	}
	progress("up: kube-apiserver %s ready at %s", kubernetesVersion, c.plan.apiURL())

	// The API server's own client identity at the kubelets (exec, logs, port-forward —
	// every e2e probe is an exec) gets the kubelet API, as kubeadm grants it.
	if err := c.k.apply(`apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: kube-apiserver-kubelet-client
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:kubelet-api-admin}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: kube-apiserver-kubelet-client}
`); err != nil {
		return err
	}

	cmKubeconfig, err := c.componentKubeconfig("controller-manager", "system:kube-controller-manager")
	if err != nil {
		return err
	}
	if err := c.startComponent(component{Name: "kube-controller-manager", Bin: c.l.Bin("kube-controller-manager"),
		Args: controllerManagerArgs(c.plan, c.pk, cmKubeconfig)}); err != nil {
		return err
	}
	schedKubeconfig, err := c.componentKubeconfig("scheduler", "system:kube-scheduler")
	if err != nil {
		return err
	}
	schedConfig := filepath.Join(c.l.State(), "scheduler.yaml")
	if err := writeFile(schedConfig, []byte(schedulerConfig(schedKubeconfig)), 0o644); err != nil {
		return err
	}
	if err := c.startComponent(component{Name: "kube-scheduler", Bin: c.l.Bin("kube-scheduler"), Args: schedulerArgs(schedConfig)}); err != nil {
		return err
	}
	progress("up: kube-controller-manager and kube-scheduler started")
	return nil
}

// createNodes creates each Node with its pod CIDRs before its kubelet starts: the kubelet
// registers into it, and flock-agent finds its ranges there.
func (c *cluster) createNodes() error {
	var b strings.Builder
	for _, n := range c.plan.Nodes {
		var cidrs []string
		for _, p := range n.PodCIDRs {
			cidrs = append(cidrs, fmt.Sprintf("%q", p.String()))
		}
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Node
metadata:
  name: %s
  labels: {kubernetes.io/hostname: %s, kubernetes.io/os: linux, kubernetes.io/arch: amd64}
spec:
  podCIDR: %s
  podCIDRs: [%s]
`, n.Name, n.Name, cidrs[0], strings.Join(cidrs, ", "))
	}
	_, err := c.k.run(b.String(), "create", "-f", "-")
	return err
}
