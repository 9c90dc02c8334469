package activator

// The wake: one attempt at a time, detached from every request, gated on health, released together.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/tenant"
)

// attempt is one wake. done is closed when it ends; err is written before that and read only after.
type attempt struct {
	done chan struct{}
	err  error
	rec  *tracker
	// The release of the requests held on it, for the wake record: how many left the hold once done
	// was closed, and when the last of them did (UnixNano), so the record can show how long letting a
	// herd go took.
	released    atomic.Int64
	lastRelease atomic.Int64
	// waiters counts the requests held on this attempt (guarded by instance.mu). When the wake
	// succeeds, runWake moves them from held to in flight in one step and sets handedOver before it
	// closes done, so a released request goes straight to the proxy without taking instance.mu again:
	// 10,000 requests re-locking one mutex after a herd's release was most of the release's spread.
	waiters    int
	handedOver bool
}

// noteRelease counts one held request let go at now.
func (a *attempt) noteRelease(now time.Time) {
	a.released.Add(1)
	t := now.UnixNano()
	for {
		last := a.lastRelease.Load()
		if t <= last || a.lastRelease.CompareAndSwap(last, t) {
			return
		}
	}
}

// withRelease returns rec (the attempt's finished record) with its release figures filled in.
func (a *attempt) withRelease(rec WakeRecord) WakeRecord {
	if n := a.released.Load(); n > 0 {
		rec.Released = int(n)
		end := rec.Started.Add(rec.Duration)
		rec.ReleaseSpread = max(0, time.Unix(0, a.lastRelease.Load()).Sub(end))
	}
	return rec
}

// Gate is the health gate a woken tenant must pass; *health.Prober is the real one.
type Gate interface {
	// Wait returns nil once the tenant is healthy, health.ErrGone if gone closes first, or an error
	// when ctx ends.
	Wait(ctx context.Context, gone <-chan struct{}) error
}

// ConnGate is a Gate that can also hand over the connection its passing probe used (nil when the
// tenant did not keep it alive). The activator gives it to the route's proxy, so the first released
// request goes out on a connection the tenant has already accepted and served: no dial, and no
// accept in a process that has just started. *health.Prober is one.
type ConnGate interface {
	WaitConn(ctx context.Context, gone <-chan struct{}) (net.Conn, error)
}

// start adopts a running tenant when the backend can tell. It runs as a wake whose waiters see the
// adopted state (or an asleep instance they then wake).
func (in *instance) start() {
	if _, ok := in.backend.(tenant.Adopter); !ok {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.beginWakeLocked("adopt")
}

// beginWakeLocked moves to Waking and starts the wake goroutine.
func (in *instance) beginWakeLocked(trigger string) *attempt {
	att := &attempt{done: make(chan struct{}), rec: newTracker(in.route.Name, in.route.Backing, trigger, in.now)}
	in.wake = att
	in.setStateLocked(Waking)
	in.wg.Add(1)
	go in.runWake(att, trigger == "adopt")
	return att
}

// runWake performs one wake: backend start, then the health gate, on a context detached from every
// request and bounded by the wake budget. All waiters are released together by closing att.done.
func (in *instance) runWake(att *attempt, adopt bool) {
	defer in.wg.Done()
	rec := att.rec
	ctx, cancel := context.WithTimeout(in.root, in.route.WakeBudget)
	defer cancel()

	var (
		life  *tenant.Life
		err   error
		awake = true
	)
	if in.after != nil {
		select {
		case <-in.after:
		case <-ctx.Done():
		}
	}
	if adopt {
		rec.Phase("adopt")
		life, awake, err = in.backend.(tenant.Adopter).Adopt(ctx)
		if err != nil {
			in.logger().Warn("adopt failed; treating the tenant as asleep", "err", err)
			awake, err = false, nil
		}
	} else {
		rec.begin(tenant.PhaseStart)
		life, err = in.backend.Wake(ctx, rec)
		if err == nil && life == nil {
			err = errors.New("backend returned no Life")
		}
	}
	if err == nil && awake {
		rec.mu.Lock()
		rec.provisional = false
		rec.mu.Unlock()
		rec.Phase(tenant.PhaseHealth)
		hctx := ctx
		if b := in.route.Health.Budget; b > 0 {
			var hcancel context.CancelFunc
			hctx, hcancel = context.WithTimeout(ctx, b)
			defer hcancel()
		}
		if in.prober == nil {
			in.prober = in.newGate()
		}
		if cg, ok := in.prober.(ConnGate); ok {
			var c net.Conn
			if c, err = cg.WaitConn(hctx, life.Done()); c != nil {
				in.adoptUpstream(c)
			}
		} else {
			err = in.prober.Wait(hctx, life.Done())
		}
		if errors.Is(err, health.ErrGone) {
			err = fmt.Errorf("%w: %w", err, life.Err())
		}
		if err != nil && !adopt {
			// The tenant started but never turned healthy: it must not keep running behind our back.
			// The stop is a phase of its own, so the record shows how long the gate took (at most
			// its budget) apart from how long the tenant took to stop.
			rec.failed()
			rec.Phase(tenant.PhaseStop)
			sctx, scancel := context.WithTimeout(context.WithoutCancel(in.root), in.route.SleepBudget)
			stop := in.backend.Sleep
			if st, ok := in.backend.(tenant.Stopper); ok {
				stop = st.Stop
			}
			if serr := stop(sctx); serr != nil {
				rec.Note("stopping the unhealthy tenant failed: " + serr.Error())
			}
			scancel()
		}
	}

	result := ResultOK
	switch {
	case err != nil:
		result = ResultFailed
	case adopt && awake:
		result = ResultAdopted
	case adopt:
		result = "adopt_asleep"
	}
	final := rec.finish(result, err)

	in.mu.Lock()
	defer in.mu.Unlock()
	in.lastRec, in.lastAtt = &final, att
	switch {
	case err != nil:
		in.fails++
		backoff := in.route.Backoff.Initial << min(in.fails-1, 20)
		if backoff > in.route.Backoff.Max || backoff <= 0 {
			backoff = in.route.Backoff.Max
		}
		we := &WakeError{Route: in.route.Name, Phase: final.FailedPhase, Err: err, RetryAfter: backoff}
		in.lastErr = we
		att.err = we
		in.until = in.now().Add(backoff)
		in.setStateLocked(Failed)
		in.logger().Warn("wake failed", "trigger", final.Trigger, "phase", final.FailedPhase, "duration", final.Duration,
			"phases", phaseAttr(final.Phases), "retry_in", backoff, "err", err)
		in.metrics.wakeDone(final)
	case !awake:
		in.setStateLocked(Asleep)
	default:
		in.fails = 0
		in.lastErr = nil
		in.life = life
		in.setStateLocked(Awake)
		// The requests held on this wake are in flight from now on; they leave without the lock.
		in.held -= att.waiters
		in.inflight += att.waiters
		att.handedOver = true
		gen := in.lifeGen
		in.wg.Add(1)
		go in.watch(life, gen, in.awakeEnd)
		if in.inflight == 0 && in.held == 0 {
			// Waiters, if any, will acquire and release; with none the idle clock starts now.
			in.armIdleLocked()
		}
	}
	close(att.done)
	// The held requests are on their way; the log line and the metrics are not in their path.
	if err == nil && awake {
		if final.Result == ResultOK {
			in.logger().Info("woke", "trigger", final.Trigger, "duration", final.Duration, "phases", phaseAttr(final.Phases),
				"joined", final.Joined, "notes", final.Notes)
			in.metrics.wakeDone(final)
		} else {
			in.logger().Info("adopted a running tenant")
		}
	}
	in.maybeRetireLocked()
}

// watch notices a tenant that stops on its own while awake.
func (in *instance) watch(life *tenant.Life, gen uint64, awakeEnd <-chan struct{}) {
	defer in.wg.Done()
	select {
	case <-life.Done():
	case <-awakeEnd:
		return
	case <-in.root.Done():
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if gen != in.lifeGen || in.state != Awake {
		return // we put it to sleep ourselves
	}
	in.logger().Warn("tenant stopped on its own", "err", life.Err(), "inflight", in.inflight)
	in.lastSlp = ReasonExited
	in.metrics.slept(in.route.Name, ReasonExited)
	in.setStateLocked(Asleep)
}

// kick starts a wake if the instance is asleep (or its failure backoff is over) and returns at once.
func (in *instance) kick() {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		return
	}
	if in.state == Asleep || (in.state == Failed && !in.now().Before(in.until)) {
		in.beginWakeLocked("admin")
	}
}

// wakeNow wakes the instance without a request (admin API) and waits for the result.
func (in *instance) wakeNow(ctx context.Context) error {
	release, err := in.acquire(ctx, "admin")
	if err != nil {
		return err
	}
	release()
	return nil
}
