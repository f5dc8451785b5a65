package main

// Configuration files and command lines of the cluster's components, pure: the plan and
// paths in, text out (configs_test.go checks what matters in each).

import (
	"fmt"
	"net/netip"
	"strings"
)

const (
	etcdClientPort = 23790
	etcdPeerPort   = 23800
	apiPort        = 6443
)

func joinAddrs(as []netip.Addr) string {
	var s []string
	for _, a := range as {
		s = append(s, a.String())
	}
	return strings.Join(s, ",")
}

func joinPrefixes(ps []netip.Prefix) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.String())
	}
	return strings.Join(s, ",")
}

// apiURL is the API server's address in the cluster's first family.
func (p *clusterPlan) apiURL() string {
	return "https://" + netip.AddrPortFrom(p.APIAddrs[0], apiPort).String()
}

func kubeconfig(server, caPath, certPath, keyPath, user string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: flock
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: flock
  context: {cluster: flock, user: %s}
current-context: flock
`, server, caPath, user, certPath, keyPath, user)
}

func etcdArgs(dataDir string) []string {
	return []string{
		"--name=fkc-etcd",
		"--data-dir=" + dataDir,
		fmt.Sprintf("--listen-client-urls=http://127.0.0.1:%d", etcdClientPort),
		fmt.Sprintf("--advertise-client-urls=http://127.0.0.1:%d", etcdClientPort),
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", etcdPeerPort),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", etcdPeerPort),
		fmt.Sprintf("--initial-cluster=fkc-etcd=http://127.0.0.1:%d", etcdPeerPort),
		"--listen-metrics-urls=",
		"--log-level=warn",
		// Small and quick: one member on a test machine.
		"--quota-backend-bytes=4294967296",
		"--snapshot-count=10000",
	}
}

func apiserverArgs(p *clusterPlan, pk *pki, auditPolicy string) []string {
	return []string{
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", etcdClientPort),
		"--bind-address=" + p.APIAddrs[0].String(),
		"--advertise-address=" + p.APIAddrs[0].String(),
		fmt.Sprintf("--secure-port=%d", apiPort),
		"--service-cluster-ip-range=" + joinPrefixes(p.ServiceCIDRs),
		"--tls-cert-file=" + pk.path("apiserver.crt"),
		"--tls-private-key-file=" + pk.path("apiserver.key"),
		"--client-ca-file=" + pk.path("ca.crt"),
		"--kubelet-client-certificate=" + pk.path("apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + pk.path("apiserver-kubelet-client.key"),
		"--kubelet-certificate-authority=" + pk.path("ca.crt"),
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--service-account-key-file=" + pk.path("sa.pub"),
		"--service-account-signing-key-file=" + pk.path("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--authorization-mode=Node,RBAC",
		// The default admission plugins, and NodeRestriction: each kubelet may change only
		// its own Node and its pods.
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--profiling=false",
		"--audit-policy-file=" + auditPolicy,
		"--audit-log-path=-",
		"--audit-log-format=json",
		// Watches answered with bookmarks, and compaction after a restart of etcd are what
		// the smoke's 410 check exercises: no special flags, the defaults users get.
		"--v=1",
	}
}

// auditPolicyText logs nothing but what a reader of the fault checks needs: the agents'
// watch and list requests (a relist after 410 shows there).
const auditPolicyText = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: ["system:serviceaccount:flock-system:flock-agent"]
  verbs: ["list", "watch"]
- level: None
`

func controllerManagerArgs(p *clusterPlan, pk *pki, kubeconfigPath string) []string {
	return []string{
		"--kubeconfig=" + kubeconfigPath,
		"--authentication-kubeconfig=" + kubeconfigPath,
		"--authorization-kubeconfig=" + kubeconfigPath,
		"--service-account-private-key-file=" + pk.path("sa.key"),
		"--root-ca-file=" + pk.path("ca.crt"),
		"--cluster-signing-cert-file=" + pk.path("ca.crt"),
		"--cluster-signing-key-file=" + pk.path("ca.key"),
		"--use-service-account-credentials=true",
		"--controllers=*",
		// Nodes get their pod CIDRs from the plan (fkc creates each Node with them), not
		// from node IPAM: its first /24 of 198.18.0.0/16 would be the nodes' own subnet.
		"--allocate-node-cidrs=false",
		"--service-cluster-ip-range=" + joinPrefixes(p.ServiceCIDRs),
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=10257",
		"--v=1",
	}
}

func schedulerArgs(configPath string) []string {
	return []string{"--config=" + configPath, "--bind-address=127.0.0.1", "--secure-port=10259", "--v=1"}
}

func schedulerConfig(kubeconfigPath string) string {
	return fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %s
leaderElection:
  leaderElect: false
`, kubeconfigPath)
}

// nodePaths are the directories of a node's own mount namespace: each bind-mounted from
// the node's root under target/cluster/state onto the path the components expect, so
// nothing is written to the host's copies.
var nodePaths = []string{
	"/var/lib/flock",
	"/run/flock",
	"/opt/cni/bin",
	"/etc/cni/net.d",
	"/var/lib/cni",
	"/var/lib/kubelet",
	"/var/log/pods",
	"/var/log/containers",
	"/run/containerd",
	"/var/lib/containerd",
	"/run/netns",
	"/etc/kubernetes",
}

// containerdConfig is a node's containerd 2.2 configuration (version 3): the cgroupfs
// driver on runc (no systemd here), CNI from the node's own directories, the agnhost image
// as the sandbox image, pinned so that nothing ever garbage-collects it.
//
// restrictOOM is set where this machine withholds CAP_SYS_RESOURCE (a sandboxed VM): then
// no process may lower its oom_score_adj, and runc would fail every container the CRI asks
// for -998 (sandboxes) or -997 (Guaranteed pods); containerd then raises those to its own.
func containerdConfig(runcPath, sandboxImage string, restrictOOM bool) string {
	return fmt.Sprintf(`version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "/run/containerd/containerd.sock"

[ttrpc]
  address = "/run/containerd/containerd.sock.ttrpc"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = %v
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = %q
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "10010"
`, sandboxImage, restrictOOM, runcPath)
}

// kubeletConfig is a node's KubeletConfiguration. cgroup v1 is allowed explicitly
// (failCgroupV1: false); the cgroup root is the node's own, under the cgroup fkc runs in.
func kubeletConfig(p *clusterPlan, n nodePlan, pk *pki, cgroupRoot, resolvConf string) string {
	var dns []string
	dns = append(dns, p.DNSIP.String())
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %s
cgroupsPerQOS: true
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s}
authorization:
  mode: Webhook
tlsCertFile: %s
tlsPrivateKeyFile: %s
rotateCertificates: false
serverTLSBootstrap: false
clusterDomain: cluster.local
clusterDNS: [%s]
resolvConf: %s
failSwapOn: false
# Images are never pulled here (there is no registry): never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# The disk is the host's, shared by every node: no disk-pressure evictions.
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "0%%"
  nodefs.inodesFree: "0%%"
  imagefs.available: "0%%"
  imagefs.inodesFree: "0%%"
serializeImagePulls: false
maxPods: 110
podLogsDir: /var/log/pods
containerLogMaxSize: 10Mi
containerLogMaxFiles: 2
# One OS, many nodes: a kubelet must not set the host's kernel defaults back and forth
# beyond what it always sets (fkc records those and down restores them).
protectKernelDefaults: false
staticPodPath: ""
`, cgroupRoot, n.IPs[0], pk.path("ca.crt"), pk.path(n.Name+"-kubelet-server.crt"), pk.path(n.Name+"-kubelet-server.key"),
		strings.Join(dns, ", "), resolvConf)
}

func kubeletArgs(n nodePlan, configPath, kubeconfigPath string) []string {
	return []string{
		"--config=" + configPath,
		"--kubeconfig=" + kubeconfigPath,
		"--hostname-override=" + n.Name,
		"--node-ip=" + joinAddrs(n.IPs),
		"--v=1",
	}
}

// kubeProxyConfig is a node's kube-proxy in nftables mode. Pod traffic is told from other
// traffic by the node's pod CIDR; conntrack's global limits are left alone (every node
// shares this kernel).
func kubeProxyConfig(n nodePlan, kubeconfigPath string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: %s
hostnameOverride: %s
bindAddress: %s
detectLocalMode: NodeCIDR
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
`, kubeconfigPath, n.Name, n.IPs[0])
}

// ptpConflist is the `--cni ptp` baseline: Debian's reference plugins as a user would
// configure them without flock (a veth per pod, host-local addresses, routes between the
// nodes added by fkc).
func ptpConflist(n nodePlan) string {
	var ranges []string
	for _, c := range n.PodCIDRs {
		ranges = append(ranges, fmt.Sprintf(`[{"subnet": %q}]`, c.String()))
	}
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "ptp",
  "plugins": [
    {"type": "ptp", "ipMasq": false, "mtu": 1500,
     "ipam": {"type": "host-local", "ranges": [%s], "routes": [%s]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, strings.Join(ranges, ", "), defaultRoutes(n))
}

func defaultRoutes(n nodePlan) string {
	var r []string
	for _, c := range n.PodCIDRs {
		if c.Addr().Is4() {
			r = append(r, `{"dst": "0.0.0.0/0"}`)
		} else {
			r = append(r, `{"dst": "::/0"}`)
		}
	}
	return strings.Join(r, ", ")
}

// resolvConf is what the node's own processes and dnsPolicy: Default pods read: the
// cluster's DNS (an address of the allowed ranges), never the host's resolver.
func resolvConf(p *clusterPlan) string {
	return fmt.Sprintf("nameserver %s\noptions ndots:1 timeout:1 attempts:2\n", p.DNSIP)
}
