package registry_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/activator/activator/internal/registry"
)

// TestLoadTLS: listen_tls with certificates from files and ACME, redirect_http, trusted_proxies and
// proxy_protocol parse into the Config; ACME's CA defaults to Let's Encrypt.
func TestLoadTLS(t *testing.T) {
	top := `listen_tls: 0.0.0.0:8443
redirect_http: true
tls:
  certificates: [{cert_file: /etc/a.pem, key_file: /etc/a.key}]
  acme: {email: ops@example.com, storage: /var/lib/activator/acme}
trusted_proxies: [10.0.0.0/8, 127.0.0.1, "::1"]
proxy_protocol: {listen_tls: true}
`
	cfg, err := registry.Load([]byte(top+oneRoute("hosts: [a.localhost, '*.b.localhost']")), backings)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ListenTLS != "0.0.0.0:8443" || !cfg.RedirectHTTP || len(cfg.TLS.Certificates) != 1 || cfg.TLS.ACME == nil {
		t.Fatalf("config %+v", cfg)
	}
	if a := cfg.TLS.ACME; a.CA != registry.DefaultACMECA || a.Email != "ops@example.com" {
		t.Fatalf("acme %+v", a)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}
	if !slices.Equal(cfg.TrustedProxies, want) || !cfg.ProxyProtocol.ListenTLS || cfg.ProxyProtocol.Listen {
		t.Fatalf("trusted %v, proxy_protocol %+v", cfg.TrustedProxies, cfg.ProxyProtocol)
	}
	if h := cfg.ExactHosts(); !slices.Equal(h, []string{"a.localhost"}) {
		t.Fatalf("exact hosts %v", h)
	}
}

func TestLoadTLSProblems(t *testing.T) {
	for _, tc := range []struct{ top, want string }{
		{"listen_tls: 127.0.0.1:8443\n", `listen_tls: needs certificates: tls.certificates (files) or tls.acme`},
		{"tls: {acme: {}}\n", `tls: set, but there is no listen_tls`},
		{"redirect_http: true\n", `redirect_http: needs listen_tls`},
		{"listen_tls: 127.0.0.1:8080\ntls: {acme: {}}\n", `listen_tls: 127.0.0.1:8080 is also the edge's plain address (listen: 127.0.0.1:8080)`},
		{"listen_tls: 127.0.0.1:8443\ntls: {certificates: [{cert_file: a.pem}]}\n", `tls.certificates[0].cert_file: "a.pem" is not an absolute path`},
		{"listen_tls: 127.0.0.1:8443\ntls: {certificates: [{cert_file: /a.pem}]}\n", `tls.certificates[0].key_file: missing`},
		{"listen_tls: 127.0.0.1:8443\ntls: {acme: {ca: 'http://ca.test/dir'}}\n", `tls.acme.ca: "http://ca.test/dir" is not an https URL`},
		{"listen_tls: 127.0.0.1:8443\ntls: {acme: {storage: acme}}\n", `tls.acme.storage: "acme" is not an absolute path`},
		{"trusted_proxies: [10.0.0.0/33]\n", `trusted_proxies[0]: "10.0.0.0/33" is neither a CIDR`},
		{"proxy_protocol: {listen: true}\n", `proxy_protocol: needs trusted_proxies`},
		{"trusted_proxies: [127.0.0.1]\nproxy_protocol: {listen_tls: true}\n", `proxy_protocol.listen_tls: there is no listen_tls`},
		{"edge: {max_tls_handshakes: 0}\n", `edge.max_tls_handshakes: must be positive, got 0`},
		{"edge: {max_conns: 0}\n", `edge.max_conns: must be positive, got 0 (leave the key out to derive it from the open-file limit)`},
		{"edge: {max_conns: -3}\n", `edge.max_conns: must be positive, got -3`},
		{"edge: {event_loops: -1}\n", `edge.event_loops: must be between 0 (off) and 64, got -1 (leave the key out for one per CPU)`},
		{"edge: {event_loops: 65}\n", `edge.event_loops: must be between 0 (off) and 64, got 65 (leave the key out for one per CPU)`},
		{"listen_tls: 127.0.0.1:8443\ntls: {acme: {}}\nroutes:\n  - name: a\n    hosts: [a.localhost]\n    backing: exec\n    upstream: 127.0.0.1:8443\n    exec: {argv: [/bin/a]}\n",
			`the activator's own listen_tls address`},
	} {
		data := tc.top
		if !strings.Contains(data, "routes:") {
			data += oneRoute("hosts: [a.localhost]")
		}
		got := strings.Join(problems(t, data, backings), "\n")
		if !strings.Contains(got, tc.want) {
			t.Errorf("%q: problems\n%s\nwant one containing %q", tc.top, got, tc.want)
		}
	}
}

// TestLoadTLSEmptyACME: an operator trial found `tls.acme:` with no value refused with "listen_tls:
// needs certificates: tls.certificates (files) or tls.acme", beside the tls.acme it had just written.
// An empty mapping (`acme: {}`) is ACME with every default; the key with no value at all (often a
// block whose keys were commented out) is refused by its own name, saying what to write, and alone.
func TestLoadTLSEmptyACME(t *testing.T) {
	const listen = "listen_tls: 127.0.0.1:8443\n"
	for _, tc := range []struct {
		name, top string
		want      []string // the whole list of problems; nil: it loads
	}{
		{"no value", listen + "tls:\n  acme:\n",
			[]string{`line 3: tls.acme: set with no value: write acme: {} for ACME with every default (Let's Encrypt, no contact email, the default storage), or give its keys (email, ca, storage, ca_root)`}},
		{"null", listen + "tls:\n  acme: null\n",
			[]string{`line 3: tls.acme: set with no value: write acme: {}`}},
		{"tilde, flow", listen + "tls: {acme: ~}\n",
			[]string{`line 2: tls.acme: set with no value`}},
		{"an alias of nothing", listen + "tls:\n  certificates: &none\n  acme: *none\n",
			[]string{`line 4: tls.acme: set with no value`}},
		{"no value beside files", listen + "tls:\n  certificates: [{cert_file: /a.pem, key_file: /a.key}]\n  acme:\n",
			[]string{`line 4: tls.acme: set with no value`}},
		{"a scalar", listen + "tls:\n  acme: true\n",
			[]string{`line 3: tls.acme: want a mapping of keys, got "true"`}},
		{"a list", listen + "tls:\n  acme: []\n",
			[]string{`line 3: tls.acme: want a mapping of keys, got a list`}},
		{"empty mapping", listen + "tls:\n  acme: {}\n", nil},
		{"keys with no values", listen + "tls:\n  acme:\n    email:\n    ca:\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := problems(t, tc.top+oneRoute("hosts: [a.localhost]"), backings)
			if len(got) != len(tc.want) {
				t.Fatalf("problems\n%s\nwant %d:\n%s", strings.Join(got, "\n"), len(tc.want), strings.Join(tc.want, "\n"))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d: %s\nwant it to contain %s", i, got[i], w)
				}
			}
			if tc.want != nil {
				return
			}
			cfg, err := registry.Load([]byte(tc.top+oneRoute("hosts: [a.localhost]")), backings)
			if err != nil {
				t.Fatal(err)
			}
			if a := cfg.TLS.ACME; a == nil || a.CA != registry.DefaultACMECA || a.Email != "" || a.Storage != "" {
				t.Errorf("tls.acme %+v, want every default", a)
			}
		})
	}
}
