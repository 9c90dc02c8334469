package tlsedge

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tlsedge/tlstest"
)

// Every test closes what it started: nothing may outlive the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// patience bounds every wait in these tests: an upper bound, never an expectation.
const patience = 30 * time.Second

// loadCerts writes a certificate file pair for each leaf into a fresh directory and loads them, failing
// the test on an error or a warning.
func loadCerts(t *testing.T, ca *tlstest.CA, leaves ...tlstest.Leaf) *Certs {
	t.Helper()
	dir := t.TempDir()
	var files []registry.CertFile
	for i, l := range leaves {
		files = append(files, ca.Write(t, dir, fmt.Sprint(i), l))
	}
	c, warnings, err := LoadCerts(files, time.Now())
	if err != nil || len(warnings) > 0 {
		t.Fatalf("LoadCerts: %v; warnings %q", err, warnings)
	}
	return c
}

// tlsServer is an http.Server (HTTP/1.1 and HTTP/2) serving h on a Listener of e on loopback.
type tlsServer struct {
	ln     *Listener
	srv    *http.Server
	served chan error
}

func startTLS(t *testing.T, e *Edge, lim Limits, h http.Handler) *tlsServer {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetHTTP2(true)
	s := &tlsServer{
		ln:     NewListener(raw, e.TLSConfig(), lim, slog.New(slog.DiscardHandler)),
		srv:    &http.Server{Handler: h, Protocols: &p, ReadHeaderTimeout: patience},
		served: make(chan error, 1),
	}
	go func() { s.served <- s.srv.Serve(s.ln) }()
	t.Cleanup(func() {
		_ = s.srv.Close()
		if err := <-s.served; err != http.ErrServerClosed {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

func (s *tlsServer) addr() string { return s.ln.Addr().String() }

// labelHandler answers with the label (common name) of the certificate the connection was given, and
// its protocol.
func labelHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil {
			http.Error(w, "not over TLS", http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "%s %s", r.Proto, r.TLS.ServerName)
	})
}

// client is an HTTPS client trusting ca that dials addr whatever the URL's host (the SNI is the URL's
// host). h2 offers HTTP/2 as well as HTTP/1.1. dials, when set, receives once each connection it makes is
// established. Its idle connections are closed at cleanup.
func client(t *testing.T, ca *tlstest.CA, addr string, h2 bool, dials chan<- struct{}) *http.Client {
	return ca.Client(t, addr, h2, dials, patience)
}

// get GETs url and returns the body, with the label of the certificate the server presented.
func get(c *http.Client, url string) (body, label string, err error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", "", fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b), resp.TLS.PeerCertificates[0].Subject.CommonName, nil
}

func testLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
