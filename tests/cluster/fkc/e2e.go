package main

// e2e: the upstream suites, unchanged, on the running cluster — Kubernetes' own e2e.test
// (built from the pinned k8s.io/kubernetes) with the ginkgo CLI for parallel runs, and
// network-policy-api's conformance suite with go test. Reports go to target/cluster/e2e/
// (JUnit, written even when a run is cut short); the last line is
// "N passed, N failed, N skipped", every skip listed with its reason.

import (
	"encoding/xml"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"
)

// An e2e suite: what it focuses on, what it skips and why.
type e2eSuite struct {
	Name  string
	Focus string
	Skip  []e2eSkip
	Procs int
	// Timeout is ginkgo's for the whole run.
	Timeout time.Duration
}

type e2eSkip struct {
	Regex  string
	Reason string
	// When decides whether the skip applies on this machine (nil: always).
	When func() bool
}

var noSCTP = e2eSkip{
	Regex:  `SCTPConnectivity`,
	Reason: "SCTP is not in this kernel: socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) fails with EPROTONOSUPPORT",
	When:   func() bool { return !kernelHasSCTP() },
}

func e2eSuites() map[string]e2eSuite {
	return map[string]e2eSuite{
		// Every Netpol spec but the two API ones (--suite api), TCP and UDP.
		"netpol": {Name: "netpol", Focus: `\[sig-network\] Netpol `, Skip: []e2eSkip{noSCTP, {Regex: `Netpol API`, Reason: "the API specs are --suite api"}}, Procs: 4, Timeout: 90 * time.Minute},
		"api":    {Name: "api", Focus: `\[sig-network\] (Netpol API|NetworkPolicy API)`, Procs: 1, Timeout: 20 * time.Minute},
		"conformance": {Name: "conformance", Focus: `\[sig-network\].*\[Conformance\]`, Skip: []e2eSkip{noSCTP}, Procs: 3,
			Timeout: 120 * time.Minute},
	}
}

// kernelHasSCTP says whether this kernel has SCTP sockets.
func kernelHasSCTP() bool {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 132)
	if err != nil {
		return false
	}
	_ = syscall.Close(fd)
	return true
}

func cmdE2E(args []string) error {
	fs := flag.NewFlagSet("e2e", flag.ContinueOnError)
	suite := fs.String("suite", "netpol", "netpol, api, conformance, network-policy-api, cases or all")
	focus := fs.String("focus", "", "only the specs of the suite that also match this regular expression")
	procs := fs.Int("procs", 0, "parallel ginkgo processes (default: the suite's)")
	if err := fs.Parse(args); err != nil {
		return exitCode(2)
	}
	c, err := loadCluster()
	if err != nil {
		return err
	}
	if !c.st.Ready {
		return fmt.Errorf("the cluster never finished coming up")
	}
	var names []string
	if *suite == "all" {
		names = []string{"api", "netpol", "conformance", npapiSuite, casesSuite}
	} else if _, ok := e2eSuites()[*suite]; ok || *suite == npapiSuite || *suite == casesSuite {
		names = []string{*suite}
	} else {
		return fmt.Errorf("--suite must be netpol, api, conformance, %s, %s or all, not %q", npapiSuite, casesSuite, *suite)
	}
	// flock's own cases need only agnhost, which every node has (its sandbox image).
	if len(names) > 1 || names[0] != casesSuite {
		if err := c.l.lock("e2e build"); err != nil {
			return err
		}
		if err := c.l.build("cluster", "e2e"); err != nil {
			return err
		}
		tars, err := c.l.buildE2EImages()
		if err != nil {
			return err
		}
		for _, n := range c.plan.Nodes {
			for _, t := range tars {
				if err := c.importTar(n, t); err != nil {
					return err
				}
			}
		}
		progress("e2e: %d images imported into every node", len(tars))
	}
	out := filepath.Join(c.l.Target, "e2e")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	total := e2eCounts{}
	for _, name := range names {
		if name == casesSuite {
			r, err := c.runCases(*focus, out)
			if err != nil {
				return err
			}
			total.add(r)
			continue
		}
		if name == npapiSuite {
			r, err := c.runNetworkPolicyAPI(*focus)
			if err != nil {
				return err
			}
			total.add(r)
			continue
		}
		s := e2eSuites()[name]
		if *procs > 0 {
			s.Procs = *procs
		}
		r, err := c.runE2E(s, *focus, out)
		if err != nil {
			return err
		}
		total.add(r)
	}
	for _, sk := range total.Skipped {
		fmt.Printf("skipped: %s — %s\n", sk.Name, sk.Reason)
	}
	for _, f := range total.Failed {
		fmt.Printf("failed: %s\n", f)
	}
	fmt.Printf("%d passed, %d failed, %d skipped\n", total.Passed, len(total.Failed), len(total.Skipped))
	if len(total.Failed) > 0 || total.Passed == 0 {
		return exitCode(1)
	}
	return nil
}

type e2eCounts struct {
	Passed  int
	Failed  []string
	Skipped []skippedSpec
}

type skippedSpec struct{ Name, Reason string }

func (c *e2eCounts) add(o e2eCounts) {
	c.Passed += o.Passed
	c.Failed = append(c.Failed, o.Failed...)
	c.Skipped = append(c.Skipped, o.Skipped...)
}

// runE2E runs one suite with the ginkgo CLI and reads its JUnit report.
func (c *cluster) runE2E(s e2eSuite, focus, out string) (e2eCounts, error) {
	report := filepath.Join(out, "junit-"+s.Name+".xml")
	_ = os.Remove(report)
	var skips []string
	var reasons []e2eSkip
	for _, sk := range s.Skip {
		if sk.When == nil || sk.When() {
			skips = append(skips, sk.Regex)
			reasons = append(reasons, sk)
		}
	}
	// ginkgo writes --junit-report relative to --output-dir (also when cut short by
	// --timeout or an interrupt).
	args := []string{"run", "-p", fmt.Sprintf("--procs=%d", s.Procs), "--focus=" + s.Focus,
		"--timeout=" + s.Timeout.String(), "--junit-report=" + filepath.Base(report), "--output-dir=" + out,
		"--no-color", "--silence-skips", "--poll-progress-after=300s"}
	if focus != "" {
		args = append(args, "--focus="+focus)
	}
	for _, sk := range skips {
		args = append(args, "--skip="+sk)
	}
	args = append(args, c.l.Bin("e2e.test"), "--",
		"--kubeconfig="+c.l.Kubeconfig(), "--provider=local",
		"--dump-logs-on-failure=false", "--disable-log-dump=true", "--e2e-verify-service-account=false")
	progress("e2e: suite %s (%d procs): ginkgo --focus=%q%s", s.Name, s.Procs, s.Focus, skipList(skips))
	log, err := os.Create(filepath.Join(out, s.Name+".log"))
	if err != nil {
		return e2eCounts{}, err
	}
	defer log.Close()
	cmd := exec.Command(c.l.Bin("ginkgo"), args...)
	cmd.Dir = out
	cmd.Stdout = log
	cmd.Stderr = log
	// The e2e framework's own tools (kubectl) and the conformance env it reads.
	cmd.Env = append(os.Environ(), "PATH="+c.l.Bin("")+":"+os.Getenv("PATH"), "KUBECONFIG="+c.l.Kubeconfig(), "KUBERNETES_CONFORMANCE_TEST=y")
	t := time.Now()
	if err := cmd.Start(); err != nil {
		return e2eCounts{}, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	var runErr error
wait:
	for {
		select {
		case runErr = <-done:
			break wait
		case <-tick.C:
			if interrupted.Load() {
				// ginkgo writes its report when interrupted.
				_ = cmd.Process.Signal(os.Interrupt)
			}
			progress("e2e: %s running for %.0f min", s.Name, time.Since(t).Minutes())
		}
	}
	counts, rerr := readJUnit(report, regexp.MustCompile(s.Focus), reasons)
	if rerr != nil {
		return e2eCounts{}, fmt.Errorf("suite %s: %v (ginkgo: %v; log %s)", s.Name, rerr, runErr, log.Name())
	}
	progress("e2e: suite %s: %d passed, %d failed, %d skipped in %.1f min (report %s)", s.Name, counts.Passed, len(counts.Failed), len(counts.Skipped), time.Since(t).Minutes(), report)
	return counts, nil
}

func skipList(skips []string) string {
	if len(skips) == 0 {
		return ""
	}
	return " --skip=" + strings.Join(skips, " --skip=")
}

type junitSuites struct {
	Suites []struct {
		Cases []junitCase `xml:"testcase"`
	} `xml:"testsuite"`
}

type junitCase struct {
	Name    string `xml:"name,attr"`
	Status  string `xml:"status,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Failure *struct {
		Message string `xml:"message,attr"`
	} `xml:"failure"`
	Error *struct {
		Message string `xml:"message,attr"`
	} `xml:"error"`
}

// readJUnit counts the suite's specs in a ginkgo JUnit report: specs outside the focus
// (reported as skipped by ginkgo) are not counted; a skipped spec of the suite gets the
// reason of the skip that matched it (or ginkgo's message).
func readJUnit(path string, focus *regexp.Regexp, skips []e2eSkip) (e2eCounts, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return e2eCounts{}, err
	}
	var js junitSuites
	if err := xml.Unmarshal(data, &js); err != nil {
		return e2eCounts{}, err
	}
	var c e2eCounts
	for _, s := range js.Suites {
		for _, tc := range s.Cases {
			name := strings.TrimSpace(strings.TrimPrefix(tc.Name, "[It]"))
			if !focus.MatchString(name) {
				continue
			}
			switch {
			case tc.Failure != nil || tc.Error != nil || tc.Status == "failed" || tc.Status == "panicked" || tc.Status == "interrupted" || tc.Status == "timedout":
				c.Failed = append(c.Failed, name)
			case tc.Skipped != nil || tc.Status == "skipped" || tc.Status == "pending":
				reason := ""
				for _, sk := range skips {
					if regexp.MustCompile(sk.Regex).MatchString(name) {
						reason = sk.Reason
					}
				}
				if reason == "" && tc.Skipped != nil {
					reason = tc.Skipped.Message
				}
				if reason == "the API specs are --suite api" {
					continue
				}
				c.Skipped = append(c.Skipped, skippedSpec{Name: name, Reason: reason})
			default:
				c.Passed++
			}
		}
	}
	sort.Strings(c.Failed)
	return c, nil
}

const npapiSuite = "network-policy-api"

// casesSuite is flock's own case corpus (tests/conformance) on the cluster, through
// `flockctl conformance --kubeconfig`: what any operator can run on theirs.
const casesSuite = "cases"

// runCases runs tests/conformance (the cases whose folder matches focus, if given) with the
// flockctl the images were built with; its report is target/cluster/e2e/cases.txt.
func (c *cluster) runCases(focus, out string) (e2eCounts, error) {
	flockctl := filepath.Join(c.l.Target, "images", "out", "flockctl")
	if _, err := os.Stat(flockctl); err != nil {
		return e2eCounts{}, fmt.Errorf("%s is missing (up.sh builds it): %w", flockctl, err)
	}
	dir := filepath.Join(c.l.Repo, "tests", "conformance")
	args := []string{"conformance", "--kubeconfig", c.l.Kubeconfig(), "--image", agnhostImage, "--base", filepath.Join(dir, "base-cluster.yaml")}
	if focus == "" {
		args = append(args, dir)
	} else {
		re, err := regexp.Compile(focus)
		if err != nil {
			return e2eCounts{}, fmt.Errorf("--focus: %w", err)
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return e2eCounts{}, err
		}
		for _, e := range entries {
			if e.IsDir() && re.MatchString(e.Name()) {
				args = append(args, filepath.Join(dir, e.Name()))
			}
		}
		if len(args) == 6 {
			return e2eCounts{}, fmt.Errorf("--focus %q matches no case of %s", focus, dir)
		}
	}
	report := filepath.Join(out, "cases.txt")
	progress("e2e: flock's cases (%s) through flockctl conformance --kubeconfig", dir)
	f, err := os.Create(report)
	if err != nil {
		return e2eCounts{}, err
	}
	defer f.Close()
	cmd := exec.Command(flockctl, args...)
	cmd.Stdout = f
	cmd.Stderr = os.Stderr
	t := time.Now()
	runErr := cmd.Run()
	text, err := os.ReadFile(report)
	if err != nil {
		return e2eCounts{}, err
	}
	counts := readCaseLines(string(text))
	progress("e2e: cases: %d passed, %d failed, %d skipped in %.1f min (report %s; flockctl: %v)",
		counts.Passed, len(counts.Failed), len(counts.Skipped), time.Since(t).Minutes(), report, runErr)
	if counts.Passed+len(counts.Failed) == 0 {
		return counts, fmt.Errorf("flockctl conformance ran no case (%v; report %s)", runErr, report)
	}
	if runErr != nil && len(counts.Failed) == 0 {
		return counts, fmt.Errorf("flockctl conformance: %v (report %s)", runErr, report)
	}
	return counts, nil
}

// readCaseLines counts flockctl conformance's `PASS|FAIL|SKIP <case> (why)` lines.
func readCaseLines(text string) e2eCounts {
	var c e2eCounts
	re := regexp.MustCompile(`^(PASS|FAIL|SKIP) (\S+)(?: \((.*)\))?$`)
	for _, line := range strings.Split(text, "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		switch m[1] {
		case "PASS":
			c.Passed++
		case "FAIL":
			c.Failed = append(c.Failed, m[2]+": "+m[3])
		case "SKIP":
			c.Skipped = append(c.Skipped, skippedSpec{Name: m[2], Reason: m[3]})
		}
	}
	return c
}

// runNetworkPolicyAPI runs network-policy-api's conformance suite (the ClusterNetworkPolicy
// profile with its experimental features) as its CI does, writing the upstream report to
// docs/conformance/network-policy-api-report.yaml.
func (c *cluster) runNetworkPolicyAPI(focus string) (e2eCounts, error) {
	if len(c.plan.Nodes) < 2 {
		return e2eCounts{}, fmt.Errorf("network-policy-api's suite needs two schedulable nodes (its hostNetwork StatefulSet)")
	}
	out := filepath.Join(c.l.Target, "e2e")
	report := filepath.Join(c.l.Repo, "docs", "conformance", "network-policy-api-report.yaml")
	if err := os.MkdirAll(filepath.Dir(report), 0o755); err != nil {
		return e2eCounts{}, err
	}
	info := fmt.Sprintf("tests/cluster/e2e.sh --suite %s on a %d-node %s cluster of Kubernetes %s (kube-proxy nftables, containerd %s) built on one machine (docs/cluster.md); kernel %s%s",
		npapiSuite, len(c.plan.Nodes), c.plan.Family, kubernetesVersion, containerdVersion, kernelRelease(), sctpNote())
	run := "TestConformanceProfiles"
	if focus != "" {
		run += "/" + focus
	}
	args := []string{"-test.run", run, "-test.v", "-test.timeout", "90m",
		"--conformance-profiles=ClusterNetworkPolicy", "--all-features",
		"--organization=flock-cni", "--project=flock", "--url=https://github.com/flock-cni/flock",
		"--version=" + flockVersion(c.l), "--contact=https://github.com/flock-cni/flock/issues",
		"--additional-info=" + info, "--report-output=" + report}
	progress("e2e: network-policy-api %s conformance (ClusterNetworkPolicy profile, all features)", networkPolicyAPIVersion)
	logPath := filepath.Join(out, npapiSuite+".log")
	log, err := os.Create(logPath)
	if err != nil {
		return e2eCounts{}, err
	}
	defer log.Close()
	cmd := exec.Command(c.l.Bin("npapi-conformance.test"), args...)
	cmd.Dir = out
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.l.Kubeconfig())
	t := time.Now()
	runErr := cmd.Run()
	text, err := os.ReadFile(logPath)
	if err != nil {
		return e2eCounts{}, err
	}
	counts := readGoTestV(string(text))
	for i, sk := range counts.Skipped {
		if strings.Contains(sk.Name, "SCTP") && !kernelHasSCTP() {
			counts.Skipped[i].Reason = "SCTP is not in this kernel"
		}
	}
	progress("e2e: network-policy-api: %d passed, %d failed, %d skipped in %.1f min (report %s; go test: %v)",
		counts.Passed, len(counts.Failed), len(counts.Skipped), time.Since(t).Minutes(), report, runErr)
	if counts.Passed+len(counts.Failed) == 0 {
		return counts, fmt.Errorf("network-policy-api's suite ran no test (%v; log %s)", runErr, logPath)
	}
	return counts, nil
}

// readGoTestV counts the leaf tests of `go test -v` output ("--- PASS: A/B/C (1.2s)"): a
// test with subtests counts through them.
func readGoTestV(text string) e2eCounts {
	type result struct{ status, name string }
	var results []result
	re := regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (\S+)`)
	for _, line := range strings.Split(text, "\n") {
		if m := re.FindStringSubmatch(line); m != nil {
			results = append(results, result{m[1], m[2]})
		}
	}
	var c e2eCounts
	for _, r := range results {
		parent := false
		for _, o := range results {
			if strings.HasPrefix(o.name, r.name+"/") {
				parent = true
				break
			}
		}
		if parent {
			continue
		}
		switch r.status {
		case "PASS":
			c.Passed++
		case "FAIL":
			c.Failed = append(c.Failed, r.name)
		case "SKIP":
			c.Skipped = append(c.Skipped, skippedSpec{Name: r.name, Reason: "skipped by the suite"})
		}
	}
	sort.Strings(c.Failed)
	return c
}

func kernelRelease() string {
	data, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(data))
}

func sctpNote() string {
	if kernelHasSCTP() {
		return ""
	}
	return "; this kernel has no SCTP: the suite's agnhost:2.45 image is this release's agnhost (" + agnhostVersion +
		") behind an entrypoint that drops only porter's SERVE_SCTP_PORT_* variables, so its pods start; the SCTP tests fail as they must"
}

// flockVersion is the crate's version and the checkout's commit.
func flockVersion(l *layout) string {
	v := "0.0.0"
	if data, err := os.ReadFile(filepath.Join(l.Repo, "Cargo.toml")); err == nil {
		if m := regexp.MustCompile(`(?m)^version = "([^"]+)"`).FindSubmatch(data); m != nil {
			v = string(m[1])
		}
	}
	if commit, err := output("git", "-C", l.Repo, "rev-parse", "--short", "HEAD"); err == nil {
		v += "+" + strings.TrimSpace(commit)
	}
	return v
}
