package unit

// A unit can run without the activator: an operator's `systemctl start` while the route sleeps, a
// client of its paired .socket, a restart of a SIGSTOPped unit. The route still reads asleep, since
// nothing woke it, and the next wake takes the unit as it is (no restart). Both must say so: the
// status, from what the manager's signals last said of the unit (seenLog, no I/O), and the wake, in a
// note of its record and a log line (Backend.noteOutside).

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/activator/activator/internal/tenant"
)

// seenLog keeps what the manager's PropertiesChanged signals last said of each unit that a backend of
// this bus drives, awake or asleep: ActiveState, SubState, FreezerState, InvocationID and the two
// timestamps a note quotes. systemd sends every one of these in each of a unit's change signals. The
// log is fed on the connection's reading goroutine (observe), in the order of the wire: once a call
// made afterwards has its reply, every signal the manager sent before the reply is in (as checkLog
// relies on). A read fills in a unit no signal has spoken of since the read began (settle); a
// connection that drops forgets everything (forget), and the next one reads again what was known.
type seenLog struct {
	mu    sync.Mutex // guards units and every entry's fields
	units map[godbus.ObjectPath]*seenUnit
}

type seenUnit struct {
	name   string
	refs   int       // backends open on the unit
	seq    uint64    // signals recorded so far
	known  bool      // st is the unit's state, from a signal or a read no signal overtook
	reread bool      // st was known when the connection dropped: the next connection reads it again
	st     UnitState // the fields named on seenLog
}

func newSeenLog() *seenLog { return &seenLog{units: map[godbus.ObjectPath]*seenUnit{}} }

// add starts keeping unit's state, for one more backend.
func (l *seenLog) add(unit string) {
	p := unitObjectPath(unit)
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.units[p]
	if e == nil {
		e = &seenUnit{name: unit}
		l.units[p] = e
	}
	e.refs++
}

// drop ends one add of unit.
func (l *seenLog) drop(unit string) {
	p := unitObjectPath(unit)
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.units[p]; e != nil {
		if e.refs--; e.refs <= 0 {
			delete(l.units, p)
		}
	}
}

// mark returns unit's signal count, for settle.
func (l *seenLog) mark(unit string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.units[unitObjectPath(unit)]; e != nil {
		return e.seq
	}
	return 0
}

// settle records st, read from the manager after mark returned seq, unless a signal was recorded
// since: that one may be newer, and any change after it comes with a signal of its own. Only the
// fields the read filled in are taken (an empty string or ID, a zero timestamp: not read).
func (l *seenLog) settle(unit string, st UnitState, seq uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.units[unitObjectPath(unit)]
	if e == nil || e.seq != seq || st.ActiveState == "" {
		return
	}
	e.known = true
	e.st.ActiveState, e.st.SubState = st.ActiveState, st.SubState
	if st.FreezerState != "" {
		e.st.FreezerState = st.FreezerState
	}
	if len(st.InvocationID) > 0 {
		e.st.InvocationID = st.InvocationID
	}
	if st.ActiveEnterTimestamp != 0 {
		e.st.ActiveEnterTimestamp = st.ActiveEnterTimestamp
	}
	if st.InactiveExitTimestamp != 0 {
		e.st.InactiveExitTimestamp = st.InactiveExitTimestamp
	}
}

// state returns what is known of unit's state.
func (l *seenLog) state(unit string) (UnitState, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.units[unitObjectPath(unit)]; e != nil && e.known {
		return e.st, true
	}
	return UnitState{}, false
}

// forget marks every state unknown: the connection dropped, and signals with it.
func (l *seenLog) forget() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.units {
		e.reread = e.reread || e.known
		e.known, e.st = false, UnitState{} // nothing of it may be mixed with a later partial read
	}
}

// toReread returns the units forget found known and nothing has told of since, and clears their marks.
func (l *seenLog) toReread() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var units []string
	for _, e := range l.units {
		if e.reread && !e.known {
			units = append(units, e.name)
		}
		e.reread = false
	}
	return units
}

// observe records a unit PropertiesChanged signal of a unit in the log. It runs on the connection's
// reading goroutine, so it only looks and records.
func (l *seenLog) observe(sig *godbus.Signal) {
	changed, isUnit := unitChanges(sig)
	if !isUnit {
		return
	}
	active, ok := changed["ActiveState"].Value().(string)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.units[sig.Path]
	if e == nil {
		return
	}
	e.seq++
	e.known = true
	e.st.ActiveState = active
	if v, ok := changed["SubState"].Value().(string); ok {
		e.st.SubState = v
	}
	if v, ok := changed["FreezerState"].Value().(string); ok {
		e.st.FreezerState = v
	}
	if v, ok := changed["InvocationID"].Value().([]byte); ok {
		e.st.InvocationID = v
	}
	if v, ok := changed["ActiveEnterTimestamp"].Value().(uint64); ok {
		e.st.ActiveEnterTimestamp = v
	}
	if v, ok := changed["InactiveExitTimestamp"].Value().(uint64); ok {
		e.st.InactiveExitTimestamp = v
	}
}

// reread reads again, after a reconnection, the units whose state was known before the drop (so that
// a unit started while no signal could arrive shows in the status), a few property Gets each.
func (b *bus) reread(c *sddbus.Conn) {
	for _, unit := range b.seen.toReread() {
		ctx, cancel := context.WithTimeout(b.ctx, callBudget)
		seq := b.seen.mark(unit)
		st, err := readProps(ctx, c, unit, "ActiveState", "SubState", "InvocationID", "FreezerState", "ActiveEnterTimestamp")
		cancel()
		if err != nil {
			b.log.Debug("read unit state", "unit", unit, "err", err)
			continue
		}
		b.seen.settle(unit, st, seq)
	}
}

// upOrStarting reports whether the unit runs or is starting: active, reloading or activating.
func (s UnitState) upOrStarting() bool { return s.Active() || s.ActiveState == "activating" }

// outside reports how a unit in state st runs without this backend, which holds no Life for it:
// "started" by someone else, or "thawed" (frozen by this backend's sleep, thawed by someone else); ""
// when it does not run, or runs as this backend left it. In stop mode a sleep leaves nothing running:
// any run but the one this backend last had (which a stop that failed may leave) is someone else's.
// In sigstop and freeze modes a sleep leaves the unit active: it is someone else's when it is known
// to be a new run (restarted, or stopped and started) or this backend never ran the unit, and in
// freeze mode when it was parked frozen and is no longer. A SIGCONT leaves no trace in a unit's
// state, so a SIGSTOPped unit continued by hand cannot be told from a parked one.
func (b *Backend) outside(st UnitState) string {
	if !st.upOrStarting() || st.Frozen() {
		return ""
	}
	b.mu.Lock()
	last, parked := b.lastInv, b.parked
	b.mu.Unlock()
	known := len(st.InvocationID) > 0 && len(last) > 0
	ours := known && bytes.Equal(st.InvocationID, last)
	switch {
	case b.s.Sleep == SleepStop && !ours:
		return "started"
	case b.s.Sleep != SleepStop && (len(last) == 0 || (known && !ours)):
		return "started"
	case b.s.Sleep == SleepFreeze && parked && st.FreezerState == "running":
		return "thawed"
	}
	return ""
}

// since renders when the running unit in state st became so: for an active unit when it entered that
// state, for one starting when it left inactive. The time comes from st when it has it, else from one
// property Get. "" when unknown.
func (b *Backend) since(ctx context.Context, st UnitState) string {
	name, us := "ActiveEnterTimestamp", st.ActiveEnterTimestamp
	if !st.Active() {
		name, us = "InactiveExitTimestamp", st.InactiveExitTimestamp
	}
	if us == 0 {
		var got UnitState
		if err := b.bus.do(ctx, func(l *link) (err error) {
			got, err = readProps(ctx, l.c, b.s.Unit, name)
			return err
		}); err != nil {
			return ""
		}
		us = max(got.ActiveEnterTimestamp, got.InactiveExitTimestamp)
	}
	return stamp(us)
}

// stamp renders a systemd µs timestamp in RFC 3339, "" for 0 (never).
func stamp(us uint64) string {
	if us == 0 {
		return ""
	}
	return time.UnixMicro(int64(us)).Format(time.RFC3339)
}

// noteOutside tells the wake's record and the log that the wake found the unit running without the
// activator (how: outside's answer), and what the route now does with it. The unit is taken as it
// is: like a unit adopted at start-up, it is the route's tenant from now on and sleeps after the
// route's idle window.
func (b *Backend) noteOutside(ctx context.Context, t tenant.Tracker, st UnitState, how string) {
	when := b.since(ctx, st)
	var msg string
	switch {
	case how == "thawed":
		msg = fmt.Sprintf("unit %s, frozen by the activator, was thawed outside it: taken as it is", b.s.Unit)
	case st.Active():
		msg = fmt.Sprintf("unit %s was already %s (started outside the activator, since %s): taken as it is, not restarted", b.s.Unit, st.ActiveState, orUnknown(when))
	default:
		msg = fmt.Sprintf("unit %s was already %s (started outside the activator at %s): the wake's start job joins that start", b.s.Unit, st.ActiveState, orUnknown(when))
	}
	msg += fmt.Sprintf("; the route now owns it and puts it to sleep (%s) after its idle window", b.s.Sleep)
	t.Note(msg)
	b.log.Info("the wake found the unit running without the activator: taken as it is", "how", how,
		"active_state", st.ActiveState, "sub_state", st.SubState, "since", when)
}

func orUnknown(s string) string {
	if s == "" {
		return "an unknown time"
	}
	return s
}

// RunningOutside implements tenant.Outsider: while no wake of this backend runs the unit, it says when
// the manager's signals show the unit running all the same (see outside), from what they last said;
// "" otherwise, or when nothing is known (before the backend's first read, after a dropped connection
// until it is read again).
func (b *Backend) RunningOutside() string {
	b.mu.Lock()
	ours := b.life != nil && b.life.Err() == nil // a start job of ours still out has its Life too
	b.mu.Unlock()
	if ours {
		return ""
	}
	st, ok := b.bus.seen.state(b.s.Unit)
	if !ok {
		return ""
	}
	how := b.outside(st)
	if how == "" {
		return ""
	}
	var msg string
	switch {
	case how == "thawed":
		msg = fmt.Sprintf("unit %s, frozen by the activator, was thawed outside it and runs", b.s.Unit)
	case st.Active():
		msg = fmt.Sprintf("unit %s is %s, started outside the activator", b.s.Unit, st.ActiveState)
		if when := stamp(st.ActiveEnterTimestamp); when != "" {
			msg += " (since " + when + ")"
		}
	default:
		msg = fmt.Sprintf("unit %s is %s, started outside the activator", b.s.Unit, st.ActiveState)
	}
	return msg + ": the next wake takes it as it is, and the route then puts it to sleep after its idle window"
}
