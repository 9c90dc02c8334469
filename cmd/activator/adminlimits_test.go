package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// getOK sends GET / for host to the edge at addr on a connection of its own and fails t, naming what,
// unless the answer is 200 within patience.
func getOK(t *testing.T, addr, host, what string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	req.Host = host
	resp, err := (&http.Client{Timeout: patience, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatalf("%s: edge request: %v", what, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: edge answered %d, want 200", what, resp.StatusCode)
	}
}

// adminHealthz sends GET /healthz on c, a connection to the admin API at addr.
func adminHealthz(t *testing.T, c net.Conn, addr string) {
	t.Helper()
	if _, err := fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", addr); err != nil {
		t.Fatalf("admin request: %v", err)
	}
}

// TestAdminIdleConnectionClosed: an admin connection idle for admin_keepalive_timeout after its
// answer is closed by the activator. Before the key, the admin server had no idle timeout at all, and
// a connection left open after one request stayed for the process's life.
func TestAdminIdleConnectionClosed(t *testing.T) {
	s := startServed(t, "admin_keepalive_timeout: 200ms\n"+configYAML(t, appRoute{Name: "idle"}))
	c, err := net.Dial("tcp", s.admin)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	adminHealthz(t, c, s.admin)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("admin answer: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %d", resp.StatusCode)
	}
	// Now idle: the next read ends when the activator closes the connection. The deadline only stops
	// a failing test from hanging.
	_ = c.SetReadDeadline(time.Now().Add(patience))
	n, err := br.Read(make([]byte, 1))
	if !errors.Is(err, io.EOF) {
		t.Fatalf("an idle admin connection: read %d bytes, %v; want it closed by the activator (EOF)", n, err)
	}
}

// TestAdminConnectionCapKeepsTheEdge: admin connections are capped at admin_max_conns, so that they
// cannot take the file descriptors the edge needs. The activator runs with a file limit that 40 more
// connections would exhaust; 60 admin connections are opened, each with a request, and left open, as a
// local process (a tenant too: the admin API listens on loopback) can do without any token. Measured on
// the commit before this test: the activator accepted admin connections until accept4 failed with
// EMFILE, and the edge then accepted nothing ("too many open files; retrying in 1s" for as long as
// the connections stayed). Now exactly admin_max_conns are answered, the edge keeps answering, a
// warning names the key, and each closed admin connection lets one waiting connection in.
func TestAdminConnectionCapKeepsTheEdge(t *testing.T) {
	const max, hogs = 8, 60
	app := appRoute{Name: "capped"}
	s := startServed(t, fmt.Sprintf("admin_max_conns: %d\n", max)+configYAML(t, app))
	edgeGet := func(what string) { t.Helper(); getOK(t, s.edge, app.host(), what) }
	edgeGet("before") // wakes the tenant, whose pipes and connections then count among the open files

	pid := s.cmd.Process.Pid
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	limit := uint64(len(fds) + 40)
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: limit}, nil); err != nil {
		t.Fatalf("cannot lower the activator's open-file limit: %v", err)
	}

	answered := make(chan int, hogs)
	conns := make([]net.Conn, hogs)
	for i := range conns {
		c, err := net.Dial("tcp", s.admin)
		if err != nil {
			t.Fatalf("admin connection %d: %v (the kernel's accept queue holds the ones not accepted)", i, err)
		}
		conns[i] = c
		defer c.Close()
		adminHealthz(t, c, s.admin)
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err == nil {
				resp.Body.Close()
				answered <- i
			}
		}()
	}
	got := map[int]bool{}
	waitAnswered := func(n int) {
		t.Helper()
		deadline := time.NewTimer(patience)
		defer deadline.Stop()
		for len(got) < n {
			select {
			case i := <-answered:
				got[i] = true
			case <-deadline.C:
				t.Fatalf("%d admin connections answered within %v, want %d", len(got), patience, n)
			}
		}
	}
	waitAnswered(max)
	edgeGet("with the admin API at its cap")
	// None was closed, so no more than max may have been answered. The edge's round trip above gave
	// an uncapped listener ample time to answer more.
	for drained := false; !drained; {
		select {
		case i := <-answered:
			got[i] = true
		default:
			drained = true
		}
	}
	if len(got) != max {
		t.Fatalf("%d admin connections answered with none closed, want admin_max_conns = %d", len(got), max)
	}
	s.waitLogged(adminCapMsg, 1)

	// Closing admitted connections lets waiting ones in, one for one.
	closed := 0
	for i, c := range conns {
		if got[i] && closed < 4 {
			c.Close()
			closed++
		}
	}
	waitAnswered(max + closed)
	edgeGet("after")
}
