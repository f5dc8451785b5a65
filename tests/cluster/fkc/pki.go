package main

// The cluster's certificates, made with the standard library: one CA, the API server's
// serving certificate, a client certificate per component (its user and groups are what
// RBAC and the Node authorizer see), each kubelet's serving certificate, and the service
// account signing key.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"
)

type pki struct {
	Dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

func (p *pki) path(name string) string { return filepath.Join(p.Dir, name) }

// newPKI makes the CA in dir.
func newPKI(dir string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "flock-cluster-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	p := &pki{Dir: dir, caCert: cert, caKey: key}
	if err := writePEM(p.path("ca.crt"), "CERTIFICATE", der); err != nil {
		return nil, err
	}
	if err := writeKey(p.path("ca.key"), key); err != nil {
		return nil, err
	}
	return p, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

// certSpec is one certificate to issue.
type certSpec struct {
	Name   string // file name stem: NAME.crt, NAME.key
	CN     string
	Orgs   []string
	Server bool
	Client bool
	DNS    []string
	IPs    []netip.Addr
}

func (p *pki) issue(s certSpec) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: s.CN, Organization: s.Orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		DNSNames:     s.DNS,
	}
	for _, ip := range s.IPs {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.IP(ip.AsSlice()))
	}
	if s.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if s.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return fmt.Errorf("issuing %s: %w", s.Name, err)
	}
	if err := writePEM(p.path(s.Name+".crt"), "CERTIFICATE", der); err != nil {
		return err
	}
	return writeKey(p.path(s.Name+".key"), key)
}

// serviceAccountKey writes the key pair service account tokens are signed with.
func (p *pki) serviceAccountKey() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	if err := writeKey(p.path("sa.key"), key); err != nil {
		return err
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	return writePEM(p.path("sa.pub"), "PUBLIC KEY", pub)
}

func writePEM(path, kind string, der []byte) error {
	return writeFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "EC PRIVATE KEY", der)
}

// clusterCerts issues every certificate the plan needs.
func clusterCerts(dir string, plan *clusterPlan) (*pki, error) {
	p, err := newPKI(dir)
	if err != nil {
		return nil, err
	}
	apiIPs := append([]netip.Addr{netip.MustParseAddr("127.0.0.1"), plan.KubernetesIP}, plan.APIAddrs...)
	for _, cidr := range plan.ServiceCIDRs[1:] {
		apiIPs = append(apiIPs, cidr.Addr().Next())
	}
	specs := []certSpec{
		{Name: "apiserver", CN: "kube-apiserver", Server: true, IPs: apiIPs,
			DNS: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}},
		{Name: "apiserver-kubelet-client", CN: "kube-apiserver-kubelet-client", Client: true},
		{Name: "admin", CN: "kubernetes-admin", Orgs: []string{"system:masters"}, Client: true},
		{Name: "controller-manager", CN: "system:kube-controller-manager", Client: true},
		{Name: "scheduler", CN: "system:kube-scheduler", Client: true},
		{Name: "kube-proxy", CN: "system:kube-proxy", Client: true},
	}
	for _, n := range plan.Nodes {
		specs = append(specs,
			certSpec{Name: n.Name + "-kubelet-client", CN: "system:node:" + n.Name, Orgs: []string{"system:nodes"}, Client: true},
			certSpec{Name: n.Name + "-kubelet-server", CN: n.Name, Server: true, DNS: []string{n.Name}, IPs: n.IPs},
		)
	}
	for _, s := range specs {
		if err := p.issue(s); err != nil {
			return nil, err
		}
	}
	return p, p.serviceAccountKey()
}
