package redfish

import (
	"encoding/pem"
	"errors"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/registry"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

func TestDecodeDefaults(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("secret-value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		src    string
		golden string
	}{
		{"minimal", "endpoint: https://bmc.example:443/\nusername: ops\npassword_file: PW\n", "defaults.golden.yaml"},
		{"force_off", "endpoint: https://bmc.example\nusername: ops\npassword_file: PW\nforce_off: true\n", "force_off.golden.yaml"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := decode(t, testRoute(), strings.ReplaceAll(c.src, "PW", pw))
			s.PasswordFile = "PW" // keep the golden file independent of the temp dir
			got, err := yaml.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", c.golden)
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if string(got) != string(want) {
				t.Fatalf("decoded settings differ from %s:\ngot:\n%s\nwant:\n%s", path, got, want)
			}
			if strings.Contains(string(got), "secret-value") {
				t.Fatal("the decoded settings hold the password")
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	empty := filepath.Join(dir, "empty")
	badCA := filepath.Join(dir, "ca.pem")
	for _, f := range []struct{ path, body string }{{pw, "pw-content\n"}, {empty, "\n"}, {badCA, "not a pem"}} {
		if err := os.WriteFile(f.path, []byte(f.body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("ACTIVATOR_TEST_EMPTY_PW", "")
	const ok = "endpoint: https://bmc\nusername: u\npassword_file: PW\n"
	cases := []struct {
		name string
		src  string
		keys []string // the keys of every error, in order
		msg  string   // a fragment of the first error
	}{
		{"no endpoint", "username: u\npassword_file: PW\n", []string{"endpoint"}, "missing"},
		{"unknown key", ok + "passwd: x\n", []string{"passwd"}, "unknown key"},
		{"unknown nested key", ok + "tls:\n  verify: false\n", []string{"tls.verify"}, "unknown key"},
		{"bad scheme", "endpoint: ftp://bmc\n", []string{"endpoint"}, "scheme"},
		{"userinfo", "endpoint: https://root:calvin@bmc\n", []string{"endpoint"}, "credentials do not belong"},
		{"password without user", "endpoint: https://bmc\npassword_file: PW\n", []string{"username"}, "without a username"},
		{"user without password", "endpoint: https://bmc\nusername: u\n", []string{"password_file"}, "missing"},
		{"both passwords", ok + "password_env: X\n", []string{"password_file"}, "not both"},
		{"unreadable password file", "endpoint: https://bmc\nusername: u\npassword_file: /nonexistent/pw\n", []string{"password_file"}, "read password file"},
		{"empty password file", "endpoint: https://bmc\nusername: u\npassword_file: " + empty + "\n", []string{"password_file"}, "empty"},
		{"unset env", "endpoint: https://bmc\nusername: u\npassword_env: ACTIVATOR_TEST_EMPTY_PW\n", []string{"password_env"}, "not set"},
		{"ca and insecure", ok + "tls:\n  ca_file: " + badCA + "\n  insecure_skip_verify: true\n", []string{"tls.insecure_skip_verify", "tls.ca_file"}, "choose one"},
		{"tls with http", "endpoint: http://bmc\ntls:\n  insecure_skip_verify: true\n", []string{"tls"}, "plain http"},
		{"bad auth", ok + "auth: digest\n", []string{"auth"}, "digest"},
		{"session without user", "endpoint: https://bmc\nauth: session\n", []string{"auth"}, "needs a username"},
		{"bad reset", ok + "reset_order: [On, ForceRestart, On]\n", []string{"reset_order[1]", "reset_order[2]"}, "not a power-on Reset type"},
		{"bad sleep", ok + "sleep: hibernate\n", []string{"sleep"}, "hibernate"},
		{"bad duration", ok + "timeout: 5\n", []string{"timeout"}, "not a duration"},
		{"power_on over wake budget", ok + "power_on_budget: 5m\n", []string{"power_on_budget"}, "wake_budget"},
		{"grace over sleep budget", ok + "shutdown_grace: 2m\n", []string{"shutdown_grace"}, "sleep_budget"},
		{"no room for force off", ok + "force_off: true\nshutdown_grace: 1m\n", []string{"power_off_budget"}, "no time left"},
		{"phases over sleep budget", ok + "force_off: true\nshutdown_grace: 40s\npower_off_budget: 30s\n", []string{"power_off_budget"}, "exceed"},
		{"poll over budget", ok + "poll_interval: 3m\n", []string{"poll_interval"}, "longer than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := strings.ReplaceAll(c.src, "PW", pw)
			_, err := Decode(testRoute(), yamlNode(t, src))
			if err == nil {
				t.Fatalf("Decode(%q) succeeded", src)
			}
			list := registry.Errors(err)
			var keys []string
			for _, e := range list {
				var re *registry.Error
				if !errors.As(e, &re) {
					t.Fatalf("error %v is not a *registry.Error", e)
				}
				keys = append(keys, re.Key)
			}
			if strings.Join(keys, ",") != strings.Join(c.keys, ",") {
				t.Fatalf("error keys = %q, want %q (%v)", keys, c.keys, err)
			}
			if !strings.Contains(list[0].Error(), c.msg) {
				t.Fatalf("error %q does not mention %q", list[0], c.msg)
			}
			if strings.Contains(err.Error(), "pw-content") {
				t.Fatalf("error %q shows the password", err)
			}
		})
	}
}

func TestDecodeDerivedBudgets(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("x-password"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &registry.Route{Name: "m", WakeBudget: 10 * time.Minute, SleepBudget: 4 * time.Minute}
	s := decode(t, r, "endpoint: https://bmc\nusername: u\npassword_file: "+pw+"\nforce_off: true\n")
	if s.PowerOnBudget.D() != 10*time.Minute || s.ShutdownGrace.D() != 2*time.Minute || s.PowerOffBudget.D() != 2*time.Minute {
		t.Fatalf("budgets = %v/%v/%v, want 10m/2m/2m", s.PowerOnBudget.D(), s.ShutdownGrace.D(), s.PowerOffBudget.D())
	}
	s = decode(t, r, "endpoint: https://bmc\nusername: u\npassword_file: "+pw+"\n")
	if s.ShutdownGrace.D() != 4*time.Minute || s.PowerOffBudget != 0 {
		t.Fatalf("without force_off: grace %v, power_off %v; want 4m and 0", s.ShutdownGrace.D(), s.PowerOffBudget.D())
	}
}

// CheckHost passes while what Decode read on the host still holds, and fails once the password file
// is empty, the password variable unset or the CA file gone; a Reloader then decodes an unchanged
// redfish route again only when it must.
func TestCheckHost(t *testing.T) {
	dir := t.TempDir()
	pw, ca := filepath.Join(dir, "pw"), filepath.Join(dir, "ca.pem")
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	srv.Close()
	for _, f := range []struct{ path, body string }{
		{pw, "secret\n"},
		{ca, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))},
	} {
		if err := os.WriteFile(f.path, []byte(f.body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("ACTIVATOR_TEST_CHECKHOST_PW", "secret")
	byFile := decode(t, testRoute(), "endpoint: https://bmc\nusername: u\npassword_file: "+pw+"\ntls:\n  ca_file: "+ca+"\n")
	byEnv := decode(t, testRoute(), "endpoint: https://bmc\nusername: u\npassword_env: ACTIVATOR_TEST_CHECKHOST_PW\n")
	for _, s := range []*Settings{byFile, byEnv} {
		if err := s.CheckHost(&registry.HostCache{}); err != nil {
			t.Fatalf("unchanged host: %v", err)
		}
	}
	// A reload of two routes (file and variable) after an edit of one decodes that one alone.
	config := func(idle string) string {
		return "listen: 127.0.0.1:8080\nadmin: 127.0.0.1:8081\nroutes:\n" +
			"  - name: a\n    hosts: [a.test]\n    backing: redfish\n    upstream: 10.0.0.1:80\n    idle: " + idle + "\n" +
			"    redfish: {endpoint: \"https://bmc-a\", username: u, password_file: \"" + pw + "\", tls: {ca_file: \"" + ca + "\"}}\n" +
			"  - name: b\n    hosts: [b.test]\n    backing: redfish\n    upstream: 10.0.0.2:80\n" +
			"    redfish: {endpoint: \"https://bmc-b\", username: u, password_env: ACTIVATOR_TEST_CHECKHOST_PW}\n"
	}
	rl := registry.NewReloader(map[string]registry.SettingsDecoder{"redfish": Decode})
	for i, c := range []struct {
		idle    string
		decoded int
	}{{"5m", 2}, {"6m", 1}} {
		if _, err := rl.Load([]byte(config(c.idle))); err != nil {
			t.Fatalf("load %d: %v", i+1, err)
		}
		if d := rl.Decoded(); d != c.decoded {
			t.Errorf("load %d decoded %d routes, want %d", i+1, d, c.decoded)
		}
	}

	if err := os.WriteFile(pw, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := byFile.CheckHost(&registry.HostCache{}); err == nil {
		t.Error("password file emptied: CheckHost passed")
	}
	if _, err := rl.Load([]byte(config("7m"))); err == nil || !strings.Contains(err.Error(), "password_file") {
		t.Errorf("reload with the password file emptied: %v, want the route's password_file problem", err)
	}
	if err := os.WriteFile(pw, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(ca); err != nil {
		t.Fatal(err)
	}
	if err := byFile.CheckHost(&registry.HostCache{}); err == nil {
		t.Error("CA file removed: CheckHost passed")
	}
	t.Setenv("ACTIVATOR_TEST_CHECKHOST_PW", "")
	if err := byEnv.CheckHost(&registry.HostCache{}); err == nil {
		t.Error("password variable emptied: CheckHost passed")
	}
}
