package main

// A restart under systemd loses no request: the activator runs as the shipped units (socket
// activation: activator.socket, activator-admin.socket, activator.service) on a private user manager,
// and is restarted with `systemctl --user restart` while clients keep sending requests.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/activator/activator/internal/systemdtest"
	"github.com/activator/activator/internal/testenv"
)

// unitEdit adapts one shipped unit file to the test's manager: set replaces the value of a key (every
// occurrence of it goes, and one line with the new value takes the first one's place); drop removes a
// key, with the reason it cannot be kept; add appends lines to a section.
type unitEdit struct {
	set  map[string]string
	drop map[string]string // key -> why
	add  map[string][]string
}

// apply returns text with e applied. It fails t if a key to set or drop is not in text: a shipped unit
// that changed must be looked at again, not silently run differently.
func (e unitEdit) apply(t testing.TB, name, text string) string {
	t.Helper()
	seen := map[string]bool{}
	var out []string
	section := ""
	flush := func() { out = append(out, e.add[section]...) }
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "[") {
			flush()
			section = trimmed
			out = append(out, line)
			continue
		}
		key, _, ok := strings.Cut(trimmed, "=")
		if !ok || strings.HasPrefix(trimmed, "#") {
			out = append(out, line)
			continue
		}
		if v, ok := e.set[key]; ok {
			if !seen[key] {
				out = append(out, key+"="+v)
			}
			seen[key] = true
			continue
		}
		if _, ok := e.drop[key]; ok {
			seen[key] = true
			continue
		}
		out = append(out, line)
	}
	flush()
	for k := range e.set {
		if !seen[k] {
			t.Fatalf("%s: no %s= to set: has the shipped unit changed?", name, k)
		}
	}
	for k := range e.drop {
		if !seen[k] {
			t.Fatalf("%s: no %s= to drop: has the shipped unit changed?", name, k)
		}
	}
	return strings.Join(out, "\n")
}

// shippedUnit reads a unit file from the repository's units/.
func shippedUnit(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "units", name))
	if err != nil {
		t.Fatalf("shipped unit: %v", err)
	}
	return string(b)
}

// systemctl runs `systemctl --user ARGS` against m.
func systemctl(t testing.TB, m *systemdtest.Manager, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*patience)
	defer cancel()
	cmd := exec.CommandContext(ctx, "systemctl", append([]string{"--user"}, args...)...)
	cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+m.RuntimeDir, "DBUS_SESSION_BUS_ADDRESS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("systemctl --user %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// loadTally counts what the load generator's requests got.
type loadTally struct {
	mu      sync.Mutex // guards the fields below
	answers map[string]int
	errs    map[string]int
	samples []string // the first few errors, verbatim
	ok      int      // proxied answers, for waiting on progress
	changed chan struct{}
}

func newLoadTally() *loadTally {
	return &loadTally{answers: map[string]int{}, errs: map[string]int{}, changed: make(chan struct{})}
}

// add records one request's outcome: the tenant's answer, a 503 with Retry-After, some other answer,
// or a transport error by kind.
func (l *loadTally) add(a clientAnswer, wantBody string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	defer func() { close(l.changed); l.changed = make(chan struct{}) }()
	switch {
	case a.err != nil:
		kind := "other error"
		switch {
		case errors.Is(a.err, syscall.ECONNRESET):
			kind = "connection reset"
		case errors.Is(a.err, syscall.ECONNREFUSED):
			kind = "connection refused"
		case errors.Is(a.err, io.EOF), errors.Is(a.err, io.ErrUnexpectedEOF):
			kind = "closed without an answer"
		}
		l.errs[kind]++
		if len(l.samples) < 5 {
			l.samples = append(l.samples, time.Now().UTC().Format("15:04:05.000000")+" "+a.err.Error())
		}
	case a.code == http.StatusOK && a.body == wantBody:
		l.answers["200 proxied"]++
		l.ok++
	case a.code == http.StatusServiceUnavailable && a.retryAfter != "":
		l.answers["503 with Retry-After"]++
	default:
		l.answers[fmt.Sprintf("unexpected %d (Retry-After %q) %q", a.code, a.retryAfter, a.body)]++
	}
}

// waitOK waits until more than n proxied answers have been counted, failing t after patience.
func (l *loadTally) waitOK(t testing.TB, n int) {
	t.Helper()
	deadline := time.NewTimer(patience)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		ok, changed := l.ok, l.changed
		l.mu.Unlock()
		if ok > n {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("no proxied answer within %v (had %d)", patience, ok)
		}
	}
}

func (l *loadTally) okCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok
}

// TestRestartUnderSystemdLosesNothing: with the shipped socket units, `systemctl restart
// activator.service` under load loses no request. systemd keeps the listening sockets across the
// restart, so connections made while no activator runs wait in the backlog; the old activator drains
// what it accepted and stops its tenant within shutdown_grace; the new one wakes the tenant again. Every
// request gets the tenant's answer or a 503 with Retry-After: no connection error, no reset.
func TestRestartUnderSystemdLosesNothing(t *testing.T) {
	if _, err := exec.LookPath("systemctl"); err != nil {
		testenv.Missing(t, "no systemctl (apt-get install systemd): %v", err)
	}
	m := systemdtest.Start(t)
	const body = "hello across restarts"
	edge := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	dir := t.TempDir()
	admin := filepath.Join(dir, "admin.sock") // the shipped unit's is a unix socket too
	cfgPath, logPath := filepath.Join(dir, "activator.yaml"), filepath.Join(dir, "activator.log")
	app := appRoute{Name: "app", Env: map[string]string{"DEMOAPP_BODY": body}}
	// listen and admin are what the activator would bind without systemd; under it the sockets win.
	cfg := fmt.Sprintf("listen: %q\nadmin: %q\nshutdown_grace: 10s\n", freeLoopbackAddr(t), freeLoopbackAddr(t)) + configYAML(t, app)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}

	startShippedUnits(t, m, shippedRun{config: cfgPath, log: logPath, readOnly: dir, edge: edge, admin: admin})

	ctx, cancel := context.WithTimeout(context.Background(), 5*patience)
	defer cancel()
	if a := getFresh(ctx, edge, app.host(), "/"); a.err != nil || a.code != http.StatusOK {
		t.Fatalf("first request: %d %q %v", a.code, a.body, a.err)
	}

	// The load: workers sending GET / one after another, each over a connection of its own, so that
	// every error is one request's and none is a reused connection's.
	const workers, maxRequests = 16, 200000
	tally := newLoadTally()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sent atomic.Int64
	for range workers {
		wg.Go(func() {
			for sent.Add(1) <= maxRequests {
				select {
				case <-stop:
					return
				default:
				}
				tally.add(getFresh(ctx, edge, app.host(), "/"), body+"\n")
			}
		})
	}
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopLoad() // also when the test fails on the way
	pids := []int{m.MainPID(t, "activator.service")}
	const restarts = 3
	for range restarts {
		tally.waitOK(t, tally.okCount()+200) // the tenant is awake and serving under load
		systemctl(t, m, "restart", "activator.service")
		pids = append(pids, m.MainPID(t, "activator.service"))
	}
	tally.waitOK(t, tally.okCount()+200)
	stopLoad()

	if slices.Contains(pids, 0) || len(slices.Compact(slices.Clone(pids))) != restarts+1 {
		t.Errorf("activator main pids %v, want %d different ones", pids, restarts+1)
	}
	tally.mu.Lock()
	defer tally.mu.Unlock()
	total := 0
	for _, k := range slices.Sorted(maps.Keys(tally.answers)) {
		t.Logf("%-40s %d", k, tally.answers[k])
		total += tally.answers[k]
		if strings.HasPrefix(k, "unexpected") {
			t.Errorf("%d requests got %s, want the tenant's answer or 503 with Retry-After", tally.answers[k], k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(tally.errs)) {
		t.Logf("%-40s %d", k, tally.errs[k])
		total += tally.errs[k]
		t.Errorf("%d requests: %s, want none", tally.errs[k], k)
	}
	for _, s := range tally.samples {
		t.Logf("error: %s", s)
	}
	t.Logf("%d requests across %d restarts (activator pids %v)", total, restarts, pids)

	// Each activator that was restarted put its tenant down itself, after its last request (systemd's
	// SIGTERM reached the activator alone: KillMode=mixed).
	f, err := os.Open(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	logs := newJSONLog()
	logs.read(f)
	if got := len(logs.matching("stopped")); got < restarts {
		t.Errorf("the activators logged %d tenant stops, want one for each of the %d restarts", got, restarts)
	}
	if died := logs.matching("tenant stopped on its own"); len(died) > 0 {
		t.Errorf("tenants stopped under a running activator: %v", died)
	}
	// The shipped sandbox leaves the kernel's socket lookups usable (AF_NETLINK).
	if w := logs.matching("socket lookups unavailable: health gates and the foreign-listener check dial instead"); len(w) > 0 {
		t.Errorf("under the shipped unit: %v", w)
	}
}

// dumpServiceLogs logs the activator service's status, the manager's log and the activators' log.
func dumpServiceLogs(t testing.TB, m *systemdtest.Manager, activatorLog string) {
	cmd := exec.Command("systemctl", "--user", "status", "--no-pager", "-l", "activator.service")
	cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+m.RuntimeDir, "DBUS_SESSION_BUS_ADDRESS=")
	out, _ := cmd.CombinedOutput()
	t.Logf("systemctl --user status activator.service:\n%s", out)
	for _, path := range []string{m.LogPath, activatorLog} {
		dumpTail(t, path)
	}
}

// dumpTail logs the last 200 lines of the file at path.
func dumpTail(t testing.TB, path string) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > 200 {
		lines = lines[len(lines)-200:]
	}
	for _, l := range lines {
		t.Logf("%s: %s", filepath.Base(path), l)
	}
}

// shippedRun is where one activator run under the shipped units keeps its files and listens.
type shippedRun struct {
	config, log string // the config file, and the file the activator's logs go to
	readOnly    string // a dir the service sees read-only (the config's)
	readWrite   string // a dir it may write ("": none)
	edge, admin string // the edge's address and the admin socket's path
}

// startShippedUnits runs this test binary as the activator under the shipped units, with run's paths
// and addresses, on m, until the test ends. What a user manager cannot apply here is dropped, and so
// is what would hide the test's files from the service; the socket activation, Type=notify, the stop
// and kill settings, the restart policy and the rest of the sandbox stay as shipped.
func startShippedUnits(t *testing.T, m *systemdtest.Manager, run shippedRun) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	noRemount := "this host cannot remount it for a service (226/NAMESPACE)"
	add := []string{
		"Environment=" + serveChildEnv + "=1",
		// The race detector's pause at exit is not the activator's: leave it out of the restart.
		"Environment=GORACE=atexit_sleep_ms=0",
		// There is no journal here: the activators' logs go to a file the test prints on failure.
		"StandardError=append:" + run.log,
	}
	if run.readWrite != "" {
		add = append(add, "ReadWritePaths="+run.readWrite)
	}
	// Without PrivateTmp (dropped below) /tmp is read-only under ProtectSystem=strict, and the
	// activator refuses to start where it cannot spill request bodies (edge.body_buffer_dir, unset:
	// $TMPDIR): the shipped unit's private /tmp is writable, so this one gets a $TMPDIR of its own.
	tmp := t.TempDir()
	add = append(add, "ReadWritePaths="+tmp, "Environment=TMPDIR="+tmp)
	service := unitEdit{
		set: map[string]string{
			"ExecStart":     fmt.Sprintf("%s serve --config %s --log-format json", self, run.config),
			"ReadOnlyPaths": run.readOnly,
		},
		drop: map[string]string{
			"User":                  "a user manager runs services as its own user",
			"Group":                 "a user manager runs services as its own user",
			"PrivateTmp":            "the test binary and its config live under /tmp",
			"StateDirectory":        "under a user manager it would be made in $HOME",
			"ProtectHome":           noRemount,
			"ProtectKernelTunables": noRemount,
			"ProtectKernelLogs":     noRemount,
		},
		add: map[string][]string{"[Service]": add},
	}.apply(t, "activator.service", shippedUnit(t, "activator.service"))
	socket := unitEdit{set: map[string]string{"ListenStream": run.edge}}.apply(t, "activator.socket", shippedUnit(t, "activator.socket"))
	adminSocket := unitEdit{
		set: map[string]string{"ListenStream": run.admin},
		drop: map[string]string{
			"SocketUser":  "a user manager cannot chown the socket to another user",
			"SocketGroup": "a user manager cannot chown the socket to another group",
		},
	}.apply(t, "activator-admin.socket", shippedUnit(t, "activator-admin.socket"))
	m.WriteUnit(t, "activator.service", service)
	m.WriteUnit(t, "activator.socket", socket)
	m.WriteUnit(t, "activator-admin.socket", adminSocket)
	t.Cleanup(func() {
		if t.Failed() {
			dumpServiceLogs(t, m, run.log)
		}
	})
	m.StartUnit(t, "activator.socket")
	m.StartUnit(t, "activator-admin.socket")
	m.StartUnit(t, "activator.service") // Type=notify: done once it sent READY=1
	t.Cleanup(func() { m.StopUnit(t, "activator.service") })
}
