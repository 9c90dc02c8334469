package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/activator/activator/internal/systemdtest"
	"github.com/activator/activator/internal/testenv"
)

// TestShippedSandboxRunsTenants: under the shipped activator.service, whose sandbox every tenant
// inherits, a Node.js app and a QEMU guest (TCG) wake and answer. Before, the unit had
// MemoryDenyWriteExecute=yes, under which V8 dies (SIGTRAP) and Java and QEMU's TCG cannot make their
// code, and its SystemCallFilter killed QEMU (SIGSYS) for a seccomp(2) call it makes at start: the
// shipped unit ran neither the most common small web app nor any guest.
func TestShippedSandboxRunsTenants(t *testing.T) {
	if _, err := exec.LookPath("systemctl"); err != nil {
		testenv.Missing(t, "no systemctl (apt-get install systemd): %v", err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Missing(t, "no node (apt-get install nodejs): %v", err)
	}
	g := needTestGuest(t)
	m := systemdtest.Start(t)
	dir := t.TempDir()
	runDir := qemuRunDir(t) // the guest's runtime and snapshot dirs: written by the service
	edge := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cfgPath, logPath := filepath.Join(dir, "activator.yaml"), filepath.Join(dir, "activator.log")
	const app = `require("http").createServer((q, s) => s.end("hello from node")).listen(+process.env.PORT, process.env.HOST)`
	cfg := fmt.Sprintf(`listen: %q
admin: %q
routes:
  - name: node
    hosts: [node.test]
    backing: exec
    upstream: %q
    health: {path: /, interval: 20ms}
    exec: {argv: [%q, -e, %q]}
  - name: guest
    hosts: [guest.test]
    backing: kvm
    upstream: %q
    wake_budget: 2m
    health: {path: /, interval: 20ms, timeout: 250ms}
    kvm: {kernel: %q, initrd: %q, append: %q, accel: tcg, memory: 128, runtime_dir: %q, snapshot_dir: %q}
`, freeLoopbackAddr(t), freeLoopbackAddr(t), freeLoopbackAddr(t), node, app,
		fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), g.kernel, g.initrd, g.append, filepath.Join(runDir, "run"), filepath.Join(runDir, "snap"))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	startShippedUnits(t, m, shippedRun{config: cfgPath, log: logPath, readOnly: dir, readWrite: runDir, edge: edge, admin: filepath.Join(dir, "admin.sock")})

	ctx, cancel := context.WithTimeout(context.Background(), 4*patience)
	defer cancel()
	for host, want := range map[string]string{"node.test": "hello from node", "guest.test": "activator-test-guest ok"} {
		if a := getFresh(ctx, edge, host, "/"); a.err != nil || a.code != http.StatusOK || !strings.Contains(a.body, want) {
			t.Errorf("GET %s under the shipped unit: %d %q %v, want 200 with %q", host, a.code, a.body, a.err, want)
		}
	}
}
