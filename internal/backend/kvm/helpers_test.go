package kvm

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/backend/backendtest"
	"github.com/activator/activator/internal/health"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/testenv"
)

const guestBody = "activator-test-guest ok"

// guest is the test guest built by scripts/build-test-guest.sh.
type guest struct {
	kernel, initrd, append string
}

// needGuest finds QEMU and the test guest ($ACTIVATOR_GUEST_DIR, or .guest/ at the repo root), or
// reports them missing.
func needGuest(tb testing.TB) guest {
	tb.Helper()
	if _, err := exec.LookPath(DefaultQEMU); err != nil {
		testenv.Missing(tb, "%s not installed (apt-get install -y qemu-system-x86)", DefaultQEMU)
	}
	dir := os.Getenv("ACTIVATOR_GUEST_DIR")
	if dir == "" {
		_, file, _, _ := runtime.Caller(0)
		dir = filepath.Join(filepath.Dir(file), "..", "..", "..", ".guest")
	}
	g := guest{kernel: filepath.Join(dir, "vmlinux"), initrd: filepath.Join(dir, "initrd.img")}
	for _, f := range []string{g.kernel, g.initrd} {
		if _, err := os.Stat(f); err != nil {
			testenv.Missing(tb, "test guest missing (%v): run scripts/build-test-guest.sh", err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "append"))
	if err != nil {
		testenv.Missing(tb, "test guest missing (%v): run scripts/build-test-guest.sh", err)
	}
	g.append = strings.TrimSpace(string(b))
	return g
}

// needGuestInit is needGuest for a test that needs the guest's init at version init or later
// (build-test-guest.sh's stamp): a guest built by an older script lacks what the test asks of it.
func needGuestInit(tb testing.TB, init int) guest {
	tb.Helper()
	g := needGuest(tb)
	stamp, _ := os.ReadFile(filepath.Join(filepath.Dir(g.kernel), "stamp"))
	var built int // the stamp's last word: init-N
	if f := strings.Fields(string(stamp)); len(f) > 0 {
		_, _ = fmt.Sscanf(f[len(f)-1], "init-%d", &built)
	}
	if built < init {
		testenv.Missing(tb, "test guest built by an older script (stamp %q, this test needs init-%d): run scripts/build-test-guest.sh", stamp, init)
	}
	return g
}

// shortDir is a private temp dir short enough for a unix socket path, removed at cleanup.
func shortDir(tb testing.TB) string {
	tb.Helper()
	d, err := os.MkdirTemp("", "kvmt")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// route decodes a kvm route for the guest through Decode, as the registry would.
func route(tb testing.TB, g guest, sleep string, extra string) *registry.Route {
	tb.Helper()
	rt := shortDir(tb)
	doc := fmt.Sprintf(`
kernel: %s
initrd: %s
append: %q
accel: auto
sleep: %s
runtime_dir: %s
snapshot_dir: %s
%s`, g.kernel, g.initrd, g.append, sleep, filepath.Join(rt, "run"), filepath.Join(rt, "snap"), extra)
	return decodeRoute(tb, "guest", testenv.FreeLoopbackAddr(tb), doc) // not 127.0.0.1: see FreeLoopbackAddr
}

func decodeRoute(tb testing.TB, name, upstream, doc string) *registry.Route {
	tb.Helper()
	u, err := registry.ParseUpstream(upstream)
	if err != nil {
		tb.Fatal(err)
	}
	r := &registry.Route{Name: name, Backing: "kvm", Upstream: u}
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(doc), &n); err != nil {
		tb.Fatal(err)
	}
	s, err := Decode(r, n.Content[0])
	if err != nil {
		tb.Fatalf("Decode: %v", err)
	}
	r.Settings = s
	return r
}

// testLogger writes the backend's logs to the test log.
func testLogger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Helper()
	w.tb.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// logTap is a logger's writer that passes each line to the test log and keeps it, for tests of what
// the backing says.
type logTap struct {
	tb    testing.TB
	mu    sync.Mutex
	lines []string
}

func newLogTap(tb testing.TB) *logTap { return &logTap{tb: tb} }

func (l *logTap) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (l *logTap) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	l.tb.Log(line)
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
	return len(p), nil
}

// find returns the first line that contains every one of subs, or "".
func (l *logTap) find(subs ...string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			return line
		}
	}
	return ""
}

// open opens r's backend and registers a Close (and, as a safety net, a kill of any QEMU left) at
// cleanup.
func open(tb testing.TB, r *registry.Route) *Backend {
	tb.Helper()
	return openWith(tb, New(Options{Logger: testLogger(tb)}), r)
}

// openWith is open through p: the Provider of an activator that opens several routes.
func openWith(tb testing.TB, p *Provider, r *registry.Route) *Backend {
	tb.Helper()
	be, err := p.Open(r)
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	b := be.(*Backend)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := b.Close(ctx); err != nil {
			tb.Errorf("Close: %v", err)
		}
		killLeftover(b.p)
	})
	return b
}

// killLeftover kills a QEMU still running from a test (a failed test must not leave guests behind).
func killLeftover(p paths) {
	if pid, err := readPid(p.pid); err == nil && isOurQEMU(pid, p.sock) {
		_ = killAndWait(pid)
	}
}

// qemuPid returns the pid of the route's running QEMU, or 0.
func qemuPid(p paths) int {
	pid, err := readPid(p.pid)
	if err != nil || !isOurQEMU(pid, p.sock) {
		return 0
	}
	return pid
}

// qmpStatus asks the backend's QEMU for its run state through the real monitor ("" without QEMU).
func qmpStatus(tb testing.TB, b *Backend) string {
	tb.Helper()
	b.mu.Lock()
	inst := b.inst
	b.mu.Unlock()
	if inst == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := inst.queryStatus(ctx)
	if err != nil {
		tb.Fatalf("query-status: %v", err)
	}
	return st
}

// subject is a backendtest.Subject for one mode.
func subject(t *testing.T, g guest, sleep string) backendtest.Subject {
	r := route(t, g, sleep, "")
	b := open(t, r)
	return backendtest.Subject{
		Backend:  b,
		Upstream: r.Upstream,
		Body:     guestBody,
		Budget:   2 * time.Minute,
		Kill: func(t *testing.T) {
			pid := qemuPid(b.p)
			if pid == 0 {
				t.Fatal("no qemu to kill")
			}
			killPid(pid)
		},
		Awake: func(t *testing.T) bool {
			if qemuPid(b.p) == 0 {
				return false
			}
			return qmpStatus(t, b) == "running"
		},
	}
}

// wake wakes b with the route's budget and waits for the guest's HTTP 200.
func wake(tb testing.TB, b *Backend, up registry.Upstream, tr tenant.Tracker) *tenant.Life {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	life, err := b.Wake(ctx, tr)
	if err != nil {
		tb.Fatalf("Wake: %v", err)
	}
	waitHealthy(tb, ctx, up, life)
	return life
}

func waitHealthy(tb testing.TB, ctx context.Context, up registry.Upstream, life *tenant.Life) {
	tb.Helper()
	p := health.New(up, registry.Health{Path: "/", MinStatus: 200, MaxStatus: 299, Interval: 20 * time.Millisecond, Timeout: time.Second, Passes: 1})
	if err := p.Wait(ctx, life.Done()); err != nil {
		tb.Fatalf("guest never served: %v (life: %v)", err, life.Err())
	}
}

// sleepB puts b to sleep and waits until it has settled, as the next Wake would: a snapshot sleep
// returns before its QEMU has quit and the snapshot is bound to the RAM file.
func sleepB(tb testing.TB, b *Backend) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := b.Sleep(ctx); err != nil {
		tb.Fatalf("Sleep: %v", err)
	}
	b.op.Lock()
	defer b.op.Unlock()
	if err := b.settle(ctx); err != nil {
		tb.Fatal(err)
	}
}

// get fetches path from the guest.
func get(tb testing.TB, up registry.Upstream, path string) string {
	tb.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	resp, err := c.Get("http://" + up.Address + path)
	if err != nil {
		tb.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("GET %s: status %d", path, resp.StatusCode)
	}
	return strings.TrimSpace(string(body))
}

// recorder is a Tracker that keeps phases and notes.
type recorder struct {
	mu     sync.Mutex
	phases []string
	notes  []string
}

func (r *recorder) Phase(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.phases = append(r.phases, name)
}

func (r *recorder) Note(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notes = append(r.notes, msg)
}

func (r *recorder) get() (phases, notes []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.phases...), append([]string(nil), r.notes...)
}
