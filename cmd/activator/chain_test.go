package main

// Wakes that span backings (issue #15), end to end: a real `activator serve` (this test binary
// re-executed, as in shutdown_test.go) with instances and requires: chains across the Redfish
// simulator of package redfishtest, the QEMU test guest (scripts/build-test-guest.sh, booted under TCG)
// and exec tenants (this binary as the demo app). What is checked is what an operator sees: the edge's
// answers, the admin API's statuses and histories, and `activator explain`. Order is read from the
// records (which phase or event came first), never from how long anything took.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/backend/redfish/redfishtest"
	"github.com/activator/activator/internal/demoapp"
	"github.com/activator/activator/internal/testenv"
)

// TestChainAcrossBackings: route app (exec) requires instance guest (a QEMU guest under TCG), which
// requires instance node (a Redfish node of the simulator). One request wakes node, then guest, then
// app, each past its own health gate before its dependent starts; the route's record nests the three
// wakes with their phases, and `activator explain` prints them as a tree. After the idle windows they
// sleep in reverse: app, then guest (once app let go), then node.
func TestChainAcrossBackings(t *testing.T) {
	g := needTestGuest(t)
	bmc := newChainBMC(t)
	runDir := qemuRunDir(t)
	s := startServed(t, "instances:\n"+bmc.nodeYAML()+guestYAML(t, g, runDir, "")+"routes:\n"+chainApp(t))

	ctx, cancel := context.WithTimeout(context.Background(), 3*patience)
	defer cancel()
	if a := getFresh(ctx, s.edge, "app.test", "/"); a.err != nil || a.code != http.StatusOK || a.body != "hello from demoapp\n" {
		t.Fatalf("GET app.test: %d %q %v, want 200 from the demo app", a.code, a.body, a.err)
	}

	// The route's record: all three wakes, nested, with their phases, in dependency order.
	rec := s.status("app").LastWake
	if rec == nil {
		t.Fatal("no wake record for app")
	}
	logRecord(t, "app", rec)
	if rec.Outcome != activator.OutcomeSucceeded || rec.Result != activator.ResultOK || rec.Culprit != nil {
		t.Errorf("app: outcome %q result %q culprit %v, want succeeded, ok and no culprit", rec.Outcome, rec.Result, rec.Culprit)
	}
	wantPhases(t, "app", rec, "requires", "spawn", "health")
	guest := required(t, "app", rec, "guest", "woken")
	wantPhases(t, "guest", guest, "requires", "qemu_start", "qmp", "running", "health")
	node := required(t, "guest", guest, "node", "woken")
	wantPhases(t, "node", node, "reset", "power_on", "health")
	for name, r := range map[string]*activator.WakeRecord{"guest": guest, "node": node} {
		if r.Result != activator.ResultOK || r.Outcome != activator.OutcomeSucceeded || r.Trigger != "required" {
			t.Errorf("%s's nested record: result %q outcome %q trigger %q, want ok, succeeded, required", name, r.Result, r.Outcome, r.Trigger)
		}
	}
	// Each dependent started its own tenant only once its requirement had passed its gate.
	before(t, "node's wake", endOf(node.Started, node.Duration), "guest's qemu_start", phaseAt(guest, "qemu_start"))
	before(t, "guest's wake", endOf(guest.Started, guest.Duration), "app's spawn", phaseAt(rec, "spawn"))

	// `activator explain` prints the chain as a tree: the route, its requirement, the requirement's.
	code, out := runMain(t, "explain", "app", "--admin", s.admin)
	t.Logf("activator explain app:\n%s", out)
	wantTree(t, code, out,
		"  wake  trigger request  result ok",
		"\n  outcome succeeded",
		"\n  requires guest: woken, result ok",
		"\n    outcome succeeded",
		"\n    requires node: woken, result ok",
		"\n      +", "reset", "\n      +", "power_on", "\n      +", "health",
		"\n    +", "requires", "\n    +", "qemu_start", "\n    +", "running", "\n    +", "health",
		"\n  +", "requires", "\n  +", "spawn", "\n  +", "health")

	// Sleep runs in reverse: each sleep starts after its dependent's sleep has ended.
	s.waitStatus("node", "asleep after its idle window", func(st activator.Status) bool {
		return st.State == "asleep" && st.LastSleep == activator.ReasonIdle
	})
	app1, guest1, node1 := lastSleep(t, s, "app"), lastSleep(t, s, "guest"), lastSleep(t, s, "node")
	before(t, "app's sleep", endOf(app1.Started, app1.Duration), "guest's sleep", guest1.Started)
	before(t, "guest's sleep", endOf(guest1.Started, guest1.Duration), "node's sleep", node1.Started)
	for _, name := range []string{"app", "guest", "node"} {
		if st := s.status(name); st.State != "asleep" || len(st.RequiredBy) != 0 {
			t.Errorf("%s: state %q required_by %v at the end, want asleep and held by nobody", name, st.State, st.RequiredBy)
		}
	}
	if ps := bmc.sim.PowerState("node-1"); ps != redfishtest.Off {
		t.Errorf("node-1 PowerState %q after the node slept, want Off", ps)
	}
	if pid := qemuPID(runDir); pid != 0 {
		t.Errorf("QEMU (pid %d) still runs after the guest slept (sleep: poweroff)", pid)
	}
	stopServed(t, s)
}

// TestChainMiddleFails: the guest in the middle of the chain cannot start (its disk image is gone since
// the config was loaded: a terminal fault). The held request gets 503 with Retry-After; the route's
// record is failed and names the guest, its phase and class as the culprit; the app never starts; the
// node, woken for this wake alone, is put back to sleep after its idle window; the activator then
// shuts down cleanly.
func TestChainMiddleFails(t *testing.T) {
	g := needTestGuest(t)
	bmc := newChainBMC(t)
	runDir := qemuRunDir(t)
	disk := filepath.Join(runDir, "disk.img")
	if err := os.WriteFile(disk, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServed(t, "instances:\n"+bmc.nodeYAML()+guestYAML(t, g, runDir, disk)+"routes:\n"+chainApp(t))
	if err := os.Remove(disk); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*patience)
	defer cancel()
	a := getFresh(ctx, s.edge, "app.test", "/")
	if a.err != nil || a.code != http.StatusServiceUnavailable {
		t.Fatalf("GET app.test: %d %q %v, want 503", a.code, a.body, a.err)
	}
	if ra, err := strconv.Atoi(a.retryAfter); err != nil || ra < 1 {
		t.Errorf("Retry-After %q, want a positive number of seconds", a.retryAfter)
	}

	rec := s.status("app").LastWake
	if rec == nil {
		t.Fatal("no wake record for app")
	}
	logRecord(t, "app", rec)
	want := activator.Culprit{Instance: "guest", Phase: "qemu_start", Class: "terminal"}
	if rec.Outcome != activator.OutcomeFailed || rec.Class != "terminal" || rec.FailedPhase != "requires" || rec.Culprit == nil || *rec.Culprit != want {
		t.Errorf("app: outcome %q class %q failed_phase %q culprit %+v, want failed, terminal, in requires, culprit %+v",
			rec.Outcome, rec.Class, rec.FailedPhase, rec.Culprit, want)
	}
	guest := required(t, "app", rec, "guest", "failed")
	if guest.Outcome != activator.OutcomeFailed || guest.FailedPhase != "qemu_start" || guest.Culprit == nil || *guest.Culprit != want ||
		!strings.Contains(guest.Error, "disk") {
		t.Errorf("guest: outcome %q failed_phase %q culprit %+v error %q, want failed in qemu_start, culprit %+v, naming the disk",
			guest.Outcome, guest.FailedPhase, guest.Culprit, guest.Error, want)
	}
	required(t, "guest", guest, "node", "woken")
	if n := len(s.logs.spawns("app")); n != 0 {
		t.Errorf("app spawned %d times, want never (its requirement failed)", n)
	}
	if st := s.status("guest"); st.State != "failed" {
		t.Errorf("guest: state %q, want failed", st.State)
	}

	// The node was woken for this wake alone: it sleeps after its idle window, and nothing holds it.
	s.waitStatus("node", "asleep after its idle window", func(st activator.Status) bool {
		return st.State == "asleep" && st.LastSleep == activator.ReasonIdle
	})
	if sl := lastSleep(t, s, "node"); sl.Result != activator.ResultOK {
		t.Errorf("node's sleep: result %q (%s), want ok", sl.Result, sl.Error)
	}
	if ps := bmc.sim.PowerState("node-1"); ps != redfishtest.Off {
		t.Errorf("node-1 PowerState %q after the node slept, want Off", ps)
	}
	if pid := qemuPID(runDir); pid != 0 {
		t.Errorf("a QEMU (pid %d) runs for a guest that could not start", pid)
	}
	code, out := runMain(t, "explain", "app", "--admin", s.admin)
	t.Logf("activator explain app:\n%s", out)
	wantTree(t, code, out,
		"  wake  trigger request  result failed in requires",
		"\n  outcome failed  culprit guest in phase qemu_start (terminal)",
		"\n  requires guest: failed, result failed in qemu_start",
		"\n    outcome failed  culprit guest in phase qemu_start (terminal)",
		"\n    requires node: woken, result ok",
		"\n    +", "qemu_start",
		"\n  +", "requires")
	stopServed(t, s)
}

// TestSharedRequirementStartsOnce: routes a and b both require the exec instance db. Fifty requests
// spread over both arrive while everything sleeps; db's start is held (DEMOAPP_HOLD_FILE) until both
// routes' wakes wait on it. db's process starts exactly once, both routes' records name that one wake
// of db, and every request is answered by its own route's app.
func TestSharedRequirementStartsOnce(t *testing.T) {
	const n = 50
	hold := filepath.Join(t.TempDir(), "hold")
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	db := fmt.Sprintf(`  - name: db
    backing: exec
    upstream: %q
    idle: 10m
    wake_budget: 2m
    health: {path: /healthz, interval: 20ms}
    exec: %s
`, freeLoopbackAddr(t), demoExec(t, map[string]string{"DEMOAPP_HOLD_FILE": hold}))
	routes := chainRoute(t, "a", "db", map[string]string{"DEMOAPP_BODY": "from a"}) + chainRoute(t, "b", "db", map[string]string{"DEMOAPP_BODY": "from b"})
	s := startServed(t, "instances:\n"+db+"routes:\n"+routes)

	ctx, cancel := context.WithTimeout(context.Background(), 3*patience)
	defer cancel()
	answers := make([]clientAnswer, n)
	var wg sync.WaitGroup
	for i := range n {
		host := []string{"a.test", "b.test"}[i%2]
		wg.Go(func() { answers[i] = getFresh(ctx, s.edge, host, "/") })
	}
	// Both routes wait on db's one wake before it may finish.
	s.waitStatus("db", "waking for both routes", func(st activator.Status) bool {
		return st.State == "waking" && s.status("a").Held+s.status("b").Held == n
	})
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, a := range answers {
		if want := "from " + []string{"a", "b"}[i%2] + "\n"; a.err != nil || a.code != http.StatusOK || a.body != want {
			t.Errorf("request %d: %d %q %v, want 200 %q", i, a.code, a.body, a.err, want)
		}
	}

	if spawns := s.logs.spawns("db"); len(spawns) != 1 {
		t.Errorf("db spawned %v, want exactly once", spawns)
	}
	var dbWakes []*activator.WakeRecord
	for _, ev := range s.events("db") {
		if ev.Wake != nil {
			dbWakes = append(dbWakes, ev.Wake)
		}
	}
	if len(dbWakes) != 1 {
		t.Fatalf("db's history has %d wakes, want 1", len(dbWakes))
	}
	for _, r := range []string{"a", "b"} {
		st := s.status(r)
		if st.LastWake == nil {
			t.Errorf("%s: no wake record", r)
			continue
		}
		if got := required(t, r, st.LastWake, "db", "woken"); got.ID != dbWakes[0].ID {
			t.Errorf("%s: requires db's wake %s, want db's one wake %s", r, got.ID, dbWakes[0].ID)
		}
		if spawns := s.logs.spawns(r); len(spawns) != 1 {
			t.Errorf("%s spawned %v, want once", r, spawns)
		}
	}
	if st := s.status("db"); !slices.Equal(st.RequiredBy, []string{"a", "b"}) {
		t.Errorf("db: required_by %v, want [a b]", st.RequiredBy)
	}
	t.Logf("db's one wake %s: joined by %d of the two routes' wakes", dbWakes[0].ID, dbWakes[0].Joined)
}

// TestRequiredWakeRecordsHaveOutcome: a requirement's own wake record, nested in its dependent's
// (requires[].wake), is a finished record like any other and has its one outcome: succeeded for a
// requirement that woke, failed with its class and culprit for one that did not, as its own history
// says.
func TestRequiredWakeRecordsHaveOutcome(t *testing.T) {
	inst := func(name string, env map[string]string) string {
		return fmt.Sprintf(`  - name: %s
    backing: exec
    upstream: %q
    idle: 10m
    health: {path: /healthz, interval: 20ms}
    backoff: {initial: 1m, max: 1m}
    exec: %s
`, name, freeLoopbackAddr(t), demoExec(t, env))
	}
	s := startServed(t, "instances:\n"+inst("dep", nil)+inst("broken", map[string]string{"DEMOAPP_EXIT_CODE": "3"})+
		"routes:\n"+chainRoute(t, "ok", "dep", nil)+chainRoute(t, "bad", "broken", nil))
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	for host, code := range map[string]int{"ok.test": http.StatusOK, "bad.test": http.StatusServiceUnavailable} {
		if a := getFresh(ctx, s.edge, host, "/"); a.err != nil || a.code != code {
			t.Fatalf("GET %s: %d %q %v, want %d", host, a.code, a.body, a.err, code)
		}
	}
	for _, c := range []struct{ route, req, state string }{{"ok", "dep", "woken"}, {"bad", "broken", "failed"}} {
		nested := required(t, c.route, s.status(c.route).LastWake, c.req, c.state)
		own := s.status(c.req).LastWake
		if own == nil || own.ID != nested.ID {
			t.Fatalf("%s: nested wake %s is not %s's last wake %+v", c.route, nested.ID, c.req, own)
		}
		if own.Outcome == "" {
			t.Fatalf("%s's own record has no outcome: %+v", c.req, own)
		}
		if nested.Outcome != own.Outcome || nested.Class != own.Class || !reflect.DeepEqual(nested.Culprit, own.Culprit) {
			t.Errorf("%s's record nested in %s's: outcome %q class %q culprit %+v; its own record says %q, %q, %+v",
				c.req, c.route, nested.Outcome, nested.Class, nested.Culprit, own.Outcome, own.Class, own.Culprit)
		}
	}
}

// --- helpers shared with fleet_test.go ---

// testGuest is the QEMU test guest that scripts/build-test-guest.sh builds.
type testGuest struct{ kernel, initrd, append string }

// needTestGuest finds QEMU and the test guest ($ACTIVATOR_GUEST_DIR, else .guest/ at the repository
// root), or reports them missing (testenv.Missing).
func needTestGuest(t *testing.T) testGuest {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		testenv.Missing(t, "qemu-system-x86_64 not installed (apt-get install -y qemu-system-x86)")
	}
	dir := os.Getenv("ACTIVATOR_GUEST_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", ".guest")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	g := testGuest{kernel: filepath.Join(dir, "vmlinux"), initrd: filepath.Join(dir, "initrd.img")}
	for _, f := range []string{g.kernel, g.initrd} {
		if _, err := os.Stat(f); err != nil {
			testenv.Missing(t, "test guest missing (%v): run scripts/build-test-guest.sh", err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "append"))
	if err != nil {
		testenv.Missing(t, "test guest missing (%v): run scripts/build-test-guest.sh", err)
	}
	g.append = strings.TrimSpace(string(b))
	return g
}

// qemuRunDir is a private directory for a guest's runtime and snapshot dirs, short enough for the QMP
// socket's path. At cleanup a QEMU still running from it is killed (QEMU daemonizes out of the
// activator's process group, so a killed activator leaves it behind) and the directory is removed.
func qemuRunDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "chain")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if pid := qemuPID(dir); pid != 0 {
			t.Errorf("killing QEMU pid %d, left running", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
			waitGone(t, pid)
		}
		os.RemoveAll(dir)
	})
	return dir
}

// qemuPID is the pid of the QEMU running from dir (its pid file names a live process whose command
// line names dir), or 0.
func qemuPID(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "run", "qemu.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0
	}
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmd, []byte(dir)) {
		return 0
	}
	return pid
}

// guestYAML is instance guest: the test guest under TCG, powered off when it sleeps after 1s idle,
// requiring node. disk, when set, is attached as its disk image.
func guestYAML(t *testing.T, g testGuest, dir, disk string) string {
	extra := ""
	if disk != "" {
		extra = fmt.Sprintf(", disk: %q", disk)
	}
	return fmt.Sprintf(`  - name: guest
    backing: kvm
    requires: [node]
    upstream: "127.0.0.1:%d"
    idle: 1s
    wake_budget: 2m
    sleep_budget: 1m
    health: {path: /, interval: 20ms, timeout: 250ms}
    kvm: {kernel: %q, initrd: %q, append: %q, accel: tcg, memory: 128, sleep: poweroff, runtime_dir: %q, snapshot_dir: %q%s}
`, testenv.FreePort(t), g.kernel, g.initrd, g.append, filepath.Join(dir, "run"), filepath.Join(dir, "snap"), extra)
}

// chainBMC is the Redfish simulator with one node, node-1, whose service answers while it is On.
type chainBMC struct{ sim *redfishtest.Server }

func newChainBMC(t *testing.T) chainBMC {
	t.Helper()
	sim, err := redfishtest.New(redfishtest.Options{Systems: []redfishtest.System{{
		ID: "node-1", ServiceAddr: "127.0.0.1:0", TransitionDelay: 100 * time.Millisecond,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Close)
	return chainBMC{sim: sim}
}

// nodeYAML is instance node: node-1, powered off gracefully when it sleeps after 1s idle.
func (b chainBMC) nodeYAML() string {
	return fmt.Sprintf(`  - name: node
    backing: redfish
    upstream: %q
    idle: 1s
    wake_budget: 1m
    sleep_budget: 30s
    health: {path: /, interval: 20ms}
    redfish: {endpoint: %q, system: node-1, poll_interval: 20ms, sleep: graceful}
`, b.sim.ServiceAddr("node-1"), b.sim.URL)
}

// chainApp is route app (host app.test), the demo app, requiring guest, sleeping after 1s idle.
func chainApp(t *testing.T) string {
	return fmt.Sprintf(`  - name: app
    hosts: [app.test]
    backing: exec
    requires: [guest]
    upstream: %q
    idle: 1s
    wake_budget: 3m
    health: {path: /healthz, interval: 20ms}
    exec: %s
`, freeLoopbackAddr(t), demoExec(t, nil))
}

// chainRoute is route name (host name.test), the demo app with env, requiring req.
func chainRoute(t *testing.T, name, req string, env map[string]string) string {
	return fmt.Sprintf(`  - name: %s
    hosts: [%s.test]
    backing: exec
    requires: [%s]
    upstream: %q
    idle: 10m
    wake_budget: 2m
    health: {path: /healthz, interval: 20ms}
    exec: %s
`, name, name, req, freeLoopbackAddr(t), demoExec(t, env))
}

// demoExec is an exec block (YAML flow style) that runs this test binary as the demo app with env.
func demoExec(t testing.TB, env map[string]string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("{argv: [%q], stop_grace: 5s, env: %s}", self, demoEnv(env))
}

// demoEnv is env (YAML flow style) with what makes this binary the demo app, and quick to exit under
// the race detector.
func demoEnv(env map[string]string) string {
	all := map[string]string{demoapp.ChildEnv: "1", "GORACE": "atexit_sleep_ms=0"}
	maps.Copy(all, env)
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(all)) {
		parts = append(parts, fmt.Sprintf("%s: %q", k, all[k]))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// events reads the history of a route or instance from the admin API, oldest first.
func (s *served) events(name string) []activator.Event {
	s.t.Helper()
	resp, err := http.Get("http://" + s.admin + "/routes/" + name + "/wakes")
	if err != nil {
		s.t.Fatalf("admin history: %v", err)
	}
	defer resp.Body.Close()
	var evs []activator.Event
	if err := json.NewDecoder(resp.Body).Decode(&evs); err != nil {
		s.t.Fatalf("admin history of %s: %v", name, err)
	}
	return evs
}

// lastSleep is the newest sleep in name's history.
func lastSleep(t *testing.T, s *served, name string) *activator.SleepRecord {
	t.Helper()
	evs := s.events(name)
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Sleep != nil {
			return evs[i].Sleep
		}
	}
	t.Fatalf("%s: no sleep in its history (%d events)", name, len(evs))
	return nil
}

// required returns the record of requirement name in rec, which must be in state ("woken" or
// "failed") with its own record.
func required(t *testing.T, who string, rec *activator.WakeRecord, name, state string) *activator.WakeRecord {
	t.Helper()
	for _, q := range rec.Requires {
		if q.Instance != name {
			continue
		}
		if q.State != state || q.Wake == nil {
			t.Fatalf("%s: requirement %s is %q (record %v), want %q with its wake record", who, name, q.State, q.Wake != nil, state)
		}
		return q.Wake
	}
	t.Fatalf("%s: no requirement %s in %+v", who, name, rec.Requires)
	return nil
}

// wantPhases checks that rec's phases are names, in order, each with a duration.
func wantPhases(t *testing.T, who string, rec *activator.WakeRecord, names ...string) {
	t.Helper()
	var got []string
	for _, p := range rec.Phases {
		got = append(got, p.Name)
		if p.Duration <= 0 {
			t.Errorf("%s: phase %s has no duration", who, p.Name)
		}
	}
	if !slices.Equal(got, names) {
		t.Errorf("%s: phases %v, want %v", who, got, names)
	}
}

// phaseAt is when rec's phase name began (wall clock), or the zero time.
func phaseAt(rec *activator.WakeRecord, name string) time.Time {
	for _, p := range rec.Phases {
		if p.Name == name {
			return rec.Started.Add(p.Start)
		}
	}
	return time.Time{}
}

// endOf is when an event that began at start and took d ended.
func endOf(start time.Time, d time.Duration) time.Time { return start.Add(d) }

// before checks that event a (at ta) came no later than event b (at tb): both are read from the
// activator's records, taken on one clock in one process.
func before(t *testing.T, a string, ta time.Time, b string, tb time.Time) {
	t.Helper()
	if ta.IsZero() || tb.IsZero() || ta.After(tb) {
		t.Errorf("%s (%s) is not before %s (%s)", a, ta.Format(time.StampMicro), b, tb.Format(time.StampMicro))
	}
}

// wantTree checks that `activator explain` succeeded and printed each of pieces, in this order; a
// piece that starts with "\n" must start a line.
func wantTree(t *testing.T, code int, out string, pieces ...string) {
	t.Helper()
	if code != 0 {
		t.Fatalf("explain: exit %d:\n%s", code, out)
	}
	rest := out
	for _, p := range pieces {
		i := strings.Index(rest, p)
		if i < 0 {
			t.Errorf("explain: no %q (after the pieces before it) in:\n%s", p, out)
			return
		}
		rest = rest[i+len(p):]
	}
}

// logRecord logs rec as the admin API serves it, for reading a failed run (and docs/wake-records.md).
func logRecord(t *testing.T, name string, rec *activator.WakeRecord) {
	t.Helper()
	b, _ := json.MarshalIndent(rec, "", "  ")
	t.Logf("%s's wake record:\n%s", name, b)
}

// stopServed sends SIGTERM and waits for the activator to exit with 0 (s.wait fails the test
// otherwise): nothing may hang a shutdown.
func stopServed(t *testing.T, s *served) {
	t.Helper()
	s.sigterm()
	s.wait()
}

// TestCheckNamesSnapshotMode: `activator check` says which snapshot mode a kvm route gets on this
// host, and why (tenant.Noter).
func TestCheckNamesSnapshotMode(t *testing.T) {
	g := needTestGuest(t)
	dir := t.TempDir()
	guest := strings.Replace(guestYAML(t, g, dir, ""), "sleep: poweroff", "sleep: snapshot", 1)
	guest = strings.Replace(guest, "    requires: [node]\n", "", 1)
	cfg := fmt.Sprintf("listen: 127.0.0.1:%d\nadmin: 127.0.0.1:%d\nroutes:\n  - name: app\n    hosts: [app.localhost]\n    backing: exec\n    upstream: 127.0.0.1:%d\n    requires: [guest]\n    exec: {argv: [/bin/true]}\ninstances:\n%s",
		testenv.FreePort(t), testenv.FreePort(t), testenv.FreePort(t), guest)
	path := filepath.Join(dir, "activator.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := runMain(t, "check", "--config", path)
	if code != 0 || !strings.Contains(out, `note: instance "guest": snapshot RAM: file (`) {
		t.Fatalf("check exited %d:\n%s", code, out)
	}
}
