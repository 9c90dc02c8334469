package activator

// Sleep and retirement: the idle clock, putting the tenant down, and closing the instance.

import (
	"context"
	"time"

	"github.com/activator/activator/internal/tenant"
)

// armIdleLocked starts the idle clock. The timer's callback only flips state and starts the owned sleep
// goroutine; a generation counter makes a timer that fired late (after a new request) harmless.
func (in *instance) armIdleLocked() {
	if in.route.Idle <= 0 || in.closed {
		return
	}
	in.idleGen++
	gen := in.idleGen
	if in.idle != nil {
		in.idle.Stop()
	}
	in.idle = time.AfterFunc(in.route.Idle, func() {
		in.mu.Lock()
		defer in.mu.Unlock()
		if gen != in.idleGen || in.state != Awake || in.inflight > 0 || in.held > 0 {
			return
		}
		in.beginSleepLocked(ReasonIdle)
	})
}

// beginSleepLocked moves an awake instance to Stopping and starts the sleep goroutine.
func (in *instance) beginSleepLocked(reason string) chan struct{} {
	done := make(chan struct{})
	in.stopDone = done
	in.setStateLocked(Stopping)
	in.wg.Add(1)
	go in.runSleep(reason, done)
	return done
}

func (in *instance) runSleep(reason string, done chan struct{}) {
	defer in.wg.Done()
	start := in.now()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(in.root), in.route.SleepBudget)
	err := in.backend.Sleep(ctx)
	cancel()
	// While Stopping nothing is proxied and no wake starts, so no connection a wake's gate handed over
	// is dropped.
	in.dropUpstream()
	in.mu.Lock()
	defer in.mu.Unlock()
	in.lastSlp = reason
	in.series.slept(reason)
	in.slpErr = nil
	if err != nil {
		// The instance is marked asleep all the same: the next request wakes it, and a backing's
		// wake takes a tenant it finds still running as it is (a unit still active, a node still
		// on). The failure stays in the status and the admin sleep's answer until a sleep succeeds.
		in.slpErr = &SleepError{Route: in.route.Name, Reason: reason, Err: err}
		in.series.sleepFailed()
		in.logger().Error("sleep failed; the tenant may still run", "reason", reason, "err", err)
	} else {
		in.logger().Info("slept", "reason", reason, "duration", in.now().Sub(start))
	}
	in.setStateLocked(Asleep)
	close(done)
	in.maybeRetireLocked()
}

// sleepNow puts the instance to sleep (admin API). It waits for a wake in progress, and returns once
// the instance is asleep; requests that arrive meanwhile wake it again afterwards. When the sleep it
// started failed, it returns that *SleepError (the instance is marked asleep all the same).
func (in *instance) sleepNow(ctx context.Context, reason string) error {
	for {
		in.mu.Lock()
		var wait <-chan struct{}
		switch in.state {
		case Asleep, Failed:
			in.mu.Unlock()
			return nil
		case Waking:
			wait = in.wake.done
		case Stopping:
			wait = in.stopDone
		case Awake:
			done := in.beginSleepLocked(reason)
			in.mu.Unlock()
			select {
			case <-done:
			case <-ctx.Done():
				return ctx.Err()
			}
			in.mu.Lock()
			defer in.mu.Unlock()
			if in.slpErr != nil {
				return in.slpErr
			}
			return nil
		}
		in.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// retire marks the instance as removed or replaced: it sleeps (ReasonReload) as soon as no request is
// in flight or held, then closes its backend and its upstream connections and lets go of the route's
// metric series. retired is closed when that is done.
func (in *instance) retire() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.retiring = true
	in.maybeRetireLocked()
}

func (in *instance) maybeRetireLocked() {
	if !in.retiring || in.closed || in.inflight > 0 || in.held > 0 {
		return
	}
	switch in.state {
	case Awake:
		in.beginSleepLocked(ReasonReload)
	case Asleep, Failed:
		in.closed = true
		in.wg.Add(1)
		go func() {
			defer in.wg.Done()
			in.teardown()
			close(in.retired)
		}()
	}
	// Waking or Stopping: runWake/runSleep call back here when they finish.
}

// shutdown stops accepting requests and joins every goroutine; the backend's Close decides what
// happens to a running tenant. Called once, when the activator exits.
func (in *instance) shutdown() {
	in.mu.Lock()
	wasClosed := in.closed
	in.closed = true
	in.idleGen++
	if in.idle != nil {
		in.idle.Stop()
	}
	in.mu.Unlock()
	in.wg.Wait()
	if !wasClosed {
		in.teardown()
	}
}

// teardown lets go of what the instance holds: its backend, its upstream connections and its route's
// metric series. It runs once: after the instance's last sleep, when it has retired or at shutdown, or
// when Apply gives up on a config before the instance started.
func (in *instance) teardown() {
	in.closeBackend()
	in.dropUpstream()
	in.series.release()
}

func (in *instance) closeBackend() {
	if c, ok := in.backend.(tenant.Closer); ok {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(in.root), in.route.SleepBudget)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			in.logger().Warn("closing the backend failed", "err", err)
		}
	}
}
