package upstream

// What the edge's event loop (internal/warmloop) shares with the fast path, so that the two send the
// same: the forwarding fields of a plain request, and the plain answer heads both read without
// http.ReadResponse.

import "net/http"

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
