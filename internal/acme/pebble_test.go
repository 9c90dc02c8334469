package acme

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

// pebble is Let's Encrypt's test CA (Debian's pebble package), run by a test with
// pebble-challtestsrv as its DNS server (every name resolves to 127.0.0.1), behind a counting
// proxy: the directory the Manager is given is the proxy's.
type pebble struct {
	caFile    string         // PEM root of the API's (and the proxy's) TLS certificate: tls.acme.ca_root
	directory string         // the proxy's directory URL: tls.acme.ca
	roots     *x509.CertPool // pebble's issuing root, which clients of the edge trust
	orders    atomic.Int64   // new-order requests the proxy passed on
	requests  atomic.Int64   // every request the proxy saw
	proc      *proc          // pebble itself
}

// pebbleConfig is what a test sets of pebble: where it validates challenges, and for how long
// certificates are valid (0: pebble's default of years).
type pebbleConfig struct {
	HTTPPort, TLSPort int
	Validity          time.Duration
}

// startPebble starts pebble-challtestsrv and pebble on free loopback ports, and the proxy. It skips
// the test when pebble is not installed (fails under ACTIVATOR_INTEGRATION=required). Validation
// is real (no PEBBLE_VA_ALWAYS_VALID): pebble connects to HTTPPort and TLSPort on 127.0.0.1.
func startPebble(t *testing.T, pc pebbleConfig) *pebble {
	t.Helper()
	for _, bin := range []string{"pebble", "pebble-challtestsrv"} {
		if _, err := exec.LookPath(bin); err != nil {
			testenv.Missing(t, "%s is not installed (apt-get install pebble)", bin)
		}
	}
	dir := t.TempDir()
	ca := newTestCA(t, dir)
	dns := freeUDPAndTCP(t)
	startProc(t, "Starting management server", nil, "pebble-challtestsrv",
		"-dns01", dns, "-http01", "", "-https01", "", "-tlsalpn01", "",
		"-management", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), "-defaultIPv4", "127.0.0.1", "-defaultIPv6", "")

	acmeAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	mgmtAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	conf := map[string]any{"pebble": map[string]any{
		"listenAddress": acmeAddr, "managementListenAddress": mgmtAddr,
		"certificate": ca.certFile, "privateKey": ca.keyFile,
		"httpPort": pc.HTTPPort, "tlsPort": pc.TLSPort, "ocspResponderURL": "",
		"certificateValidityPeriod": int(pc.Validity.Seconds()),
	}}
	confFile := filepath.Join(dir, "pebble.json")
	writeJSON(t, confFile, conf)
	// No nonce rejected, no random validation sleeps, and every order validated afresh.
	env := []string{"PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0", "PEBBLE_AUTHZREUSE=0"}
	p := &pebble{caFile: ca.caFile}
	p.proc = startProc(t, "ACME directory available at", env, "pebble", "-config", confFile, "-dnsserver", dns)
	p.roots = fetchRoot(t, ca.pool, "https://"+mgmtAddr+"/roots/0")
	p.directory = p.startProxy(t, ca, "https://"+acmeAddr) + "/dir"
	return p
}

// startProxy serves the CA's API through a counting reverse proxy on a TLS port of its own and
// returns its URL. Pebble builds its URLs from the Host header, so the client stays on the proxy.
func (p *pebble) startProxy(t *testing.T, ca *testCA, target string) string {
	to, _ := url.Parse(target)
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(to)
			r.Out.Host = r.In.Host
		},
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool}},
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
	t.Cleanup(srv.Close)
	return srv.URL
}

// stop kills pebble: the CA is gone; the proxy answers 502 from then on.
func (p *pebble) stop() { p.proc.kill() }

// proc is a child process of a test, its output kept for the failure report.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when the process has been reaped
	mu     sync.Mutex    // guards out
	out    strings.Builder
}

// startProc starts name and waits (10s at most) for ready to appear in its output. The process is
// killed and reaped at the end of the test; its output is logged if the test failed.
func startProc(t *testing.T, ready string, env []string, name string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(name, args...), exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	r, w := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	seen := make(chan struct{})
	go p.scan(r, ready, seen)
	go func() {
		p.cmd.Wait()
		w.Close()
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
	case <-time.After(10 * time.Second):
		t.Fatalf("%s not ready after 10s:\n%s", name, p.output())
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
	io.Copy(io.Discard, r)
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// kill kills the process and waits until it is reaped.
func (p *proc) kill() {
	p.cmd.Process.Kill()
	<-p.exited
}

// testCA is a CA made for one test, and a leaf it signed for 127.0.0.1 and localhost: pebble's API
// and the proxy serve the leaf, and tls.acme.ca_root names the CA's file.
type testCA struct {
	pool                      *x509.CertPool
	caFile, certFile, keyFile string
	leaf                      tls.Certificate
}

func newTestCA(t *testing.T, dir string) *testCA {
	t.Helper()
	caKey, caDER := newCert(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: "acme test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign,
	}, nil, nil)
	caCert, _ := x509.ParseCertificate(caDER)
	leafKey, leafDER := newCert(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
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
func newCert(t *testing.T, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*ecdsa.PrivateKey, []byte) {
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

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func writeJSON(t *testing.T, path string, v any) {
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
// its addresses before it listens on them, so this polls (10s at most) until the API answers.
func fetchRoot(t *testing.T, trust *x509.CertPool, u string) *x509.CertPool {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: trust}}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
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

// freeUDPAndTCP is a loopback address whose port was free for both UDP and TCP a moment ago (the
// challenge server answers DNS on both).
func freeUDPAndTCP(t *testing.T) string {
	t.Helper()
	for range 20 {
		addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		if c, err := net.ListenPacket("udp", addr); err == nil {
			c.Close()
			return addr
		}
	}
	t.Fatal("no port free for both UDP and TCP")
	return ""
}
