package main

// smoke: the named checks of flock on the running cluster, one line each, ending with
// "N passed, N failed". Probes are what users run: kubectl exec of agnhost in real pods;
// policies are applied with kubectl; faults are made to the real components.

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

const smokeNS = "fkc-smoke"

type smoke struct {
	c        *cluster
	k        kube
	flockctl string
	// The fixture pods by name: their node and addresses (first family first).
	pods map[string]smokePod
	// ClusterIP and NodePort of Service srv (srv-1 behind it).
	svcIP    string
	nodePort int
}

type smokePod struct {
	Node string
	IPs  []string
}

type smokeCheck struct {
	name string
	run  func(*smoke) error
}

func (s *smoke) checks() []smokeCheck {
	return []smokeCheck{
		{"nodes-ready", (*smoke).checkNodesReady},
		{"cni-is-flock", (*smoke).checkCNIIsFlock},
		{"flock-pods-ready", (*smoke).checkFlockPodsReady},
		{"flockctl-status", (*smoke).checkFlockctlStatus},
		{"pod-addresses", (*smoke).checkPodAddresses},
		{"pod-to-pod-same-node", (*smoke).checkSameNode},
		{"pod-to-pod-cross-node", (*smoke).checkCrossNode},
		{"udp-cross-node", (*smoke).checkUDP},
		{"clusterip-service", (*smoke).checkClusterIP},
		{"nodeport-service", (*smoke).checkNodePort},
		{"coredns-names", (*smoke).checkDNS},
		{"apiserver-by-name", (*smoke).checkAPIServerByName},
		{"probes-under-deny-all", (*smoke).checkProbesUnderDenyAll},
		{"policy-denies-within-1s", (*smoke).checkDeniesWithinASecond},
		{"admin-deny-beats-allow", (*smoke).checkAdminDeny},
		{"domain-rule", (*smoke).checkDomainRule},
		{"egress-deny-all-node", (*smoke).checkEgressDenyNode},
		{"post-dnat-pod-address", (*smoke).checkPostDNAT},
		{"explain-agrees", (*smoke).checkExplain},
		{"whatif-agrees", (*smoke).checkWhatif},
		{"nft-beside-kube-proxy", (*smoke).checkTables},
		{"fault-apiserver-restart", (*smoke).checkAPIServerRestart},
		{"fault-watch-410-relist", (*smoke).checkWatchExpired},
		{"fault-agent-pod-deleted", (*smoke).checkAgentPodDeleted},
		{"fault-kubelet-restart", (*smoke).checkKubeletRestart},
		{"bad-invalid-policy", (*smoke).checkInvalidPolicy},
		{"bad-crd-schema", (*smoke).checkCRDSchema},
		{"bad-rbac-forbidden", (*smoke).checkForbidden},
		{"bad-kubeconfig", (*smoke).checkBadKubeconfig},
	}
}

func cmdSmoke(args []string) error {
	fs := flag.NewFlagSet("smoke", flag.ContinueOnError)
	only := fs.String("only", "", "run only the checks whose names match this regular expression")
	keep := fs.Bool("keep", false, "leave the smoke namespace and its objects in place")
	if err := fs.Parse(args); err != nil {
		return exitCode(2)
	}
	var filter *regexp.Regexp
	if *only != "" {
		var err error
		if filter, err = regexp.Compile(*only); err != nil {
			return fmt.Errorf("--only: %w", err)
		}
	}
	c, err := loadCluster()
	if err != nil {
		return err
	}
	if !c.st.Ready {
		return fmt.Errorf("the cluster in %s never finished coming up: run tests/cluster/down.sh, then up.sh", c.l.State())
	}
	if c.plan.CNI != "flock" {
		return fmt.Errorf("this cluster runs --cni %s: the smoke checks flock (tests/cluster/up.sh --cni flock)", c.plan.CNI)
	}
	s := &smoke{c: c, k: c.k, flockctl: filepath.Join(c.l.Target, "images", "out", "flockctl"), pods: map[string]smokePod{}}
	fmt.Printf("smoke: %d nodes, %s, flock; namespace %s\n", len(c.plan.Nodes), c.plan.Family, smokeNS)
	if err := s.setup(); err != nil {
		return fmt.Errorf("setting up the smoke's pods: %w", err)
	}
	if !*keep {
		defer s.teardown()
	}
	passed, failed := 0, 0
	for _, ch := range s.checks() {
		if filter != nil && !filter.MatchString(ch.name) {
			continue
		}
		if interrupted.Load() {
			break
		}
		t := time.Now()
		err := ch.run(s)
		s.cleanPolicies()
		if err != nil {
			failed++
			fmt.Printf("FAIL  %-26s %s (%.1f s)\n", ch.name, oneLine(err.Error()), time.Since(t).Seconds())
		} else {
			passed++
			fmt.Printf("ok    %-26s (%.1f s)\n", ch.name, time.Since(t).Seconds())
		}
	}
	fmt.Printf("%d passed, %d failed\n", passed, failed)
	if failed > 0 || interrupted.Load() {
		return exitCode(1)
	}
	return nil
}

func oneLine(s string) string { return shorten(strings.Join(strings.Fields(s), " "), 400) }

// ---- fixture ----

func (s *smoke) node(i int) nodePlan { return s.c.plan.Nodes[(i-1)%len(s.c.plan.Nodes)] }

func (s *smoke) setup() error {
	_, _ = s.k.run("", "delete", "namespace", smokeNS, "--ignore-not-found", "--wait=true", "--timeout=120s")
	n1, n2 := s.node(1).Name, s.node(2).Name
	img := agnhostImage
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n", smokeNS)
	server := func(name, node, inst string) {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, labels: {app: srv, inst: "%s"}}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers:
  - name: netexec
    image: %s
    args: [netexec, --http-port=8080, --udp-port=8081]
    ports: [{name: http, containerPort: 8080}, {name: udp, containerPort: 8081, protocol: UDP}]
    readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1, failureThreshold: 2}
    livenessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 2, failureThreshold: 3}
`, name, smokeNS, inst, node, img)
	}
	client := func(name, node, app string) {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s, labels: {app: %s}}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers: [{name: c, image: %s, args: [pause]}]
`, name, smokeNS, app, node, img)
	}
	server("srv-1", n1, "1")
	server("srv-2", n2, "2")
	client("cli-1", n1, "cli")
	client("cli-2", n2, "cli")
	client("dom", n1, "dom")
	client("iso", n1, "iso")
	client("bad-2", n2, "bad")
	svc := func(name, selector, extra string) {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Service
metadata: {name: %s, namespace: %s}
spec:
  selector: {app: srv, inst: "%s"}
  ipFamilyPolicy: PreferDualStack
%s`, name, smokeNS, selector, extra)
	}
	svc("srv", "1", "  type: NodePort\n  ports: [{name: http, port: 80, targetPort: 8080}]\n")
	svc("dom-a", "1", "  clusterIP: None\n  ports: [{name: http, port: 8080}]\n")
	svc("dom-b", "2", "  clusterIP: None\n  ports: [{name: http, port: 8080}]\n")
	if err := s.k.apply(b.String()); err != nil {
		return err
	}
	if err := s.k.waitPodsReady(3*time.Minute, "the smoke's pods", 7, "-n", smokeNS); err != nil {
		return err
	}
	var pl podList
	if err := s.k.getJSON(&pl, "pods", "-n", smokeNS); err != nil {
		return err
	}
	for _, p := range pl.Items {
		sp := smokePod{Node: p.Spec.NodeName}
		for _, ip := range p.Status.PodIPs {
			sp.IPs = append(sp.IPs, ip.IP)
		}
		s.pods[p.Metadata.Name] = sp
	}
	var svcObj struct {
		Spec struct {
			ClusterIP string `json:"clusterIP"`
			Ports     []struct {
				NodePort int `json:"nodePort"`
			} `json:"ports"`
		} `json:"spec"`
	}
	if err := s.k.getJSON(&svcObj, "service", "-n", smokeNS, "srv"); err != nil {
		return err
	}
	s.svcIP = svcObj.Spec.ClusterIP
	if len(svcObj.Spec.Ports) > 0 {
		s.nodePort = svcObj.Spec.Ports[0].NodePort
	}
	// kube-proxy programs the new Services within a moment: wait for srv to answer.
	return waitFor(30*time.Second, "Service srv", func() error { return s.expect("cli-1", hostPort(s.svcIP, 80), "tcp", true) })
}

func (s *smoke) teardown() {
	s.cleanPolicies()
	_, _ = s.k.run("", "delete", "namespace", smokeNS, "--ignore-not-found", "--wait=false")
}

// cleanPolicies removes every policy a check made (by the label each carries).
func (s *smoke) cleanPolicies() {
	_, _ = s.k.run("", "delete", "networkpolicy", "-n", smokeNS, "-l", "fkc-smoke=1", "--ignore-not-found")
	_, _ = s.k.run("", "delete", "clusternetworkpolicy", "-l", "fkc-smoke=1", "--ignore-not-found")
}

func hostPort(host string, port int) string {
	return netip.AddrPortFrom(netip.MustParseAddr(host), uint16(port)).String()
}

func (s *smoke) ip(pod string) string { return s.pods[pod].IPs[0] }

// connect probes from a pod with agnhost connect: true when it connected, false when the
// connection was refused or timed out; any other failure (exec, DNS) is an error.
func (s *smoke) connect(from, dest, proto string) (bool, error) {
	out, err := s.k.runTimeout(20*time.Second, "", "exec", "-n", smokeNS, from, "--", "/agnhost", "connect", dest, "--timeout=1s", "--protocol="+proto)
	if err == nil {
		return true, nil
	}
	msg := err.Error() + out
	if strings.Contains(msg, "TIMEOUT") || strings.Contains(msg, "REFUSED") {
		return false, nil
	}
	return false, fmt.Errorf("probe %s -> %s/%s: %v", from, dest, proto, err)
}

// expect probes and says what was wrong when the result is not the one expected. A
// probe expected to connect is tried twice (the e2e suite's rule: a probe may be lost).
func (s *smoke) expect(from, dest, proto string, want bool) error {
	tries := 1
	if want {
		tries = 2
	}
	var got bool
	var err error
	for range tries {
		got, err = s.connect(from, dest, proto)
		if err != nil {
			return err
		}
		if got == want {
			return nil
		}
	}
	if want {
		return fmt.Errorf("%s cannot reach %s/%s", from, dest, proto)
	}
	return fmt.Errorf("%s reaches %s/%s", from, dest, proto)
}

func (s *smoke) applyPolicy(yaml string) error {
	return s.k.apply(yaml)
}

// ---- the cluster and flock are there ----

func (s *smoke) checkNodesReady() error {
	var names []string
	for _, n := range s.c.plan.Nodes {
		names = append(names, n.Name)
	}
	return s.k.waitNodesReady(10*time.Second, names)
}

func (s *smoke) checkCNIIsFlock() error {
	for _, n := range s.c.plan.Nodes {
		entries, err := os.ReadDir(s.c.nodeFile(n.Name, "/etc/cni/net.d"))
		if err != nil {
			return err
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if strings.Join(names, " ") != "10-flock.conflist" {
			return fmt.Errorf("%s's /etc/cni/net.d holds %v, not flock's conflist alone", n.Name, names)
		}
		conf, err := os.ReadFile(s.c.nodeFile(n.Name, "/etc/cni/net.d/10-flock.conflist"))
		if err != nil {
			return err
		}
		for _, cidr := range n.PodCIDRs {
			if !strings.Contains(string(conf), cidr.String()) {
				return fmt.Errorf("%s's conflist does not name its pod CIDR %s", n.Name, cidr)
			}
		}
		if _, err := os.Stat(s.c.nodeFile(n.Name, "/opt/cni/bin/flock-cni")); err != nil {
			return fmt.Errorf("%s: flock-cni is not in /opt/cni/bin: %w", n.Name, err)
		}
	}
	return nil
}

func (s *smoke) checkFlockPodsReady() error {
	n := len(s.c.plan.Nodes)
	for _, sel := range []struct {
		label string
		count int
	}{{"app.kubernetes.io/name=flock-agent", n}, {"app.kubernetes.io/name=flock-socket-keeper", n}, {"app.kubernetes.io/name=flock-controller", 1}} {
		if err := s.k.waitPodsReady(20*time.Second, sel.label, sel.count, "-n", "flock-system", "-l", sel.label); err != nil {
			return err
		}
	}
	return nil
}

type statusReport struct {
	Nodes []struct {
		Name    string   `json:"name"`
		OK      bool     `json:"ok"`
		API     string   `json:"api"`
		Reasons []string `json:"reasons"`
		Rules   int      `json:"rules"`
	} `json:"nodes"`
}

func (s *smoke) status() (*statusReport, string, error) {
	out, err := outputTimeout(60*time.Second, s.flockctl, "status", "--kubeconfig", s.c.l.Kubeconfig(), "-o", "json")
	var r statusReport
	if jerr := json.Unmarshal([]byte(out), &r); jerr != nil {
		if err == nil {
			err = jerr
		}
		return nil, out, err
	}
	return &r, out, nil
}

func (s *smoke) checkFlockctlStatus() error {
	return waitFor(60*time.Second, "flockctl status", func() error {
		r, out, err := s.status()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if len(r.Nodes) != len(s.c.plan.Nodes) {
			return fmt.Errorf("%d nodes in the report, not %d", len(r.Nodes), len(s.c.plan.Nodes))
		}
		for _, n := range r.Nodes {
			if !n.OK || n.API != "Connected" {
				return fmt.Errorf("%s: ok=%v api=%s %v", n.Name, n.OK, n.API, n.Reasons)
			}
		}
		return nil
	})
}

func (s *smoke) checkPodAddresses() error {
	for name, p := range s.pods {
		var plan nodePlan
		for _, n := range s.c.plan.Nodes {
			if n.Name == p.Node {
				plan = n
			}
		}
		if len(p.IPs) != len(plan.PodCIDRs) {
			return fmt.Errorf("%s has addresses %v, not one per family of %v", name, p.IPs, plan.PodCIDRs)
		}
		for i, ip := range p.IPs {
			a, err := netip.ParseAddr(ip)
			if err != nil || !plan.PodCIDRs[i].Contains(a) {
				return fmt.Errorf("%s's address %s is not in %s's pod CIDR %s", name, ip, p.Node, plan.PodCIDRs[i])
			}
		}
	}
	return nil
}

func (s *smoke) checkSameNode() error {
	return s.expect("cli-1", hostPort(s.ip("srv-1"), 8080), "tcp", true)
}

func (s *smoke) checkCrossNode() error {
	if err := s.expect("cli-1", hostPort(s.ip("srv-2"), 8080), "tcp", true); err != nil {
		return err
	}
	if err := s.expect("cli-2", hostPort(s.ip("srv-1"), 8080), "tcp", true); err != nil {
		return err
	}
	// Every family of a dual-stack cluster.
	for i := 1; i < len(s.pods["srv-1"].IPs); i++ {
		if err := s.expect("cli-2", hostPort(s.pods["srv-1"].IPs[i], 8080), "tcp", true); err != nil {
			return err
		}
	}
	return nil
}

func (s *smoke) checkUDP() error {
	return s.expect("cli-2", hostPort(s.ip("srv-1"), 8081), "udp", true)
}

func (s *smoke) checkClusterIP() error {
	return s.expect("cli-2", hostPort(s.svcIP, 80), "tcp", true)
}

func (s *smoke) checkNodePort() error {
	if s.nodePort == 0 {
		return fmt.Errorf("Service srv has no node port")
	}
	// From a pod on the other node, to node-1's address: kube-proxy's DNAT there.
	return s.expect("cli-2", hostPort(s.node(1).IPs[0].String(), s.nodePort), "tcp", true)
}

func (s *smoke) checkDNS() error {
	out, err := s.k.run("", "exec", "-n", smokeNS, "cli-1", "--", "getent", "hosts", "srv."+smokeNS+".svc.cluster.local")
	if err != nil {
		return err
	}
	if !strings.Contains(out, s.svcIP) {
		return fmt.Errorf("srv.%s.svc.cluster.local resolved to %q, not %s", smokeNS, strings.TrimSpace(out), s.svcIP)
	}
	return nil
}

func (s *smoke) checkAPIServerByName() error {
	// A name, resolved by CoreDNS; then TLS to the API server through the kubernetes
	// Service (kube-proxy's DNAT to 198.18.0.254:6443).
	out, err := s.k.run("", "exec", "-n", smokeNS, "cli-2", "--", "curl", "-sS", "--max-time", "5",
		"--cacert", "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", "https://kubernetes.default.svc.cluster.local/livez")
	if err != nil {
		return err
	}
	if strings.TrimSpace(out) != "ok" {
		return fmt.Errorf("/livez through kubernetes.default answered %q", out)
	}
	return nil
}

// ---- policies ----

// policy is a NetworkPolicy labelled as the smoke's.
func policy(name, spec string) string {
	return fmt.Sprintf("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: %s, namespace: %s, labels: {fkc-smoke: \"1\"}}\nspec:\n%s", name, smokeNS, spec)
}

func (s *smoke) checkProbesUnderDenyAll() error {
	before, err := s.restarts("srv-1")
	if err != nil {
		return err
	}
	if err := s.applyPolicy(policy("deny-srv-1", "  podSelector: {matchLabels: {inst: \"1\"}}\n  policyTypes: [Ingress]\n")); err != nil {
		return err
	}
	if err := waitFor(10*time.Second, "the deny-all", func() error { return s.expect("cli-2", hostPort(s.ip("srv-1"), 8080), "tcp", false) }); err != nil {
		return err
	}
	// The kubelet probes every 1 s (readiness) and 2 s (liveness): 12 s are many of each.
	deadline := time.Now().Add(12 * time.Second)
	for time.Now().Before(deadline) {
		var p pod
		if err := s.k.getJSON(&p, "pod", "-n", smokeNS, "srv-1"); err != nil {
			return err
		}
		if !p.ready() {
			return fmt.Errorf("srv-1 turned not ready under the deny-all: %s", p.why())
		}
		time.Sleep(time.Second)
	}
	after, err := s.restarts("srv-1")
	if err != nil {
		return err
	}
	if after != before {
		return fmt.Errorf("srv-1 was restarted by its liveness probe under the deny-all (%d -> %d)", before, after)
	}
	return s.expect("cli-2", hostPort(s.ip("srv-1"), 8080), "tcp", false)
}

func (s *smoke) restarts(name string) (int, error) {
	var p pod
	if err := s.k.getJSON(&p, "pod", "-n", smokeNS, name); err != nil {
		return 0, err
	}
	n := 0
	for _, cs := range p.Status.ContainerStatuses {
		n += cs.RestartCount
	}
	return n, nil
}

func (s *smoke) checkDeniesWithinASecond() error {
	target := hostPort(s.ip("srv-2"), 8080)
	pr, err := s.startProber("cli-1", target, 60*time.Second)
	if err != nil {
		return err
	}
	defer pr.stop()
	if err := pr.waitFor(true, time.Now(), 20*time.Second); err != nil {
		return fmt.Errorf("before the policy: %w", err)
	}
	applied := time.Now()
	if err := s.applyPolicy(policy("deny-srv-2", "  podSelector: {matchLabels: {inst: \"2\"}}\n  policyTypes: [Ingress]\n")); err != nil {
		return err
	}
	denied, err := pr.firstAfter(false, applied, 10*time.Second)
	if err != nil {
		return err
	}
	if d := denied.Sub(applied); d > time.Second {
		return fmt.Errorf("the first denied probe came %.2f s after kubectl apply (more than 1 s)", d.Seconds())
	}
	if err := pr.steady(false, denied, 1500*time.Millisecond); err != nil {
		return err
	}
	deleted := time.Now()
	if _, err := s.k.run("", "delete", "networkpolicy", "-n", smokeNS, "deny-srv-2"); err != nil {
		return err
	}
	restored, err := pr.firstAfter(true, deleted, 10*time.Second)
	if err != nil {
		return fmt.Errorf("after the deletion: %w", err)
	}
	progress("smoke: denied %.2f s after apply, restored %.2f s after delete", denied.Sub(applied).Seconds(), restored.Sub(deleted).Seconds())
	return nil
}

func (s *smoke) checkAdminDeny() error {
	if err := s.applyPolicy(policy("allow-all-srv-1", "  podSelector: {matchLabels: {inst: \"1\"}}\n  policyTypes: [Ingress]\n  ingress: [{}]\n")); err != nil {
		return err
	}
	cnp := fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: fkc-smoke-deny-cli-2, labels: {fkc-smoke: "1"}}
spec:
  tier: Admin
  priority: 10
  subject:
    pods:
      namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: %s}}
      podSelector: {matchLabels: {inst: "1"}}
  ingress:
  - name: deny-cli-2
    action: Deny
    from:
    - pods:
        namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: %s}}
        podSelector: {matchLabels: {app: cli}}
`, smokeNS, smokeNS)
	if err := s.applyPolicy(cnp); err != nil {
		return err
	}
	if err := waitFor(10*time.Second, "the Admin Deny", func() error { return s.expect("cli-2", hostPort(s.ip("srv-1"), 8080), "tcp", false) }); err != nil {
		return err
	}
	if err := s.expect("cli-1", hostPort(s.ip("srv-1"), 8080), "tcp", false); err != nil {
		return err
	}
	// The NetworkPolicy's allow still admits what the Admin rule does not name.
	if err := s.expect("dom", hostPort(s.ip("srv-1"), 8080), "tcp", true); err != nil {
		return err
	}
	if _, err := s.k.run("", "delete", "clusternetworkpolicy", "fkc-smoke-deny-cli-2"); err != nil {
		return err
	}
	return waitFor(10*time.Second, "the Admin Deny's deletion", func() error { return s.expect("cli-2", hostPort(s.ip("srv-1"), 8080), "tcp", true) })
}

func (s *smoke) checkDomainRule() error {
	// dom may reach only DNS (CoreDNS) and, through a domain rule, the name dom-a (srv-1).
	if err := s.applyPolicy(policy("dom-egress", `  podSelector: {matchLabels: {app: dom}}
  policyTypes: [Egress]
  egress:
  - to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}, podSelector: {matchLabels: {k8s-app: kube-dns}}}]
    ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]
`)); err != nil {
		return err
	}
	name := "dom-a." + smokeNS + ".svc.cluster.local"
	cnp := fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: fkc-smoke-domain, labels: {fkc-smoke: "1"}}
spec:
  tier: Admin
  priority: 20
  subject:
    pods:
      namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: %s}}
      podSelector: {matchLabels: {app: dom}}
  egress:
  - name: dom-a
    action: Accept
    to: [{domainNames: [%q]}]
    protocols: [{tcp: {destinationPort: {number: 8080}}}]
`, smokeNS, name)
	if err := s.applyPolicy(cnp); err != nil {
		return err
	}
	// Before any lookup, the address is not admitted.
	if err := waitFor(10*time.Second, "the egress policy", func() error { return s.expect("dom", hostPort(s.ip("srv-1"), 8080), "tcp", false) }); err != nil {
		return err
	}
	if err := waitFor(15*time.Second, "the domain rule", func() error { return s.expect("dom", name+":8080", "tcp", true) }); err != nil {
		return err
	}
	// Learned: now the address itself is admitted (the answer taught it) ...
	if err := s.expect("dom", hostPort(s.ip("srv-1"), 8080), "tcp", true); err != nil {
		return err
	}
	// ... and nothing else: another name, another pod, another port.
	other := "dom-b." + smokeNS + ".svc.cluster.local:8080"
	if err := s.expect("dom", other, "tcp", false); err != nil {
		return err
	}
	if err := s.expect("dom", hostPort(s.ip("srv-2"), 8080), "tcp", false); err != nil {
		return err
	}
	return s.expect("dom", hostPort(s.ip("srv-1"), 8081), "udp", false)
}

func (s *smoke) checkEgressDenyNode() error {
	node := s.node(1).IPs[0].String()
	kubelet := hostPort(node, 10250)
	agent := hostPort(node, 9781)
	// Without a policy the node's ports answer ...
	for _, d := range []string{kubelet, agent} {
		if err := s.expect("iso", d, "tcp", true); err != nil {
			return fmt.Errorf("before the policy: %w", err)
		}
	}
	if err := s.applyPolicy(policy("iso-deny-egress", "  podSelector: {matchLabels: {app: iso}}\n  policyTypes: [Egress]\n")); err != nil {
		return err
	}
	if err := waitFor(10*time.Second, "the egress deny-all", func() error { return s.expect("iso", kubelet, "tcp", false) }); err != nil {
		return err
	}
	// ... and under egress deny-all nothing does: not the node's own ports, pods, Services.
	for _, d := range []string{agent, hostPort(node, s.nodePort), hostPort(s.ip("srv-1"), 8080), hostPort(s.ip("srv-2"), 8080), hostPort(s.svcIP, 80), hostPort(s.c.plan.KubernetesIP.String(), 443)} {
		if err := s.expect("iso", d, "tcp", false); err != nil {
			return err
		}
	}
	return s.expect("iso", hostPort(s.c.plan.DNSIP.String(), 53), "udp", false)
}

func (s *smoke) checkPostDNAT() error {
	// cli-1 may reach only srv-1's port 8080 (by pod selector): through the Service's
	// ClusterIP (port 80) that works only if flock judges the address kube-proxy's DNAT
	// chose.
	if err := s.applyPolicy(policy("cli-egress-srv-1", `  podSelector: {matchLabels: {app: cli}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {inst: "1"}}}]
    ports: [{protocol: TCP, port: 8080}]
`)); err != nil {
		return err
	}
	if err := waitFor(10*time.Second, "the egress policy", func() error { return s.expect("cli-1", hostPort(s.ip("srv-2"), 8080), "tcp", false) }); err != nil {
		return err
	}
	if err := s.expect("cli-1", hostPort(s.svcIP, 80), "tcp", true); err != nil {
		return err
	}
	return s.expect("cli-2", hostPort(s.svcIP, 80), "tcp", true)
}

// ---- the operator's tools agree with the probes ----

type explainResult struct {
	Verdict string `json:"verdict"`
}

func (s *smoke) explain(from, to string, port int) (string, error) {
	out, err := outputTimeout(60*time.Second, s.flockctl, "explain", "--kubeconfig", s.c.l.Kubeconfig(),
		"--from", smokeNS+"/"+from, "--to", smokeNS+"/"+to, "--port", strconv.Itoa(port), "-o", "json")
	if err != nil {
		return "", fmt.Errorf("%v: %s", err, out)
	}
	var r explainResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		return "", err
	}
	return r.Verdict, nil
}

func (s *smoke) checkExplain() error {
	if err := s.applyPolicy(policy("srv-2-from-cli-1", `  podSelector: {matchLabels: {inst: "2"}}
  policyTypes: [Ingress]
  ingress: [{from: [{podSelector: {matchLabels: {app: cli}}}], ports: [{port: 8080}]}]
`)); err != nil {
		return err
	}
	if err := waitFor(10*time.Second, "the policy", func() error { return s.expect("dom", hostPort(s.ip("srv-2"), 8080), "tcp", false) }); err != nil {
		return err
	}
	for _, f := range []struct {
		from string
		port int
	}{{"cli-1", 8080}, {"dom", 8080}, {"iso", 8080}, {"cli-2", 8080}} {
		verdict, err := s.explain(f.from, "srv-2", f.port)
		if err != nil {
			return err
		}
		got, err := s.connect(f.from, hostPort(s.ip("srv-2"), f.port), "tcp")
		if err != nil {
			return err
		}
		if (verdict == "Allow") != got {
			return fmt.Errorf("explain says %s for %s -> srv-2:%d, the probe connected=%v", verdict, f.from, f.port, got)
		}
	}
	return nil
}

func (s *smoke) checkWhatif() error {
	change := policy("whatif-srv-1", `  podSelector: {matchLabels: {inst: "1"}}
  policyTypes: [Ingress]
  ingress: [{from: [{podSelector: {matchLabels: {app: dom}}}]}]
`)
	file := filepath.Join(s.c.l.Target, "smoke-whatif.yaml")
	if err := os.WriteFile(file, []byte(change), 0o644); err != nil {
		return err
	}
	out, err := outputTimeout(120*time.Second, s.flockctl, "whatif", "--kubeconfig", s.c.l.Kubeconfig(), "--apply", file,
		"--port", "8080", "--protocol", "TCP", "-o", "json", "--max-changes", "1000")
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	var r struct {
		Changes []struct {
			From, To string
			Before   string `json:"before"`
			After    string `json:"after"`
		} `json:"changes"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		return err
	}
	closed := map[string]bool{}
	for _, ch := range r.Changes {
		if ch.To == smokeNS+"/srv-1" && ch.After == "Deny" {
			closed[strings.TrimPrefix(ch.From, smokeNS+"/")] = true
		}
	}
	for _, from := range []string{"cli-1", "cli-2", "iso"} {
		if !closed[from] {
			return fmt.Errorf("whatif does not say %s -> srv-1:8080 closes (changes: %v)", from, r.Changes)
		}
	}
	if closed["dom"] {
		return fmt.Errorf("whatif says dom -> srv-1 closes")
	}
	if err := s.applyPolicy(change); err != nil {
		return err
	}
	if err := waitFor(10*time.Second, "the change", func() error { return s.expect("cli-2", hostPort(s.ip("srv-1"), 8080), "tcp", false) }); err != nil {
		return err
	}
	for from := range closed {
		if _, ok := s.pods[from]; ok && from != "srv-2" {
			if err := s.expect(from, hostPort(s.ip("srv-1"), 8080), "tcp", false); err != nil {
				return fmt.Errorf("whatif said it closes: %w", err)
			}
		}
	}
	return s.expect("dom", hostPort(s.ip("srv-1"), 8080), "tcp", true)
}

func (s *smoke) checkTables() error {
	for _, n := range s.c.plan.Nodes {
		out, err := outputTimeout(30*time.Second, "nsenter", "--net=/run/netns/"+n.NetNS, "--", "nft", "list", "tables")
		if err != nil {
			return err
		}
		want := []string{"table inet flock"}
		if s.c.plan.hasV4() {
			want = append(want, "table ip kube-proxy")
		}
		if s.c.plan.hasV6() {
			want = append(want, "table ip6 kube-proxy")
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				return fmt.Errorf("%s's tables lack %q: %s", n.Name, w, strings.Join(strings.Fields(out), " "))
			}
		}
		// flock's filter chain runs after kube-proxy's DNAT (priority dstnat, -100).
		flock, err := outputTimeout(30*time.Second, "nsenter", "--net=/run/netns/"+n.NetNS, "--", "nft", "list", "table", "inet", "flock")
		if err != nil {
			return err
		}
		if !regexp.MustCompile(`hook forward priority filter`).MatchString(flock) {
			return fmt.Errorf("%s: flock's table has no forward chain at priority filter", n.Name)
		}
	}
	return nil
}

// ---- faults ----

// traffic keeps probing an allowed and a denied flow to srv-1 (node-1) while a fault
// happens, from node-2's pods. The probes run in the pods' network namespaces, entered
// from the host: an exec session would end with the API server or a kubelet, and
// measure nothing while they are away.
type traffic struct {
	allowed, denied *prober
}

func (s *smoke) startTraffic(d time.Duration) (*traffic, error) {
	if err := s.applyPolicy(policy("fault-allow-cli", `  podSelector: {matchLabels: {inst: "1"}}
  policyTypes: [Ingress]
  ingress: [{from: [{podSelector: {matchLabels: {app: cli}}}]}]
`)); err != nil {
		return nil, err
	}
	if err := waitFor(10*time.Second, "the fault's policy", func() error { return s.expect("bad-2", hostPort(s.ip("srv-1"), 8080), "tcp", false) }); err != nil {
		return nil, err
	}
	a, err := s.startNetnsProber("cli-2", hostPort(s.ip("srv-1"), 8080), d)
	if err != nil {
		return nil, err
	}
	dn, err := s.startNetnsProber("bad-2", hostPort(s.ip("srv-1"), 8080), d)
	if err != nil {
		a.stop()
		return nil, err
	}
	if err := a.waitFor(true, time.Now(), 20*time.Second); err != nil {
		a.stop()
		dn.stop()
		return nil, err
	}
	if err := dn.waitFor(false, time.Now(), 20*time.Second); err != nil {
		a.stop()
		dn.stop()
		return nil, err
	}
	return &traffic{allowed: a, denied: dn}, nil
}

// verdict stops the probes and says whether enforcement held throughout: no denied probe
// got through, and the allowed flow lost at most the given share.
func (t *traffic) verdict(maxLost float64) error {
	t.allowed.stop()
	t.denied.stop()
	aOK, aAll := t.allowed.count(true)
	dOK, dAll := t.denied.count(true)
	if aAll < 5 || dAll < 5 {
		return fmt.Errorf("too few probes ran (%d allowed, %d denied)", aAll, dAll)
	}
	if dOK > 0 {
		return fmt.Errorf("%d of %d denied probes got through during the fault", dOK, dAll)
	}
	if lost := float64(aAll-aOK) / float64(aAll); lost > maxLost {
		return fmt.Errorf("%d of %d allowed probes failed during the fault", aAll-aOK, aAll)
	}
	return nil
}

func (s *smoke) checkAPIServerRestart() error {
	tr, err := s.startTraffic(90 * time.Second)
	if err != nil {
		return err
	}
	if err := s.c.stopComponent("kube-apiserver", 10*time.Second); err != nil {
		return err
	}
	time.Sleep(8 * time.Second)
	if err := s.c.startComponent(s.c.comps["kube-apiserver"]); err != nil {
		return err
	}
	if err := s.c.waitAPIServer(90 * time.Second); err != nil {
		return err
	}
	if err := tr.verdict(0); err != nil {
		return err
	}
	return s.checkFlockctlStatus()
}

func (s *smoke) relists() (map[string]float64, error) {
	out := map[string]float64{}
	for _, n := range s.c.plan.Nodes {
		text, err := httpGet(fmt.Sprintf("http://%s/metrics", hostPort(n.IPs[0].String(), 9781)))
		if err != nil {
			return nil, fmt.Errorf("%s's agent metrics: %w", n.Name, err)
		}
		for _, line := range strings.Split(text, "\n") {
			// Every relist but the first: 410 Gone ("expired"), or a watch that kept failing
			// while the API server was away relisting with a consistent read ("failing").
			if strings.HasPrefix(line, "flock_watch_relists_total{") && !strings.Contains(line, `reason="initial"`) {
				f := strings.Fields(line)
				v, _ := strconv.ParseFloat(f[len(f)-1], 64)
				out[n.Name] += v
			}
		}
	}
	return out, nil
}

func (s *smoke) checkWatchExpired() error {
	before, err := s.relists()
	if err != nil {
		return err
	}
	rules, _, err := s.status()
	if err != nil {
		return err
	}
	tr, err := s.startTraffic(120 * time.Second)
	if err != nil {
		return err
	}
	if err := s.c.stopComponent("kube-apiserver", 10*time.Second); err != nil {
		return err
	}
	// Writes while the API server is away (a key outside its /registry prefix) move etcd's
	// revision past every resourceVersion an agent holds; compacting to it removes them all:
	// each agent's watch is answered 410 Gone when it comes back.
	for i := range 3 {
		if _, err := s.c.etcdctl("put", "/fkc-smoke/bump", strconv.Itoa(i)); err != nil {
			return err
		}
	}
	if _, err := s.c.etcdctl("del", "/fkc-smoke/bump"); err != nil {
		return err
	}
	st, err := s.c.etcdctl("endpoint", "status", "--write-out=json")
	if err != nil {
		return err
	}
	var status []struct {
		Status struct {
			Header struct {
				Revision int64 `json:"revision"`
			} `json:"header"`
		} `json:"Status"`
	}
	if err := json.Unmarshal([]byte(st), &status); err != nil || len(status) == 0 {
		return fmt.Errorf("reading etcd's revision: %v %s", err, st)
	}
	rev := status[0].Status.Header.Revision
	if _, err := s.c.etcdctl("compact", strconv.FormatInt(rev, 10)); err != nil {
		return err
	}
	if err := s.c.startComponent(s.c.comps["kube-apiserver"]); err != nil {
		return err
	}
	if err := s.c.waitAPIServer(90 * time.Second); err != nil {
		return err
	}
	if err := waitFor(90*time.Second, "every agent's relist", func() error {
		after, err := s.relists()
		if err != nil {
			return err
		}
		for _, n := range s.c.plan.Nodes {
			if after[n.Name] <= before[n.Name] {
				return fmt.Errorf("%s: flock_watch_relists_total (but initial) still %v", n.Name, after[n.Name])
			}
		}
		return nil
	}); err != nil {
		return err
	}
	if err := tr.verdict(0); err != nil {
		return err
	}
	if err := s.checkFlockctlStatus(); err != nil {
		return err
	}
	// After the relist the nodes enforce what they did before (nothing dropped).
	again, _, err := s.status()
	if err != nil {
		return err
	}
	for i, n := range again.Nodes {
		if i < len(rules.Nodes) && n.Rules < rules.Nodes[i].Rules {
			return fmt.Errorf("%s has %d rules after the relist, %d before", n.Name, n.Rules, rules.Nodes[i].Rules)
		}
	}
	progress("smoke: etcd compacted at revision %d; every agent relisted", rev)
	return nil
}

func (s *smoke) checkAgentPodDeleted() error {
	tr, err := s.startTraffic(120 * time.Second)
	if err != nil {
		return err
	}
	// An established connection (HTTP keep-alive, a request every 200 ms) from cli-2 to
	// srv-1 across the replacement: curl reports each transfer's new connections.
	stream, err := s.startStream("cli-2", fmt.Sprintf("http://%s/hostname", hostPort(s.ip("srv-1"), 8080)), 150)
	if err != nil {
		return err
	}
	// And DNS through node-1's proxy: dom has a domain rule (its DNS is steered there).
	if err := s.applyDomainRuleForDNS(); err != nil {
		return err
	}
	dns, err := s.startDNSLoop("dom", "dom-a."+smokeNS+".svc.cluster.local", 30*time.Second)
	if err != nil {
		return err
	}
	var old pod
	var pl podList
	if err := s.k.getJSON(&pl, "pods", "-n", "flock-system", "-l", "app.kubernetes.io/name=flock-agent", "--field-selector", "spec.nodeName="+s.node(1).Name); err != nil {
		return err
	}
	if len(pl.Items) != 1 {
		return fmt.Errorf("%d flock-agent pods on %s", len(pl.Items), s.node(1).Name)
	}
	old = pl.Items[0]
	time.Sleep(2 * time.Second)
	if _, err := s.k.run("", "delete", "pod", "-n", "flock-system", old.Metadata.Name, "--wait=false"); err != nil {
		return err
	}
	if err := waitFor(120*time.Second, "the replacement agent", func() error {
		var pl podList
		if err := s.k.getJSON(&pl, "pods", "-n", "flock-system", "-l", "app.kubernetes.io/name=flock-agent", "--field-selector", "spec.nodeName="+s.node(1).Name); err != nil {
			return err
		}
		for _, p := range pl.Items {
			if p.Metadata.UID != old.Metadata.UID && p.ready() {
				return nil
			}
		}
		return fmt.Errorf("no new Ready agent pod yet")
	}); err != nil {
		return err
	}
	time.Sleep(3 * time.Second)
	failedDNS, totalDNS := dns.wait()
	if totalDNS < 10 {
		return fmt.Errorf("only %d DNS lookups ran", totalDNS)
	}
	if failedDNS > 0 {
		return fmt.Errorf("%d of %d DNS lookups through the proxy failed across the agent's replacement", failedDNS, totalDNS)
	}
	connects, transfers, err := stream.wait()
	if err != nil {
		return err
	}
	if connects != 1 {
		return fmt.Errorf("the established connection broke: %d connections for %d requests", connects, transfers)
	}
	if err := tr.verdict(0); err != nil {
		return err
	}
	progress("smoke: %d requests on one connection and %d DNS lookups across the agent's replacement", transfers, totalDNS)
	return nil
}

// applyDomainRuleForDNS gives dom the domain rule of checkDomainRule (its DNS goes through
// the agent's proxy) without isolating it further.
func (s *smoke) applyDomainRuleForDNS() error {
	return s.applyPolicy(fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: fkc-smoke-dns, labels: {fkc-smoke: "1"}}
spec:
  tier: Admin
  priority: 21
  subject:
    pods:
      namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: %s}}
      podSelector: {matchLabels: {app: dom}}
  egress:
  - name: dom-a
    action: Accept
    to: [{domainNames: ["dom-a.%s.svc.cluster.local"]}]
`, smokeNS, smokeNS))
}

func (s *smoke) checkKubeletRestart() error {
	tr, err := s.startTraffic(90 * time.Second)
	if err != nil {
		return err
	}
	before, err := s.restarts("srv-1")
	if err != nil {
		return err
	}
	n1 := s.node(1).Name
	if err := s.c.restartComponent(n1+"-kubelet", 10*time.Second); err != nil {
		return err
	}
	time.Sleep(5 * time.Second)
	if err := s.k.waitNodesReady(90*time.Second, []string{n1}); err != nil {
		return err
	}
	if err := tr.verdict(0); err != nil {
		return err
	}
	if after, err := s.restarts("srv-1"); err != nil || after != before {
		return fmt.Errorf("srv-1's containers restarted with the kubelet (%d -> %d, %v)", before, after, err)
	}
	// The restarted kubelet still starts pods, wired by flock-cni.
	if err := s.k.apply(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: after-kubelet, namespace: %s, labels: {app: cli}}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers: [{name: c, image: %s, args: [pause]}]
`, smokeNS, n1, agnhostImage)); err != nil {
		return err
	}
	defer func() { _, _ = s.k.run("", "delete", "pod", "-n", smokeNS, "after-kubelet", "--wait=false") }()
	if err := s.k.waitPodsReady(60*time.Second, "a pod after the restart", 1, "-n", smokeNS, "--field-selector", "metadata.name=after-kubelet"); err != nil {
		return err
	}
	return s.expect("after-kubelet", hostPort(s.ip("srv-2"), 8080), "tcp", true)
}

// ---- bad input through the real API ----

func (s *smoke) checkInvalidPolicy() error {
	_, err := s.k.run(policy("bad-port", "  podSelector: {}\n  ingress: [{ports: [{port: 70000}]}]\n"), "apply", "-f", "-")
	if err == nil {
		return fmt.Errorf("a NetworkPolicy with port 70000 was accepted")
	}
	for _, want := range []string{`NetworkPolicy "bad-port" is invalid`, "spec.ingress[0].ports[0].port", "70000"} {
		if !strings.Contains(err.Error(), want) {
			return fmt.Errorf("the error does not say %q: %v", want, err)
		}
	}
	return nil
}

func (s *smoke) checkCRDSchema() error {
	_, err := s.k.run(`apiVersion: policy.networking.k8s.io/v1alpha2
kind: ClusterNetworkPolicy
metadata: {name: fkc-smoke-bad, labels: {fkc-smoke: "1"}}
spec:
  tier: Gold
  priority: 5000
  subject: {namespaces: {}}
`, "apply", "-f", "-")
	if err == nil {
		return fmt.Errorf("a ClusterNetworkPolicy with tier Gold and priority 5000 was accepted")
	}
	for _, want := range []string{`"fkc-smoke-bad" is invalid`, "spec.tier", "spec.priority"} {
		if !strings.Contains(err.Error(), want) {
			return fmt.Errorf("the error does not say %q: %v", want, err)
		}
	}
	// flock's own CRD refuses what its schema refuses too.
	_, err = s.k.run("apiVersion: flock.dev/v1alpha1\nkind: FlockNode\nmetadata: {name: fkc-smoke-bad}\nspec: {bogus: 1}\nstatus: {apiHealth: 7}\n", "apply", "-f", "-")
	if err == nil {
		_, _ = s.k.run("", "delete", "flocknode", "fkc-smoke-bad", "--ignore-not-found")
		return fmt.Errorf("a FlockNode with unknown fields was accepted")
	}
	return nil
}

func (s *smoke) saKubeconfig(name string) (string, error) {
	if _, err := s.k.run("", "create", "serviceaccount", "-n", smokeNS, name); err != nil && !strings.Contains(err.Error(), "AlreadyExists") {
		return "", err
	}
	token, err := s.k.run("", "create", "token", "-n", smokeNS, name, "--duration=10m")
	if err != nil {
		return "", err
	}
	path := filepath.Join(s.c.l.Target, "smoke-"+name+".kubeconfig")
	// Block style: an IPv6 server URL's brackets are not plain YAML in a flow mapping.
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: flock
  cluster:
    server: %q
    certificate-authority: %q
users:
- name: %s
  user:
    token: %q
contexts:
- name: flock
  context: {cluster: flock, user: %s}
current-context: flock
`, s.c.plan.apiURL(), s.c.pk.path("ca.crt"), name, strings.TrimSpace(token), name)
	return path, os.WriteFile(path, []byte(kc), 0o600)
}

func (s *smoke) checkForbidden() error {
	kc, err := s.saKubeconfig("nobody")
	if err != nil {
		return err
	}
	defer os.Remove(kc)
	out, err := outputTimeout(60*time.Second, s.flockctl, "status", "--kubeconfig", kc)
	if err == nil {
		return fmt.Errorf("flockctl status worked without RBAC: %s", out)
	}
	msg := err.Error() + out
	if !strings.Contains(strings.ToLower(msg), "forbidden") || !strings.Contains(msg, "nodes") {
		return fmt.Errorf("the error does not name what was forbidden: %s", oneLine(msg))
	}
	// And kubectl as the agent: it may not write NetworkPolicies.
	_, err = s.k.run(policy("as-agent", "  podSelector: {}\n"), "apply", "-f", "-", "--as=system:serviceaccount:flock-system:flock-agent")
	if err == nil || !strings.Contains(err.Error(), "forbidden") {
		return fmt.Errorf("flock-agent's account could write a NetworkPolicy: %v", err)
	}
	return nil
}

func (s *smoke) checkBadKubeconfig() error {
	missing := filepath.Join(s.c.l.Target, "no-such.kubeconfig")
	out, err := outputTimeout(30*time.Second, s.flockctl, "status", "--kubeconfig", missing)
	if err == nil || !strings.Contains(err.Error()+out, "no-such.kubeconfig") {
		return fmt.Errorf("a missing kubeconfig did not give an error naming it: %v %s", err, out)
	}
	// A kubeconfig naming an address where no API server is.
	bad := filepath.Join(s.c.l.Target, "smoke-wrong.kubeconfig")
	kc, err := os.ReadFile(s.c.l.Kubeconfig())
	if err != nil {
		return err
	}
	wrong := "198.18.0.253"
	if !s.c.plan.hasV4() {
		wrong = "[2001:db8::fd]"
	}
	text := strings.Replace(string(kc), strings.TrimPrefix(s.c.plan.apiURL(), "https://"), wrong+":6443", 1)
	if err := os.WriteFile(bad, []byte(text), 0o600); err != nil {
		return err
	}
	defer os.Remove(bad)
	out, err = outputTimeout(60*time.Second, s.flockctl, "status", "--kubeconfig", bad)
	if err == nil {
		return fmt.Errorf("flockctl status worked against %s", wrong)
	}
	if msg := err.Error() + out; !strings.Contains(msg, strings.Trim(wrong, "[]")) {
		return fmt.Errorf("the error does not name the address it tried: %s", oneLine(msg))
	}
	return nil
}

// ---- probes that run inside a pod ----

// prober probes one destination from a pod in a loop (a bash loop in the pod: agnhost
// connect every 50 ms) and keeps each result with the pod's time (the host's clock: one
// kernel).
type prober struct {
	mu      sync.Mutex
	results []probeResult
	cancel  func()
	done    chan struct{}
}

type probeResult struct {
	At time.Time
	OK bool
}

func (s *smoke) startProber(from, dest string, d time.Duration) (*prober, error) {
	script := fmt.Sprintf(`end=$((SECONDS+%d)); while [ $SECONDS -lt $end ]; do t=$(date +%%s.%%N); if /agnhost connect %s --timeout=300ms >/dev/null 2>&1; then echo "$t ok"; else echo "$t fail"; fi; sleep 0.05; done`,
		int(d.Seconds()), dest)
	return runProber(exec.Command(s.k.kubectl, "--kubeconfig="+s.k.kubeconfig, "exec", "-n", smokeNS, from, "--", "bash", "-c", script))
}

// runProber starts a probe loop's command and collects its lines ("<unix time> ok|fail").
func runProber(cmd *exec.Cmd) (*prober, error) {
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &prober{done: make(chan struct{})}
	p.cancel = func() { _ = cmd.Process.Kill() }
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) != 2 {
				continue
			}
			secs, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				continue
			}
			at := time.Unix(0, int64(secs*1e9))
			p.mu.Lock()
			p.results = append(p.results, probeResult{At: at, OK: f[1] == "ok"})
			p.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	return p, nil
}

// podPid is the pid of a pod's sandbox, from its node's containerd (crictl): the process
// whose network namespace is the pod's.
func (s *smoke) podPid(name string) (int, error) {
	node := s.pods[name].Node
	endpoint := "unix://" + s.c.nodeFile(node, "/run/containerd/containerd.sock")
	crictl := func(args ...string) (string, error) {
		return outputTimeout(30*time.Second, s.c.l.Bin("crictl"), append([]string{"--runtime-endpoint", endpoint, "--config", "/dev/null"}, args...)...)
	}
	id, err := crictl("pods", "--name", "^"+name+"$", "--namespace", smokeNS, "--state", "ready", "-q")
	if err != nil {
		return 0, err
	}
	ids := strings.Fields(id)
	if len(ids) != 1 {
		return 0, fmt.Errorf("%d ready sandboxes of %s on %s", len(ids), name, node)
	}
	out, err := crictl("inspectp", ids[0])
	if err != nil {
		return 0, err
	}
	var info struct {
		Info struct {
			Pid int `json:"pid"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil || info.Info.Pid == 0 {
		return 0, fmt.Errorf("no pid for %s's sandbox: %v", name, err)
	}
	return info.Info.Pid, nil
}

// startNetnsProber is startProber run in the pod's network namespace from the host
// (agnhost from the cache): independent of the API server and the kubelets.
func (s *smoke) startNetnsProber(from, dest string, d time.Duration) (*prober, error) {
	pid, err := s.podPid(from)
	if err != nil {
		return nil, err
	}
	script := fmt.Sprintf(`end=$((SECONDS+%d)); while [ $SECONDS -lt $end ]; do t=$(date +%%s.%%N); if %s connect %s --timeout=300ms >/dev/null 2>&1; then echo "$t ok"; else echo "$t fail"; fi; sleep 0.05; done`,
		int(d.Seconds()), s.c.l.Bin("agnhost"), dest)
	return runProber(exec.Command("nsenter", fmt.Sprintf("--net=/proc/%d/ns/net", pid), "--", "bash", "-c", script))
}

func (p *prober) stop() {
	p.cancel()
	<-p.done
}

func (p *prober) snapshot() []probeResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]probeResult(nil), p.results...)
}

// firstAfter waits for the first probe started after t with the given result.
func (p *prober) firstAfter(ok bool, t time.Time, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, r := range p.snapshot() {
			if r.At.After(t) && r.OK == ok {
				return r.At, nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Time{}, fmt.Errorf("no probe %s within %s", map[bool]string{true: "connected", false: "was denied"}[ok], timeout)
}

func (p *prober) waitFor(ok bool, t time.Time, timeout time.Duration) error {
	_, err := p.firstAfter(ok, t, timeout)
	return err
}

// steady waits d after t and checks that every probe in that time had the result.
func (p *prober) steady(ok bool, t time.Time, d time.Duration) error {
	time.Sleep(time.Until(t.Add(d)))
	n := 0
	for _, r := range p.snapshot() {
		if r.At.After(t) && r.At.Before(t.Add(d)) {
			n++
			if r.OK != ok {
				return fmt.Errorf("a probe at +%.2f s had the other result", r.At.Sub(t).Seconds())
			}
		}
	}
	if n == 0 {
		return fmt.Errorf("no probe ran in the %s after", d)
	}
	return nil
}

func (p *prober) count(ok bool) (int, int) {
	rs := p.snapshot()
	n := 0
	for _, r := range rs {
		if r.OK == ok {
			n++
		}
	}
	return n, len(rs)
}

// stream is one HTTP keep-alive connection making requests at a steady rate (curl
// --rate), reporting for each transfer how many new connections it made.
type stream struct {
	out  strings.Builder
	err  error
	done chan struct{}
}

func (s *smoke) startStream(from, url string, requests int) (*stream, error) {
	args := []string{"--kubeconfig=" + s.k.kubeconfig, "exec", "-n", smokeNS, from, "--", "curl", "-s", "-o", "/dev/null",
		"--rate", "5/s", "--max-time", "120", "-w", `%{num_connects} %{http_code}\n`}
	for range requests {
		args = append(args, url)
	}
	cmd := exec.Command(s.k.kubectl, args...)
	st := &stream{done: make(chan struct{})}
	cmd.Stdout = &st.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(st.done)
		st.err = cmd.Wait()
	}()
	return st, nil
}

// wait returns the connections made and the transfers done.
func (st *stream) wait() (int, int, error) {
	<-st.done
	connects, transfers := 0, 0
	for _, line := range strings.Split(strings.TrimSpace(st.out.String()), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		n, _ := strconv.Atoi(f[0])
		connects += n
		if f[1] == "200" {
			transfers++
		}
	}
	if st.err != nil && transfers == 0 {
		return connects, transfers, fmt.Errorf("the stream failed: %v", st.err)
	}
	return connects, transfers, nil
}

// dnsLoop looks a name up every 200 ms (dig: a timeout of 2 s and one retry, a resolver's
// usual patience).
type dnsLoop struct {
	out  strings.Builder
	done chan struct{}
}

func (s *smoke) startDNSLoop(from, name string, d time.Duration) (*dnsLoop, error) {
	qtype := "A"
	if !s.c.plan.hasV4() {
		qtype = "AAAA"
	}
	script := fmt.Sprintf(`end=$((SECONDS+%d)); while [ $SECONDS -lt $end ]; do if dig +short +timeout=2 +tries=2 %s %s | grep -q .; then echo ok; else echo fail; fi; sleep 0.2; done`, int(d.Seconds()), name, qtype)
	cmd := exec.Command(s.k.kubectl, "--kubeconfig="+s.k.kubeconfig, "exec", "-n", smokeNS, from, "--", "bash", "-c", script)
	l := &dnsLoop{done: make(chan struct{})}
	cmd.Stdout = &l.out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() { defer close(l.done); _ = cmd.Wait() }()
	return l, nil
}

func (l *dnsLoop) wait() (failed, total int) {
	<-l.done
	for _, line := range strings.Split(strings.TrimSpace(l.out.String()), "\n") {
		switch line {
		case "ok":
			total++
		case "fail":
			total++
			failed++
		}
	}
	return failed, total
}

func httpGet(url string) (string, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(body), nil
}

// outputTimeout runs a command with a deadline; the error carries its stderr.
func outputTimeout(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}
