package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

