package upstream

import (
	"io"
	"log"
	"net/http"
	"net/netip"
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
