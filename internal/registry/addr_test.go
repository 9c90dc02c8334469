package registry_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/activator/activator/internal/registry"
)

// TestLoadListenAddrs covers listen and admin: the default, the forms each accepts, and each way a value
// can be wrong. The admin API also takes unix:/path; the edge listens on TCP only.
func TestLoadListenAddrs(t *testing.T) {
	const (
		listenForms = `(want host:port, as in 127.0.0.1:8080, [::1]:8080 or :8080)`
		adminForms  = `(want host:port, as in 127.0.0.1:9090, or unix:/path)`
	)
	runTopKeys(t, []topKey{
		{"listen", func(c *registry.Config) any { return c.Listen }, []keyCase{
			{value: "", want: "127.0.0.1:8080"},
			{value: "127.0.0.1:8000", want: "127.0.0.1:8000"},
			{value: "0.0.0.0:80", want: "0.0.0.0:80"},
			{value: `":8080"`, want: ":8080"},
			{value: `"[::1]:8080"`, want: "[::1]:8080"},
			{value: "localhost:8080", want: "localhost:8080"},
			{value: "edge.example.com:443", want: "edge.example.com:443"},
			{value: "bogus", problem: `"bogus" is not an address to listen on ` + listenForms},
			{value: "127.0.0.1", problem: `"127.0.0.1" is not an address to listen on ` + listenForms},
			{value: "127.0.0.1:99999", problem: `"127.0.0.1:99999": port 99999 is out of range 1-65535`},
			{value: "127.0.0.1:http", problem: `"127.0.0.1:http": port "http" is not a number (1-65535)`},
			{value: "127.0.0.1:0", problem: `"127.0.0.1:0" needs a fixed port`},
			{value: "999.1.1.1:80", problem: `"999.1.1.1:80": "999.1.1.1" is not a valid IP address`},
			{value: `"bad host:80"`, problem: `"bad host:80": host "bad host" is neither an IP address nor a DNS name`},
			{value: "unix:/run/edge.sock", problem: `"unix:/run/edge.sock": the edge listens on TCP only ` + listenForms},
		}},
		{"admin", func(c *registry.Config) any { return c.Admin }, []keyCase{
			{value: "", want: "127.0.0.1:9090"},
			{value: "127.0.0.1:9191", want: "127.0.0.1:9191"},
			{value: "unix:/run/activator/admin.sock", want: "unix:/run/activator/admin.sock"},
			{value: "bogus", problem: `"bogus" is not an address to listen on ` + adminForms},
			{value: "/run/admin.sock", problem: `"/run/admin.sock" is not an address to listen on ` + adminForms},
			{value: `"unix:"`, problem: `"unix:" names no socket path ` + adminForms},
			{value: "127.0.0.1:65536", problem: `"127.0.0.1:65536": port 65536 is out of range 1-65535`},
			{value: "300.0.0.1:9090", problem: `"300.0.0.1:9090": "300.0.0.1" is not a valid IP address`},
			{value: "127.0.0.1:8080", problem: `127.0.0.1:8080 is also the edge's address (listen: 127.0.0.1:8080)`},
			{value: `":8080"`, problem: `:8080 is also the edge's address (listen: 127.0.0.1:8080)`},
		}},
	})
}

// TestParseUpstreamAddrs: a TCP upstream names a port in 1-65535 and a host that is an IP address or a
// DNS name.
func TestParseUpstreamAddrs(t *testing.T) {
	tests := []struct {
		in      string
		wantErr string // "" when valid
	}{
		{in: "127.0.0.1:65535"},
		{in: "localhost:80"},
		{in: "app.internal:8080"},
		{in: "APP.Internal.:8080"},
		{in: "my_app:8080"}, // a Compose service name
		{in: "[::1]:80"},
		{in: "[fe80::1%eth0]:80"},
		{in: "[::ffff:127.0.0.1]:80"},
		{in: "127.0.0.1:99999", wantErr: `upstream "127.0.0.1:99999": port 99999 is out of range 1-65535`},
		{in: "127.0.0.1:-1", wantErr: `upstream "127.0.0.1:-1": port "-1" is not a number (1-65535)`},
		{in: "127.0.0.1:+80", wantErr: `upstream "127.0.0.1:+80": port "+80" is not a number (1-65535)`},
		{in: "app:http", wantErr: `upstream "app:http": port "http" is not a number (1-65535)`},
		{in: "999.1.1.1:80", wantErr: `upstream "999.1.1.1:80": "999.1.1.1" is not a valid IP address`},
		{in: "1.2.3:80", wantErr: `upstream "1.2.3:80": "1.2.3" is not a valid IP address`},
		{in: "[::zz]:80", wantErr: `upstream "[::zz]:80": "::zz" is not a valid IP address`},
		{in: "bad host:80", wantErr: `upstream "bad host:80": host "bad host" is neither an IP address nor a DNS name`},
		{in: "-app:80", wantErr: `upstream "-app:80": host "-app" is neither an IP address nor a DNS name`},
		{in: "a..b:80", wantErr: `upstream "a..b:80": host "a..b" is neither an IP address nor a DNS name`},
		{in: strings.Repeat("a", 64) + ":80", wantErr: fmt.Sprintf(`upstream "%s:80": host %q is neither an IP address nor a DNS name`, strings.Repeat("a", 64), strings.Repeat("a", 64))},
	}
	for _, tt := range tests {
		_, err := registry.ParseUpstream(tt.in)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.wantErr {
			t.Errorf("ParseUpstream(%q) error = %q, want %q", tt.in, got, tt.wantErr)
		}
	}
}

// upstreamRoute is a config with top-level lines top (one line each), then one route "a" whose upstream
// is on the line after them plus 4.
func upstreamRoute(upstream string, top ...string) string {
	var b strings.Builder
	for _, l := range top {
		b.WriteString(l + "\n")
	}
	fmt.Fprintf(&b, "routes:\n  - name: a\n    hosts: [a.localhost]\n    backing: exec\n    upstream: %q\n    exec: {argv: [/bin/a]}\n", upstream)
	return b.String()
}

// TestLoadUpstreamIsTheEdge: an upstream that is the activator's own listen or admin address is
// rejected. A wildcard listen address (0.0.0.0, ::, or no host) takes every local address of its port.
func TestLoadUpstreamIsTheEdge(t *testing.T) {
	const hint = " (where does the woken tenant listen?)"
	loop := func(up, listen string) string {
		return fmt.Sprintf("upstream %s is the activator's own listen address %s: requests would loop back to the edge", up, listen) + hint
	}
	tests := []struct {
		name     string
		top      []string
		upstream string
		want     string // the problem after `line N: route "a": upstream: `; "" when the config is valid
	}{
		{name: "the default listen address", upstream: "127.0.0.1:8080", want: loop("127.0.0.1:8080", "127.0.0.1:8080")},
		{name: "localhost for the default listen address", upstream: "localhost:8080", want: loop("localhost:8080", "127.0.0.1:8080")},
		{name: "another port", upstream: "127.0.0.1:8081"},
		{name: "another loopback address", upstream: "127.0.0.2:8080"},
		{name: "a listen name", top: []string{"listen: Edge.Example.com:80"}, upstream: "edge.example.com.:80", want: loop("edge.example.com.:80", "Edge.Example.com:80")},
		{name: "0.0.0.0 takes 127.0.0.1", top: []string{"listen: 0.0.0.0:9001"}, upstream: "127.0.0.1:9001", want: loop("127.0.0.1:9001", "0.0.0.0:9001")},
		{name: "0.0.0.0 takes localhost", top: []string{"listen: 0.0.0.0:9001"}, upstream: "LocalHost:9001", want: loop("LocalHost:9001", "0.0.0.0:9001")},
		{name: "0.0.0.0 takes other loopback addresses", top: []string{"listen: 0.0.0.0:9001"}, upstream: "127.0.0.9:9001", want: loop("127.0.0.9:9001", "0.0.0.0:9001")},
		{name: ":: takes ::1", top: []string{`listen: "[::]:9001"`}, upstream: "[::1]:9001", want: loop("[::1]:9001", "[::]:9001")},
		{name: "no host takes a mapped loopback", top: []string{`listen: ":9001"`}, upstream: "[::ffff:127.0.0.1]:9001", want: loop("[::ffff:127.0.0.1]:9001", ":9001")},
		{name: "0.0.0.0 and another port", top: []string{"listen: 0.0.0.0:9001"}, upstream: "127.0.0.1:9002"},
		{name: "0.0.0.0 and a remote host", top: []string{"listen: 0.0.0.0:9001"}, upstream: "app.internal:9001"},
		{name: "a specific listen IP", top: []string{"listen: 192.0.2.10:80"}, upstream: "192.0.2.10:80", want: loop("192.0.2.10:80", "192.0.2.10:80")},
		{name: "a specific listen IP and loopback", top: []string{"listen: 192.0.2.10:80"}, upstream: "127.0.0.1:80"},
		{
			name: "the admin address", upstream: "127.0.0.1:9090",
			want: "upstream 127.0.0.1:9090 is the activator's own admin address 127.0.0.1:9090: requests would go to the admin API" + hint,
		},
		{name: "a unix admin address", top: []string{"admin: unix:/run/admin.sock"}, upstream: "unix:/run/admin.sock",
			want: "upstream unix:/run/admin.sock is the activator's own admin address unix:/run/admin.sock: requests would go to the admin API" + hint},
		{name: "a bad listen address is not compared", top: []string{"listen: bogus"}, upstream: "127.0.0.1:8080"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := upstreamRoute(tt.upstream, tt.top...)
			var want []string
			if tt.want != "" {
				want = []string{fmt.Sprintf(`line %d: route "a": upstream: %s`, len(tt.top)+5, tt.want)}
			}
			var got []string
			for _, p := range problems(t, data, backings) {
				if !strings.HasPrefix(p, "line 1: listen: ") { // the bad listen case's own problem
					got = append(got, p)
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Load problems:\n got %q\nwant %q", got, want)
			}
		})
	}
}

// TestLoadHealthHost covers health.host: by default the route's first exact host (none when it has only
// wildcards, and the probe then sends the upstream's address), else a host or host:port as a Host
// header carries it.
func TestLoadHealthHost(t *testing.T) {
	host := func(c *registry.Config) any { return c.Routes[0].Health.Host }
	tests := []struct {
		hosts string // the route's hosts
		kc    keyCase
	}{
		{"[a.localhost]", keyCase{value: "", want: "a.localhost"}},
		{`["*.example.com", App.Example.com, b.example.com]`, keyCase{value: "", want: "app.example.com"}},
		{`["*.example.com"]`, keyCase{value: "", want: ""}},
		{`["*.example.com"]`, keyCase{value: "www.example.com", want: "www.example.com"}},
		{"[a.localhost]", keyCase{value: "api.internal:8443", want: "api.internal:8443"}},
		{"[a.localhost]", keyCase{value: "10.0.0.1", want: "10.0.0.1"}},
		{"[a.localhost]", keyCase{value: `"[::1]:8080"`, want: "[::1]:8080"}},
		{"[a.localhost]", keyCase{value: `"[::1]"`, want: "[::1]"}},
		{"[a.localhost]", keyCase{value: "http://a.example.com", problem: `"http://a.example.com": leave the scheme out (a Host header: host or host:port)`}},
		{"[a.localhost]", keyCase{value: "a.example.com/healthz", problem: `"a.example.com/healthz": leave the path out (set it in health.path)`}},
		{"[a.localhost]", keyCase{value: `"a b"`, problem: `"a b": host "a b" is neither an IP address nor a DNS name`}},
		{"[a.localhost]", keyCase{value: `"*.example.com"`, problem: `"*.example.com": host "*.example.com" is neither an IP address nor a DNS name`}},
		{"[a.localhost]", keyCase{value: "a.example.com:0", problem: `"a.example.com:0": port 0 is out of range 1-65535`}},
		{"[a.localhost]", keyCase{value: "a.example.com:99999", problem: `"a.example.com:99999": port 99999 is out of range 1-65535`}},
		{"[a.localhost]", keyCase{value: `"a.example.com:"`, problem: `"a.example.com:": port "" is not a number (1-65535)`}},
		{"[a.localhost]", keyCase{value: `"::1"`, problem: `"::1": write an IPv6 address in brackets, as in [::1]`}},
		{"[a.localhost]", keyCase{value: "999.0.0.1", problem: `"999.0.0.1": "999.0.0.1" is not a valid IP address`}},
	}
	for _, tt := range tests {
		t.Run(tt.hosts+" "+tt.kc.value, func(t *testing.T) {
			extra := []string{"hosts: " + tt.hosts}
			if tt.kc.value != "" {
				extra = append(extra, "health:", "  host: "+tt.kc.value)
			}
			runKeyCase(t, oneRoute(extra...), tt.kc, `line 8: route "a": health.host: `, host)
		})
	}
}
