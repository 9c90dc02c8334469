package activator

// Benchmarks of issue 14 §1 and §2 (docs/benchmarks.md, "Waiting page and Server-Timing"):
//
//	go test -run '^$' -bench 'WaitingPage|ServeHTTP|ServerTiming' -benchmem ./internal/activator

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
)

// BenchmarkWaitingPage: a browser navigation to a sleeping route (its wake never ends), answered with
// the waiting page: in process (ServeHTTP into a recorder), and to the first byte over a loopback
// connection kept alive, as a browser sees it.
func BenchmarkWaitingPage(b *testing.B) {
	be := &fakeBackend{wakeGate: make(chan struct{})}
	b.Cleanup(func() { close(be.wakeGate) })
	s := benchServer(b, 1, registry.Upstream{Network: "tcp", Address: "127.0.0.1:1"}, be)
	req := navigation("r0.test", "/cart?item=42")
	b.Run("recorder", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			w := httptest.NewRecorder()
			s.ServeHTTP(w, req)
			if w.Code != http.StatusServiceUnavailable {
				b.Fatalf("status %d", w.Code)
			}
		}
	})
	b.Run("first-byte", func(b *testing.B) {
		edge := httptest.NewServer(s)
		b.Cleanup(edge.Close)
		conn, err := net.Dial("tcp", edge.Listener.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		br := bufio.NewReader(conn)
		r := req.Clone(req.Context())
		r.RequestURI, r.URL.Scheme, r.URL.Host = "", "", ""
		b.ReportAllocs()
		var first time.Duration
		for b.Loop() {
			start := time.Now()
			if err := r.Write(conn); err != nil {
				b.Fatal(err)
			}
			if _, err := br.Peek(1); err != nil {
				b.Fatal(err)
			}
			first += time.Since(start)
			resp, err := http.ReadResponse(br, r)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
				b.Fatalf("status %d, %v", resp.StatusCode, err)
			}
			resp.Body.Close()
		}
		b.ReportMetric(float64(first.Microseconds())/float64(b.N), "µs-to-first-byte")
	})
}

// BenchmarkServeHTTPBrowser: BenchmarkServeHTTP's warm request, sent as a browser navigation: on an
// awake route the waiting page costs its one atomic load, and Server-Timing nothing.
func BenchmarkServeHTTPBrowser(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	b.Cleanup(up.Close)
	s := benchServer(b, 1, registry.Upstream{Network: "tcp", Address: up.Listener.Addr().String()}, &fakeBackend{})
	if err := s.instance("r0").wakeNow(context.Background()); err != nil {
		b.Fatal(err)
	}
	req := navigation("r0.test", "/")
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		if w.Code != http.StatusOK || w.Header().Get("Server-Timing") != "" {
			b.Fatalf("status %d, Server-Timing %q", w.Code, w.Header().Get("Server-Timing"))
		}
	}
}

// BenchmarkServerTimingHeld: what a held request pays for its Server-Timing and wake id (the wake's
// phases are rendered once per wake, not per request).
func BenchmarkServerTimingHeld(b *testing.B) {
	att := &attempt{done: make(chan struct{}), rec: newTracker("r0", "fake", triggerRequest, time.Now),
		timing: timingEntries([]PhaseRecord{{Name: "spawn", Duration: 2040 * time.Millisecond}, {Name: "health", Duration: 12 * time.Millisecond}})}
	close(att.done)
	b.ReportAllocs()
	for b.Loop() {
		c := holdCharge{heldFor: 2041 * time.Millisecond, wake: att}
		w := c.writer(&statusWriter{ResponseWriter: httptest.NewRecorder()})
		w.WriteHeader(http.StatusOK)
	}
}
