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

// watcher is the background poll of one Life. It is owned by the Backend: started when a node is
// found On, stopped (and joined) by Sleep, Close and the next Wake.
type watcher struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startWatch starts polling PowerState every watch_interval; when the node is found Off the Life
// ends with ErrPoweredOff. Read errors are logged and the poll goes on: a BMC hiccup is not a dead node.
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
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-life.Done():
			return
		case <-t.C:
		}
		st, err := b.bmc.readOnce(ctx)
		switch {
		case ctx.Err() != nil:
			return
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

// stopWatch stops the background poll, if any, and waits for it to return.
func (b *Backend) stopWatch() { b.swapWatch(nil) }

// swapWatch makes w (nil for none) the Backend's poll, then stops the previous one and waits for it.
func (b *Backend) swapWatch(w *watcher) {
	b.mu.Lock()
	old := b.watch
	b.watch = w
	b.mu.Unlock()
	if old != nil {
		old.cancel()
		<-old.done
	}
}
