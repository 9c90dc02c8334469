package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/activator/activator/internal/registry"
)

// TestAdminUnixSocket: `serve` binds admin: unix:/path over a stale socket file, with the mode and
// group of admin_socket, and the CLI reaches it with --admin unix:/path and $ACTIVATOR_ADMIN.
func TestAdminUnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "adm") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "admin.sock")
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close() // leaves the file, as a killed activator does

	app := appRoute{Name: "sockapp"}
	cfg := fmt.Sprintf("admin_socket: {mode: \"0660\", group: %q}\n", fmt.Sprint(os.Getgid())) + configYAML(t, app)
	startServedAt(t, freeLoopbackAddr(t), "unix:"+sock, cfg)

	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Errorf("admin socket mode %v, want a socket with 0660", fi.Mode())
	}
	if gid := fi.Sys().(*syscall.Stat_t).Gid; int(gid) != os.Getgid() {
		t.Errorf("admin socket group %d, want %d", gid, os.Getgid())
	}
	if code := cmdAct("wake", []string{app.Name, "--admin", "unix:" + sock}); code != 0 {
		t.Errorf("activator wake --admin unix:%s: exit %d, want 0", sock, code)
	}
	t.Setenv("ACTIVATOR_ADMIN", "unix:"+sock)
	if code := cmdStatus(nil); code != 0 {
		t.Errorf("activator status with ACTIVATOR_ADMIN=unix:%s: exit %d, want 0", sock, code)
	}
	// A POST without the header is refused over the socket too.
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	resp, err := c.Post("http://x/routes/"+app.Name+"/sleep", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("text/plain POST over the socket: %d, want 403", resp.StatusCode)
	}
}

// TestAdminToken: with admin_token_file on TCP every request needs the token; the CLI finds it through
// --token-file, $ACTIVATOR_ADMIN_TOKEN or --config.
func TestAdminToken(t *testing.T) {
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte("t0ken\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	app := appRoute{Name: "tokapp"}
	admin := freeLoopbackAddr(t)
	s := startServedAt(t, freeLoopbackAddr(t), admin, fmt.Sprintf("admin_token_file: %q\n", tokFile)+configYAML(t, app))
	_ = s

	resp, err := http.Get("http://" + admin + "/routes")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
		t.Errorf("GET /routes without the token: %d %q, want 401 with WWW-Authenticate: Bearer", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
	if code := cmdStatus([]string{"--admin", admin}); code != 1 {
		t.Errorf("activator status without a token: exit %d, want 1", code)
	}
	if code := cmdStatus([]string{"--admin", admin, "--token-file", tokFile}); code != 0 {
		t.Errorf("activator status --token-file: exit %d, want 0", code)
	}
	clientCfg := filepath.Join(dir, "client.yaml")
	if err := os.WriteFile(clientCfg, fmt.Appendf(nil, "admin: %q\nadmin_token_file: %q\n", admin, tokFile), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := cmdAct("wake", []string{app.Name, "--config", clientCfg}); code != 0 {
		t.Errorf("activator wake --config: exit %d, want 0", code)
	}
	t.Setenv(registry.AdminTokenEnv, "t0ken")
	if code := cmdAct("sleep", []string{app.Name, "--admin", admin}); code != 0 {
		t.Errorf("activator sleep with $%s: exit %d, want 0", registry.AdminTokenEnv, code)
	}
	t.Setenv(registry.AdminTokenEnv, "wrong")
	if code := cmdStatus([]string{"--admin", admin}); code != 1 {
		t.Errorf("activator status with a wrong token: exit %d, want 1", code)
	}
	// It says the token was refused, not that one is wanted (an operator trial was told the latter).
	if code, out := runMain(t, "status", "--admin", admin); code != 1 || !strings.Contains(out, "refused the bearer token") {
		t.Errorf("activator status with a wrong token: exit %d, output:\n%s\nwant 1 saying the token was refused", code, out)
	}
}

// runMain runs this test binary as `activator args...`, in this process's whole environment (the
// admin API's variables included, which runCLI leaves out), and returns its exit code and output.
func runMain(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var admin []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "ACTIVATOR_ADMIN") {
			admin = append(admin, kv)
		}
	}
	return runCLI(t, admin, args...)
}

// TestAdminConfigProblems: `check` and `serve` agree on the admin settings: what serve cannot bind or
// set is a problem for check, and a listener beyond loopback without a token is warned about.
func TestAdminConfigProblems(t *testing.T) {
	dir := t.TempDir()
	routes := configYAML(t, appRoute{Name: "chk"})
	loose := filepath.Join(dir, "loose-token")
	if err := os.WriteFile(loose, []byte("tok\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty-token")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, top string
		code      int
		want      string
	}{
		{"relative unix path", "admin: unix:run/admin.sock\n", 1, "admin: \"unix:run/admin.sock\": the socket path must be absolute"},
		{"no such group", "admin: unix:/run/a.sock\nadmin_socket: {group: no-such-group-xyz}\n", 1, "admin_socket.group: no group \"no-such-group-xyz\""},
		{"bad mode", "admin_socket: {mode: \"0999\"}\n", 1, "admin_socket.mode: \"0999\" is not an octal mode"},
		{"missing token file", "admin_token_file: /nonexistent/token\n", 1, "admin_token_file: cannot read the token"},
		{"empty token file", fmt.Sprintf("admin_token_file: %q\n", empty), 1, "admin_token_file: " + empty + " is empty"},
		{"wildcard without a token", "admin: 0.0.0.0:19999\n", 0, "warning: the admin API listens on 0.0.0.0:19999, beyond loopback, without a token"},
		{"readable token file", fmt.Sprintf("admin_token_file: %q\n", loose), 0, "is readable by its group or others (mode 0644)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "a.yaml")
			if err := os.WriteFile(path, []byte(tt.top+routes), 0o600); err != nil {
				t.Fatal(err)
			}
			code, out := runMain(t, "check", "--config", path)
			if code != tt.code || !strings.Contains(out, tt.want) {
				t.Errorf("check: exit %d, output:\n%s\nwant exit %d and %q", code, out, tt.code, tt.want)
			}
		})
	}
	// serve reports the missing group by its key too, and exits.
	path := filepath.Join(dir, "group.yaml")
	cfg := fmt.Sprintf("listen: %q\nadmin: unix:%s\nadmin_socket: {group: no-such-group-xyz}\n", freeLoopbackAddr(t), filepath.Join(dir, "a.sock")) + routes
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := runMain(t, "serve", "--config", path); code != 1 || !strings.Contains(out, "admin_socket.group") {
		t.Errorf("serve with a missing group: exit %d, output:\n%s\nwant exit 1 naming admin_socket.group", code, out)
	}
}
