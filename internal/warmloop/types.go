// Package warmloop is the edge's event loop for warm keep-alive traffic: HTTP/1.1 connections that
// net/http has vetted and the edge has handed over, served by one epoll loop per thread, each socket
// read once per readiness and each answer written once, the shape of HAProxy's (docs/architecture.md,
// "The warm path's event loop"). It serves only a strict subset of requests (Parse) to awake routes,
// and hands a connection back to net/http, with every byte it has read, for anything else.
package warmloop

// MaxFields is the most header fields a request the loop serves may have (Host included); a request
// with more is handed back.
const MaxFields = 32

// Request is a request head the loop serves itself, as Parse read it: offsets into Head.
type Request struct {
	Head   []byte // the head, from the request line to the CRLF of the empty line
	Target []byte // the request-target, origin form, within Head
	Path   []byte // Target up to its '?', within Head
	Host   []byte // the Host field's value, trimmed, within Head
	// The fields passed on upstream, in the order they came: every field but Host and a
	// "Connection: keep-alive" (the only Connection field Parse accepts).
	Fields [MaxFields]Field
	N      int // Fields in use

	hostString string // string(Host) as AppendUpstreamHead last made it, reused while Host is the same
	fwdPeer    string // the peer AppendUpstreamHead last made fwd for
	fwd        []byte // the forwarding field lines for hostString and fwdPeer
}

// Field is one header field of a Request: offsets into its Head of the name (as sent) and the value
// (trimmed of its surrounding spaces and tabs).
type Field struct {
	Name, Value [2]uint16
}

// Result is what Parse made of a connection's buffered bytes.
type Result int

const (
	// More: no whole head yet, and nothing seen so far that the loop would hand back.
	More Result = iota
	// Parsed: a head the loop serves; the request is filled in.
	Parsed
	// HandBack: a request the loop does not serve (or bytes that are no request): net/http decides.
	HandBack
)

// StatusClientClosed is the status Target.End is given for a request whose client's connection the
// loop closed before the answer's head came: nginx's 499, "client closed request", which the edge's
// net/http path counts for a client that left too.
const StatusClientClosed = 499
