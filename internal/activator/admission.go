package activator

// Admission: what a request must pass at the edge before it may cost a tenant anything. Its body is
// read first (takeBody), so a slow upload neither wakes a tenant nor takes an upstream slot; while it
// is held it is counted against the process-wide caps (heldAccount); and its wait for an upstream
// slot is bounded by what is left of its hold budget (instance.admit).

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/activator/activator/internal/bodybuf"
	"github.com/activator/activator/internal/registry"
)

// takeBody readies r's body before the request is held or admitted, per its route and the edge's
// limits: with request buffering on, it reads the whole body (bodybuf.Read) and swaps the replay in,
// returning it for the caller to Close once the response is done (a replay the Transport made through
// r.GetBody may keep the bytes until it closes too); with buffering off, it leaves the
// body streaming but bounded by max_body and the body idle timeout (streamBody), and returns nil. A
// nil *bodybuf.Body is an empty body, and closing it does nothing.
//
// A bodyless request (nearly every GET) passes without allocating, so the upstream client's fast
// path still applies to it.
func (s *Server) takeBody(w *statusWriter, r *http.Request, rt *registry.Route, e *registry.EdgeLimits) (*bodybuf.Body, error) {
	if !rt.RequestBuffering {
		err := streamBody(w, r, rt.MaxBody, e.BodyTimeout)
		if err == nil {
			delete(w.Header(), "Connection") // ServeHTTP's, for answers before the body: the proxy reads it
		}
		return nil, err
	}
	b, err := bodybuf.Read(w, r, bodybuf.Options{Memory: e.BodyMemory, Dir: e.BodyBufferDir, Max: rt.MaxBody, Idle: e.BodyTimeout, Spills: &s.spills})
	if err != nil {
		return nil, s.bodyFailed(rt, err)
	}
	delete(w.Header(), "Connection") // ServeHTTP's, for answers before the body: it is read

	if b == nil {
		r.Body, r.ContentLength = http.NoBody, 0
	} else {
		// GetBody lets the ReverseProxy's Transport send the body again on a new connection when the
		// tenant closed a kept-alive one as the request arrived (TestBufferedBodyIsRetried): a request
		// nothing of which was written, or one with an Idempotency-Key whose answer never began.
		r.Body, r.ContentLength, r.GetBody = b, b.Len(), b.Replay
	}
	r.TransferEncoding = nil // the length is known now
	// The client has had its 100 Continue (net/http sends it as the body is read) and the edge has the
	// whole body: a tenant asked to Expect it would answer a second 100 Continue, which reached the
	// client after it had sent the body (found with the real binary).
	r.Header.Del("Expect")
	return b, nil
}

// spillLogEvery is how often, at most, the edge logs the bodies it could not buffer.
const spillLogEvery = 10 * time.Second

// bodyFailed classifies a failed bodybuf.Read for statusFor: too large and idle as they are, a spill
// file that could not be written as ErrBodyBuffer (the operator's problem: logged), anything else as
// the client's (ErrBodyRead, not logged: clients that hang up mid-upload are no news).
func (s *Server) bodyFailed(rt *registry.Route, err error) error {
	var pe *fs.PathError
	switch {
	case errors.Is(err, bodybuf.ErrTooLarge), errors.Is(err, bodybuf.ErrIdle):
		return err
	case errors.Is(err, bodybuf.ErrSpillsFull):
		if n, write := s.spillLog.note(time.Now(), spillLogEvery); write {
			files, bytes := s.spills.InUse()
			s.log.Warn("request bodies refused: their spill files are at their cap (edge.max_spill_files, edge.max_spill_bytes)",
				"route", rt.Name, "refused", n, "files", files, "bytes", bytes, "err", err)
		}
		return err
	case errors.As(err, &pe):
		// A full disk or no descriptor left fails every upload at once: a line per body would flood
		// the log (and the disk under it).
		if n, write := s.spillLog.note(time.Now(), spillLogEvery); write {
			s.log.Warn("cannot buffer a request body", "route", rt.Name, "bodies", n, "err", err)
		}
		return fmt.Errorf("%w: %w", ErrBodyBuffer, err)
	}
	return fmt.Errorf("%w: %w", ErrBodyRead, err)
}

// streamBody bounds an unbuffered body: a declared length over max is refused at once (before any
// byte is read, so no 100 Continue goes out); otherwise, when max or idle is set, r.Body is wrapped
// so that byte max+1 or a pause of idle fails the read, and so the proxy's upstream request, with an
// error that statusFor maps to 413 or 408. w keeps the wrapper, for statusWriter.fail. max and idle
// 0 are no bound.
func streamBody(w *statusWriter, r *http.Request, max int64, idle time.Duration) error {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil
	}
	if max > 0 && r.ContentLength > max {
		if r.ProtoMajor == 1 {
			// As bodybuf.Read does: answer without reading the body first, then close.
			w.Header().Set("Connection", "close")
		}
		if idle > 0 {
			// Bounds what the server still reads of the body after the handler.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(idle))
		}
		return fmt.Errorf("%w: %d bytes declared, at most %d accepted", bodybuf.ErrTooLarge, r.ContentLength, max)
	}
	if max <= 0 && idle <= 0 {
		return nil
	}
	sb := &streamed{body: r.Body, idle: idle, max: -1}
	if max > 0 {
		sb.max = max
	}
	if idle > 0 {
		sb.rc = http.NewResponseController(w)
	}
	r.Body, w.body = sb, sb
	return nil
}

// streamed is an unbuffered request body with max_body and the body idle timeout applied, read by
// the proxy as it forwards the body. The idle bound is a read deadline on the client connection, set
// before each read and cleared at the body's end: left in place, it would end the connection's
// background read, and so the request's context, in the middle of a long response. On an error the
// deadline stays, bounding what the server reads of the body after the handler.
type streamed struct {
	body io.ReadCloser
	rc   *http.ResponseController // nil: no idle bound (not set, or the writer cannot set deadlines)
	idle time.Duration
	max  int64 // most bytes accepted; < 0: any number
	n    int64 // bytes read so far
	// deadline is the read deadline in force, in Unix nanoseconds (0: none). The proxy reads the body
	// on the transport's goroutine; the handler's reads it in idleExpired.
	deadline atomic.Int64
}

// idleExpired reports whether the body's read deadline has passed: the body, not the client, ended
// the request. net/http cancels the request's context on the read error, and the proxy then often
// reports that context instead of the read error (see cause).
func (sb *streamed) idleExpired() bool {
	d := sb.deadline.Load()
	return d != 0 && time.Now().UnixNano() >= d
}

// cause is err, unless the body timed out: then it is the body's ErrIdle, which the proxy's error
// may not carry. On a nil sb it is err.
func (sb *streamed) cause(err error) error {
	if sb != nil && !bodyRefused(err) && sb.idleExpired() {
		return fmt.Errorf("%w: no byte for %v", bodybuf.ErrIdle, sb.idle)
	}
	return err
}

func (sb *streamed) Read(p []byte) (int, error) {
	if left := sb.max + 1 - sb.n; sb.max >= 0 && int64(len(p)) > left {
		p = p[:left]
	}
	if sb.rc != nil {
		d := time.Now().Add(sb.idle)
		err := sb.rc.SetReadDeadline(d)
		switch {
		case errors.Is(err, http.ErrNotSupported):
			sb.rc = nil
		case err != nil:
			return 0, fmt.Errorf("%w: %w", ErrBodyRead, err)
		default:
			sb.deadline.Store(d.UnixNano())
		}
	}
	n, err := sb.body.Read(p)
	sb.n += int64(n)
	switch {
	case sb.max >= 0 && sb.n > sb.max:
		return n - int(sb.n-sb.max), fmt.Errorf("%w: more than %d bytes", bodybuf.ErrTooLarge, sb.max)
	case err == io.EOF:
		if sb.rc != nil {
			_ = sb.rc.SetReadDeadline(time.Time{})
			sb.deadline.Store(0)
		}
		return n, io.EOF
	case err == nil:
		return n, nil
	case isTimeout(err):
		return n, fmt.Errorf("%w: no byte for %v", bodybuf.ErrIdle, sb.idle)
	}
	return n, fmt.Errorf("%w: %w", ErrBodyRead, err)
}

func (sb *streamed) Close() error { return sb.body.Close() }

// bodyRefused reports whether err refuses the request's body for its length or its silence: an
// answer the client, still there, must get (see statusWriter.fail).
func bodyRefused(err error) bool {
	return errors.Is(err, bodybuf.ErrIdle) || errors.Is(err, bodybuf.ErrTooLarge)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// heldAccount counts, across all routes, the requests being held and the bytes they keep, for the
// edge.max_held and edge.max_held_bytes caps. Only the hold changes it (parking reads n): a request to
// an awake route is never held, and never counted.
type heldAccount struct {
	n     atomic.Int64 // requests held
	bytes atomic.Int64 // what they keep: see holdCharge.bytes
}

// holdCharge is one request's entry in the server's heldAccount, taken when the edge starts reading
// its buffered body, when acquire first holds it, or when admit must wait for an upstream slot,
// whichever comes first, and given back by admit when the request has its slot (or by ServeHTTP,
// answer or abandon when it fails). A nil *holdCharge counts nothing
// (admin wakes, tests); one without an account counts nothing but notes the wake it held on.
type holdCharge struct {
	acct  *heldAccount
	lim   *registry.EdgeLimits // the caps; 0 is no cap
	bytes int64                // what the request keeps while held: headerSizes' held plus its in-memory body

	taken   bool
	heldFor time.Duration // how long acquire held the request; 0 if it found the route awake
	wake    *attempt      // the wake acquire held the request for (the last, after several turns); nil if none
	// handedBy is the wake that handed the request over to the proxy when its hold ended; nil when
	// it was not held, failed, or found the route awake on a later turn.
	handedBy *attempt
}

// measureHeader checks r's header against edge.max_header_bytes (ErrHeaderTooLarge) and returns what
// it keeps while held (see headerSizes). With neither that limit nor a held-bytes cap set (hand-built
// configs) it does not look.
func measureHeader(r *http.Request, e *registry.EdgeLimits) (held int64, err error) {
	if e.MaxHeaderBytes <= 0 && e.MaxHeldBytes <= 0 {
		return 0, nil
	}
	wire, held := headerSizes(r)
	if e.MaxHeaderBytes > 0 && wire > e.MaxHeaderBytes {
		return 0, fmt.Errorf("%w: %d bytes or more, at most %d accepted", ErrHeaderTooLarge, wire, e.MaxHeaderBytes)
	}
	return held, nil
}

// headerSizes measures r's header in one walk over its fields:
//
//   - wire is the request line and header as they were sent, at least: each field as "Name: value"
//     and CRLF, the Host field, the request line and the final CRLF. What net/http drops from the
//     header (Transfer-Encoding, a chunked body's Content-Length) and optional whitespace are not
//     counted, so it never exceeds what came on the wire. net/http's own limit holds on a new
//     connection; wire catches the up to 4 KiB more it lets through on a kept-alive one.
//   - held approximates the memory the header keeps while the request is held: each field's name
//     and value plus 4 (about what net/http keeps per field beyond the strings), the request target
//     and the Host. The connection's buffers, the handler goroutine's stack and the structs around
//     them are not counted: they are the same for every request, whatever its client sends
//     (docs/security.md gives the allowance).
func headerSizes(r *http.Request) (wire, held int64) {
	fields := 0
	for k, vs := range r.Header {
		for _, v := range vs {
			fields += len(k) + len(v) + 4
		}
	}
	held = int64(fields + len(r.RequestURI) + len(r.Host))
	wire = int64(fields + len(r.Method) + len(r.RequestURI) + len(r.Proto) + 4 + len("Host: \r\n") + len(r.Host) + 2)
	return wire, held
}

// take counts the request as held, or refuses it with ErrEdgeFull when either cap would be passed.
// Two requests racing for the last place may both be refused; neither cap is ever passed.
func (c *holdCharge) take() error {
	if c == nil || c.taken {
		return nil // nothing to count, or counted already (its body read, or held, before a wait for a slot)
	}
	a := c.acct
	if a == nil {
		return nil // a charge without an account only notes its wake (a requirement's hold, chain.go)
	}
	if n := a.n.Add(1); c.lim.MaxHeld > 0 && n > int64(c.lim.MaxHeld) {
		a.n.Add(-1)
		return fmt.Errorf("%w: %d requests are held already (edge.max_held)", ErrEdgeFull, c.lim.MaxHeld)
	}
	if err := c.addBytes(c.bytes); err != nil {
		a.n.Add(-1)
		return err
	}
	c.taken = true
	return nil
}

// grow adds n bytes to what c counts (a body read whole after c was taken), or refuses them with
// ErrEdgeFull past edge.max_held_bytes, counting nothing more.
func (c *holdCharge) grow(n int64) error {
	if n == 0 {
		return nil
	}
	if c.taken {
		if err := c.addBytes(n); err != nil {
			return err
		}
	}
	c.bytes += n
	return nil
}

// addBytes adds n to the account's bytes, or nothing and ErrEdgeFull past edge.max_held_bytes.
func (c *holdCharge) addBytes(n int64) error {
	if b := c.acct.bytes.Add(n); c.lim.MaxHeldBytes > 0 && b > c.lim.MaxHeldBytes {
		c.acct.bytes.Add(-n)
		return fmt.Errorf("%w: held requests keep their maximum of %d bytes (edge.max_held_bytes)", ErrEdgeFull, c.lim.MaxHeldBytes)
	}
	return nil
}

// buffersBody reports whether takeBody reads r's body whole before anything else (request_buffering
// on, and a body declared or chunked).
func buffersBody(r *http.Request, rt *registry.Route) bool {
	return rt.RequestBuffering && r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0
}

// give ends what take counted; without a take, or on a nil c, it does nothing.
func (c *holdCharge) give() {
	if c == nil || !c.taken {
		return
	}
	c.taken = false
	c.acct.bytes.Add(-c.bytes)
	c.acct.n.Add(-1)
}

// checkBodyDir reports whether dir ("" is os.TempDir()) can hold spill files, so that a missing or
// read-only edge.body_buffer_dir stops Apply (the start, or a reload) instead of failing uploads.
func checkBodyDir(dir string) error {
	if dir == "" {
		dir = os.TempDir()
	}
	f, err := os.CreateTemp(dir, "activator-check-*")
	if err != nil {
		return fmt.Errorf("edge.body_buffer_dir: %w", err)
	}
	name := f.Name()
	return errors.Join(f.Close(), os.Remove(name))
}
