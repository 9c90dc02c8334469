package kvm

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSpawnCancelledLeavesNoDaemon: a spawn whose context ends after QEMU has forked its daemon but
// before the daemon wrote its pid file leaves nothing running. Only the pid file told the daemon
// apart, so the daemon went on booting the guest, and the next activator adopted it as running. The
// stand-in for QEMU forks a "daemon" that carries the command line (the QMP socket in it) and never
// daemonizes; the parent hangs.
func TestSpawnCancelledLeavesNoDaemon(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "qemu")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nsh -c 'while :; do sleep 1; done' fake-qemu-daemon \"$@\" &\nwhile :; do sleep 1; done\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := paths{sock: filepath.Join(dir, "qmp.sock"), pid: filepath.Join(dir, "qemu.pid"), log: filepath.Join(dir, "qemu.log"), start: filepath.Join(dir, "qemu-start.log")}
	args := []string{"-qmp", "unix:" + p.sock + ",server=on,wait=off", "-daemonize"}
	t.Cleanup(func() { // a failure leaves nothing behind either
		for _, pid := range ourQEMUs(p.sock) {
			killPid(pid)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// Cancel once the daemon runs: the moment between QEMU's fork and its pid file.
		pctx, pcancel := context.WithTimeout(ctx, time.Minute)
		defer pcancel()
		_ = pollUntil(pctx, func() bool { return len(ourQEMUs(p.sock)) > 0 })
		cancel()
	}()
	if _, err := spawn(ctx, fake, args, p, nil); err == nil {
		t.Fatal("spawn succeeded, want the cancelled context's error")
	}
	wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
	defer wcancel()
	if err := pollUntil(wctx, func() bool { return len(ourQEMUs(p.sock)) == 0 }); err != nil {
		t.Fatalf("the daemon of a cancelled spawn still runs: pids %v", ourQEMUs(p.sock))
	}
}
