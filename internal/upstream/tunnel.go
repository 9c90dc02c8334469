package upstream

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// tunnel is the tenant's side of a connection that has switched protocols (a 101: a WebSocket), as the
// ReverseProxy copies it: Read carries the tenant's bytes to the client, Write the client's to the
// tenant. So it sees every byte either way, and closes the connection once none has come from either
// end for bound; the ReverseProxy's copy from it then ends, and with it the request, and the
// ReverseProxy closes the client's connection.
//
// One timer per tunnel, never moved by a byte: Read and Write record the time in last, and the timer,
// when it fires, closes the tunnel or re-arms itself for what is left of bound since then.
type tunnel struct {
	rwc    io.ReadWriteCloser // the 101's body: the connection to the tenant
	start  time.Time          // when the protocol switched
	bound  time.Duration
	last   atomic.Int64                    // when a byte last came from either end, as time since start
	onIdle func(open, bound time.Duration) // nil: none

	mu    sync.Mutex  // guards the fields below
	timer *time.Timer // due when the tunnel would have passed nothing for bound, unless a byte came
	ended bool        // closed, by the ReverseProxy or for silence: the timer does nothing more
}

// newTunnel wraps rwc, the body of a 101 answer, to be closed after bound without a byte; onIdle,
// which may be nil, is called when it is, in the timer's goroutine.
func newTunnel(rwc io.ReadWriteCloser, bound time.Duration, onIdle func(open, bound time.Duration)) *tunnel {
	t := &tunnel{rwc: rwc, start: time.Now(), bound: bound, onIdle: onIdle}
	t.mu.Lock() // expire reads timer: not before it is set
	t.timer = time.AfterFunc(bound, t.expire)
	t.mu.Unlock()
	return t
}

// moved records that a byte came from either end now.
func (t *tunnel) moved() { t.last.Store(int64(time.Since(t.start))) }

// Read reads the tenant's bytes, for the client.
func (t *tunnel) Read(p []byte) (int, error) {
	n, err := t.rwc.Read(p)
	if n > 0 {
		t.moved()
	}
	return n, err
}

// Write writes the client's bytes to the tenant. They count when they come, not when the tenant has
// taken them: a tenant that never reads them is as silent as one that never writes.
func (t *tunnel) Write(p []byte) (int, error) {
	if len(p) > 0 {
		t.moved()
	}
	return t.rwc.Write(p)
}

// Close closes the connection to the tenant and stops the timer. The ReverseProxy calls it once the
// copying is over, whatever ended it.
func (t *tunnel) Close() error {
	t.mu.Lock()
	t.ended = true
	t.timer.Stop()
	t.mu.Unlock()
	return t.rwc.Close()
}

// expire closes the tunnel if nothing came for bound, else re-arms the timer for the rest of bound
// after the last byte.
func (t *tunnel) expire() {
	t.mu.Lock()
	if t.ended {
		t.mu.Unlock()
		return
	}
	open := time.Since(t.start)
	if quiet := open - time.Duration(t.last.Load()); quiet < t.bound {
		t.timer.Reset(t.bound - quiet)
		t.mu.Unlock()
		return
	}
	t.ended = true
	t.mu.Unlock()
	_ = t.rwc.Close()
	if t.onIdle != nil {
		t.onIdle(open, t.bound)
	}
}

// boundTunnel is the ReverseProxy's ModifyResponse. It leaves every answer but a 101 as it is, for one
// comparison. A 101 it checks as the ReverseProxy will (switchedAsAsked), then wraps its body in a
// tunnel if the timeout asked now is above 0.
func (c *Client) boundTunnel(res *http.Response) error {
	if res.StatusCode != http.StatusSwitchingProtocols {
		return nil
	}
	rwc, err := switchedAsAsked(res)
	if err != nil {
		return err
	}
	if c.tunnelTimeout == nil {
		return nil
	}
	if bound := c.tunnelTimeout(); bound > 0 {
		res.Body = newTunnel(rwc, bound, c.onIdleTunnel)
	}
	return nil
}

// switchedAsAsked returns the connection of a 101 answer, or the error the ReverseProxy would fail it
// with: a switch to another protocol than the one asked for (or to one not named in printable ASCII),
// or a 101 that is no switch (no Upgrade, no connection to write to). Refused here, the answer's body
// is closed (the ReverseProxy closes it when ModifyResponse fails); refused by the ReverseProxy itself
// (handleUpgradeResponse), it was left open, and with it the connection to the tenant.
func switchedAsAsked(res *http.Response) (io.ReadWriteCloser, error) {
	var asked string
	if res.Request != nil {
		asked = upgradeType(res.Request.Header)
	}
	got := upgradeType(res.Header)
	// asked is printable ASCII (the ReverseProxy refuses a request whose isn't), so with got printable
	// too, strings.EqualFold is the ReverseProxy's ASCII comparison.
	if !printableASCII(got) || !strings.EqualFold(asked, got) {
		return nil, fmt.Errorf("the tenant switched to protocol %q when %q was asked for", got, asked)
	}
	rwc, ok := res.Body.(io.ReadWriteCloser)
	if !ok {
		return nil, errors.New("the tenant answered 101 Switching Protocols without switching the connection")
	}
	return rwc, nil
}

// upgradeType is the protocol a header switches to (Upgrade, when Connection names it), as the
// ReverseProxy reads it; "" for none.
func upgradeType(h http.Header) string {
	if !httpguts.HeaderValuesContainsToken(h["Connection"], "Upgrade") {
		return ""
	}
	return h.Get("Upgrade")
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
