package unit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/activator/activator/internal/tenant"
)

// ErrUnsupported is wrapped by errors for a sleep mode the host's systemd cannot do (freezing without
// the cgroup v2 freezer). The mode is never silently downgraded. It is terminal (tenant.ClassOf), and
// so is every error that wraps it: the host or the route's mode must change.
var ErrUnsupported error = unsupportedError{}

type unsupportedError struct{}

func (unsupportedError) Error() string            { return "not supported by this host's systemd" }
func (unsupportedError) FaultClass() tenant.Class { return tenant.ClassTerminal }

// UnitState is what the backend reads about a unit to decide and to explain.
type UnitState struct {
	LoadState    string // loaded, not-found, masked, bad-setting, error
	ActiveState  string // active, reloading, inactive, failed, activating, deactivating
	SubState     string // running, dead, exited, auto-restart, ...
	FreezerState string // running, freezing, frozen, thawing ("" on systemd without a freezer)
	InvocationID []byte // changes on every start
	// Service properties.
	Result          string // success, exit-code, signal, timeout, core-dump, start-limit-hit, ...
	MainPID         uint32
	ExecMainCode    int32  // CLD_EXITED (1), CLD_KILLED (2), CLD_DUMPED (3); 0 when never ran
	ExecMainStatus  int32  // exit status or signal number
	TimeoutStopUSec uint64 // TimeoutStopSec=, in µs (math.MaxUint64: infinity)
	// When the unit last entered active and last left inactive (began to start), in µs since the
	// epoch; 0: never. Read only for a note (outside.go).
	ActiveEnterTimestamp, InactiveExitTimestamp uint64
	// Start limits (0 interval: disabled).
	StartLimitIntervalUSec uint64
	StartLimitBurst        uint32
	// The unit's Condition*= and Assert*= settings and their last check (see checks.go).
	ConditionFailed bool    // ConditionResult=no at the last check: a condition failed, the start was skipped
	Conditions      []Check // the unit's Condition*= settings, with each one's state at the last check
	Asserts         []Check // the unit's Assert*= settings, likewise
	checked         bool    // the read showed a condition check (ConditionTimestamp set)
}

// Active reports whether the unit runs (active or reloading: a frozen unit is still active).
func (s UnitState) Active() bool { return s.ActiveState == "active" || s.ActiveState == "reloading" }

// Frozen reports whether the unit's cgroup is frozen or being frozen.
func (s UnitState) Frozen() bool { return s.FreezerState == "frozen" || s.FreezerState == "freezing" }

// String renders the fields an operator needs to see why a unit is not running.
func (s UnitState) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ActiveState=%s SubState=%s Result=%s", s.ActiveState, s.SubState, s.Result)
	if s.ExecMainCode != 0 {
		fmt.Fprintf(&b, " ExecMainCode=%s ExecMainStatus=%d", cldName(s.ExecMainCode), s.ExecMainStatus)
	}
	if s.LoadState != "" && s.LoadState != "loaded" {
		fmt.Fprintf(&b, " LoadState=%s", s.LoadState)
	}
	return b.String()
}

func cldName(code int32) string {
	switch code {
	case 1:
		return "exited"
	case 2:
		return "killed"
	case 3:
		return "dumped"
	}
	return fmt.Sprint(code)
}

// JobError is a start or stop job that did not end in "done", with the unit's state read afterwards.
type JobError struct {
	Unit   string
	Job    string // "start" or "stop"
	Result string // failed, timeout, dependency, canceled, skipped, assert (an Assert*= failed), ...
	State  UnitState
	// Refused: a start job failed, on a unit with a start limit, while the unit kept the InvocationID
	// it had after this backend's previous start: nothing ran, the manager refused the start, which
	// for a service is its start limit. systemd sets Result=start-limit-hit only when the run before
	// succeeded; after a failed run Result stays that run's (exit-code, say), so Result alone misses
	// the refusal of a tenant that crashes.
	Refused bool
}

func (e *JobError) Error() string {
	if e.Result == "assert" { // only a start's asserts are checked
		return fmt.Sprintf("unit %s: %s job result %q: start refused: %s (%s)", e.Unit, e.Job, e.Result, describeFailed("assert", e.State.Asserts), e.State)
	}
	if e.Refused {
		return fmt.Sprintf("unit %s: %s job result %q: the manager refused to start it before anything ran, as its start limit does (StartLimitBurst=%d in StartLimitIntervalSec=%v; `systemctl reset-failed %s` clears it) (%s)",
			e.Unit, e.Job, e.Result, e.State.StartLimitBurst, time.Duration(e.State.StartLimitIntervalUSec)*time.Microsecond, e.Unit, e.State)
	}
	return fmt.Sprintf("unit %s: %s job result %q (%s)", e.Unit, e.Job, e.Result, e.State)
}

// FaultClass implements tenant.Classer: throttle when systemd refused the start for its start limit
// (Refused, or Result=start-limit-hit), terminal when the unit cannot do the job or its executable
// cannot be run, else retryable (a job that failed or timed out; see UnitState.class).
func (e *JobError) FaultClass() tenant.Class {
	switch {
	case e.Refused:
		return tenant.ClassThrottle
	case e.Result == "unsupported":
		return tenant.ClassTerminal
	}
	return e.State.class()
}

// ExitError ends a Life when the unit stopped on its own (crash, OOM kill, an operator's stop) or was
// restarted behind the activator's back, or when a start job was done but left the unit inactive:
// a failed Condition*= skipped the start (State.ConditionFailed), and nothing ran.
type ExitError struct {
	Unit  string
	State UnitState
}

// FaultClass implements tenant.Classer: see UnitState.class. A unit that exits before it is ready is
// retryable: a crash at start may be transient, and the next wake retries after the backoff.
func (e *ExitError) FaultClass() tenant.Class { return e.State.class() }

func (e *ExitError) Error() string {
	if e.State.Active() {
		return fmt.Sprintf("unit %s was restarted behind the activator's back (%s)", e.Unit, e.State)
	}
	if why := e.State.skipped(); why != "" {
		return fmt.Sprintf("unit %s: %s (%s)", e.Unit, why, e.State)
	}
	return fmt.Sprintf("unit %s stopped (%s)", e.Unit, e.State)
}

// readState reads the unit's Unit and Service properties.
func readState(ctx context.Context, c *sddbus.Conn, unit string) (UnitState, error) {
	up, err := c.GetUnitPropertiesContext(ctx, unit)
	if err != nil {
		return UnitState{}, fmt.Errorf("read properties of %s: %w", unit, err)
	}
	var st UnitState
	st.LoadState, _ = up["LoadState"].(string)
	st.ActiveState, _ = up["ActiveState"].(string)
	st.SubState, _ = up["SubState"].(string)
	st.FreezerState, _ = up["FreezerState"].(string)
	st.InvocationID, _ = up["InvocationID"].([]byte)
	st.ActiveEnterTimestamp, _ = up["ActiveEnterTimestamp"].(uint64)
	st.InactiveExitTimestamp, _ = up["InactiveExitTimestamp"].(uint64)
	st.StartLimitIntervalUSec, _ = up["StartLimitIntervalUSec"].(uint64)
	st.StartLimitBurst, _ = up["StartLimitBurst"].(uint32)
	condOK, _ := up["ConditionResult"].(bool)
	condAt, _ := up["ConditionTimestamp"].(uint64) // 0: not checked since the unit was loaded
	st.checked = condAt != 0
	st.ConditionFailed = st.checked && !condOK
	st.Conditions = parseChecks(up["Conditions"])
	st.Asserts = parseChecks(up["Asserts"])
	if st.LoadState != "loaded" {
		return st, nil
	}
	sp, err := c.GetUnitTypePropertiesContext(ctx, unit, "Service")
	if err != nil {
		return st, fmt.Errorf("read service properties of %s: %w", unit, err)
	}
	st.Result, _ = sp["Result"].(string)
	st.MainPID, _ = sp["MainPID"].(uint32)
	st.ExecMainCode, _ = sp["ExecMainCode"].(int32)
	st.ExecMainStatus, _ = sp["ExecMainStatus"].(int32)
	st.TimeoutStopUSec, _ = sp["TimeoutStopUSec"].(uint64)
	return st, nil
}

// readQuick reads only what the wake path decides on: LoadState, ActiveState, SubState, InvocationID,
// and FreezerState when freezer is set. readState's two GetAll calls cost about 3 ms each on the manager
// measured here (hundreds of properties serialised), two of them were half of a unit wake; one
// property Get costs about 0.15 ms. Failures still get readState's full picture.
func readQuick(ctx context.Context, c *sddbus.Conn, unit string, freezer bool) (UnitState, error) {
	names := []string{"LoadState", "ActiveState", "SubState", "InvocationID"}
	if freezer {
		names = append(names, "FreezerState")
	}
	return readProps(ctx, c, unit, names...)
}

// readResult reads a service's Result (success, timeout, signal, ...) in one property Get.
func readResult(ctx context.Context, c *sddbus.Conn, unit string) (string, error) {
	p, err := c.GetServicePropertyContext(ctx, unit, "Result")
	if err != nil {
		return "", fmt.Errorf("read Result of %s: %w", unit, err)
	}
	res, _ := p.Value.Value().(string)
	return res, nil
}

// readLive reads what decides whether a watched unit's awake period goes on, ActiveState and
// InvocationID, in two property Gets. A watch is checked on every change of either while the unit
// starts, where readState's two GetAlls kept the manager serialising hundreds of properties while the
// tenant started beside it.
func readLive(ctx context.Context, c *sddbus.Conn, unit string) (UnitState, error) {
	return readProps(ctx, c, unit, "ActiveState", "InvocationID")
}

// readProps reads the named Unit properties one Get each (LoadState first, if named: a unit that is not
// loaded has nothing else to read; FreezerState is left empty on a systemd without it).
func readProps(ctx context.Context, c *sddbus.Conn, unit string, names ...string) (UnitState, error) {
	var st UnitState
	for _, name := range names {
		p, err := c.GetUnitPropertyContext(ctx, unit, name)
		if err != nil {
			if name == "FreezerState" {
				continue // a systemd without a freezer has no such property
			}
			return st, fmt.Errorf("read %s of %s: %w", name, unit, err)
		}
		switch name {
		case "LoadState":
			st.LoadState, _ = p.Value.Value().(string)
		case "ActiveState":
			st.ActiveState, _ = p.Value.Value().(string)
		case "SubState":
			st.SubState, _ = p.Value.Value().(string)
		case "InvocationID":
			st.InvocationID, _ = p.Value.Value().([]byte)
		case "FreezerState":
			st.FreezerState, _ = p.Value.Value().(string)
		case "ActiveEnterTimestamp":
			st.ActiveEnterTimestamp, _ = p.Value.Value().(uint64)
		case "InactiveExitTimestamp":
			st.InactiveExitTimestamp, _ = p.Value.Value().(uint64)
		}
		if name == "LoadState" && st.LoadState != "loaded" {
			return st, nil
		}
	}
	return st, nil
}

// dbusErrorName returns the D-Bus error name of err ("org.freedesktop.systemd1.NoSuchUnit"), or "".
func dbusErrorName(err error) string {
	var de godbus.Error
	if errors.As(err, &de) {
		return de.Name
	}
	var dp *godbus.Error
	if errors.As(err, &dp) && dp != nil {
		return dp.Name
	}
	return ""
}

// unsupported wraps a manager error that says the operation cannot be done here in ErrUnsupported.
func unsupported(unit, op string, err error) error {
	name := dbusErrorName(err)
	msg := err.Error()
	if name == "org.freedesktop.DBus.Error.NotSupported" || strings.Contains(msg, "does not support freezing") ||
		strings.Contains(msg, "not supported") {
		return fmt.Errorf("unit %s: %s: %w: %v (sleep: freeze needs the cgroup v2 freezer; use sleep: sigstop or stop)", unit, op, ErrUnsupported, err)
	}
	return fmt.Errorf("unit %s: %s: %w", unit, op, err)
}
