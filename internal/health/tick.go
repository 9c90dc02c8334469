package health

import (
	"sync"
	"time"
)

// The gate's fast pauses are shorter than Go's timers can time in an idle process: the runtime parks
// in epoll_wait, whose timeout is in whole milliseconds, so a 200 µs time.Timer fires after about
// 1 ms, and a tenant that starts listening is noticed up to a millisecond late (measured: bound →
// first byte of a unit wake 1.5 ms, against 0.5 ms for systemd socket activation). ticks are the
// fast pauses instead: one process-wide source that ticks every FastPause while any gate is in its
// fast phase, on a timerfd the netpoller watches (tick_linux.go), so a tick wakes the runtime on
// time. It costs one descriptor and one goroutine, only while some gate uses it; where no precise
// source exists (tick_other.go, or timerfd_create failing) the gate falls back to time.Timer.
type ticks struct {
	mu      sync.Mutex
	users   int
	running bool
	next    chan struct{}              // closed at the next tick
	src     tickSource                 // nil until first use, and when none could be made
	failed  bool                       // newTickSource failed: do not retry on every wake
	stopped chan struct{}              // closed when the current run ends (tests wait on it)
	newSrc  func() (tickSource, error) // newTickSource unless a test swaps it
}

// tickSource is a periodic timer: arm starts it (period FastPause), wait blocks until it expired at
// least once, disarm stops it, close releases it.
type tickSource interface {
	arm(period time.Duration) error
	wait() error
	disarm()
	close()
}

var fastTicks ticks

// join registers a gate as a user of the ticks and reports whether they are available; a gate that
// joined calls leave when its fast phase ends.
func (t *ticks) join() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.src == nil && !t.failed {
		if t.newSrc == nil {
			t.newSrc = newTickSource
		}
		src, err := t.newSrc()
		if err != nil {
			t.failed = true
			return false
		}
		t.src = src
	}
	if t.src == nil {
		return false
	}
	if !t.running {
		if err := t.src.arm(FastPause); err != nil {
			return false
		}
		t.running = true
		t.next = make(chan struct{})
		t.stopped = make(chan struct{})
		go t.run(t.next, t.stopped)
	}
	t.users++
	return true
}

func (t *ticks) leave() {
	t.mu.Lock()
	t.users--
	t.mu.Unlock()
}

// tick returns a channel closed at the next tick, or nil when the ticks stopped (their source
// failed): the gate then pauses on a timer. Only a joined gate may call it.
func (t *ticks) tick() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.running {
		return nil
	}
	return t.next
}

// run broadcasts ticks until no gate is left; it disarms the source before it returns, and a later
// join starts a new run.
func (t *ticks) run(next, stopped chan struct{}) {
	defer close(stopped)
	for {
		err := t.src.wait()
		t.mu.Lock()
		close(next)
		if err != nil {
			// Not expected of a timerfd; should it happen, gates pause on timers from now on.
			t.src.close()
			t.src, t.failed, t.running = nil, true, false
			t.mu.Unlock()
			return
		}
		if t.users == 0 {
			t.src.disarm()
			t.running = false
			t.mu.Unlock()
			return
		}
		next = make(chan struct{})
		t.next = next
		t.mu.Unlock()
	}
}
