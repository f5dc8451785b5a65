package main

// bench: what the real cluster costs, as JSON — build and up times, pod creation to Ready
// for many pods under flock and under the ptp baseline (what policy-before-first-packet
// costs under a real kubelet), and the resident memory of the agent, the API server and
// etcd at rest.

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

func cmdBench(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	pods := fs.Int("pods", 100, "pods created at once, per CNI")
	here := fs.Bool("here", false, "measure the running cluster only (no up/down)")
	family := fs.String("family", "ipv4", "the clusters' family")
	if err := fs.Parse(args); err != nil {
		return exitCode(2)
	}
	if *here {
		c, err := loadCluster()
		if err != nil {
			return err
		}
		r, err := c.benchPods(*pods)
		if err != nil {
			return err
		}
		return printJSON(r)
	}
	l, err := newLayout()
	if err != nil {
		return err
	}
	if _, err := os.Stat(statePath(l)); err == nil {
		return fmt.Errorf("a cluster is running: bench starts its own (or use --here)")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	report := map[string]any{"machine": machine(), "pods": *pods, "family": *family}
	// The build, warm (the cache is there, as after the first build); the cold build's
	// time is what the stamps recorded when the cache was filled.
	t := time.Now()
	if err := runSelf(self, "build"); err != nil {
		return err
	}
	report["build_warm_s"] = round1(time.Since(t).Seconds())
	report["build_cold_s"] = round1(l.coldBuildSeconds())
	per := map[string]any{}
	for _, cni := range []string{"flock", "ptp"} {
		t := time.Now()
		if err := runSelf(self, "up", "--cni", cni, "--family", *family); err != nil {
			return err
		}
		upS := time.Since(t).Seconds()
		c, err := loadCluster()
		if err != nil {
			return err
		}
		r, berr := c.benchPods(*pods)
		if berr == nil {
			r["up_s"] = round1(upS)
			per[cni] = r
		}
		if err := runSelf(self, "down"); err != nil {
			return err
		}
		if berr != nil {
			return berr
		}
	}
	report["clusters"] = per
	f, p := per["flock"].(map[string]any), per["ptp"].(map[string]any)
	report["ready_p50_ratio"] = round2(f["ready_p50_ms"].(float64) / p["ready_p50_ms"].(float64))
	report["ready_p99_ratio"] = round2(f["ready_p99_ms"].(float64) / p["ready_p99_ms"].(float64))
	return printJSON(report)
}

func runSelf(self string, args ...string) error {
	cmd := execCommand(self, args...)
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	return cmd.Run()
}

func printJSON(v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	fmt.Println(string(data))
	return nil
}

func round1(f float64) float64 { return math.Round(f*10) / 10 }
func round2(f float64) float64 { return math.Round(f*100) / 100 }

// coldBuildSeconds sums the build times the stamps recorded.
func (l *layout) coldBuildSeconds() float64 {
	total := 0.0
	for _, b := range binaries() {
		data, err := os.ReadFile(l.stampPath(b.Name))
		if err != nil {
			continue
		}
		var s stamp
		if json.Unmarshal(data, &s) == nil && b.Set == "cluster" {
			total += s.Seconds
		}
	}
	return total
}

func machine() map[string]any {
	m := map[string]any{"cpus": numCPU()}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m["kernel"] = strings.TrimSpace(string(data))
	}
	if data, err := os.ReadFile("/etc/debian_version"); err == nil {
		m["debian"] = strings.TrimSpace(string(data))
	}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "model name") {
				m["cpu"] = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	return m
}

// apiClient talks to the API server directly (the admin's certificate): for timings
// kubectl's process start would blur.
type apiClient struct {
	base string
	http *http.Client
}

func (c *cluster) api() (*apiClient, error) {
	ca, err := os.ReadFile(c.pk.path("ca.crt"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair(c.pk.path("admin.crt"), c.pk.path("admin.key"))
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}, MaxIdleConnsPerHost: 16}
	return &apiClient{base: c.plan.apiURL(), http: &http.Client{Transport: tr}}, nil
}

func (a *apiClient) do(method, path string, body []byte) ([]byte, error) {
	req, err := http.NewRequest(method, a.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		return nil, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, shorten(string(data), 300))
	}
	return data, nil
}

// watchReady sends every pod of ns that is Ready (from a list, then a watch from its
// resourceVersion) until stop is closed. A watch the API server ends (its timeout, a
// restart) is resumed from the last resourceVersion seen, and relisted when that is gone
// (410); it returns an error only after five failed attempts in a row, with the last one.
func (a *apiClient) watchReady(ns string, ready chan<- readyEvent, stop <-chan struct{}) error {
	rv := ""
	failures := 0
	var last error
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		if failures >= 5 {
			return fmt.Errorf("%d attempts in a row failed, the last: %w", failures, last)
		}
		if failures > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		if rv == "" {
			data, err := a.do("GET", "/api/v1/namespaces/"+ns+"/pods", nil)
			if err != nil {
				failures, last = failures+1, err
				continue
			}
			var list struct {
				Metadata struct {
					ResourceVersion string `json:"resourceVersion"`
				} `json:"metadata"`
				Items []pod `json:"items"`
			}
			if err := json.Unmarshal(data, &list); err != nil {
				failures, last = failures+1, fmt.Errorf("the pod list: %w", err)
				continue
			}
			for _, p := range list.Items {
				if p.ready() {
					ready <- readyEvent{name: p.Metadata.Name, at: time.Now()}
				}
			}
			rv = list.Metadata.ResourceVersion
		}
		req, err := http.NewRequest("GET", a.base+"/api/v1/namespaces/"+ns+"/pods?watch=1&allowWatchBookmarks=true&resourceVersion="+rv, nil)
		if err != nil {
			return err
		}
		resp, err := a.http.Do(req)
		if err != nil {
			failures, last = failures+1, err
			continue
		}
		if resp.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			failures, last = failures+1, fmt.Errorf("watch: %s: %s", resp.Status, shorten(string(body), 300))
			continue
		}
		dec := json.NewDecoder(bufio.NewReader(resp.Body))
		for {
			var ev struct {
				Type   string `json:"type"`
				Object pod    `json:"object"`
			}
			if err := dec.Decode(&ev); err != nil {
				if err != io.EOF {
					failures, last = failures+1, fmt.Errorf("watch: %w", err)
				}
				break
			}
			failures = 0
			if ev.Type == "ERROR" {
				// Most often 410 Gone: the resourceVersion is too old; relist.
				rv = ""
				last = fmt.Errorf("watch: an ERROR event")
				break
			}
			if v := ev.Object.Metadata.ResourceVersion; v != "" {
				rv = v
			}
			if ev.Type != "BOOKMARK" && ev.Object.ready() {
				ready <- readyEvent{name: ev.Object.Metadata.Name, at: time.Now()}
			}
		}
		resp.Body.Close()
	}
}

// benchPods creates n pods at once (spread over the nodes) and times each from its
// creation request to the moment a watch reports it Ready; then the memory at rest.
func (c *cluster) benchPods(n int) (map[string]any, error) {
	a, err := c.api()
	if err != nil {
		return nil, err
	}
	ns := "fkc-bench"
	_, _ = c.k.run("", "delete", "namespace", ns, "--ignore-not-found", "--wait=true", "--timeout=180s")
	if _, err := a.do("POST", "/api/v1/namespaces", []byte(fmt.Sprintf(`{"apiVersion":"v1","kind":"Namespace","metadata":{"name":%q}}`, ns))); err != nil {
		return nil, err
	}
	defer func() { _, _ = c.k.run("", "delete", "namespace", ns, "--wait=true", "--timeout=300s") }()
	// The service account controller has to make the namespace's default account first.
	if err := waitFor(30*time.Second, "the default service account", func() error {
		_, err := a.do("GET", "/api/v1/namespaces/"+ns+"/serviceaccounts/default", nil)
		return err
	}); err != nil {
		return nil, err
	}

	// Watch first, so that no transition is missed.
	ready := make(chan readyEvent, n*4)
	stop := make(chan struct{})
	defer close(stop)
	watchErr := make(chan error, 1)
	go func() { watchErr <- a.watchReady(ns, ready, stop) }()

	created := map[string]time.Time{}
	errs := make(chan error, n)
	type createdAt struct {
		name string
		at   time.Time
	}
	done := make(chan createdAt, n)
	for i := range n {
		node := c.plan.Nodes[i%len(c.plan.Nodes)].Name
		name := fmt.Sprintf("bench-%03d", i)
		body := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":%q,"labels":{"app":"bench"}},"spec":{"nodeName":%q,"terminationGracePeriodSeconds":0,"containers":[{"name":"c","image":%q,"args":["pause"],"resources":{"requests":{"cpu":"1m","memory":"4Mi"}}}]}}`, name, node, agnhostImage)
		go func() {
			at := time.Now()
			if _, err := a.do("POST", "/api/v1/namespaces/"+ns+"/pods", []byte(body)); err != nil {
				errs <- err
				return
			}
			done <- createdAt{name, at}
		}()
	}
	for range n {
		select {
		case e := <-errs:
			return nil, e
		case d := <-done:
			created[d.name] = d.at
		}
	}
	var lat []float64
	seen := map[string]bool{}
	deadline := time.After(10 * time.Minute)
	for len(seen) < n {
		select {
		case err := <-watchErr:
			return nil, fmt.Errorf("watching the pods, with %d of %d Ready: %w", len(seen), n, err)
		case ev := <-ready:
			if seen[ev.name] || created[ev.name].IsZero() {
				continue
			}
			seen[ev.name] = true
			lat = append(lat, float64(ev.at.Sub(created[ev.name]).Microseconds())/1000)
		case <-deadline:
			return nil, fmt.Errorf("%d of %d pods Ready after 10 minutes", len(seen), n)
		}
	}
	sort.Float64s(lat)
	r := map[string]any{
		"cni":          c.plan.CNI,
		"ready_p50_ms": round1(percentile(lat, 50)),
		"ready_p99_ms": round1(percentile(lat, 99)),
		"ready_max_ms": round1(lat[len(lat)-1]),
	}
	if c.plan.CNI == "flock" {
		// How long after a policy write (kubectl apply returning) the first probe sees it,
		// and after its deletion: the smoke's probe loop, many times.
		s := &smoke{c: c, k: c.k, pods: map[string]smokePod{}}
		if err := s.setup(); err != nil {
			return nil, err
		}
		deny, restore, err := s.policyLatencies(20)
		s.teardown()
		if err != nil {
			return nil, err
		}
		r["policy_to_denied_p50_ms"], r["policy_to_denied_max_ms"] = round1(percentile(deny, 50)), round1(deny[len(deny)-1])
		r["deletion_to_allowed_p50_ms"], r["deletion_to_allowed_max_ms"] = round1(percentile(restore, 50)), round1(restore[len(restore)-1])
		r["policy_trials"] = len(deny)
	}
	// Memory at rest: a few seconds after the pods settled.
	time.Sleep(10 * time.Second)
	for k, v := range c.rssAtRest() {
		r[k] = v
	}
	return r, nil
}

type readyEvent struct {
	name string
	at   time.Time
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	if i < 0 {
		i = 0
	}
	return sorted[i]
}

// rssAtRest reads the resident memory of the API server, etcd and every flock-agent (found
// by its command name among the cluster's own processes, under fkc's cgroup).
func (c *cluster) rssAtRest() map[string]any {
	out := map[string]any{}
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if p, ok := c.st.Processes[name]; ok && alive(p) {
			out[strings.ReplaceAll(name, "-", "_")+"_rss_mb"] = round1(rssMB(p.Pid))
		}
	}
	dir, err := pidsDir(c.st.CgroupBase)
	if err != nil {
		return out
	}
	var agents []float64
	for _, pid := range cgroupPids(dir) {
		comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		if err == nil && strings.TrimSpace(string(comm)) == "flock-agent" {
			agents = append(agents, round1(rssMB(pid)))
		}
	}
	if len(agents) > 0 {
		sort.Float64s(agents)
		out["flock_agent_rss_mb"] = agents
	}
	return out
}

func rssMB(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			kb, _ := strconv.ParseFloat(f[0], 64)
			return kb / 1024
		}
	}
	return 0
}

// policyLatencies writes and deletes a deny policy n times with a probe loop running (in
// the pod's network namespace: every ~60 ms) and returns, sorted, how long after each write
// the first denied probe started and after each deletion the first admitted one (ms).
func (s *smoke) policyLatencies(n int) ([]float64, []float64, error) {
	pr, err := s.startNetnsProber("cli-1", hostPort(s.ip("srv-2"), 8080), time.Duration(n)*8*time.Second+30*time.Second)
	if err != nil {
		return nil, nil, err
	}
	defer pr.stop()
	if err := pr.waitFor(true, time.Now(), 20*time.Second); err != nil {
		return nil, nil, err
	}
	var deny, restore []float64
	for range n {
		applied := time.Now()
		if err := s.applyPolicy(policy("bench-deny", "  podSelector: {matchLabels: {inst: \"2\"}}\n  policyTypes: [Ingress]\n")); err != nil {
			return nil, nil, err
		}
		at, err := pr.firstAfter(false, applied, 10*time.Second)
		if err != nil {
			return nil, nil, err
		}
		deny = append(deny, float64(at.Sub(applied).Microseconds())/1000)
		time.Sleep(time.Second)
		deleted := time.Now()
		if _, err := s.k.run("", "delete", "networkpolicy", "-n", smokeNS, "bench-deny"); err != nil {
			return nil, nil, err
		}
		at, err = pr.firstAfter(true, deleted, 10*time.Second)
		if err != nil {
			return nil, nil, err
		}
		restore = append(restore, float64(at.Sub(deleted).Microseconds())/1000)
		time.Sleep(time.Second)
	}
	sort.Float64s(deny)
	sort.Float64s(restore)
	return deny, restore, nil
}
