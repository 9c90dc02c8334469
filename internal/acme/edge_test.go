package acme

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mholt/acmez/v3"

	"github.com/activator/activator/internal/acme/pebbletest"
	"github.com/activator/activator/internal/registry"
)

var discardLog = log.New(io.Discard, "", 0)

// edge stands in for the edge's two listeners: TLS, taking certificates from the Manager, and
// plain HTTP, wrapped in its challenge handler. Both are bound before pebble starts (pebble is told
// their ports); the Manager behind them can be replaced, as across a restart.
type edge struct {
	t                  *testing.T
	tlsLn, httpLn      net.Listener
	mgr                atomic.Pointer[Manager]
	alpnHellos         atomic.Int64 // TLS-ALPN-01 hellos (acme-tls/1 only)
	httpChallenges     atomic.Int64 // requests for /.well-known/acme-challenge/ on the plain listener
	tenantHits         atomic.Int64 // requests that reached the "tenant"
	tenantChallengeHit atomic.Int64 // challenge requests that reached the tenant: must stay 0
	mu                 sync.Mutex   // guards refused
	refused            map[string]int
	once               sync.Once
}

func newEdge(t *testing.T) *edge {
	t.Helper()
	e := &edge{t: t, refused: map[string]int{}}
	var err error
	if e.tlsLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if e.httpLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.tlsLn.Close(); e.httpLn.Close() })
	return e
}

func (e *edge) tlsPort() int  { return e.tlsLn.Addr().(*net.TCPAddr).Port }
func (e *edge) httpPort() int { return e.httpLn.Addr().(*net.TCPAddr).Port }

// serve puts m behind the listeners, starting them the first time.
func (e *edge) serve(m *Manager) {
	e.mgr.Store(m)
	e.once.Do(func() {
		tenant := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			e.tenantHits.Add(1)
			if strings.HasPrefix(r.URL.Path, challengePath) {
				e.tenantChallengeHit.Add(1)
			}
			io.WriteString(w, "tenant")
		})
		plain := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, challengePath) {
				e.httpChallenges.Add(1)
			}
			e.mgr.Load().HTTPChallengeHandler(tenant).ServeHTTP(w, r)
		})
		conf := &tls.Config{GetCertificate: e.getCertificate, NextProtos: []string{"http/1.1", acmez.ACMETLS1Protocol}}
		servers := []*http.Server{{Handler: tenant, ErrorLog: discardLog}, {Handler: plain, ErrorLog: discardLog}}
		go servers[0].Serve(tls.NewListener(e.tlsLn, conf))
		go servers[1].Serve(e.httpLn)
		e.t.Cleanup(func() {
			for _, s := range servers {
				s.Close()
			}
		})
	})
}

func (e *edge) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if len(hello.SupportedProtos) == 1 && hello.SupportedProtos[0] == acmez.ACMETLS1Protocol {
		e.alpnHellos.Add(1)
	}
	c, err := e.mgr.Load().GetCertificate(hello)
	if errors.Is(err, ErrNotManaged) {
		e.mu.Lock()
		e.refused[hello.ServerName]++
		e.mu.Unlock()
	}
	return c, err
}

func (e *edge) refusals(name string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.refused[name]
}

// handshake connects to the TLS listener for host, as a client trusting roots, and returns the
// leaf the edge presented (the chain verified).
func (e *edge) handshake(host string, roots *x509.CertPool) (*x509.Certificate, error) {
	d := &tls.Dialer{Config: &tls.Config{ServerName: host, RootCAs: roots, NextProtos: []string{"http/1.1"}}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", e.tlsLn.Addr().String())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.(*tls.Conn).ConnectionState().PeerCertificates[0], nil
}

// mustHandshake is handshake that fails the test on an error.
func (e *edge) mustHandshake(host string, roots *x509.CertPool) *x509.Certificate {
	e.t.Helper()
	leaf, err := e.handshake(host, roots)
	if err != nil {
		e.t.Fatalf("handshake for %s: %v", host, err)
	}
	return leaf
}

// waitServed polls handshakes (10s at most) until host's certificate is no longer old, and returns
// the new one.
func (e *edge) waitServed(host string, roots *x509.CertPool, old *x509.Certificate) *x509.Certificate {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		leaf := e.mustHandshake(host, roots)
		if leaf.SerialNumber.Cmp(old.SerialNumber) != 0 {
			if leaf.NotAfter.Before(old.NotAfter) {
				e.t.Errorf("new certificate expires %v, before the old one's %v", leaf.NotAfter, old.NotAfter)
			}
			return leaf
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: still serving serial %x after 10s", host, old.SerialNumber)
		}
	}
}

// get fetches path from host over HTTPS through the TLS listener.
func (e *edge) get(host, path string, roots *x509.CertPool) (int, string, error) {
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{ServerName: host, RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, e.tlsLn.Addr().String())
		},
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get("https://" + host + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// newManager builds a Manager on pebble's directory for hosts, storing in storage, behind e's
// listeners; its log goes to the returned recorder.
func newManager(t *testing.T, p *pebbletest.Pebble, e *edge, storage string, hosts ...string) (*Manager, *logRecorder) {
	t.Helper()
	rec := newLogRecorder(t)
	m, err := New(Options{
		ACME:     &registry.ACME{Email: "ops@example.org", CA: p.Directory, Storage: storage, CARoot: p.CARoot},
		Hosts:    hosts,
		HTTPAddr: e.httpLn.Addr().String(),
		TLSAddr:  e.tlsLn.Addr().String(),
	}, slog.New(rec))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m, rec
}

// run runs m until the returned stop is called (or the test ends), and stop reports Run's error.
func run(t *testing.T, m *Manager) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				err = errors.New("Run did not return 10s after its context ended")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// logRecorder is an slog.Handler that keeps every record; waitFor blocks until a matching one has
// been logged. The records are logged through the test when it fails.
type logRecorder struct {
	shared *logShared
	attrs  []slog.Attr
}

type logShared struct {
	mu      sync.Mutex // guards the fields below
	lines   []string
	msgs    []string      // each line's message
	changed chan struct{} // closed and replaced on each record
}

func newLogRecorder(t *testing.T) *logRecorder {
	r := &logRecorder{shared: &logShared{changed: make(chan struct{})}}
	t.Cleanup(func() {
		if t.Failed() {
			r.shared.mu.Lock()
			t.Logf("manager log:\n%s", strings.Join(r.shared.lines, "\n"))
			r.shared.mu.Unlock()
		}
	})
	return r
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }
func (r *logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	return &logRecorder{shared: r.shared, attrs: append(append([]slog.Attr(nil), r.attrs...), as...)}
}

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s", rec.Time.Format("15:04:05.000"), rec.Level, rec.Message)
	add := func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true }
	for _, a := range r.attrs {
		add(a)
	}
	rec.Attrs(add)
	s := r.shared
	s.mu.Lock()
	s.lines = append(s.lines, b.String())
	s.msgs = append(s.msgs, rec.Message)
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	return nil
}

// count is how many records have the message msg and hold every one of parts (as key=value).
func (r *logRecorder) count(msg string, parts ...string) int {
	r.shared.mu.Lock()
	defer r.shared.mu.Unlock()
	n := 0
	for i, l := range r.shared.lines {
		if r.shared.msgs[i] == msg && containsAll(l, parts) {
			n++
		}
	}
	return n
}

// waitFor waits (30s at most) until n records have the message msg and hold every one of parts.
func (r *logRecorder) waitFor(t *testing.T, n int, msg string, parts ...string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		r.shared.mu.Lock()
		changed := r.shared.changed
		r.shared.mu.Unlock()
		if r.count(msg, parts...) >= n {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no %d log records %q with %q after 30s", n, msg, parts)
		}
	}
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s+" ", " "+p+" ") {
			return false
		}
	}
	return true
}

// plainGet sends GET path with Host host to the plain listener and returns the status code.
func (e *edge) plainGet(t *testing.T, host, path string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+e.httpLn.Addr().String()+path, nil)
	if err != nil {
		t.Error(err)
		return 0
	}
	req.Host = host
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Errorf("GET http://%s%s: %v", host, path, err)
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
