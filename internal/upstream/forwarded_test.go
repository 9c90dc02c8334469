package upstream

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"testing"
)

// TestForwardingFields: the forwarding fields for what the equivalence cases cannot send: TLS, a
// zoned peer, no trust function, and a peer asked about only when its request carries such a field.
func TestForwardingFields(t *testing.T) {
	for _, tc := range []struct {
		name      string
		peer      string
		tls       bool
		header    http.Header
		trusted   func(netip.Addr) bool
		want      []string
		wantAsked bool
	}{
		{name: "over TLS", peer: "198.51.100.7:4711", tls: true,
			want: []string{"X-Forwarded-For: 198.51.100.7", "X-Forwarded-Host: app.test", "X-Forwarded-Proto: https", "Forwarded: for=198.51.100.7;host=app.test;proto=https"}},
		{name: "zoned peer", peer: "[fe80::1%eth0]:4711",
			want: []string{"X-Forwarded-For: fe80::1%eth0", "X-Forwarded-Host: app.test", "X-Forwarded-Proto: http", `Forwarded: for="[fe80::1%eth0]";host=app.test;proto=http`}},
		{name: "no trust function", peer: "192.0.2.10:4711", header: http.Header{"X-Forwarded-For": {"203.0.113.9"}},
			want: []string{"X-Forwarded-For: 192.0.2.10", "X-Forwarded-Host: app.test", "X-Forwarded-Proto: http", "Forwarded: for=192.0.2.10;host=app.test;proto=http"}},
		{name: "trusted proxy over TLS keeps its proto", peer: "192.0.2.10:4711", tls: true, trusted: testTrusted,
			header:    http.Header{"X-Forwarded-Proto": {"http"}},
			want:      []string{"X-Forwarded-For: 192.0.2.10", "X-Forwarded-Host: app.test", "X-Forwarded-Proto: http", "Forwarded: for=192.0.2.10;host=app.test;proto=http"},
			wantAsked: true},
		{name: "zoned trusted peer", peer: "[2001:db8::1%eth0]:4711", trusted: testTrusted, header: http.Header{"Forwarded": {"for=_hidden"}},
			want:      []string{"X-Forwarded-For: 2001:db8::1%eth0", "X-Forwarded-Host: app.test", "X-Forwarded-Proto: http", `Forwarded: for=_hidden, for="[2001:db8::1%eth0]"`},
			wantAsked: true},
		{name: "nothing to trust", peer: "192.0.2.10:4711", trusted: testTrusted, header: http.Header{"X-Other": {"1"}},
			want: []string{"X-Forwarded-For: 192.0.2.10", "X-Forwarded-Host: app.test", "X-Forwarded-Proto: http", "Forwarded: for=192.0.2.10;host=app.test;proto=http"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "http://app.test/", nil)
			r.RemoteAddr, r.Header = tc.peer, tc.header
			if tc.tls {
				r.TLS = &tls.ConnectionState{}
			}
			asked := false
			trusted := tc.trusted
			if trusted != nil {
				trusted = func(a netip.Addr) bool { asked = true; return tc.trusted(a) }
			}
			fw := newForwarding(r, trusted)
			var got []string
			fw.fields(func(name, value string) { got = append(got, name+": "+value) })
			if !slices.Equal(got, tc.want) {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
			if asked != tc.wantAsked {
				t.Errorf("trust asked: %v, want %v", asked, tc.wantAsked)
			}
		})
	}
}
