package kvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/activator/activator/internal/foreign"
	"github.com/activator/activator/internal/privdir"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/testenv"
)

// The fault class of each failure the kvm backing reports, read with tenant.ClassOf from what Wake,
// Open or Check returns. None of these boots a guest: each fails before QEMU runs one, or holds a real
// QEMU before it gets that far. The kvm backing has no throttle: QEMU never asks the activator to slow
// down, so no case of that class exists to provoke.

// needQEMU reports QEMU missing unless it is installed.
func needQEMU(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath(DefaultQEMU); err != nil {
		testenv.Missing(t, "%s not installed (apt-get install -y qemu-system-x86)", DefaultQEMU)
	}
}

// cheapRoute decodes a kvm route whose kernel is an empty file in dir (no QEMU gets to load it), with
// the extra YAML lines given, and returns it.
func cheapRoute(t *testing.T, dir, extra string) *registry.Route {
	t.Helper()
	kernel := filepath.Join(dir, "kernel")
	if err := os.WriteFile(kernel, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	doc := fmt.Sprintf("kernel: %s\naccel: tcg\nruntime_dir: %s\nsnapshot_dir: %s\n%s",
		kernel, filepath.Join(dir, "run"), filepath.Join(dir, "snap"), extra)
	return decodeRoute(t, "guest", fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), doc)
}

// wantClass fails t unless err is an error of class want.
func wantClass(t *testing.T, err error, want tenant.Class) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want a %s one", want)
	}
	if got := tenant.ClassOf(err); got != want {
		t.Fatalf("ClassOf(%v) = %q, want %q", err, got, want)
	}
}

// wakeErr wakes b with tr and returns its error; a Wake that succeeds fails t.
func wakeErr(t *testing.T, b *Backend, tr tenant.Tracker) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	life, err := b.Wake(ctx, tr)
	if err == nil {
		t.Fatalf("Wake succeeded (life %v), want an error", life)
	}
	return err
}

// qemusOf lists the live processes started with b's QMP socket (a QEMU of this route, daemonized or
// not).
func qemusOf(b *Backend) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmd), "unix:"+b.p.sock+",") && alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// A QEMU binary that does not exist fails Check and Open; one removed after Open fails the wake.
func TestTerminalMissingQEMU(t *testing.T) {
	dir := shortDir(t)
	r := cheapRoute(t, dir, "qemu: "+filepath.Join(dir, "no-such-qemu")+"\n")
	wantClass(t, New(Options{}).Check(context.Background(), r), tenant.ClassTerminal)
	_, err := New(Options{}).Open(r)
	wantClass(t, err, tenant.ClassTerminal)

	fake := filepath.Join(dir, "qemu")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	b := open(t, cheapRoute(t, dir, "qemu: "+fake+"\n"))
	if err := os.Remove(fake); err != nil {
		t.Fatal(err)
	}
	err = wakeErr(t, b, tenant.Discard)
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), fake) {
		t.Fatalf("Wake = %v, want it to say %s does not exist", err, fake)
	}
	wantClass(t, err, tenant.ClassTerminal)
}

// A disk image removed after the config was loaded fails Check and the wake, without a QEMU.
func TestTerminalMissingImage(t *testing.T) {
	needQEMU(t)
	dir := shortDir(t)
	disk := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(disk, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := cheapRoute(t, dir, "disk: "+disk+"\n")
	b := open(t, r)
	if err := os.Remove(disk); err != nil {
		t.Fatal(err)
	}
	cerr := New(Options{}).Check(context.Background(), r)
	if !errors.Is(cerr, os.ErrNotExist) {
		t.Fatalf("Check = %v, want it to report the missing disk", cerr)
	}
	wantClass(t, cerr, tenant.ClassTerminal)
	err := wakeErr(t, b, tenant.Discard)
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "disk") {
		t.Fatalf("Wake = %v, want it to report the missing disk", err)
	}
	wantClass(t, err, tenant.ClassTerminal)
	if pids := qemusOf(b); len(pids) > 0 {
		t.Fatalf("the refused wake launched qemu %v", pids)
	}
}

// Another process listens on the guest's forwarded port: an operator must stop it.
func TestTerminalForeignHolder(t *testing.T) {
	needQEMU(t)
	r := cheapRoute(t, shortDir(t), "")
	ln, err := net.Listen("tcp", r.Upstream.Address)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = wakeErr(t, open(t, r), tenant.Discard)
	var held *foreign.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("Wake = %v, want a *foreign.HeldError", err)
	}
	wantClass(t, err, tenant.ClassTerminal)
}

// budgets records each phase's budget, as the activator's tracker does (tenant.Budgeter).
type budgets struct {
	mu     sync.Mutex
	phase  string
	budget map[string]time.Duration
}

func (b *budgets) Phase(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.phase = name
}

func (b *budgets) Note(string) {}

func (b *budgets) PhaseBudget(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.budget == nil {
		b.budget = map[string]time.Duration{}
	}
	b.budget[b.phase] = d
}

// A real QEMU told to wait for a client on a chardev (server=on,wait=on) before it goes on never
// daemonizes: budgets.qemu_start runs out however fast the machine is. The error names the phase, its
// budget and the state last observed, is retryable, and leaves no QEMU behind.
func TestRetryableQEMUStartBudget(t *testing.T) {
	needQEMU(t)
	dir := shortDir(t)
	hold := "socket,id=hold,path=" + filepath.Join(dir, "hold.sock") + ",server=on,wait=on"
	b := open(t, cheapRoute(t, dir, fmt.Sprintf("budgets: {qemu_start: 1s}\nextra_args: [-chardev, %q]\n", hold)))
	tr := &budgets{}
	err := wakeErr(t, b, tr)
	var be *BudgetError
	if !errors.As(err, &be) || be.Phase != PhaseQEMUStart || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wake = %v, want a *BudgetError of phase %s", err, PhaseQEMUStart)
	}
	// What QEMU printed ("QEMU waiting for connection on: …") follows "it said:" when it got that far
	// within the budget, which is not asserted: that would time the machine.
	for _, want := range []string{"qemu_start: qemu still starting, not daemonized", "after 1s (budgets.qemu_start)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
	wantClass(t, err, tenant.ClassRetryable)
	if got := tr.budget[PhaseQEMUStart]; got != time.Second {
		t.Errorf("budget recorded for %s: %v, want 1s", PhaseQEMUStart, got)
	}
	if pids := qemusOf(b); len(pids) > 0 {
		t.Errorf("qemu %v still runs after the failed wake", pids)
	}
}

// A QMP socket that refuses connections (QEMU not listening yet) is dialed again until budgets.qmp
// runs out, not given up on at the first refusal; the error says so and is retryable.
func TestRetryableQMPRefused(t *testing.T) {
	dir := shortDir(t)
	r := cheapRoute(t, dir, "qemu: /bin/true\nbudgets: {qmp: 200ms}\n")
	b := open(t, r)
	if err := privdir.Make(b.s.RuntimeDir); err != nil {
		t.Fatal(err)
	}
	refusing(t, b.p.sock)
	_, err := b.attach(context.Background(), 0)
	var be *BudgetError
	if !errors.As(err, &be) || be.Phase != PhaseQMP || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("attach = %v, want a *BudgetError of phase %s after refused connections", err, PhaseQMP)
	}
	if !strings.Contains(err.Error(), "after 200ms (budgets.qmp)") {
		t.Errorf("message %q does not name the budget", err)
	}
	wantClass(t, err, tenant.ClassRetryable)
}

// refusing leaves a unix socket file at path that nobody listens on: connections are refused.
func refusing(t *testing.T, path string) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
}

// A runtime_dir or snapshot_dir someone else could change fails Check and Open as terminal, naming
// the key and the step: the backing trusts the pid file, the record of snapshot dirs and the snapshot
// it finds there (the /tmp fallback is a path any local user can make first).
func TestTerminalDirNotPrivate(t *testing.T) {
	dir := shortDir(t)
	r := cheapRoute(t, dir, "")
	run, snap := filepath.Join(dir, "run"), filepath.Join(dir, "snap")
	for _, d := range []string{run, snap} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(run, 65534, 65534); err != nil {
		t.Skipf("cannot give %s to uid 65534, needed to play another local user: %v", run, err)
	}
	if err := os.Chmod(snap, 0o777); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{"Check": New(Options{}).Check(context.Background(), r), "Open": func() error { _, err := New(Options{}).Open(r); return err }()} {
		wantClass(t, err, tenant.ClassTerminal)
		for _, want := range []string{"runtime_dir: " + run + " is owned by uid 65534", "snapshot_dir: " + snap + " is writable by others (mode 0777)"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s = %q, want it to say %q", name, err, want)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(run, pidName)); err == nil {
		t.Fatal("something was written into the refused runtime_dir")
	}
}
