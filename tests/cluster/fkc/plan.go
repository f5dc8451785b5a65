package main

// The cluster's plan, pure: names, addresses and ranges from the flags. Every address is in
// 198.18.0.0/15 or 2001:db8::/32 (or loopback): nodes 198.18.0.N / 2001:db8::N, pod CIDRs
// 198.18.N.0/24 / 2001:db8:N::/64 (as tests/conformance/base-cluster.yaml), the control
// plane 198.18.0.254 / 2001:db8::fe, Services 198.19.255.0/24 / 2001:db8:ffff::/112.

import (
	"fmt"
	"net/netip"
)

type clusterPlan struct {
	Family string // ipv4, ipv6, dual
	CNI    string // flock, ptp
	Nodes  []nodePlan
	// The API server's addresses, one per family (the first is the one it advertises).
	APIAddrs     []netip.Addr
	ServiceCIDRs []netip.Prefix
	// The kubernetes Service's ClusterIP and CoreDNS's, in the first family.
	KubernetesIP netip.Addr
	DNSIP        netip.Addr
	ClusterCIDRs []netip.Prefix // every node's pod CIDR together
	NodeSubnets  []netip.Prefix // the underlay: 198.18.0.0/24, 2001:db8::/64
}

type nodePlan struct {
	Name     string // node-N
	Index    int    // N
	NetNS    string // fkc-node-N
	IPs      []netip.Addr
	PodCIDRs []netip.Prefix
}

const maxNodes = 50

func planCluster(nodes int, family, cni string) (*clusterPlan, error) {
	if nodes < 1 || nodes > maxNodes {
		return nil, fmt.Errorf("--nodes must be 1 to %d, not %d", maxNodes, nodes)
	}
	v4, v6 := false, false
	switch family {
	case "ipv4":
		v4 = true
	case "ipv6":
		v6 = true
	case "dual":
		v4, v6 = true, true
	default:
		return nil, fmt.Errorf("--family must be ipv4, ipv6 or dual, not %q", family)
	}
	if cni != "flock" && cni != "ptp" {
		return nil, fmt.Errorf("--cni must be flock or ptp, not %q", cni)
	}
	p := &clusterPlan{Family: family, CNI: cni}
	if v4 {
		p.APIAddrs = append(p.APIAddrs, netip.MustParseAddr("198.18.0.254"))
		p.ServiceCIDRs = append(p.ServiceCIDRs, netip.MustParsePrefix("198.19.255.0/24"))
		p.ClusterCIDRs = append(p.ClusterCIDRs, netip.MustParsePrefix("198.18.0.0/16"))
		p.NodeSubnets = append(p.NodeSubnets, netip.MustParsePrefix("198.18.0.0/24"))
	}
	if v6 {
		p.APIAddrs = append(p.APIAddrs, netip.MustParseAddr("2001:db8::fe"))
		p.ServiceCIDRs = append(p.ServiceCIDRs, netip.MustParsePrefix("2001:db8:ffff::/112"))
		p.ClusterCIDRs = append(p.ClusterCIDRs, netip.MustParsePrefix("2001:db8::/48"))
		p.NodeSubnets = append(p.NodeSubnets, netip.MustParsePrefix("2001:db8::/64"))
	}
	// The Service range's first address is the kubernetes Service, its tenth CoreDNS's (as
	// kubeadm does).
	first := p.ServiceCIDRs[0].Addr()
	p.KubernetesIP = first.Next()
	p.DNSIP = first
	for range 10 {
		p.DNSIP = p.DNSIP.Next()
	}
	for n := 1; n <= nodes; n++ {
		node := nodePlan{Name: fmt.Sprintf("node-%d", n), Index: n, NetNS: fmt.Sprintf("fkc-node-%d", n)}
		if v4 {
			node.IPs = append(node.IPs, netip.AddrFrom4([4]byte{198, 18, 0, byte(n)}))
			node.PodCIDRs = append(node.PodCIDRs, netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(n), 0}), 24))
		}
		if v6 {
			// 198.18.C.D -> 2001:db8:C::D, with C and D written as the decimal digits, as
			// the conformance base clusters do.
			node.IPs = append(node.IPs, netip.MustParseAddr(fmt.Sprintf("2001:db8::%d", n)))
			node.PodCIDRs = append(node.PodCIDRs, netip.MustParsePrefix(fmt.Sprintf("2001:db8:%d::/64", n)))
		}
		p.Nodes = append(p.Nodes, node)
	}
	return p, nil
}

// allowed says whether an address is one this project may assign or send to.
func allowed(a netip.Addr) bool {
	return a.IsLoopback() ||
		netip.MustParsePrefix("198.18.0.0/15").Contains(a) ||
		netip.MustParsePrefix("2001:db8::/32").Contains(a)
}

// check refuses a plan with an address outside the allowed ranges or ranges that overlap:
// a guard for whoever edits the plan.
func (p *clusterPlan) check() error {
	var all []netip.Prefix
	for _, a := range p.APIAddrs {
		if !allowed(a) {
			return fmt.Errorf("API server address %s outside 198.18.0.0/15 and 2001:db8::/32", a)
		}
	}
	for _, s := range p.ServiceCIDRs {
		if !allowed(s.Addr()) {
			return fmt.Errorf("Service range %s outside the allowed ranges", s)
		}
		all = append(all, s)
	}
	for _, n := range p.Nodes {
		for _, a := range n.IPs {
			if !allowed(a) {
				return fmt.Errorf("%s's address %s outside the allowed ranges", n.Name, a)
			}
		}
		for _, c := range n.PodCIDRs {
			if !allowed(c.Addr()) {
				return fmt.Errorf("%s's pod CIDR %s outside the allowed ranges", n.Name, c)
			}
			all = append(all, c)
		}
	}
	all = append(all, p.NodeSubnets...)
	for i := range all {
		for j := i + 1; j < len(all); j++ {
			if all[i].Overlaps(all[j]) {
				return fmt.Errorf("ranges %s and %s overlap", all[i], all[j])
			}
		}
	}
	return nil
}

// hasV4 and hasV6 say which families the cluster runs.
func (p *clusterPlan) hasV4() bool { return p.Family != "ipv6" }
func (p *clusterPlan) hasV6() bool { return p.Family != "ipv4" }

// subnetBits is the node subnet's prefix length for an address of the cluster.
func subnetBits(a netip.Addr) int {
	if a.Is4() {
		return 24
	}
	return 64
}
