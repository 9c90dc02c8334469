package activator

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
)

// chunkConn is a net.Conn whose reads return the chunks given, one a read, then io.EOF.
type chunkConn struct {
	net.Conn // nil: only Read is called
	chunks   [][]byte
}

func (c *chunkConn) Read(b []byte) (int, error) {
	if len(c.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(b, c.chunks[0])
	if c.chunks[0] = c.chunks[0][n:]; len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
	}
	return n, nil
}

// framingReference is what framingConn must record of a connection's bytes, said the simple way: the
// fields whose names, in any case and with their colon, begin a line (the stream's start, or after a
// '\n').
func framingReference(data []byte) uint32 {
	var seen uint32
	for _, line := range bytes.Split(data, []byte("\n")) {
		l := bytes.ToLower(line)
		if bytes.HasPrefix(l, []byte(contentLengthField)) {
			seen |= sawContentLength
		}
		if bytes.HasPrefix(l, []byte(transferEncodingField)) {
			seen |= sawTransferEncoding
		}
	}
	return seen
}

// FuzzFramingConn: however a connection's bytes are cut into reads, framingConn records what
// framingReference says of them, passes every byte on unchanged, and, on a TLS connection, fails the
// read that completes HTTP/2's preface at the connection's start (and every read after) but no other.
func FuzzFramingConn(f *testing.F) {
	f.Add([]byte("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"), []byte{3, 7, 1}, false)
	f.Add([]byte("GET / HTTP/1.1\r\nX-A: b\r\n Content-Length: 5\r\n\r\ntransfer-encoding: x\n"), []byte{1}, false)
	f.Add([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), []byte{5, 9}, true)
	f.Add([]byte("PRI * HTTP/1.1\r\nContent-Length: 0\r\n"), []byte{14}, true)
	f.Fuzz(func(t *testing.T, data, cuts []byte, overTLS bool) {
		var chunks [][]byte
		for rest := data; len(rest) > 0; {
			n := min(len(rest), 64) // a read takes at most 64 bytes (buf)
			if len(cuts) > 0 {
				n = min(n, int(cuts[0])%64+1)
				cuts = cuts[1:]
			}
			chunks = append(chunks, rest[:n])
			rest = rest[n:]
		}
		c := &framingConn{Conn: &chunkConn{chunks: chunks}}
		if overTLS {
			c.tls = &tls.ConnectionState{}
		}
		refused := overTLS && bytes.HasPrefix(data, []byte(http2Preface))
		var got []byte
		buf := make([]byte, 64)
		for range len(chunks) + 1 {
			n, err := c.Read(buf)
			if errors.Is(err, errPrefaceOverTLS) {
				if !refused || len(got) >= len(http2Preface) {
					t.Fatalf("refused after %d bytes of %q (a TLS connection: %v)", len(got), data, overTLS)
				}
				if _, err := c.Read(buf); !errors.Is(err, errPrefaceOverTLS) && err != io.EOF {
					t.Fatalf("a read after the refusal: %v, want it refused too", err)
				}
				return
			}
			got = append(got, buf[:n]...)
			if err == io.EOF {
				break
			}
		}
		if refused {
			t.Fatalf("%q over TLS: read through, want the preface refused", data)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("read %q, want %q", got, data)
		}
		if seen, want := c.seen.Load(), framingReference(data); seen != want {
			t.Fatalf("%q in %d reads: recorded %b, want %b", data, len(chunks), seen, want)
		}
	})
}
