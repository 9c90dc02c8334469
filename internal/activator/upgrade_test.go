package activator

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/activator/activator/internal/registry"
)

// TestNoHTTPUpgradeAskedOfTenant: an Upgrade to h2c (or h2, or HTTP/x) never reaches the tenant; the
// request goes on as a plain one, its body with it, and the client gets the tenant's plain answer.
// WebSocket upgrades, and the rest of a list that named h2c beside them, pass as they came. On
// 59746f8 the tenant was sent "Upgrade: h2c" and HTTP2-Settings, and hypercorn upgraded on them
// (TestH2CSmugglingStopped in cmd/activator has that end to end). On both paths: the loop hands each
// upgrade back to net/http.
func TestNoHTTPUpgradeAskedOfTenant(t *testing.T) {
	type seen struct {
		upgrade, connection, settings, body string
	}
	got := make(chan seen, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Header.Get("Upgrade"), strings.Join(r.Header["Connection"], ","), r.Header.Get("Http2-Settings"), string(b)}
		io.WriteString(w, "plain")
	}))
	t.Cleanup(up.Close)
	r := testRoute("app")
	r.Hosts = []string{"app.test"}
	r.Upstream.Address = up.Listener.Addr().String()
	e := newConformEdge(t, conformConfig{routes: []*registry.Route{r}})
	const settings = "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
	for _, tc := range []struct {
		name, fields string
		want         seen
	}{
		{"h2c, as RFC 7540 asks", "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n" + settings, seen{}},
		{"h2c, settings not a connection option", "Connection: Upgrade\r\nUpgrade: h2c\r\n" + settings, seen{}},
		{"h2c in capitals, keep-alive kept", "Connection: keep-alive, upgrade\r\nUpgrade: H2C\r\n" + settings, seen{}},
		{"h2", "Connection: Upgrade\r\nUpgrade: h2\r\n", seen{}},
		{"HTTP/2.0", "Connection: Upgrade\r\nUpgrade: HTTP/2.0\r\n" + settings, seen{}},
		{"h2c then websocket", "Connection: Upgrade\r\nUpgrade: h2c, websocket\r\n" + settings, seen{upgrade: "websocket", connection: "Upgrade"}},
		{"websocket alone", "Connection: Upgrade\r\nUpgrade: websocket\r\n", seen{upgrade: "websocket", connection: "Upgrade"}},
	} {
		for _, method := range []string{"GET", "POST"} {
			for _, p := range edgePaths {
				t.Run(p.name+" "+method+" "+tc.name, func(t *testing.T) {
					raw := method + " /x HTTP/1.1\r\nHost: app.test\r\n" + tc.fields
					want := tc.want
					if method == "POST" {
						raw += "Content-Length: 4\r\n\r\nbody"
						want.body = "body"
					} else {
						raw += "\r\n"
					}
					resp, body := e.exchange(t, p, raw)
					s := <-got
					if s != want {
						t.Errorf("the tenant saw %+v, want %+v", s, want)
					}
					if resp.StatusCode != http.StatusOK || body != "plain" {
						t.Errorf("answer %d %q, want 200 %q", resp.StatusCode, body, "plain")
					}
				})
			}
		}
	}
}

// FuzzWithoutHTTPUpgrade: for any Upgrade and Connection values, withoutHTTPUpgrade leaves the request
// it was given untouched, and returns one whose Upgrade names no HTTP protocol, keeps every other token
// in order, has no HTTP2-Settings once a token went, and, with no token left, no Upgrade and no
// "upgrade" connection option.
func FuzzWithoutHTTPUpgrade(f *testing.F) {
	for _, s := range [][2]string{
		{"h2c", "Upgrade, HTTP2-Settings"}, {"websocket", "Upgrade"}, {"h2c, websocket", "keep-alive, upgrade"},
		{"HTTP/2.0, ,tcp", "Upgrade"}, {"H2C", ""}, {"h2", "close"}, {"http", "Upgrade,,x-hop"},
	} {
		f.Add(s[0], s[1])
	}
	tokens := func(vv []string) []string {
		var out []string
		for _, v := range vv {
			for t := range strings.SplitSeq(v, ",") {
				if t = textproto.TrimString(t); t != "" { // as withoutHTTPUpgrade and the ReverseProxy trim
					out = append(out, t)
				}
			}
		}
		return out
	}
	f.Fuzz(func(t *testing.T, upgrade, connection string) {
		r, err := http.NewRequest(http.MethodGet, "http://app.test/", nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Header = http.Header{"Upgrade": {upgrade}, "Connection": {connection}, "Http2-Settings": {"AAMAAABkAARAAAAAAAIAAAAA"}}
		before := r.Header.Clone()
		got := withoutHTTPUpgrade(r)
		if !reflect.DeepEqual(r.Header, before) {
			t.Fatalf("the request given was changed: %q, was %q", r.Header, before)
		}
		var want []string
		for _, tok := range tokens([]string{upgrade}) {
			if !httpUpgrade(tok) {
				want = append(want, tok)
			}
		}
		if got == r {
			if len(want) != len(tokens([]string{upgrade})) {
				t.Fatalf("Upgrade %q: request returned unchanged", upgrade)
			}
			return
		}
		if kept := tokens(got.Header["Upgrade"]); !slices.Equal(kept, want) {
			t.Errorf("Upgrade %q became %q, want tokens %q", upgrade, got.Header["Upgrade"], want)
		}
		if got.Header["Http2-Settings"] != nil {
			t.Errorf("Upgrade %q: HTTP2-Settings kept", upgrade)
		}
		if len(want) == 0 {
			if got.Header["Upgrade"] != nil {
				t.Errorf("Upgrade %q: Upgrade kept as %q", upgrade, got.Header["Upgrade"])
			}
			for _, tok := range tokens(got.Header["Connection"]) {
				if strings.EqualFold(tok, "upgrade") {
					t.Errorf("Upgrade %q, Connection %q: became %q", upgrade, connection, got.Header["Connection"])
				}
			}
		}
	})
}
