package main

import (
	"archive/tar"
	"encoding/json"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestPlanAddressesAreInTheAllowedRanges(t *testing.T) {
	for _, fam := range []string{"ipv4", "ipv6", "dual"} {
		p, err := planCluster(3, fam, "flock")
		if err != nil {
			t.Fatal(err)
		}
		if err := p.check(); err != nil {
			t.Fatalf("%s: %v", fam, err)
		}
		if len(p.Nodes) != 3 || p.Nodes[1].Name != "node-2" || p.Nodes[1].NetNS != "fkc-node-2" {
			t.Fatalf("%s: nodes %+v", fam, p.Nodes)
		}
		for _, a := range append(append([]netip.Addr{}, p.APIAddrs...), p.KubernetesIP, p.DNSIP) {
			if !allowed(a) {
				t.Fatalf("%s: %s not allowed", fam, a)
			}
		}
	}
	p, _ := planCluster(2, "ipv4", "flock")
	if got := p.Nodes[1].IPs[0].String(); got != "198.18.0.2" {
		t.Fatalf("node-2 is %s", got)
	}
	if got := p.Nodes[1].PodCIDRs[0].String(); got != "198.18.2.0/24" {
		t.Fatalf("node-2's pod CIDR is %s", got)
	}
	if p.KubernetesIP.String() != "198.19.255.1" || p.DNSIP.String() != "198.19.255.10" {
		t.Fatalf("service IPs %s %s", p.KubernetesIP, p.DNSIP)
	}
	p6, _ := planCluster(2, "ipv6", "flock")
	if got := p6.Nodes[1].IPs[0].String() + " " + p6.Nodes[1].PodCIDRs[0].String(); got != "2001:db8::2 2001:db8:2::/64" {
		t.Fatalf("node-2 (v6) is %s", got)
	}
	if p6.DNSIP.String() != "2001:db8:ffff::a" || p6.apiURL() != "https://[2001:db8::fe]:6443" {
		t.Fatalf("v6 service %s, api %s", p6.DNSIP, p6.apiURL())
	}
	d, _ := planCluster(2, "dual", "ptp")
	if len(d.Nodes[0].IPs) != 2 || len(d.ServiceCIDRs) != 2 || !d.hasV4() || !d.hasV6() {
		t.Fatalf("dual plan %+v", d)
	}
}

func TestPlanRefusesBadFlags(t *testing.T) {
	for _, c := range []struct {
		n      int
		family string
		cni    string
	}{{0, "ipv4", "flock"}, {51, "ipv4", "flock"}, {2, "ipv5", "flock"}, {2, "ipv4", "calico"}} {
		if _, err := planCluster(c.n, c.family, c.cni); err == nil {
			t.Fatalf("%+v accepted", c)
		}
	}
	p, _ := planCluster(2, "ipv4", "flock")
	p.APIAddrs[0] = netip.MustParseAddr("10.0.0.1")
	if err := p.check(); err == nil || !strings.Contains(err.Error(), "10.0.0.1") {
		t.Fatalf("a 10/8 API address passed the check: %v", err)
	}
	p, _ = planCluster(2, "ipv4", "flock")
	p.ServiceCIDRs[0] = netip.MustParsePrefix("198.18.1.0/24")
	if err := p.check(); err == nil || !strings.Contains(err.Error(), "overlap") {
		t.Fatalf("overlapping ranges passed the check: %v", err)
	}
}

func TestCgroupBaseNestsUnderEveryOwnCgroup(t *testing.T) {
	base, err := cgroupBase(map[string]string{"cpu": "/", "memory": "/process_api/abc", "pids": "/", "": "/"})
	if err != nil || base != "/process_api/abc/fkc" {
		t.Fatalf("base %q, %v", base, err)
	}
	base, err = cgroupBase(map[string]string{"cpu": "/a", "memory": "/a/b"})
	if err != nil || base != "/a/b/fkc" {
		t.Fatalf("base %q, %v", base, err)
	}
	if _, err := cgroupBase(map[string]string{"cpu": "/a", "memory": "/b/c"}); err == nil {
		t.Fatal("cgroups with no common descendant were accepted")
	}
	if !isAncestor("/", "/x") || !isAncestor("/a", "/a/b") || isAncestor("/a", "/ab") {
		t.Fatal("isAncestor")
	}
}

// The repository's Dockerfile is what the cluster's images are built from: every
// instruction of the stages used must be understood.
func TestTheRepositorysDockerfileIsUnderstood(t *testing.T) {
	text, err := os.ReadFile("../../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	stages, err := parseDockerfile(string(text))
	if err != nil {
		t.Fatal(err)
	}
	build, err := findStage(stages, "build")
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := buildCommands(build)
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != 1 || !strings.Contains(cmds[0], "cargo build --release --locked") || !strings.Contains(cmds[0], " /out") {
		t.Fatalf("build commands %q", cmds)
	}
	agent, err := findStage(stages, "agent")
	if err != nil {
		t.Fatal(err)
	}
	plan, err := planImage(agent)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Root.Suite != "bookworm" || !plan.Root.Slim || strings.Join(plan.Root.Packages, " ") != "nftables iproute2" {
		t.Fatalf("agent root %+v", plan.Root)
	}
	var paths []string
	for _, c := range plan.Copies {
		paths = append(paths, c.Path+"<"+c.Source+c.Link)
	}
	want := "/usr/local/bin/flock-agent<flock-agent /usr/local/bin/flock-cni<flock-cni /usr/local/bin/flockctl<flockctl /usr/local/bin/flock-socket-keeper<flock-socket-keeper /usr/local/bin/kubectl-flock<flockctl"
	if strings.Join(paths, " ") != want {
		t.Fatalf("agent files\n%s\nwant\n%s", strings.Join(paths, " "), want)
	}
	if strings.Join(plan.Config.Entrypoint, " ") != "/usr/local/bin/flock-agent" || !contains(plan.Config.Env, "GLIBC_TUNABLES=glibc.malloc.mxfast=0") {
		t.Fatalf("agent config %+v", plan.Config)
	}
	ctl, err := findStage(stages, "controller")
	if err != nil {
		t.Fatal(err)
	}
	cplan, err := planImage(ctl)
	if err != nil {
		t.Fatal(err)
	}
	if cplan.Config.User != "65532:65532" || len(cplan.Root.Packages) != 0 {
		t.Fatalf("controller plan %+v", cplan)
	}
}

func TestAnUnknownDockerfileInstructionFailsByName(t *testing.T) {
	stages, err := parseDockerfile("FROM debian:12.11-slim AS agent\nHEALTHCHECK CMD true\n")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := planImage(&stages[0]); err == nil || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), "HEALTHCHECK") {
		t.Fatalf("got %v", err)
	}
	stages, _ = parseDockerfile("FROM debian:12-slim AS agent\nRUN curl http://example | sh\n")
	if _, err := planImage(&stages[0]); err == nil || !strings.Contains(err.Error(), "curl") {
		t.Fatalf("got %v", err)
	}
	stages, _ = parseDockerfile("FROM alpine:3 AS agent\n")
	if _, err := planImage(&stages[0]); err == nil {
		t.Fatal("an alpine base was accepted")
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// An image written here reads back as a docker-archive: the manifest names the tag, the
// config's diff_ids are the layers' digests, the layer holds the files.
func TestWriteImageIsADockerArchive(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tool")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(dir, "layer.tar")
	if err := layerTar(layer, []imageFile{{Path: "/usr/local/bin/tool", Source: bin, Mode: 0o755}, {Path: "/usr/local/bin/alias", Link: "tool"}}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "image.tar")
	if err := writeImage(out, []string{"example.test/tool:dev-1"}, []string{layer}, imageConfig{Entrypoint: []string{"/usr/local/bin/tool"}}); err != nil {
		t.Fatal(err)
	}
	files := readTar(t, out)
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil {
		t.Fatal(err)
	}
	if len(manifest) != 1 || manifest[0].RepoTags[0] != "example.test/tool:dev-1" || len(manifest[0].Layers) != 1 {
		t.Fatalf("manifest %+v", manifest)
	}
	var config struct {
		Rootfs struct {
			DiffIDs []string `json:"diff_ids"`
		}
		Config imageConfig
	}
	if err := json.Unmarshal(files[manifest[0].Config], &config); err != nil {
		t.Fatal(err)
	}
	sum, _, _ := fileDigest(layer)
	if config.Rootfs.DiffIDs[0] != "sha256:"+sum || manifest[0].Layers[0] != sum+".tar" {
		t.Fatalf("diff id %v, layer %v, digest %s", config.Rootfs.DiffIDs, manifest[0].Layers, sum)
	}
	inner := readTarBytes(t, files[manifest[0].Layers[0]])
	if string(inner["usr/local/bin/tool"]) != "#!/bin/sh\n" {
		t.Fatalf("layer files %v", keys(inner))
	}
	if _, ok := inner["usr/local/bin/"]; !ok {
		t.Fatalf("parent directories missing: %v", keys(inner))
	}
	// The same files give the same layer.
	again := filepath.Join(dir, "again.tar")
	_ = layerTar(again, []imageFile{{Path: "/usr/local/bin/alias", Link: "tool"}, {Path: "/usr/local/bin/tool", Source: bin, Mode: 0o755}})
	if sum2, _, _ := fileDigest(again); sum2 != sum {
		t.Fatal("the layer is not reproducible")
	}
}

func readTar(t *testing.T, path string) map[string][]byte {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return readTarBytes(t, data)
}

func readTarBytes(t *testing.T, data []byte) map[string][]byte {
	out := map[string][]byte{}
	tr := tar.NewReader(strings.NewReader(string(data)))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		out[h.Name] = b
	}
}

func keys(m map[string][]byte) []string {
	var k []string
	for x := range m {
		k = append(k, x)
	}
	return k
}

// The versions fkc reports are the ones the modules pin.
func TestPinsMatchTheModules(t *testing.T) {
	for mod, want := range map[string]string{
		"kubernetes":         "k8s.io/kubernetes " + kubernetesVersion,
		"etcd":               "go.etcd.io/etcd/server/v3 " + etcdVersion,
		"containerd":         "github.com/containerd/containerd/v2 " + containerdVersion,
		"crictl":             "sigs.k8s.io/cri-tools " + crictlVersion,
		"coredns":            "github.com/coredns/coredns " + corednsVersion,
		"cni-plugins":        "github.com/containernetworking/plugins " + cniPluginsVersion,
		"network-policy-api": "sigs.k8s.io/network-policy-api " + networkPolicyAPIVersion,
	} {
		data, err := os.ReadFile(filepath.Join("../modules", mod, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^\s*(require\s+)?` + regexp.QuoteMeta(want) + `\b`).Match(data) {
			t.Errorf("modules/%s/go.mod does not require %s", mod, want)
		}
	}
	data, err := os.ReadFile("../modules/kubernetes/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	// Every staging module is replaced by its tag of the same release.
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, "=>") && !strings.HasSuffix(strings.TrimSpace(line), " v0.37.2") {
			t.Errorf("replace not at v0.37.2: %s", line)
		}
	}
	if _, err := pinsHash("../modules"); err != nil {
		t.Fatal(err)
	}
}

func TestConfigsNameThePlansAddresses(t *testing.T) {
	p, _ := planCluster(2, "ipv6", "flock")
	pk := &pki{Dir: "/pki"}
	n := p.Nodes[1]
	kc := kubeletConfig(p, n, pk, "/a/fkc/node-2", "/etc/resolv.conf")
	for _, want := range []string{"failCgroupV1: false", "cgroupDriver: cgroupfs", "cgroupRoot: /a/fkc/node-2", "address: 2001:db8::2", "clusterDNS: [2001:db8:ffff::a]", "imageGCHighThresholdPercent: 100", `nodefs.available: "0%"`} {
		if !strings.Contains(kc, want) {
			t.Errorf("kubelet config lacks %q:\n%s", want, kc)
		}
	}
	kp := kubeProxyConfig(n, "/k")
	for _, want := range []string{"mode: nftables", "hostnameOverride: node-2", "maxPerCore: 0"} {
		if !strings.Contains(kp, want) {
			t.Errorf("kube-proxy config lacks %q", want)
		}
	}
	args := strings.Join(apiserverArgs(p, pk, "/audit"), " ")
	for _, want := range []string{"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction", "--advertise-address=2001:db8::fe", "--service-cluster-ip-range=2001:db8:ffff::/112", "--service-account-issuer="} {
		if !strings.Contains(args, want) {
			t.Errorf("apiserver args lack %q", want)
		}
	}
	cc := containerdConfig("/usr/sbin/runc", agnhostImage, true)
	for _, want := range []string{"SystemdCgroup = false", `sandbox = "registry.k8s.io/e2e-test-images/agnhost:` + agnhostVersion + `"`, `bin_dirs = ["/opt/cni/bin"]`, "restrict_oom_score_adj = true"} {
		if !strings.Contains(cc, want) {
			t.Errorf("containerd config lacks %q", want)
		}
	}
	ptp := ptpConflist(p.Nodes[0])
	var parsed map[string]any
	if err := json.Unmarshal([]byte(ptp), &parsed); err != nil {
		t.Fatalf("ptp conflist is not JSON: %v\n%s", err, ptp)
	}
	if !strings.Contains(ptp, "2001:db8:1::/64") {
		t.Error(ptp)
	}
	if !strings.Contains(resolvConf(p), "nameserver 2001:db8:ffff::a") {
		t.Error(resolvConf(p))
	}
}

func TestSysctlSnapshotRoundTrips(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.txt")
	in := map[string]string{"kernel.panic": "1", "net.ipv4.ip_local_port_range": "32768\t60999"}
	if err := writeSnapshot(path, in); err != nil {
		t.Fatal(err)
	}
	out, err := readSnapshot(path)
	if err != nil {
		t.Fatal(err)
	}
	if out["kernel.panic"] != "1" || normalizeSysctl(out["net.ipv4.ip_local_port_range"]) != "32768 60999" {
		t.Fatalf("%v", out)
	}
}

func TestJUnitCountsOnlyTheSuitesSpecsAndNamesEachSkip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "junit.xml")
	report := `<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="Kubernetes e2e suite" tests="5">
<testcase name="[It] [sig-network] Netpol NetworkPolicy between server and client should support a 'default-deny-ingress' policy [Feature:NetworkPolicy]" status="passed"></testcase>
<testcase name="[It] [sig-network] Netpol NetworkPolicy between server and client should deny egress from all pods [Feature:NetworkPolicy]" status="failed"><failure message="probe x/a -> y/b">boom</failure></testcase>
<testcase name="[It] [sig-network] Netpol [Feature:SCTPConnectivity] [LinuxOnly] NetworkPolicy between server and client using SCTP should enforce policy based on Ports" status="skipped"><skipped message="skipped - filtered by --skip"></skipped></testcase>
<testcase name="[It] [sig-network] Netpol API should support creating NetworkPolicy API operations" status="skipped"><skipped message="filtered"></skipped></testcase>
<testcase name="[It] [sig-storage] something else entirely" status="skipped"><skipped message="filtered"></skipped></testcase>
</testsuite></testsuites>`
	if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	suite := e2eSuites()["netpol"]
	sctp := suite.Skip[0]
	sctp.When = nil
	c, err := readJUnit(path, regexp.MustCompile(suite.Focus), []e2eSkip{sctp, suite.Skip[1]})
	if err != nil {
		t.Fatal(err)
	}
	if c.Passed != 1 || len(c.Failed) != 1 || len(c.Skipped) != 1 {
		t.Fatalf("counts %+v", c)
	}
	if !strings.Contains(c.Skipped[0].Reason, "SCTP is not in this kernel") {
		t.Fatalf("the SCTP skip's reason: %q", c.Skipped[0].Reason)
	}
}

func TestGoTestVCountsLeafTests(t *testing.T) {
	out := `=== RUN   TestConformanceProfiles
=== RUN   TestConformanceProfiles/CNPAdminTierEgressSCTP
=== RUN   TestConformanceProfiles/CNPAdminTierEgressSCTP/Should_support_an_'allow-egress'_policy_for_SCTP_protocol
    --- FAIL: TestConformanceProfiles/CNPAdminTierEgressSCTP/Should_support_an_'allow-egress'_policy_for_SCTP_protocol (10.02s)
    --- PASS: TestConformanceProfiles/CNPAdminTierEgressTCP/one (1.00s)
    --- PASS: TestConformanceProfiles/CNPAdminTierEgressTCP/two (1.00s)
    --- SKIP: TestConformanceProfiles/CNPNamedPorts (0.00s)
  --- FAIL: TestConformanceProfiles/CNPAdminTierEgressSCTP (10.02s)
  --- PASS: TestConformanceProfiles/CNPAdminTierEgressTCP (2.00s)
--- FAIL: TestConformanceProfiles (30.00s)
`
	c := readGoTestV(out)
	if c.Passed != 2 || len(c.Failed) != 1 || len(c.Skipped) != 1 || !strings.Contains(c.Failed[0], "SCTP") {
		t.Fatalf("counts %+v", c)
	}
}

func TestCaseLinesCountEveryVerdict(t *testing.T) {
	out := "PASS 001-deny-all-ingress-in-x\n" +
		"PASS 060-mixed (1 of 3 probes skipped: SCTP not available on the cluster's nodes)\n" +
		"FAIL 002-allow (1 cells differ; step 1 TCP/81 y/a -> x/b: expected to connect, was blocked)\n" +
		"SKIP 301-dns (needs the case's DNS server and records (the cluster's DNS answers for itself))\n" +
		"2 passed, 1 failed, 1 skipped\n"
	c := readCaseLines(out)
	if c.Passed != 2 || len(c.Failed) != 1 || len(c.Skipped) != 1 {
		t.Fatalf("counts %+v", c)
	}
	if !strings.HasPrefix(c.Failed[0], "002-allow: 1 cells differ") || !strings.HasPrefix(c.Skipped[0].Reason, "needs the case's DNS") {
		t.Fatalf("what they say: %+v", c)
	}
}

func TestPreviousChartSplitsCRDsDedupesAndEscapes(t *testing.T) {
	all := "---\napiVersion: v1\nkind: Namespace\nmetadata: {name: flock-system}\n---\n" +
		"apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: runs.flock.dev}\n---\n" +
		"apiVersion: v1\nkind: Namespace\nmetadata: {name: flock-system}\n---\n" +
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {t: \"{{ not a template }}\"}\n"
	docs, crds := splitCRDs(all)
	if strings.Count(docs, "kind: Namespace") != 1 || !strings.Contains(docs, "kind: ConfigMap") || strings.Contains(docs, "CustomResourceDefinition") {
		t.Fatalf("docs: %q", docs)
	}
	if !strings.Contains(crds, "runs.flock.dev") || strings.Contains(crds, "Namespace") {
		t.Fatalf("crds: %q", crds)
	}
	if got := escapeTemplates(`t: "{{ x }}"`); got != "t: \"{{`{{`}} x }}\"" {
		t.Fatalf("escaped: %s", got)
	}
}
