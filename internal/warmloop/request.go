package warmloop

// The request heads the loop serves itself (Parse) and the head it sends upstream for one
// (AppendUpstreamHead).
//
// Parse need not be complete, only never wrong about what it accepts: anything it does not accept
// goes back to net/http with every byte, and is served as before. So it accepts only heads that
// net/http reads one way, that the edge's hygiene (internal/activator/hygiene.go) leaves as they are,
// and whose upstream head is the fast path's (upstream's writeHead) with the fields in their order:
//
//   - GET only: the loop's answer reader frames an answer to a GET (upstream.PlainAnswer); a HEAD's
//     answer has no body after its Content-Length, other methods may carry a body, and OPTIONS may
//     ask for "*".
//   - HTTP/1.1 exactly: HTTP/1.0 has other persistence rules and needs no Host.
//   - Origin form: an absolute-form target is routed by its own host, not Host (RFC 9112 §3.2.2).
//   - Path bytes of RFC 3986's pchar and no '%': the path is then its own decoding, so no "%2F" or
//     "%2E" exists to read two ways and url.URL's Path is the bytes sent. No "." or ".." segment:
//     hygiene would rewrite the path (cleanPath) before routing.
//   - Query bytes of RFC 3986's query: no byte that parsers split on, drop or re-escape each their own
//     way (space, '"', '#', '\', obs-text), and no '%' but one that starts an escape, which decoders
//     would each read their own way.
//   - CRLF only (a bare LF ends a line for some parsers and not for others: smuggling), no obs-fold
//     (RFC 9112 §5.2: net/http joins the lines, others refuse them), no space before a field's colon
//     (RFC 9112 §5.1: must be refused), names of token bytes.
//   - Values of visible ASCII with single SP or HTAB inside: no controls (NUL, CR) and no obs-text
//     (bytes ≥ 0x80, which readers decode as UTF-8 or Latin-1); no runs of whitespace, which RFC 2616
//     let any recipient fold into one SP.
//   - At most MaxFields fields: Request has room for that many, and Parse allocates nothing.
//   - Exactly one Host (RFC 9112 §3.2: more is a 400), not empty (a route needs a name), of
//     plainHost's bytes: the fast path sends those unchanged (any such Host is also valid for
//     httpguts.ValidHostHeader, which net/http's server checks).
//   - Hop-by-hop fields describe the client's connection, and some change the framing or the
//     protocol (Transfer-Encoding, Upgrade, "Te: trailers", which writeHead passes on): back, except
//     one "Connection: keep-alive", which HTTP/1.1 clients send and which changes nothing in it.
//   - Content-Length (even 0), Expect: a body, its framing and the 100-continue handshake are
//     net/http's (the edge's framing record, activator.Listener, sees only the bytes net/http reads).
//   - HTTP2-Settings: part of an h2c upgrade, which hygiene takes off the request.
//   - The forwarding fields and upstream's clientField names: whether a client's own are believed
//     (a trusted proxy's) or dropped is upstream's forwarding to decide; AppendForwardingFields
//     assumes there are none.
//   - A name with '_' that reads as a name in this list (User-Agent and Cache-Control included)
//     once each '_' is a '-': upstream drops such aliases of the forwarding fields (forwardedAlias),
//     which CGI-style gateways read as the real ones ("X_Forwarded_For"); the others are too rare to
//     be worth telling apart.
//   - User-Agent empty or twice: writeHead sends the first one alone and none when it is empty, as
//     Request.Write; the loop passes fields as they came.
//   - "Pragma: no-cache" (the first Pragma) without Cache-Control: net/http adds
//     "Cache-Control: no-cache" to the request's header (fixPragmaCacheControl), which the fast path
//     then sends.

import (
	"math"

	"github.com/activator/activator/internal/upstream"
)

// Parse parses the request head at the start of b, a connection's buffered bytes. It returns
// (Parsed, n) for a head the loop serves, b[:n] through the CRLF of the empty line, with req filled
// in (offsets into req.Head, which is b[:n]); (More, 0) while b is shorter than maxHead and breaks
// none of the rules above (so every proper prefix of a head it serves is More); (HandBack, 0) for
// anything else, including a head that is not whole within b's first maxHead bytes. HandBack is
// final: no bytes added to b change it. A maxHead over 65535 counts as 65535: Field's offsets are
// uint16. req is undefined after More or HandBack. Parse does not allocate.
func Parse(b []byte, maxHead int, req *Request) (Result, int) {
	maxHead = max(0, min(maxHead, math.MaxUint16))
	res, n := parse(b[:min(len(b), maxHead)], req)
	if res == More && len(b) >= maxHead {
		return HandBack, 0
	}
	return res, n
}

// parse is Parse without the limit. Each rule is checked as soon as the bytes so far break it (a dot
// segment once its segment ends, a second Host at its colon, a Host byte as it comes), so that More
// never stands for bytes that will be handed back whatever follows, and HandBack is final. Only the
// empty line settles the rules about fields that are missing (Host, Cache-Control after
// "Pragma: no-cache"); until then More may stand for a head that can no longer take them.
func parse(b []byte, req *Request) (Result, int) {
	const start = "GET /"
	if len(b) < len(start) {
		if string(b) == start[:len(b)] {
			return More, 0
		}
		return HandBack, 0
	}
	if string(b[:len(start)]) != start {
		return HandBack, 0
	}

	// The target: a path, then maybe a query.
	i := len(start)
	seg := i // where the path's current segment starts
	for ; ; i++ {
		if i == len(b) {
			return More, 0
		}
		c := b[i]
		if c == '/' || c == '?' || c == ' ' {
			if s := b[seg:i]; len(s) == 1 && s[0] == '.' || len(s) == 2 && s[0] == '.' && s[1] == '.' {
				return HandBack, 0
			}
			if c != '/' {
				break
			}
			seg = i + 1
		} else if class[c]&pathByte == 0 {
			return HandBack, 0
		}
	}
	pathEnd := i
	if b[i] == '?' {
		for i++; ; {
			if i == len(b) {
				return More, 0
			}
			c := b[i]
			if c == ' ' {
				break
			}
			if c == '%' {
				for k := 1; k <= 2; k++ {
					if i+k == len(b) {
						return More, 0
					}
					if class[b[i+k]]&hexDigit == 0 {
						return HandBack, 0
					}
				}
				i += 3
				continue
			}
			if class[c]&queryByte == 0 {
				return HandBack, 0
			}
			i++
		}
	}
	targetEnd := i
	const proto = " HTTP/1.1\r\n"
	if rest := b[i:]; len(rest) < len(proto) {
		if string(rest) == proto[:len(rest)] {
			return More, 0
		}
		return HandBack, 0
	} else if string(rest[:len(proto)]) != proto {
		return HandBack, 0
	}
	i += len(proto)

	// The fields.
	var (
		lines                      int  // field lines so far
		host, keepAlive, userAgent bool // seen
		pragmaSeen, pragmaNoCache  bool // a Pragma seen; the first one's value is "no-cache"
		cacheControl               bool // a Cache-Control seen
		hostStart, hostEnd         int
	)
	req.N = 0
	for {
		if i == len(b) {
			return More, 0
		}
		if b[i] == '\r' {
			if i+1 == len(b) {
				return More, 0
			}
			if b[i+1] != '\n' {
				return HandBack, 0
			}
			i += 2
			break
		}
		if lines == MaxFields {
			return HandBack, 0
		}
		lines++

		// The name, up to its colon. A line starting with SP or HTAB (obs-fold), a bare LF and a
		// space before the colon all stop here as a byte that is neither a token's nor ':'.
		ns := i
		for i < len(b) && class[b[i]]&tokenByte != 0 {
			i++
		}
		if i == len(b) {
			return More, 0
		}
		if b[i] != ':' || i == ns {
			return HandBack, 0
		}
		ne := i
		kind := fieldKind(b[ns:ne])
		if kind == refused ||
			kind == hostField && host || kind == connectionField && keepAlive || kind == userAgentField && userAgent {
			return HandBack, 0
		}

		// The value: OWS, visible bytes with single SP or HTAB between them, OWS, CRLF.
		for i++; i < len(b) && (b[i] == ' ' || b[i] == '\t'); i++ {
		}
		vs, ve := i, i // ve is past the last visible byte
		for ; i < len(b); i++ {
			c := b[i]
			if c == ' ' || c == '\t' {
				continue
			}
			if c < 0x21 || c > 0x7e {
				break
			}
			if i-ve > 1 {
				return HandBack, 0 // a run of whitespace inside the value
			}
			ve = i + 1
		}
		whole := false // the line's CRLF is in b
		if i < len(b) {
			if b[i] != '\r' || i+1 < len(b) && b[i+1] != '\n' {
				return HandBack, 0
			}
			whole = i+1 < len(b)
		}
		value := b[vs:ve]
		switch kind {
		case hostField:
			if !plainHost(value) || whole && len(value) == 0 {
				return HandBack, 0
			}
		case connectionField:
			if !prefixFold(value, "keep-alive") || whole && len(value) != len("keep-alive") {
				return HandBack, 0
			}
		case userAgentField:
			if whole && len(value) == 0 {
				return HandBack, 0
			}
		}
		if !whole {
			return More, 0
		}
		i += 2

		switch kind {
		case hostField:
			host, hostStart, hostEnd = true, vs, ve
			continue
		case connectionField:
			keepAlive = true
			continue
		case userAgentField:
			userAgent = true
		case pragmaField:
			if !pragmaSeen {
				pragmaSeen, pragmaNoCache = true, string(value) == "no-cache"
			}
		case cacheControlField:
			cacheControl = true
		}
		req.Fields[req.N] = Field{Name: [2]uint16{uint16(ns), uint16(ne)}, Value: [2]uint16{uint16(vs), uint16(ve)}}
		req.N++
	}
	if !host || pragmaNoCache && !cacheControl {
		return HandBack, 0
	}
	req.Head = b[:i]
	req.Target = b[len("GET "):targetEnd]
	req.Path = b[len("GET "):pathEnd]
	req.Host = b[hostStart:hostEnd]
	return Parsed, i
}

// AppendUpstreamHead appends to dst the head of the request the upstream is sent for req (Parsed)
// from the client at peer (its IP; "" for none): the request line, Host, req's passed fields in their
// order with canonical names (http.CanonicalHeaderKey's form), and the forwarding fields
// (upstream.AppendForwardingFields, for a request over plain HTTP). It is the head the fast path
// writes for the same request but for the order of the fields, which writeHead takes from a map: the
// fast path's forwarding depends on whether the peer is a trusted proxy only for fields that Parse
// hands back.
//
// The string of the host that AppendForwardingFields takes is kept in req and made again only when
// the host changes: a Request reused for a connection's requests, which nearly always name one host,
// costs one allocation a connection, not one a request.
func AppendUpstreamHead(dst []byte, req *Request, peer string) []byte {
	dst = append(dst, "GET "...)
	dst = append(dst, req.Target...)
	dst = append(dst, " HTTP/1.1\r\nHost: "...)
	dst = append(dst, req.Host...)
	dst = append(dst, "\r\n"...)
	for _, f := range req.Fields[:req.N] {
		dst = appendCanonical(dst, req.Head[f.Name[0]:f.Name[1]])
		dst = append(dst, ": "...)
		dst = append(dst, req.Head[f.Value[0]:f.Value[1]]...)
		dst = append(dst, "\r\n"...)
	}
	// The forwarding fields depend on the peer and the Host alone: made once for a connection's
	// requests while both stay the same (each making costs an address parse and a few allocations).
	if req.hostString != string(req.Host) || req.fwdPeer != peer || req.fwd == nil {
		req.hostString, req.fwdPeer = string(req.Host), peer
		req.fwd = upstream.AppendForwardingFields(req.fwd[:0], peer, req.hostString)
	}
	dst = append(dst, req.fwd...)
	return append(dst, "\r\n"...)
}

// appendCanonical appends the field name (token bytes) in textproto.CanonicalMIMEHeaderKey's form:
// upper case at the start and after each '-', lower case elsewhere. Writing each byte as it goes
// costs nothing more than copying it, so a name already canonical and one that is not are alike.
func appendCanonical(dst, name []byte) []byte {
	upper := true
	for _, c := range name {
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		} else if !upper && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
		upper = c == '-'
	}
	return dst
}

// What Parse makes of a field by its name.
type kind uint8

const (
	plainField kind = iota // passed on as it came
	refused                // the request goes back
	hostField
	connectionField
	userAgentField
	pragmaField
	cacheControlField
)

// fieldKind returns the kind of the field named name (token bytes), in any case. A name with '_' that
// names a field of another kind once its '_' are read as '-' is refused: upstream drops such aliases
// of its forwarding fields (forwardedAlias), and the others are rare enough to leave to net/http.
func fieldKind(name []byte) kind {
	var buf [len("x-original-forwarded-for")]byte // the longest name of kind other than plainField
	if len(name) > len(buf) {
		return plainField
	}
	underscore := false
	for i, c := range name {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		underscore = underscore || c == '_'
		buf[i] = c
	}
	k := namedKind(buf[:len(name)])
	if k != plainField || !underscore {
		return k
	}
	for i, c := range buf[:len(name)] {
		if c == '_' {
			buf[i] = '-'
		}
	}
	if namedKind(buf[:len(name)]) != plainField {
		return refused
	}
	return plainField
}

// namedKind returns the kind of the lower-case name.
func namedKind(name []byte) kind {
	switch string(name) {
	case "host":
		return hostField
	case "connection":
		return connectionField
	case "user-agent":
		return userAgentField
	case "pragma":
		return pragmaField
	case "cache-control":
		return cacheControlField
	case
		// upstream's hopByHop, but Connection
		"proxy-connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
		"transfer-encoding", "upgrade",
		// a body and its framing
		"content-length", "expect",
		// an h2c upgrade's
		"http2-settings",
		// the forwarding fields
		"forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto",
		// upstream's clientField
		"x-real-ip", "true-client-ip", "x-client-ip", "cf-connecting-ip", "fastly-client-ip",
		"x-cluster-client-ip", "x-forwarded", "forwarded-for", "x-original-forwarded-for",
		"x-forwarded-ssl", "x-forwarded-scheme", "front-end-https", "x-url-scheme", "x-forwarded-port",
		"x-forwarded-server", "x-forwarded-prefix":
		return refused
	}
	return plainField
}

// plainHost reports whether h has upstream's plainHost bytes only: ASCII letters, digits and
// "-._:[]".
func plainHost(h []byte) bool {
	for _, c := range h {
		if class[c]&hostByte == 0 {
			return false
		}
	}
	return true
}

// prefixFold reports whether b is a prefix of the lower-case s, in any ASCII case.
func prefixFold(b []byte, s string) bool {
	if len(b) > len(s) {
		return false
	}
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// The byte classes of Parse, as bits of class.
const (
	pathByte  = 1 << iota // RFC 3986's pchar without pct-encoded: unreserved, sub-delims, ':' and '@'
	queryByte             // pathByte, '/' and '?' ('%' is checked apart: it starts an escape)
	tokenByte             // RFC 9110's tchar
	hostByte              // upstream's plainHost: letters, digits and "-._:[]"
	hexDigit
)

// class holds each byte's classes; it is never written after its initialisation.
var class = func() (t [256]uint8) {
	set := func(bits uint8, s string) {
		for i := 0; i < len(s); i++ {
			t[s[i]] |= bits
		}
	}
	const (
		alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
		digit = "0123456789"
	)
	set(pathByte|queryByte|tokenByte|hostByte, alpha+digit)
	set(pathByte|queryByte, "-._~!$&'()*+,;=:@")
	set(queryByte, "/?")
	set(tokenByte, "!#$%&'*+-.^_`|~")
	set(hostByte, "-._:[]")
	set(hexDigit, digit+"ABCDEFabcdef")
	return t
}()
