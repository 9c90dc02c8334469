package upstream

import (
	"net/http"
	"strings"
	"testing"
)

// TestAppendForwardingFieldsMatchesBothPaths: the loop's forwarding fields are the ones both of the
// client's paths derive (forwarding.fields) for a request with none of its own.
func TestAppendForwardingFieldsMatchesBothPaths(t *testing.T) {
	for _, tc := range []struct{ remote, peer, host string }{
		{"192.0.2.7:4711", "192.0.2.7", "app.test"},
		{"[2001:db8::1]:80", "2001:db8::1", "app.test:8080"},
		{"", "", "app.test"},
	} {
		r := &http.Request{Host: tc.host, RemoteAddr: tc.remote, Header: http.Header{}}
		f := newForwarding(r, nil)
		var want strings.Builder
		f.fields(func(name, value string) { want.WriteString(name + ": " + value + "\r\n") })
		if got := string(AppendForwardingFields(nil, tc.peer, tc.host)); got != want.String() {
			t.Errorf("peer %q host %q:\n got %q\nwant %q", tc.peer, tc.host, got, want.String())
		}
	}
}

// TestPlainAnswerFields: the export passes on what take would put in the header, hop-by-hop fields
// left out, and turns away what parse turns away.
func TestPlainAnswerFields(t *testing.T) {
	b := []byte("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\nX-A:  1 \r\n\r\nhi")
	var p PlainAnswer
	if !p.Parse(b) {
		t.Fatal("a plain head was not parsed")
	}
	if p.Status() != 200 || p.ContentLength() != 2 || string(b[p.HeadLen():]) != "hi" {
		t.Fatalf("status %d length %d rest %q", p.Status(), p.ContentLength(), b[p.HeadLen():])
	}
	var got []string
	p.Fields(b, func(n, v []byte) { got = append(got, string(n)+"="+string(v)) })
	if want := "content-type=text/plain Content-Length=2 X-A=1"; strings.Join(got, " ") != want {
		t.Errorf("fields %q, want %q", strings.Join(got, " "), want)
	}
	if p.Parse([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")) {
		t.Error("a chunked head was taken for plain")
	}
}
