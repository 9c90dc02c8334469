package activator

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportBoundary keeps the edge and the backings apart: both sides import the contract in
// internal/tenant, internal/activator never depends on a backing or a backing's library, and no
// backing depends on internal/activator (and so on chi, Prometheus or the proxy).
func TestImportBoundary(t *testing.T) {
	const mod = "github.com/activator/activator/"
	deps := func(pkgs ...string) map[string][]string {
		t.Helper()
		args := append([]string{"list", "-deps", "-f", `{{.ImportPath}}`}, pkgs...)
		out := map[string][]string{}
		for _, p := range pkgs {
			b, err := exec.Command("go", append(args[:4:4], p)...).Output()
			if err != nil {
				t.Fatalf("go list -deps %s: %v", p, err)
			}
			out[p] = strings.Fields(string(b))
		}
		return out
	}
	forbidden := map[string][]string{
		".": {
			mod + "internal/backend/",
			"github.com/coreos/go-systemd",
			"github.com/godbus/dbus",
			"github.com/digitalocean/go-qemu",
			"github.com/stmcginnis/gofish",
		},
	}
	for _, b := range []string{"exec", "unit", "kvm", "redfish", "split", "backendtest"} {
		// Prometheus's metrics libraries, not its /proc parser (prometheus/procfs, which
		// internal/foreign uses to name the holder of a tenant's address).
		forbidden["../backend/"+b] = []string{mod + "internal/activator", "github.com/go-chi/chi",
			"github.com/prometheus/client_golang", "github.com/prometheus/client_model", "github.com/prometheus/common"}
	}
	forbidden["../tenant"] = []string{mod + "internal/activator", mod + "internal/backend/"}
	pkgs := make([]string, 0, len(forbidden))
	for p := range forbidden {
		pkgs = append(pkgs, p)
	}
	for pkg, list := range deps(pkgs...) {
		for _, dep := range list {
			for _, f := range forbidden[pkg] {
				if strings.HasPrefix(dep, f) {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}
