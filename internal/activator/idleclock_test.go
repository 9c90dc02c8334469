package activator

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// TestIdleClockLateFiringIsStale: the idle clock is one timer, Reset and Stopped. A firing that a
// request's acquire came too late to stop (its callback already waiting for the lock) must not put
// the tenant to sleep after the release that followed armed the clock again: the tenant sleeps one
// whole idle window after that release, not before.
func TestIdleClockLateFiringIsStale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		_, in := newTestServer(t, b, passGate{})
		rel, err := in.acquire(context.Background(), triggerRequest)
		if err != nil {
			t.Fatal(err)
		}
		rel() // arms the clock: its window ends a minute from now

		in.mu.Lock()
		time.Sleep(time.Minute) // synctest's clock: the timer fires, and its callback waits for mu
		// What acquire and release do, while the callback waits.
		in.inflight++
		in.disarmIdleLocked()
		in.inflight--
		in.armIdleLocked()
		stale := in.idleStale
		in.mu.Unlock()
		if stale != 1 {
			t.Fatalf("idleStale = %d after a Stop that came too late, want 1", stale)
		}
		synctest.Wait() // the late callback has run
		if n, st := b.sleeps.Load(), in.status().State; n != 0 || st != "awake" {
			t.Fatalf("after the late firing: %d sleeps, state %s; want 0, awake", n, st)
		}

		time.Sleep(time.Minute - time.Second)
		synctest.Wait()
		if n := b.sleeps.Load(); n != 0 {
			t.Fatalf("slept %d times before the re-armed window ended", n)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if n, st := b.sleeps.Load(), in.status().State; n != 1 || st != "asleep" {
			t.Fatalf("after the re-armed window: %d sleeps, state %s; want 1, asleep", n, st)
		}
	})
}
