package unit

import (
	"context"
	"fmt"
	"sync"

	godbus "github.com/godbus/dbus/v5"
)

// gatedSignals is the godbus signal handler of our connections: it queues signals until open is
// called, then delivers them in order and passes later ones straight through.
//
// Why: go-systemd's dispatch goroutine reads its subscriber fields without the lock that
// SetPropertiesSubscriber takes (dbus/subscription.go), so a signal that arrives while the subscriber is
// being set (a JobRemoved of some other unit's job, right after the connection is made) is a data
// race, and the race detector fails the tests on it. Opening the gate only after the subscriber is
// set orders the two. Queuing, not blocking, matters: godbus delivers signals on the goroutine that also
// reads method replies, and go-systemd makes a call (AddMatch) before we can set anything.
//
// It also drops what the manager did not send. On a bus daemon (the system bus without root, the
// session bus) any client may send a signal with any path and member: a JobRemoved for a job of ours
// decided a start's or a stop's result, a PropertiesChanged fed what a unit was believed to be, and
// one with the wrong body panicked go-systemd's dispatch goroutine (it asserts each field's type),
// which took the activator down. There only signals whose sender is the unique name that owns
// org.freedesktop.systemd1 pass (the bus driver's NameOwnerChanged keeps that name current), and
// only with the body go-systemd expects. A private socket's only peer is the manager: its signals
// carry no sender and pass, their bodies checked the same.
type gatedSignals struct {
	inner   godbus.SignalHandler
	observe func(*godbus.Signal) // sees every signal delivered, on the reading goroutine (checkLog.observe)

	mu       sync.Mutex // guards the fields below, and delivery order
	opened   bool
	pending  []queuedSignal
	brokered bool   // the connection is to a bus daemon: only owner's signals pass
	owner    string // the unique name that owns org.freedesktop.systemd1 there
}

type queuedSignal struct {
	iface, name string
	sig         *godbus.Signal
}

var (
	_ godbus.SignalHandler   = (*gatedSignals)(nil)
	_ godbus.SignalRegistrar = (*gatedSignals)(nil)
	_ godbus.Terminator      = (*gatedSignals)(nil)
)

func newGatedSignals(observe func(*godbus.Signal)) *gatedSignals {
	// The gate wraps godbus's own fan-out to Signal channels; the constructor is marked deprecated only
	// because godbus means to unexport it, and there is no other way to reach that handler.
	//lint:ignore SA1019 see above
	return &gatedSignals{inner: godbus.NewDefaultSignalHandler(), observe: observe}
}

// DeliverSignal implements godbus.SignalHandler.
func (g *gatedSignals) DeliverSignal(iface, name string, sig *godbus.Signal) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.opened {
		g.pending = append(g.pending, queuedSignal{iface, name, sig})
		return
	}
	g.deliverLocked(iface, name, sig)
}

// deliverLocked hands sig on if the manager sent it (see gatedSignals).
func (g *gatedSignals) deliverLocked(iface, name string, sig *godbus.Signal) {
	if g.brokered {
		if sig.Sender == busDriver && sig.Name == busDriver+".NameOwnerChanged" {
			if len(sig.Body) == 3 {
				if n, _ := sig.Body[0].(string); n == managerName {
					g.owner, _ = sig.Body[2].(string)
				}
			}
			return
		}
		if sig.Sender == "" || sig.Sender != g.owner {
			return
		}
	}
	if !wellFormed(sig) {
		return
	}
	g.observe(sig)
	g.inner.DeliverSignal(iface, name, sig)
}

const (
	busDriver   = "org.freedesktop.DBus"
	managerName = "org.freedesktop.systemd1"
)

// wellFormed reports whether sig has the body go-systemd's dispatch reads for its member (it asserts
// each field's type); signals it does not read pass.
func wellFormed(sig *godbus.Signal) bool {
	b := sig.Body
	switch sig.Name {
	case managerName + ".Manager.JobRemoved": // uoss: id, job, unit, result
		if len(b) != 4 {
			return false
		}
		_, ok0 := b[0].(uint32)
		_, ok1 := b[1].(godbus.ObjectPath)
		_, ok2 := b[2].(string)
		_, ok3 := b[3].(string)
		return ok0 && ok1 && ok2 && ok3
	case managerName + ".Manager.UnitNew": // so: unit, path
		if len(b) != 2 {
			return false
		}
		_, ok0 := b[0].(string)
		_, ok1 := b[1].(godbus.ObjectPath)
		return ok0 && ok1
	case busDriver + ".Properties.PropertiesChanged": // sa{sv}as
		if len(b) < 1 {
			return false
		}
		_, ok := b[0].(string)
		return ok
	}
	return true
}

// brokered reports whether c is to a bus daemon: it has a unique name (Hello gave it one), which a
// connection to the manager's private socket has not.
func brokered(c *godbus.Conn) bool { return c.Names()[0] != "" }

// trustOwner, on a connection to a bus daemon, makes only the signals of the manager's unique name
// pass from now on, following its changes (a re-executed manager comes back under a new one). Called
// before open.
func (g *gatedSignals) trustOwner(ctx context.Context, c *godbus.Conn) error {
	err := c.AddMatchSignalContext(ctx, godbus.WithMatchSender(busDriver), godbus.WithMatchInterface(busDriver),
		godbus.WithMatchMember("NameOwnerChanged"), godbus.WithMatchArg(0, managerName))
	if err != nil {
		return fmt.Errorf("watch the manager's bus name: %w", err)
	}
	var owner string
	if err := c.BusObject().CallWithContext(ctx, busDriver+".GetNameOwner", 0, managerName).Store(&owner); err != nil {
		return fmt.Errorf("find the manager on the bus: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.brokered, g.owner = true, owner
	return nil
}

// open delivers the queued signals and lets later ones through.
func (g *gatedSignals) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.opened = true
	for _, q := range g.pending {
		g.deliverLocked(q.iface, q.name, q.sig)
	}
	g.pending = nil
}

// AddSignal implements godbus.SignalRegistrar.
func (g *gatedSignals) AddSignal(ch chan<- *godbus.Signal) {
	g.inner.(godbus.SignalRegistrar).AddSignal(ch)
}

// RemoveSignal implements godbus.SignalRegistrar.
func (g *gatedSignals) RemoveSignal(ch chan<- *godbus.Signal) {
	g.inner.(godbus.SignalRegistrar).RemoveSignal(ch)
}

// Terminate implements godbus.Terminator: the connection closed.
func (g *gatedSignals) Terminate() {
	g.mu.Lock()
	g.pending = nil
	g.mu.Unlock()
	g.inner.(godbus.Terminator).Terminate()
}
