package activator

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportBoundary keeps the edge independent of every mechanism: internal/activator declares the
// Backend it needs and must never depend on a backend package or a backend's library.
func TestImportBoundary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Skipf("go list unavailable: %v", err)
	}
	forbidden := []string{
		"github.com/activator/activator/internal/backend/",
		"github.com/coreos/go-systemd",
		"github.com/godbus/dbus",
		"github.com/digitalocean/go-qemu",
		"github.com/stmcginnis/gofish",
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) {
				t.Errorf("internal/activator depends on %s", dep)
			}
		}
	}
}
