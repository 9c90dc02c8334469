package activator

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/activator/activator/internal/registry"
)

// TestHoldLimitSlots: requests first held within one 64th of hold.max_time share one deadline, a 64th
// after the first of them has been held for max_time. None is held for less than max_time, nor for
// more than max_time and a 64th; a request held in a later 64th gets a later deadline.
func TestHoldLimitSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxTime = 64 * time.Second // slots of a second
		b := &fakeBackend{wakeGate: make(chan struct{})}
		_, in := newTestServer(t, b, passGate{}, func(r *registry.Route) {
			r.WakeBudget = 10 * time.Minute // the wake outlasts every hold
			r.Hold = registry.Hold{MaxRequests: 10, MaxTime: maxTime}
		})
		start := time.Now()
		type result struct {
			err              error
			heldAt, answered time.Duration
		}
		results := make(chan result, 3)
		hold := func() {
			at := time.Since(start)
			go func() {
				_, err := in.acquire(context.Background(), triggerRequest)
				results <- result{err, at, time.Since(start)}
			}()
			synctest.Wait() // held
		}
		hold()                             // at 0: the first slot, which ends at 1s; its deadline is 65s
		time.Sleep(500 * time.Millisecond) // the same slot
		hold()
		time.Sleep(time.Second) // at 1.5s: the next slot, whose deadline is 66.5s
		hold()
		want := map[time.Duration]time.Duration{0: 65 * time.Second, 500 * time.Millisecond: 65 * time.Second, 1500 * time.Millisecond: 66500 * time.Millisecond}
		for range 3 {
			r := <-results
			if !errors.Is(r.err, ErrHoldTimeout) {
				t.Fatalf("request held at %v: %v, want ErrHoldTimeout", r.heldAt, r.err)
			}
			if r.answered != want[r.heldAt] {
				t.Errorf("request held at %v answered at %v, want %v", r.heldAt, r.answered, want[r.heldAt])
			}
			if held := r.answered - r.heldAt; held < maxTime || held > maxTime+maxTime/holdSlots {
				t.Errorf("request held at %v was held %v, want %v to %v", r.heldAt, held, maxTime, maxTime+maxTime/holdSlots)
			}
		}
		close(b.wakeGate)
	})
}

// TestHoldLimitShutdown: the shared hold limit ends with the server too: Shutdown answers the requests
// still held with ErrClosed, not with ErrHoldTimeout.
func TestHoldLimitShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{wakeGate: make(chan struct{})}
		s, in := newTestServer(t, b, passGate{}, func(r *registry.Route) {
			r.WakeBudget = 10 * time.Minute
			r.Hold = registry.Hold{MaxRequests: 10, MaxTime: time.Hour}
		})
		errs := make(chan error, 1)
		go func() { _, err := in.acquire(context.Background(), triggerRequest); errs <- err }()
		synctest.Wait()
		done := make(chan error, 1)
		go func() { done <- s.Shutdown(context.Background()) }() // no deadline: held requests are answered at once
		if err := <-errs; !errors.Is(err, ErrClosed) {
			t.Fatalf("held request at shutdown: %v, want ErrClosed", err)
		}
		if err := <-done; err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	})
}

// A wake's hand-over settles (every request it handed over has left the hold) by counting alone, never
// by the backstop: with some of the herd's requests canceled as the wake ends, each of them leaves
// either as released or through leave, and each counts out once. A request that waits for the
// settling, as a parked one does, goes on at once, with no time passing. A lone request settles its
// wake itself.
func TestHandOverSettles(t *testing.T) {
	for round := range 20 {
		synctest.Test(t, func(t *testing.T) {
			b := &fakeBackend{wakeGate: make(chan struct{})}
			_, in := newTestServer(t, b, passGate{})
			const n = 50
			cancels := make([]context.CancelFunc, n)
			waited := make([]time.Duration, n)
			handed := make([]bool, n)
			var wg sync.WaitGroup
			for i := range n {
				ctx, cancel := context.WithCancel(context.Background())
				cancels[i] = cancel
				wg.Go(func() {
					var c holdCharge
					release, err := in.acquireFor(ctx, triggerRequest, &c)
					if err != nil {
						return
					}
					defer release()
					if handed[i] = c.handedBy != nil; handed[i] {
						start := time.Now()
						c.handedBy.awaitSettled(context.Background())
						waited[i] = time.Since(start)
					}
				})
			}
			synctest.Wait()
			for i := range n {
				if (i+round)%3 == 0 {
					cancels[i]()
				}
			}
			close(b.wakeGate)
			wg.Wait()
			got := 0
			for i := range n {
				if handed[i] {
					got++
				}
				if waited[i] != 0 {
					t.Errorf("request %d waited %v for its wake to settle, want no time at all", i, waited[i])
				}
				cancels[i]()
			}
			if got == 0 {
				t.Error("no request was handed over")
			}
		})
	}
	synctest.Test(t, func(t *testing.T) {
		_, in := newTestServer(t, &fakeBackend{}, passGate{})
		var c holdCharge
		release, err := in.acquireFor(context.Background(), triggerRequest, &c)
		if err != nil || c.handedBy == nil {
			t.Fatalf("a lone request: err %v, handed over by %v", err, c.handedBy)
		}
		defer release()
		select {
		case <-c.handedBy.settled:
		default:
			t.Error("a lone request's wake has not settled once it left the hold")
		}
	})
}
