package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/activator/activator/internal/registry"
)

// TestReloadReportsAddressChanges: a reload cannot move the listeners, so one that changes listen or
// admin says so with a warning naming both addresses, and applies the rest; a reload that changes
// neither, or changes one back, warns of nothing.
func TestReloadReportsAddressChanges(t *testing.T) {
	app := appRoute{Name: "addr"}
	routes := configYAML(t, app)
	top := func(listen, admin string) string { return fmt.Sprintf("listen: %q\nadmin: %q\n", listen, admin) }
	started := top("127.0.0.1:18080", "127.0.0.1:19090") + routes
	h := newHarness(t, started)
	running := loadConfig(t, h.bk, started)
	path := filepath.Join(t.TempDir(), "activator.yaml")
	reload := newReload(t.Context(), h.log, serveOptions{configPath: path}, h.bk, h.srv, running)
	const (
		listenMoved = "listen address changed from 127.0.0.1:18080 to 0.0.0.0:18081; restart the activator to apply it"
		adminMoved  = "admin address changed from 127.0.0.1:19090 to unix:/run/activator/admin.sock; restart the activator to apply it"
	)
	steps := []struct {
		name   string
		config string
		want   []string // the warnings this reload adds
	}{
		{"both moved", top("0.0.0.0:18081", "unix:/run/activator/admin.sock") + routes, []string{listenMoved, adminMoved}},
		{"only listen moved", top("0.0.0.0:18081", "127.0.0.1:19090") + routes, []string{listenMoved}},
		{"both back", started, nil},
		{"routes changed only", started + appRoute{Name: "more"}.yaml(t), nil},
	}
	for i, st := range steps {
		if err := os.WriteFile(path, []byte(st.config), 0o600); err != nil {
			t.Fatal(err)
		}
		before := map[string]int{}
		for _, msg := range []string{listenMoved, adminMoved} {
			before[msg] = len(h.rec.matching(msg, "", ""))
		}
		reload("SIGHUP")
		if n := len(h.rec.matching("config reloaded", "", "")); n != i+1 {
			t.Fatalf("%s: %d reloads applied, want %d (a moved address must not stop the rest)", st.name, n, i+1)
		}
		var msgs []string
		for _, msg := range []string{listenMoved, adminMoved} {
			recs := h.rec.matching(msg, "", "")
			for _, r := range recs[before[msg]:] {
				msgs = append(msgs, r.msg)
				if r.level != slog.LevelWarn {
					t.Errorf("%s: %q logged at %v, want WARN", st.name, r.msg, r.level)
				}
			}
		}
		if fmt.Sprint(msgs) != fmt.Sprint(st.want) {
			t.Errorf("%s: warnings %q, want %q", st.name, msgs, st.want)
		}
	}
}

// loadConfig is config loaded with bk's decoders, as serve loads it: the config a reloader starts with.
func loadConfig(t testing.TB, bk *backings, config string) *registry.Config {
	t.Helper()
	cfg, err := registry.Load([]byte(config), bk.decoders)
	if err != nil {
		t.Fatalf("config rejected: %v\n%s", err, config)
	}
	return cfg
}

// TestReloadReportsStartOnlyKeys: the keys read only at start-up besides the addresses (cgroup_root,
// the edge server's own limits, and with a TLS listener its handshake limits and tls.acme) are
// warned about by name, with both values, when a reload changes them; the reload applies the rest.
// A TLS limit is not compared once listen_tls itself is gone: that warning says it all.
func TestReloadReportsStartOnlyKeys(t *testing.T) {
	routes := configYAML(t, appRoute{Name: "keys"})
	tlsAt := "listen_tls: 127.0.0.1:18443\ntls:\n  certificates:\n    - {cert_file: /etc/keys.crt, key_file: /etc/keys.key}\n"
	top := func(edge, more string) string {
		return "listen: 127.0.0.1:18080\nadmin: 127.0.0.1:19090\n" + more + "edge:\n" + edge + routes
	}
	const edge0 = "  header_timeout: 5s\n  keepalive_timeout: 30s\n  max_header_bytes: 16KiB\n  tls_handshake_timeout: 3s\n"
	started := top(edge0, "cgroup_root: off\n"+tlsAt)
	h := newHarness(t, started)
	path := filepath.Join(t.TempDir(), "activator.yaml")
	reload := newReload(t.Context(), h.log, serveOptions{configPath: path}, h.bk, h.srv, loadConfig(t, h.bk, started))
	const restart = restartSuffix
	steps := []struct {
		name   string
		config string
		want   []string // the warnings this reload adds, in startOnly's order
	}{
		{"edge server limits", top("  header_timeout: 5s\n  keepalive_timeout: 1m\n  max_header_bytes: 64KiB\n  tls_handshake_timeout: 3s\n", "cgroup_root: off\n"+tlsAt), []string{
			"edge.keepalive_timeout changed from 30s to 1m0s" + restart,
			"edge.max_header_bytes changed from 16384 bytes to 65536 bytes" + restart,
		}},
		{"cgroup root, header timeout and the TLS side", top("  header_timeout: 7s\n  keepalive_timeout: 30s\n  max_header_bytes: 16KiB\n  tls_handshake_timeout: 4s\n",
			tlsAt+"  acme: {email: ops@example.com}\n"), []string{
			"cgroup_root changed from off to automatic" + restart,
			"edge.header_timeout changed from 5s to 7s" + restart,
			"edge.tls_handshake_timeout changed from 3s to 4s" + restart,
			`tls.acme changed from off to {email: "ops@example.com", ca: "` + registry.DefaultACMECA + `", storage: "", ca_root: ""}` + restart,
		}},
		{"all back", started, nil},
		{"listen_tls gone, its limit too", top("  header_timeout: 5s\n  keepalive_timeout: 30s\n  max_header_bytes: 16KiB\n  tls_handshake_timeout: 9s\n", "cgroup_root: off\n"), []string{
			"listen_tls address changed from 127.0.0.1:18443 to none" + restart,
		}},
	}
	for i, st := range steps {
		if err := os.WriteFile(path, []byte(st.config), 0o600); err != nil {
			t.Fatal(err)
		}
		from := len(h.rec.snapshot())
		reload("SIGHUP")
		if n := len(h.rec.matching("config reloaded", "", "")); n != i+1 {
			t.Fatalf("%s: %d reloads applied, want %d (a start-only key must not stop the rest)", st.name, n, i+1)
		}
		if got := restartWarnings(t, h.rec, from); !slices.Equal(got, st.want) {
			t.Errorf("%s: warnings\n%q\nwant\n%q", st.name, got, st.want)
		}
	}
}

// TestReloadReportsAdminSocket: with the admin API on a unix socket (here from the -admin flag, so
// the admin key itself is not compared), admin_socket's mode and group are set when the socket is
// bound, and a reload that changes them is warned about; with a TCP admin address they mean nothing
// and are not.
func TestReloadReportsAdminSocket(t *testing.T) {
	routes := configYAML(t, appRoute{Name: "sock"})
	started := "listen: 127.0.0.1:18080\nadmin: 127.0.0.1:19090\n" + routes
	const restart = restartSuffix
	for _, c := range []struct {
		name, admin string
		want        []string
	}{
		{"unix socket", "unix:/run/activator/admin.sock", []string{
			`admin_socket changed from {mode: 0600, group: the activator's} to {mode: 0660, group: "0"}` + restart,
		}},
		{"TCP", "127.0.0.1:19091", nil},
	} {
		h := newHarness(t, started)
		path := filepath.Join(t.TempDir(), "activator.yaml")
		reload := newReload(t.Context(), h.log, serveOptions{configPath: path, admin: c.admin}, h.bk, h.srv, loadConfig(t, h.bk, started))
		if err := os.WriteFile(path, []byte("admin_socket: {mode: \"0660\", group: \"0\"}\n"+started), 0o600); err != nil {
			t.Fatal(err)
		}
		from := len(h.rec.snapshot())
		reload("SIGHUP")
		if n := len(h.rec.matching("config reloaded", "", "")); n != 1 {
			t.Fatalf("%s: %d reloads applied, want 1", c.name, n)
		}
		if got := restartWarnings(t, h.rec, from); !slices.Equal(got, c.want) {
			t.Errorf("%s: warnings\n%q\nwant\n%q", c.name, got, c.want)
		}
	}
}

// restartSuffix ends each start-only key's warning (warnStartOnly).
const restartSuffix = "; restart the activator to apply it"

// restartWarnings are the start-only warnings rec logged from its record from on, each checked to be
// a WARN naming its key.
func restartWarnings(t *testing.T, rec *recorder, from int) []string {
	t.Helper()
	var got []string
	for _, r := range rec.snapshot()[from:] {
		if strings.HasSuffix(r.msg, restartSuffix) {
			got = append(got, r.msg)
			if r.level != slog.LevelWarn || r.attrs["key"] == "" {
				t.Errorf("%q logged at %v with key %q, want WARN naming the key", r.msg, r.level, r.attrs["key"])
			}
		}
	}
	return got
}
