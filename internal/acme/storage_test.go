package acme

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/activator/activator/internal/registry"
)

func TestStorageDir(t *testing.T) {
	for _, tc := range []struct {
		name, set string
		env       map[string]string
		want      string // "" for an error
	}{
		{"set", "/srv/acme", map[string]string{"STATE_DIRECTORY": "/var/lib/activator"}, "/srv/acme"},
		{"systemd", "", map[string]string{"STATE_DIRECTORY": "/var/lib/activator", "HOME": "/home/a"}, "/var/lib/activator/acme"},
		{"systemd, several", "", map[string]string{"STATE_DIRECTORY": "/var/lib/a:/var/lib/b"}, "/var/lib/a/acme"},
		{"xdg", "", map[string]string{"XDG_DATA_HOME": "/x", "HOME": "/home/a"}, "/x/activator/acme"},
		{"xdg relative is ignored", "", map[string]string{"XDG_DATA_HOME": "rel", "HOME": "/home/a"}, "/home/a/.local/share/activator/acme"},
		{"nothing", "", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := storageDir(tc.set, func(k string) string { return tc.env[k] })
			if got != tc.want || (err != nil) != (tc.want == "") {
				t.Errorf("storageDir(%q) = %q, %v; want %q", tc.set, got, err, tc.want)
			}
		})
	}
}

// New reports what it cannot use under the config key (or listener) it came from.
func TestNewErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "root.der")
	if err := os.WriteFile(notPEM, []byte("\x30\x82"), 0o600); err != nil {
		t.Fatal(err)
	}
	acme := func(root string) *registry.ACME {
		return &registry.ACME{CA: registry.DefaultACMECA, Storage: filepath.Join(dir, "s"), CARoot: root}
	}
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"no acme", Options{}, "no tls.acme"},
		{"root missing", Options{ACME: acme(filepath.Join(dir, "nope.pem"))}, "tls.acme.ca_root: open"},
		{"root not PEM", Options{ACME: acme(notPEM)}, "tls.acme.ca_root: " + notPEM + " holds no PEM certificate"},
		{"bad listen", Options{ACME: acme(""), HTTPAddr: "localhost"}, `listen "localhost"`},
		{"bad listen_tls port", Options{ACME: acme(""), TLSAddr: ":https"}, `listen_tls ":https": not a port number`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(tc.opts, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New error = %v, want one containing %q", err, tc.want)
			}
			if m != nil {
				t.Errorf("New returned a Manager with its error")
			}
		})
	}
}

// The challenge solvers are pointed at the edge's listeners, so that certmagic finds them bound.
func TestIssuerTemplate(t *testing.T) {
	for _, tc := range []struct {
		http, tls         string
		host              string
		httpPort, tlsPort int
		noHTTP, noTLS     bool
	}{
		{"127.0.0.1:80", "127.0.0.1:443", "127.0.0.1", 80, 443, false, false},
		{"127.0.0.1:8080", "0.0.0.0:443", "", 8080, 443, false, false},
		{"", "[::]:8443", "::", 0, 8443, true, false},
		{":80", "", "", 80, 0, false, true},
	} {
		got, err := issuerTemplate(Options{ACME: &registry.ACME{CA: registry.DefaultACMECA}, HTTPAddr: tc.http, TLSAddr: tc.tls}, nil)
		if err != nil {
			t.Fatalf("issuerTemplate(%q, %q): %v", tc.http, tc.tls, err)
		}
		if got.ListenHost != tc.host || got.AltHTTPPort != tc.httpPort || got.AltTLSALPNPort != tc.tlsPort ||
			got.DisableHTTPChallenge != tc.noHTTP || got.DisableTLSALPNChallenge != tc.noTLS || !got.Agreed {
			t.Errorf("issuerTemplate(%q, %q) = host %q, ports %d/%d, disabled %v/%v, agreed %v; want %q, %d/%d, %v/%v, true",
				tc.http, tc.tls, got.ListenHost, got.AltHTTPPort, got.AltTLSALPNPort, got.DisableHTTPChallenge,
				got.DisableTLSALPNChallenge, got.Agreed, tc.host, tc.httpPort, tc.tlsPort, tc.noHTTP, tc.noTLS)
		}
	}
}

// TestCheck: Check reports, creating nothing, what New would refuse: the same ca_root problems, and a
// storage path under a file or in a directory this user cannot write; and warns of a storage
// directory others may read. check passed such configs that serve then refused (found with the real
// binary).
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	loose := filepath.Join(dir, "loose")
	if err := os.Mkdir(loose, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(loose, 0o777); err != nil {
		t.Fatal(err)
	}
	readable := filepath.Join(dir, "readable")
	if err := os.Mkdir(readable, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(readable, 0o755); err != nil {
		t.Fatal(err)
	}
	acme := func(storage, root string) Options {
		return Options{ACME: &registry.ACME{CA: registry.DefaultACMECA, Storage: storage, CARoot: root}}
	}
	for _, tc := range []struct {
		name             string
		opts             Options
		problem, warning string
	}{
		{"good, to be made", acme(filepath.Join(dir, "new", "acme"), ""), "", ""},
		{"root missing", acme(filepath.Join(dir, "s"), filepath.Join(dir, "nope.pem")), "tls.acme.ca_root: open", ""},
		{"under a file", acme(filepath.Join(file, "x"), ""), "a-file is not a directory", ""},
		{"writable by others", acme(loose, ""), "loose is writable by others (mode 0777)", ""},
		{"readable by others", acme(readable, ""), "", "mode 0755"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			problems, warnings := Check(tc.opts)
			if got := errors.Join(problems...); (tc.problem == "") != (got == nil) || got != nil && !strings.Contains(got.Error(), tc.problem) {
				t.Errorf("problems %v, want %q", got, tc.problem)
			}
			if got := strings.Join(warnings, "; "); !strings.Contains(got, tc.warning) || (tc.warning == "") != (got == "") {
				t.Errorf("warnings %q, want %q", got, tc.warning)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Check made the storage directory (%v)", err)
	}
}
