package main

import (
	"context"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

// loopHarness runs a reloadLoop on channels the test drives: SIGHUPs, file events, the settle
// windows (each one opened is handed to the test, which ends it by sending on it) and the reloads
// (each one reports its trigger as it begins and returns when the test lets it). The loop is joined
// at cleanup, and a reload nobody expected fails the test.
type loopHarness struct {
	t       *testing.T
	hup     chan os.Signal      // buffered 1, as the reloader's
	events  chan fsnotify.Event // buffered: a send is an event pending for the loop
	windows chan chan time.Time // every settle window the loop opened, in order
	reloads chan string         // every reload's trigger, as it begins
	release chan struct{}       // a reload returns once it receives here
	cancel  context.CancelFunc
	done    chan struct{} // closed when run returned
	once    sync.Once
}

const configName = "activator.yaml"

func startLoop(t *testing.T) *loopHarness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &loopHarness{
		t:       t,
		hup:     make(chan os.Signal, 1),
		events:  make(chan fsnotify.Event, 16),
		windows: make(chan chan time.Time, 16),
		reloads: make(chan string, 16),
		release: make(chan struct{}),
		cancel:  cancel,
		done:    make(chan struct{}),
	}
	l := &reloadLoop{
		hup:    h.hup,
		events: h.events,
		file:   configName,
		settle: func() <-chan time.Time {
			w := make(chan time.Time, 1)
			h.windows <- w
			return w
		},
		reload: func(trigger string) {
			h.reloads <- trigger
			select {
			case <-h.release:
			case <-ctx.Done():
			}
		},
	}
	go func() {
		defer close(h.done)
		l.run(ctx)
	}()
	t.Cleanup(h.stop)
	return h
}

// stop ends the loop, joins it, and checks that no reload is left unexpected.
func (h *loopHarness) stop() {
	h.once.Do(func() {
		h.cancel()
		select {
		case <-h.done:
		case <-time.After(patience):
			h.t.Fatalf("the reload loop did not return within %v of its ctx ending", patience)
		}
		if n := len(h.reloads); n > 0 {
			h.t.Errorf("%d more reloads than expected (first trigger %q)", n, <-h.reloads)
		}
	})
}

// signal sends a SIGHUP the way signal.Notify does: dropped when one is already pending.
func (h *loopHarness) signal() {
	select {
	case h.hup <- syscall.SIGHUP:
	default:
	}
}

func (h *loopHarness) event(name string, op fsnotify.Op) {
	h.events <- fsnotify.Event{Name: "/etc/activator/" + name, Op: op}
}

// window returns the next settle window the loop opened.
func (h *loopHarness) window() chan<- time.Time {
	h.t.Helper()
	select {
	case w := <-h.windows:
		return w
	case <-time.After(patience):
		h.t.Fatalf("no settle window opened within %v", patience)
		return nil
	}
}

// reloaded waits for the next reload to begin and checks its trigger; the reload runs until finish.
func (h *loopHarness) reloaded(want string) {
	h.t.Helper()
	select {
	case got := <-h.reloads:
		if got != want {
			h.t.Errorf("reload triggered by %q, want %q", got, want)
		}
	case <-time.After(patience):
		h.t.Fatalf("no reload (%s) within %v", want, patience)
	}
}

func (h *loopHarness) finish() { h.release <- struct{}{} }

// TestReloadLoop: bursts of triggers coalesce into one reload (see reloadLoop).
func TestReloadLoop(t *testing.T) {
	t.Run("file events reload once, when the last one's window ends", func(t *testing.T) {
		h := startLoop(t)
		h.event(configName, fsnotify.Write)
		w1 := h.window()
		h.event(configName+".swp", fsnotify.Write) // another file
		h.event(configName, fsnotify.Chmod)        // not a change of its content
		h.event(configName, fsnotify.Rename)
		w2 := h.window()
		h.event(configName, fsnotify.Create)
		w3 := h.window()
		w1 <- time.Time{} // superseded windows end without a reload
		w2 <- time.Time{}
		w3 <- time.Time{}
		h.reloaded("file change")
		h.finish()
		h.stop()
		if n := len(h.windows); n > 0 {
			t.Errorf("events on another file or not changing it opened %d settle windows", n)
		}
	})

	t.Run("a SIGHUP reloads at once and closes the open window", func(t *testing.T) {
		h := startLoop(t)
		h.event(configName, fsnotify.Write)
		w := h.window()
		h.signal()
		h.reloaded("SIGHUP")
		h.finish()
		w <- time.Time{} // closed by the SIGHUP's reload, which read the file
		h.signal()
		h.reloaded("SIGHUP")
		h.finish()
	})

	t.Run("triggers pending when a reload begins are dropped", func(t *testing.T) {
		h := startLoop(t)
		h.signal()
		h.reloaded("SIGHUP")
		// While this reload runs, more triggers arrive (the second SIGHUP is dropped on arrival).
		h.signal()
		h.signal()
		h.event(configName, fsnotify.Write)
		h.event(configName, fsnotify.Rename)
		h.finish()
		// They came after the first reload read the file: one more reload, and it begins with none
		// of them pending.
		h.reloaded("SIGHUP")
		if len(h.hup) > 0 || len(h.events) > 0 {
			t.Errorf("the reload began with triggers pending: %d SIGHUP, %d file events", len(h.hup), len(h.events))
		}
		// Windows the loop opened for those events before it took the SIGHUP closed with it.
		for len(h.windows) > 0 {
			w := <-h.windows
			w <- time.Time{}
		}
		h.finish()
	})
}
