package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
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
