package activator

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/testenv"
)

// TestTunnelTimeout: a WebSocket through the edge that passes no byte either way for
// edge.tunnel_timeout is closed, on the client's side and the tenant's; the request stops counting in
// flight, so the route goes to sleep; the log says so at INFO, with the route and how long the socket
// was open, at most once per tunnelEvery. A socket whose messages keep passing is not closed
// meanwhile, and a reload's bound applies to the sockets opened after it. Found by an attacker trial
// on the real binary: a silent socket stayed open for ever, holding a client connection, an upstream
// connection and a max_upstream_conns slot, and kept its tenant awake.
//
// Real sockets and a real clock: the bound is the only wait, and every other step waits for an event
// (a read that ends, a count that changes). internal/upstream's TestTunnelTimeout has the exact times.
func TestTunnelTimeout(t *testing.T) {
	const bound = time.Second
	tenantGone := make(chan struct{}, 4)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer func() { tenantGone <- struct{}{} }()
		defer ws.CloseNow()
		// It echoes what it is sent, and never sends anything of its own.
		ctx := context.Background()
		for {
			typ, msg, err := ws.Read(ctx)
			if err != nil {
				return
			}
			if err := ws.Write(ctx, typ, msg); err != nil {
				return
			}
		}
	}))
	t.Cleanup(up.Close)

	var logs testenv.SyncBuffer
	b := &fakeBackend{}
	s := New(Options{Opener: fakeProvider{b}, Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} }})
	r := testRoute("app")
	r.Upstream.Address = up.Listener.Addr().String()
	r.Idle = time.Millisecond
	apply := func(t *testing.T, tunnel time.Duration) {
		t.Helper()
		if err := s.Apply(&registry.Config{Edge: registry.EdgeLimits{TunnelTimeout: tunnel}, Routes: []*registry.Route{r}}); err != nil {
			t.Fatal(err)
		}
	}
	apply(t, bound)
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	in := s.instance("app")
	addr := edgeListen(t, s, true)

	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	dial := func(t *testing.T) *websocket.Conn {
		t.Helper()
		ws, _, err := websocket.Dial(ctx, "ws://"+addr+"/ws", &websocket.DialOptions{Host: "app.test"})
		if err != nil {
			t.Fatalf("websocket through the edge: %v", err)
		}
		t.Cleanup(func() { ws.CloseNow() })
		return ws
	}
	echo := func(ws *websocket.Conn) error {
		if err := ws.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
			return err
		}
		if _, msg, err := ws.Read(ctx); err != nil || string(msg) != "ping" {
			return fmt.Errorf("echo %q, %v", msg, err)
		}
		return nil
	}
	// tenantClosed waits for the tenant's side of a socket to end.
	tenantClosed := func() error {
		select {
		case <-tenantGone:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("the tenant's side stayed open for %v", patience)
		}
	}
	// closed waits for the edge to close ws, which sends nothing: its read ends, and the tenant's
	// side ends too. It reports what did not happen by patience.
	closed := func(ws *websocket.Conn) error {
		_, _, err := ws.Read(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("still open after %v (tunnel_timeout %v)", patience, bound)
		}
		if terr := tenantClosed(); terr != nil {
			return fmt.Errorf("the client's side was closed (%v); %w", err, terr)
		}
		return nil
	}
	inFlight := func(t *testing.T, want int) {
		t.Helper()
		until(t, func() (bool, string) {
			in.mu.Lock()
			defer in.mu.Unlock()
			return in.inflight == want, fmt.Sprintf("%d requests in flight, want %d", in.inflight, want)
		})
	}
	// end closes ws, which the edge has kept open, as a client does, and waits for the request to end.
	end := func(t *testing.T, ws *websocket.Conn) {
		t.Helper()
		if err := ws.Close(websocket.StatusNormalClosure, ""); err != nil {
			t.Errorf("closing the socket: %v", err)
		}
		if err := tenantClosed(); err != nil {
			t.Error(err)
		}
		inFlight(t, 0)
	}

	t.Run("silent socket closed, route sleeps", func(t *testing.T) {
		if err := closed(dial(t)); err != nil {
			t.Fatalf("a silent socket: %v", err)
		}
		inFlight(t, 0)
		until(t, func() (bool, string) {
			st := in.status().State
			return b.sleeps.Load() == 1 && st == Asleep.String(), fmt.Sprintf("route %v after %d sleeps, want asleep after 1", st, b.sleeps.Load())
		})
		var line string
		for l := range strings.Lines(logs.String()) {
			if strings.Contains(l, "edge.tunnel_timeout") {
				line = l
			}
		}
		if !strings.Contains(line, `"level":"INFO"`) || !strings.Contains(line, `"route":"app"`) || !strings.Contains(line, `"open":`) {
			t.Errorf("log line %q, want one at INFO naming the route and how long the socket was open\n%s", line, logs.String())
		}
	})

	t.Run("a socket that passes bytes stays open", func(t *testing.T) {
		chatty := dial(t)
		silent := dial(t) // opened after chatty, closed a bound after that
		silentDone := make(chan error, 1)
		go func() { silentDone <- closed(silent) }()
		for n := 0; ; n++ {
			if err := echo(chatty); err != nil {
				t.Fatalf("the chatty socket, after %d echoes: %v", n, err)
			}
			select {
			case err := <-silentDone:
				if err != nil {
					t.Fatalf("a silent socket beside a chatty one: %v", err)
				}
			default:
				continue
			}
			break
		}
		// The chatty socket has outlived a silent one opened after it; it is still open.
		if err := echo(chatty); err != nil {
			t.Fatalf("the chatty socket, once the silent one was closed: %v", err)
		}
		inFlight(t, 1)
		end(t, chatty)
	})

	// The upstream client is built once and kept across reloads; the bound is asked at each switch.
	t.Run("a reload bounds the sockets opened after it", func(t *testing.T) {
		apply(t, 0)
		unbound := dial(t)
		apply(t, bound)
		if s.instance("app") != in {
			t.Fatal("the reload replaced the route's instance")
		}
		if err := closed(dial(t)); err != nil {
			t.Fatalf("a silent socket opened after the reload: %v", err)
		}
		if err := echo(unbound); err != nil {
			t.Fatalf("a silent socket opened under no bound, once a bound one was closed: %v", err)
		}
		end(t, unbound)
	})

	// Three sockets closed for silence within tunnelEvery: a client that opens them by the thousand
	// gets one line.
	if n := strings.Count(logs.String(), "edge.tunnel_timeout"); n != 1 {
		t.Errorf("%d log lines for sockets closed within %v, want 1:\n%s", n, tunnelEvery, logs.String())
	}
}

// TestTunnelsCounted: real WebSockets through the edge to a real tenant, each ended another way, are
// counted in activator_tunnels_closed_total by what ended them, exactly once each, and
// activator_tunnels_open counts them while they are open: a close handshake the client begins and a
// client that drops its connection count as client, the same from the tenant as tenant, whether or not
// the edge bounds tunnels; a silent socket that edge.tunnel_timeout closes counts as idle. A route
// has no tunnel series until its first tunnel.
//
// Real sockets and a real clock: the bound is the only wait, and every other step waits for an event
// (a read that ends, the tenant's handler returning) or a count that changes.
func TestTunnelsCounted(t *testing.T) {
	tenantGone := make(chan struct{}, 8)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer func() { tenantGone <- struct{}{} }()
		defer ws.CloseNow()
		// It echoes what it is sent; "bye" makes it begin a close handshake, "drop" close its
		// connection without one.
		ctx := context.Background()
		for {
			typ, msg, err := ws.Read(ctx)
			if err != nil {
				return
			}
			switch string(msg) {
			case "bye":
				_ = ws.Close(websocket.StatusNormalClosure, "")
				return
			case "drop":
				return
			}
			if err := ws.Write(ctx, typ, msg); err != nil {
				return
			}
		}
	}))
	t.Cleanup(up.Close)

	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	g := m.Gatherer(reg)
	s := New(Options{Opener: fakeProvider{&fakeBackend{}}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} }, Metrics: m})
	r := testRoute("app")
	r.Upstream.Address = up.Listener.Addr().String()
	apply := func(t *testing.T, tunnel time.Duration) {
		t.Helper()
		if err := s.Apply(&registry.Config{Edge: registry.EdgeLimits{TunnelTimeout: tunnel}, Routes: []*registry.Route{r}}); err != nil {
			t.Fatal(err)
		}
	}
	apply(t, 0)
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	addr := edgeListen(t, s, true)

	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	dial := func(t *testing.T) *websocket.Conn {
		t.Helper()
		ws, _, err := websocket.Dial(ctx, "ws://"+addr+"/ws", &websocket.DialOptions{Host: "app.test"})
		if err != nil {
			t.Fatalf("websocket through the edge: %v", err)
		}
		t.Cleanup(func() { ws.CloseNow() })
		// A message each way: the tunnel is up.
		if err := ws.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
			t.Fatal(err)
		}
		if _, msg, err := ws.Read(ctx); err != nil || string(msg) != "ping" {
			t.Fatalf("echo %q, %v", msg, err)
		}
		return ws
	}
	tenantClosed := func(t *testing.T) {
		t.Helper()
		select {
		case <-tenantGone:
		case <-ctx.Done():
			t.Fatalf("the tenant's side stayed open for %v", patience)
		}
	}
	// want waits until the route's tunnel series say open and closed (by reason), and checks that
	// they then still do once the tenant's side has ended.
	type counts struct{ open, idle, client, tenant float64 }
	series := func(c counts) map[string]float64 {
		return map[string]float64{
			`activator_tunnels_open{}`:                        c.open,
			`activator_tunnels_closed_total{reason="idle"}`:   c.idle,
			`activator_tunnels_closed_total{reason="client"}`: c.client,
			`activator_tunnels_closed_total{reason="tenant"}`: c.tenant,
		}
	}
	want := func(t *testing.T, c counts) {
		t.Helper()
		until(t, func() (bool, string) {
			got := routeSeries(t, g, "app")
			for k, v := range series(c) {
				if got[k] != v {
					return false, fmt.Sprintf("tunnel series %v, want %v", got, series(c))
				}
			}
			return true, ""
		})
	}

	// Before any tunnel, none: few routes of a large config have one.
	for k := range routeSeries(t, g, "app") {
		if strings.HasPrefix(k, "activator_tunnels") {
			t.Fatalf("route app has %s before its first tunnel", k)
		}
	}

	t.Run("the client closes", func(t *testing.T) {
		ws := dial(t)
		wantValues(t, routeSeries(t, g, "app"), series(counts{open: 1}), "while open")
		if err := ws.Close(websocket.StatusNormalClosure, ""); err != nil {
			t.Fatalf("the client's close handshake: %v", err)
		}
		tenantClosed(t)
		want(t, counts{client: 1})
	})
	t.Run("the client drops its connection", func(t *testing.T) {
		ws := dial(t)
		ws.CloseNow()
		tenantClosed(t)
		want(t, counts{client: 2})
	})
	t.Run("the tenant closes", func(t *testing.T) {
		ws := dial(t)
		if err := ws.Write(ctx, websocket.MessageText, []byte("bye")); err != nil {
			t.Fatal(err)
		}
		if _, _, err := ws.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
			t.Fatalf("after bye: %v, want the tenant's close", err)
		}
		tenantClosed(t)
		want(t, counts{client: 2, tenant: 1})
	})
	t.Run("the tenant drops its connection", func(t *testing.T) {
		ws := dial(t)
		if err := ws.Write(ctx, websocket.MessageText, []byte("drop")); err != nil {
			t.Fatal(err)
		}
		if _, _, err := ws.Read(ctx); err == nil {
			t.Fatal("the socket is still open after drop")
		}
		tenantClosed(t)
		// The edge passes the tenant's end on as the end of the client's stream, and waits for the
		// client to close its side; until then the tunnel is open, half of it.
		wantValues(t, routeSeries(t, g, "app"), series(counts{open: 1, client: 2, tenant: 1}), "half-closed by the tenant")
		ws.CloseNow()
		want(t, counts{client: 2, tenant: 2})
	})
	t.Run("a silent socket is closed for silence", func(t *testing.T) {
		apply(t, 100*time.Millisecond)
		ws := dial(t)
		if _, _, err := ws.Read(ctx); ctx.Err() != nil {
			t.Fatalf("still open after %v (tunnel_timeout 100ms): %v", patience, err)
		}
		tenantClosed(t)
		want(t, counts{idle: 1, client: 2, tenant: 2})
	})
	// Each of the five upgrades counts as the 101 it was answered with, not as 200 (the ReverseProxy
	// writes the 101 on the hijacked connection, past the status writer: found by an operator trial).
	until(t, func() (bool, string) {
		got := routeSeries(t, g, "app")
		return got[`activator_requests_total{code="101"}`] == 5 && got[`activator_requests_total{code="200"}`] == 0,
			fmt.Sprintf("request series %v, want 5 of code 101 and none of 200", got)
	})
}
