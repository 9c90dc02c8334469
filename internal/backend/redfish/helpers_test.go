package redfish

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/backend/redfish/redfishtest"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/testenv"
)

const (
	testUser     = "activator"
	testPassword = "Sup3r-s3cret-BMC-pw"
	budget       = time.Minute // generous upper bound for every wake and sleep in tests
)

// env is one simulated BMC and a backend pointed at it.
type env struct {
	sim   *redfishtest.Server
	b     *Backend
	s     *Settings
	logs  *testenv.SyncBuffer
	addr  string // the node service's address
	route *registry.Route
	// sleepNotes are what the last sleep noted (tenant.NoteSleep), and sleepForced whether it marked
	// the sleep forced (tenant.NoteForcedSleep).
	sleepNotes  []string
	sleepForced bool
}

type envConfig struct {
	tls        bool
	sim        redfishtest.Options // Systems default to one node-1 with a node service
	password   string              // the password the backend presents (default testPassword)
	yaml       string              // extra YAML lines for the redfish block
	noService  bool
	untrusted  bool // with tls: leave tls.ca_file out, so the simulator's self-signed certificate is not trusted
	httpsPlain bool // without tls: an https:// endpoint for the simulator's plain HTTP
	// now, when set, is the clock of the BMC's record of rejected credentials (see testClock).
	now func() time.Time
}

func newEnv(t testing.TB, c envConfig) *env {
	t.Helper()
	e := &env{logs: &testenv.SyncBuffer{}}
	o := c.sim
	o.TLS = c.tls
	if o.Username == "" {
		o.Username, o.Password = testUser, testPassword
	}
	if len(o.Systems) == 0 {
		o.Systems = []redfishtest.System{{ID: "node-1", TransitionDelay: 20 * time.Millisecond}}
	}
	if !c.noService && o.Systems[0].ServiceAddr == "" {
		o.Systems[0].ServiceAddr = "127.0.0.1:0"
	}
	sim, err := redfishtest.New(o)
	if err != nil {
		t.Fatal(err)
	}
	e.addr = sim.ServiceAddr(o.Systems[0].ID)
	t.Cleanup(sim.Close)
	e.sim = sim

	dir := t.TempDir()
	pw := c.password
	if pw == "" {
		pw = testPassword
	}
	pwFile := filepath.Join(dir, "bmc-password")
	if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var y strings.Builder
	endpoint := sim.URL
	if c.httpsPlain {
		endpoint = strings.Replace(endpoint, "http://", "https://", 1)
	}
	fmt.Fprintf(&y, "endpoint: %s\nusername: %s\npassword_file: %s\n", endpoint, testUser, pwFile)
	fmt.Fprintf(&y, "poll_interval: 10ms\nwatch_interval: 20ms\n")
	if !strings.Contains(c.yaml, "timeout:") {
		y.WriteString("timeout: 5s\n")
	}
	if c.tls && !c.untrusted {
		ca := filepath.Join(dir, "bmc-ca.pem")
		if err := os.WriteFile(ca, sim.CertificatePEM(), 0o600); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&y, "tls:\n  ca_file: %s\n", ca)
	}
	y.WriteString(c.yaml)
	e.route = testRoute()
	e.s = decode(t, e.route, y.String())
	e.route.Settings = e.s
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p := NewProvider(Options{Logger: log})
	p.endpoints.now = c.now
	be, err := p.Open(e.route)
	if err != nil {
		t.Fatal(err)
	}
	e.b = be.(*Backend)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		_ = e.b.Close(ctx)
	})
	return e
}

func testRoute() *registry.Route {
	return &registry.Route{Name: "metal", Backing: "redfish", WakeBudget: 2 * time.Minute, SleepBudget: time.Minute}
}

func decode(t testing.TB, r *registry.Route, src string) *Settings {
	t.Helper()
	s, err := Decode(r, yamlNode(t, src))
	if err != nil {
		t.Fatalf("Decode:\n%s\n%v", src, err)
	}
	return s.(*Settings)
}

func yamlNode(t testing.TB, src string) *yaml.Node {
	t.Helper()
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(src), &n); err != nil {
		t.Fatal(err)
	}
	if n.Kind == yaml.DocumentNode {
		return n.Content[0]
	}
	return &n
}

func (e *env) wake(t testing.TB) (*tenant.Life, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	return e.b.Wake(ctx, tenant.Discard)
}

func (e *env) sleep(t testing.TB) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	ctx, notes := tenant.WithSleepNotes(ctx)
	err := e.b.Sleep(ctx)
	e.sleepNotes, e.sleepForced = notes.List(), notes.Forced()
	return err
}

// mustWake wakes and fails the test on error.
func (e *env) mustWake(t testing.TB) *tenant.Life {
	t.Helper()
	l, err := e.wake(t)
	if err != nil {
		t.Fatalf("Wake: %v", err)
	}
	return l
}

// count counts the requests matching method and path suffix.
func count(reqs []redfishtest.Request, method, suffix string) int {
	n := 0
	for _, r := range reqs {
		if r.Method == method && strings.HasSuffix(r.Path, suffix) {
			n++
		}
	}
	return n
}

// recTracker records phases and notes.
type recTracker struct {
	phases []string
	notes  []string
}

func (r *recTracker) Phase(p string) { r.phases = append(r.phases, p) }
func (r *recTracker) Note(n string)  { r.notes = append(r.notes, n) }
