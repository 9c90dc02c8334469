package health_test

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/registry"
)

// allowHost answers 200 when the request's Host is want, and 400 otherwise, as a Django or Rails app
// with a Host allow-list does; it keeps the last Host it saw.
func allowHost(want string, seen *atomic.Value) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Host)
		if r.Host != want {
			http.Error(w, "Invalid HTTP_HOST header: "+r.Host, http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusOK)
	}
}

// loadRoute loads a config of one route with the given hosts and health block, and upstream up, the
// way serve does (Load fills in the health defaults), with a backing whose settings are empty.
func loadRoute(t *testing.T, up registry.Upstream, hosts, healthBlock string) *registry.Route {
	t.Helper()
	data := fmt.Sprintf("routes:\n  - name: a\n    hosts: %s\n    backing: fake\n    upstream: %q\n    health: %s\n", hosts, up.String(), healthBlock)
	decoders := map[string]registry.SettingsDecoder{"fake": func(*registry.Route, *yaml.Node) (any, error) { return struct{}{}, nil }}
	cfg, err := registry.Load([]byte(data), decoders)
	if err != nil {
		t.Fatalf("Load: %v\n%s", err, data)
	}
	return cfg.Routes[0]
}

// TestProbeHost: the probe sends the route's first exact host as Host, or health.host when set, so a
// tenant that checks Host passes the gate; a route with only wildcard hosts sends the upstream's address.
func TestProbeHost(t *testing.T) {
	tests := []struct {
		name   string
		hosts  string
		health string
		want   string // the Host the tenant accepts; "" for the upstream's address
	}{
		{name: "the first exact host", hosts: `["*.example.com", app.example.com, www.example.com]`, health: "{path: /healthz}", want: "app.example.com"},
		{name: "health.host", hosts: "[app.example.com]", health: "{path: /healthz, host: internal.example.com:8443}", want: "internal.example.com:8443"},
		{name: "health.host on a wildcard route", hosts: `["*.example.com"]`, health: "{path: /healthz, host: probe.example.com}", want: "probe.example.com"},
		{name: "only wildcards: the upstream's address", hosts: `["*.example.com"]`, health: "{path: /healthz}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var seen, accept atomic.Value // accept: the handler is built before the upstream's address is known
			up := tcpServer(t, func(w http.ResponseWriter, r *http.Request) {
				allowHost(accept.Load().(string), &seen)(w, r)
			})
			want := tt.want
			if want == "" {
				want = up.Address
			}
			accept.Store(want)
			r := loadRoute(t, up, tt.hosts, tt.health)
			if err := newGate(t, r.Upstream, r.Health).Probe(t.Context()); err != nil {
				t.Errorf("Probe() = %v (Host %q), want a pass with Host %q", err, seen.Load(), want)
			}
		})
	}
}

// TestProbeHostOverUnix: over a unix socket the probe still sends the route's host; without one,
// localhost.
func TestProbeHostOverUnix(t *testing.T) {
	for _, tt := range []struct{ hosts, want string }{
		{"[app.example.com]", "app.example.com"},
		{`["*.example.com"]`, "localhost"},
	} {
		var seen atomic.Value
		up := unixServer(t, allowHost(tt.want, &seen))
		r := loadRoute(t, up, tt.hosts, "{path: /healthz}")
		if err := newGate(t, r.Upstream, r.Health).Probe(t.Context()); err != nil {
			t.Errorf("hosts %s: Probe() over unix = %v (Host %q), want a pass with Host %q", tt.hosts, err, seen.Load(), tt.want)
		}
	}
}
