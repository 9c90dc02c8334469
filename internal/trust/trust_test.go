package trust

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	proxyproto "github.com/pires/go-proxyproto"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The tests' trusted proxy is 127.0.0.1, the loopback's default source; their untrusted client
// connects from 127.0.0.2.
const untrustedSource = "127.0.0.2"

func trustLoopback(peer netip.Addr) bool { return peer == netip.MustParseAddr("127.0.0.1") }

// listen returns a wrapped listener on 127.0.0.1 that waits timeout for a header, the PROXY protocol
// on.
func listen(t *testing.T, timeout time.Duration) net.Listener {
	return listenOn(t, func() bool { return true }, timeout)
}

// listenOn is listen with the PROXY protocol on while on says so.
func listenOn(t *testing.T, on func() bool, timeout time.Duration) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	wl := wrap(ln, on, trustLoopback, timeout)
	t.Cleanup(func() { wl.Close() })
	return wl
}

// dial connects to ln from source ("" for the default), skipping the test where the loopback has no
// such address.
func dial(t *testing.T, ln net.Listener, source string) net.Conn {
	t.Helper()
	var d net.Dialer
	if source != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(source)}
	}
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		if source != "" {
			t.Skipf("cannot connect from %s: %v", source, err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// accept returns the next connection ln accepts, bounded like the client's.
func accept(t *testing.T, ln net.Listener) net.Conn {
	t.Helper()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

func header(t *testing.T, h *proxyproto.Header) string {
	t.Helper()
	b, err := h.Format()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestWrap: a trusted peer's connection has the PROXY header's source as its address (v1, v2; LOCAL
// keeps the proxy's) and must send one; an untrusted peer's is served as it is and may not send one.
func TestWrap(t *testing.T) {
	client6 := &net.TCPAddr{IP: net.ParseIP("2001:db8::9"), Port: 4711}
	edge6 := &net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 443}
	for _, tc := range []struct {
		name       string
		source     string // "" for the trusted proxy
		send       string // before "hello\n"
		wantRemote string // the IP the edge sees; "" for the socket's peer
		wantErr    error  // of the first read
	}{
		{name: "trusted, v1", send: "PROXY TCP4 203.0.113.9 192.0.2.1 4711 80\r\n", wantRemote: "203.0.113.9"},
		{name: "trusted, v1 UNKNOWN", send: "PROXY UNKNOWN\r\n"},
		{name: "trusted, v2", send: header(t, proxyproto.HeaderProxyFromAddrs(2, client6, edge6)), wantRemote: "2001:db8::9"},
		{name: "trusted, v2 LOCAL", send: header(t, &proxyproto.Header{Version: 2, Command: proxyproto.LOCAL})},
		{name: "trusted, v2 naming Unix sockets", send: header(t, proxyproto.HeaderProxyFromAddrs(2,
			&net.UnixAddr{Name: "/a", Net: "unix"}, &net.UnixAddr{Name: "/b", Net: "unix"})), wantErr: errNotTCP},
		{name: "trusted, no header", wantErr: proxyproto.ErrNoProxyProtocol},
		{name: "untrusted, no header", source: untrustedSource, wantRemote: untrustedSource},
		{name: "untrusted, v1", source: untrustedSource, send: "PROXY TCP4 203.0.113.9 192.0.2.1 4711 80\r\n", wantErr: proxyproto.ErrSuperfluousProxyHeader},
		{name: "untrusted, v2", source: untrustedSource, send: header(t, proxyproto.HeaderProxyFromAddrs(2, client6, edge6)),
			wantErr: proxyproto.ErrSuperfluousProxyHeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln := listen(t, HeaderTimeout)
			c := dial(t, ln, tc.source)
			if _, err := io.WriteString(c, tc.send+"hello\n"); err != nil {
				t.Fatal(err)
			}
			sc := accept(t, ln)
			line, err := bufio.NewReader(sc).ReadString('\n')
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("first read: %q, %v; want %v", line, err, tc.wantErr)
				}
				return
			}
			if err != nil || line != "hello\n" {
				t.Fatalf("first read: %q, %v; want \"hello\\n\"", line, err)
			}
			want := tc.wantRemote
			if want == "" {
				want = c.LocalAddr().(*net.TCPAddr).IP.String()
			}
			if got := sc.RemoteAddr().(*net.TCPAddr).IP.String(); got != want {
				t.Errorf("RemoteAddr %s, want %s", sc.RemoteAddr(), want)
			}
		})
	}
}

// TestWrapFollowsOn: whether a connection must open with a header is decided as it is accepted. While
// the PROXY protocol is off, a trusted peer's connection is served as it is: no header needed, and
// one it sends is the connection's first bytes, not its address. Turned on, the next connection
// from the same peer must send one; the connection accepted before stays raw for its whole life.
func TestWrapFollowsOn(t *testing.T) {
	var on atomic.Bool
	ln := listenOn(t, on.Load, HeaderTimeout)
	v1 := "PROXY TCP4 203.0.113.9 192.0.2.1 4711 80\r\n"

	before := dial(t, ln, "")
	if _, err := io.WriteString(before, v1+"hello\n"); err != nil {
		t.Fatal(err)
	}
	raw := accept(t, ln)
	r := bufio.NewReader(raw)
	if line, err := r.ReadString('\n'); err != nil || line != v1 {
		t.Fatalf("off: first read %q, %v; want the header's own bytes", line, err)
	}
	if ip := raw.RemoteAddr().(*net.TCPAddr).IP.String(); ip != "127.0.0.1" {
		t.Errorf("off: RemoteAddr %s, want the socket's peer", raw.RemoteAddr())
	}

	on.Store(true)
	after := dial(t, ln, "")
	if _, err := io.WriteString(after, "hello\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(accept(t, ln)).ReadString('\n'); !errors.Is(err, proxyproto.ErrNoProxyProtocol) {
		t.Fatalf("on: a trusted peer without a header read %v, want %v", err, proxyproto.ErrNoProxyProtocol)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "hello\n" {
		t.Fatalf("on: the connection accepted while off read %q, %v; want its own bytes still", line, err)
	}
}

// TestSilentTrustedPeer: a trusted peer that sends nothing holds its connection only until the
// header's timeout, then the connection's first read fails; Accept was never held up.
func TestSilentTrustedPeer(t *testing.T) {
	ln := listen(t, 50*time.Millisecond)
	dial(t, ln, "")
	sc := accept(t, ln)
	start := time.Now()
	if _, err := sc.Read(make([]byte, 1)); !errors.Is(err, proxyproto.ErrNoProxyProtocol) {
		t.Fatalf("first read: %v, want %v", err, proxyproto.ErrNoProxyProtocol)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the read failed after %v; the header's timeout is 50ms", d)
	}
}

// TestPeerIP: the address a policy decides on, for the peers a listener may report.
func TestPeerIP(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		want string // "" for none
	}{
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.1"), Port: 1}, "192.0.2.1"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.1"), Port: 1}, "192.0.2.1"},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 1, Zone: "eth0"}, "fe80::1"},
		{&net.UnixAddr{Name: "@", Net: "unix"}, ""},
		{nil, ""},
	} {
		got, ok := peerIP(tc.addr)
		if s := got.String(); ok != (tc.want != "") || ok && s != tc.want {
			t.Errorf("peerIP(%v) = %v, %v; want %q", tc.addr, got, ok, tc.want)
		}
	}
}
