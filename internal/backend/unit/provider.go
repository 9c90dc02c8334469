// Package unit is the systemd unit backing: a route's tenant is a .service unit that the activator
// starts and stops (or freezes, or SIGSTOPs) over D-Bus with go-systemd, never through systemctl.
//
// The Provider owns one connection per bus (system, user, or a manager's private socket address),
// shared by every route on that bus, dialed on first use on the root context given in Options and
// re-established whenever it drops (systemd restart, daemon-reexec). The same connection carries the
// manager's property-change signals, from which a woken unit that stops on its own (crash, OOM kill,
// `systemctl stop` by an operator, a restart behind the activator's back) ends its Life: there is no
// polling.
//
// Units outlive the activator: Backend implements tenant.Adopter (an active unit is adopted as
// awake, keeping its MainPID) and its Close leaves the unit as it is.
package unit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"syscall"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// Options configure a Provider.
type Options struct {
	// Context is the root context: connections are dialed on it and close when it ends. Required.
	Context context.Context
	// Logger receives connection and unit events (default: slog.Default()).
	Logger *slog.Logger
}

// The contract this backing keeps, checked by the compiler: were a method's signature to drift, the
// activator would silently stop finding the ability.
var (
	_ tenant.Opener       = (*Provider)(nil)
	_ tenant.Checker      = (*Provider)(nil)
	_ tenant.SharedCloser = (*Provider)(nil)
	_ tenant.Backend      = (*Backend)(nil)
	_ tenant.Stopper      = (*Backend)(nil)
	_ tenant.Adopter      = (*Backend)(nil)
	_ tenant.Closer       = (*Backend)(nil)
	_ tenant.Outsider     = (*Backend)(nil)
)

// Provider opens unit Backends. It checks routes against the host and holds the D-Bus connections, and is
// safe for concurrent use.
type Provider struct {
	ctx    context.Context
	cancel context.CancelFunc
	log    *slog.Logger
	wg     sync.WaitGroup // the buses' goroutines

	mu    sync.Mutex      // guards buses
	buses map[string]*bus // by Settings.Bus
}

// NewProvider returns a Provider. It dials nothing until a route needs its bus.
func NewProvider(o Options) *Provider {
	ctx := o.Context
	if ctx == nil {
		ctx = context.Background()
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(ctx)
	return &Provider{ctx: ctx, cancel: cancel, log: log.With("backing", "unit"), buses: map[string]*bus{}}
}

// bus returns the shared connection manager for a Settings.Bus value.
func (p *Provider) bus(name string) *bus {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.buses[name]
	if !ok {
		b = newBus(p.ctx, name, dialerFor(name), p.log, &p.wg)
		p.buses[name] = b
	}
	return b
}

func settingsOf(r *registry.Route) (*Settings, error) {
	s, ok := r.Settings.(*Settings)
	if !ok || s == nil {
		return nil, tenant.Terminal(fmt.Errorf("route %q: settings are %T, want *unit.Settings (decoded by unit.Decode)", r.Name, r.Settings))
	}
	return s, nil
}

// Open returns the route's Backend. It does not touch the bus (the unit is only entered in the
// bus's log of what the manager's signals say, for its status: tenant.Outsider).
func (p *Provider) Open(r *registry.Route) (tenant.Backend, error) {
	s, err := settingsOf(r)
	if err != nil {
		return nil, err
	}
	if p.ctx.Err() != nil {
		return nil, errClosed
	}
	b := &Backend{
		s:           *s,
		bus:         p.bus(s.Bus),
		log:         p.log.With("route", r.Name, "unit", s.Unit),
		sleepBudget: r.SleepBudget,
		upstream:    r.Upstream,
	}
	b.bus.seen.add(s.Unit) // what the manager's signals say of the unit is kept from now on (outside.go)
	return b, nil
}

// Check verifies a route against the live manager without waking anything: the bus is reachable, the
// unit (and its paired socket) exist, the sleep mode can work here (freeze needs the cgroup v2
// freezer: an error wrapping ErrUnsupported otherwise). Enabled start limits are logged as a warning.
// What it finds wrong with the units is terminal; a manager it cannot reach is not (see bus.do).
func (p *Provider) Check(ctx context.Context, r *registry.Route) error {
	s, err := settingsOf(r)
	if err != nil {
		return err
	}
	var st UnitState
	var sockLoad string
	err = p.bus(s.Bus).do(ctx, func(l *link) (err error) {
		if st, err = readState(ctx, l.c, s.Unit); err != nil || s.Socket == "" {
			return err
		}
		sockLoad, err = readLoadState(ctx, l.c, s.Socket)
		return err
	})
	if err != nil {
		return err
	}
	var errs []error
	if st.LoadState != "loaded" {
		errs = append(errs, tenant.Terminal(fmt.Errorf("unit %s: LoadState=%s (is the unit file installed? daemon-reload?)", s.Unit, st.LoadState)))
	}
	if s.Socket != "" && sockLoad != "loaded" {
		errs = append(errs, tenant.Terminal(fmt.Errorf("socket %s: LoadState=%s", s.Socket, sockLoad)))
	}
	if s.Sleep == SleepFreeze {
		if err := freezerSupported(); err != nil {
			errs = append(errs, fmt.Errorf("unit %s: sleep: freeze: %w", s.Unit, err))
		}
	}
	if st.LoadState == "loaded" && st.StartLimitIntervalUSec != 0 {
		p.log.Warn("the unit has start limits enabled: fast sleep/wake cycles will trip them (set StartLimitIntervalSec=0; the activator's backoff takes over)",
			"route", r.Name, "unit", s.Unit, "start_limit_interval_usec", st.StartLimitIntervalUSec, "start_limit_burst", st.StartLimitBurst)
	}
	return errors.Join(errs...)
}

// Notes warns about unit settings that work against sleeping (tenant.Noter), so that `activator check`
// says so before serve's log does: enabled start limits, which fast sleep/wake cycles trip, and a
// TimeoutStopSec= not below the route's sleep_budget, under which a tenant slow to stop fails its
// sleep while systemd carries on stopping it. Nothing when the unit cannot be read (Check says why).
func (p *Provider) Notes(ctx context.Context, r *registry.Route) []string {
	s, err := settingsOf(r)
	if err != nil {
		return nil
	}
	var st UnitState
	if err := p.bus(s.Bus).do(ctx, func(l *link) (err error) {
		st, err = readState(ctx, l.c, s.Unit)
		return err
	}); err != nil || st.LoadState != "loaded" {
		return nil
	}
	return unitNotes(s.Unit, st, r.SleepBudget)
}

var _ tenant.Noter = (*Provider)(nil)

// unitNotes are Notes' warnings for a loaded unit in state st on a route with the given sleep budget.
func unitNotes(unit string, st UnitState, sleepBudget time.Duration) []string {
	var notes []string
	if st.StartLimitIntervalUSec != 0 {
		notes = append(notes, fmt.Sprintf("warning: %s has start limits enabled (StartLimitIntervalSec=%v, StartLimitBurst=%d): fast sleep/wake cycles will trip them; set StartLimitIntervalSec=0 (the activator's backoff takes over)",
			unit, time.Duration(st.StartLimitIntervalUSec)*time.Microsecond, st.StartLimitBurst))
	}
	if stop, ok := usec(st.TimeoutStopUSec); sleepBudget > 0 && (!ok || stop >= sleepBudget) {
		limit := "infinity"
		if ok {
			limit = stop.String()
		}
		notes = append(notes, fmt.Sprintf("warning: %s has TimeoutStopSec=%s, not below the route's sleep_budget %v: a tenant slow to stop fails its sleep while systemd carries on stopping it, and the next wake waits for that stop; set TimeoutStopSec= below sleep_budget",
			unit, limit, sleepBudget))
	}
	return notes
}

// usec converts a systemd µs property to a Duration; false for infinity or a value too large.
func usec(v uint64) (time.Duration, bool) {
	if v > uint64(math.MaxInt64/int64(time.Microsecond)) {
		return 0, false
	}
	return time.Duration(v) * time.Microsecond, true
}

// readLoadState reads a unit's LoadState.
func readLoadState(ctx context.Context, c *sddbus.Conn, unit string) (string, error) {
	p, err := c.GetUnitPropertyContext(ctx, unit, "LoadState")
	if err != nil {
		return "", fmt.Errorf("read LoadState of %s: %w", unit, err)
	}
	s, _ := p.Value.Value().(string)
	return s, nil
}

// cgroup2Magic is CGROUP2_SUPER_MAGIC.
const cgroup2Magic = 0x63677270

// freezerSupported reports whether this host can freeze units: systemd freezes through the cgroup v2
// freezer, which needs the unified hierarchy at /sys/fs/cgroup (not the hybrid layout). It checks the
// local host, which is where the manager runs (buses are unix sockets).
func freezerSupported() error {
	var fs syscall.Statfs_t
	if err := syscall.Statfs("/sys/fs/cgroup", &fs); err != nil {
		return fmt.Errorf("%w: cannot inspect /sys/fs/cgroup: %v", ErrUnsupported, err)
	}
	if fs.Type != cgroup2Magic {
		return fmt.Errorf("%w: /sys/fs/cgroup is not the cgroup v2 unified hierarchy, so systemd cannot freeze units (use sleep: sigstop or stop)", ErrUnsupported)
	}
	return nil
}

// Close closes every connection and waits for the provider's goroutines. Backends opened from it stop
// working.
func (p *Provider) Close() error {
	p.cancel()
	p.wg.Wait()
	return nil
}
