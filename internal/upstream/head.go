package upstream

// The answer heads the fast path reads without http.ReadResponse: the plain ones that make up nearly
// all warm traffic. Any other head is left in the buffer for http.ReadResponse, which decides.

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// maxHeadFields is the most fields a head parsed here may have; one with more goes to
// http.ReadResponse.
const maxHeadFields = 32

// plainHead is a parsed answer head: offsets into the head's bytes, until it is taken (take).
type plainHead struct {
	n      int // length of the head, the final CRLF included
	status int
	length int64 // Content-Length
	fields int
	name   [maxHeadFields][2]uint16 // start and end of each field's name
	value  [maxHeadFields][2]uint16 // start and end of each field's value, trimmed
	canon  [maxHeadFields]bool      // the name is in canonical form
	hop    [maxHeadFields]bool      // a hop-by-hop field: not passed on
}

// parsePlain parses the answer head at the start of b, the reader's buffered bytes, when it is a
// plain one: HTTP/1.1, a status from 200 to 599 other than 204 and 304, to a GET or OPTIONS (not a
// HEAD), framed by exactly one valid Content-Length, without Transfer-Encoding, Connection, Trailer
// or Pragma (whose handling http.ReadResponse owns), every line ending in CRLF, no line folded, every
// field name a token and every value made of the bytes net/textproto accepts, at most
// maxHeadFields fields. For such a head http.ReadResponse returns the same status, fields (in the
// same order, values trimmed alike) and length: FuzzPlainHeadMatchesReadResponse holds it to that.
// It reports false for every other head, and for one not yet wholly buffered.
func (h *plainHead) parse(b []byte, method string) bool {
	if method != http.MethodGet && method != http.MethodOptions {
		return false
	}
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 || end+4 > 1<<16-1 {
		return false
	}
	b = b[:end+2] // every line with its CRLF
	line, rest, _ := bytes.Cut(b, []byte("\r\n"))
	// "HTTP/1.1 200" and an optional " reason".
	if len(line) < 12 || string(line[:9]) != "HTTP/1.1 " || len(line) > 12 && line[12] != ' ' {
		return false
	}
	code := 0
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return false
		}
		code = code*10 + int(c-'0')
	}
	if code < 200 || code > 599 || code == http.StatusNoContent || code == http.StatusNotModified {
		return false
	}
	for _, c := range line[12:] {
		if !validValueByte(c) {
			return false
		}
	}
	h.status, h.length, h.fields = code, -1, 0
	off := len(line) + 2
	for len(rest) > 0 {
		line, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		start := off
		off += len(line) + 2
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || h.fields == maxHeadFields {
			return false // no name (a folded line starts with a space, which no name has), or too many
		}
		canon, upper := true, true
		for _, c := range line[:colon] {
			if !validNameByte(c) {
				return false
			}
			if upper && 'a' <= c && c <= 'z' || !upper && 'A' <= c && c <= 'Z' {
				canon = false
			}
			upper = c == '-'
		}
		v := line[colon+1:]
		for _, c := range v {
			if !validValueByte(c) {
				return false
			}
		}
		vs, ve := colon+1, len(line)
		for vs < ve && (line[vs] == ' ' || line[vs] == '\t') {
			vs++
		}
		for ve > vs && (line[ve-1] == ' ' || line[ve-1] == '\t') {
			ve--
		}
		i := h.fields
		h.fields++
		h.name[i] = [2]uint16{uint16(start), uint16(start + colon)}
		h.value[i] = [2]uint16{uint16(start + vs), uint16(start + ve)}
		h.canon[i], h.hop[i] = canon, false
		name := line[:colon]
		switch {
		case asciiEqualFold(string(name), "Content-Length"):
			if h.length >= 0 {
				return false // a second one: http.ReadResponse checks that they agree
			}
			n, err := strconv.ParseUint(string(line[vs:ve]), 10, 63)
			if err != nil || ve == vs || line[vs] == '+' {
				return false
			}
			h.length = int64(n)
		case asciiEqualFold(string(name), "Transfer-Encoding"), asciiEqualFold(string(name), "Connection"),
			asciiEqualFold(string(name), "Trailer"), asciiEqualFold(string(name), "Pragma"):
			return false
		default:
			h.hop[i] = hopByHopName(name)
		}
	}
	if h.length < 0 {
		return false // a body read to the close
	}
	h.n = end + 4
	return true
}

// take puts the head's fields into dst, as writeAnswer would from http.ReadResponse's answer: its
// hop-by-hop fields left out, each name's values (in order) replacing what dst had under it. It
// makes one string of the head and one slice of all values, and discards the head from br.
func (h *plainHead) take(br *bufio.Reader, dst http.Header) {
	b, _ := br.Peek(h.n)
	s := string(b)
	_, _ = br.Discard(h.n)
	vals := make([]string, h.fields)
	used := 0
	var done [maxHeadFields]bool
	for i := range h.fields {
		if done[i] || h.hop[i] {
			continue
		}
		name := s[h.name[i][0]:h.name[i][1]]
		if !h.canon[i] {
			name = http.CanonicalHeaderKey(name)
		}
		first := used
		for j := i; j < h.fields; j++ {
			if j == i || !done[j] && !h.hop[j] && h.sameName(s, i, j) {
				done[j] = true
				vals[used] = s[h.value[j][0]:h.value[j][1]]
				used++
			}
		}
		dst[name] = vals[first:used:used]
	}
}

// hopByHopName reports whether name, in any ASCII case, is one of hopByHop's fields (parse has turned
// away Connection, Trailer and Transfer-Encoding already).
func hopByHopName(name []byte) bool {
	for _, k := range [...]string{"Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Upgrade"} {
		if asciiEqualFold(string(name), k) {
			return true
		}
	}
	return false
}

// sameName reports whether fields i and j have the same name, in any ASCII case.
func (h *plainHead) sameName(s string, i, j int) bool {
	return asciiEqualFold(s[h.name[i][0]:h.name[i][1]], s[h.name[j][0]:h.name[j][1]])
}

// validNameByte reports a token byte (RFC 9110 5.6.2), as net/textproto accepts in a name.
func validNameByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return c < 0x80 && strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// validValueByte reports a byte net/textproto accepts in a field value: VCHAR, SP, HTAB and
// obs-text (0x80 and above).
func validValueByte(c byte) bool {
	return c == '\t' || 0x20 <= c && c != 0x7f
}

// fixedBody is the body of an answer whose head parse took: Content-Length bytes from the
// connection's reader.
type fixedBody struct {
	br   *bufio.Reader
	left int64
}

func (f *fixedBody) Read(p []byte) (int, error) {
	if f.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > f.left {
		p = p[:f.left]
	}
	n, err := f.br.Read(p)
	f.left -= int64(n)
	switch {
	case f.left == 0:
		return n, io.EOF
	case err == io.EOF:
		return n, io.ErrUnexpectedEOF // as http.ReadResponse's body: the answer was cut
	}
	return n, err
}

func (f *fixedBody) Close() error { return nil }
