package main

// The cluster's network: an underlay namespace (fkc-underlay) holding one bridge, every
// node's eth0 and the control plane's link on it — one L2 segment, as a rack's nodes
// share. The control plane runs in the root namespace behind its link fkc-host
// (198.18.0.254, 2001:db8::fe), with routes to the nodes' pod CIDRs; each node is a network
// namespace fkc-node-N.

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
)

const (
	underlayNS = "fkc-underlay"
	bridgeName = "fkc-br"
	hostLink   = "fkc-host"
)

func ipCmd(args ...string) error {
	_, err := output("ip", args...)
	return err
}

// inNetNS runs a command in a named network namespace with nsenter (not `ip netns exec`,
// which remounts /sys and would hide the cgroup file systems).
func inNetNS(ns string, name string, args ...string) error {
	a := append([]string{"--net=/run/netns/" + ns, "--", name}, args...)
	_, err := output("nsenter", a...)
	return err
}

func sysctlIn(ns, key, value string) error {
	return inNetNS(ns, "sysctl", "-q", "-w", key+"="+value)
}

func addNetNS(st *clusterState, name string) error {
	if err := ipCmd("netns", "add", name); err != nil {
		return err
	}
	return st.record(func(s *clusterState) { s.NetNS = append(s.NetNS, name) })
}

func addrArgs(a netip.Addr, bits int) []string {
	args := []string{netip.PrefixFrom(a, bits).String()}
	if a.Is6() {
		// No duplicate address detection: the address is usable at once.
		args = append(args, "nodad")
	}
	return args
}

// setupNetwork makes the underlay, the control plane's link and every node's namespace.
func setupNetwork(st *clusterState, p *clusterPlan) error {
	if err := addNetNS(st, underlayNS); err != nil {
		return err
	}
	steps := [][]string{
		{"-n", underlayNS, "link", "set", "lo", "up"},
		{"-n", underlayNS, "link", "add", bridgeName, "type", "bridge"},
		{"-n", underlayNS, "link", "set", bridgeName, "up"},
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			return err
		}
	}
	// No IPv6 on the bridge itself: it is only a switch.
	_ = sysctlIn(underlayNS, "net.ipv6.conf."+bridgeName+".disable_ipv6", "1")

	if err := ipCmd("link", "add", hostLink, "type", "veth", "peer", "name", "up-host", "netns", underlayNS); err != nil {
		return err
	}
	if err := st.record(func(s *clusterState) { s.Links = append(s.Links, hostLink) }); err != nil {
		return err
	}
	if err := ipCmd("-n", underlayNS, "link", "set", "up-host", "master", bridgeName, "up"); err != nil {
		return err
	}
	// The host's side: no router advertisements or DAD on a link of the test's own.
	if p.hasV6() {
		for _, k := range []string{"accept_dad=0", "accept_ra=0", "autoconf=0"} {
			kv := strings.SplitN(k, "=", 2)
			_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+hostLink+"/"+kv[0], []byte(kv[1]), 0o644)
		}
	}
	for _, a := range p.APIAddrs {
		if err := ipCmd(append([]string{"addr", "add"}, append(addrArgs(a, subnetBits(a)), "dev", hostLink)...)...); err != nil {
			return err
		}
	}
	if err := ipCmd("link", "set", hostLink, "up"); err != nil {
		return err
	}

	for _, n := range p.Nodes {
		if err := setupNodeNetwork(st, p, n); err != nil {
			return fmt.Errorf("%s's network: %w", n.Name, err)
		}
	}
	// The control plane reaches pods (answers to them, exec streams) through their node.
	for _, n := range p.Nodes {
		for i, c := range n.PodCIDRs {
			route := []string{"route", "add", c.String(), "via", n.IPs[i].String(), "dev", hostLink}
			if err := ipCmd(route...); err != nil {
				return err
			}
			if err := st.record(func(s *clusterState) { s.Routes = append(s.Routes, route[2:]) }); err != nil {
				return err
			}
		}
	}
	return nil
}

func setupNodeNetwork(st *clusterState, p *clusterPlan, n nodePlan) error {
	if err := addNetNS(st, n.NetNS); err != nil {
		return err
	}
	port := fmt.Sprintf("up-node-%d", n.Index)
	steps := [][]string{
		{"-n", n.NetNS, "link", "set", "lo", "up"},
		{"-n", underlayNS, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", n.NetNS},
		{"-n", underlayNS, "link", "set", port, "master", bridgeName, "up"},
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			return err
		}
	}
	// A node forwards (its pods' traffic), as kubeadm's preflight requires.
	if err := sysctlIn(n.NetNS, "net.ipv4.ip_forward", "1"); err != nil {
		return err
	}
	if p.hasV6() {
		for _, kv := range [][2]string{{"net.ipv6.conf.all.forwarding", "1"}, {"net.ipv6.conf.eth0.accept_dad", "0"}, {"net.ipv6.conf.default.accept_dad", "0"}} {
			if err := sysctlIn(n.NetNS, kv[0], kv[1]); err != nil {
				return err
			}
		}
	}
	for _, a := range n.IPs {
		if err := ipCmd(append([]string{"-n", n.NetNS, "addr", "add"}, append(addrArgs(a, subnetBits(a)), "dev", "eth0")...)...); err != nil {
			return err
		}
	}
	if err := ipCmd("-n", n.NetNS, "link", "set", "eth0", "up"); err != nil {
		return err
	}
	// The default route points at the control plane's address: a node has one (Service
	// ClusterIPs are routed before kube-proxy's DNAT), and nothing answers beyond it.
	for _, a := range p.APIAddrs {
		if err := ipCmd("-n", n.NetNS, "route", "add", "default", "via", a.String(), "dev", "eth0"); err != nil {
			return err
		}
	}
	return nil
}

// ptpRoutes gives each node routes to the other nodes' pod CIDRs: what flock-agent does
// itself (host-gw on one segment), the ptp baseline gets from fkc, as its users get from
// their cloud's route table.
func ptpRoutes(p *clusterPlan) error {
	for _, n := range p.Nodes {
		for _, m := range p.Nodes {
			if m.Index == n.Index {
				continue
			}
			for i, c := range m.PodCIDRs {
				if err := ipCmd("-n", n.NetNS, "route", "add", c.String(), "via", m.IPs[i].String(), "dev", "eth0"); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
