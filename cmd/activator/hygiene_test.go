package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// rawAnswer is one answer read off a raw connection; close is its "Connection: close" (which
// http.ReadResponse takes out of the header).
type rawAnswer struct {
	reply
	close bool
}

// pipeline sends raw (one request or several) on a new connection to the harness's edge and reads
// every answer until the edge closes the connection, or until it has read want answers. It reports
// whether the connection was closed after the last answer read.
func pipeline(t *testing.T, h *harness, raw string, want int) (answers []rawAnswer, closed bool) {
	t.Helper()
	c, err := net.Dial("tcp", h.edgeAddr)
	if err != nil {
		t.Fatal(err)
	}
	return pipelineOn(t, c, raw, want)
}

// pipelineOn is pipeline on a connection already made (a TLS one, say), which it closes.
func pipelineOn(t *testing.T, c net.Conn, raw string, want int) (answers []rawAnswer, closed bool) {
	t.Helper()
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(patience)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	for len(answers) < want {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
				return answers, true
			}
			t.Fatalf("after %d answers: %v", len(answers), err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("answer %d: %v", len(answers)+1, err)
		}
		answers = append(answers, rawAnswer{reply{code: resp.StatusCode, header: resp.Header, body: string(body)}, resp.Close})
	}
	return answers, false
}

// TestContentLengthWithTransferEncoding: on the edge as serve() wires it, a request with both
// Content-Length and Transfer-Encoding reaches the tenant framed by its chunks (RFC 9112 §6.1), is
// answered with "Connection: close", and the request pipelined after it is never answered: the
// connection is closed. A chunked request without Content-Length keeps its connection.
func TestContentLengthWithTransferEncoding(t *testing.T) {
	app := appRoute{Name: "framing"}
	h := newHarness(t, configYAML(t, app))
	const (
		clte    = "POST /echo HTTP/1.1\r\nHost: framing.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
		chunked = "POST /echo HTTP/1.1\r\nHost: framing.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
		next    = "GET / HTTP/1.1\r\nHost: framing.test\r\n\r\n"
	)

	answers, closed := pipeline(t, h, clte+next, 2)
	if len(answers) != 1 || !closed {
		t.Fatalf("CL+TE then a pipelined GET: %d answers (%+v), closed %v; want the first answered, then the connection closed", len(answers), answers, closed)
	}
	if a := answers[0]; a.code != http.StatusOK || a.body != "hello" || !a.close {
		t.Errorf("CL+TE answer: %d %q, Connection: close %v; want 200 %q with Connection: close", a.code, a.body, a.close, "hello")
	}

	answers, closed = pipeline(t, h, chunked+next, 2)
	if len(answers) != 2 || closed {
		t.Fatalf("chunked then a pipelined GET: %d answers, closed %v; want both answered on one connection", len(answers), closed)
	}
	if answers[0].body != "hello" || answers[0].close || answers[1].code != http.StatusOK {
		t.Errorf("chunked, then GET: %+v", answers)
	}
}

// TestEdgeRefusalsSpawnNothing: on the edge as serve() wires it, CONNECT and TRACE get 501 and an
// encoded slash gets 400, and no tenant is spawned.
func TestEdgeRefusalsSpawnNothing(t *testing.T) {
	app := appRoute{Name: "refuse"}
	h := newHarness(t, configYAML(t, app))
	for _, tc := range []struct {
		raw  string
		code int
	}{
		{"CONNECT refuse.test:443 HTTP/1.1\r\nHost: refuse.test:443\r\n\r\n", http.StatusNotImplemented},
		{"TRACE / HTTP/1.1\r\nHost: refuse.test\r\n\r\n", http.StatusNotImplemented},
		{"GET /a%2F..%2F..%2Fb HTTP/1.1\r\nHost: refuse.test\r\n\r\n", http.StatusBadRequest},
	} {
		answers, _ := pipeline(t, h, tc.raw, 1)
		if len(answers) != 1 || answers[0].code != tc.code {
			t.Errorf("%s: %+v, want %d", strings.Fields(tc.raw)[0], answers, tc.code)
		}
	}
	if spawns := h.spawns(app.Name); len(spawns) != 0 {
		t.Errorf("requests refused at the edge spawned %v", spawns)
	}
	if st := h.status(app.Name); st.State != "asleep" {
		t.Errorf("route %s is %s, want asleep", app.Name, st.State)
	}
}
