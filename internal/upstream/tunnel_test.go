package upstream

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// hijackable is a ResponseWriter whose Hijack hands over conn, the edge's end of the client's
// connection, as net/http's does.
type hijackable struct {
	h    http.Header
	conn net.Conn
}

func (w *hijackable) Header() http.Header         { return w.h }
func (w *hijackable) Write(b []byte) (int, error) { return w.conn.Write(b) }
func (w *hijackable) WriteHeader(int)             {}

func (w *hijackable) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return w.conn, bufio.NewReadWriter(bufio.NewReader(w.conn), bufio.NewWriter(w.conn)), nil
}

// TestTunnelTimeout: once a request has switched protocols, Options.TunnelTimeout closes the connection,
// on the client's side and the tenant's, when no byte has come from either end for that long, and ends
// the request (Serve returns). Each byte, either way, starts the bound again; a tunnel that ends first is
// not bound any more, and with no bound one stays open until a side closes it. Found by an attacker
// trial on the real binary: a silent WebSocket stayed open for ever. OnTunnelOpen hears of every
// tunnel, bound or not, and OnTunnelEnd of its end once, with why (the bound, or the side that sent
// the first Close frame or else whose connection ended first), how long it was open and its bound.
// The sides send WebSocket frames: a ping for a byte, a Close. The connections are pipes, so the test
// runs on synctest's clock and the times are exact.
func TestTunnelTimeout(t *testing.T) {
	const bound = time.Minute
	cases := []struct {
		name       string
		bound      time.Duration // -1: no Options.TunnelTimeout at all
		client     []time.Duration
		tenant     []time.Duration // when each side sends a ping, counted from the switch
		clientBye  time.Duration   // the client sends a Close frame then (0: never)
		tenantBye  time.Duration   // the tenant sends a Close frame then (0: never)
		clientEnds time.Duration   // the client closes its connection then (0: never)
		tenantEnds time.Duration   // the tenant closes its connection then (0: never)
		closed     time.Duration   // when both sides are closed and Serve returns
		why        TunnelReason    // what OnTunnelEnd is told
	}{
		{name: "silent", bound: bound, closed: bound, why: TunnelIdle},
		{name: "the client sends", bound: bound, client: []time.Duration{50 * time.Second, 100 * time.Second, 150 * time.Second, 200 * time.Second},
			closed: 260 * time.Second, why: TunnelIdle},
		{name: "the tenant sends", bound: bound, tenant: []time.Duration{50 * time.Second, 100 * time.Second, 150 * time.Second, 200 * time.Second},
			closed: 260 * time.Second, why: TunnelIdle},
		{name: "each in turn", bound: bound, client: []time.Duration{59 * time.Second, 177 * time.Second}, tenant: []time.Duration{118 * time.Second},
			closed: 237 * time.Second, why: TunnelIdle},
		{name: "the client leaves first", bound: bound, client: []time.Duration{30 * time.Second}, clientEnds: 40 * time.Second, closed: 40 * time.Second,
			why: TunnelClient},
		{name: "the tenant leaves first", bound: bound, tenant: []time.Duration{30 * time.Second}, tenantEnds: 40 * time.Second, closed: 40 * time.Second,
			why: TunnelTenant},
		// The close handshakes: the tenant closes its connection first, as a server does, whoever began.
		{name: "the client says bye", bound: bound, clientBye: 30 * time.Second, tenant: []time.Duration{31 * time.Second}, tenantEnds: 32 * time.Second,
			closed: 32 * time.Second, why: TunnelClient},
		{name: "the tenant says bye", bound: bound, tenantBye: 30 * time.Second, client: []time.Duration{31 * time.Second}, tenantEnds: 32 * time.Second,
			closed: 32 * time.Second, why: TunnelTenant},
		{name: "a bye, then silence", bound: bound, clientBye: 30 * time.Second, closed: 90 * time.Second, why: TunnelClient},
		{name: "no bound", bound: 0, clientEnds: 10 * time.Hour, closed: 10 * time.Hour, why: TunnelClient},
		{name: "no bound, the tenant leaves", bound: 0, tenantEnds: 10 * time.Hour, closed: 10 * time.Hour, why: TunnelTenant},
		{name: "no option", bound: -1, clientEnds: 10 * time.Hour, closed: 10 * time.Hour, why: TunnelClient},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ends := make(chan TunnelEnd, 2)
				opened := 0 // OnTunnelOpen runs in Serve's goroutine
				opts := Options{Network: "tcp", Address: "127.0.0.1:1", MaxConns: 4, ErrorHandler: failed,
					OnTunnelOpen: func() { opened++ }, OnTunnelEnd: func(e TunnelEnd) { ends <- e }}
				if tc.bound >= 0 {
					opts.TunnelTimeout = func() time.Duration { return tc.bound }
				}
				c := New(opts)
				tenantEnd, upEnd := net.Pipe()
				c.transport.DialContext = func(context.Context, string, string) (net.Conn, error) { return upEnd, nil }
				clientEnd, edgeEnd := net.Pipe()
				start := time.Now()
				since := func() time.Duration { return time.Since(start) }
				ping, bye := []byte{0x89, 0}, []byte{0x88, 0} // a ping and a Close frame, unmasked, no payload
				sends := func(conn net.Conn, at []time.Duration, byeAt, endAt time.Duration) {
					for _, d := range at {
						time.Sleep(d - since())
						if _, err := conn.Write(ping); err != nil {
							t.Errorf("a ping at %v: %v", d, err)
						}
					}
					if byeAt > 0 {
						time.Sleep(byeAt - since())
						if _, err := conn.Write(bye); err != nil {
							t.Errorf("a Close frame at %v: %v", byeAt, err)
						}
					}
					if endAt > 0 {
						time.Sleep(endAt - since())
						conn.Close()
					}
				}

				tenantClosed := make(chan time.Duration, 1)
				go func() {
					br := bufio.NewReader(tenantEnd)
					req, err := http.ReadRequest(br)
					if err != nil || req.Header.Get("Upgrade") != "websocket" {
						t.Errorf("the tenant got %v, %v; want an upgrade to websocket", req, err)
						tenantEnd.Close()
						return
					}
					io.WriteString(tenantEnd, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
					go sends(tenantEnd, tc.tenant, tc.tenantBye, tc.tenantEnds)
					_, _ = io.Copy(io.Discard, br)
					tenantClosed <- since()
					tenantEnd.Close()
				}()
				clientClosed := make(chan time.Duration, 1)
				go func() {
					br := bufio.NewReader(clientEnd)
					resp, err := http.ReadResponse(br, nil)
					if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
						t.Errorf("the client got %v, %v; want 101", resp, err)
						clientEnd.Close()
						return
					}
					go sends(clientEnd, tc.client, tc.clientBye, tc.clientEnds)
					_, _ = io.Copy(io.Discard, br)
					clientClosed <- since()
					clientEnd.Close()
				}()

				r := httptest.NewRequest(http.MethodGet, "http://app.test/ws", nil)
				r.Header.Set("Connection", "Upgrade")
				r.Header.Set("Upgrade", "websocket")
				c.Serve(&hijackable{h: http.Header{}, conn: edgeEnd}, r)
				served := since()
				tenantAt, clientAt := <-tenantClosed, <-clientClosed
				time.Sleep(10 * bound) // a timer left behind would fire meanwhile
				synctest.Wait()
				c.CloseIdle()

				if served != tc.closed || tenantAt != tc.closed || clientAt != tc.closed {
					t.Errorf("the request ended at %v, the tenant's side was closed at %v, the client's at %v; want all at %v",
						served, tenantAt, clientAt, tc.closed)
				}
				var told []TunnelEnd
				for len(ends) > 0 {
					told = append(told, <-ends)
				}
				if want := []TunnelEnd{{Why: tc.why, Open: tc.closed, Bound: max(tc.bound, 0)}}; opened != 1 || !slices.Equal(told, want) {
					t.Errorf("OnTunnelOpen told %d times, OnTunnelEnd %+v; want once, and %+v", opened, told, want)
				}
			})
		})
	}
}

// TestTunnelWrongProtocol: a tenant that answers an upgrade with a 101 to another protocol than the one
// asked for (or with none) gets its connection closed at once, and the request fails; with a tunnel
// bound or without. The ReverseProxy fails the request but leaves that connection, the 101's body,
// open: the tenant's side stayed open until the tunnel's bound closed it, and for ever without one.
// Found while counting tunnels (OnTunnelOpen): one counted there would have been open for ever. It is
// no tunnel, and the hooks hear nothing of it.
func TestTunnelWrongProtocol(t *testing.T) {
	for _, tc := range []struct {
		name    string
		bound   time.Duration // -1: no Options.TunnelTimeout at all
		upgrade string        // the 101's Upgrade; "": no Upgrade and no Connection
	}{
		{name: "no option", bound: -1, upgrade: "h2c"},
		{name: "a bound", bound: time.Minute, upgrade: "h2c"},
		{name: "no upgrade named", bound: time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				failures := make(chan error, 2)
				var told atomic.Int32
				opts := Options{Network: "tcp", Address: "127.0.0.1:1", MaxConns: 4,
					ErrorHandler: func(_ http.ResponseWriter, _ *http.Request, err error) { failures <- err },
					OnTunnelOpen: func() { told.Add(1) }, OnTunnelEnd: func(TunnelEnd) { told.Add(1) }}
				if tc.bound >= 0 {
					opts.TunnelTimeout = func() time.Duration { return tc.bound }
				}
				c := New(opts)
				tenantEnd, upEnd := net.Pipe()
				c.transport.DialContext = func(context.Context, string, string) (net.Conn, error) { return upEnd, nil }
				clientEnd, edgeEnd := net.Pipe()
				start := time.Now()

				tenantClosed := make(chan time.Duration, 1)
				go func() {
					br := bufio.NewReader(tenantEnd)
					if _, err := http.ReadRequest(br); err != nil {
						t.Errorf("the tenant got %v", err)
					}
					head := "HTTP/1.1 101 Switching Protocols\r\n\r\n"
					if tc.upgrade != "" {
						head = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + tc.upgrade + "\r\nConnection: Upgrade\r\n\r\n"
					}
					io.WriteString(tenantEnd, head)
					_, _ = io.Copy(io.Discard, br)
					tenantClosed <- time.Since(start)
				}()
				go func() { _, _ = io.Copy(io.Discard, clientEnd) }()

				r := httptest.NewRequest(http.MethodGet, "http://app.test/ws", nil)
				r.Header.Set("Connection", "Upgrade")
				r.Header.Set("Upgrade", "websocket")
				c.Serve(&hijackable{h: http.Header{}, conn: edgeEnd}, r)
				synctest.Wait()
				select {
				case err := <-failures:
					t.Logf("the request failed: %v", err)
				default:
					t.Error("the request did not fail")
				}
				select {
				case at := <-tenantClosed:
					if at != 0 {
						t.Errorf("the tenant's side was closed %v after the answer, want at once", at)
					}
				default:
					t.Error("the tenant's side is still open once the request has ended")
					tenantEnd.Close()
				}
				time.Sleep(10 * time.Minute) // a timer left behind fires meanwhile
				synctest.Wait()
				if n := told.Load(); n > 0 {
					t.Errorf("OnTunnelOpen and OnTunnelEnd told %d times of a switch that failed, want none", n)
				}
				edgeEnd.Close()
				clientEnd.Close()
				c.CloseIdle()
			})
		})
	}
}
