package activator

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"
)

// AdminPolicy is who may use the admin API. The zero policy requires no token: fit for a loopback or
// unix-socket listener only.
type AdminPolicy struct {
	// Token, when non-empty, is the bearer token every request over TCP must carry
	// (Authorization: Bearer …), but for /metrics when MetricsOpen. Over a unix socket it is not
	// required (the socket's mode and group are the access control), but a wrong one is refused.
	Token []byte
	// MetricsOpen leaves GET /metrics open without the token.
	MetricsOpen bool
	// Hosts are Host header names accepted over TCP beside the loopback names (localhost, 127.0.0.1,
	// [::1]) and the address the connection arrived at. Lower case, without a port.
	Hosts []string
}

// AdminAccess holds the AdminPolicy in force; Set replaces it (on reload) for the requests that start
// afterwards. Safe for concurrent use.
type AdminAccess struct {
	p atomic.Pointer[AdminPolicy]
}

// NewAdminAccess returns an AdminAccess with p in force.
func NewAdminAccess(p AdminPolicy) *AdminAccess {
	a := &AdminAccess{}
	a.Set(p)
	return a
}

// Set puts p in force.
func (a *AdminAccess) Set(p AdminPolicy) {
	p.Hosts = append([]string(nil), p.Hosts...)
	for i, h := range p.Hosts {
		p.Hosts[i] = strings.ToLower(h)
	}
	p.Token = append([]byte(nil), p.Token...)
	a.p.Store(&p)
}

func (a *AdminAccess) policy() *AdminPolicy {
	if a == nil {
		return &AdminPolicy{}
	}
	return a.p.Load()
}

// CSRFHeader is the header a state-changing admin request without a bearer token must carry (any
// non-empty value; the CLI sends "1"). A browser sends no custom header cross-site without a CORS
// preflight, which the admin API never grants.
const CSRFHeader = "X-Activator"

// Guard wraps the admin API in its access checks, in this order:
//
//  1. Host (TCP only): a loopback name, a configured host or the address the connection arrived at,
//     with any port; anything else gets 421 Misdirected Request. This stops DNS rebinding.
//  2. Token: when the policy has one, a request over TCP without the right bearer token gets 401 with
//     WWW-Authenticate: Bearer (but GET /metrics when MetricsOpen). A wrong token gets 401 on a unix
//     socket too.
//  3. Cross-site requests: a method other than GET, HEAD and OPTIONS needs a request no browser sends
//     cross-site without a preflight (a bearer token, the X-Activator header, or Content-Type
//     application/json), an Origin, if any, that is the admin API's own, and no Sec-Fetch-Site but
//     same-origin or none; otherwise 403.
//  4. A request body, which no admin route reads, is read and dropped, within adminBodyTimeout and
//     up to adminBodyLimit bytes (dropBody).
//
// The answer of a request that passes has each write bounded by adminWriteStall (stallWriter).
//
// A request refused with a body, or whose body broke a bound, has its connection closed after the
// answer, and nothing more of the body is read (endBody). Left to net/http, which drains an unread
// body of up to 256 KiB before it answers, with no deadline, a body trickled a byte at a time held
// its request, refused or not, and its connection for as long as the client kept trickling.
func (a *AdminAccess) Guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		refuse := func(code int, msg string) {
			endBody(w, req)
			writeJSON(w, code, map[string]string{"error": msg})
		}
		p := a.policy()
		unix := overUnix(req)
		if !unix && !hostAllowed(req, p.Hosts) {
			refuse(http.StatusMisdirectedRequest, "Host "+req.Host+" is not this admin API's (add it to admin_hosts)")
			return
		}
		auth, hasAuth := bearer(req)
		if hasAuth && len(p.Token) > 0 && !tokenEqual(auth, p.Token) ||
			!hasAuth && len(p.Token) > 0 && !unix && !(p.MetricsOpen && req.URL.Path == "/metrics" && isRead(req.Method)) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="activator admin"`)
			refuse(http.StatusUnauthorized, "a valid bearer token is required (see admin_token_file)")
			return
		}
		if s := req.Header.Get("Sec-Fetch-Site"); s == "cross-site" || s == "same-site" {
			// A read too: a page on any site could otherwise have a visitor's browser ask a token-less
			// loopback API for a CPU profile or a 100,000-route listing, though it cannot read the
			// answer. Tools and Prometheus send no Sec-Fetch-Site; a browser opening the URL, "none".
			refuse(http.StatusForbidden, "cross-site request refused (Sec-Fetch-Site: "+s+")")
			return
		}
		if !isRead(req.Method) {
			if msg := crossSite(req, hasAuth && len(p.Token) > 0); msg != "" {
				refuse(http.StatusForbidden, msg)
				return
			}
		}
		if code, msg := dropBody(w, req); code != 0 {
			refuse(code, msg)
			return
		}
		sw := stallWriter{w, http.NewResponseController(w)}
		next.ServeHTTP(sw, req)
		sw.bound() // for net/http's flush of what the handler left in its buffer
	})
}

// adminWriteStall bounds each write of an admin answer (stallWriter).
var adminWriteStall = 10 * time.Second // a variable for the tests only

// stallWriter gives each write of an admin answer adminWriteStall to reach the kernel. A client that
// stops reading an answer (a /metrics scrape of 100,000 routes is megabytes) otherwise kept its
// connection, the handler's goroutine and what the answer holds for ever: the admin server has no
// WriteTimeout, since a wake requested over it may take minutes before its first byte. net/http
// clears the write deadline once the answer is finished, so it does not outlive its answer (a
// deadline left on an idle connection would fail net/http's own answer to the next request, a 400 or
// 431 written before any handler runs).
type stallWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
}

func (s stallWriter) Write(p []byte) (int, error) {
	s.bound()
	return s.ResponseWriter.Write(p)
}

func (s stallWriter) bound() { _ = s.rc.SetWriteDeadline(time.Now().Add(adminWriteStall)) }

// Unwrap lets http.ResponseController reach the connection's writer.
func (s stallWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// adminBodyLimit and adminBodyTimeout bound what Guard reads of a request body: the admin routes take
// their arguments from the path and query, and a client's `{}` or form is far below both.
const adminBodyLimit = 64 << 10

var adminBodyTimeout = 10 * time.Second // a variable for the tests only

// hasBody reports whether req may have a body to read.
func hasBody(req *http.Request) bool {
	return req.Body != nil && req.Body != http.NoBody && req.ContentLength != 0
}

// dropBody reads req's body, if it has one, to its end and drops it, within adminBodyTimeout and
// adminBodyLimit. Otherwise it returns the answer's status and error: 408 for a body that did not
// arrive in time, 400 for one that broke off or is malformed, 413 for one over the limit. The read
// deadline it sets must not outlive the body: a wake requested over the admin API may take minutes,
// and net/http's read in the background, which ends the request's context when the client leaves,
// would end it at the deadline. net/http clears the deadline itself when it starts that read, at the
// body's end; it is cleared here too, so as not to depend on that.
func dropBody(w http.ResponseWriter, req *http.Request) (int, string) {
	if !hasBody(req) {
		return 0, ""
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(adminBodyTimeout))
	n, err := io.Copy(io.Discard, io.LimitReader(req.Body, adminBodyLimit+1))
	where := req.Method + " " + req.URL.Path
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return http.StatusRequestTimeout, fmt.Sprintf("%s: the request body did not arrive whole within %v (the admin API reads no body)", where, adminBodyTimeout)
	case err != nil:
		return http.StatusBadRequest, fmt.Sprintf("%s: the request body broke off or is malformed (the admin API reads no body)", where)
	case n > adminBodyLimit:
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("%s: a request body over %d bytes (the admin API reads no body)", where, adminBodyLimit)
	}
	_ = rc.SetReadDeadline(time.Time{})
	return 0, ""
}

// endBody, for a request about to be refused, makes sure nothing more of its body is read: its
// connection is closed after the answer, and a read deadline in the past stops net/http's drain of
// the body (up to 256 KiB, with no deadline of its own) before it closes the connection.
func endBody(w http.ResponseWriter, req *http.Request) {
	if !hasBody(req) {
		return
	}
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(time.Unix(1, 0))
}

func isRead(method string) bool {
	return method == http.MethodGet || method == http.MethodHead || method == http.MethodOptions
}

// overUnix reports whether req came over a unix socket.
func overUnix(req *http.Request) bool {
	la, _ := req.Context().Value(http.LocalAddrContextKey).(net.Addr)
	return la != nil && la.Network() == "unix"
}

// hostAllowed reports whether req's Host is a loopback name, one of hosts, or the IP address the
// connection arrived at (a browser that sends that Host has loaded a page from this very listener,
// not from a rebound name).
func hostAllowed(req *http.Request, hosts []string) bool {
	h := strings.ToLower(req.Host)
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	} else {
		h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	}
	switch h {
	case "localhost", "127.0.0.1", "::1":
		return true
	}
	for _, x := range hosts {
		if h == strings.TrimSuffix(strings.TrimPrefix(x, "["), "]") {
			return true
		}
	}
	if la, ok := req.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok && la.IP != nil && !la.IP.IsUnspecified() {
		if ip := net.ParseIP(h); ip != nil && ip.Equal(la.IP) {
			return true
		}
	}
	return false
}

// bearer returns the token of an "Authorization: Bearer …" header, and whether req has an
// Authorization header at all.
func bearer(req *http.Request) ([]byte, bool) {
	v, ok := req.Header["Authorization"]
	if !ok {
		return nil, false
	}
	scheme, tok, _ := strings.Cut(strings.TrimSpace(strings.Join(v, ",")), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return nil, true
	}
	return []byte(strings.TrimSpace(tok)), true
}

// crossSite returns why a state-changing req could have come from a browser on another site, or "".
// authed says it carries a valid bearer token, which no browser adds cross-site unasked.
func crossSite(req *http.Request, authed bool) string {
	ct := strings.ToLower(strings.TrimSpace(strings.Split(req.Header.Get("Content-Type"), ";")[0]))
	if !authed && req.Header.Get(CSRFHeader) == "" && ct != "application/json" {
		return "a state-changing request needs the header " + CSRFHeader + ": 1 (or a bearer token)"
	}
	if o, ok := req.Header["Origin"]; ok && (len(o) != 1 || !strings.EqualFold(o[0], "http://"+req.Host)) {
		return "cross-origin request refused (Origin " + strings.Join(o, ", ") + ")"
	}
	switch s := req.Header.Get("Sec-Fetch-Site"); s {
	case "", "same-origin", "none":
	default:
		return "cross-site request refused (Sec-Fetch-Site: " + s + ")"
	}
	return ""
}

// tokenEqual compares a presented token with the admin token in time that depends on neither:
// subtle.ConstantTimeCompare returns at once when the lengths differ, which tells the token's length
// to whoever times it. Their SHA-256 digests have one length.
func tokenEqual(got, want []byte) bool {
	g, w := sha256.Sum256(got), sha256.Sum256(want)
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}
