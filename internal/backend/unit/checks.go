package unit

import (
	"fmt"
	"strings"
	"sync"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// A unit's Condition*= and Assert*= settings are checked by the manager at each start, before anything
// runs. A failed assert fails the start job with the result "assert", which says enough. A failed
// condition skips the start: the job is "done" and the unit stays inactive with Result=success, and
// only the unit's ConditionResult (and the state of each entry of Conditions) says why. A unit that
// nothing references is unloaded as soon as its job is over, taking that state with it: read
// afterwards, it is a fresh load whose conditions were never checked. So the backend also keeps what
// the manager's PropertiesChanged signals said of the check while a start job of its own was out
// (checkLog), and names the settings from the unit's list, which the fresh load still has.

// Check is one Condition*= or Assert*= setting of a unit (the Unit interface's Conditions and Asserts,
// "a(sbbsi)").
type Check struct {
	Type      string // ConditionPathExists, AssertPathExists, ...
	Trigger   bool   // "|": a triggering check; at least one of those must hold
	Negate    bool   // "!"
	Parameter string
	State     int32 // at the last check: > 0 held, < 0 failed, 0 not checked (or the unit was reloaded since)
}

// String renders the check as it is written in the unit file, ConditionPathExists=|!/path.
func (c Check) String() string {
	var b strings.Builder
	b.WriteString(c.Type + "=")
	if c.Trigger {
		b.WriteByte('|')
	}
	if c.Negate {
		b.WriteByte('!')
	}
	b.WriteString(c.Parameter)
	return b.String()
}

// parseChecks reads a Conditions or Asserts property value as godbus decodes it ([][]any); entries of
// another shape are left out.
func parseChecks(v any) []Check {
	rows, _ := v.([][]any)
	var out []Check
	for _, r := range rows {
		if len(r) != 5 {
			continue
		}
		var c Check
		var ok [5]bool
		c.Type, ok[0] = r[0].(string)
		c.Trigger, ok[1] = r[1].(bool)
		c.Negate, ok[2] = r[2].(bool)
		c.Parameter, ok[3] = r[3].(string)
		c.State, ok[4] = r[4].(int32)
		if ok == [5]bool{true, true, true, true, true} {
			out = append(out, c)
		}
	}
	return out
}

// skipped says why the manager ran nothing at the unit's last start when a condition failed, "start
// skipped: condition ConditionPathExists=/srv/data failed"; "" when none did (or the unit is active: a
// later start passed).
func (s UnitState) skipped() string {
	if s.Active() || !s.ConditionFailed {
		return ""
	}
	return "start skipped: " + describeFailed("condition", s.Conditions)
}

// describeFailed names the checks of one kind that failed: those the manager marked failed, or, when
// the unit was reloaded since (every state 0), the ones that must have: a lone check, or every
// triggering check when there is nothing else. Otherwise it lists them all as candidates. The order is
// the manager's (systemd 252 lists a unit's checks last written first).
func describeFailed(kind string, checks []Check) string {
	var plain, trig, failedPlain, failedTrig []string
	for _, c := range checks {
		if c.Trigger {
			trig = append(trig, c.String())
			if c.State < 0 {
				failedTrig = append(failedTrig, c.String())
			}
		} else {
			plain = append(plain, c.String())
			if c.State < 0 {
				failedPlain = append(failedPlain, c.String())
			}
		}
	}
	switch {
	case len(failedPlain) == 1:
		return fmt.Sprintf("%s %s failed", kind, failedPlain[0])
	case len(failedPlain) > 1:
		return fmt.Sprintf("%ss %s failed", kind, strings.Join(failedPlain, ", "))
	case len(failedTrig) > 0 && len(failedTrig) == len(trig):
		return fmt.Sprintf("no triggering %s held: %s", kind, strings.Join(trig, ", "))
	case len(plain) == 1 && len(trig) == 0:
		return fmt.Sprintf("%s %s failed", kind, plain[0])
	case len(plain) == 0 && len(trig) > 0:
		return fmt.Sprintf("no triggering %s held: %s", kind, strings.Join(trig, ", "))
	case len(plain)+len(trig) > 0:
		return fmt.Sprintf("one of the %ss %s failed; the manager unloaded the unit before saying which", kind, strings.Join(append(plain, trig...), ", "))
	}
	return fmt.Sprintf("a %s failed", kind)
}

// checkLog keeps the outcome of the condition checks that the manager's PropertiesChanged signals
// report for the units whose start jobs a backend awaits. It is fed on the connection's reading
// goroutine, in the order of the wire: once a call made after a job's end has its reply, every signal
// the manager sent before that reply is in. A unit's entry lives from expect to the matching drop.
type checkLog struct {
	mu    sync.Mutex // guards units
	units map[godbus.ObjectPath]*checkEntry
}

type checkEntry struct {
	expecters  int  // expect calls not yet dropped
	seen       bool // a signal reported a check since the last expect
	condFailed bool // what the latest such signal said
}

func newCheckLog() *checkLog { return &checkLog{units: map[godbus.ObjectPath]*checkEntry{}} }

func unitObjectPath(unit string) godbus.ObjectPath {
	return godbus.ObjectPath("/org/freedesktop/systemd1/unit/" + sddbus.PathBusEscape(unit))
}

// expect starts recording unit's checks (again from nothing).
func (l *checkLog) expect(unit string) {
	p := unitObjectPath(unit)
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.units[p]
	if e == nil {
		e = &checkEntry{}
		l.units[p] = e
	}
	e.expecters++
	e.seen, e.condFailed = false, false
}

// drop ends one expect of unit.
func (l *checkLog) drop(unit string) {
	p := unitObjectPath(unit)
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.units[p]; e != nil {
		if e.expecters--; e.expecters <= 0 {
			delete(l.units, p)
		}
	}
}

// fill completes st, read from unit, with what the signals said of the unit's last condition check
// when the read could not say (the unit was reloaded since: ConditionTimestamp is 0).
func (l *checkLog) fill(unit string, st UnitState) UnitState {
	if st.checked {
		return st
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.units[unitObjectPath(unit)]; e != nil && e.seen {
		st.ConditionFailed = e.condFailed
	}
	return st
}

// unitChanges returns the properties that a PropertiesChanged signal of a unit (interface
// org.freedesktop.systemd1.Unit) says changed, and false for any other signal.
func unitChanges(sig *godbus.Signal) (map[string]godbus.Variant, bool) {
	if sig.Name != "org.freedesktop.DBus.Properties.PropertiesChanged" || len(sig.Body) < 2 {
		return nil, false
	}
	if iface, _ := sig.Body[0].(string); iface != "org.freedesktop.systemd1.Unit" {
		return nil, false
	}
	changed, _ := sig.Body[1].(map[string]godbus.Variant)
	return changed, true
}

// observe records a unit PropertiesChanged signal that carries the condition check of an expected unit.
// It runs on the connection's reading goroutine, so it only looks and records.
func (l *checkLog) observe(sig *godbus.Signal) {
	changed, isUnit := unitChanges(sig)
	if !isUnit {
		return
	}
	ok, ok1 := changed["ConditionResult"].Value().(bool)
	at, ok2 := changed["ConditionTimestamp"].Value().(uint64)
	if !ok1 || !ok2 || at == 0 {
		return // not about conditions, or a unit loaded afresh that was never checked: nothing to say
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.units[sig.Path]
	if e == nil {
		return
	}
	e.seen = true
	e.condFailed = !ok
}
