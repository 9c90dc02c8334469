package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// plainHeads are answer heads (and what follows them in the buffer), each with whether plainHead
// takes it for a GET; FuzzPlainHeadMatchesReadResponse starts from them.
var plainHeads = []struct {
	name, head string
	plain      bool
}{
	{"net/http's answer", "HTTP/1.1 200 OK\r\nContent-Length: 19\r\nContent-Type: text/plain; charset=utf-8\r\nDate: Tue, 01 Dec 2026 14:00:00 GMT\r\n\r\nhello from demoapp\n", true},
	{"no reason", "HTTP/1.1 404\r\nContent-Length: 0\r\n\r\n", true},
	{"names in odd cases, repeated, values trimmed", "HTTP/1.1 418 I'm a teapot\r\ncontent-length: 2\r\nx-a: 1\r\nX-A:\t2 \r\nSET-COOKIE: a=b\r\nX-Empty:\r\n\r\nhi", true},
	{"obs-text and a tab in a value", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nX-T: caf\xc3\xa9\tau lait\r\n\r\nx", true},
	{"hop-by-hop fields", "HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nContent-Length: 1\r\nProxy-Authenticate: Basic\r\nUpgrade: h2c\r\nTe: trailers\r\nX-Keep: 1\r\n\r\nx", true},
	{"a body that looks like a head", "HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", true},
	{"leading zeros in the length", "HTTP/1.1 200 OK\r\nContent-Length: 0003\r\n\r\nabc", true},
	{"short body", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", true},
	{"HTTP/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", false},
	{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n", false},
	{"no length", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nx", false},
	{"two lengths", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", false},
	{"bad length", "HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\nx", false},
	{"empty length", "HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\nx", false},
	{"Connection", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx", false},
	{"Pragma", "HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 1\r\n\r\nx", false},
	{"Trailer", "HTTP/1.1 200 OK\r\nTrailer: X-Sum\r\nContent-Length: 1\r\n\r\nx", false},
	{"204", "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", false},
	{"304", "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n", false},
	{"1xx", "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false},
	{"folded line", "HTTP/1.1 200 OK\r\nX-A: 1\r\n 2\r\nContent-Length: 0\r\n\r\n", false},
	{"bare LF", "HTTP/1.1 200 OK\nContent-Length: 0\n\n", false},
	{"bare LF inside", "HTTP/1.1 200 OK\r\nX-A: 1\nContent-Length: 0\r\n\r\n", false},
	{"space before the colon", "HTTP/1.1 200 OK\r\nX-A : 1\r\nContent-Length: 0\r\n\r\n", false},
	{"control byte in a value", "HTTP/1.1 200 OK\r\nX-A: 1\x01\r\nContent-Length: 0\r\n\r\n", false},
	{"two spaces after the version", "HTTP/1.1  200 OK\r\nContent-Length: 0\r\n\r\n", false},
	{"status without a space", "HTTP/1.1 200OK\r\nContent-Length: 0\r\n\r\n", false},
	{"incomplete head", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n", false},
}

func TestPlainHead(t *testing.T) {
	for _, tc := range plainHeads {
		t.Run(tc.name, func(t *testing.T) {
			var h plainHead
			if got := h.parse([]byte(tc.head), http.MethodGet); got != tc.plain {
				t.Errorf("parse = %v, want %v", got, tc.plain)
			}
			checkPlainHead(t, []byte(tc.head), http.MethodGet)
		})
	}
	var h plainHead
	if h.parse([]byte(plainHeads[0].head), http.MethodHead) {
		t.Error("parse took the answer to a HEAD")
	}
}

// TestPlainHeadReplaces: the fields taken replace what the client's header had under their names, as
// writeAnswer does with http.ReadResponse's, and leave the others.
func TestPlainHeadReplaces(t *testing.T) {
	head := "HTTP/1.1 200 OK\r\nServer-Timing: app;dur=1\r\nContent-Length: 0\r\nserver-timing: db;dur=2\r\n\r\n"
	var h plainHead
	if !h.parse([]byte(head), http.MethodGet) {
		t.Fatal("not taken")
	}
	dst := http.Header{"Server-Timing": {"hold;dur=3"}, "Activator-Wake-Id": {"w1"}}
	br := bufio.NewReader(strings.NewReader(head))
	_, _ = br.Peek(len(head))
	h.take(br, dst)
	want := http.Header{"Server-Timing": {"app;dur=1", "db;dur=2"}, "Activator-Wake-Id": {"w1"}, "Content-Length": {"0"}}
	if !reflect.DeepEqual(dst, want) || br.Buffered() != 0 {
		t.Errorf("got %v (%d bytes left), want %v", dst, br.Buffered(), want)
	}
	// The values are capped: adding to one name must not overwrite the next.
	dst["Server-Timing"] = append(dst["Server-Timing"], "x")
	if got := dst["Content-Length"]; !reflect.DeepEqual(got, []string{"0"}) {
		t.Errorf("Content-Length became %q", got)
	}
}

// checkPlainHead: when plainHead takes b's head, http.ReadResponse reads it alike: the same status,
// fields (those writeAnswer passes on), length, head length and body.
func checkPlainHead(t *testing.T, b []byte, method string) {
	t.Helper()
	var h plainHead
	if !h.parse(b, method) {
		return
	}
	br := bufio.NewReaderSize(bytes.NewReader(b), 1<<17)
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%q: taken, but http.ReadResponse: %v", b, err)
	}
	if n := len(b) - br.Buffered(); n != h.n {
		t.Errorf("%q: head of %d bytes, http.ReadResponse read %d", b, h.n, n)
	}
	if resp.StatusCode != h.status || resp.ContentLength != h.length || resp.Close || resp.TransferEncoding != nil || resp.Trailer != nil {
		t.Errorf("%q: status %d length %d; http.ReadResponse: %d, %d, close %v, transfer %v, trailer %v",
			b, h.status, h.length, resp.StatusCode, resp.ContentLength, resp.Close, resp.TransferEncoding, resp.Trailer)
	}
	removeHopByHop(resp.Header)
	ours := bufio.NewReaderSize(bytes.NewReader(b), 1<<17)
	_, _ = ours.Peek(len(b))
	got := http.Header{}
	h.take(ours, got)
	if !reflect.DeepEqual(got, resp.Header) {
		t.Errorf("%q: fields\n  taken:             %q\n  http.ReadResponse: %q", b, got, resp.Header)
	}
	fb := &fixedBody{br: ours, left: h.length}
	gotBody, gotErr := io.ReadAll(fb)
	wantBody, wantErr := io.ReadAll(resp.Body)
	if !bytes.Equal(gotBody, wantBody) || !errors.Is(gotErr, io.ErrUnexpectedEOF) != !errors.Is(wantErr, io.ErrUnexpectedEOF) {
		t.Errorf("%q: body %q %v, http.ReadResponse's %q %v", b, gotBody, gotErr, wantBody, wantErr)
	}
}

// FuzzPlainHeadMatchesReadResponse: every answer head plainHead takes, http.ReadResponse reads alike.
func FuzzPlainHeadMatchesReadResponse(f *testing.F) {
	for _, tc := range plainHeads {
		f.Add([]byte(tc.head), http.MethodGet)
	}
	f.Add([]byte(plainHeads[0].head), http.MethodOptions)
	f.Fuzz(func(t *testing.T, b []byte, method string) {
		checkPlainHead(t, b, method)
	})
}
