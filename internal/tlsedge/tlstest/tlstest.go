// Package tlstest makes certificates for tests: a throwaway CA, leaves it signs for the names a test
// asks for, written as the PEM files tls.certificates names.
package tlstest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
)

// CA is a certificate authority that exists for one test.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

// NewCA makes a CA.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: "activator test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{cert: cert, key: key, pool: pool}
}

// Pool holds the CA's certificate: a client's RootCAs.
func (ca *CA) Pool() *x509.CertPool { return ca.pool }

// Leaf is what Issue puts in a certificate.
type Leaf struct {
	Label string   // the subject's common name: how a test tells certificates apart
	Names []string // DNS names (subjectAltName), exact or "*.example.com"
	// NotBefore and NotAfter default to an hour ago and a day from now.
	NotBefore, NotAfter time.Time
}

// Issue signs a leaf with a new key and returns both as PEM.
func (ca *CA) Issue(t testing.TB, l Leaf) (certPEM, keyPEM []byte) {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: l.Label},
		DNSNames:     l.Names,
		NotBefore:    l.NotBefore,
		NotAfter:     l.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore = time.Now().Add(-time.Hour)
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// Write issues l and writes it as dir/name.crt and dir/name.key (KeyFiles first, each by rename, as a
// renewal does), returning the pair as tls.certificates names it.
func (ca *CA) Write(t testing.TB, dir, name string, l Leaf) registry.CertFile {
	t.Helper()
	certPEM, keyPEM := ca.Issue(t, l)
	f := registry.CertFile{CertFile: filepath.Join(dir, name+".crt"), KeyFile: filepath.Join(dir, name+".key")}
	WriteFile(t, f.KeyFile, keyPEM)
	WriteFile(t, f.CertFile, certPEM)
	return f
}

// WriteFile writes b to path by rename: a reader sees the old content or the new, never part.
func WriteFile(t testing.TB, path string, b []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Client is an HTTPS client trusting ca that dials addr whatever the URL's host (the SNI is the URL's
// host), within timeout per request. h2 offers HTTP/2 as well as HTTP/1.1. dials, when set, receives
// once each connection it makes is established (in the server's accept queue). Its idle connections
// are closed at cleanup.
func (ca *CA) Client(t testing.TB, addr string, h2 bool, dials chan<- struct{}, timeout time.Duration) *http.Client {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetHTTP2(h2)
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: ca.Pool()},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			if err == nil && dials != nil {
				dials <- struct{}{}
			}
			return c, err
		},
		Protocols: &p,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: timeout}
}
