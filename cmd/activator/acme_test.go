package main

// ACME end to end (docs/tls.md, "ACME"): a real `activator serve` with listen and listen_tls on
// loopback and tls.acme pointed at a real pebble (internal/acme/pebbletest), which validates its
// challenges against the activator's own listeners: pebble-challtestsrv resolves every name to the
// loopback address the activator listens on, and pebble's httpPort and tlsPort are its plain and TLS
// ports.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/activator/activator/internal/acme/pebbletest"
	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/testenv"
)

// acmeServe is what an ACME test's activator is started with: its plain and TLS listeners (bound
// by the activator, on a loopback address of the test's own, where every name resolves and pebble
// validates) and its admin address, and the rest of its config.
type acmeServe struct {
	edge, tls, admin string
	config           string
}

// The challenge an ACME test lets pebble validate; the other one's port leads nowhere.
const (
	http01    = "http-01"     // to the activator's plain listener
	tlsALPN01 = "tls-alpn-01" // to its TLS listener
)

// newACMEServe picks the activator's addresses, starts pebble validating challenge against them (and
// the other challenge against a port nothing listens on), and writes the config: tls.acme on pebble,
// storage in storage, and routes. The certificates are ordered in the background as soon as the
// activator starts. The handshake timeout is raised from its 10s default: a first handshake waits for
// the order, which on a loaded machine under the race detector may take longer.
func newACMEServe(t *testing.T, challenge, storage string, routes ...appRoute) (*acmeServe, *pebbletest.Pebble) {
	t.Helper()
	ip := loopbackIP(t)
	addrs := testenv.FreeAddrs(t, ip, 3)
	a := &acmeServe{edge: addrs[0], tls: addrs[1], admin: freeLoopbackAddr(t)}
	httpPort, tlsPort, nowhere := portOf(a.edge), portOf(a.tls), portOf(addrs[2])
	conf := pebbletest.Config{IP: ip, HTTPPort: httpPort, TLSPort: nowhere}
	if challenge == tlsALPN01 {
		conf = pebbletest.Config{IP: ip, HTTPPort: nowhere, TLSPort: tlsPort}
	}
	p := pebbletest.Start(t, conf)
	a.config = fmt.Sprintf("listen_tls: %q\nedge: {tls_handshake_timeout: 30s}\n", a.tls) +
		fmt.Sprintf("tls:\n  acme: {email: ops@example.org, ca: %q, ca_root: %q, storage: %q}\n", p.Directory, p.CARoot, storage) +
		configYAML(t, routes...)
	return a, p
}

// portOf is addr's port.
func portOf(addr string) int { return int(netip.MustParseAddrPort(addr).Port()) }

func (a *acmeServe) start(t *testing.T) *served {
	t.Helper()
	return startServedAt(t, a.edge, a.admin, a.config)
}

// rootsClient is an HTTPS client trusting only roots that dials addr whatever the URL's host, which
// is the SNI. Its idle connections are closed at cleanup.
func rootsClient(t *testing.T, roots *x509.CertPool, addr string) *http.Client {
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: patience}
}

// verifiedAnswer is one HTTPS answer with the chain the client verified.
type verifiedAnswer struct {
	code  int
	body  string
	chain []*x509.Certificate // leaf first, pebble's root last
	err   error
}

func verifiedDo(c *http.Client, method, url string, body []byte) verifiedAnswer {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return verifiedAnswer{err: err}
	}
	resp, err := c.Do(req)
	if err != nil {
		return verifiedAnswer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	a := verifiedAnswer{code: resp.StatusCode, body: string(b), err: err}
	if len(resp.TLS.VerifiedChains) > 0 {
		a.chain = resp.TLS.VerifiedChains[0]
	}
	return a
}

// checkIssued checks that chain, which the client verified against pebble's roots alone, is for
// host only.
func checkIssued(t *testing.T, host string, chain []*x509.Certificate) {
	t.Helper()
	if len(chain) < 2 {
		t.Fatalf("%s: verified chain of %d certificates, want a leaf issued under pebble's root", host, len(chain))
	}
	if got := chain[0].DNSNames; len(got) != 1 || got[0] != host {
		t.Errorf("%s: certificate for %q, want [%s]", host, got, host)
	}
}

// waitObtained waits until the activator has logged that host's certificate was obtained.
func (s *served) waitObtained(host string) {
	s.t.Helper()
	for n := 1; ; n++ {
		if countHost(s.waitLogged("certificate obtained", n), host) > 0 {
			return
		}
	}
}

func countHost(recs []map[string]any, host string) int {
	n := 0
	for _, r := range recs {
		if r["host"] == host {
			n++
		}
	}
	return n
}

// wantOneRequestWake checks that route's history is exactly one wake, triggered by a request and
// successful.
func (s *served) wantOneRequestWake(t *testing.T, route string) {
	t.Helper()
	evs := s.events(route)
	if len(evs) != 1 || evs[0].Kind != activator.EventWake || evs[0].Wake.Trigger != "request" || evs[0].Wake.Result != activator.ResultOK {
		t.Errorf("%s: history %+v, want one successful wake triggered by a request", route, evs)
	}
}

// TestACMEEdge: with pebble validating over HTTP-01 alone (its TLS-ALPN-01 port leads nowhere), so
// that every validation is an HTTP request for a route's host to the activator's plain listener, the
// one kind of challenge that routing could hand to a tenant:
//   - the first HTTPS request to a host, sent as the activator starts, gets a certificate that
//     verifies against pebble's root, then wakes the tenant and is answered, its body intact;
//   - for a second host, the background order completes while its route sleeps, and the route is
//     still asleep with an empty history; the request that follows is its only wake;
//   - a hello for an unknown name (with or without acme-tls/1, or with none) gets no certificate and
//     causes no order, and storage holds nothing for it.
func TestACMEEdge(t *testing.T) {
	t.Parallel()
	first, asleep := appRoute{Name: "acmefirst"}, appRoute{Name: "acmeasleep"}
	storage := t.TempDir()
	a, p := newACMEServe(t, http01, storage, first, asleep)
	s := a.start(t)
	c := rootsClient(t, p.Roots, a.tls)

	t.Run("the first request obtains a certificate", func(t *testing.T) {
		sent := make([]byte, 64<<10)
		_, _ = rand.Read(sent)
		got := verifiedDo(c, http.MethodPost, "https://"+first.host()+"/echo", sent)
		if got.err != nil || got.code != http.StatusOK {
			t.Fatalf("POST https://%s/echo: %d, %v; want 200", first.host(), got.code, got.err)
		}
		checkIssued(t, first.host(), got.chain)
		if got.body != string(sent) {
			t.Errorf("the echo returned %d bytes that differ from the %d sent", len(got.body), len(sent))
		}
		s.wantOneRequestWake(t, first.Name)
	})

	t.Run("challenges wake no tenant", func(t *testing.T) {
		s.waitObtained(asleep.host())
		if st := s.status(asleep.Name); st.State != "asleep" || len(s.events(asleep.Name)) != 0 || len(s.logs.spawns(asleep.Name)) != 0 {
			t.Fatalf("%s after its certificate was obtained: %s, %d events, %d spawns; want asleep, untouched",
				asleep.Name, st.State, len(s.events(asleep.Name)), len(s.logs.spawns(asleep.Name)))
		}
		got := verifiedDo(c, http.MethodGet, "https://"+asleep.host()+"/", nil)
		if got.err != nil || got.code != http.StatusOK || got.body != "hello from demoapp\n" {
			t.Fatalf("GET https://%s/: %d %q, %v; want the tenant's 200", asleep.host(), got.code, got.body, got.err)
		}
		checkIssued(t, asleep.host(), got.chain)
		s.wantOneRequestWake(t, asleep.Name)
	})

	t.Run("unknown names", func(t *testing.T) {
		orders := p.Orders()
		names := []string{""}
		for i := range 50 {
			names = append(names, fmt.Sprintf("unknown%d.test", i))
		}
		for i, name := range names {
			protos := []string{"h2", "http/1.1"}
			if i%2 == 1 {
				protos = []string{"acme-tls/1"}
			}
			conf := &tls.Config{ServerName: name, InsecureSkipVerify: true, NextProtos: protos}
			if conn, err := tls.Dial("tcp", a.tls, conf); err == nil {
				conn.Close()
				t.Errorf("hello for %q (ALPN %q) got a certificate, want none", name, protos)
			}
		}
		if got := p.Orders(); got != orders {
			t.Errorf("orders after %d hellos for unknown names: %d, want %d", len(names), got, orders)
		}
		err := filepath.WalkDir(storage, func(path string, _ fs.DirEntry, err error) error {
			if strings.Contains(path, "unknown") {
				t.Errorf("storage holds %s", path)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	t.Run("metrics", func(t *testing.T) {
		hc := &http.Client{Transport: &http.Transport{}}
		t.Cleanup(hc.CloseIdleConnections)
		body := adminGet(t, hc, a.admin, "/metrics")
		for _, r := range []appRoute{first, asleep} {
			got := verifiedDo(c, http.MethodGet, "https://"+r.host()+"/", nil)
			if got.err != nil {
				t.Fatal(got.err)
			}
			host := fmt.Sprintf("%q", r.host())
			v, ok := scrapedValue(body, "activator_tls_certificate_expiry_timestamp_seconds", "certificate="+host, `source="acme"`)
			if want := got.chain[0].NotAfter.Unix(); !ok || int64(v) != want {
				t.Errorf("expiry of %s: %v (present %v), want %d, the served leaf's", r.host(), v, ok, want)
			}
			if v, ok := scrapedValue(body, "activator_tls_acme_failing", "host="+host); !ok || v != 0 {
				t.Errorf("activator_tls_acme_failing of %s: %v (present %v), want 0", r.host(), v, ok)
			}
			for _, op := range []string{"obtain", "renew"} {
				if v, ok := scrapedValue(body, "activator_tls_acme_failures_total", "host="+host, fmt.Sprintf("operation=%q", op)); !ok || v != 0 {
					t.Errorf("ACME %s failures of %s: %v (present %v), want 0", op, r.host(), v, ok)
				}
			}
		}
		if bytes.Contains(body, []byte("unknown0.test")) {
			t.Errorf("an unknown hello's name is in /metrics")
		}
	})

	for _, r := range []appRoute{first, asleep} {
		if n := countHost(s.logs.matching("certificate obtained"), r.host()); n != 1 {
			t.Errorf("%s: %d certificates obtained, want 1 (the handshake and the background order share one)", r.host(), n)
		}
	}
}

// TestACMEStoppedCA: with pebble validating over TLS-ALPN-01 alone (through the activator's TLS
// listener), the certificate obtained stays in service once the CA is stopped: on the running
// activator, and across a restart of the activator on the same storage, which sends the CA no order
// and serves the same certificate to the request that wakes the tenant.
func TestACMEStoppedCA(t *testing.T) {
	t.Parallel()
	app := appRoute{Name: "acmekeep"}
	a, p := newACMEServe(t, tlsALPN01, t.TempDir(), app)
	s := a.start(t)
	url := "https://" + app.host() + "/"
	get := func(what string) *x509.Certificate {
		t.Helper()
		got := verifiedDo(rootsClient(t, p.Roots, a.tls), http.MethodGet, url, nil)
		if got.err != nil || got.code != http.StatusOK || got.body != "hello from demoapp\n" {
			t.Fatalf("%s: GET %s: %d %q, %v; want the tenant's 200", what, url, got.code, got.body, got.err)
		}
		checkIssued(t, app.host(), got.chain)
		return got.chain[0]
	}
	s.waitObtained(app.host())
	leaf := get("with the CA running")

	p.Stop()
	orders := p.Orders()
	if got := get("with the CA stopped"); !got.Equal(leaf) {
		t.Errorf("with the CA stopped: serial %x, want %x", got.SerialNumber, leaf.SerialNumber)
	}
	stopServed(t, s)

	s = a.start(t)
	if got := get("after a restart"); !got.Equal(leaf) {
		t.Errorf("after a restart: serial %x, want %x from storage", got.SerialNumber, leaf.SerialNumber)
	}
	s.wantOneRequestWake(t, app.Name)
	if got := p.Orders(); got != orders {
		t.Errorf("orders sent to the stopped CA: %d, want none", got-orders)
	}
	if n := len(s.logs.matching("certificate obtained")); n != 0 {
		t.Errorf("the restarted activator obtained %d certificates, want none", n)
	}
}
