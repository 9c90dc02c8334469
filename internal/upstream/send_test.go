package upstream

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// tcpPair is both ends of a loopback TCP connection, closed at cleanup.
func tcpPair(t *testing.T) (client, srv net.Conn) {
	t.Helper()
	ln := listen(t)
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	srv, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return client, srv
}

// TestSendAwaitingFullSocket: a request whose last bytes meet a full socket buffer (sendFD's EAGAIN)
// is written whole by the blocking path, and the answer is read: the upstream gets the request's
// bytes exactly once, in order. The connection then carries a second request, sent whole at once and
// followed by the wait (sendFD asking for it). The socket buffer is filled before the exchange, and
// the upstream reads only once sendFD has had its first turn.
func TestSendAwaitingFullSocket(t *testing.T) {
	client, srv := tcpPair(t)
	_ = client.(*net.TCPConn).SetWriteBuffer(4096)
	_ = srv.(*net.TCPConn).SetReadBuffer(4096)

	// Fill the client's side until the kernel takes no more.
	fill := 0
	raw, _ := client.(*net.TCPConn).SyscallConn()
	junk := bytes.Repeat([]byte{'j'}, 1024)
	_ = raw.Write(func(fd uintptr) bool {
		for range 10000 {
			n, err := syscall.Write(int(fd), junk)
			if n > 0 {
				fill += n
			}
			if err != nil {
				return true
			}
		}
		return true
	})
	if fill == 0 {
		t.Fatal("the socket buffer took nothing")
	}

	head := "GET /x HTTP/1.1\r\nHost: a\r\nX-Pad: " + strings.Repeat("p", 3000) + "\r\n\r\n"
	c := NewConn(client)
	var (
		turns  []bool // what each exchange's first sendFD turn returned (true: the wait is not wanted)
		first  = true
		turned = make(chan struct{}, 2)
	)
	c.sendFn = func(fd uintptr) bool {
		done := c.sendFD(fd)
		if first {
			first = false
			turns = append(turns, done && len(c.pending) > 0)
			turned <- struct{}{}
		}
		return done
	}
	type result struct {
		code int
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, _, err := c.Get([]byte(head))
		if err != nil {
			got <- result{err: err}
			return
		}
		_, err = io.Copy(io.Discard, resp.Body)
		got <- result{resp.StatusCode, err}
	}()

	<-turned
	br := bufio.NewReader(srv)
	if _, err := io.CopyN(io.Discard, br, int64(fill)); err != nil {
		t.Fatal(err)
	}
	req, err := http.ReadRequest(br)
	if err != nil {
		t.Fatalf("the request did not arrive whole: %v", err)
	}
	if len(req.Header.Get("X-Pad")) != 3000 || req.URL.Path != "/x" {
		t.Fatalf("request mangled: %s %q", req.URL.Path, req.Header.Get("X-Pad")[:10])
	}
	if _, err := io.WriteString(srv, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.err != nil || r.code != 200 {
		t.Fatalf("answer: %d %v", r.code, r.err)
	}
	if br.Buffered() != 0 {
		t.Fatalf("%d bytes more than the request", br.Buffered())
	}

	// The same connection carries the next request.
	first = true
	go func() {
		resp, _, err := c.Get([]byte("GET /y HTTP/1.1\r\nHost: a\r\n\r\n"))
		if err != nil {
			got <- result{err: err}
			return
		}
		_, err = io.Copy(io.Discard, resp.Body)
		got <- result{resp.StatusCode, err}
	}()
	<-turned
	req, err = http.ReadRequest(br)
	if err != nil || req.URL.Path != "/y" {
		t.Fatalf("second request: %v", err)
	}
	_, _ = io.WriteString(srv, "HTTP/1.1 204 No Content\r\n\r\n")
	if r := <-got; r.err != nil || r.code != 204 {
		t.Fatalf("second answer: %d %v", r.code, r.err)
	}
	if len(turns) != 2 || !turns[0] || turns[1] {
		t.Fatalf("first turns (true: part left for the blocking path) = %v, want [true false]", turns)
	}
}

// TestGetThenAnswer: a Get whose deadline cuts the wait after the request went out reports waiting,
// and Answer, after a new deadline, reads the answer the upstream sends later; the request reaches the
// upstream once. A Get cut while the answer's head is half read does not report waiting.
func TestGetThenAnswer(t *testing.T) {
	client, srv := tcpPair(t)
	c := NewConn(client)
	br := bufio.NewReader(srv)

	// The deadline is set once the upstream has the request: the wait for the answer ends.
	type result struct {
		resp    *http.Response
		waiting bool
		err     error
	}
	got := make(chan result, 1)
	go func() {
		resp, waiting, err := c.Get([]byte("GET /late HTTP/1.1\r\nHost: a\r\n\r\n"))
		got <- result{resp, waiting, err}
	}()
	req, err := http.ReadRequest(br)
	if err != nil || req.URL.Path != "/late" {
		t.Fatalf("the upstream read %v, %v; want GET /late", req, err)
	}
	_ = c.SetDeadline(time.Unix(1, 0))
	if r := <-got; r.err == nil || !r.waiting || r.resp != nil {
		t.Fatalf("Get cut by its deadline = %v, waiting %v, %v; want a timeout while waiting", r.resp, r.waiting, r.err)
	}
	_ = c.SetDeadline(time.Time{})
	if _, err := io.WriteString(srv, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
		t.Fatal(err)
	}
	resp, _, err := c.Answer()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("Answer = %v, %v; want the late 200", resp, err)
	}
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "ok" {
		t.Fatalf("body %q, %v", b, err)
	}
	if n := br.Buffered(); n != 0 {
		t.Errorf("the upstream got %d bytes more than one request", n)
	}

	// Half an answer's head, then the deadline: not waiting (the answer is spoiled). Over a pipe, so
	// that the upstream's write returns only once the client has read the half head.
	pc, ps := net.Pipe()
	defer pc.Close()
	defer ps.Close()
	c = NewConn(pc)
	go func() {
		resp, waiting, err := c.Get([]byte("GET /again HTTP/1.1\r\nHost: a\r\n\r\n"))
		got <- result{resp, waiting, err}
	}()
	if _, err := http.ReadRequest(bufio.NewReader(ps)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(ps, "HTTP/1.1 200 OK\r\nContent-"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Unix(1, 0))
	if r := <-got; r.err == nil || r.waiting {
		t.Fatalf("Get cut mid-head: waiting %v, %v; want an error without waiting", r.waiting, r.err)
	}
}
