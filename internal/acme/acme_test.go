package acme

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/activator/activator/internal/acme/pebbletest"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/testenv"
)

// The first handshake for a configured host, made as Run starts, obtains its certificate (or waits
// for the background order), over each challenge in turn: pebble's port for the other one leads
// nowhere. A client trusting pebble's root gets a valid chain and the tenant's answer, and only one
// certificate was obtained.
func TestFirstHandshakeObtainsCertificate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		conf func(e *edge, nowhere int) pebbletest.Config
		used func(e *edge) int64
	}{
		{"tls-alpn-01", func(e *edge, nowhere int) pebbletest.Config {
			return pebbletest.Config{HTTPPort: nowhere, TLSPort: e.tlsPort()}
		}, func(e *edge) int64 { return e.alpnHellos.Load() }},
		{"http-01", func(e *edge, nowhere int) pebbletest.Config {
			return pebbletest.Config{HTTPPort: e.httpPort(), TLSPort: nowhere}
		}, func(e *edge) int64 { return e.httpChallenges.Load() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEdge(t)
			p := pebbletest.Start(t, tc.conf(e, testenv.FreePort(t)))
			host := testHost(t)
			m, rec := newManager(t, p, e, t.TempDir(), host)
			e.serve(m)
			stop := run(t, m)

			leaf := e.mustHandshake(host, p.Roots)
			if got := leaf.DNSNames; len(got) != 1 || got[0] != host {
				t.Errorf("certificate names = %q, want [%s]", got, host)
			}
			if n := tc.used(e); n == 0 {
				t.Errorf("no %s validation reached the edge", tc.name)
			}
			code, body, err := e.get(host, "/", p.Roots)
			if err != nil || code != http.StatusOK || body != "tenant" {
				t.Errorf("GET https://%s/ = %d %q, %v; want 200 \"tenant\"", host, code, body, err)
			}
			if n := e.tenantChallengeHit.Load(); n != 0 {
				t.Errorf("%d challenge requests reached the tenant, want 0", n)
			}
			if err := stop(); err != nil {
				t.Errorf("Run: %v", err)
			}
			if n := rec.count("certificate obtained"); n != 1 {
				t.Errorf("%d certificates obtained, want 1", n)
			}
		})
	}
}

// Run obtains the configured hosts' certificates with no handshake asking; SetHosts manages a host
// added and drops one removed, whose name is then refused like any unknown one.
func TestBackgroundManagementAndReload(t *testing.T) {
	t.Parallel()
	e := newEdge(t)
	p := pebbletest.Start(t, pebbletest.Config{HTTPPort: e.httpPort(), TLSPort: e.tlsPort()})
	a, b := "a."+testHost(t), "b."+testHost(t)
	m, rec := newManager(t, p, e, t.TempDir(), a)
	e.serve(m)
	run(t, m)

	rec.waitFor(t, 1, "certificate obtained", "host="+a, "renewal=false")
	orders := p.Orders()
	e.mustHandshake(a, p.Roots)
	if got := p.Orders(); got != orders {
		t.Errorf("orders after a handshake for a managed certificate = %d, want %d", got, orders)
	}

	m.SetHosts([]string{b})
	rec.waitFor(t, 1, "certificate obtained", "host="+b)
	e.mustHandshake(b, p.Roots)
	if _, err := e.handshake(a, p.Roots); err == nil || e.refusals(a) == 0 {
		t.Errorf("handshake for the removed %s: err %v, %d refusals; want ErrNotManaged", a, err, e.refusals(a))
	}
}

// With certificates valid for a minute (due for renewal at once by certmagic's measure), the
// maintenance pass (what certmagic runs every 10 minutes, called here) renews the certificate, and
// handshakes serve the new one; so does Run at start, for a due certificate it finds in storage.
func TestRenewal(t *testing.T) {
	t.Parallel()
	e := newEdge(t)
	p := pebbletest.Start(t, pebbletest.Config{HTTPPort: e.httpPort(), TLSPort: e.tlsPort(), Validity: time.Minute})
	host, storage := testHost(t), t.TempDir()
	m, rec := newManager(t, p, e, storage, host)
	e.serve(m)
	stop := run(t, m)
	rec.waitFor(t, 1, "certificate obtained", "host="+host, "renewal=false")
	first := e.mustHandshake(host, p.Roots)

	if err := m.cache.RenewManagedCertificates(t.Context()); err != nil {
		t.Fatalf("maintenance pass: %v", err)
	}
	rec.waitFor(t, 1, "certificate obtained", "host="+host, "renewal=true")
	// The new certificate is served once m's renewal job has loaded it into memory, its last step: m2's
	// start-up renewal below is not dropped as that job's duplicate (TestStoppedCAKeepsCertificates).
	second := e.waitServed(host, p.Roots, first)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}

	m2, rec2 := newManager(t, p, e, storage, host)
	e.serve(m2)
	run(t, m2)
	rec2.waitFor(t, 1, "certificate obtained", "host="+host, "renewal=true")
	e.waitServed(host, p.Roots, second)
}

// A flood of unknown names (plain and TLS-ALPN-01 hellos, none, a wildcard, a subdomain of the
// managed host) gets no certificate, and reaches neither the CA nor storage: pebble sees no order, the proxy
// no request at all, and no file in storage changes. Challenge requests for unknown hosts go to
// the tenant; for the managed host, a bogus token gets 404 from the handler, not the tenant.
func TestUnknownNamesCauseNoOrder(t *testing.T) {
	t.Parallel()
	e := newEdge(t)
	p := pebbletest.Start(t, pebbletest.Config{HTTPPort: e.httpPort(), TLSPort: e.tlsPort()})
	host, storage := testHost(t), t.TempDir()
	m, _ := newManager(t, p, e, storage, host)
	e.serve(m)
	run(t, m)
	e.mustHandshake(host, p.Roots)

	orders, requests, files := p.Orders(), p.Requests(), snapshot(t, storage)
	names := []string{"", "*." + host, "sub." + host, strings.ToUpper(host) + "x"}
	for i := range 300 {
		names = append(names, fmt.Sprintf("x%d.flood.test", i))
	}
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			protos := []string{"http/1.1"}
			if i%2 == 1 {
				protos = []string{"acme-tls/1"}
			}
			conf := &tls.Config{ServerName: name, InsecureSkipVerify: true, NextProtos: protos}
			if c, err := tls.Dial("tcp", e.tlsLn.Addr().String(), conf); err == nil {
				c.Close()
				t.Errorf("handshake for %q succeeded, want no certificate", name)
			}
			e.plainGet(t, name, challengePath+"token"+fmt.Sprint(i))
		})
	}
	wg.Wait()

	if got := p.Orders(); got != orders {
		t.Errorf("orders after the flood = %d, want %d", got, orders)
	}
	if got := p.Requests(); got != requests {
		t.Errorf("requests to the CA during the flood = %d, want %d", got, requests)
	}
	if got := snapshot(t, storage); got != files {
		t.Errorf("storage changed during the flood:\nbefore:\n%s\nafter:\n%s", files, got)
	}
	hits := e.tenantHits.Load()
	if code := e.plainGet(t, host, challengePath+"bogus"); code != http.StatusNotFound || e.tenantHits.Load() != hits {
		t.Errorf("bogus token for the managed host: %d, tenant hits %d→%d; want 404 from the handler", code, hits, e.tenantHits.Load())
	}
}

// A stopped CA leaves the certificate in service: while renewals fail (logged, not fatal), and
// across a restart of the Manager from the same storage, which asks the CA for nothing first.
func TestStoppedCAKeepsCertificates(t *testing.T) {
	t.Parallel()
	e := newEdge(t)
	p := pebbletest.Start(t, pebbletest.Config{HTTPPort: e.httpPort(), TLSPort: e.tlsPort(), Validity: time.Minute})
	host, storage := testHost(t), t.TempDir()
	m, rec := newManager(t, p, e, storage, host)
	e.serve(m)
	stop := run(t, m)
	rec.waitFor(t, 1, "certificate obtained", "host="+host)
	first := e.mustHandshake(host, p.Roots)

	p.Stop()
	if err := m.cache.RenewManagedCertificates(t.Context()); err != nil { // due: tries, and fails
		t.Fatalf("maintenance pass: %v", err)
	}
	rec.waitFor(t, 1, "certificate order failed", "host="+host, "renewal=true")
	if leaf := e.mustHandshake(host, p.Roots); leaf.SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Errorf("serving serial %x with the CA stopped, want %x", leaf.SerialNumber, first.SerialNumber)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// certmagic runs renewals as jobs of one process-wide queue that drops a job whose name
	// ("renew_"+host) is still queued or running. A real restart is a new process; here m's failed
	// renewal job must have ended first, or m2's start-up renewal is dropped as its duplicate. The
	// queue logs "job failed" as the job returns, and forgets its name a moment after.
	rec.waitFor(t, 1, "job failed", "error=["+host+"]")

	m2, rec2 := newManager(t, p, e, storage, host)
	e.serve(m2)
	run(t, m2)
	if leaf := e.mustHandshake(host, p.Roots); leaf.SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Errorf("after a restart, serving serial %x, want %x from storage", leaf.SerialNumber, first.SerialNumber)
	}
	rec2.waitFor(t, 1, "certificate order failed", "host="+host, "renewal=true") // Run tried, and runs on
	if leaf := e.mustHandshake(host, p.Roots); leaf.SerialNumber.Cmp(first.SerialNumber) != 0 {
		t.Errorf("after a failed renewal at start, serving serial %x, want %x", leaf.SerialNumber, first.SerialNumber)
	}
}

// testHost is a host name of the test's own, different on each run: certmagic keeps some state per
// name process-wide (obtains in flight, renewal backoff), which must not carry over from one test,
// or one -count iteration, to the next.
func testHost(t *testing.T) string {
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	return fmt.Sprintf("%s-%08x.test", name, rand.Uint32())
}

// Without any CA (nothing listens at its address) and without background management (Run has
// returned at once), unknown names are refused by a map lookup: GetCertificate returns
// ErrNotManaged and storage stays empty; the challenge handler passes unknown hosts to next.
func TestUnknownNamesWithoutCA(t *testing.T) {
	storage := filepath.Join(t.TempDir(), "acme")
	m, err := New(Options{
		ACME:  &registry.ACME{CA: fmt.Sprintf("https://127.0.0.1:%d/dir", testenv.FreePort(t)), Storage: storage},
		Hosts: []string{"app.test", "*.wild.test"},
	}, slog.New(newLogRecorder(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := m.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, name := range []string{"", "other.test", "APP.TEST.", "x.wild.test", "*.wild.test"} {
		if _, err := m.GetCertificate(&tls.ClientHelloInfo{ServerName: name}); !errors.Is(err, ErrNotManaged) {
			t.Errorf("GetCertificate(%q) error = %v, want ErrNotManaged", name, err)
		}
	}
	if got := snapshot(t, storage); got != "" {
		t.Errorf("storage after refusals:\n%s\nwant empty", got)
	}
	var passed []string
	h := m.HTTPChallengeHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { passed = append(passed, r.Host+r.URL.Path) }))
	for _, target := range []string{"http://other.test/.well-known/acme-challenge/t", "http://app.test/", "http://app.test/.well-known/acme-challenge/t"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, target, nil))
	}
	if want := []string{"other.test/.well-known/acme-challenge/t", "app.test/"}; strings.Join(passed, " ") != strings.Join(want, " ") {
		t.Errorf("passed to next: %q, want %q", passed, want)
	}
}

// snapshot lists every file under dir with its size and modification time.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		lines = append(lines, fmt.Sprintf("%s %d %s", path, info.Size(), info.ModTime().Format(time.RFC3339Nano)))
		return nil
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// counterValues gathers reg and returns activator_tls_acme_failures_total by "host operation", and
// activator_tls_acme_failing by "host failing".
func counterValues(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch mf.GetName() {
			case "activator_tls_acme_failures_total":
				out[labels["host"]+" "+labels["operation"]] = m.GetCounter().GetValue()
			case "activator_tls_acme_failing":
				out[labels["host"]+" failing"] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// The failures counter has both operations of every managed host from 0; a failed order (pebble
// validates at ports where nothing listens) counts under obtain, a failed renewal (the CA stopped)
// under renew, and either sets the host's failing gauge, which a success clears; a host removed loses
// its series. CertificateExpiries tells a managed host's NotAfter once
// its certificate is in memory, and nothing before.
func TestMetrics(t *testing.T) {
	t.Parallel()
	e := newEdge(t)
	nowhere := testenv.FreePort(t)
	bad := pebbletest.Start(t, pebbletest.Config{HTTPPort: nowhere, TLSPort: nowhere})
	host := testHost(t)
	reg := prometheus.NewRegistry()
	rec := newLogRecorder(t)
	m, err := New(Options{
		ACME:       &registry.ACME{CA: bad.Directory, Storage: t.TempDir(), CARoot: bad.CARoot},
		Hosts:      []string{host},
		HTTPAddr:   e.httpLn.Addr().String(),
		TLSAddr:    e.tlsLn.Addr().String(),
		Registerer: reg,
	}, slog.New(rec))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := counterValues(t, reg), map[string]float64{host + " obtain": 0, host + " renew": 0, host + " failing": 0}; !maps.Equal(got, want) {
		t.Errorf("before Run: %v, want %v", got, want)
	}
	e.serve(m)
	stop := run(t, m)
	rec.waitFor(t, 1, "certificate order failed", "host="+host, "renewal=false")
	if got := counterValues(t, reg); got[host+" obtain"] < 1 || got[host+" renew"] != 0 || got[host+" failing"] != 1 {
		t.Errorf("after a failed order: %v, want obtain at least 1, renew 0, failing", got)
	}
	if got := m.CertificateExpiries(); len(got) != 0 {
		t.Errorf("expiries with no certificate obtained: %v", got)
	}
	m.SetHosts(nil)
	if got := counterValues(t, reg); len(got) != 0 {
		t.Errorf("after the host was removed: %v, want no series", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	p := pebbletest.Start(t, pebbletest.Config{HTTPPort: e.httpPort(), TLSPort: e.tlsPort(), Validity: time.Minute})
	good := testHost(t)
	reg2 := prometheus.NewRegistry()
	rec2 := newLogRecorder(t)
	m2, err := New(Options{
		ACME:       &registry.ACME{CA: p.Directory, Storage: t.TempDir(), CARoot: p.CARoot},
		Hosts:      []string{good},
		HTTPAddr:   e.httpLn.Addr().String(),
		TLSAddr:    e.tlsLn.Addr().String(),
		Registerer: reg2,
	}, slog.New(rec2))
	if err != nil {
		t.Fatal(err)
	}
	e.serve(m2)
	run(t, m2)
	rec2.waitFor(t, 1, "certificate obtained", "host="+good, "renewal=false")
	leaf := e.mustHandshake(good, p.Roots)
	if got, want := counterValues(t, reg2), map[string]float64{good + " obtain": 0, good + " renew": 0, good + " failing": 0}; !maps.Equal(got, want) {
		t.Errorf("after the certificate was obtained: %v, want %v", got, want)
	}
	if got := m2.CertificateExpiries(); len(got) != 1 || !got[good].Equal(leaf.NotAfter) {
		t.Errorf("expiries %v, want %s: %v (the served leaf's)", got, good, leaf.NotAfter)
	}
	p.Stop()
	if err := m2.cache.RenewManagedCertificates(t.Context()); err != nil { // due: tries, and fails
		t.Fatalf("maintenance pass: %v", err)
	}
	rec2.waitFor(t, 1, "certificate order failed", "host="+good, "renewal=true")
	if got := counterValues(t, reg2); got[good+" renew"] < 1 || got[good+" obtain"] != 0 || got[good+" failing"] != 1 {
		t.Errorf("after a failed renewal: %v, want renew at least 1, obtain 0, failing", got)
	}
}
