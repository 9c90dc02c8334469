package health

import (
	"errors"
	"runtime"
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

// TestTicks: a joined gate gets ticks; after the last gate leaves, the run ends (disarming the
// timerfd), and a later join starts ticking again.
func TestTicks(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the precise ticks are a Linux timerfd; elsewhere gates pause on timers (TestTicksFallback)")
	}
	var tk ticks
	t.Cleanup(func() {
		if tk.src != nil {
			tk.src.close()
		}
	})
	for round := range 2 {
		if !tk.join() {
			t.Fatalf("round %d: join() = false, want the timerfd ticks", round)
		}
		for i := range 3 {
			c := tk.tick()
			if c == nil {
				t.Fatalf("round %d: tick() = nil while joined", round)
			}
			awaitClosed(t, c, "tick "+string(rune('0'+i)))
		}
		stopped := tk.stopped
		tk.leave()
		awaitClosed(t, stopped, "the run ending after the last gate left")
		if tk.tick() != nil {
			t.Fatalf("round %d: tick() after the run ended is not nil", round)
		}
	}
}

type failingSource struct{ closed bool }

func (f *failingSource) arm(time.Duration) error { return nil }
func (f *failingSource) wait() error             { return errors.New("read: bad file descriptor") }
func (f *failingSource) disarm()                 {}
func (f *failingSource) close()                  { f.closed = true }

// TestTicksFallback: when the tick source cannot be made, or fails, join and tick say so and the
// gate pauses on timers; the source is not retried on every wake.
func TestTicksFallback(t *testing.T) {
	made := 0
	none := ticks{newSrc: func() (tickSource, error) { made++; return nil, errors.New("EMFILE") }}
	if none.join() || none.join() {
		t.Fatal("join() = true without a tick source")
	}
	if made != 1 {
		t.Fatalf("the tick source was made %d times, want 1 (no retry per wake)", made)
	}

	src := &failingSource{}
	broken := ticks{newSrc: func() (tickSource, error) { return src, nil }}
	if !broken.join() {
		t.Fatal("join() = false with a source that arms")
	}
	awaitClosed(t, broken.stopped, "the run ending on the source's error")
	if broken.tick() != nil {
		t.Fatal("tick() after the source failed is not nil: the gate would not fall back to its timer")
	}
	if !src.closed {
		t.Fatal("the failed source was not closed")
	}
	broken.leave()
	if broken.join() {
		t.Fatal("join() = true after the source failed")
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
