// Package testenv decides what a test does when something it needs from the host (a systemd manager,
// QEMU, a guest image) is missing: skip with the reason, or fail when ACTIVATOR_INTEGRATION=required
// (as .ci/run sets), so CI cannot pass by skipping.
package testenv

import (
	"os"
	"testing"
)

// Required reports whether integration dependencies are mandatory in this run.
func Required() bool { return os.Getenv("ACTIVATOR_INTEGRATION") == "required" }

// Missing skips t with the reason, or fails it when integration tests are required.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if Required() {
		t.Fatalf("ACTIVATOR_INTEGRATION=required, but: "+format, args...)
	}
	t.Skipf("skipping: "+format+" (set ACTIVATOR_INTEGRATION=required to make this a failure)", args...)
}
