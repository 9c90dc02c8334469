package exec

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/testenv"
)

// childEnv wakes f's child, which writes its environment to dump before it starts (envDumpEnv), and
// returns that environment as a map.
func childEnv(t *testing.T, f *fixture, dump string) map[string]string {
	t.Helper()
	_ = os.Remove(dump)
	f.wake(t)
	b, err := os.ReadFile(dump)
	if err != nil {
		t.Fatalf("the child wrote no environment: %v", err)
	}
	env := map[string]string{}
	for _, kv := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if err := f.b.Sleep(ctx); err != nil {
		t.Fatalf("Sleep: %v", err)
	}
	return env
}

// A secret the activator holds in its environment for another route (a Redfish password_env) or for
// itself (the admin token) never reaches an exec child, unless the route's own env sets it. A secret
// named after the backend was opened (a reload) applies at the next spawn.
func TestSecretEnvScrubbed(t *testing.T) {
	t.Setenv("EXEC_TEST_BMC_PASSWORD", "bmc-secret")
	t.Setenv(registry.AdminTokenEnv, "admin-secret")
	t.Setenv("EXEC_TEST_LATER_SECRET", "later-secret")
	t.Setenv("EXEC_TEST_PLAIN", "plain")
	var names atomic.Pointer[[]string]
	first := []string{"EXEC_TEST_BMC_PASSWORD", registry.AdminTokenEnv}
	names.Store(&first)
	secrets := func() []string { return *names.Load() }

	dump := filepath.Join(t.TempDir(), "env")
	block := "env: {" + envDumpEnv + ": " + dump + "}\n"
	f := newFixtureOpts(t, testenv.FreeTCP(t), block, Options{Logger: testLogger(t), SecretEnv: secrets})

	env := childEnv(t, f, dump)
	for _, k := range first {
		if v, ok := env[k]; ok {
			t.Errorf("child environment has secret %s=%q", k, v)
		}
	}
	if env["EXEC_TEST_PLAIN"] != "plain" {
		t.Errorf("EXEC_TEST_PLAIN = %q, want the activator's own variable inherited", env["EXEC_TEST_PLAIN"])
	}
	if env["EXEC_TEST_LATER_SECRET"] != "later-secret" {
		t.Errorf("EXEC_TEST_LATER_SECRET = %q before it was named a secret, want it inherited", env["EXEC_TEST_LATER_SECRET"])
	}

	// A reload names one more secret: the next child goes without it.
	later := append(append([]string(nil), first...), "EXEC_TEST_LATER_SECRET")
	names.Store(&later)
	if v, ok := childEnv(t, f, dump)["EXEC_TEST_LATER_SECRET"]; ok {
		t.Errorf("after the reload, child environment has secret EXEC_TEST_LATER_SECRET=%q", v)
	}

	// The route's own env sets a secret's name explicitly: the operator's choice, and its value.
	own := newFixtureOpts(t, testenv.FreeTCP(t), "env: {"+envDumpEnv+": "+dump+", EXEC_TEST_BMC_PASSWORD: mine}\n",
		Options{Logger: testLogger(t), SecretEnv: secrets})
	env = childEnv(t, own, dump)
	if env["EXEC_TEST_BMC_PASSWORD"] != "mine" {
		t.Errorf("EXEC_TEST_BMC_PASSWORD = %q, want the route's own value %q", env["EXEC_TEST_BMC_PASSWORD"], "mine")
	}
	if v, ok := env[registry.AdminTokenEnv]; ok {
		t.Errorf("child environment has secret %s=%q", registry.AdminTokenEnv, v)
	}
}
