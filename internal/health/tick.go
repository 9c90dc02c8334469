package health

import (
	"sync"
	"time"
)

// Pacer times the gates' fast pauses. They are shorter than Go's timers can time in an idle process:
// the runtime parks in epoll_wait, whose timeout is in whole milliseconds, so a 200 µs time.Timer
// fires after about 1 ms, and a tenant that starts listening is noticed up to a millisecond late
// (measured: bound → first byte of a unit wake 1.5 ms, against 0.5 ms for systemd socket
// activation). A Pacer ticks every FastPause on a timerfd the netpoller watches (tick_linux.go), so a
// tick wakes the runtime on time; it is armed while any gate is in its fast phase and disarmed when
// none is.
//
// One Pacer serves every gate of a process (see WithPacer): it costs one descriptor and one goroutine,
// parked while no gate uses it, from NewPacer to Close. Where no precise source exists
// (tick_other.go, or timerfd_create failing) a Pacer has no goroutine and its gates pause on
// time.Timer. A Pacer is safe for concurrent use.
type Pacer struct {
	src  tickSource    // nil when none could be made
	done chan struct{} // closed when run has returned (at once when src is nil)

	mu     sync.Mutex    // guards the fields below
	users  int           // gates in their fast phase
	next   chan struct{} // closed at the next tick
	failed bool          // src failed or the Pacer is closed: gates pause on timers
	closed bool          // Close was called
}

// tickSource is a periodic timer: arm starts it (period FastPause), wait blocks until it expired at
// least once (or fails once close was called), disarm stops it, close releases it. arm and disarm are
// never called after close.
type tickSource interface {
	arm(period time.Duration) error
	wait() error
	disarm()
	close() error
}

// NewPacer returns a Pacer ticking on a timerfd, or one whose gates pause on timers when no timerfd
// can be had. Its owner calls Close once no gate uses it any more.
func NewPacer() *Pacer { return newPacer(newTickSource) }

func newPacer(newSrc func() (tickSource, error)) *Pacer {
	p := &Pacer{done: make(chan struct{}), next: make(chan struct{})}
	src, err := newSrc()
	if err != nil {
		p.failed = true
		close(p.done)
		return p
	}
	p.src = src
	go p.run()
	return p
}

// Close stops the Pacer's goroutine, waits for it to return and releases the timerfd. A gate still
// in its fast phase is woken and pauses on a timer from then on. Close is idempotent; only the first
// call's error is reported.
func (p *Pacer) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.done
		return nil
	}
	p.closed, p.failed = true, true
	p.mu.Unlock()
	var err error
	if p.src != nil {
		err = p.src.close() // ends the wait in run
	}
	<-p.done
	return err
}

// run broadcasts every tick by closing next, until the source fails (as it does once Close closed it).
func (p *Pacer) run() {
	defer close(p.done)
	for {
		err := p.src.wait()
		p.mu.Lock()
		close(p.next)
		p.next = make(chan struct{})
		if err != nil {
			// Close, or not expected of a timerfd: should it happen, gates pause on timers from
			// now on.
			p.failed = true
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
}

// join registers a gate as a user of the ticks and reports whether they are available; a gate that
// joined calls leave when its fast phase ends. A nil Pacer has no ticks.
func (p *Pacer) join() bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed {
		return false
	}
	if p.users == 0 {
		if err := p.src.arm(FastPause); err != nil {
			return false
		}
	}
	p.users++
	return true
}

func (p *Pacer) leave() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.users--
	if p.users == 0 && !p.failed {
		p.src.disarm()
	}
}

// tick returns a channel closed at the next tick, or nil when the ticks stopped (the Pacer closed or
// its source failed): the gate then pauses on a timer. Only a joined gate may call it.
func (p *Pacer) tick() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed {
		return nil
	}
	return p.next
}
