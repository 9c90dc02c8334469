package sockdiag

import (
	"errors"
	"net"
	"net/netip"
	"runtime"
	"syscall"
	"testing"
)

func open(t *testing.T) *Conn {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the lookup is Linux's sock_diag")
	}
	c, err := Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestListening: the kernel's lookup finds a listener on the loopback address, on the wildcard
// address and a dual-stack one, and nothing once it is closed or at an address nobody listens on.
func TestListening(t *testing.T) {
	c := open(t)
	for _, tc := range []struct{ listen, lookup string }{
		{"127.0.0.1:0", "127.0.0.1"},
		{"0.0.0.0:0", "127.0.0.1"},
		{"[::]:0", "127.0.0.1"},
		{"[::1]:0", "::1"},
		{"127.0.0.1:0", "::ffff:127.0.0.1"},
	} {
		t.Run(tc.listen+" as "+tc.lookup, func(t *testing.T) {
			ln, err := net.Listen("tcp", tc.listen)
			if err != nil {
				t.Skipf("cannot listen on %s here: %v", tc.listen, err)
			}
			at := netip.AddrPortFrom(netip.MustParseAddr(tc.lookup), uint16(ln.Addr().(*net.TCPAddr).Port))
			if up, err := c.Listening(at); err != nil || !up {
				t.Errorf("Listening(%v) with %s open = %v, %v; want true, nil", at, tc.listen, up, err)
			}
			ln.Close()
			if up, err := c.Listening(at); err != nil || up {
				t.Errorf("Listening(%v) after close = %v, %v; want false, nil", at, up, err)
			}
		})
	}
}

// lookupFunc is a Lookup the test writes.
type lookupFunc func(netip.AddrPort) (bool, error)

func (f lookupFunc) Listening(at netip.AddrPort) (bool, error) { return f(at) }

// TestSeesListeners: the real lookup sees the listener made for the question, and it is closed after;
// a lookup that finds nothing (a kernel without TCP socket diagnostics) or fails does not.
func TestSeesListeners(t *testing.T) {
	c := open(t)
	lo := netip.MustParseAddr("127.0.0.1")
	var asked netip.AddrPort
	spy := lookupFunc(func(at netip.AddrPort) (bool, error) { asked = at; return c.Listening(at) })
	if !SeesListeners(spy, lo) {
		t.Fatal("SeesListeners(the kernel's lookup) = false, want true")
	}
	if asked.Addr() != lo || asked.Port() == 0 {
		t.Fatalf("asked about %v, want 127.0.0.1 at a port of its own", asked)
	}
	if up, err := c.Listening(asked); err != nil || up {
		t.Errorf("the listener made for the question is still open after: %v, %v", up, err)
	}
	if ln, err := net.Listen("tcp", "[::1]:0"); err == nil {
		ln.Close()
		if !SeesListeners(c, netip.MustParseAddr("::1")) {
			t.Error("SeesListeners(::1) = false, want true")
		}
	}
	blind := lookupFunc(func(netip.AddrPort) (bool, error) { return false, nil })
	if SeesListeners(blind, lo) {
		t.Error("SeesListeners(a lookup that finds nothing) = true")
	}
	failing := lookupFunc(func(netip.AddrPort) (bool, error) { return true, syscall.EIO })
	if SeesListeners(failing, lo) {
		t.Error("SeesListeners(a failing lookup) = true")
	}
	if SeesListeners(c, netip.MustParseAddr("192.0.2.1")) { // TEST-NET-1: not an address of this host
		t.Error("SeesListeners(an address this host cannot listen on) = true")
	}
}

// TestTrusted: this kernel's lookups see this process's listeners, for both families where the host
// has them, and the answer is the same when asked again.
func TestTrusted(t *testing.T) {
	open(t)
	lo := netip.MustParseAddr("127.0.0.5")
	first := Trusted(lo)
	if !first {
		t.Error("Trusted(127.0.0.5) = false on a kernel whose lookups work")
	}
	if again := Trusted(lo); again != first {
		t.Errorf("Trusted(127.0.0.5) = %v, then %v", first, again)
	}
	if !Trusted(netip.MustParseAddr("::ffff:127.0.0.1")) {
		t.Error("Trusted(::ffff:127.0.0.1) = false: a mapped address is IPv4's")
	}
	if ln, err := net.Listen("tcp", "[::1]:0"); err == nil {
		ln.Close()
		if !Trusted(netip.IPv6Loopback()) {
			t.Error("Trusted(::1) = false on a host with IPv6 loopback")
		}
	}
}

// TestOpenElsewhere: off Linux, Open says there is no lookup.
func TestOpenElsewhere(t *testing.T) {
	if runtime.GOOS == "linux" {
		t.Skip("Linux has the lookup")
	}
	if _, err := Open(); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Open() = %v, want ErrUnsupported", err)
	}
}
