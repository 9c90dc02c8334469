package activator

import (
	"os/exec"
	"slices"
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
	forbidden["../upstream"] = []string{mod + "internal/activator", mod + "internal/health"}
	forbidden["../health"] = []string{mod + "internal/activator"}
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

// TestImportRows keeps the rest of architecture.md's "Who owns what" table: each package there that
// "never imports everything of ours but …" imports, directly, only the packages of this module its row
// names. A new import across a row fails here, and the table changes with it or the import goes.
func TestImportRows(t *testing.T) {
	const internal = "github.com/activator/activator/internal/"
	may := map[string][]string{
		"tenant":    {"registry"},
		"bodybuf":   nil,
		"registry":  nil,
		"waitpage":  nil,
		"cgroup":    nil,
		"foreign":   {"sockdiag", "tenant"},
		"sockdiag":  nil,
		"connlimit": nil,
		"fleet":     {"tenant"},
		"warmloop":  {"upstream"},
		"tlsedge":   {"registry"},
		"acme":      {"registry", "privdir"},
		"trust":     nil,
		"privdir":   nil,
	}
	args := []string{"list", "-f", `{{.ImportPath}} {{join .Imports " "}}`}
	for p := range may {
		args = append(args, "../"+p)
	}
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], internal)
		allowed, ok := may[pkg]
		if !ok {
			t.Fatalf("go list named %q, which the table does not", f[0])
		}
		seen++
		for _, imp := range f[1:] {
			if ours, ok := strings.CutPrefix(imp, internal); ok && !slices.Contains(allowed, ours) {
				t.Errorf("internal/%s imports internal/%s: architecture.md's row allows only %v", pkg, ours, allowed)
			}
		}
	}
	if seen != len(may) {
		t.Fatalf("go list answered for %d packages, want %d", seen, len(may))
	}
}
