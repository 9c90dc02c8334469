// Package pebbletest runs Let's Encrypt's test CA for a test: Debian's pebble, with
// pebble-challtestsrv as its DNS server (every name resolves to one loopback address, 127.0.0.1 by
// default), behind a proxy that counts what the CA is asked. Validation is real (no
// PEBBLE_VA_ALWAYS_VALID): pebble connects to the ports a test names at that address, as a
// production CA connects to ports 80 and 443. Pebble and its DNS server listen on a loopback address
// of their own, so that the free ports they pick are not another test's.
//
// Start skips the test when pebble is not installed, or fails it under ACTIVATOR_INTEGRATION=required
// (internal/testenv). Everything it starts is stopped, and its goroutines joined, at the test's
// cleanup.
package pebbletest

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/activator/activator/internal/testenv"
)

// patience bounds each wait for a process to be ready: an upper bound for a loaded machine, never an
// expectation (pebble is ready within a second).
const patience = 30 * time.Second

// Config is what a test sets of pebble: where it validates challenges, and for how long the
// certificates it issues are valid.
type Config struct {
	// IP is the IPv4 address every name resolves to: where the edge listens. "" is 127.0.0.1.
	IP string
	// HTTPPort and TLSPort are the ports at IP where pebble validates HTTP-01 and TLS-ALPN-01
	// challenges: the edge's plain and TLS listeners. A port nothing listens on makes that
	// challenge fail, and leaves the other.
	HTTPPort, TLSPort int
	// Validity is the certificates' lifetime; 0 is pebble's default (years).
	Validity time.Duration
}

// Pebble is a running CA, reached through its counting proxy.
type Pebble struct {
	// Directory is the ACME directory URL (the proxy's): tls.acme.ca.
	Directory string
	// CARoot is a PEM file of the root of the API's TLS certificate (the proxy serves one it
	// signed): tls.acme.ca_root.
	CARoot string
	// Roots holds pebble's issuing root, which clients of the edge trust. Pebble makes a new one
	// each time it starts; this one stays valid for what it issued after a Stop.
	Roots *x509.CertPool

	orders   atomic.Int64 // new-order requests the proxy received
	requests atomic.Int64 // every request the proxy received
	proc     *proc        // pebble itself
}

// Orders is how many new-order requests (POST /order-plz) the CA has been sent: each is an order,
// whether or not the CA was still running to take it.
func (p *Pebble) Orders() int64 { return p.orders.Load() }

// Requests is how many requests of any kind the CA has been sent.
func (p *Pebble) Requests() int64 { return p.requests.Load() }

// Stop kills pebble and waits until it has exited: the CA is gone, and the proxy answers 502 from
// then on (still counting). It is safe to call more than once.
func (p *Pebble) Stop() { p.proc.kill() }

// Start starts pebble-challtestsrv and pebble on free ports of a loopback address of their own, and
// the counting proxy in front of pebble's API, and returns once pebble serves its issuing root. No
// nonce is rejected, validations do not sleep, and every order is validated afresh (no
// authorization reuse).
func Start(t testing.TB, c Config) *Pebble {
	t.Helper()
	for _, bin := range []string{"pebble", "pebble-challtestsrv"} {
		if _, err := exec.LookPath(bin); err != nil {
			testenv.Missing(t, "%s is not installed (apt-get install pebble)", bin)
		}
	}
	resolve := c.IP
	if resolve == "" {
		resolve = "127.0.0.1"
	}
	dir := t.TempDir()
	own := loopbackIP(t)
	ca := newTestCA(t, dir, own)
	dns := freeUDPAndTCP(t, own)
	startProc(t, "Starting management server", nil, "pebble-challtestsrv",
		"-dns01", dns, "-http01", "", "-https01", "", "-tlsalpn01", "",
		"-management", freeAddr(t, own), "-defaultIPv4", resolve, "-defaultIPv6", "")

	addrs := testenv.FreeAddrs(t, own, 2)
	acmeAddr, mgmtAddr := addrs[0], addrs[1]
	conf := map[string]any{"pebble": map[string]any{
		"listenAddress": acmeAddr, "managementListenAddress": mgmtAddr,
		"certificate": ca.certFile, "privateKey": ca.keyFile,
		"httpPort": c.HTTPPort, "tlsPort": c.TLSPort, "ocspResponderURL": "",
		"certificateValidityPeriod": int(c.Validity.Seconds()),
	}}
	confFile := filepath.Join(dir, "pebble.json")
	writeJSON(t, confFile, conf)
	env := []string{"PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0", "PEBBLE_AUTHZREUSE=0"}
	p := &Pebble{CARoot: ca.caFile}
	p.proc = startProc(t, "ACME directory available at", env, "pebble", "-config", confFile, "-dnsserver", dns)
	p.Roots = fetchRoot(t, ca.pool, "https://"+mgmtAddr+"/roots/0")
	p.Directory = p.startProxy(t, ca, "https://"+acmeAddr) + "/dir"
	return p
}

var discardLog = log.New(io.Discard, "", 0)

// startProxy serves the CA's API through a counting reverse proxy on a TLS port of its own and
// returns its URL. Pebble builds its URLs from the Host header, so the client stays on the proxy.
func (p *Pebble) startProxy(t testing.TB, ca *testCA, target string) string {
	to, _ := url.Parse(target)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(to)
			r.Out.Host = r.In.Host
		},
		Transport: tr,
		ErrorLog:  discardLog,
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.requests.Add(1)
		if r.Method == http.MethodPost && r.URL.Path == "/order-plz" {
			p.orders.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.leaf}}
	srv.Config.ErrorLog = discardLog
	srv.StartTLS()
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
	})
	return srv.URL
}

// proc is a child process of a test, its output kept for the failure report.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process has been reaped and its output read to the end
	mu     sync.Mutex    // guards out
	out    strings.Builder
}

// startProc starts name and waits (patience at most) for ready to appear in its output. The process
// is killed and reaped at the end of the test; its output is logged if the test failed.
func startProc(t testing.TB, ready string, env []string, name string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(name, args...), exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	r, w := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	seen := make(chan struct{})
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		p.scan(r, ready, seen)
	}()
	go func() {
		_ = p.cmd.Wait()
		w.Close()
		<-scanned
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("%s output:\n%s", name, p.output())
		}
	})
	select {
	case <-seen:
		return p
	case <-p.exited:
		t.Fatalf("%s exited before it was ready:\n%s", name, p.output())
	case <-time.After(patience):
		t.Fatalf("%s not ready after %v:\n%s", name, patience, p.output())
	}
	return nil
}

func (p *proc) scan(r io.Reader, ready string, seen chan struct{}) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		p.mu.Lock()
		p.out.WriteString(sc.Text() + "\n")
		p.mu.Unlock()
		if seen != nil && strings.Contains(sc.Text(), ready) {
			close(seen)
			seen = nil
		}
	}
	_, _ = io.Copy(io.Discard, r)
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// kill kills the process and waits until it is reaped.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// testCA is a CA made for one test, and a leaf it signed for 127.0.0.1, pebble's own address and
// localhost: pebble's API and the proxy serve the leaf, and tls.acme.ca_root names the CA's file.
type testCA struct {
	pool                      *x509.CertPool
	caFile, certFile, keyFile string
	leaf                      tls.Certificate
}

func newTestCA(t testing.TB, dir, ip string) *testCA {
	t.Helper()
	caKey, caDER := newCert(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: "acme test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign,
	}, nil, nil)
	caCert, _ := x509.ParseCertificate(caDER)
	leafKey, leafDER := newCert(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.ParseIP(ip)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature,
	}, caCert, caKey)
	keyDER, err := x509.MarshalPKCS8PrivateKey(leafKey)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{pool: x509.NewCertPool(), caFile: filepath.Join(dir, "ca.pem"),
		certFile: filepath.Join(dir, "cert.pem"), keyFile: filepath.Join(dir, "key.pem")}
	ca.pool.AddCert(caCert)
	writePEM(t, ca.caFile, "CERTIFICATE", caDER)
	writePEM(t, ca.certFile, "CERTIFICATE", leafDER)
	writePEM(t, ca.keyFile, "PRIVATE KEY", keyDER)
	if ca.leaf, err = tls.LoadX509KeyPair(ca.certFile, ca.keyFile); err != nil {
		t.Fatal(err)
	}
	return ca
}

// newCert makes a key and a certificate for tmpl, signed by parent (self-signed when nil).
func newCert(t testing.TB, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(time.Now().UnixNano())
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// fetchRoot is the PEM root pebble's management API serves: the root of what it issues. Pebble logs
// its addresses before it listens on them, so this polls (patience at most) until the API answers.
func fetchRoot(t testing.TB, trust *x509.CertPool, u string) *x509.CertPool {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: trust}}, Timeout: patience}
	defer c.CloseIdleConnections()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(patience)
	for {
		resp, err := c.Get(u)
		if err == nil {
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			pool := x509.NewCertPool()
			if resp.StatusCode != http.StatusOK || !pool.AppendCertsFromPEM(b) {
				t.Fatalf("pebble root: %s: %q", resp.Status, b)
			}
			return pool
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("pebble root: %v", err)
		}
	}
}

// loopbackIP is a random address of 127.0.0.0/8 (all of it is loopback on Linux) other than
// 127.0.0.1.
func loopbackIP(t testing.TB) string {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.%d.%d.%d", 1+int(b[0])%254, b[1], 1+int(b[2])%254)
}

// freeAddr is ip with a TCP port that was free a moment ago.
func freeAddr(t testing.TB, ip string) string {
	t.Helper()
	return testenv.FreeAddrs(t, ip, 1)[0]
}

// freeUDPAndTCP is an address on ip whose port was free for both UDP and TCP a moment ago (the
// challenge server answers DNS on both).
func freeUDPAndTCP(t testing.TB, ip string) string {
	t.Helper()
	for range 20 {
		addr := freeAddr(t, ip)
		if c, err := net.ListenPacket("udp", addr); err == nil {
			c.Close()
			return addr
		}
	}
	t.Fatal("no port free for both UDP and TCP")
	return ""
}
