package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/activator/activator/internal/backend/exec"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tlsedge"
)

// The generated TLS config passes the activator's own validation, and its certificate loads as the
// activator loads it and carries the names the experiment connects with.
func TestHTTPSConfigValidates(t *testing.T) {
	now := time.Now()
	c, err := writeBenchCert(t.TempDir(), now)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := addTLS(renderConfig(18080, 19090, []routeSpec{{name: "cold-tls", hosts: []string{"cold-tls.localhost"}, port: 20001, argv: []string{self, "app"}}}), 18443, c)
	conf, err := registry.Load([]byte(cfg), map[string]registry.SettingsDecoder{"exec": exec.Decode})
	if err != nil {
		t.Fatalf("generated config rejected: %v\n%s", err, cfg)
	}
	if conf.ListenTLS != "127.0.0.1:18443" || len(conf.TLS.Certificates) != 1 {
		t.Fatalf("listen_tls %q, %d certificates; want 127.0.0.1:18443, 1", conf.ListenTLS, len(conf.TLS.Certificates))
	}
	certs, warnings, err := tlsedge.LoadCerts(conf.TLS.Certificates, now)
	if err != nil || len(warnings) > 0 {
		t.Fatalf("LoadCerts: %v, warnings %q", err, warnings)
	}
	for _, h := range []string{"localhost", "cold-tls.localhost"} {
		if !certs.Covers(h) {
			t.Errorf("the certificate does not cover %s", h)
		}
	}
	leaf := certs.Default().Leaf
	if k, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("key %T, want ECDSA P-256", leaf.PublicKey)
	}
	if len(leaf.IPAddresses) != 1 || leaf.IPAddresses[0].String() != "127.0.0.1" {
		t.Errorf("IP SANs %v, want 127.0.0.1", leaf.IPAddresses)
	}
	// HAProxy's crt file: the certificate and its key in one PEM file.
	combined, err := os.ReadFile(c.combined)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(combined, combined); err != nil {
		t.Errorf("combined PEM: %v", err)
	}
}

// The handshake loop stops at its count bound, and every connection is a full handshake the server
// sees, with the pinned certificate.
func TestHandshakeLoop(t *testing.T) {
	c, err := writeBenchCert(t.TempDir(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			accepted.Add(1)
		}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()

	const max = 40
	r := handshakeLoop(context.Background(), addr, "localhost", clientTLS(c.der, "localhost"), 4, time.Minute, max)
	if r.Handshakes != max || r.Errors != 0 || r.Resumed != 0 {
		t.Errorf("handshakes %d, errors %d (%s), resumed %d; want %d, 0, 0", r.Handshakes, r.Errors, r.FirstError, r.Resumed, max)
	}
	if got := accepted.Load(); got != max {
		t.Errorf("the server accepted %d connections, want %d", got, max)
	}
	if r.Negotiated == "" || !(r.P50us > 0) || r.P99us < r.P50us {
		t.Errorf("negotiated %q, p50 %v µs, p99 %v µs", r.Negotiated, r.P50us, r.P99us)
	}

	// A server with another certificate fails the pin.
	other := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	other.Config.ErrorLog = log.New(io.Discard, "", 0) // its failed handshakes are the point
	other.StartTLS()
	t.Cleanup(other.Close)
	r = handshakeLoop(context.Background(), other.Listener.Addr().String(), "localhost", clientTLS(c.der, "localhost"), 1, time.Minute, 3)
	if r.Handshakes != 0 || r.Errors != 3 {
		t.Errorf("against another certificate: handshakes %d, errors %d; want 0, 3", r.Handshakes, r.Errors)
	}
}

func TestCPUTimes(t *testing.T) {
	busy, total, err := cpuTimes("0")
	if err != nil {
		t.Skipf("no /proc/stat: %v", err)
	}
	if total == 0 || busy > total {
		t.Errorf("busy %d, total %d", busy, total)
	}
	if _, _, err := cpuTimes("99999"); err == nil {
		t.Error("cpuTimes found a CPU that does not exist")
	}
}
