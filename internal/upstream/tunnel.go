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

// TunnelReason is why a tunnel (a connection switched to another protocol by a 101: a WebSocket) ended:
// the first of these that happened to it. What followed from it (the read that fails because the
// tunnel was closed, the other side's close that answers a WebSocket Close frame) does not count.
type TunnelReason uint8

const (
	// TunnelIdle: the edge closed it, as no byte had passed either way for its bound
	// (Options.TunnelTimeout).
	TunnelIdle TunnelReason = iota
	// TunnelClient: the client ended it: it sent a WebSocket Close frame first (closeWatch), or its
	// side ended first. The ReverseProxy closed the tunnel because its copy from the client ended (the
	// client closed or reset its connection) or a write to the client failed. (It also closes the
	// tunnel when the request's context ends, which net/http does for a hijacked connection only once
	// the handler has returned: after the copying is over.)
	TunnelClient
	// TunnelTenant: the tenant ended it: it sent a WebSocket Close frame first, or its side ended first:
	// a read from it ended (it closed its side, or its connection broke: it crashed, or was stopped
	// under the tunnel) or a write to it failed.
	TunnelTenant
)

// String returns the reason's name: "idle", "client" or "tenant".
func (r TunnelReason) String() string {
	switch r {
	case TunnelIdle:
		return "idle"
	case TunnelClient:
		return "client"
	case TunnelTenant:
		return "tenant"
	}
	return fmt.Sprintf("TunnelReason(%d)", uint8(r))
}

// TunnelEnd is how a tunnel ended (Options.OnTunnelEnd).
type TunnelEnd struct {
	Why   TunnelReason
	Open  time.Duration // from the switch of protocols to the end
	Bound time.Duration // the Options.TunnelTimeout it had; 0: none
}

// tunnel is the tenant's side of a connection that has switched protocols (a 101: a WebSocket), as the
// ReverseProxy copies it: Read carries the tenant's bytes to the client, Write the client's to the
// tenant. So it sees every byte either way, and, with a bound, closes the connection once none has come
// from either end for bound; the ReverseProxy's copy from it then ends, and with it the request, and
// the ReverseProxy closes the client's connection. It also sees how the tunnel ends (TunnelReason): a
// WebSocket's first Close frame, either way; a read or write of the tenant's that fails; its own
// bound; or else the ReverseProxy's Close.
//
// One timer per tunnel, never moved by a byte: Read and Write record the time in last, and the timer,
// when it fires, closes the tunnel or re-arms itself for what is left of bound since then.
type tunnel struct {
	rwc   io.ReadWriteCloser // the 101's body: the connection to the tenant
	start time.Time          // when the protocol switched
	bound time.Duration      // 0: none
	last  atomic.Int64       // when a byte last came from either end, as time since start
	onEnd func(TunnelEnd)    // nil: none

	// Read's and Write's own, for a WebSocket: its frames each way, until the first Close frame.
	ws                     bool
	fromTenant, fromClient closeWatch

	mu     sync.Mutex   // guards the fields below
	timer  *time.Timer  // nil without a bound; due when the tunnel would have passed nothing for bound, unless a byte came
	caused bool         // why is the end's first cause: whatever happens later is its effect
	why    TunnelReason // valid once caused
	ended  bool         // closed, by the ReverseProxy or for silence: reported, and the timer does nothing more
}

// newTunnel wraps rwc, the body of a 101 answer switching to protocol, to be closed after bound without
// a byte (0: never); onEnd, which may be nil, is told once how it ended (see Options.OnTunnelEnd).
func newTunnel(rwc io.ReadWriteCloser, protocol string, bound time.Duration, onEnd func(TunnelEnd)) *tunnel {
	t := &tunnel{rwc: rwc, start: time.Now(), bound: bound, onEnd: onEnd, ws: strings.EqualFold(protocol, "websocket")}
	if bound > 0 {
		t.mu.Lock() // expire reads timer: not before it is set
		t.timer = time.AfterFunc(bound, t.expire)
		t.mu.Unlock()
	}
	return t
}

// moved records that a byte came from either end now.
func (t *tunnel) moved() { t.last.Store(int64(time.Since(t.start))) }

// cause records why as the first cause of the tunnel's end, unless it has one already. Whoever closes
// the tunnel records its cause first, so that the reads and writes that fail because of the close
// find one.
func (t *tunnel) cause(why TunnelReason) {
	t.mu.Lock()
	t.causeLocked(why)
	t.mu.Unlock()
}

func (t *tunnel) causeLocked(why TunnelReason) {
	if !t.caused {
		t.caused, t.why = true, why
	}
}

// Read reads the tenant's bytes, for the client. A WebSocket Close frame among them, or an error
// (io.EOF included), is the tenant ending the tunnel, unless it was ended first.
func (t *tunnel) Read(p []byte) (int, error) {
	n, err := t.rwc.Read(p)
	if n > 0 {
		t.moved()
		if t.ws && t.fromTenant.sawClose(p[:n]) {
			t.cause(TunnelTenant)
		}
	}
	if err != nil {
		t.cause(TunnelTenant)
	}
	return n, err
}

// Write writes the client's bytes to the tenant. They count when they come, not when the tenant has
// taken them: a tenant that never reads them is as silent as one that never writes. A WebSocket Close
// frame among them is the client ending the tunnel, and an error the tenant, unless it was ended
// first.
func (t *tunnel) Write(p []byte) (int, error) {
	if len(p) > 0 {
		t.moved()
		if t.ws && t.fromClient.sawClose(p) {
			t.cause(TunnelClient)
		}
	}
	n, err := t.rwc.Write(p)
	if err != nil {
		t.cause(TunnelTenant)
	}
	return n, err
}

// Close closes the connection to the tenant and stops the timer, and reports the end unless the timer
// did. The ReverseProxy calls it once the copying is over, whatever ended it: with no cause found
// before, the client's side ended it (TunnelClient).
func (t *tunnel) Close() error {
	t.mu.Lock()
	t.causeLocked(TunnelClient)
	if t.timer != nil {
		t.timer.Stop()
	}
	report := !t.ended
	t.ended = true
	why := t.why
	t.mu.Unlock()
	if report {
		t.report(why, time.Since(t.start))
	}
	return t.rwc.Close()
}

// expire closes the tunnel if nothing came for bound, else re-arms the timer for the rest of bound
// after the last byte. A tunnel whose tenant's side has ended already is closed all the same, for
// that reason.
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
	t.causeLocked(TunnelIdle)
	why := t.why
	t.mu.Unlock()
	t.report(why, open)
	_ = t.rwc.Close()
}

// report tells onEnd how the tunnel ended. It runs before the connection to the tenant is closed, so
// whoever sees that close sees the end counted.
func (t *tunnel) report(why TunnelReason, open time.Duration) {
	if t.onEnd != nil {
		t.onEnd(TunnelEnd{Why: why, Open: open, Bound: t.bound})
	}
}

// boundTunnel is the ReverseProxy's ModifyResponse. It leaves every answer but a 101 as it is, for one
// comparison. A 101 it checks as the ReverseProxy will (switchedAsAsked), then wraps its body in a
// tunnel, bounded by the timeout asked now if that is above 0, and tells Options.OnTunnelOpen;
// without a bound or a hook to tell, it leaves the body as it is.
func (c *Client) boundTunnel(res *http.Response) error {
	if res.StatusCode != http.StatusSwitchingProtocols {
		return nil
	}
	rwc, err := switchedAsAsked(res)
	if err != nil {
		return err
	}
	var bound time.Duration
	if c.tunnelTimeout != nil {
		bound = c.tunnelTimeout()
	}
	if bound <= 0 && c.onTunnelOpen == nil && c.onTunnelEnd == nil {
		return nil
	}
	if c.onTunnelOpen != nil {
		c.onTunnelOpen() // before the bound's timer runs, and with it the end
	}
	res.Body = newTunnel(rwc, upgradeType(res.Header), max(bound, 0), c.onTunnelEnd)
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
