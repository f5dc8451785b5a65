package main

// upgrade: flock installed, upgraded, rolled back and removed with Helm on the running
// cluster, as operators do, with traffic running through every step (Cilium's conn-disrupt
// test, on flock's own fixture pods): long-lived TCP streams, new connections, UDP and DNS
// (plain, and through the agent's DNS proxy for a pod with a domain rule) between pods on
// both nodes, and denied probes.
//
// The steps: adopt the kubectl install up.sh made (helm --take-ownership, the path existing
// users take: nothing restarts); move to the previous version (a pinned commit of main,
// its images built from that commit, its manifests wrapped as chart 0.1.0); upgrade to the
// working tree's chart; roll back; upgrade again; uninstall, and check that no node keeps
// anything of flock once its last flock pod is gone; install again (the cluster is left as
// up.sh made it). The socket keeper is OnDelete: after each step its pods are replaced
// node by node. The last line is one JSON object (docs/cluster.md#upgrades).

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// upgradeFrom is the previous version: main at the stop before the chart's first
// release-to-be (2026-12-03), whose agents keep their rules on every stop.
const upgradeFrom = "d44cc6a"

// phaseCounts are one phase's attempts and losses (the JSON's inner objects).
type phaseCounts struct {
	Streams, NewConns, UDP, DNS, Denied                          int
	StreamsCut, NewConnsFailed, UDPLost, DNSFailed, DeniedAnswer int
}

func (p *phaseCounts) add(o phaseCounts) {
	p.Streams += o.Streams
	p.NewConns += o.NewConns
	p.UDP += o.UDP
	p.DNS += o.DNS
	p.Denied += o.Denied
	p.StreamsCut += o.StreamsCut
	p.NewConnsFailed += o.NewConnsFailed
	p.UDPLost += o.UDPLost
	p.DNSFailed += o.DNSFailed
	p.DeniedAnswer += o.DeniedAnswer
}

func (p phaseCounts) losses() int {
	return p.StreamsCut + p.NewConnsFailed + p.UDPLost + p.DNSFailed + p.DeniedAnswer
}

type upgrade struct {
	s    *smoke
	helm []string // the helm command (tests/helm/helm.sh)
	// The working tree's images (from the running install) and the previous version's.
	cur, prev map[string]string // stage -> image ref
	prevChart string
	values    string // the working tree chart's values for this cluster
	// CoreDNS's replicas before the uninstall scaled it to 0.
	corednsReplicas string
}

func cmdUpgrade(args []string) error {
	fs := flag.NewFlagSet("upgrade", flag.ContinueOnError)
	from := fs.String("from", upgradeFrom, "the previous version: a commit of this repository")
	if err := fs.Parse(args); err != nil {
		return exitCode(2)
	}
	u, err := newUpgrade("upgrade")
	if err != nil {
		return err
	}
	c := u.s.c
	t0 := time.Now()
	if err := u.buildPrevious(*from); err != nil {
		return fmt.Errorf("the previous version %s: %w", *from, err)
	}
	if err := u.writeValues(); err != nil {
		return err
	}
	if err := u.s.setup(); err != nil {
		return fmt.Errorf("setting up the fixture pods: %w", err)
	}
	defer u.s.teardown()
	if err := u.policies(); err != nil {
		return err
	}

	// Helm 4 applies server-side by default, and every field kubectl's client-side apply
	// manages then conflicts, at the adoption and at every later upgrade (found here). An
	// install kubectl made is adopted client-side: its later upgrades stay so ("auto").
	progress("upgrade: adopting the kubectl install (helm upgrade --install --take-ownership --server-side=false)")
	before, err := u.agentPods()
	if err != nil {
		return err
	}
	if _, err := u.runHelm(append([]string{"upgrade", "--install", "flock", filepath.Join(c.l.Repo, "deploy/helm/flock"), "--take-ownership", "--server-side=false"}, u.chartArgs()...)...); err != nil {
		return err
	}
	after, err := u.agentPods()
	if err != nil {
		return err
	}
	if strings.Join(before, ",") != strings.Join(after, ",") {
		return fmt.Errorf("adoption restarted agents: %v became %v", before, after)
	}
	progress("upgrade: adopted as revision 1; no agent restarted")

	steps := []struct {
		phase, what string
		run         func() error
	}{
		{"rollback", "to the previous version (chart 0.1.0, " + *from + ")", func() error {
			_, err := u.runHelm("upgrade", "flock", u.prevChart, "--namespace", "flock-system", "--wait=legacy", "--timeout", "5m")
			return err
		}},
		{"upgrade", "to the working tree", func() error {
			_, err := u.runHelm(append([]string{"upgrade", "flock", filepath.Join(c.l.Repo, "deploy/helm/flock")}, u.chartArgs()...)...)
			return err
		}},
		{"rollback", "helm rollback to revision 2", func() error {
			_, err := u.runHelm("rollback", "flock", "2", "--namespace", "flock-system", "--wait=legacy", "--timeout", "5m")
			return err
		}},
		{"upgrade", "to the working tree again", func() error {
			_, err := u.runHelm(append([]string{"upgrade", "flock", filepath.Join(c.l.Repo, "deploy/helm/flock")}, u.chartArgs()...)...)
			return err
		}},
	}
	attempted := map[string]*phaseCounts{"upgrade": {}, "rollback": {}}
	down := map[string]map[string]float64{"upgrade": {}, "rollback": {}}
	for _, st := range steps {
		progress("upgrade: %s: %s", st.phase, st.what)
		counts, times, err := u.measure(st.run)
		if err != nil {
			return fmt.Errorf("%s %s: %w", st.phase, st.what, err)
		}
		progress("upgrade: %s done: %d streams (%d cut), %d new connections (%d failed), %d UDP (%d lost), %d DNS (%d failed), %d denied probes (%d answered); nodes without a Ready agent: %v",
			st.phase, counts.Streams, counts.StreamsCut, counts.NewConns, counts.NewConnsFailed, counts.UDP, counts.UDPLost,
			counts.DNS, counts.DNSFailed, counts.Denied, counts.DeniedAnswer, times)
		attempted[st.phase].add(counts)
		for n, t := range times {
			down[st.phase][n] = float64(int((down[st.phase][n]+t)*10+0.5)) / 10
		}
	}

	progress("upgrade: helm uninstall")
	checked, left, uninstallTimes, err := u.uninstall("helm uninstall", func() error {
		_, err := u.runHelm("uninstall", "flock", "--namespace", "flock-system", "--wait=legacy", "--timeout", "5m")
		return err
	})
	if err != nil {
		return err
	}
	if err := u.reinstall(); err != nil {
		return fmt.Errorf("installing flock again after the uninstall: %w", err)
	}
	// The plain manifests' way: kubectl delete -k of the overlays up.sh applied (the
	// namespace goes with them).
	progress("upgrade: kubectl delete -k (the plain manifests)")
	c2, l2, _, err := u.uninstall("kubectl delete -k", func() error {
		for _, part := range []string{"agent", "controller"} {
			dir := filepath.Join(c.l.Target, "install", part)
			if _, err := c.k.runTimeout(3*time.Minute, "", "delete", "-k", dir, "--ignore-not-found", "--wait=true"); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	checked, left = checked+c2, left+l2
	if err := u.reinstall(); err != nil {
		return fmt.Errorf("installing flock again after kubectl delete: %w", err)
	}
	progress("upgrade: installed again; %.0f s in all", time.Since(t0).Seconds())

	phaseJSON := func(p *phaseCounts) (map[string]int, map[string]int) {
		return map[string]int{"streams": p.Streams, "new_conns": p.NewConns, "udp": p.UDP, "dns": p.DNS, "denied_probes": p.Denied},
			map[string]int{"streams_cut": p.StreamsCut, "new_conns_failed": p.NewConnsFailed, "udp_lost": p.UDPLost, "dns_failed": p.DNSFailed, "denied_answered": p.DeniedAnswer}
	}
	ua, ul := phaseJSON(attempted["upgrade"])
	ra, rl := phaseJSON(attempted["rollback"])
	out := map[string]any{
		"attempted": map[string]any{"upgrade": ua, "rollback": ra, "uninstall": map[string]int{"nodes_checked": checked}},
		"losses":    map[string]any{"upgrade": ul, "rollback": rl, "uninstall": map[string]int{"left_on_nodes": left}},
		"times":     map[string]any{"upgrade": down["upgrade"], "rollback": down["rollback"], "uninstall": uninstallTimes},
	}
	text, err := json.Marshal(out)
	if err != nil {
		return err
	}
	fmt.Println(string(text))
	if attempted["upgrade"].losses()+attempted["rollback"].losses()+left > 0 {
		return exitCode(1)
	}
	return nil
}

// newUpgrade: the running flock cluster of up.sh, with Helm and the images it runs; `what`
// names the command in the error when there is no such cluster.
func newUpgrade(what string) (*upgrade, error) {
	c, err := loadCluster()
	if err != nil {
		return nil, err
	}
	if !c.st.Ready || c.plan.CNI != "flock" {
		return nil, fmt.Errorf("%s needs the flock cluster of tests/cluster/up.sh (ready, --cni flock)", what)
	}
	u := &upgrade{
		s:    &smoke{c: c, k: c.k, flockctl: filepath.Join(c.l.Target, "images", "out", "flockctl"), pods: map[string]smokePod{}},
		helm: []string{filepath.Join(c.l.Repo, "tests/helm/helm.sh"), "--kubeconfig", c.l.Kubeconfig()},
	}
	if u.cur, err = u.installedImages(); err != nil {
		return nil, err
	}
	return u, nil
}

func (u *upgrade) runHelm(args ...string) (string, error) {
	args = append(append([]string(nil), u.helm[1:]...), args...)
	cmd := exec.Command(u.helm[0], args...)
	cmd.Dir = u.s.c.l.Repo
	out, err := cmd.CombinedOutput()
	f, ferr := os.OpenFile(filepath.Join(u.s.c.l.Logs(), "helm.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if ferr == nil {
		fmt.Fprintf(f, "==== helm %s\n%s\n", strings.Join(args, " "), out)
		f.Close()
	}
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w: %s", strings.Join(args[2:], " "), err, shorten(strings.TrimSpace(string(out)), 600))
	}
	return string(out), nil
}

// chartArgs: the working tree's chart with this cluster's values. --wait=legacy: Helm 4's
// default watcher waits for every DaemonSet to be updated, which the socket keeper (OnDelete)
// never is until its pods are deleted (found here: every upgrade timed out); the legacy
// checker, Helm 3's, leaves OnDelete DaemonSets alone.
func (u *upgrade) chartArgs() []string {
	return []string{"--namespace", "flock-system", "-f", u.values, "--wait=legacy", "--timeout", "5m"}
}

// installedImages are the images the running install names (up.sh's, of the working tree).
func (u *upgrade) installedImages() (map[string]string, error) {
	get := func(kind, name string) (string, error) {
		out, err := u.s.k.run("", "get", kind, "-n", "flock-system", name, "-o", "jsonpath={.spec.template.spec.containers[0].image}")
		return strings.TrimSpace(out), err
	}
	agent, err := get("daemonset", "flock-agent")
	if err != nil {
		return nil, err
	}
	controller, err := get("deployment", "flock-controller")
	if err != nil {
		return nil, err
	}
	return map[string]string{"agent": agent, "controller": controller}, nil
}

func tagOf(ref string) string { return ref[strings.LastIndex(ref, ":")+1:] }

// writeValues writes the working tree chart's values for this cluster: the images up.sh
// built, the cluster's ranges (what up.sh's kustomize overlay sets).
func (u *upgrade) writeValues() error {
	p := u.s.c.plan
	var pods, svcs []string
	for _, n := range p.Nodes {
		for _, c := range n.PodCIDRs {
			pods = append(pods, strconv.Quote(c.String()))
		}
	}
	for _, s := range p.ServiceCIDRs {
		svcs = append(svcs, strconv.Quote(s.String()))
	}
	u.values = filepath.Join(u.s.c.l.Target, "upgrade", "values.yaml")
	return writeFile(u.values, []byte(fmt.Sprintf(`# Written by tests/cluster/upgrade.sh: the working tree's chart on this cluster.
agent:
  image: {tag: %q}
controller:
  image: {tag: %q}
  clusterPodCIDRs: [%s]
  clusterServiceCIDRs: [%s]
`, tagOf(u.cur["agent"]), tagOf(u.cur["controller"]), strings.Join(pods, ", "), strings.Join(svcs, ", "))), 0o644)
}

// buildPrevious builds the previous version's images from its commit (cached by commit),
// imports them into every node, and wraps its manifests, as a kustomize overlay with those
// images and this cluster's ranges renders them, as chart 0.1.0.
func (u *upgrade) buildPrevious(commit string) error {
	l := u.s.c.l
	full, err := outputIn(l.Repo, "git", "rev-parse", "--verify", commit+"^{commit}")
	if err != nil {
		return err
	}
	full = strings.TrimSpace(full)
	base := filepath.Join(l.Target, "prev", full[:12])
	src := filepath.Join(base, "src")
	if _, err := os.Stat(filepath.Join(src, "Cargo.toml")); err != nil {
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		progress("upgrade: extracting %s into %s", full[:12], src)
		if err := run(nil, "sh", "-c", fmt.Sprintf("git -C %s archive %s | tar -x -C %s", shellQuote(l.Repo), full, shellQuote(src))); err != nil {
			return err
		}
		// Its dependencies are this checkout's (the same lockfile but for flock's own
		// crates): start from a copy of this checkout's release build.
		if _, err := os.Stat(filepath.Join(l.Repo, "target/release")); err == nil {
			progress("upgrade: seeding its build from target/release")
			if err := os.MkdirAll(filepath.Join(src, "target"), 0o755); err != nil {
				return err
			}
			if err := run(nil, "cp", "-a", filepath.Join(l.Repo, "target/release"), filepath.Join(src, "target/release")); err != nil {
				return err
			}
		}
	}
	pl := *l
	pl.Repo, pl.Target, pl.Commit = src, base, full[:7]
	imgs, err := pl.buildFlockImages()
	if err != nil {
		return err
	}
	u.prev = map[string]string{}
	for _, img := range imgs {
		u.prev[img.Stage] = img.Ref()
		for _, n := range u.s.c.plan.Nodes {
			if err := u.s.c.importTar(n, img.Tar); err != nil {
				return err
			}
		}
	}
	// Its manifests, as an operator's overlay renders them.
	overlay := filepath.Join(base, "overlay")
	var b strings.Builder
	for _, part := range []string{"agent", "controller"} {
		dir := filepath.Join(overlay, part)
		rel, _ := filepath.Rel(dir, filepath.Join(src, "deploy", part))
		k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%s]\nimages:\n  - {name: %s, newTag: %s}\n",
			rel, flockImageNames[part], tagOf(u.prev[part]))
		if part == "controller" {
			k += fmt.Sprintf(`patches:
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
`, podCIDRList(u.s.c.plan), joinPrefixes(u.s.c.plan.ServiceCIDRs))
		}
		if err := writeFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
			return err
		}
		out, err := u.s.k.run("", "kustomize", dir)
		if err != nil {
			return err
		}
		b.WriteString("---\n" + out)
	}
	chart := filepath.Join(base, "chart")
	_ = os.RemoveAll(chart)
	docs, crds := splitCRDs(b.String())
	if err := writeFile(filepath.Join(chart, "Chart.yaml"), []byte(fmt.Sprintf(`apiVersion: v2
name: flock
description: flock %s's deploy/ manifests, wrapped by tests/cluster/upgrade.sh as the previous release
version: 0.1.0
appVersion: %q
`, full[:7], full[:7])), 0o644); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(chart, "templates", "flock.yaml"), []byte(escapeTemplates(docs)), 0o644); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(chart, "crds", "crds.yaml"), []byte(crds), 0o644); err != nil {
		return err
	}
	u.prevChart = chart
	progress("upgrade: previous version %s: images %s, %s; chart 0.1.0 in %s", full[:7], u.prev["agent"], u.prev["controller"], chart)
	return nil
}

// splitCRDs separates CustomResourceDefinitions (a chart's crds/) from the other documents.
func splitCRDs(all string) (docs, crds string) {
	var d, c []string
	seen := map[string]bool{}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(all, -1) {
		// Both parts of deploy/ carry the namespace: once in a release.
		if strings.TrimSpace(doc) == "" || seen[strings.TrimSpace(doc)] {
			continue
		}
		seen[strings.TrimSpace(doc)] = true
		if regexp.MustCompile(`(?m)^kind: CustomResourceDefinition\s*$`).MatchString(doc) {
			c = append(c, strings.Trim(doc, "\n"))
		} else {
			d = append(d, strings.Trim(doc, "\n"))
		}
	}
	return strings.Join(d, "\n---\n") + "\n", strings.Join(c, "\n---\n") + "\n"
}

// escapeTemplates keeps `{{` in the manifests literal for Helm's template engine.
func escapeTemplates(s string) string {
	return strings.ReplaceAll(s, "{{", "{{`{{`}}")
}

// policies: bad-2 denied to srv-1 (and srv-2), the others allowed; dom's DNS through the
// agent's proxy (a domain rule).
func (u *upgrade) policies() error {
	s := u.s
	for _, inst := range []string{"1", "2"} {
		if err := s.applyPolicy(policy("upgrade-allow-cli-"+inst, fmt.Sprintf(`  podSelector: {matchLabels: {inst: "%s"}}
  policyTypes: [Ingress]
  ingress: [{from: [{podSelector: {matchLabels: {app: cli}}}]}]
`, inst))); err != nil {
			return err
		}
	}
	if err := s.applyDomainRuleForDNS(); err != nil {
		return err
	}
	return waitFor(15*time.Second, "the upgrade's policies", func() error {
		return s.expect("bad-2", hostPort(s.ip("srv-1"), 8080), "tcp", false)
	})
}

// agentPods are the agent pods' uids, sorted.
func (u *upgrade) agentPods() ([]string, error) {
	var pl podList
	if err := u.s.k.getJSON(&pl, "pods", "-n", "flock-system", "-l", "app.kubernetes.io/name=flock-agent"); err != nil {
		return nil, err
	}
	var uids []string
	for _, p := range pl.Items {
		uids = append(uids, p.Metadata.UID)
	}
	sort.Strings(uids)
	return uids, nil
}

// netnsLoop runs a probe loop in a pod's network namespace from the host until stop:
// every line "<ok|fail>".
type netnsLoop struct {
	cmd  *exec.Cmd
	out  strings.Builder
	mu   sync.Mutex
	done chan struct{}
}

func (s *smoke) startNetnsLoop(from, body string) (*netnsLoop, error) {
	pid, err := s.podPid(from)
	if err != nil {
		return nil, err
	}
	l := &netnsLoop{done: make(chan struct{})}
	l.cmd = exec.Command("nsenter", fmt.Sprintf("--net=/proc/%d/ns/net", pid), "--", "bash", "-c", body)
	// A group of its own: stop ends the loop and whatever it runs at once.
	l.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, err := l.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := l.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		defer close(l.done)
		buf := make([]byte, 4096)
		for {
			n, err := pr.Read(buf)
			l.mu.Lock()
			l.out.Write(buf[:n])
			l.mu.Unlock()
			if err != nil {
				break
			}
		}
		_ = l.cmd.Wait()
	}()
	return l, nil
}

func (l *netnsLoop) stop() (ok, fail int, lines []string) {
	// Every line written so far stays readable; the probe in flight is not counted.
	_ = syscall.Kill(-l.cmd.Process.Pid, syscall.SIGKILL)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range strings.Split(strings.TrimSpace(l.out.String()), "\n") {
		switch strings.Fields(line + " x")[0] {
		case "ok":
			ok++
		case "fail":
			fail++
		default:
			if line != "" {
				lines = append(lines, line)
			}
		}
	}
	return ok, fail, lines
}

// measure runs one step with the traffic running, replaces the socket keeper's pods node
// by node, and counts what the traffic lost, and how long each node had no Ready agent.
func (u *upgrade) measure(step func() error) (phaseCounts, map[string]float64, error) {
	s := u.s
	var pc phaseCounts
	agnhost := s.c.l.Bin("agnhost")
	connectLoop := func(dest, proto string) string {
		return fmt.Sprintf(`while :; do if %s connect %s --timeout=1s --protocol=%s >/dev/null 2>&1; then echo ok; else echo fail; fi; sleep 0.1; done`, agnhost, dest, proto)
	}
	// A stream: one HTTP keep-alive connection, a request every 200 ms; any request that
	// needed a new connection or failed cuts it ("fail").
	streamLoop := func(dest string) string {
		// -o once per URL: curl's -o names the output of one transfer only.
		// -w to stderr (unbuffered; curl's stdout to a pipe is block-buffered) and read by
		// bash, not awk (Debian's mawk reads a pipe in blocks): each transfer is counted as it
		// ends, and the loop can be killed at any time (found here).
		return fmt.Sprintf(`u=(); for i in $(seq 3000); do u+=(-o /dev/null http://%s/hostname); done; curl -s --rate 5/s --max-time 10 -w '%%{stderr}%%{num_connects} %%{http_code}\n' "${u[@]}" 2>&1 >/dev/null | { read -r c h; if [ "$h" = 200 ]; then echo ok; else echo fail; fi; while read -r c h; do if [ "$c" = 0 ] && [ "$h" = 200 ]; then echo ok; else echo fail; fi; done; }`, dest)
	}
	type loop struct {
		kind string
		l    *netnsLoop
	}
	var loops []loop
	start := func(kind, from, body string) error {
		l, err := s.startNetnsLoop(from, body)
		if err != nil {
			return err
		}
		loops = append(loops, loop{kind, l})
		return nil
	}
	srv1, srv2 := s.ip("srv-1"), s.ip("srv-2")
	dnsIP := s.c.plan.DNSIP.String()
	qtype := "1"
	if !s.c.plan.hasV4() {
		qtype = "28"
	}
	dnsLoop := func(name string) string {
		// From the pod's namespace to the cluster DNS Service, a resolver's patience (2 s,
		// one retry); python3 is the host's (no dig there).
		return fmt.Sprintf(`exec python3 -c %s %s %s %s`, shellQuote(dnsProbe), dnsIP, name, qtype)
	}
	cleanup := func() {
		for _, l := range loops {
			l.l.stop()
		}
	}
	for _, st := range []struct{ kind, from, body string }{
		{"stream", "cli-2", streamLoop(hostPort(srv1, 8080))},
		{"stream", "cli-1", streamLoop(hostPort(srv2, 8080))},
		{"new", "cli-2", connectLoop(hostPort(srv1, 8080), "tcp")},
		{"new", "cli-1", connectLoop(hostPort(srv2, 8080), "tcp")},
		{"udp", "cli-2", connectLoop(hostPort(srv1, 8081), "udp")},
		{"udp", "cli-1", connectLoop(hostPort(srv2, 8081), "udp")},
		{"dns", "dom", dnsLoop("dom-a." + smokeNS + ".svc.cluster.local")},
		{"dns", "cli-2", dnsLoop("srv." + smokeNS + ".svc.cluster.local")},
		{"denied", "bad-2", connectLoop(hostPort(srv1, 8080), "tcp")},
		{"denied", "bad-2", connectLoop(hostPort(srv2, 8080), "tcp")},
	} {
		if err := start(st.kind, st.from, st.body); err != nil {
			cleanup()
			return pc, nil, err
		}
	}
	// Not-Ready time per node, sampled every 200 ms.
	down := map[string]float64{}
	stopPoll := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		last := time.Now()
		for {
			select {
			case <-stopPoll:
				return
			case <-time.After(200 * time.Millisecond):
			}
			ready, err := u.readyAgents()
			now := time.Now()
			if err == nil {
				for _, n := range s.c.plan.Nodes {
					if !ready[n.Name] {
						down[n.Name] += now.Sub(last).Seconds()
					}
				}
			}
			last = now
		}
	}()
	time.Sleep(3 * time.Second)
	err := step()
	if err == nil {
		err = u.replaceKeepers()
	}
	if err == nil {
		err = u.waitAgentsReady()
	}
	time.Sleep(5 * time.Second)
	close(stopPoll)
	<-polled
	for _, l := range loops {
		ok, fail, other := l.l.stop()
		if len(other) > 0 {
			progress("upgrade: a %s loop said: %s", l.kind, shorten(strings.Join(other, " | "), 300))
		}
		switch l.kind {
		case "stream":
			pc.Streams++
			if fail > 0 || ok == 0 {
				pc.StreamsCut++
				progress("upgrade: a stream was cut: %d requests on its connection, %d needed a new one or failed", ok, fail)
			}
		case "new":
			pc.NewConns += ok + fail
			pc.NewConnsFailed += fail
		case "udp":
			pc.UDP += ok + fail
			pc.UDPLost += fail
		case "dns":
			pc.DNS += ok + fail
			pc.DNSFailed += fail
		case "denied":
			pc.Denied += ok + fail
			pc.DeniedAnswer += ok
		}
	}
	for n, t := range down {
		down[n] = float64(int(t*10+0.5)) / 10
	}
	return pc, down, err
}

// dnsProbe asks SERVER for NAME (type QTYPE) every 200 ms, printing ok (an answer with
// records) or fail; each query waits 2 s and is tried twice.
const dnsProbe = `import random, socket, struct, sys, time
server, name, qtype = sys.argv[1], sys.argv[2], int(sys.argv[3])
family = socket.AF_INET6 if ":" in server else socket.AF_INET
qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".") if p) + b"\0"
def ask():
    tid = random.randrange(65536)
    packet = struct.pack(">HHHHHH", tid, 0x0100, 1, 0, 0, 0) + qname + struct.pack(">HH", qtype, 1)
    for _ in range(2):
        s = socket.socket(family, socket.SOCK_DGRAM)
        s.settimeout(2)
        try:
            s.sendto(packet, (server, 53))
            while True:
                data, _ = s.recvfrom(4096)
                if len(data) >= 12 and struct.unpack(">H", data[:2])[0] == tid:
                    return data[3] & 15 == 0 and struct.unpack(">H", data[6:8])[0] > 0
        except OSError:
            pass
        finally:
            s.close()
    return False
while True:
    print("ok" if ask() else "fail", flush=True)
    time.sleep(0.2)
`

// readyAgents: which nodes have a Ready agent pod.
func (u *upgrade) readyAgents() (map[string]bool, error) {
	var pl podList
	if err := u.s.k.getJSON(&pl, "pods", "-n", "flock-system", "-l", "app.kubernetes.io/name=flock-agent"); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, p := range pl.Items {
		if p.ready() && p.Metadata.DeletionTimestamp == "" {
			out[p.Spec.NodeName] = true
		}
	}
	return out, nil
}

func (u *upgrade) waitAgentsReady() error {
	return waitFor(3*time.Minute, "a Ready agent on every node", func() error {
		ready, err := u.readyAgents()
		if err != nil {
			return err
		}
		for _, n := range u.s.c.plan.Nodes {
			if !ready[n.Name] {
				return fmt.Errorf("no Ready agent on %s", n.Name)
			}
		}
		return nil
	})
}

// replaceKeepers replaces, node by node, the socket keeper pods that are not of the
// DaemonSet's current revision (it is OnDelete: nothing else replaces them).
func (u *upgrade) replaceKeepers() error {
	k := u.s.k
	image, err := k.run("", "get", "daemonset", "-n", "flock-system", "flock-socket-keeper", "-o", "jsonpath={.spec.template.spec.containers[0].image}")
	if err != nil {
		return err
	}
	want := strings.TrimSpace(image)
	keepers := func(node string) ([]pod, error) {
		var pl struct {
			Items []struct {
				pod
				Spec struct {
					NodeName   string `json:"nodeName"`
					Containers []struct {
						Image string `json:"image"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"items"`
		}
		if err := k.getJSON(&pl, "pods", "-n", "flock-system", "-l", "app.kubernetes.io/name=flock-socket-keeper", "--field-selector", "spec.nodeName="+node); err != nil {
			return nil, err
		}
		var out []pod
		for _, p := range pl.Items {
			if len(p.Spec.Containers) > 0 && p.Spec.Containers[0].Image == want && p.Metadata.DeletionTimestamp == "" {
				continue
			}
			out = append(out, p.pod)
		}
		return out, nil
	}
	for _, n := range u.s.c.plan.Nodes {
		old, err := keepers(n.Name)
		if err != nil {
			return err
		}
		for _, p := range old {
			progress("upgrade: replacing socket keeper %s on %s (OnDelete)", p.Metadata.Name, n.Name)
			if _, err := k.run("", "delete", "pod", "-n", "flock-system", p.Metadata.Name, "--wait=true", "--timeout=60s"); err != nil {
				return err
			}
		}
		if len(old) == 0 {
			continue
		}
		if err := k.waitPodsReady(2*time.Minute, "the new socket keeper on "+n.Name, 1, "-n", "flock-system",
			"-l", "app.kubernetes.io/name=flock-socket-keeper", "--field-selector", "spec.nodeName="+n.Name); err != nil {
			return err
		}
	}
	return nil
}

// uninstall removes the release, then every pod flock wired (the fixture's, CoreDNS's:
// flock-cni stays until the last one's DEL), and checks each node: no flock table, route,
// VXLAN device, pod interface, DNS proxy rule, CNI config or flock-cni.
func (u *upgrade) uninstall(how string, remove func() error) (checked, left int, times map[string]float64, err error) {
	k := u.s.k
	t := time.Now()
	if err := remove(); err != nil {
		return 0, 0, nil, err
	}
	if err := waitFor(2*time.Minute, "flock's pods gone", func() error {
		var pl podList
		if err := k.getJSON(&pl, "pods", "-n", "flock-system"); err != nil && !strings.Contains(err.Error(), "NotFound") {
			return err
		}
		if len(pl.Items) > 0 {
			return fmt.Errorf("%d pods left in flock-system", len(pl.Items))
		}
		return nil
	}); err != nil {
		return 0, 0, nil, err
	}
	progress("upgrade: %s done in %.0f s; deleting the pods flock wired", how, time.Since(t).Seconds())
	if _, err := k.run("", "delete", "namespace", smokeNS, "--ignore-not-found", "--wait=true", "--timeout=120s"); err != nil {
		return 0, 0, nil, err
	}
	replicas, err := k.run("", "get", "deployment", "-n", "kube-system", "coredns", "-o", "jsonpath={.spec.replicas}")
	if err != nil {
		return 0, 0, nil, err
	}
	u.corednsReplicas = strings.TrimSpace(replicas)
	if _, err := k.run("", "scale", "deployment", "-n", "kube-system", "coredns", "--replicas=0"); err != nil {
		return 0, 0, nil, err
	}
	if err := waitFor(2*time.Minute, "CoreDNS's pods gone", func() error {
		var pl podList
		if err := k.getJSON(&pl, "pods", "-n", "kube-system", "-l", "k8s-app=kube-dns"); err != nil {
			return err
		}
		if len(pl.Items) > 0 {
			return fmt.Errorf("%d left", len(pl.Items))
		}
		return nil
	}); err != nil {
		return 0, 0, nil, err
	}
	times = map[string]float64{}
	for _, n := range u.s.c.plan.Nodes {
		checked++
		found := u.leftovers(n.Name)
		if len(found) > 0 {
			left++
			progress("upgrade: %s keeps: %s", n.Name, strings.Join(found, "; "))
		} else {
			progress("upgrade: %s: nothing of flock left", n.Name)
		}
		times[n.Name] = float64(int(time.Since(t).Seconds()*10+0.5)) / 10
	}
	return checked, left, times, nil
}

// leftovers lists what of flock a node still has.
func (u *upgrade) leftovers(node string) []string {
	c := u.s.c
	in := func(args ...string) string {
		out, _ := output("nsenter", append([]string{"--net=" + c.nodeNS(node).Net, "--"}, args...)...)
		return strings.TrimSpace(out)
	}
	var found []string
	if strings.Contains(in("nft", "list", "tables"), "inet flock") {
		found = append(found, "table inet flock")
	}
	if r := in("ip", "route", "show", "proto", "70"); r != "" {
		found = append(found, "routes: "+oneLine(r))
	}
	if r := in("ip", "-6", "route", "show", "proto", "70"); r != "" {
		found = append(found, "IPv6 routes: "+oneLine(r))
	}
	for _, fam := range []string{"-4", "-6"} {
		if r := in("ip", fam, "rule", "show", "table", "180"); r != "" {
			found = append(found, "DNS proxy rule: "+oneLine(r))
		}
	}
	for _, line := range strings.Split(in("ip", "-o", "-d", "link", "show"), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name := strings.SplitN(strings.TrimSuffix(f[1], ":"), "@", 2)[0]
		if strings.HasPrefix(name, "flk") || strings.Contains(line, "flock overlay") {
			found = append(found, "link "+name)
		}
	}
	for _, p := range []string{"/etc/cni/net.d/10-flock.conflist", "/opt/cni/bin/flock-cni"} {
		if _, err := os.Stat(c.nodeFile(node, p)); err == nil {
			found = append(found, p)
		}
	}
	return found
}

// reinstall puts flock back as up.sh installed it, and CoreDNS.
func (u *upgrade) reinstall() error {
	c := u.s.c
	imgs, err := filepath.Glob(filepath.Join(c.l.Target, "images", "*-dev-*.tar"))
	if err != nil {
		return err
	}
	c.flockImages = nil
	for _, t := range imgs {
		base := filepath.Base(t)
		stage := base[:strings.Index(base, "-dev-")]
		c.flockImages = append(c.flockImages, flockImage{Stage: stage, Name: flockImageNames[stage], Tag: strings.TrimSuffix(base[len(stage)+1:], ".tar"), Tar: t})
	}
	if err := c.installFlock(); err != nil {
		return err
	}
	if _, err := c.k.run("", "scale", "deployment", "-n", "kube-system", "coredns", "--replicas="+u.corednsReplicas); err != nil {
		return err
	}
	if err := c.k.waitPodsReady(3*time.Minute, "flock's pods", 2, "-n", "flock-system", "-l", "app.kubernetes.io/name=flock-agent"); err != nil {
		return err
	}
	return c.k.waitPodsReady(3*time.Minute, "CoreDNS", 1, "-n", "kube-system", "-l", "k8s-app=kube-dns")
}
