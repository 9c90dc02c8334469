package health

import (
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"
)

// patience bounds every wait here; nothing asserts how long a tick took.
const patience = 30 * time.Second

func awaitClosed(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(patience):
		t.Fatalf("%s: not within %v", what, patience)
	}
}

// TestPacer: a joined gate gets ticks from the timerfd; after the last gate leaves and a later one
// joins, it ticks again; Close joins the goroutine, and a closed Pacer has no ticks.
func TestPacer(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the precise ticks are a Linux timerfd; elsewhere gates pause on timers (TestPacerFallback)")
	}
	p := NewPacer()
	for round := range 2 {
		if !p.join() {
			t.Fatalf("round %d: join() = false, want the timerfd ticks", round)
		}
		for i := range 3 {
			c := p.tick()
			if c == nil {
				t.Fatalf("round %d: tick() = nil while joined", round)
			}
			awaitClosed(t, c, "tick "+string(rune('0'+i)))
		}
		p.leave()
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	awaitClosed(t, p.done, "the goroutine returning") // Close returned: it must already have
	if p.join() {
		t.Fatal("join() = true after Close")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close() = %v, want nil", err)
	}
}

// fakeSource is a tickSource the test ticks by hand; wait fails once fail or close is called.
type fakeSource struct {
	ticks  chan struct{} // a send is one expiry
	failed chan struct{} // closed by fail: the wait fails from then on
	end    sync.Once     // closes failed

	mu       sync.Mutex // guards the fields below
	armed    bool
	arms     int
	closes   int
	afterEnd bool // arm or disarm called after close
}

func newFakeSource() *fakeSource {
	return &fakeSource{ticks: make(chan struct{}), failed: make(chan struct{})}
}

func (f *fakeSource) arm(period time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.afterEnd = f.afterEnd || f.closes > 0
	f.armed = true
	f.arms++
	return nil
}

func (f *fakeSource) disarm() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.afterEnd = f.afterEnd || f.closes > 0
	f.armed = false
}

func (f *fakeSource) wait() error {
	select {
	case <-f.ticks:
		return nil
	case <-f.failed:
		return errors.New("read: bad file descriptor")
	}
}

func (f *fakeSource) fail() { f.end.Do(func() { close(f.failed) }) }

func (f *fakeSource) close() error {
	f.fail()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closes++
	return nil
}

func (f *fakeSource) state() (armed bool, arms, closes int, afterEnd bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.armed, f.arms, f.closes, f.afterEnd
}

func fakePacer(t *testing.T) (*Pacer, *fakeSource) {
	t.Helper()
	src := newFakeSource()
	p := newPacer(func() (tickSource, error) { return src, nil })
	t.Cleanup(func() { _ = p.Close() })
	return p, src
}

// TestPacerBroadcast: one tick releases every joined gate at once; the source is armed by the first
// gate to join and disarmed when the last one leaves.
func TestPacerBroadcast(t *testing.T) {
	p, src := fakePacer(t)
	for gate := range 2 {
		if !p.join() {
			t.Fatalf("gate %d: join() = false with a source that arms", gate)
		}
	}
	if armed, arms, _, _ := src.state(); !armed || arms != 1 {
		t.Fatalf("after two joins: armed %v, %d arms; want armed once", armed, arms)
	}
	a, b := p.tick(), p.tick()
	if a != b {
		t.Fatal("two gates waiting for the same tick got different channels")
	}
	src.ticks <- struct{}{}
	awaitClosed(t, a, "the first tick")
	next := p.tick()
	if next == a {
		t.Fatal("tick() after a tick returns the channel already closed")
	}
	p.leave()
	if armed, _, _, _ := src.state(); !armed {
		t.Fatal("disarmed while a gate is still joined")
	}
	p.leave()
	if armed, _, _, _ := src.state(); armed {
		t.Fatal("still armed after the last gate left")
	}
	if !p.join() {
		t.Fatal("join() = false after the gates left")
	}
	if armed, arms, _, _ := src.state(); !armed || arms != 2 {
		t.Fatalf("after a new join: armed %v, %d arms; want armed again", armed, arms)
	}
	p.leave()
}

// TestPacerClose: Close wakes a gate waiting for a tick, which then finds no ticks and pauses on a
// timer; the source is closed once and not touched after; Close returns once the goroutine has.
func TestPacerClose(t *testing.T) {
	p, src := fakePacer(t)
	if !p.join() {
		t.Fatal("join() = false with a source that arms")
	}
	waiting := p.tick()
	if err := p.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	select {
	case <-p.done:
	default:
		t.Fatal("Close returned before the goroutine did")
	}
	awaitClosed(t, waiting, "the tick a gate waited for when Close was called")
	if p.tick() != nil {
		t.Fatal("tick() after Close is not nil: the gate would not fall back to its timer")
	}
	p.leave() // the gate's fast phase ends after Close: no disarm on a closed source
	if p.join() {
		t.Fatal("join() = true after Close")
	}
	_ = p.Close()
	if _, _, closes, afterEnd := src.state(); closes != 1 || afterEnd {
		t.Fatalf("source closed %d times (want 1), armed or disarmed after close: %v", closes, afterEnd)
	}
}

// TestPacerFallback: when the tick source cannot be made, or fails, join and tick say so and the
// gate pauses on timers; the source is made once, not on every wake. A nil Pacer has no ticks.
func TestPacerFallback(t *testing.T) {
	made := 0
	none := newPacer(func() (tickSource, error) { made++; return nil, errors.New("EMFILE") })
	for i := range 2 {
		if none.join() {
			t.Fatalf("join() #%d = true without a tick source", i+1)
		}
	}
	if made != 1 {
		t.Fatalf("the tick source was made %d times, want 1 (no retry per wake)", made)
	}
	if err := none.Close(); err != nil {
		t.Fatalf("Close() without a source = %v", err)
	}

	p, src := fakePacer(t)
	if !p.join() {
		t.Fatal("join() = false with a source that arms")
	}
	waiting := p.tick()
	src.fail() // the source fails on its own, before any Close
	awaitClosed(t, waiting, "the tick a gate waited for when the source failed")
	awaitClosed(t, p.done, "the goroutine ending on the source's error")
	if p.tick() != nil {
		t.Fatal("tick() after the source failed is not nil: the gate would not fall back to its timer")
	}
	p.leave()
	if p.join() {
		t.Fatal("join() = true after the source failed")
	}

	var nilPacer *Pacer
	if nilPacer.join() {
		t.Fatal("a nil Pacer's join() = true")
	}
}

// TestNextPause: the pause is 1/PaceDivisor of the time waited, between FastPause and the interval.
func TestNextPause(t *testing.T) {
	for _, tc := range []struct {
		elapsed, interval, want time.Duration
	}{
		{0, time.Second, FastPause},
		{20 * time.Millisecond, time.Second, FastPause},
		{400 * time.Millisecond, time.Second, 2 * time.Millisecond},
		{10 * time.Second, time.Second, 50 * time.Millisecond},
		{10 * time.Minute, time.Second, time.Second},
		{10 * time.Minute, 50 * time.Microsecond, FastPause}, // never below FastPause
	} {
		if got := nextPause(tc.elapsed, tc.interval); got != tc.want {
			t.Errorf("nextPause(%v, %v) = %v, want %v", tc.elapsed, tc.interval, got, tc.want)
		}
	}
}
