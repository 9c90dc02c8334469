package activator

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"
)

// smallSendBuffer gives each accepted TCP connection an 8 KiB send buffer, so that a server's
// writes wait for the client's reads instead of filling megabytes of kernel buffer.
type smallSendBuffer struct{ net.Listener }

func (l smallSendBuffer) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(8 << 10)
	}
	return c, err
}

// dialSmall dials addr with a 4 KiB receive buffer.
func dialSmall(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sendServer serves, on Listener with sendTimeout, GET /big (size bytes) and GET /own (the same after
// setting a write deadline of its own, own from now), reporting each answer's write error on the
// returned channel (nil when it was written whole).
func sendServer(t *testing.T, sendTimeout, own time.Duration, size int) (string, <-chan error) {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 4)
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/own" {
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(own))
		}
		w.Header().Set("Content-Length", fmt.Sprint(size))
		chunk := make([]byte, 32<<10)
		for left := size; left > 0; left -= len(chunk) {
			if _, err := w.Write(chunk[:min(left, len(chunk))]); err != nil {
				done <- err
				return
			}
		}
		done <- http.NewResponseController(w).Flush()
	}), ConnContext: ConnContext}
	go hs.Serve(Listener(smallSendBuffer{raw}, sendTimeout))
	t.Cleanup(func() { hs.Close() })
	return raw.Addr().String(), done
}

func waitWrite(t *testing.T, done <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(patience):
		t.Fatalf("%s: the answer's write still blocked after %v", what, patience)
		return nil
	}
}

// TestListenerBoundsStalledWrites: edge.send_timeout, kept by Listener's connections. An answer to a
// client that reads nothing fails its write once the timeout passes; before, it blocked for ever,
// holding the request and its route's upstream slot. A write deadline a handler set itself is kept
// to, not replaced. And the bound is on progress, not on the whole answer: a client that reads
// steadily but slowly gets all of an answer that takes longer than the timeout.
func TestListenerBoundsStalledWrites(t *testing.T) {
	t.Run("stalled", func(t *testing.T) {
		addr, done := sendServer(t, 200*time.Millisecond, 0, 64<<20)
		c := dialSmall(t, addr)
		fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
		if err := waitWrite(t, done, "a client that reads nothing"); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a client that reads nothing: %v, want the write deadline exceeded", err)
		}
	})
	t.Run("a handler's own deadline", func(t *testing.T) {
		addr, done := sendServer(t, time.Hour, 200*time.Millisecond, 64<<20)
		c := dialSmall(t, addr)
		fmt.Fprintf(c, "GET /own HTTP/1.1\r\nHost: x\r\n\r\n")
		if err := waitWrite(t, done, "the handler's own deadline"); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("with the handler's own deadline: %v, want it exceeded", err)
		}
	})
	t.Run("slow but steady", func(t *testing.T) {
		// 2 MiB read 8 KiB every 20 ms takes over 5 s, more than twice the 2 s timeout; each 16 KiB
		// piece is taken within about 40 ms of being written.
		const size = 2 << 20
		addr, done := sendServer(t, 2*time.Second, 0, size)
		c := dialSmall(t, addr)
		fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReaderSize(c, 8<<10), nil)
		if err != nil {
			t.Fatal(err)
		}
		start, n := time.Now(), int64(0)
		buf := make([]byte, 8<<10)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			m, err := io.ReadFull(resp.Body, buf)
			n += int64(m)
			if err != nil {
				break
			}
			<-tick.C
		}
		if n != size {
			t.Fatalf("a slow but steady client got %d bytes of %d", n, size)
		}
		if err := waitWrite(t, done, "a slow but steady client"); err != nil {
			t.Fatalf("a slow but steady client: %v", err)
		}
		if took := time.Since(start); took < 2*time.Second {
			t.Logf("the answer took only %v: this run did not outlast the timeout", took)
		}
	})
}
