package registry_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
)

// TestLoadAdminAccess covers the keys beside admin: admin_socket, admin_token_file, admin_metrics_open,
// admin_hosts, and the admin listener's limits (admin_keepalive_timeout, admin_max_conns).
func TestLoadAdminAccess(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	runTopKeys(t, []topKey{
		{"admin_socket", func(c *registry.Config) any { return c.AdminAccess.Socket }, []keyCase{
			{value: "", want: registry.AdminSocket{Mode: 0o600}},
			{value: `{mode: "0660", group: activator}`, want: registry.AdminSocket{Mode: 0o660, Group: "activator"}},
			{value: `{group: "1234"}`, want: registry.AdminSocket{Mode: 0o600, Group: "1234"}},
		}},
		{"admin_token_file", func(c *registry.Config) any { return string(c.AdminAccess.Token) }, []keyCase{
			{value: "", want: ""},
			{value: tok, want: "s3cret"},
			{value: "token", problem: `"token" is not an absolute path`},
			{value: filepath.Join(dir, "missing"), problem: "cannot read the token: open " + filepath.Join(dir, "missing") + ": no such file or directory"},
			{value: empty, problem: empty + " is empty (write a long random token into it, e.g. `openssl rand -hex 32`)"},
		}},
		{"admin_metrics_open", func(c *registry.Config) any { return c.AdminAccess.MetricsOpen }, []keyCase{
			{value: "", want: false},
			{value: "true", want: true},
		}},
		{"admin_keepalive_timeout", func(c *registry.Config) any { return c.AdminAccess.KeepAliveTimeout }, []keyCase{
			{value: "", want: registry.DefaultAdminKeepAliveTimeout},
			{value: "30s", want: 30 * time.Second},
			{value: "0s", problem: "must be positive, got 0s (leave the key out for the default 2m0s)"},
			{value: "-1m", problem: `duration "-1m" is negative`},
		}},
		{"admin_max_conns", func(c *registry.Config) any { return c.AdminAccess.MaxConns }, []keyCase{
			{value: "", want: registry.DefaultAdminMaxConns},
			{value: "16", want: 16},
			{value: "0", problem: "must be positive, got 0 (leave the key out for the default 128)"},
			{value: "-3", problem: "must be positive, got -3 (leave the key out for the default 128)"},
		}},
	})
}

// TestLoadAdminSocketMode: a bad admin_socket.mode is reported under that key.
func TestLoadAdminSocketMode(t *testing.T) {
	for mode, want := range map[string]string{
		"0999":  `line 1: admin_socket.mode: "0999" is not an octal mode (as in "0660")`,
		"01777": `line 1: admin_socket.mode: "01777" has bits beyond 0777`,
		"0066":  `line 1: admin_socket.mode: "0066" does not let the activator's own user connect (want at least 0600)`,
	} {
		data := "admin_socket: {mode: \"" + mode + "\"}\nroutes:\n  - {name: a, host: a.test, backing: fake, upstream: \"127.0.0.1:3000\"}\n"
		_, err := registry.Load([]byte(data), backings)
		var got []string
		for _, e := range registry.Errors(err) {
			got = append(got, e.Error())
		}
		if len(got) == 0 || got[0] != want { // the route's backing, unknown here, is a second problem
			t.Errorf("admin_socket.mode %q: problems %q, want %q first", mode, got, want)
		}
	}
}

// TestParseAdminAddr: what serve binds and check accepts.
func TestParseAdminAddr(t *testing.T) {
	tests := []struct {
		in       string
		want     registry.AdminAddr
		loopback bool
		wantErr  string
	}{
		{in: "127.0.0.1:9090", want: registry.AdminAddr{Network: "tcp", Address: "127.0.0.1:9090"}, loopback: true},
		{in: "[::1]:9090", want: registry.AdminAddr{Network: "tcp", Address: "[::1]:9090"}, loopback: true},
		{in: "localhost:9090", want: registry.AdminAddr{Network: "tcp", Address: "localhost:9090"}, loopback: true},
		{in: "0.0.0.0:9090", want: registry.AdminAddr{Network: "tcp", Address: "0.0.0.0:9090"}},
		{in: ":9090", want: registry.AdminAddr{Network: "tcp", Address: ":9090"}},
		{in: "unix:/run/activator/admin.sock", want: registry.AdminAddr{Network: "unix", Address: "/run/activator/admin.sock"}, loopback: true},
		{in: "unix:run/admin.sock", wantErr: `"unix:run/admin.sock": the socket path must be absolute (want host:port, as in 127.0.0.1:9090, or unix:/path)`},
		{in: "/run/admin.sock", wantErr: `"/run/admin.sock" is not an address to listen on (want host:port, as in 127.0.0.1:9090, or unix:/path)`},
	}
	for _, tt := range tests {
		got, err := registry.ParseAdminAddr(tt.in)
		if tt.wantErr != "" {
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("ParseAdminAddr(%q) = %v, %v; want error %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want || got.Loopback() != tt.loopback {
			t.Errorf("ParseAdminAddr(%q) = %+v (loopback %v), %v; want %+v (loopback %v)", tt.in, got, got.Loopback(), err, tt.want, tt.loopback)
		}
	}
}
