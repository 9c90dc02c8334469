package systemdtest

import (
	"context"
	"testing"
	"time"
)

func TestManager(t *testing.T) {
	m := Start(t)
	m.WriteUnit(t, "one.service", "[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart=/bin/true\n")
	m.StartUnit(t, "one.service")
	if st := m.ActiveState(t, "one.service"); st != "active" {
		t.Fatalf("ActiveState %q, want active", st)
	}
	m.StopUnit(t, "one.service")
	m.WaitState(t, "one.service", "inactive", time.Minute)
}

func TestBusProxyCut(t *testing.T) {
	m := Start(t)
	p := m.NewBusProxy(t)
	ctx := context.Background()
	c, err := DialRaw(ctx, p.Address)
	if err != nil {
		t.Fatalf("dial through proxy: %v", err)
	}
	defer c.Close()
	p.Cut()
	select {
	case <-c.Context().Done():
	case <-time.After(time.Minute):
		t.Fatal("the cut connection did not close")
	}
	c2, err := DialRaw(ctx, p.Address)
	if err != nil {
		t.Fatalf("dial after cut: %v", err)
	}
	c2.Close()
}
