package tlsedge

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Limits bound the handshakes a Listener runs (edge.tls_handshake_timeout, edge.max_tls_handshakes).
type Limits struct {
	// Timeout bounds one handshake, from accept to its end: a deadline on the connection.
	Timeout time.Duration
	// Max is how many connections may be between accept and Accept's return at once. Beyond it the
	// Listener accepts no more: new connections wait in the kernel's accept queue.
	Max int
}

// Listener is a TLS listener that runs the handshakes itself, at most Limits.Max at once and each within
// Limits.Timeout, so that http.Server never starts an unbounded handshake on a goroutine of its own:
// Accept returns only *tls.Conn whose handshake has completed. A flood of hellos, or of connections that
// never send one, thus costs at most Max goroutines and connections for Timeout each; it does not touch
// other listeners, nor connections already established. A completed TLS-ALPN-01 challenge handshake is
// closed, never returned: the challenge is answered by the handshake itself.
//
// Its accept loop starts at NewListener; Close stops it, aborts the handshakes under way and waits for
// all of them (http.Server closes its listeners on Shutdown and Close).
type Listener struct {
	inner  net.Listener
	config *tls.Config
	lim    Limits
	log    *slog.Logger

	slots    chan struct{}  // one token per connection between accept and Accept's return
	ready    chan *tls.Conn // handshaken connections, to Accept
	errs     chan error     // the inner listener's Accept errors, to Accept
	ctx      context.Context
	cancel   context.CancelFunc // by Close, or when the inner listener is closed under it
	wg       sync.WaitGroup     // the accept loop and every handshake
	inFlight atomic.Int64
	once     sync.Once
	closeErr error // set inside once
}

// NewListener returns inner as a Listener serving config (Edge.TLSConfig), logging failed handshakes to
// log at debug level (nil: nowhere). lim.Max below 1 counts as 1; lim.Timeout 0 leaves handshakes
// unbounded in time (never do that at the edge).
func NewListener(inner net.Listener, config *tls.Config, lim Limits, log *slog.Logger) *Listener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Listener{
		inner: inner, config: config, lim: lim, log: log,
		slots: make(chan struct{}, max(lim.Max, 1)),
		ready: make(chan *tls.Conn),
		errs:  make(chan error),
		ctx:   ctx, cancel: cancel,
	}
	l.wg.Add(1)
	go l.run()
	return l
}

// Accept returns the next connection whose handshake completed: a *tls.Conn, its deadlines cleared.
// An error of the inner listener's Accept is returned as it is (net/http retries the temporary ones);
// after Close, or once the inner listener is closed, it returns net.ErrClosed.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case err := <-l.errs:
		return nil, err
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	}
}

// Close closes the inner listener, aborts the handshakes under way (their connections are closed) and
// returns once the accept loop and every handshake have ended. Connections Accept returned are the
// caller's. It is idempotent; it returns the inner listener's Close error.
func (l *Listener) Close() error {
	l.once.Do(func() {
		l.cancel()
		l.closeErr = l.inner.Close()
		l.wg.Wait()
	})
	return l.closeErr
}

// Addr is the inner listener's address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// InFlight is the number of handshakes running now.
func (l *Listener) InFlight() int { return int(l.inFlight.Load()) }

// run accepts a connection whenever a slot is free, and starts its handshake.
func (l *Listener) run() {
	defer l.wg.Done()
	for {
		select {
		case l.slots <- struct{}{}:
		case <-l.ctx.Done():
			return
		}
		c, err := l.inner.Accept()
		if err != nil {
			<-l.slots
			if errors.Is(err, net.ErrClosed) {
				l.cancel() // closed under us: Accept says so from now on
				return
			}
			// Handed over one at a time: net/http backs off before its next Accept, and so does this
			// loop, instead of spinning on EMFILE.
			select {
			case l.errs <- err:
			case <-l.ctx.Done():
				return
			}
			continue
		}
		l.wg.Add(1)
		go l.handshake(c)
	}
}

// handshake runs raw's handshake and hands the connection to Accept; raw holds a slot until then.
func (l *Listener) handshake(raw net.Conn) {
	defer l.wg.Done()
	defer func() { <-l.slots }()
	l.inFlight.Add(1)
	c, err := l.shake(raw)
	l.inFlight.Add(-1)
	if err != nil {
		_ = raw.Close()
		if !errors.Is(err, errChallengeAnswered) {
			l.log.Debug("tls handshake failed", "remote", raw.RemoteAddr().String(), "err", err)
		}
		return
	}
	select {
	case l.ready <- c:
	case <-l.ctx.Done():
		_ = c.Close()
	}
}

// errChallengeAnswered is shake's answer to a TLS-ALPN-01 validation: its handshake was the answer.
var errChallengeAnswered = errors.New("tls-alpn-01 challenge answered")

// shake runs the handshake under the deadline, or until Close.
func (l *Listener) shake(raw net.Conn) (*tls.Conn, error) {
	ctx := l.ctx
	if l.lim.Timeout > 0 {
		if err := raw.SetDeadline(time.Now().Add(l.lim.Timeout)); err != nil {
			return nil, err
		}
		// The socket's deadline bounds reads and writes, not a GetCertificate that waits: an ACME
		// order in progress (certmagic's lock, held through its retries) held handshakes, and their
		// slots, for minutes, and with TLS-ALPN-01 the order's own challenge then found no slot
		// (found with the real binary and pebble). The hello's context ends with the timeout too.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.lim.Timeout)
		defer cancel()
	}
	c := tls.Server(raw, l.config)
	if err := c.HandshakeContext(ctx); err != nil {
		answerPlainHTTP(err)
		return nil, err
	}
	if c.ConnectionState().NegotiatedProtocol == ACMETLS1 {
		return nil, errChallengeAnswered
	}
	if err := raw.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return c, nil
}

// answerPlainHTTP answers a plain-HTTP request sent to the TLS listener with 400, as net/http's own
// TLS server does, when err says that is what came.
func answerPlainHTTP(err error) {
	var re tls.RecordHeaderError
	if !errors.As(err, &re) || re.Conn == nil {
		return
	}
	for _, m := range [...]string{"GET /", "HEAD ", "POST ", "PUT /", "OPTIO"} {
		if bytes.Equal(re.RecordHeader[:], []byte(m)) {
			_, _ = io.WriteString(re.Conn, "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
			return
		}
	}
}
