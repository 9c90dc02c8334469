package unit

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	godbus "github.com/godbus/dbus/v5"

	"github.com/activator/activator/internal/testenv"
)

// TestSignalsOnlyFromTheManager: on a bus daemon any client may send any signal. A spoofed JobRemoved
// decided a start's or stop's result, and one with an empty body panicked go-systemd's dispatch
// goroutine (`dbus-send --system --type=signal /x org.freedesktop.systemd1.Manager.JobRemoved`, by any
// local user, took the activator down). Only the manager's unique name passes, as the bus driver's
// NameOwnerChanged keeps it, and only with the body go-systemd reads; on a private socket, where the
// manager is the only peer and signals carry no sender, the bodies are checked the same.
func TestSignalsOnlyFromTheManager(t *testing.T) {
	job := func(sender string, body ...any) *godbus.Signal {
		return &godbus.Signal{Sender: sender, Path: "/org/freedesktop/systemd1", Name: managerName + ".Manager.JobRemoved", Body: body}
	}
	done := []any{uint32(7), godbus.ObjectPath("/org/freedesktop/systemd1/job/7"), "app.service", "done"}
	owner := func(name string) *godbus.Signal {
		return &godbus.Signal{Sender: busDriver, Path: "/org/freedesktop/DBus", Name: busDriver + ".NameOwnerChanged", Body: []any{managerName, ":1.5", name}}
	}
	for _, c := range []struct {
		name     string
		brokered bool
		sigs     []*godbus.Signal
		want     []string // the senders of the signals delivered, in order
	}{
		{"bus: the manager's", true, []*godbus.Signal{job(":1.5", done...)}, []string{":1.5"}},
		{"bus: another client's", true, []*godbus.Signal{job(":1.6", done...)}, nil},
		{"bus: the manager's, empty body", true, []*godbus.Signal{job(":1.5")}, nil},
		{"bus: the manager's, wrong types", true, []*godbus.Signal{job(":1.5", "7", "x", 1, 2)}, nil},
		{"bus: the manager re-executed", true, []*godbus.Signal{owner(":1.9"), job(":1.5", done...), job(":1.9", done...)}, []string{":1.9"}},
		{"bus: NameOwnerChanged from a client", true, []*godbus.Signal{{Sender: ":1.6", Name: busDriver + ".NameOwnerChanged", Body: []any{managerName, ":1.5", ":1.6"}}, job(":1.6", done...)}, nil},
		{"private: the manager's", false, []*godbus.Signal{job("", done...)}, []string{""}},
		{"private: empty body", false, []*godbus.Signal{job("")}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var observed int
			g := newGatedSignals(func(*godbus.Signal) { observed++ })
			ch := make(chan *godbus.Signal, len(c.sigs))
			g.AddSignal(ch)
			if c.brokered {
				g.brokered, g.owner = true, ":1.5"
			}
			g.open()
			for _, s := range c.sigs {
				g.DeliverSignal("", "", s)
			}
			var got []string
			for len(ch) > 0 {
				got = append(got, (<-ch).Sender)
			}
			if len(got) != len(c.want) || observed != len(c.want) {
				t.Fatalf("delivered from %q (observed %d), want %q", got, observed, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("delivered from %q, want %q", got, c.want)
				}
			}
		})
	}
}

// TestSignalsOnARealBus: the gate on a real dbus-daemon, with a client standing in for the manager
// (it owns org.freedesktop.systemd1): its JobRemoved passes, another client's is dropped, and when a
// third client takes the name over (a manager that re-executed) its signals pass and the old owner's
// do not.
func TestSignalsOnARealBus(t *testing.T) {
	daemon, err := exec.LookPath("dbus-daemon")
	if err != nil {
		testenv.Missing(t, "dbus-daemon not found (Debian package dbus)")
	}
	dir := t.TempDir()
	addr := "unix:path=" + filepath.Join(dir, "bus")
	conf := filepath.Join(dir, "bus.conf")
	if err := os.WriteFile(conf, []byte(`<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>session</type><listen>`+addr+`</listen><auth>EXTERNAL</auth>
<policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/></policy></busconfig>`), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(daemon, "--config-file="+conf, "--nofork", "--print-address")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start dbus-daemon: %v", err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil { // the daemon listens once it prints
		t.Fatalf("dbus-daemon: %v", err)
	}
	ctx := t.Context()
	dial := dialBroker(func(opts ...godbus.ConnOption) (*godbus.Conn, error) { return godbus.Dial(addr, opts...) })
	client := func() *godbus.Conn {
		c, err := dial(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	own := func(c *godbus.Conn) {
		if r, err := c.RequestName(managerName, godbus.NameFlagAllowReplacement|godbus.NameFlagReplaceExisting); err != nil || r != godbus.RequestNameReplyPrimaryOwner {
			t.Fatalf("RequestName: %v, %v", r, err)
		}
	}
	manager, stranger, heir := client(), client(), client()
	own(manager)

	delivered := make(chan *godbus.Signal, 16)
	g := newGatedSignals(func(*godbus.Signal) {})
	g.AddSignal(delivered)
	us, err := dial(ctx, godbus.WithSignalHandler(g))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { us.Close() })
	if !brokered(us) {
		t.Fatal("a bus daemon's connection is not told from the manager's private socket: connect would not gate it")
	}
	if err := g.trustOwner(ctx, us); err != nil {
		t.Fatal(err)
	}
	if err := us.AddMatchSignalContext(ctx, godbus.WithMatchInterface(managerName+".Manager"), godbus.WithMatchMember("JobRemoved")); err != nil {
		t.Fatal(err)
	}
	g.open()
	emit := func(from *godbus.Conn, result string) {
		t.Helper()
		if err := from.Emit("/org/freedesktop/systemd1", managerName+".Manager.JobRemoved", uint32(1), godbus.ObjectPath("/org/freedesktop/systemd1/job/1"), "app.service", result); err != nil {
			t.Fatal(err)
		}
	}
	// Each emit is followed by the manager's own, so that a dropped signal is told by what comes next.
	next := func(want string) {
		t.Helper()
		select {
		case s := <-delivered:
			if got := s.Body[3].(string); got != want {
				t.Fatalf("delivered a JobRemoved %q, want %q", got, want)
			}
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	emit(manager, "done")
	next("done")
	emit(stranger, "spoofed")
	emit(manager, "after the spoof")
	next("after the spoof")
	own(heir) // the name passes to heir; the bus driver's NameOwnerChanged says so
	emit(manager, "from the old owner")
	emit(heir, "from the new owner")
	next("from the new owner")
}
