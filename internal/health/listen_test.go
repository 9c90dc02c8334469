package health

import (
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

// fakeListen is a listenSource whose answers the test sets.
type fakeListen struct {
	up     bool
	err    error
	calls  int
	closed bool
	// seen is what the source finds when asked about another address than at (the self-check).
	seen bool
	at   netip.AddrPort
}

func (f *fakeListen) Listening(at netip.AddrPort) (bool, error) {
	f.calls++
	if at != f.at {
		return f.seen, nil
	}
	return f.up, f.err
}

func (f *fakeListen) Close() error { f.closed = true; return nil }

var testAt = netip.MustParseAddrPort("127.0.0.1:9")

func newState(f *fakeListen) *listenState {
	f.at = testAt
	return &listenState{at: testAt, refused: refusedAt(testAt), open: func() (listenSource, error) { return f, nil }}
}

// TestListenCheckSkip: while nothing listens, an attempt dials only when the last dial is forceDial
// old; once the lookup finds a listener, every attempt dials.
func TestListenCheckSkip(t *testing.T) {
	f := &fakeListen{seen: true}
	st := newState(f)
	lc := st.openCheck()
	if lc == nil {
		t.Fatal("openCheck = nil, want the lookups")
	}
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at   time.Duration
		up   bool
		skip bool
	}{
		{0, false, false}, // the first attempt dials
		{200 * time.Microsecond, false, true},
		{forceDial - time.Microsecond, false, true},
		{forceDial, false, false}, // forced
		{forceDial + 200*time.Microsecond, false, true},
		{forceDial + 400*time.Microsecond, true, false}, // listening: dial
		{forceDial + 600*time.Microsecond, true, false},
	}
	for i, s := range steps {
		f.up = s.up
		now := t0.Add(s.at)
		if got := lc.skip(now); got != s.skip {
			t.Fatalf("step %d (+%v, listening %v): skip = %v, want %v", i, s.at, s.up, got, s.skip)
		}
		if !s.skip {
			lc.dialed(now, st.refused)
		}
	}
	if st.off.Load() {
		t.Error("refused dials turned the lookups off")
	}
	lc.close()
	if !f.closed {
		t.Error("close did not close the source")
	}
}

// TestListenCheckContradicted: a forced dial that reaches a listener the lookup still does not see
// turns the lookups off for the Prober; one the tenant answered just after the lookup does not.
func TestListenCheckContradicted(t *testing.T) {
	t0 := time.Unix(1000, 0)
	t.Run("listener the lookup misses", func(t *testing.T) {
		f := &fakeListen{seen: true}
		st := newState(f)
		lc := st.openCheck()
		if lc.skip(t0) {
			t.Fatal("the first attempt skipped its dial")
		}
		lc.dialed(t0, nil) // it passed, while the lookup still finds nothing
		if !st.off.Load() {
			t.Fatal("the lookups stay on after a dial they could not see")
		}
		if lc.skip(t0.Add(time.Microsecond)) {
			t.Error("an attempt skipped its dial after the lookups were turned off")
		}
		if st.openCheck() != nil {
			t.Error("the next gate got lookups")
		}
	})
	t.Run("tenant started meanwhile", func(t *testing.T) {
		f := &fakeListen{seen: true}
		st := newState(f)
		lc := st.openCheck()
		lc.skip(t0)
		f.up = true // it began listening between the lookup and the dial
		lc.dialed(t0, nil)
		if st.off.Load() {
			t.Error("a tenant that began listening turned the lookups off")
		}
	})
}

// TestListenCheckOff: no lookups for a source that fails, for one that does not see a listener it is
// shown (a kernel without TCP socket diagnostics answers every lookup "not found"), and a failed
// lookup ends a gate's lookups.
func TestListenCheckOff(t *testing.T) {
	t.Run("open fails", func(t *testing.T) {
		st := &listenState{at: testAt, open: func() (listenSource, error) { return nil, errors.New("no") }}
		if st.openCheck() != nil || !st.off.Load() {
			t.Error("lookups from a source that cannot be opened")
		}
	})
	t.Run("blind source", func(t *testing.T) {
		f := &fakeListen{seen: false}
		st := newState(f)
		if st.openCheck() != nil || !st.off.Load() {
			t.Error("lookups from a source that does not see this host's listeners")
		}
		if !f.closed {
			t.Error("the blind source was not closed")
		}
	})
	t.Run("lookup fails", func(t *testing.T) {
		f := &fakeListen{seen: true, err: syscall.EIO}
		lc := newState(f).openCheck()
		if lc.skip(time.Unix(1000, 0)) {
			t.Error("an attempt skipped its dial on a failed lookup")
		}
		if lc.skip(time.Unix(1000, 0)) || f.calls != 2 { // the self-check, then one lookup
			t.Errorf("lookups after one failed: %d calls, want 2", f.calls)
		}
	})
	t.Run("not loopback", func(t *testing.T) {
		var st listenState
		if st.openCheck() != nil {
			t.Error("lookups without an address")
		}
	})
}

// TestRefusedAt: a skipped dial fails as a refused one does.
func TestRefusedAt(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, dialErr := net.Dial("tcp", addr)
	if dialErr == nil {
		t.Skip("the closed port answered")
	}
	got := refusedAt(netip.MustParseAddrPort(addr))
	if got.Error() != dialErr.Error() {
		t.Errorf("refusedAt = %q, want %q (a refused dial)", got, dialErr)
	}
	if !errors.Is(got, syscall.ECONNREFUSED) {
		t.Errorf("refusedAt does not wrap ECONNREFUSED: %v", got)
	}
}
