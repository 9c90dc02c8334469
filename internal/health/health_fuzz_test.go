package health

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
)

// fuzzProbeTimeout is the probe timeout in FuzzProbe: short, since an answer that never ends takes
// all of it, and no input can pass by timing out.
const fuzzProbeTimeout = 20 * time.Millisecond

// FuzzProbe has a tenant answer a probe with any bytes, over a real unix socket, then close the
// connection, or (with hang) keep it open until the prober closes it. keep asks for the keep-alive
// probe that WaitConn makes; lo and hi make the status range (100-599). The prober must not panic, must
// return (well within a bound far beyond the probe timeout: a hung probe fails the run), and must not
// report healthy unless the answer begins with a status line (after any informational answers) whose
// code is in the range.
func FuzzProbe(f *testing.F) {
	dir, err := os.MkdirTemp("", "hf") // short: a socket path has about 100 bytes
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "s")
	f.Fuzz(func(t *testing.T, answer []byte, hang, keep bool, lo, hi uint16) {
		if len(answer) > 4096 {
			t.Skip("longer than any input this needs, and slow to minimize")
		}
		minStatus, maxStatus := 100+int(lo)%500, 100+int(hi)%500
		if minStatus > maxStatus {
			minStatus, maxStatus = maxStatus, minStatus
		}
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan struct{})
		go func() {
			defer close(served)
			serveAnswer(ln, answer, hang)
		}()
		p := New(registry.Upstream{Network: "unix", Address: sock}, registry.Health{
			Path: "/healthz", MinStatus: minStatus, MaxStatus: maxStatus, Timeout: fuzzProbeTimeout,
		})
		type result struct {
			c   net.Conn
			err error
		}
		done := make(chan result, 1)
		go func() {
			c, _, err := p.probeConn(context.Background(), keep, false)
			done <- result{c, err}
		}()
		var res result
		select {
		case res = <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("probe still running 10s after it began, with a %v timeout; answer %q", fuzzProbeTimeout, answer)
		}
		if res.c != nil {
			res.c.Close()
		}
		ln.Close()
		<-served

		if res.err != nil {
			return
		}
		code, ok := finalStatus(answer)
		switch {
		case !ok:
			t.Fatalf("healthy (status %d-%d) on an answer that does not begin with a status line: %q", minStatus, maxStatus, answer)
		case code < minStatus || code > maxStatus:
			t.Fatalf("healthy (status %d-%d) on an answer with status %d: %q", minStatus, maxStatus, code, answer)
		}
		if res.c != nil && !keep {
			t.Errorf("probe kept its connection without being asked to")
		}
	})
}

// serveAnswer accepts one connection on ln, reads the probe's request head, writes answer and closes
// the connection, or with hang waits for the prober to close it first.
func serveAnswer(ln net.Listener, answer []byte, hang bool) {
	c, err := ln.Accept()
	if err != nil {
		return
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		if line == "\r\n" {
			break
		}
	}
	if _, err := c.Write(answer); err != nil {
		return
	}
	if hang {
		_, _ = io.Copy(io.Discard, br)
	}
}

// statusLineRE is a status line as an HTTP/1.1 client reads one: a version, spaces, a three-digit
// code, then the end of the line or a space and a reason. A line ends at LF, with or without CR.
var statusLineRE = regexp.MustCompile(`^HTTP/[0-9]\.[0-9] +([0-9]{3})(?: [^\n]*|\r)?\n`)

// finalStatus returns the code of the answer's final status line: its first, or the first after the
// heads of informational (1xx) answers, which end at an empty line. ok is false when the answer does
// not begin so.
func finalStatus(answer []byte) (code int, ok bool) {
	rest := answer
	for {
		m := statusLineRE.FindSubmatch(rest)
		if m == nil {
			return 0, false
		}
		code, _ = strconv.Atoi(string(m[1]))
		if code < 100 || code >= 200 {
			return code, true
		}
		rest = rest[len(m[0]):]
		for {
			i := bytes.IndexByte(rest, '\n')
			if i < 0 {
				return 0, false
			}
			line := rest[:i]
			rest = rest[i+1:]
			if len(line) == 0 || string(line) == "\r" {
				break
			}
		}
	}
}
