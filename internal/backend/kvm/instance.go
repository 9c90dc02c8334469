package kvm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// instance is one QEMU process and its QMP monitor. It owns two goroutines, three with logs: drain,
// which reads QMP events until the connection closes (go-qemu stalls command replies while events go
// unread); watch, which notices QEMU's end (the monitor's EOF, or a SHUTDOWN/GUEST_PANICKED event),
// makes sure the process is gone, closes gone and reports to the backend through onGone; and capLogs,
// which holds QEMU's log files to their cap (logcap.go) until the monitor closes.
//
// An instance ends in one of three ways: QEMU exits (on its own, killed, or after quit), stop kills
// it, or detach lets go of a QEMU that keeps running. After any of them, close joins the goroutines.
type instance struct {
	pid int
	mon *monitor
	log *slog.Logger
	// ramFile: the guest's RAM is the route's RAM file (file mode). Set by the backend once, right
	// after attach; read under the backend's op lock.
	ramFile bool
	// logs are the files QEMU writes without bound (its console, its messages), held to logCap while
	// the instance runs. Set before start.
	logs []string

	monClosed chan struct{} // closed by drain when the event stream ends
	fatal     chan struct{} // closed (once, by drain) on SHUTDOWN or GUEST_PANICKED
	gone      chan struct{} // closed by watch once QEMU has exited; goneErr is set before
	done      chan struct{} // closed when drain and watch have returned
	goneErr   error

	// onGone is called by watch once QEMU has exited, unless the instance was detached; onStop by drain
	// when the guest stops without the backend asking. Neither may block on the instance.
	onGone func(*instance, error)
	onStop func(*instance)

	// wakeMu makes wakeSuspended's check of wantRun and its wake-up one step against a sleep's
	// setWantRun(false). Taken before mu, never under it.
	wakeMu sync.Mutex

	mu        sync.Mutex // guards the fields below
	status    string     // run state: "running", "paused", "inmigrate", "postmigrate", ...
	migration string     // status of the last MIGRATION event
	reason    string     // why QEMU is ending (SHUTDOWN reason, guest panic), "" until then
	changed   chan struct{}
	wantRun   bool // the backend expects the guest to run (a STOP now is unexpected)
	lateStops int  // QMP stops the backend gave up waiting for (stopFailed): QEMU may still do them
	detached  bool
	fatalOnce bool
	// The guest's suspends to RAM (wakeSuspended): when it was last woken, and the suspends since the
	// last line about them, written at suspendLogged.
	wokenAt       time.Time
	suspends      int
	suspendLogged time.Time
}

func newInstance(pid int, mon *monitor, log *slog.Logger, onGone func(*instance, error), onStop func(*instance)) *instance {
	return &instance{
		pid:       pid,
		mon:       mon,
		log:       log.With("qemu_pid", pid),
		monClosed: make(chan struct{}),
		fatal:     make(chan struct{}),
		gone:      make(chan struct{}),
		done:      make(chan struct{}),
		changed:   make(chan struct{}),
		onGone:    onGone,
		onStop:    onStop,
	}
}

// start launches drain and watch; wg is the owner's, so it can join them.
func (in *instance) start(wg *sync.WaitGroup) {
	var local sync.WaitGroup
	local.Add(2)
	wg.Add(1)
	if len(in.logs) > 0 {
		local.Add(1)
		go func() {
			defer local.Done()
			in.capLogs(in.logs)
		}()
	}
	go func() {
		defer local.Done()
		in.drain()
	}()
	go func() {
		defer local.Done()
		in.watch()
	}()
	go func() {
		defer wg.Done()
		local.Wait()
		close(in.done)
	}()
}

func (in *instance) drain() {
	defer close(in.monClosed)
	for ev := range in.mon.events {
		in.handle(ev.Event, ev.Data)
	}
}

func (in *instance) handle(name string, data map[string]any) {
	str := func(k string) string { s, _ := data[k].(string); return s }
	in.mu.Lock()
	var stopCB, fatal, late, wakeUp bool
	switch name {
	case "STOP":
		in.status = "paused"
		if in.lateStops > 0 {
			// The backend's own stop, answered too late: not someone else's. The sleep that sent it
			// failed, and the backend took the guest back as running, so it is continued.
			in.lateStops--
			late = in.wantRun
		} else {
			stopCB = in.wantRun
			in.wantRun = false
		}
	case "RESUME":
		in.status = "running"
	case "SHUTDOWN":
		switch {
		case strings.HasPrefix(in.reason, suspendedReason):
			// The quit that follows a suspend the guest could not be woken from is ours, not the reason.
		case str("reason") == "guest-reset" && !in.wokenAt.IsZero() && time.Since(in.wokenAt) < wokenWindow:
			in.reason = resetAtWakeReason
		default:
			in.reason = "guest shut down (" + str("reason") + ")"
		}
		fatal = true
	case "GUEST_PANICKED":
		in.reason = "guest panicked"
		fatal = true
	case "SUSPEND":
		// The guest suspended itself to RAM (ACPI S3): its vCPUs stop and it answers nothing. The
		// backing decides when a guest sleeps, so one it expects to run is woken (wakeSuspended).
		in.status = "suspended"
		wakeUp = in.wantRun
	case "WAKEUP":
		in.status = "running"
		in.wokenAt = time.Now()
	case "RESET":
		in.log.Info("guest reset", "reason", str("reason"))
	case "MIGRATION":
		in.migration = str("status")
	default:
		in.mu.Unlock()
		return
	}
	if fatal && !in.fatalOnce {
		in.fatalOnce = true
		close(in.fatal)
	}
	close(in.changed)
	in.changed = make(chan struct{})
	in.mu.Unlock()
	in.log.Debug("qmp event", "event", name, "data", data)
	if stopCB {
		in.onStop(in)
	}
	if late {
		go in.contLate() // not here: the monitor's events must keep being drained
	}
	if wakeUp {
		go in.wakeSuspended() // likewise
	}
}

// wokenWindow is how soon after a wake-up from a suspend to RAM a guest's reset is taken for a failed
// resume: a resume that fails resets the guest at once (the test guest, booted with -kernel, reset
// within milliseconds of WAKEUP on QEMU 7.2).
const wokenWindow = 30 * time.Second

// resetAtWakeReason is why QEMU ends when a guest woken from a suspend to RAM resets instead of
// resuming: -no-reboot makes the reset a power-off.
const resetAtWakeReason = "guest suspended itself to RAM (ACPI S3) and, woken, reset instead of resuming (-no-reboot makes that a power-off)"

// wakeSuspended wakes a guest that suspended itself to RAM while the backend expected it to run
// (system_wakeup). The first of a QEMU's is logged at once, the rest at most every logCutEvery. A
// wake-up that fails leaves the guest unreachable: its life ends (suspendedReason) and QEMU is quit.
func (in *instance) wakeSuspended() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// A sleep may have begun since the SUSPEND: then the guest, suspended, is as good as asleep, and a
	// wake-up sent now would run it behind the sleep's back (its stop, done already, does nothing to
	// a suspended guest). The check and the wake-up are one step against the sleep's setWantRun.
	in.wakeMu.Lock()
	in.mu.Lock()
	want := in.wantRun && in.status == "suspended"
	in.mu.Unlock()
	if !want {
		in.wakeMu.Unlock()
		return
	}
	err := in.mon.run(ctx, nil, "system_wakeup", nil)
	in.wakeMu.Unlock()
	in.mu.Lock()
	in.suspends++
	n, write := in.suspends, time.Since(in.suspendLogged) >= logCutEvery
	if write {
		in.suspends, in.suspendLogged = 0, time.Now()
	}
	if err != nil && !in.fatalOnce {
		in.reason = suspendedReason + ": " + err.Error()
		in.fatalOnce = true
		close(in.fatal)
	}
	in.mu.Unlock()
	switch {
	case err != nil:
		in.log.Warn("the guest suspended itself to RAM (ACPI S3) and cannot be woken: quitting its QEMU; the next wake boots it", "err", err, "fix", suspendFix)
	case write:
		in.log.Warn("the guest suspended itself to RAM (ACPI S3): woke it", "suspends", n, "fix", suspendFix)
	}
}

// suspendFix is what the log tells an operator whose guest suspends itself to RAM.
const suspendFix = "keep the guest from suspending itself (systemd: systemctl mask sleep.target suspend.target; or turn off its idle suspend): the activator puts it to sleep"

// contLate continues a guest that a late stop of the backend's own paused (see stopFailed).
func (in *instance) contLate() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := in.mon.run(ctx, nil, "cont", nil); err != nil {
		in.log.Warn("a failed sleep's stop paused the guest late, and it cannot be continued", "err", err)
		return
	}
	in.log.Info("a failed sleep's stop paused the guest late: continued it")
}

// suspendedReason is why QEMU ends when the guest suspended itself to RAM and could not be woken.
const suspendedReason = "guest suspended itself to RAM (ACPI S3) and could not be woken: QEMU quit"

func (in *instance) watch() {
	select {
	case <-in.monClosed:
	case <-in.fatal:
	}
	in.mu.Lock()
	detached := in.detached
	in.mu.Unlock()
	if detached {
		<-in.monClosed
		return
	}
	// QEMU is ending: give it a moment to exit by itself, then make sure. The QEMU of a guest that
	// suspended itself does not end by itself: it is asked to quit.
	in.mu.Lock()
	suspended := strings.HasPrefix(in.reason, suspendedReason)
	in.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if suspended {
		_ = in.mon.run(ctx, nil, "quit", nil)
	}
	if err := waitGone(ctx, in.pid); err != nil {
		in.log.Warn("qemu still running after its monitor closed or the guest ended; killing it")
		_ = killAndWait(in.pid)
	}
	cancel()
	in.mon.close()
	<-in.monClosed
	in.mu.Lock()
	reason := in.reason
	in.mu.Unlock()
	if reason == "" {
		reason = "qemu exited (killed, crashed, or quit by another client)"
	}
	in.goneErr = errors.New(reason)
	close(in.gone)
	in.onGone(in, in.goneErr)
}

// setStatus records a run state read with query-status.
func (in *instance) setStatus(s string) {
	in.mu.Lock()
	in.status = s
	close(in.changed)
	in.changed = make(chan struct{})
	in.mu.Unlock()
}

func (in *instance) setWantRun(v bool) {
	if !v {
		// After this, no wake-up wakeSuspended decided while the guest was wanted running reaches
		// QEMU: it is sent under wakeMu, or not at all.
		in.wakeMu.Lock()
		defer in.wakeMu.Unlock()
	}
	in.mu.Lock()
	in.wantRun = v
	in.mu.Unlock()
}

// cont continues the guest (QMP cont). A guest that suspended itself to RAM (ACPI S3) as the backend
// put it to sleep is not paused but suspended, and neither the sleep's stop nor cont does anything to
// it: only a wake-up (system_wakeup) runs it again, its memory kept. cont sends one to such a guest and
// reports that it did (TestGuestSuspendedAsItSlept), with the status it asked for ("" after a wake-up,
// which has yet to run the guest). Before, the guest stayed suspended: the wake
// waited out budgets.running and threw it away for a cold boot, and a failed snapshot's rollback left
// it suspended under a Life that passed for awake.
func (in *instance) cont(ctx context.Context) (status string, woke bool, err error) {
	if err := in.mon.run(ctx, nil, "cont", nil); err != nil {
		return "", false, err
	}
	st, err := in.queryStatus(ctx)
	if err != nil || st != "suspended" {
		return st, false, err
	}
	in.log.Warn("the guest had suspended itself to RAM (ACPI S3) as it was put to sleep: waking it", "fix", suspendFix)
	if err := in.mon.run(ctx, nil, "system_wakeup", nil); err != nil {
		return "", false, fmt.Errorf("waking the guest, which had suspended itself to RAM (ACPI S3): %w", err)
	}
	return "", true, nil
}

func (in *instance) state() (status, migration string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.status, in.migration
}

// waitFor waits until cond holds for (status, migration), QEMU is gone, or ctx ends.
func (in *instance) waitFor(ctx context.Context, cond func(status, migration string) (bool, error)) error {
	for {
		in.mu.Lock()
		ok, err := cond(in.status, in.migration)
		ch := in.changed
		in.mu.Unlock()
		if ok || err != nil {
			return err
		}
		select {
		case <-ch:
		case <-in.gone:
			return fmt.Errorf("qemu exited: %w", in.goneErr)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// migrate runs cmd (migrate or migrate-incoming) to uri, first forgetting the status an earlier
// migration of this QEMU left. That status ("failed" after a full disk) would otherwise be what a
// wait for this migration sees first: QEMU sends this one's first event before its reply, but drain
// may not have recorded it by the time the reply is back.
func (in *instance) migrate(ctx context.Context, cmd, uri string) error {
	in.mu.Lock()
	in.migration = ""
	in.mu.Unlock()
	return in.mon.run(ctx, nil, cmd, map[string]any{"uri": uri})
}

// queryStatus asks QEMU for its run state and records it.
func (in *instance) queryStatus(ctx context.Context) (string, error) {
	var st struct {
		Status string `json:"status"`
	}
	if err := in.mon.run(ctx, &st, "query-status", nil); err != nil {
		return "", err
	}
	in.setStatus(st.Status)
	return st.Status, nil
}

// quit asks QEMU to quit and waits until it is gone, within budget (bounded by ctx too); past it,
// QEMU is killed. It returns once QEMU is gone.
func (in *instance) quit(ctx context.Context, budget time.Duration) {
	qctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	if err := in.mon.run(qctx, nil, "quit", nil); err != nil {
		in.log.Debug("qmp quit", "err", err)
	}
	select {
	case <-in.gone:
		return
	case <-qctx.Done():
	}
	in.log.Warn("qemu did not quit in time; killing it", "budget", budget)
	in.kill()
}

// kill kills QEMU and waits until the instance has seen it go.
func (in *instance) kill() {
	killPid(in.pid)
	<-in.gone
}

// detach lets go of a QEMU that keeps running: the monitor closes, the goroutines end, onGone is not
// called.
func (in *instance) detach() {
	in.mu.Lock()
	in.detached = true
	in.mu.Unlock()
	in.mon.close()
	<-in.done
}

// close joins the goroutines of an instance whose QEMU is gone.
func (in *instance) close() {
	<-in.gone
	in.mon.close()
	<-in.done
}

// isGone reports whether QEMU has exited.
func (in *instance) isGone() bool {
	select {
	case <-in.gone:
		return true
	default:
		return false
	}
}

// stopFailed takes the guest back as running after a QMP stop that failed. One whose context ended
// (QEMU stalled past the sleep's budget) may still be carried out by QEMU: its STOP is then the
// backend's own, not a pause behind its back, and the guest is continued (contLate). Found with the
// real binary: a QEMU stopped (SIGSTOP) across a pause sleep's budget did the stop once continued,
// which was taken for someone else's, and the guest was thrown away.
func (in *instance) stopFailed(err error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		in.lateStops++ // in one step with wantRun: a STOP between the two would be misread either way
	}
	in.wantRun = true
}
