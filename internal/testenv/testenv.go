// Package testenv decides what a test does when something it needs from the host (a systemd manager,
// QEMU, a guest image) is missing: skip with the reason, or fail when ACTIVATOR_INTEGRATION=required
// (as .ci/run sets), so CI cannot pass by skipping.
package testenv

import (
	"bytes"
	crand "crypto/rand"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"

	"github.com/activator/activator/internal/registry"
)

// Required reports whether integration dependencies are mandatory in this run.
func Required() bool { return os.Getenv("ACTIVATOR_INTEGRATION") == "required" }

// Missing skips t with the reason, or fails it when integration tests are required.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if Required() {
		t.Fatalf("ACTIVATOR_INTEGRATION=required, but: "+format, args...)
	}
	t.Skipf("skipping: "+format+" (set ACTIVATOR_INTEGRATION=required to make this a failure)", args...)
}

// FreeAddrs returns n addresses on ip whose TCP ports were free a moment ago, each a different one:
// all n are held until the last is bound.
func FreeAddrs(t testing.TB, ip string, n int) []string {
	t.Helper()
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Fatalf("no free port on %s: %v", ip, err)
		}
		defer ln.Close() // held until all are bound: no port twice
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs
}

// FreeLoopbackAddr returns a TCP address whose port was free a moment ago, on a random address of
// 127.0.0.0/8 (all of it is loopback on Linux). A free port on 127.0.0.1 alone is released before the
// tenant binds it, and other test packages running at the same time (or a benchmark on the box) may
// take it meanwhile: QEMU then fails to set up its host forwarding, or a health gate passes against
// another test's server. Across the 16 million addresses, a collision is left to chance alone.
func FreeLoopbackAddr(t testing.TB) string {
	t.Helper()
	var b [3]byte
	if _, err := crand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	ip := fmt.Sprintf("127.%d.%d.%d", 1+int(b[0])%254, b[1], 1+int(b[2])%254)
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatalf("no free port on %s: %v", ip, err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// FreeTCP returns a loopback TCP upstream nothing listens on (a port that was free a moment ago).
func FreeTCP(t testing.TB) registry.Upstream {
	t.Helper()
	return registry.Upstream{Network: "tcp", Address: fmt.Sprintf("127.0.0.1:%d", FreePort(t))}
}

// SyncBuffer is a bytes.Buffer safe for concurrent writes and reads: a log sink or a child's output
// that goroutines write while the test reads it.
type SyncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
