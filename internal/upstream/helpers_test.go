package upstream

import (
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// failed is the tests' ErrorHandler: 502 and a body that names no cause, so answers of both paths
// compare equal (their errors' texts differ).
func failed(w http.ResponseWriter, _ *http.Request, _ error) {
	http.Error(w, "upstream failed", http.StatusBadGateway)
}

// newEdges returns two handlers for the upstream at addr: the Client's (fast path when it can), and
// the same Client's ReverseProxy alone.
func newEdges(t testing.TB, addr string) (fast, slow http.HandlerFunc) {
	c := New(Options{Network: "tcp", Address: addr, MaxConns: 16, ErrorHandler: failed, TrustedProxy: testTrusted})
	t.Cleanup(c.CloseIdle)
	return c.Serve, c.proxy.ServeHTTP
}

// testTrusted trusts the proxies of the tests: peers in 192.0.2.0/24 and 2001:db8::/32 (documentation
// addresses; a test sets them as the request's RemoteAddr), never 127.0.0.1.
func testTrusted(peer netip.Addr) bool {
	return netip.MustParsePrefix("192.0.2.0/24").Contains(peer) || netip.MustParsePrefix("2001:db8::/32").Contains(peer)
}

// quietLog discards a test server's log (the ReverseProxy's and net/http's complaints).
func quietLog() *log.Logger { return log.New(io.Discard, "", 0) }

// rawUpstream accepts connections on a loopback listener and serves each with serve (n counts them
// from 0) in a goroutine of its own, until the test ends: then it closes the listener and every
// connection, and waits for the goroutines. It returns the listener's address.
func rawUpstream(t *testing.T, serve func(c net.Conn, n int)) string {
	t.Helper()
	ln := listen(t)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		open []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Go(func() { serve(c, n) })
		}
	})
	return ln.Addr().String()
}
