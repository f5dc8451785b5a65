package main

// The host's sysctls. Network sysctls of the nodes live in their own namespaces and go with
// them; but a kubelet sets machine-wide kernel tunables (kernel.panic_on_oops and friends:
// setupKernelTunables in pkg/kubelet/cm), and conntrack's limits are global. up records
// the host's values of those keys and a snapshot of every writable machine-wide key; down
// puts back each one that changed, by name.

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// knownSysctls are the keys the components are known to set on the host.
var knownSysctls = []string{
	// kubelet (setupKernelTunables)
	"vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
	"kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes",
	// kube-proxy (its conntrack settings are zeroed in its config, but in case)
	"net.netfilter.nf_conntrack_max", "net.netfilter.nf_conntrack_tcp_timeout_established",
	"net.netfilter.nf_conntrack_tcp_timeout_close_wait", "net.netfilter.nf_conntrack_tcp_be_liberal",
	"net.netfilter.nf_conntrack_udp_timeout", "net.netfilter.nf_conntrack_udp_timeout_stream",
	// the root namespace's forwarding (the control plane's namespace)
	"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding",
}

// snapshotPrefixes are the machine-wide trees compared at down; keys that change by
// themselves are skipped.
var snapshotPrefixes = []string{"kernel/", "vm/", "fs/", "net/core/", "net/netfilter/", "net/ipv4/", "net/ipv6/conf/all/", "net/ipv6/conf/default/", "user/"}

var volatileSysctls = map[string]bool{
	"kernel.ns_last_pid": true, "kernel.random.uuid": true, "kernel.random.boot_id": true,
	"kernel.random.entropy_avail": true, "fs.dentry-state": true, "fs.file-nr": true,
	"fs.inode-nr": true, "fs.inode-state": true, "kernel.pty.nr": true,
	"net.netfilter.nf_conntrack_count": true, "fs.quota.syncs": true,
	// Tables that grow as the host runs.
	"kernel.keys.gc_delay": false,
}

func sysctlPath(key string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
}

func readSysctl(key string) (string, error) {
	data, err := os.ReadFile(sysctlPath(key))
	return strings.TrimSpace(string(data)), err
}

// snapshotSysctls reads every writable key under the prefixes (of the root namespace).
func snapshotSysctls() map[string]string {
	out := map[string]string{}
	for _, prefix := range snapshotPrefixes {
		root := filepath.Join("/proc/sys", prefix)
		_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			info, err := d.Info()
			if err != nil || info.Mode().Perm()&0o200 == 0 {
				return nil
			}
			key := strings.ReplaceAll(strings.TrimPrefix(path, "/proc/sys/"), "/", ".")
			if volatileSysctls[key] || strings.HasPrefix(key, "net.ipv4.conf.") || strings.HasPrefix(key, "net.ipv4.neigh.") {
				return nil
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return nil
			}
			out[key] = strings.TrimSpace(string(data))
			return nil
		})
	}
	return out
}

func writeSnapshot(path string, m map[string]string) error {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s\t%s\n", k, strings.ReplaceAll(m[k], "\n", " "))
	}
	return writeFile(path, []byte(b.String()), 0o600)
}

func readSnapshot(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "\t")
		if ok {
			out[k] = v
		}
	}
	return out, sc.Err()
}

func (c *cluster) recordSysctls() error {
	known := map[string]string{}
	for _, k := range knownSysctls {
		if v, err := readSysctl(k); err == nil {
			known[k] = v
		}
	}
	snap := filepath.Join(c.l.State(), "sysctl-before.txt")
	if err := writeSnapshot(snap, snapshotSysctls()); err != nil {
		return err
	}
	return c.st.record(func(s *clusterState) {
		s.Sysctls = known
		s.SysctlSnapshot = snap
	})
}

// restoreSysctls puts back every recorded key whose value changed; it returns what it
// restored, by name.
func restoreSysctls(st *clusterState) ([]string, []error) {
	want := map[string]string{}
	if st.SysctlSnapshot != "" {
		if snap, err := readSnapshot(st.SysctlSnapshot); err == nil {
			want = snap
		}
	}
	for k, v := range st.Sysctls {
		want[k] = v
	}
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var restored []string
	var errs []error
	for _, k := range keys {
		cur, err := readSysctl(k)
		if err != nil || normalizeSysctl(cur) == normalizeSysctl(want[k]) {
			continue
		}
		if err := os.WriteFile(sysctlPath(k), []byte(want[k]), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restoring %s to %q: %w", k, want[k], err))
			continue
		}
		restored = append(restored, fmt.Sprintf("%s %s -> %s", k, cur, want[k]))
	}
	return restored, errs
}

func normalizeSysctl(v string) string { return strings.Join(strings.Fields(v), " ") }
