package main

import (
	"encoding/pem"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/activator/activator/internal/backend/kvm"
	"github.com/activator/activator/internal/backend/redfish"
	"github.com/activator/activator/internal/registry"
)

// The guest experiment's generated configs must pass the activator's own validation, with the real kvm
// and redfish decoders (which check that the files they name exist and parse).
func TestGuestConfigsValidate(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	g := testGuest{kernel: write("vmlinux", "k"), initrd: write("initrd.img", "i"), append: `console=ttyS0 quiet "x"`}
	routes := []guestRoute{
		{name: "guest-snap", sleep: "snapshot", port: 20001, dir: filepath.Join(dir, "snap dir")},
		{name: "guest-pause", sleep: "pause", port: 20002, dir: filepath.Join(dir, "pause")},
	}
	cfg := renderGuestConfig(18080, 19090, g, routes)
	c, err := registry.Load([]byte(cfg), map[string]registry.SettingsDecoder{"kvm": kvm.Decode})
	if err != nil {
		t.Fatalf("generated kvm config rejected: %v\n%s", err, cfg)
	}
	if len(c.Routes) != 2 {
		t.Fatalf("got %d routes, want 2", len(c.Routes))
	}
	for i, r := range c.Routes {
		s := r.Settings.(*kvm.Settings)
		if s.Sleep != routes[i].sleep || s.SnapshotDir != routes[i].snapDir() || s.RuntimeDir != routes[i].runDir() || s.Append != g.append {
			t.Errorf("route %s: settings = %+v", r.Name, s)
		}
		if got, want := r.Upstream.Address, "127.0.0.1:"+strconv.Itoa(routes[i].port); got != want {
			t.Errorf("route %s: upstream %s, want %s", r.Name, got, want)
		}
	}

	srv := httptest.NewTLSServer(nil)
	defer srv.Close()
	ca := write("ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})))
	pw := write("pw", "secret\n")
	fleets := []fleetRoute{
		{name: "fleet-parallel", first: 0, ports: []int{9101, 9102, 9103}},
		{name: "fleet-serial", serial: true, first: 3, ports: []int{9104, 9105, 9106}},
	}
	cfg = renderFleetConfig(18080, 19090, 8443, fleets, pw, ca)
	c, err = registry.Load([]byte(cfg), map[string]registry.SettingsDecoder{"redfish": redfish.Decode})
	if err != nil {
		t.Fatalf("generated redfish config rejected: %v\n%s", err, cfg)
	}
	if len(c.Routes) != 2 {
		t.Fatalf("got %d routes, want 2", len(c.Routes))
	}
	for i, r := range c.Routes {
		f := fleets[i]
		if r.Name != f.name || r.Fleet == nil {
			t.Fatalf("route %d: %s, fleet %+v; want %s with a fleet", i, r.Name, r.Fleet, f.name)
		}
		if r.Fleet.Serial != f.serial || r.Fleet.MinReady != len(f.ports) || len(r.Fleet.Members) != len(f.ports) {
			t.Errorf("%s: fleet serial %v, min_ready %d, %d members; want %v, %d, %d", r.Name, r.Fleet.Serial, r.Fleet.MinReady, len(r.Fleet.Members), f.serial, len(f.ports), len(f.ports))
			continue
		}
		for j, m := range r.Fleet.Members {
			s := m.Settings.(*redfish.Settings)
			if want := "node-" + strconv.Itoa(f.first+j); m.Name != want || s.System != want || s.Endpoint != "https://127.0.0.1:8443" {
				t.Errorf("%s member %d: %s, settings %+v; want %s on the simulator", r.Name, j, m.Name, s, want)
			}
			if got, want := m.Upstream.Address, "127.0.0.1:"+strconv.Itoa(f.ports[j]); got != want {
				t.Errorf("%s member %s: upstream %s, want %s", r.Name, m.Name, got, want)
			}
		}
	}
}
