package upstream

// What the edge's event loop (internal/warmloop) shares with the fast path, so that the two send the
// same: the forwarding fields of a plain request, and the plain answer heads both read without
// http.ReadResponse.

import (
	"bufio"
	"errors"
	"net"
	"net/http"
)

// AppendForwardingFields appends to b the forwarding field lines (each ending in CRLF) that both of
// the client's paths send upstream for a request over plain HTTP from peer (its IP; "" for none) to
// host, when the request carried no forwarding field of its own: X-Forwarded-For, X-Forwarded-Host,
// X-Forwarded-Proto and Forwarded, in that order.
func AppendForwardingFields(b []byte, peer, host string) []byte {
	f := forwarding{peer: peer, host: host, proto: "http"}
	if peer != "" {
		b = appendLine(b, "X-Forwarded-For", peer)
	}
	b = appendLine(b, "X-Forwarded-Host", host)
	b = appendLine(b, "X-Forwarded-Proto", "http")
	b = append(b, "Forwarded: "...)
	b = f.appendForwarded(b)
	return append(b, "\r\n"...)
}

func appendLine(b []byte, name, value string) []byte {
	b = append(b, name...)
	b = append(b, ": "...)
	b = append(b, value...)
	return append(b, "\r\n"...)
}

// PlainAnswer is an answer head to a GET that the fast path would read itself (plainHead.parse says
// which: HTTP/1.1, a status from 200 to 599 other than 204 and 304, exactly one Content-Length, no
// Transfer-Encoding, Connection, Trailer or Pragma, every line strict). Its offsets point into the
// bytes it was parsed from.
type PlainAnswer struct{ h plainHead }

// Parse parses the answer head at the start of b, reporting false for any head that is not plain or
// not yet whole.
func (p *PlainAnswer) Parse(b []byte) bool { return p.h.parse(b, http.MethodGet) }

// HeadLen is the head's length, its final CRLF included.
func (p *PlainAnswer) HeadLen() int { return p.h.n }

// Status is the answer's status code.
func (p *PlainAnswer) Status() int { return p.h.status }

// ContentLength is the answer's body length.
func (p *PlainAnswer) ContentLength() int64 { return p.h.length }

// Fields calls f for each field the client is given (every field but the hop-by-hop ones), in the
// order they came, with the name as sent and the value trimmed; b is what Parse parsed.
func (p *PlainAnswer) Fields(b []byte, f func(name, value []byte)) {
	for i := range p.h.fields {
		if p.h.hop[i] {
			continue
		}
		f(b[p.h.name[i][0]:p.h.name[i][1]], b[p.h.value[i][0]:p.h.value[i][1]])
	}
}

// Finish passes on the answer to r, a request the edge's loop sent on conn and whose answer it does
// not relay itself, as Serve's fast path would pass it on: answer is what the loop read of it. The
// answer's head is bounded by Options.ResponseTimeout afresh from here. conn joins the pool's
// connections if the pool has room for it, and is closed otherwise.
func (c *Client) Finish(w http.ResponseWriter, r *http.Request, conn net.Conn, answer []byte) {
	uc := NewConn(&prefixed{Conn: conn, prefix: answer})
	select {
	case c.pool.slots <- struct{}{}:
	default:
		_ = conn.Close()
		c.onError(w, r, errors.New("the upstream connection pool is full"))
		return
	}
	resp, err := c.pool.read(r, uc, func(*bufio.Writer) {}, c.got1xx(w), w.Header())
	if err != nil {
		c.pool.discard(uc)
		c.onError(w, r, err)
		return
	}
	c.writeAnswer(w, r, resp)
}

// Fail answers r, a request the edge's loop sent upstream and whose exchange failed before the
// answer's head was whole, as Serve answers a failed exchange of its own: through
// Options.ErrorHandler, so that the client is told the same and the log throttled the same.
func (c *Client) Fail(w http.ResponseWriter, r *http.Request, err error) { c.onError(w, r, err) }

// prefixed is a connection whose first bytes were read already: prefix, then the connection.
type prefixed struct {
	net.Conn
	prefix []byte
}

func (p *prefixed) Read(b []byte) (int, error) {
	if len(p.prefix) == 0 {
		return p.Conn.Read(b)
	}
	n := copy(b, p.prefix)
	p.prefix = p.prefix[n:]
	return n, nil
}

// TellUnasked tells Options.OnUnasked of a connection to the upstream closed for bytes no request
// asked for, which the edge's loop found on one of its own.
func (c *Client) TellUnasked() { c.pool.tellUnasked() }
