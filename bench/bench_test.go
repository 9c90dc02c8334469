package main

import (
	"math"
	"os"
	"strings"
	"testing"

	"github.com/activator/activator/internal/backend/exec"
	"github.com/activator/activator/internal/backend/unit"
	"github.com/activator/activator/internal/registry"
)

func TestParseWrk(t *testing.T) {
	out := `Running 5s test @ http://127.0.0.1:8080/
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   208.00us   67.87us   2.38ms   83.45%
    Req/Sec    76.21k     2.15k   80.18k    72.00%
  Latency Distribution
     50%  195.00us
     75%  227.00us
     90%  276.00us
     99%    1.45ms
  379215 requests in 5.00s, 51.02MB read
  Socket errors: connect 0, read 2, write 1, timeout 3
  Non-2xx or 3xx responses: 12
Requests/sec:  75841.31
Transfer/sec:     10.20MB
`
	r, err := parseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	want := wrkResult{RPS: 75841.31, P50: 195, P99: 1450, Requests: 379215, Errors: 18, Timeouts: 3}
	if r != want {
		t.Errorf("parseWrk = %+v, want %+v", r, want)
	}
	if _, err := parseWrk("unable to connect to 127.0.0.1:1 Connection refused\n"); err == nil {
		t.Error("parseWrk accepted output without results")
	}
}

func TestParseWrkDuration(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
	}{{"195.00us", 195}, {"1.23ms", 1230}, {"2.00s", 2e6}, {"1.50m", 90e6}} {
		got, err := parseWrkDuration(tc.in)
		if err != nil || math.Abs(got-tc.want) > 1e-6 {
			t.Errorf("parseWrkDuration(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	if _, err := parseWrkDuration("fast"); err == nil {
		t.Error("parseWrkDuration accepted garbage")
	}
}

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want Stat
	}{
		{[]float64{3, 1, 2}, Stat{Median: 2, Min: 1, Max: 3, N: 3}},
		{[]float64{4, 1, 3, 2}, Stat{Median: 2.5, Min: 1, Max: 4, N: 4}},
		{[]float64{math.NaN(), 5}, Stat{Median: 5, Min: 5, Max: 5, N: 1}},
	} {
		if got := summarize(tc.in); got != tc.want {
			t.Errorf("summarize(%v) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
	if s := summarize(nil); s.valid() || !math.IsNaN(s.Median) {
		t.Errorf("summarize(nil) = %+v, want invalid", s)
	}
	// Ratios pair run i with run i.
	if got := ratios([]float64{10, 30, 20}, []float64{5, 10, 10}); got != (Stat{Median: 2, Min: 2, Max: 3, N: 3}) {
		t.Errorf("ratios = %+v", got)
	}
	if got := percentile([]float64{5, 1, 4, 2, 3}, 50); got != 3 {
		t.Errorf("percentile 50 = %v, want 3", got)
	}
}

func TestStatJSONNaN(t *testing.T) {
	b, err := summarize(nil).MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"median":null,"min":null,"max":null,"n":0}`; string(b) != want {
		t.Errorf("got %s, want %s", b, want)
	}
}

// The generated configs must pass the activator's own validation (with the real exec decoder).
func TestRenderConfigValidates(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := renderConfig(18080, 19090, []routeSpec{
		{name: "a", hosts: []string{"a.localhost", "127.0.0.1"}, port: 20001, argv: []string{self, "app"}},
		{name: "b", hosts: []string{"b.localhost"}, port: 20002, listen: "listen_fds", argv: []string{"/bin/sh", "-c", "read _ < '/tmp/x y'; exec app"},
			maxHeld: 11000, budget: "10m", env: map[string]string{"DEMOAPP_BODY": "hi: there"}},
	})
	c, err := registry.Load([]byte(cfg), map[string]registry.SettingsDecoder{"exec": exec.Decode})
	if err != nil {
		t.Fatalf("generated config rejected: %v\n%s", err, cfg)
	}
	if len(c.Routes) != 2 || c.Routes[1].Hold.MaxRequests != 11000 || c.Listen != "127.0.0.1:18080" {
		t.Errorf("unexpected config: %+v", c)
	}
	s := c.Routes[1].Settings.(*exec.Settings)
	if s.Listen != exec.ListenFDs || s.Env["DEMOAPP_BODY"] != "hi: there" || !strings.Contains(s.Argv[2], "'/tmp/x y'") {
		t.Errorf("exec settings = %+v", s)
	}
}

func TestMetricValue(t *testing.T) {
	text := "# HELP go_memstats_heap_inuse_bytes x\n# TYPE go_memstats_heap_inuse_bytes gauge\ngo_memstats_heap_inuse_bytes 1.2345e+07\ngo_memstats_heap_inuse_bytes_total 3\n"
	if got := metricValue(text, "go_memstats_heap_inuse_bytes"); got != 1.2345e7 {
		t.Errorf("metricValue = %v", got)
	}
	if got := metricValue(text, "absent"); !math.IsNaN(got) {
		t.Errorf("metricValue(absent) = %v, want NaN", got)
	}
}

func TestTailExpect(t *testing.T) {
	var tl tail
	seen := tl.expect("config reloaded")
	_, _ = tl.Write([]byte("level=INFO msg=other\n"))
	select {
	case <-seen:
		t.Fatal("matched the wrong line")
	default:
	}
	_, _ = tl.Write([]byte("level=INFO msg=\"config reloaded\" routes=3\n"))
	select {
	case <-seen:
	default:
		t.Fatal("marker not seen")
	}
}

func TestUnitConfigValidates(t *testing.T) {
	routes := []unitRoute{
		{name: "unit", unit: "ua-app.service", sleep: "stop", port: 20001},
		{name: "unit-sigstop", unit: "ss-app.service", sleep: "sigstop", port: 20002},
		{name: "unit-freeze", unit: "fz-app.service", sleep: "freeze", port: 20003},
	}
	cfg := renderUnitConfig(18080, 19090, "unix:path=/tmp/x y/systemd/private", routes)
	c, err := registry.Load([]byte(cfg), map[string]registry.SettingsDecoder{"unit": unit.Decode})
	if err != nil {
		t.Fatalf("generated unit config rejected: %v\n%s", err, cfg)
	}
	if len(c.Routes) != len(routes) {
		t.Fatalf("got %d routes, want %d", len(c.Routes), len(routes))
	}
	for i, r := range routes {
		s := c.Routes[i].Settings.(*unit.Settings)
		if c.Routes[i].Name != r.name || s.Unit != r.unit || string(s.Sleep) != r.sleep || s.Bus != "unix:path=/tmp/x y/systemd/private" {
			t.Errorf("route %d: %s %+v, want %+v", i, c.Routes[i].Name, s, r)
		}
	}
}
