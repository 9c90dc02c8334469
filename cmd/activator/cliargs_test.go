package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// runCLI runs this test binary as `activator args...` with the admin API's variables taken out of its
// environment and env added, and returns the exit code and what it printed.
func runCLI(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ACTIVATOR_ADMIN") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, serveChildEnv+"=1")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, string(out)
}

// TestAdminAddressNeedsAPort: an admin address the CLI cannot dial is a usage error (exit 2) before
// any request, saying what is wrong with it and where it came from (--admin, $ACTIVATOR_ADMIN or the
// config's admin), for every subcommand that talks to the admin API. Found by an operator trial:
// `activator status --admin 127.0.0.1` said the address was "not an address to listen on".
func TestAdminAddressNeedsAPort(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "activator.yaml")
	if err := os.WriteFile(cfg, []byte("admin: 127.0.0.1\nroutes: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const missing = `: missing port (want host:port, e.g. 127.0.0.1:9090)`
	for _, tc := range []struct {
		name string
		env  []string
		args []string // after the subcommand (and its route)
		want string   // the whole first line after "activator VERB: "
	}{
		{"--admin without a port", nil, []string{"--admin", "127.0.0.1"}, `--admin "127.0.0.1"` + missing},
		{"--admin=name without a port", nil, []string{"--admin=localhost"}, `--admin "localhost"` + missing},
		{"--admin with an empty port", nil, []string{"--admin", "127.0.0.1:"}, `--admin "127.0.0.1:"` + missing},
		{"--admin bracketed IPv6 without a port", nil, []string{"--admin", "[::1]"}, `--admin "[::1]"` + missing},
		{"--admin bare IPv6", nil, []string{"--admin", "::1"}, `--admin "::1": missing port (want [host]:port, e.g. [::1]:9090)`},
		{"--admin a URL", nil, []string{"--admin", "http://127.0.0.1:9090"}, `--admin "http://127.0.0.1:9090": a URL; want host:port, e.g. 127.0.0.1:9090, or unix:/path`},
		{"--admin empty", nil, []string{"--admin", ""}, `--admin is empty; leave it out for $ACTIVATOR_ADMIN, the config's admin or 127.0.0.1:9090`},
		{"--admin with a bad port", nil, []string{"--admin", "127.0.0.1:http"}, `--admin "127.0.0.1:http": port "http" is not a number (1-65535)`},
		{"--admin relative socket", nil, []string{"--admin", "unix:admin.sock"}, `--admin "unix:admin.sock": the socket path must be absolute (want host:port, as in 127.0.0.1:9090, or unix:/path)`},
		{"$ACTIVATOR_ADMIN without a port", []string{"ACTIVATOR_ADMIN=127.0.0.1"}, nil, `$ACTIVATOR_ADMIN "127.0.0.1"` + missing},
		{"config's admin without a port", nil, []string{"--config", cfg}, cfg + `: admin "127.0.0.1"` + missing},
	} {
		for _, verb := range [][]string{{"status"}, {"wake", "app"}, {"sleep", "app"}, {"explain", "app"}} {
			t.Run(verb[0]+" "+tc.name, func(t *testing.T) {
				code, out := runCLI(t, tc.env, append(verb, tc.args...)...)
				want := "activator " + verb[0] + ": " + tc.want + "\n"
				if code != 2 || out != want {
					t.Errorf("exit %d, printed %q; want 2 and %q", code, out, want)
				}
			})
		}
	}
}

// TestRouteNameRefused: a route name that no route can have (the config's rule, registry.CheckName)
// is a usage error (exit 2) before any request, quoting the name safely, for every subcommand that
// takes one. Found by an operator trial: `activator explain ../healthz` sent GET
// /routes/..%2Fhealthz/wakes and printed the escaped name back from the admin API's 404. A valid name
// still goes to the admin API.
func TestRouteNameRefused(t *testing.T) {
	var asked atomic.Int64
	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":"no such route: app"}`))
	}))
	t.Cleanup(admin.Close)
	addr := admin.Listener.Addr().String()
	const rule = ` is not a valid route name (lower-case letters, digits, '-' and '_', at most 63)`
	for _, name := range []string{"../healthz", "..", "a/b", "App", "_under", "-dash", "has space", "a%2Fb", "x\x1b[2Jy", "caf\u00e9", "\xff",
		strings.Repeat("a", 64)} {
		arg := []string{name}
		if strings.HasPrefix(name, "-") {
			arg = []string{"--", name} // else a flag, and its own usage error
		}
		for _, args := range [][]string{
			append([]string{"explain"}, arg...), append([]string{"wake"}, arg...), append([]string{"sleep"}, arg...),
			append([]string{"explain", "--last", "1"}, arg...), append([]string{"status"}, arg...),
			append([]string{"status", "app"}, arg...), append([]string{"status", "--state", "awake"}, arg...),
		} {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				before := asked.Load()
				code, out := runCLI(t, nil, append(args, "--admin", addr)...)
				want := "activator " + args[0] + ": " + strconv.Quote(name) + rule + "\n"
				if code != 2 || out != want {
					t.Errorf("exit %d, printed %q; want 2 and %q", code, out, want)
				}
				if n := asked.Load() - before; n != 0 {
					t.Errorf("%d requests to the admin API, want none", n)
				}
			})
		}
	}
	for _, args := range [][]string{{"explain", "app"}, {"status", "app"}, {"sleep", "a-1_b"}} {
		before := asked.Load()
		if code, out := runCLI(t, nil, append(args, "--admin", addr)...); code != 1 || !strings.Contains(out, "no such route: app") || asked.Load() == before {
			t.Errorf("%v: exit %d, printed %q; want the admin API asked and its 404 shown", args, code, out)
		}
	}
}

// TestDemoAddressesNeedAPort: the demo refuses an edge or admin address without a port at once, as a
// usage error, before it sets anything up. Found by session 29's CLI work: `activator demo --admin
// 127.0.0.1` failed only after the tenant's cgroups were set up, saying the address was "not an
// address to listen on".
func TestDemoAddressesNeedAPort(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--admin", "127.0.0.1"}, `activator demo: --admin "127.0.0.1": missing port`},
		{[]string{"--listen", "127.0.0.1"}, `activator demo: --listen "127.0.0.1": want host:port`},
		{[]string{"--listen", "127.0.0.1:"}, `activator demo: --listen "127.0.0.1:": want host:port`},
	} {
		code, out := runCLI(t, nil, append([]string{"demo"}, tc.args...)...)
		if code != 2 || !strings.HasPrefix(out, tc.want) {
			t.Errorf("demo %q: exit %d, %q; want exit 2 and %q", tc.args, code, out, tc.want)
		}
	}
}
