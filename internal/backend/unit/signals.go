package unit

import (
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
type gatedSignals struct {
	inner   godbus.SignalHandler
	observe func(*godbus.Signal) // sees every signal first, on the reading goroutine (checkLog.observe)

	mu      sync.Mutex // guards the fields below, and delivery order
	opened  bool
	pending []queuedSignal
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
	g.observe(sig)
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.opened {
		g.pending = append(g.pending, queuedSignal{iface, name, sig})
		return
	}
	g.inner.DeliverSignal(iface, name, sig)
}

// open delivers the queued signals and lets later ones through.
func (g *gatedSignals) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.opened = true
	for _, q := range g.pending {
		g.inner.DeliverSignal(q.iface, q.name, q.sig)
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
