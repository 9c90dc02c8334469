package unit

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	godbus "github.com/godbus/dbus/v5"

	"github.com/activator/activator/internal/backend/backendtest"
	"github.com/activator/activator/internal/systemdtest"
	"github.com/activator/activator/internal/tenant"
)

// TestWakeNotesAUnitStartedOutside: a unit started by hand (`systemctl start`) while its route sleeps
// is taken as it is by the next wake, not restarted, and the wake says so in its record: before, it
// read like an ordinary start. Each case starts the unit behind the backend's back in a different way:
// on a backend that put it to sleep itself (stop mode: the fast path, which reads nothing before its
// start job), on a backend that never ran it, and a SIGSTOPped unit restarted by hand (a new
// invocation, running). A wake of the backend's own park says nothing of the kind.
func TestWakeNotesAUnitStartedOutside(t *testing.T) {
	m := systemdtest.Start(t)
	p := newProvider(t)
	cases := []struct {
		name       string
		mode       SleepMode
		sleptFirst bool                           // the backend woke and slept the unit before
		outside    func(t *testing.T, f *fixture) // what is done behind the backend's back
	}{
		{"stop, after its own sleep", SleepStop, true, func(t *testing.T, f *fixture) { m.StartUnit(t, f.unit) }},
		{"stop, never ran it", SleepStop, false, func(t *testing.T, f *fixture) { m.StartUnit(t, f.unit) }},
		{"sigstop, restarted by hand", SleepSIGSTOP, true, func(t *testing.T, f *fixture) { restartUnit(t, m, f.unit) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, m, p, c.mode, systemdtest.Demo{})
			if c.sleptFirst {
				var own phaseLog
				backendtest.WakeTracked(t, f.subject(), &own)
				f.sleep(t)
				if n := outsideNotes(own.notes); len(n) > 0 {
					t.Fatalf("an ordinary wake noted %q", n)
				}
			}
			c.outside(t, f)
			pid := m.MainPID(t, f.unit)

			var log phaseLog
			backendtest.WakeTracked(t, f.subject(), &log)
			backendtest.Get(t, f.subject())
			if got := m.MainPID(t, f.unit); got != pid {
				t.Errorf("MainPID %d after the wake, want %d: the unit started by hand was restarted", got, pid)
			}
			notes := outsideNotes(log.notes)
			if len(notes) != 1 || !strings.Contains(notes[0], f.unit) || !strings.Contains(notes[0], "already active") ||
				!strings.Contains(notes[0], "since ") {
				t.Fatalf("wake notes %q, want one saying %s was already active, started outside the activator, since when", log.notes, f.unit)
			}

			// A wake of the backend's own park, or from its own stop, notes nothing of the kind.
			f.sleep(t)
			var again phaseLog
			backendtest.WakeTracked(t, f.subject(), &again)
			if n := outsideNotes(again.notes); len(n) > 0 {
				t.Errorf("a wake after the backend's own sleep noted %q", n)
			}
		})
	}
}

// TestWakeJoinsAStartOutside: a wake that finds the unit still starting under someone else's start
// job (an ExecStartPre= that waits on a FIFO the test holds shut) joins that start, says so in its
// record, and the unit comes up once, when the test lets the start go on.
func TestWakeJoinsAStartOutside(t *testing.T) {
	m := systemdtest.Start(t)
	fifo := filepath.Join(t.TempDir(), "go")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, m, newProvider(t), SleepStop, systemdtest.Demo{Service: []string{"ExecStartPre=/bin/sh -c 'read x < " + fifo + "'"}})
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	handJob := make(chan string, 1)
	if _, err := m.Conn().StartUnitContext(ctx, f.unit, "replace", handJob); err != nil {
		t.Fatalf("start %s by hand: %v", f.unit, err)
	}
	m.WaitState(t, f.unit, "activating", budget)

	var log phaseLog
	life, err := f.b.Wake(ctx, &log)
	if err != nil {
		t.Fatalf("Wake: %v", err)
	}
	notes := outsideNotes(log.notes)
	if len(notes) != 1 || !strings.Contains(notes[0], "already activating") || !strings.Contains(notes[0], "joins that start") {
		t.Errorf("wake notes %q, want one saying %s was already activating, started outside the activator, and the wake joins it", log.notes, f.unit)
	}

	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteString("go\n"); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if res := <-handJob; res != "done" {
		t.Fatalf("the start by hand ended %q, want done", res)
	}
	waitListening(t, f.r.Upstream.Address)
	backendtest.Get(t, f.subject())
	if err := life.Err(); err != nil {
		t.Fatalf("Life ended: %v", err)
	}
}

// outsideNotes returns the notes that say a unit was started outside the activator.
func outsideNotes(notes []string) []string {
	var out []string
	for _, n := range notes {
		if strings.Contains(n, "outside the activator") {
			out = append(out, n)
		}
	}
	return out
}

// restartUnit restarts a unit behind the backend's back (systemctl --user restart) and waits for the job.
func restartUnit(t *testing.T, m *systemdtest.Manager, unit string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	ch := make(chan string, 1)
	if _, err := m.Conn().RestartUnitContext(ctx, unit, "replace", ch); err != nil {
		t.Fatalf("restart %s: %v", unit, err)
	}
	select {
	case res := <-ch:
		if res != "done" {
			t.Fatalf("restart %s: job %s", unit, res)
		}
	case <-ctx.Done():
		t.Fatalf("restart %s: no job result", unit)
	}
}

var _ tenant.Tracker = (*phaseLog)(nil)

// TestRunningOutside: while a route sleeps, the backend says (for its status, without I/O) when its
// unit runs all the same, from the manager's signals: before, the route read plainly asleep. It says
// nothing of a unit it woke or parked itself, nor once the unit has stopped again. The test waits
// for the signals by a property read over the backend's own connection: its reply follows every
// signal the manager sent before it.
func TestRunningOutside(t *testing.T) {
	m := systemdtest.Start(t)
	p := newProvider(t)
	for _, mode := range []SleepMode{SleepStop, SleepSIGSTOP} {
		t.Run(string(mode), func(t *testing.T) {
			f := newFixture(t, m, p, mode, systemdtest.Demo{})
			heard := func() string {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), budget)
				defer cancel()
				if _, err := f.b.liveState(ctx); err != nil {
					t.Fatal(err)
				}
				return f.b.RunningOutside()
			}
			f.wake(t)
			if got := heard(); got != "" {
				t.Fatalf("awake: RunningOutside %q, want none", got)
			}
			f.sleep(t)
			if got := heard(); got != "" {
				t.Fatalf("asleep (%s by the backend): RunningOutside %q, want none", mode, got)
			}
			if mode == SleepStop {
				m.StartUnit(t, f.unit)
			} else {
				restartUnit(t, m, f.unit)
			}
			got := heard()
			for _, want := range []string{f.unit, "started outside the activator", "(since ", "the next wake takes it as it is"} {
				if !strings.Contains(got, want) {
					t.Errorf("started by hand: RunningOutside %q, want it to say %q", got, want)
				}
			}
			m.StopUnit(t, f.unit)
			if got := heard(); got != "" {
				t.Errorf("stopped by hand again: RunningOutside %q, want none", got)
			}
		})
	}
}

// TestOutside: which running units are someone else's, by mode, for a backend that holds no Life. A
// SIGCONT leaves no trace in a unit's state, so a SIGSTOPped unit continued by hand reads as parked;
// the freezer is not available here, so the freeze rows are covered by this table alone.
func TestOutside(t *testing.T) {
	ours, other := []byte("inv-ours"), []byte("inv-other")
	st := func(active, freezer string, inv []byte) UnitState {
		return UnitState{ActiveState: active, FreezerState: freezer, InvocationID: inv}
	}
	cases := []struct {
		name   string
		mode   SleepMode
		last   []byte // the invocation the backend last ran
		parked bool
		st     UnitState
		want   string
	}{
		{"stop: inactive", SleepStop, ours, false, st("inactive", "running", ours), ""},
		{"stop: failed", SleepStop, ours, false, st("failed", "running", ours), ""},
		{"stop: deactivating", SleepStop, ours, false, st("deactivating", "running", ours), ""},
		{"stop: active", SleepStop, ours, false, st("active", "running", other), "started"},
		{"stop: activating", SleepStop, nil, false, st("activating", "running", other), "started"},
		{"stop: its run unknown", SleepStop, ours, false, st("active", "", nil), "started"},
		{"stop: its own run, which a failed stop left", SleepStop, ours, false, st("active", "running", ours), ""},
		{"sigstop: parked", SleepSIGSTOP, ours, true, st("active", "running", ours), ""},
		{"sigstop: restarted", SleepSIGSTOP, ours, true, st("active", "running", other), "started"},
		{"sigstop: never ran it", SleepSIGSTOP, nil, false, st("active", "running", other), "started"},
		{"sigstop: a failed sleep's unit", SleepSIGSTOP, ours, false, st("active", "running", ours), ""},
		{"sigstop: its run unknown", SleepSIGSTOP, ours, true, st("active", "", nil), ""},
		{"freeze: parked", SleepFreeze, ours, true, st("active", "frozen", ours), ""},
		{"freeze: freezing", SleepFreeze, ours, true, st("active", "freezing", ours), ""},
		{"freeze: thawed", SleepFreeze, ours, true, st("active", "running", ours), "thawed"},
		{"freeze: restarted", SleepFreeze, ours, true, st("active", "running", other), "started"},
		{"freeze: a failed freeze's unit", SleepFreeze, ours, false, st("active", "running", ours), ""},
		{"freeze: left frozen by an earlier activator", SleepFreeze, nil, false, st("active", "frozen", other), ""},
	}
	for _, c := range cases {
		b := &Backend{s: Settings{Unit: "web.service", Sleep: c.mode}, lastInv: c.last, parked: c.parked}
		if got := b.outside(c.st); got != c.want {
			t.Errorf("%s: outside = %q, want %q", c.name, got, c.want)
		}
	}
}

// TestSeenLog: the log of what the signals say of a unit takes every signal, fills in a read only
// when no signal came since the read began, forgets everything when the connection drops, and names
// once what it knew then, to be read again.
func TestSeenLog(t *testing.T) {
	const unit = "web.service"
	sig := func(active string, inv []byte) *godbus.Signal {
		return &godbus.Signal{Path: unitObjectPath(unit), Name: "org.freedesktop.DBus.Properties.PropertiesChanged",
			Body: []any{"org.freedesktop.systemd1.Unit", map[string]godbus.Variant{
				"ActiveState": godbus.MakeVariant(active), "SubState": godbus.MakeVariant("running"),
				"InvocationID": godbus.MakeVariant(inv), "ActiveEnterTimestamp": godbus.MakeVariant(uint64(1_700_000_000_000_000)),
			}, []string{}}}
	}
	l := newSeenLog()
	l.observe(sig("active", []byte("a"))) // a unit no backend drives: not kept
	if _, ok := l.state(unit); ok {
		t.Fatal("a unit nobody added is known")
	}
	l.add(unit)
	if _, ok := l.state(unit); ok {
		t.Fatal("a unit nothing was heard of is known")
	}
	seq := l.mark(unit)
	l.settle(unit, UnitState{ActiveState: "inactive", SubState: "dead"}, seq)
	if st, ok := l.state(unit); !ok || st.ActiveState != "inactive" {
		t.Fatalf("after a read: %+v %v, want inactive", st, ok)
	}
	seq = l.mark(unit)
	l.observe(sig("active", []byte("b")))
	l.settle(unit, UnitState{ActiveState: "inactive"}, seq) // overtaken by the signal
	if st, ok := l.state(unit); !ok || st.ActiveState != "active" || string(st.InvocationID) != "b" || st.ActiveEnterTimestamp == 0 {
		t.Fatalf("a read overtaken by a signal: %+v, want the signal's active, invocation b, with its timestamp", st)
	}
	l.forget()
	if _, ok := l.state(unit); ok {
		t.Fatal("known after the connection dropped")
	}
	seq = l.mark(unit)
	l.settle(unit, UnitState{ActiveState: "active", SubState: "running"}, seq) // a read without the invocation
	if st, _ := l.state(unit); len(st.InvocationID) != 0 || st.ActiveEnterTimestamp != 0 {
		t.Fatalf("a partial read after a drop: %+v, want nothing from before the drop", st)
	}
	l.forget()
	if got := l.toReread(); len(got) != 1 || got[0] != unit {
		t.Fatalf("to read again: %q, want %q", got, unit)
	}
	if got := l.toReread(); len(got) != 0 {
		t.Fatalf("to read again a second time: %q, want none", got)
	}
	l.drop(unit)
	l.observe(sig("active", []byte("c")))
	if _, ok := l.state(unit); ok {
		t.Fatal("a dropped unit is still known")
	}
}
