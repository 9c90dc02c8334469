package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
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
// the admin listener's and the edge server's own limits, and with a TLS listener its handshake limits and tls.acme) are
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
		{"edge send timeout", top(edge0+"  send_timeout: 20s\n", "cgroup_root: off\n"+tlsAt), []string{
			"edge.send_timeout changed from 1m0s to 20s" + restart,
		}},
		{"edge connection cap", top(edge0+"  max_conns: 5000\n", "cgroup_root: off\n"+tlsAt), []string{
			"edge.max_conns changed from the default (from the open-file limit) to 5000" + restart,
		}},
		{"admin listener limits", top(edge0, "cgroup_root: off\nadmin_keepalive_timeout: 30s\nadmin_max_conns: 16\n"+tlsAt), []string{
			"admin_keepalive_timeout changed from 2m0s to 30s" + restart,
			"admin_max_conns changed from 128 to 16" + restart,
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

// TestReloadUnderSocketActivation: a listener systemd passed in stays whatever the config says, and a
// restart keeps it too, so a reload that changes its key (listen, admin, and with systemd's unix
// admin socket admin_socket) says so and points at the socket unit instead of a restart; a key whose
// listener the activator bound itself is still a restart's; with systemd's TCP admin socket,
// admin_socket is not compared at all.
func TestReloadUnderSocketActivation(t *testing.T) {
	routes := configYAML(t, appRoute{Name: "sock"})
	top := func(listen, admin, more string) string {
		return fmt.Sprintf("listen: %q\nadmin: %q\n%s", listen, admin, more) + routes
	}
	started := top("127.0.0.1:18080", "unix:/run/activator/admin.sock", "")
	h := newHarness(t, started)
	path := filepath.Join(t.TempDir(), "activator.yaml")
	o := serveOptions{configPath: path, activated: map[string]string{"edge": "tcp", "admin": "unix"}}
	reload := newReload(t.Context(), h.log, o, h.bk, h.srv, loadConfig(t, h.bk, started))
	if err := os.WriteFile(path, []byte(top("0.0.0.0:18081", "unix:/run/other.sock",
		"listen_tls: 127.0.0.1:18443\ntls:\n  certificates:\n    - {cert_file: /etc/k.crt, key_file: /etc/k.key}\nadmin_socket: {mode: \"0660\"}\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	from := len(h.rec.snapshot())
	reload("SIGHUP")
	if n := len(h.rec.matching("config reloaded", "", "")); n != 1 {
		t.Fatalf("%d reloads applied, want 1", n)
	}
	const systemds = ", but this listener is systemd's (socket activation, FileDescriptorName="
	want := []string{
		"listen address changed from 127.0.0.1:18080 to 0.0.0.0:18081" + systemds + "edge), which a restart keeps; change ListenStream= in its .socket unit to move it",
		"admin address changed from unix:/run/activator/admin.sock to unix:/run/other.sock" + systemds + "admin), which a restart keeps; change ListenStream= in its .socket unit to move it",
		"listen_tls address changed from none to 127.0.0.1:18443" + restartSuffix,
		"admin_socket changed from {mode: 0600, group: the activator's} to {mode: 0660, group: the activator's}" + systemds + "admin), which a restart keeps; set SocketMode= and SocketGroup= in its .socket unit instead",
	}
	var got []string
	for _, r := range h.rec.snapshot()[from:] {
		if r.level != slog.LevelWarn || r.attrs["key"] == "" {
			continue
		}
		got = append(got, r.msg)
		if strings.Contains(r.msg, systemds) && (r.attrs["socket"] == "" || r.attrs["previous"] == "" || r.attrs["in_force"] != "") {
			t.Errorf("%q: attrs %v, want socket and previous (no in_force: the socket's address is)", r.msg, r.attrs)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("warnings\n%q\nwant\n%q", got, want)
	}

	// systemd's admin socket is TCP: admin_socket means nothing, though the config's admin is unix.
	o.activated["admin"] = "tcp"
	reload = newReload(t.Context(), h.log, o, h.bk, h.srv, loadConfig(t, h.bk, started))
	if err := os.WriteFile(path, []byte(top("127.0.0.1:18080", "unix:/run/activator/admin.sock", "admin_socket: {mode: \"0660\"}\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	from = len(h.rec.snapshot())
	reload("SIGHUP")
	for _, r := range h.rec.snapshot()[from:] {
		if r.level == slog.LevelWarn && r.attrs["key"] != "" {
			t.Errorf("with systemd's TCP admin socket: warned %q", r.msg)
		}
	}
}

// TestSocketActivatedEdgeKeepsItsListener: given an edge socket the way systemd passes one
// (LISTEN_FDS, LISTEN_FDNAMES=edge, LISTEN_PID set by a shell that then execs the activator), the
// activator serves on it and does not bind its config's listen; a reload that changes listen warns
// that the listener is systemd's, not that a restart would move it.
func TestSocketActivatedEdgeKeepsItsListener(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", loopbackIP(t)+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	configured := freeLoopbackAddr(t) // what the activator would bind without systemd
	routes := configYAML(t, appRoute{Name: "activated"})
	s := startServedAt(t, configured, freeLoopbackAddr(t), routes, func(cmd *exec.Cmd) {
		// LISTEN_PID must be the activator's own pid: the shell's, which exec keeps.
		cmd.Args = append([]string{"sh", "-c", `LISTEN_PID=$$ exec "$0" "$@"`}, cmd.Args...)
		cmd.Path = "/bin/sh"
		cmd.ExtraFiles = []*os.File{f}
		cmd.Env = append(cmd.Env, "LISTEN_FDS=1", "LISTEN_FDNAMES=edge")
	})
	if l := s.logs.matching("activator listening"); len(l) != 1 || l[0]["socket_activated"] != "edge" || l[0]["edge"] != ln.Addr().String() {
		t.Errorf("start-up record %v, want edge=%s and socket_activated=edge", l, ln.Addr())
	}
	c := &http.Client{Timeout: patience}
	resp, err := c.Get("http://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatalf("the socket passed in: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound { // no route for the host: the edge's own answer
		t.Errorf("the socket passed in answered %d, want the edge's 404 for an unknown host", resp.StatusCode)
	}
	if conn, err := net.Dial("tcp", configured); err == nil {
		conn.Close()
		t.Errorf("the config's listen %s is bound too: systemd's socket must replace it", configured)
	}

	moved := freeLoopbackAddr(t)
	s.edge = moved // rewrite writes s.edge as listen
	s.rewrite(routes, 1)
	want := fmt.Sprintf("listen address changed from %s to %s, but this listener is systemd's (socket activation, FileDescriptorName=edge), which a restart keeps; change ListenStream= in its .socket unit to move it", configured, moved)
	// The warnings follow "config reloaded".
	if w := s.waitLogged(want, 1); len(w) != 1 || w[0]["level"] != "WARN" || w[0]["socket"] != "edge" {
		t.Errorf("after the reload: %v, want one WARN %q with socket=edge", w, want)
	}
	for _, r := range s.logs.matching("listen address changed from " + configured + " to " + moved + restartSuffix) {
		t.Errorf("warned %q: a restart keeps systemd's socket", r["msg"])
	}
}

// TestReloadTriggersFromTheFirstMoment: from "activator listening" (and READY) on, a SIGHUP reloads
// and a change of the file is seen. Both used to be set up by the reloader's goroutine, which could
// start after READY: a `systemctl reload` right after the start then killed the activator (SIGHUP's
// default action), and a config manager's first write was missed. GOMAXPROCS=1 leaves that
// goroutine waiting longest; each of a few starts is triggered at once.
func TestReloadTriggersFromTheFirstMoment(t *testing.T) {
	t.Parallel()
	routes := configYAML(t, appRoute{Name: "first"})
	onePro := func(cmd *exec.Cmd) { cmd.Env = append(cmd.Env, "GOMAXPROCS=1") }
	for i := range 5 {
		s := startServedAt(t, freeLoopbackAddr(t), freeLoopbackAddr(t), routes, onePro)
		if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		select {
		case <-s.exited:
			t.Fatalf("start %d: a SIGHUP right after \"activator listening\" ended the activator: %v", i+1, s.exitErr)
		default:
		}
		if r := s.waitLogged("config reloaded", 1); r[0]["trigger"] != "SIGHUP" {
			t.Fatalf("start %d: first reload %v, want the SIGHUP's", i+1, r[0])
		}
		s = startServedAt(t, freeLoopbackAddr(t), freeLoopbackAddr(t), routes, onePro)
		s.rewrite(routes+appRoute{Name: "second"}.yaml(t), 1) // fails after patience when the write was missed
	}
}
