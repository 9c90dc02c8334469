package tlsedge

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tlsedge/tlstest"
)

// loadCase is one LoadCerts call and what it must report.
type loadCase struct {
	name     string
	files    []registry.CertFile
	problems []string // each a substring of one error, in order
	warnings []string // likewise
	loaded   int
}

// loadCases writes the files of TestLoadCertsProblems' cases.
func loadCases(t *testing.T) []loadCase {
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	good := ca.Write(t, dir, "good", tlstest.Leaf{Label: "good", Names: []string{"good.test"}})
	other := ca.Write(t, dir, "other", tlstest.Leaf{Label: "other", Names: []string{"other.test"}})
	expired := ca.Write(t, dir, "expired", tlstest.Leaf{Label: "expired", Names: []string{"old.test"},
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	early := ca.Write(t, dir, "early", tlstest.Leaf{Label: "early", Names: []string{"new.test"},
		NotBefore: time.Now().Add(24 * time.Hour), NotAfter: time.Now().Add(48 * time.Hour)})
	noNames := ca.Write(t, dir, "nonames", tlstest.Leaf{Label: "nonames"})
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	garbage := write("garbage.pem", "not a certificate\n")
	fifo := filepath.Join(dir, "fifo.pem")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	weak := weakPair(t, dir)
	encrypted := write("encrypted.key", "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n")
	missing := filepath.Join(dir, "missing.pem")

	return []loadCase{
		{"good", []registry.CertFile{good}, nil, nil, 1},
		{"missing cert file", []registry.CertFile{{CertFile: missing, KeyFile: good.KeyFile}},
			[]string{"tls.certificates[0].cert_file: " + missing + ": no such file"}, nil, 0},
		{"missing both", []registry.CertFile{{CertFile: missing, KeyFile: missing}},
			[]string{"tls.certificates[0].cert_file: " + missing + ": no such file", "tls.certificates[0].key_file: " + missing + ": no such file"}, nil, 0},
		{"not PEM", []registry.CertFile{{CertFile: garbage, KeyFile: good.KeyFile}},
			[]string{"tls.certificates[0].cert_file: " + garbage + ": not PEM"}, nil, 0},
		{"swapped", []registry.CertFile{{CertFile: good.KeyFile, KeyFile: good.CertFile}},
			[]string{"cert_file: " + good.KeyFile + ": holds a private key, not a certificate: are cert_file and key_file swapped?",
				"key_file: " + good.CertFile + ": holds a certificate, not a private key"}, nil, 0},
		{"encrypted key", []registry.CertFile{{CertFile: good.CertFile, KeyFile: encrypted}},
			[]string{"key_file: " + encrypted + ": the private key is encrypted"}, nil, 0},
		{"key of another certificate", []registry.CertFile{{CertFile: good.CertFile, KeyFile: other.KeyFile}},
			[]string{"tls.certificates[0]: " + good.CertFile + " and " + other.KeyFile + ": the key in key_file does not match the certificate"}, nil, 0},
		{"every pair tried", []registry.CertFile{{CertFile: missing, KeyFile: good.KeyFile}, good, {CertFile: garbage, KeyFile: good.KeyFile}},
			[]string{"tls.certificates[0].cert_file", "tls.certificates[2].cert_file: " + garbage}, nil, 1},
		{"expired is a warning", []registry.CertFile{good, expired}, nil,
			[]string{"tls.certificates[1].cert_file: " + expired.CertFile + ": expired on"}, 2},
		{"not yet valid is a warning", []registry.CertFile{early}, nil,
			[]string{"tls.certificates[0].cert_file: " + early.CertFile + ": not valid before"}, 1},
		{"no names, first", []registry.CertFile{noNames, good}, nil, []string{"served only as the default"}, 2},
		{"no names, not first", []registry.CertFile{good, noNames}, nil, []string{"it is never served"}, 2},
		// Found with the real binary: a FIFO hung check, and a key Go will not sign with loaded and
		// failed every handshake.
		{"a FIFO", []registry.CertFile{{CertFile: fifo, KeyFile: good.KeyFile}},
			[]string{"tls.certificates[0].cert_file: " + fifo + ": not a regular file"}, nil, 0},
		{"RSA 512", []registry.CertFile{weak}, []string{"tls.certificates[0].key_file: " + weak.KeyFile + ": the key cannot sign a handshake"}, nil, 0},
		{"a name twice", []registry.CertFile{good, good}, nil, []string{"tls.certificates[1].cert_file: " + good.CertFile + ": good.test is also in tls.certificates[0]", "every name it carries is an earlier pair's"}, 2},
	}
}

// TestLoadCertsProblems: each pair that cannot be served is an error naming its key, its file and the
// problem, every pair is tried, and a certificate that is not valid now is served with a warning.
func TestLoadCertsProblems(t *testing.T) {
	for _, tt := range loadCases(t) {
		t.Run(tt.name, func(t *testing.T) {
			certs, warnings, err := LoadCerts(tt.files, time.Now())
			errs := registry.Errors(err)
			if len(errs) != len(tt.problems) {
				t.Fatalf("errors %q, want %d like %q", errs, len(tt.problems), tt.problems)
			}
			for i, e := range errs {
				var ce *CertError
				if !errors.As(e, &ce) {
					t.Errorf("error %q is a %T, want a *CertError", e, e)
				}
				if !strings.Contains(e.Error(), tt.problems[i]) {
					t.Errorf("error %d: %q, want it to contain %q", i, e, tt.problems[i])
				}
			}
			if len(warnings) != len(tt.warnings) {
				t.Fatalf("warnings %q, want %d like %q", warnings, len(tt.warnings), tt.warnings)
			}
			for i, w := range warnings {
				if !strings.Contains(w, tt.warnings[i]) {
					t.Errorf("warning %d: %q, want it to contain %q", i, w, tt.warnings[i])
				}
			}
			if got := len(certs.list); got != tt.loaded {
				t.Errorf("%d certificates loaded, want %d", got, tt.loaded)
			}
			if got, want := len(certs.Files()), 2*len(tt.files); got != want {
				t.Errorf("Files() lists %d, want %d: every file, loaded or not, is watched", got, want)
			}
		})
	}
}

// fakeSource is a Source that answers every hello with its certificate, or its error, and counts.
type fakeSource struct {
	cert  *tls.Certificate
	err   error
	asked chan string // every hello's ServerName; buffered by the test
}

func (s *fakeSource) GetCertificate(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.asked <- h.ServerName
	return s.cert, s.err
}

// TestChooseCertificate: a hello gets the file that carries its name exactly, else the one whose
// wildcard covers it, else the Source for its hosts, else the first file; a TLS-ALPN-01 challenge goes
// to the Source whatever its name.
func TestChooseCertificate(t *testing.T) {
	ca := tlstest.NewCA(t)
	certs := loadCerts(t, ca,
		tlstest.Leaf{Label: "A", Names: []string{"a.test", "*.wild.test"}},
		tlstest.Leaf{Label: "B", Names: []string{"b.test", "exact.wild.test"}},
	)
	srcCert := loadCerts(t, ca, tlstest.Leaf{Label: "source", Names: []string{"acme.test"}}).Default()
	src := &fakeSource{cert: srcCert, asked: make(chan string, 100)}
	withSource := New(Settings{Certs: certs, SourceHosts: []string{"acme.test", "a.test"}}, Options{Source: src})
	filesOnly := New(Settings{Certs: certs, SourceHosts: []string{"acme.test"}}, Options{})
	tests := []struct {
		name   string
		edge   *Edge
		sni    string
		protos []string
		want   string // the label; "source" is the Source's
	}{
		{"exact", filesOnly, "b.test", nil, "B"},
		{"exact, any case and a trailing dot", filesOnly, "B.Test.", nil, "B"},
		{"wildcard", filesOnly, "x.wild.test", nil, "A"},
		{"exact beats wildcard", filesOnly, "exact.wild.test", nil, "B"},
		{"a wildcard covers one label", filesOnly, "x.y.wild.test", nil, "A"}, // the default, which is A
		{"no SNI: the default", filesOnly, "", nil, "A"},
		{"unknown: the default", filesOnly, "nobody.test", nil, "A"},
		{"source hosts without a source: the default", filesOnly, "acme.test", nil, "A"},
		{"a source host", withSource, "acme.test", nil, "source"},
		{"a file before the source", withSource, "a.test", nil, "A"},
		{"unknown with a source: the default", withSource, "nobody.test", nil, "A"},
		{"a challenge goes to the source", withSource, "b.test", []string{ACMETLS1}, "source"},
		{"acme-tls/1 among others is no challenge", withSource, "b.test", []string{"h2", ACMETLS1}, "B"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := tt.edge.TLSConfig().GetCertificate(&tls.ClientHelloInfo{ServerName: tt.sni, SupportedProtos: tt.protos})
			if err != nil {
				t.Fatalf("GetCertificate(%q): %v", tt.sni, err)
			}
			if got := c.Leaf.Subject.CommonName; got != tt.want {
				t.Errorf("GetCertificate(%q, %q) = %s, want %s", tt.sni, tt.protos, got, tt.want)
			}
		})
	}

	t.Run("the source's error is final", func(t *testing.T) {
		failing := &fakeSource{err: errors.New("order failed"), asked: make(chan string, 1)}
		e := New(Settings{Certs: certs, SourceHosts: []string{"acme.test"}}, Options{Source: failing})
		if _, err := e.TLSConfig().GetCertificate(&tls.ClientHelloInfo{ServerName: "acme.test"}); err == nil || err.Error() != "order failed" {
			t.Errorf("err = %v, want the source's", err)
		}
	})
	t.Run("no certificate at all", func(t *testing.T) {
		e := New(Settings{}, Options{Source: src})
		if _, err := e.TLSConfig().GetCertificate(&tls.ClientHelloInfo{ServerName: "nobody.test"}); err == nil || !strings.Contains(err.Error(), `no certificate for "nobody.test"`) {
			t.Errorf("err = %v, want no certificate", err)
		}
	})
	close(src.asked)
	var asked []string
	for n := range src.asked {
		asked = append(asked, n)
	}
	if want := []string{"acme.test", "b.test"}; strings.Join(asked, " ") != strings.Join(want, " ") {
		t.Errorf("the source was asked for %q, want only %q: never for names a file carries or nobody serves", asked, want)
	}
}

// TestTLSConfig: the modern defaults, and acme-tls/1 offered only with a Source.
func TestTLSConfig(t *testing.T) {
	files := New(Settings{}, Options{}).TLSConfig()
	if files.MinVersion != tls.VersionTLS12 || files.CipherSuites != nil || files.SessionTicketsDisabled {
		t.Errorf("MinVersion %x, CipherSuites %v, SessionTicketsDisabled %v: want TLS 1.2, Go's suites, tickets on", files.MinVersion, files.CipherSuites, files.SessionTicketsDisabled)
	}
	if got := strings.Join(files.NextProtos, ","); got != "h2,http/1.1" {
		t.Errorf("NextProtos %s without a source, want h2,http/1.1", got)
	}
	acme := New(Settings{}, Options{Source: &fakeSource{}}).TLSConfig()
	if got := strings.Join(acme.NextProtos, ","); got != "h2,http/1.1,"+ACMETLS1 {
		t.Errorf("NextProtos %s with a source, want h2,http/1.1,acme-tls/1", got)
	}
}

// TestCovers: what the redirect and check ask of the files.
func TestCovers(t *testing.T) {
	ca := tlstest.NewCA(t)
	certs := loadCerts(t, ca, tlstest.Leaf{Label: "A", Names: []string{"a.test", "*.wild.test"}})
	for host, want := range map[string]bool{
		"a.test": true, "A.TEST:8080": true, "a.test.": true, "x.wild.test": true, "*.wild.test": true,
		"wild.test": false, "x.y.wild.test": false, "b.test": false, "[::1]:80": false, "": false,
	} {
		if got := certs.Covers(host); got != want {
			t.Errorf("Covers(%q) = %v, want %v", host, got, want)
		}
	}
	var none *Certs
	if none.Covers("a.test") || none.Default() != nil || none.Files() != nil {
		t.Error("a nil *Certs covers something")
	}
}

// weakPair writes a self-signed certificate with a 512-bit RSA key, which Go only makes, and signs
// with, under GODEBUG=rsa1024min=0.
func weakPair(t *testing.T, dir string) registry.CertFile {
	t.Helper()
	t.Setenv("GODEBUG", "rsa1024min=0")
	key, err := rsa.GenerateKey(rand.Reader, 512)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), DNSNames: []string{"weak.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("GODEBUG", "")
	f := registry.CertFile{CertFile: filepath.Join(dir, "weak.crt"), KeyFile: filepath.Join(dir, "weak.key")}
	for file, blk := range map[string]*pem.Block{f.CertFile: {Type: "CERTIFICATE", Bytes: der},
		f.KeyFile: {Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}} {
		if err := os.WriteFile(file, pem.EncodeToMemory(blk), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}
