package health_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/testenv"
)

// silentServer accepts on ln one connection at a time and sends, for each, how many bytes the client
// wrote before closing it: in accept order, which is the order the connects completed in. It speaks no
// HTTP. Closed and joined at cleanup.
func silentServer(t *testing.T, ln net.Listener) <-chan int64 {
	t.Helper()
	got := make(chan int64, 100)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n, _ := io.Copy(io.Discard, c)
			c.Close()
			select {
			case got <- n:
			default:
			}
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return got
}

// listenUnix listens on a unix socket in a short-named directory (socket paths are limited to about
// 100 bytes, and t.TempDir can be longer).
func listenUnix(t *testing.T) net.Listener {
	t.Helper()
	dir, err := os.MkdirTemp("", "health")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ln, err := net.Listen("unix", filepath.Join(dir, "s"))
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// upstreamOf is the upstream that dials ln.
func upstreamOf(ln net.Listener) registry.Upstream {
	return registry.Upstream{Network: ln.Addr().Network(), Address: ln.Addr().String()}
}

// probesBefore dials up itself, writing one byte, and returns how many connections the server saw
// before that one and whether each was silent. The server takes connections in order, so this counts
// exactly the probes made before the call.
func probesBefore(t *testing.T, up registry.Upstream, got <-chan int64) (n int, silent bool) {
	t.Helper()
	c, err := up.Dial(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte{'x'}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	silent = true
	for {
		select {
		case b := <-got:
			if b == 1 {
				return n, silent
			}
			n++
			silent = silent && b == 0
		case <-time.After(time.Minute): // a safety net against a hang, far above any real run
			t.Fatal("the server never saw the test's own connection")
		}
	}
}

// TestWaitTCP: in TCP mode the gate passes after Passes connects in a row, over TCP and unix sockets,
// sends nothing on them (the upstream speaks no HTTP; path and status are not looked at), and WaitConn
// hands over no connection.
func TestWaitTCP(t *testing.T) {
	listeners := map[string]func(*testing.T) net.Listener{
		"tcp": func(t *testing.T) net.Listener {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			return ln
		},
		"unix": listenUnix,
	}
	for network, listen := range listeners {
		for _, passes := range []int{1, 3} {
			t.Run(network+"/passes="+strconv.Itoa(passes), func(t *testing.T) {
				ln := listen(t)
				got := silentServer(t, ln)
				up := upstreamOf(ln)
				p := newGate(t, up, cfg(func(h *registry.Health) { h.TCP, h.Passes, h.MinStatus, h.MaxStatus = true, passes, 204, 204 }))
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a bound, not an expectation
				defer cancel()
				c, err := p.WaitConn(ctx, nil)
				if err != nil || c != nil {
					t.Fatalf("WaitConn() = %v, %v; want a pass and no connection", c, err)
				}
				if n, silent := probesBefore(t, up, got); n != passes || !silent {
					t.Errorf("the gate made %d connects (silent: %v), want %d that send nothing", n, silent, passes)
				}
			})
		}
	}
}

// TestProbeTCPRefused: a TCP-mode probe of a port nobody listens on fails with the dial's error.
func TestProbeTCPRefused(t *testing.T) {
	err := newGate(t, testenv.FreeTCP(t), cfg(func(h *registry.Health) { h.TCP = true })).Probe(t.Context())
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Probe() against a closed port = %v, want ECONNREFUSED", err)
	}
	if err != nil && !strings.HasPrefix(err.Error(), "connect check: ") {
		t.Errorf("Probe() error %q does not say it is a connect check", err)
	}
}

// TestWaitTCPGateError: a TCP-mode gate whose budget ends reports the last connect's error.
func TestWaitTCPGateError(t *testing.T) {
	p := newGate(t, testenv.FreeTCP(t), cfg(func(h *registry.Health) { h.TCP = true }))
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	err := p.Wait(ctx, nil)
	var ge *health.GateError
	if !errors.As(err, &ge) || !errors.Is(ge.Last, syscall.ECONNREFUSED) {
		t.Fatalf("Wait() = %v, want a *GateError whose last probe was refused", err)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("GateError = %v, want it to unwrap to context.DeadlineExceeded", err)
	}
}
