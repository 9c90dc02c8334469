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
	cfg = renderFleetConfig(18080, 19090, 8443, []int{9101, 9102, 9103}, pw, ca)
	c, err = registry.Load([]byte(cfg), map[string]registry.SettingsDecoder{"redfish": redfish.Decode})
	if err != nil {
		t.Fatalf("generated redfish config rejected: %v\n%s", err, cfg)
	}
	if len(c.Routes) != 3 {
		t.Fatalf("got %d routes, want 3", len(c.Routes))
	}
	if s := c.Routes[2].Settings.(*redfish.Settings); s.System != "node-2" || s.Endpoint != "https://127.0.0.1:8443" {
		t.Errorf("node-2 settings = %+v", s)
	}
}
