package exec

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/backend/backendtest"
	"github.com/activator/activator/internal/foreign"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/testenv"
)

// The fault class of each failure the exec backing reports, read with tenant.ClassOf from what Wake
// (or Check) returns, against real child processes. The exec backing has no throttle: nothing between
// fork and exec asks the activator to slow down, so no case of that class exists to provoke.

// scriptBackend decodes a route whose argv is a shell script written to a fresh temp dir (Decode
// checks that it exists and is executable) and returns its Backend, closed at cleanup, with the
// script's path.
func scriptBackend(t *testing.T, up registry.Upstream) (*Backend, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "app")
	if err := os.WriteFile(path, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &registry.Route{Name: "app", Upstream: up}
	var node yaml.Node
	if err := yaml.Unmarshal(fmt.Appendf(nil, "argv: [%q]\n", path), &node); err != nil {
		t.Fatal(err)
	}
	s, err := Decode(r, &node)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	r.Settings = s
	b, err := New(r, Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		if err := b.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b, path
}

// wakeErr wakes b within budget and returns the error; a Wake that succeeds fails t.
func wakeErr(t *testing.T, b *Backend) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	life, err := b.Wake(ctx, tenant.Discard)
	if err == nil {
		t.Fatalf("Wake succeeded (life %v), want an error", life)
	}
	return err
}

// The executable or its permissions changed after the config was loaded: no retry can help.
func TestTerminalExecutable(t *testing.T) {
	cases := []struct {
		name  string
		spoil func(path string) error
		want  error
	}{
		{"missing", os.Remove, os.ErrNotExist},
		{"not_executable", func(p string) error { return os.Chmod(p, 0o644) }, os.ErrPermission},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, path := scriptBackend(t, testenv.FreeTCP(t))
			if err := c.spoil(path); err != nil {
				t.Fatal(err)
			}
			err := wakeErr(t, b)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Wake = %v, want an error naming %s and wrapping %v", err, path, c.want)
			}
			backendtest.WantClass(t, err, tenant.ClassTerminal)
		})
	}
}

// Something else already listens on the upstream: an operator must stop it.
func TestTerminalForeignHolder(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f := newFixture(t, registry.Upstream{Network: "tcp", Address: ln.Addr().String()}, "")
	err = wakeErr(t, f.b)
	var held *foreign.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("Wake = %v, want a *foreign.HeldError", err)
	}
	backendtest.WantClass(t, err, tenant.ClassTerminal)
}

// sleep: freeze without cgroups cannot be honoured here, both at the wake and in the host check.
func TestTerminalUnsupportedSetting(t *testing.T) {
	f := newFixture(t, testenv.FreeTCP(t), "sleep: freeze\n") // no Containment: process groups only
	err := wakeErr(t, f.b)
	if !strings.Contains(err.Error(), "sleep: freeze is unavailable") {
		t.Fatalf("Wake = %v, want it to say freeze is unavailable", err)
	}
	backendtest.WantClass(t, err, tenant.ClassTerminal)
	if pids := tagged(f.tag); len(pids) > 0 {
		t.Errorf("the refused wake spawned %v", pids)
	}

	p := NewProvider(Options{Logger: testLogger(t)})
	p.CheckRoot("off")
	r := &registry.Route{Name: "app", Settings: f.b.settings}
	cerr := p.Check(context.Background(), r)
	if cerr == nil || !strings.Contains(cerr.Error(), "sleep: freeze is unavailable") {
		t.Fatalf("Check = %v, want it to say freeze is unavailable", cerr)
	}
	backendtest.WantClass(t, cerr, tenant.ClassTerminal)
}

// A tenant that daemonizes before printing its ready marker does so at every start.
func TestTerminalDaemonizes(t *testing.T) {
	f := newShellFixture(t, testenv.FreeTCP(t), `( setsid "$0" & ) ; exit 0`, "ready_marker: never printed\n",
		Options{Containment: contained(t)})
	err := wakeErr(t, f.b)
	var de *DaemonError
	if !errors.As(err, &de) {
		t.Fatalf("Wake = %v, want a *DaemonError", err)
	}
	// Its chain holds the retryable *ExitError of the main process; the outer class wins.
	backendtest.WantClass(t, err, tenant.ClassTerminal)
}

// A tenant that exits before its ready marker may have met a transient fault: the next wake, after
// the backoff, tries again.
func TestRetryableExitBeforeReady(t *testing.T) {
	f := newFixture(t, testenv.FreeTCP(t), "env: {DEMOAPP_EXIT_CODE: \"3\"}\nready_marker: demoapp ready\n")
	err := wakeErr(t, f.b)
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 3 {
		t.Fatalf("Wake = %v, want an *ExitError with code 3", err)
	}
	backendtest.WantClass(t, err, tenant.ClassRetryable)
}

// The wake's budget runs out while the ready marker has not been seen. The marker is never printed,
// so the budget runs out however fast the machine is.
func TestRetryableBudgetRanOut(t *testing.T) {
	f := newFixture(t, testenv.FreeTCP(t), "ready_marker: never printed\n")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := f.b.Wake(ctx, tenant.Discard)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wake = %v, want the wake budget's deadline", err)
	}
	backendtest.WantClass(t, err, tenant.ClassRetryable)
}
