package redfish

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/activator/activator/internal/tenant"
)

// ErrPoweredOff is the Life error of a node that powered off while awake, without the activator
// asking.
var ErrPoweredOff = errors.New("node powered off on its own")

// watcher is one background goroutine of the Backend: the poll of one Life (started when a node is
// found On) or the undo of a failed wake (see startUndo). Both are stopped (and joined) by Sleep, Close
// and the next Wake.
type watcher struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startWatch starts polling PowerState every watch_interval; when the node is found Off the Life
// ends with ErrPoweredOff. Read errors are logged and the poll goes on: a BMC hiccup is not a dead node.
// Once the BMC has rejected the credentials, though, the poll stops logging in with them (see
// roundRead) but goes on pausing, and logs in again once they change or a call with them succeeds.
func (b *Backend) startWatch(life *tenant.Life) {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{cancel: cancel, done: make(chan struct{})}
	b.swapWatch(w)
	go func() {
		defer close(w.done)
		b.watchLoop(ctx, life)
	}()
}

func (b *Backend) watchLoop(ctx context.Context, life *tenant.Life) {
	every := b.s.WatchInterval.D()
	failing, held := false, loopHold{}
	for {
		// Only the watch ends a Life while it runs (Sleep stops the watch first), but a Life that has
		// ended needs no watch.
		if b.pause(ctx, every) != nil || life.Err() != nil {
			return
		}
		st, err := b.roundRead(ctx, "power-state watch", &held)
		switch {
		case ctx.Err() != nil:
			return
		case held.on:
			continue // roundRead said so
		case err != nil:
			if !failing {
				b.log.Warn("cannot read the awake node's power state; will keep trying", "err", err, "every", every)
			}
			failing = true
			continue
		case failing:
			b.log.Info("reading the node's power state works again")
			failing = false
		}
		if st.PowerState == stateOff {
			b.log.Warn("node powered off while awake", "system", st.ID)
			life.End(fmt.Errorf("%s: %w (PowerState Off)", b.bmc.nodeName(), ErrPoweredOff))
			return
		}
	}
}

// loopHold is a background loop's state of being held back by rejected credentials (see roundRead).
type loopHold struct {
	on bool    // the loop is held back
	id credsID // on the credentials with this fingerprint
}

// roundRead is one round's read of PowerState by a background loop (name: "power-state watch", "undo
// of the failed wake"). When the BMC has rejected the credentials it would log in with (bmc.heldBack),
// it sends nothing and returns that ErrCredentials error: each failed login counts towards the
// account's lockout, and a loop that logged in at each round locked it within the hour. *held is the
// loop's state; while held.on the loop need not log the error: roundRead logs at WARN when the loop
// stops logging in (the BMC, the user, the password source, and what makes it try again), once per
// loop and rejected password, and at INFO when it goes on. What was logged outlives the loop (see
// bmc.loopWarned): a held-back sleep restarts the watch at every idle window, and a new watch held
// back on the same credentials says nothing again; it ends when a round gets through, which says so,
// or when a call with the credentials succeeds (a sleep that worked, whose own line says so). A round
// let through by the timed retry whose login is rejected again, or does not get through, leaves the
// loop held back, without a word.
func (b *Backend) roundRead(ctx context.Context, name string, held *loopHold) (*systemState, error) {
	err := b.bmc.heldBack()
	if err == nil {
		// Asked before the read, whose success forgets it.
		warned := b.bmc.loopWarnedNow()
		var st *systemState
		st, err = b.bmc.readOnce(ctx)
		// A rejection of the credentials is noted (unless none were sent: a service root that wants
		// them), so that the next round is held back.
		if err == nil || b.bmc.heldBack() == nil {
			if held.on || warned {
				b.log.Info("the credentials changed, or a call with them succeeded: the " + name + " resumes")
			}
			b.bmc.loopWarnedOff()
			*held = loopHold{}
			b.held.Store(nil) // also for a new loop: a wake or sleep that succeeded may have put it right
			return st, err
		}
	}
	id, _ := b.bmc.rejectedCreds()
	if !held.on || held.id != id {
		if b.bmc.warnLoop(name, id) {
			b.log.Warn("BMC rejected the credentials: the "+name+" stops logging in until they change", append(b.bmc.heldAttrs(), "err", err)...)
		}
		*held = loopHold{on: true, id: id}
		b.held.Store(&name)
	}
	return nil, err
}

// stopWatch stops the background poll, if any, and waits for it to return.
func (b *Backend) stopWatch() { b.swapWatch(nil) }

// swapWatch makes w (nil for none) the Backend's poll, then stops the previous one and waits for it.
func (b *Backend) swapWatch(w *watcher) { b.swap(&b.watch, w) }

// swap makes w (nil for none) the goroutine in *slot (a field guarded by b.mu), then stops the
// previous one and waits for it.
func (b *Backend) swap(slot **watcher, w *watcher) {
	b.mu.Lock()
	old := *slot
	*slot = w
	b.mu.Unlock()
	if old != nil {
		old.cancel()
		<-old.done
	}
}

// startUndo starts undoing a failed wake in the background: for the route's sleep_budget (undoWindow)
// it reads PowerState every poll_interval, and as soon as the node is On or PoweringOn (at once when it
// was on its way up at the failure, later when the BMC carried the Reset out after the wake had given
// up) it powers the node off as Sleep does, within a sleep_budget of its own, and ends. Other errors
// that retrying cannot fix end it early; rejected credentials pause it instead, without logging in,
// until they change (see roundRead). The undo is owned by the Backend: the next Wake, Sleep or Close
// stops and joins it before touching the node.
func (b *Backend) startUndo() {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{cancel: cancel, done: make(chan struct{})}
	b.swap(&b.undo, w)
	go func() {
		defer close(w.done)
		b.undoLoop(ctx)
	}()
}

// stopUndo stops the undo of a failed wake, if any, and waits for it to return.
func (b *Backend) stopUndo() { b.swap(&b.undo, nil) }

func (b *Backend) undoLoop(ctx context.Context) {
	window := b.s.undoWindow
	wctx, cancel := context.WithTimeout(ctx, window)
	defer cancel()
	every := b.s.PollInterval.D()
	polls := int(window/max(every, time.Millisecond)) + 2
	failing, held := false, loopHold{}
	for range polls {
		st, err := b.roundRead(wctx, "undo of the failed wake", &held)
		switch {
		case wctx.Err() != nil:
		case held.on:
			// roundRead said so; the next round may find other credentials.
		case tenant.ClassOf(err) == tenant.ClassTerminal:
			// Retrying cannot help: a certificate, the configuration.
			b.log.Error("cannot undo the failed wake: the node's power state cannot be read", "err", err)
			return
		case err != nil:
			if !failing {
				b.log.Warn("undo of the failed wake: cannot read the node's power state; will keep trying", "err", err)
			}
			failing = true
		case st.PowerState == stateOn || st.PowerState == statePoweringOn:
			b.log.Warn("node came on after its wake failed: powering it off", "system", st.ID, "power_state", st.PowerState)
			sctx, scancel := context.WithTimeout(ctx, b.s.undoWindow)
			err := b.powerOff(sctx, "undo")
			scancel()
			if err != nil {
				b.log.Error("undo of the failed wake: the node could not be powered off", "err", err)
			} else {
				b.log.Info("undo of the failed wake: node powered off", "system", st.ID)
			}
			return
		default:
			failing = false
		}
		if err := b.pause(wctx, every); err != nil {
			break
		}
	}
	switch {
	case ctx.Err() != nil:
	case held.on:
		b.log.Error("undo of the failed wake gave up: the BMC rejected the credentials, and they did not change in time: the node may be on", "window", window)
	default:
		b.log.Info("undo of the failed wake: the node did not come on", "window", window)
	}
}
