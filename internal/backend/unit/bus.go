package unit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/activator/activator/internal/tenant"
)

// Reconnection pacing after the bus drops (systemd restarted, daemon-reexec).
const (
	reconnectFirst = 20 * time.Millisecond
	reconnectMax   = 5 * time.Second
	// callBudget bounds one D-Bus call made by the watcher, off any request path.
	callBudget = 30 * time.Second
	// updateBuffer is the property-change channel's size. go-systemd drops updates when it is full and
	// reports that on the error channel; the watcher then re-reads every watched unit.
	updateBuffer = 1024
)

// errClosed is returned when the provider has been closed.
var errClosed = errors.New("unit provider closed")

// dialFunc opens one raw, authenticated D-Bus connection (Hello done when the bus needs it). The
// connection must close when ctx ends.
type dialFunc func(ctx context.Context, opts ...godbus.ConnOption) (*godbus.Conn, error)

// bus is one manager connection shared by every route on the same bus. It re-establishes the
// connection when it drops and watches the units of awake routes for property changes.
//
// Goroutines: one dial goroutine at a time (started by get), and one serve goroutine per live
// connection, which after a drop keeps redialing until it succeeds or the provider closes. All are
// counted in wg and stop when ctx ends.
type bus struct {
	name string // "system", "user" or the address, for errors and logs
	dial dialFunc
	ctx  context.Context // the provider's lifetime
	log  *slog.Logger
	wg   *sync.WaitGroup
	// checks keeps what the manager's signals say of the condition checks of units whose start jobs
	// are out (see checks.go); seen, what they last said of the state of every unit a backend drives
	// (see outside.go). Each has a lock of its own.
	checks *checkLog
	seen   *seenLog

	mu      sync.Mutex    // guards the fields below
	link    *link         // nil while disconnected
	dialing chan struct{} // closed when the dial in progress ends; nil when none is
	dialErr error         // the last dial's error
	watches map[string]map[*watch]struct{}
}

// link is one live connection. ctx ends when its D-Bus connection drops or is closed. go-systemd asks
// for two, one for calls and one for signals; it is given the same one twice (see connect).
type link struct {
	c      *sddbus.Conn
	ctx    context.Context
	cancel context.CancelFunc // releases the context the connections were dialed on
}

// dialBudget bounds dialing and subscribing: go-systemd makes some of those calls without a context.
const dialBudget = 30 * time.Second

// errLinkLost is returned by a call that was cut off by its connection dropping.
var errLinkLost = errors.New("connection to systemd lost")

// lost reports whether err came from l dropping (so a retry on a fresh connection makes sense).
func (l *link) lost(err error) bool {
	return l.ctx.Err() != nil || errors.Is(err, errLinkLost) || errors.Is(err, godbus.ErrClosed) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.EOF)
}

// watch is one awake route's interest in its unit: when the unit stops being active (or is replaced by
// a new invocation), life is ended with an *ExitError.
type watch struct {
	unit string
	life *tenant.Life

	mu         sync.Mutex // guards invocation
	invocation []byte     // the InvocationID the route woke; nil until known
}

func (w *watch) setInvocation(id []byte) {
	w.mu.Lock()
	w.invocation = id
	w.mu.Unlock()
}

// dead reports whether st means the watched invocation is gone.
func (w *watch) dead(st UnitState) bool {
	if !st.Active() {
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.invocation != nil && len(st.InvocationID) > 0 && !bytes.Equal(w.invocation, st.InvocationID)
}

func newBus(ctx context.Context, name string, dial dialFunc, log *slog.Logger, wg *sync.WaitGroup) *bus {
	return &bus{name: name, dial: dial, ctx: ctx, log: log.With("bus", name), wg: wg, checks: newCheckLog(),
		seen: newSeenLog(), watches: map[string]map[*watch]struct{}{}}
}

// observe sees every signal of the connection first, on its reading goroutine (gatedSignals).
func (b *bus) observe(sig *godbus.Signal) {
	b.checks.observe(sig)
	b.seen.observe(sig)
}

// get returns the live connection, dialing one if there is none (or the one there is has dropped).
// Concurrent callers share one dial; each waits for it at most until its own ctx ends.
func (b *bus) get(ctx context.Context) (*link, error) {
	b.mu.Lock()
	if b.link != nil && b.link.ctx.Err() == nil {
		l := b.link
		b.mu.Unlock()
		return l, nil
	}
	if b.link != nil {
		b.link = nil // dropped: its serve goroutine closes it
		b.seen.forget()
	}
	if err := b.ctx.Err(); err != nil {
		b.mu.Unlock()
		return nil, errClosed
	}
	if b.dialing == nil {
		b.dialing = make(chan struct{})
		b.wg.Add(1)
		go b.connect(b.dialing)
	}
	done := b.dialing
	b.mu.Unlock()

	select {
	case <-done:
	case <-ctx.Done():
		return nil, fmt.Errorf("connect to systemd (%s bus): %w", b.name, context.Cause(ctx))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.link != nil {
		return b.link, nil
	}
	return nil, fmt.Errorf("connect to systemd (%s bus): %w", b.name, b.dialErr)
}

// do runs fn on the live connection. When the call fails because that connection dropped, it runs fn
// once more on a fresh one: every operation of this package is safe to repeat (reads, start and stop
// jobs in mode "replace", signals, freeze/thaw). A route never stays stuck on a dead connection.
func (b *bus) do(ctx context.Context, fn func(*link) error) error {
	l, err := b.get(ctx)
	if err != nil {
		return err
	}
	err = fn(l)
	if err == nil || !l.lost(err) || ctx.Err() != nil {
		return dbusFault(err)
	}
	b.log.Info("call failed on a dropped connection; retrying on a new one", "err", err)
	b.invalidate(l)
	l, gerr := b.get(ctx)
	if gerr != nil {
		return fmt.Errorf("%w (and reconnecting failed: %v)", err, gerr)
	}
	return dbusFault(fn(l))
}

// invalidate forgets l if it is the current connection and closes it; its serve goroutine then
// reconnects. What the signals said of the units goes with the current connection: the next one
// reads it again (seenLog).
func (b *bus) invalidate(l *link) {
	b.mu.Lock()
	if b.link == l {
		b.link = nil
		b.seen.forget()
	}
	b.mu.Unlock()
	l.c.Close()
	l.cancel()
}

// connect dials, subscribes to unit property changes, publishes the connection and starts serving it.
// It closes done when finished either way.
func (b *bus) connect(done chan struct{}) {
	defer b.wg.Done()
	// The connections live on cctx: cancelling it closes them, which unblocks any call go-systemd makes
	// without a context if the manager does not answer within dialBudget.
	cctx, cancel := context.WithCancel(b.ctx)
	timer := time.AfterFunc(dialBudget, cancel)
	// One connection carries go-systemd's calls and its signals (godbus hands signals on without
	// blocking the replies behind them). A manager sends every signal to each of its private socket's
	// connections, so a second connection doubled what it serialises, and what this process decodes,
	// at every unit's start on the host: work on the two CPUs a tenant is starting on.
	var (
		raw  *godbus.Conn
		gate *gatedSignals
	)
	c, err := sddbus.NewConnection(func() (*godbus.Conn, error) {
		if raw != nil {
			return raw, nil
		}
		g := newGatedSignals(b.observe)
		rc, err := b.dial(cctx, godbus.WithSignalHandler(g))
		if err == nil {
			raw, gate = rc, g
		}
		return rc, err
	})
	updates := make(chan *sddbus.PropertiesUpdate, updateBuffer)
	lost := make(chan error, 1)
	if err == nil && brokered(raw) {
		if err = gate.trustOwner(cctx, raw); err != nil {
			c.Close()
		}
	}
	if err == nil {
		c.SetPropertiesSubscriber(updates, lost)
		gate.open()
		if err = c.Subscribe(); err != nil {
			c.Close()
			err = fmt.Errorf("subscribe to unit changes: %w", err)
		}
	}
	if !timer.Stop() && err == nil {
		c.Close()
		err = fmt.Errorf("the manager did not answer within %v", dialBudget)
	}
	if err != nil {
		cancel()
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	b.dialing = nil
	b.dialErr = err
	defer close(done)
	if err != nil {
		return
	}
	if b.ctx.Err() != nil {
		c.Close()
		cancel()
		b.dialErr = errClosed
		return
	}
	lctx, lcancel := context.WithCancel(raw.Context())
	l := &link{c: c, ctx: lctx, cancel: func() { lcancel(); cancel() }}
	b.link = l
	b.wg.Add(1)
	go b.serve(l, updates, lost)
}

// serve delivers l's property changes to the watches until l drops or the provider closes; after a
// drop it reconnects. Every (re)connection starts with a resync: watched units that died while nobody
// was listening are noticed, and units whose state was known before the drop are read again (reread).
func (b *bus) serve(l *link, updates <-chan *sddbus.PropertiesUpdate, lost <-chan error) {
	defer b.wg.Done()
	b.resync(l.c)
	b.reread(l.c)
loop:
	for {
		select {
		case u := <-updates:
			b.update(l.c, u)
		case err := <-lost:
			// An update was dropped (channel full) or the subscriber failed: re-read everything.
			b.log.Warn("unit change notification lost; re-reading watched units", "err", err)
			b.resync(l.c)
		case <-l.ctx.Done():
			break loop
		case <-b.ctx.Done():
			break loop
		}
	}
	b.invalidate(l)
	if b.ctx.Err() != nil {
		return
	}
	b.log.Warn("lost the connection to systemd; reconnecting")
	b.reconnect()
}

// reconnect redials with backoff until a connection is up (ours or one a caller dialed) or the
// provider closes.
func (b *bus) reconnect() {
	delay := reconnectFirst
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(b.ctx, callBudget)
		_, err := b.get(ctx)
		cancel()
		if err == nil {
			b.log.Info("reconnected to systemd", "attempts", attempt)
			return
		}
		if b.ctx.Err() != nil {
			return
		}
		if attempt == 1 || delay == reconnectMax {
			b.log.Warn("reconnect to systemd failed", "err", err, "attempts", attempt)
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-b.ctx.Done():
			t.Stop()
			return
		}
		delay = min(2*delay, reconnectMax)
	}
}

// update handles one property change: for a watched unit whose ActiveState or InvocationID changed, it
// confirms the state with a fresh read (signals may arrive late or coalesced) and ends dead watches.
func (b *bus) update(c *sddbus.Conn, u *sddbus.PropertiesUpdate) {
	_, state := u.Changed["ActiveState"]
	_, inv := u.Changed["InvocationID"]
	if !state && !inv {
		return
	}
	b.mu.Lock()
	n := len(b.watches[u.UnitName])
	b.mu.Unlock()
	if n == 0 {
		return
	}
	b.check(c, u.UnitName)
}

// resync checks every watched unit.
func (b *bus) resync(c *sddbus.Conn) {
	b.mu.Lock()
	units := make([]string, 0, len(b.watches))
	for u := range b.watches {
		units = append(units, u)
	}
	b.mu.Unlock()
	for _, u := range units {
		b.check(c, u)
	}
}

// check reads unit's state (readLive) and ends the watches it shows dead, with the unit's full state
// (readState) to say why. A failed read leaves the watches alone: the connection is probably dropping,
// and the resync after reconnecting checks again.
func (b *bus) check(c *sddbus.Conn, unit string) {
	ctx, cancel := context.WithTimeout(b.ctx, callBudget)
	defer cancel()
	st, err := readLive(ctx, c, unit)
	if err != nil {
		b.log.Debug("read unit state", "unit", unit, "err", err)
		return
	}
	var dead []*watch
	b.mu.Lock()
	for w := range b.watches[unit] {
		if w.dead(st) {
			dead = append(dead, w)
			b.unwatchLocked(w)
		}
	}
	b.mu.Unlock()
	if len(dead) == 0 {
		return
	}
	if full, err := readState(ctx, c, unit); err == nil {
		st = b.checks.fill(unit, full) // a watch set up after a start job a condition skipped ends here too
	}
	for _, w := range dead {
		b.log.Info("unit stopped behind the activator's back", "unit", unit, "active_state", st.ActiveState, "sub_state", st.SubState, "result", st.Result)
		w.life.End(&ExitError{Unit: unit, State: st})
	}
}

// watch registers interest in unit; the caller confirms the unit's state afterwards (check), so a
// change between its last read and the registration is not missed.
func (b *bus) watch(unit string, life *tenant.Life) *watch {
	w := &watch{unit: unit, life: life}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.watches[unit] == nil {
		b.watches[unit] = map[*watch]struct{}{}
	}
	b.watches[unit][w] = struct{}{}
	return w
}

// unwatch removes w (nil is allowed).
func (b *bus) unwatch(w *watch) {
	if w == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.unwatchLocked(w)
}

func (b *bus) unwatchLocked(w *watch) {
	ws := b.watches[w.unit]
	delete(ws, w)
	if len(ws) == 0 {
		delete(b.watches, w.unit)
	}
}

// Dialers.

// dialPrivate returns a dialer for a manager's private socket: peer-to-peer, EXTERNAL auth, no Hello.
func dialPrivate(address string) dialFunc {
	return func(ctx context.Context, opts ...godbus.ConnOption) (*godbus.Conn, error) {
		c, err := godbus.Dial(address, append(opts, godbus.WithContext(ctx))...)
		if err != nil {
			return nil, err
		}
		if err := c.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
			c.Close()
			return nil, authFault(fmt.Errorf("authenticate to %s: %w", address, err))
		}
		return c, nil
	}
}

// dialBroker returns a dialer for a message bus (system or session): auth, then Hello.
func dialBroker(open func(opts ...godbus.ConnOption) (*godbus.Conn, error)) dialFunc {
	return func(ctx context.Context, opts ...godbus.ConnOption) (*godbus.Conn, error) {
		c, err := open(append(opts, godbus.WithContext(ctx))...)
		if err != nil {
			return nil, err
		}
		if err := c.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
			c.Close()
			return nil, authFault(err)
		}
		if err := c.Hello(); err != nil {
			c.Close()
			return nil, dbusFault(err)
		}
		return c, nil
	}
}

// dialerFor resolves a Settings.Bus value, as systemctl does: the system manager's private socket
// when root can use it, else the system bus; the user manager's private socket in $XDG_RUNTIME_DIR
// when it exists, else the session bus.
func dialerFor(busName string) dialFunc {
	switch busName {
	case BusSystem:
		return func(ctx context.Context, opts ...godbus.ConnOption) (*godbus.Conn, error) {
			const private = "/run/systemd/private"
			if os.Geteuid() == 0 {
				if _, err := os.Stat(private); err == nil {
					return dialPrivate("unix:path="+private)(ctx, opts...)
				}
			}
			return dialBroker(godbus.SystemBusPrivate)(ctx, opts...)
		}
	case BusUser:
		return func(ctx context.Context, opts ...godbus.ConnOption) (*godbus.Conn, error) {
			if rt := os.Getenv("XDG_RUNTIME_DIR"); rt != "" {
				p := filepath.Join(rt, "systemd", "private")
				if _, err := os.Stat(p); err == nil {
					return dialPrivate("unix:path="+p)(ctx, opts...)
				}
			}
			return dialBroker(godbus.SessionBusPrivate)(ctx, opts...)
		}
	default:
		return dialPrivate(busName)
	}
}
