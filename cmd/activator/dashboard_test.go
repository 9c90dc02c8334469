package main

// The dashboard (docs/dashboards/activator.json) and the alerting rules (docs/alerts.yml), checked
// against a real Prometheus: Debian's prometheus server scrapes a live activator (this test binary
// re-executed as `activator serve`) whose routes have woken, failed, slept and failed to sleep, and
// every panel's and every rule's PromQL must return data there. promtool lints /metrics, checks the
// rules and runs their unit tests (docs/alerts_test.yml).
//
// What "returns data" means:
//   - A panel's query (and the route variable's label_values) must return at least one series with a
//     finite value. The events happen after Prometheus has scraped the activator once, and again after a
//     second scrape, so rates and quantiles are numbers, not NaN.
//   - A rule's expression is normally empty when it does not fire, so each comparison in it is turned
//     into its `bool` form (`x > 30` becomes `x > bool 30`): that keeps every series the comparison is
//     applied to, with value 0 or 1, and must return at least one. A renamed metric empties it.
//   - Every activator_* metric name a panel or rule references must have series in Prometheus
//     (/api/v1/series), and be in docs/metrics.md; every metric in docs/metrics.md must be on the
//     dashboard.
//   - Prometheus loads docs/alerts.yml itself: every rule must evaluate with health "ok", and the four
//     alerts this scenario provokes (ActivatorWakeFailed for route broken, ActivatorSleepFailed for
//     route metal, ActivatorSleepForced for route stubborn, ActivatorFleetDegraded for route pool,
//     pending) must be active, with the route in their summary.
//
// The scenario: route web (exec, a healthy demo app) is woken by a held request, passes a WebSocket that
// its client closes, and is put to sleep through the admin API; route broken (exec, a demo app that exits 3 before listening) fails its wakes;
// route metal (redfish, on the simulated BMC of package redfishtest, whose node ignores
// GracefulShutdown) wakes and then fails to sleep; route stubborn (exec, a demo app that ignores
// SIGTERM) wakes and is killed at its sleep after stop_grace; route pool (exec, a fleet of two demo
// apps, min_ready 1, m2's executable gone) comes up without m2. The edge also serves TLS, from a
// certificate file and from ACME on a CA that nothing answers for, whose orders fail. Each of these happens twice, once on each side of a
// scrape, and web is woken a last time so that an instance is awake when the queries run.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/backend/redfish/redfishtest"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/testenv"
	"github.com/activator/activator/internal/tlsedge/tlstest"
)

const (
	dashboardPath  = "../../docs/dashboards/activator.json"
	alertsPath     = "../../docs/alerts.yml"
	alertsTestPath = "../../docs/alerts_test.yml"
	metricsDocPath = "../../docs/metrics.md"
)

// grafanaVars replaces the Grafana variables the dashboard's queries use. Every window is 5m: longer
// than this whole test, so a window always holds the scrapes from before and after the events.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m",
	"$__interval", "5m",
	"$__range", "5m",
	"${route}", ".*",
	"$route", ".*",
)

// dashboard is the part of a Grafana dashboard that these tests read.
type dashboard struct {
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
	Panels []dashPanel `json:"panels"`
}

type dashPanel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"` // a collapsed row's
}

// query is one PromQL expression found in the docs, and where.
type query struct {
	where string // "panel \"Wake latency…\" A", "rule ActivatorWakeFailed"
	expr  string // as written
}

// loadDashboard parses the dashboard and returns its panels' queries and its route variable's
// label_values definition.
func loadDashboard(t *testing.T) (dashboard, []query) {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	var qs []query
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, tg := range p.Targets {
				qs = append(qs, query{where: fmt.Sprintf("panel %q %s", p.Title, tg.RefID), expr: tg.Expr})
			}
		}
	}
	walk(d.Panels)
	return d, qs
}

// alertRules is docs/alerts.yml.
type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func loadAlerts(t *testing.T) alertRules {
	t.Helper()
	b, err := os.ReadFile(alertsPath)
	if err != nil {
		t.Fatal(err)
	}
	var a alertRules
	if err := yaml.Unmarshal(b, &a); err != nil {
		t.Fatalf("%s: %v", alertsPath, err)
	}
	return a
}

var (
	// metricNameRE finds the activator's metric names in PromQL.
	metricNameRE = regexp.MustCompile(`\bactivator_[a-z_]+[a-z]\b`)
	// metricRowRE is a row of docs/metrics.md's table.
	metricRowRE = regexp.MustCompile("^\\| `(activator_[a-z_]+)` \\|")
	// labelValuesRE is a Grafana query variable's definition.
	labelValuesRE = regexp.MustCompile(`^label_values\((\w+),\s*(\w+)\)$`)
)

// baseMetric strips a histogram's series suffix.
func baseMetric(name string) string {
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if strings.HasSuffix(name, s) && strings.HasSuffix(strings.TrimSuffix(name, s), "_seconds") {
			return strings.TrimSuffix(name, s)
		}
	}
	return name
}

// documentedMetrics returns the metric names of docs/metrics.md's table.
func documentedMetrics(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(metricsDocPath)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		if m := metricRowRE.FindStringSubmatch(line); m != nil {
			names = append(names, m[1])
		}
	}
	if len(names) == 0 {
		t.Fatalf("%s: no metric table found", metricsDocPath)
	}
	return names
}

// TestDashboardJSON checks the dashboard's shape without Prometheus: every panel with queries uses the
// datasource variable, panel ids are unique, every metric it names is documented and every documented
// metric is on it.
func TestDashboardJSON(t *testing.T) {
	d, qs := loadDashboard(t)
	if d.Title == "" {
		t.Error("the dashboard has no title")
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" || vars["route"] != "query" {
		t.Errorf("templating variables %v, want datasource (type datasource) and route (type query)", vars)
	}
	ids := map[int]string{}
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			walk(p.Panels)
			if prev, dup := ids[p.ID]; dup {
				t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
			}
			ids[p.ID] = p.Title
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no queries", p.Title)
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: datasource %+v, want uid ${datasource}", p.Title, p.Datasource)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q target %s has no expr", p.Title, tg.RefID)
				}
			}
		}
	}
	walk(d.Panels)

	documented := documentedMetrics(t)
	used := map[string]bool{}
	for _, q := range qs {
		for _, m := range metricNameRE.FindAllString(q.expr, -1) {
			used[baseMetric(m)] = true
			if !slices.Contains(documented, baseMetric(m)) {
				t.Errorf("%s: metric %s is not in %s", q.where, m, metricsDocPath)
			}
		}
	}
	for _, m := range documented {
		if !used[m] {
			t.Errorf("metric %s (in %s) is on no panel of the dashboard", m, metricsDocPath)
		}
	}
}

// TestAlertRulesPromtool runs `promtool check rules` over docs/alerts.yml and `promtool test rules`
// over docs/alerts_test.yml (one test per alert, firing and not firing), and checks that every alert
// has a for:, a severity, a summary and a description, and a unit test.
func TestAlertRulesPromtool(t *testing.T) {
	promtool := lookPrometheusTool(t, "promtool")
	a := loadAlerts(t)
	tests, err := os.ReadFile(alertsTestPath)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range a.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if r.For == "" {
				t.Errorf("alert %s has no for:", r.Alert)
			}
			if !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]) {
				t.Errorf("alert %s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s needs a summary and a description", r.Alert)
			}
			if !bytes.Contains(tests, []byte("alertname: "+r.Alert+"\n")) {
				t.Errorf("alert %s has no unit test in %s", r.Alert, alertsTestPath)
			}
		}
	}
	if n < 4 {
		t.Errorf("%s holds %d alerts, want at least 4 (failed wakes, slow wake p95, sleep failures, full hold)", alertsPath, n)
	}
	runPromtool(t, promtool, nil, "check", "rules", alertsPath)
	runPromtool(t, promtool, nil, "test", "rules", alertsTestPath)
}

// lookPrometheusTool finds a binary of Debian's prometheus package, or skips (fails when required).
func lookPrometheusTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		testenv.Missing(t, "%s not found (apt-get install prometheus): %v", name, err)
	}
	return p
}

// runPromtool runs promtool with args (stdin when non-nil) and fails the test with its output unless
// it exits 0.
func runPromtool(t *testing.T, promtool string, stdin []byte, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	cmd := exec.CommandContext(ctx, promtool, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		return
	}
	t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
}

// TestDashboardAndAlertsAgainstPrometheus: the live check described at the top of this file.
func TestDashboardAndAlertsAgainstPrometheus(t *testing.T) {
	t.Parallel()
	promBin := lookPrometheusTool(t, "prometheus")
	promtool := lookPrometheusTool(t, "promtool")
	d, panels := loadDashboard(t)
	rules := loadAlerts(t)
	alertsAbs, err := filepath.Abs(alertsPath)
	if err != nil {
		t.Fatal(err)
	}

	// The BMC of route metal: its node powers on, but ignores GracefulShutdown, so every sleep fails.
	bmc, err := redfishtest.New(redfishtest.Options{Systems: []redfishtest.System{{ID: "node-1", ServiceAddr: "127.0.0.1:0"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bmc.Close)
	bmc.SetIgnoreGraceful("node-1", true)

	web := appRoute{Name: "web"}
	broken := appRoute{Name: "broken", BackoffInitial: "20ms", BackoffMax: "40ms",
		Env: map[string]string{"DEMOAPP_EXIT_CODE": "3", "DEMOAPP_EXIT_MESSAGE": "demo: no database"}}
	stubborn := appRoute{Name: "stubborn", StopGrace: "100ms", Env: map[string]string{"DEMOAPP_IGNORE_TERM": "1"}}
	metal := fmt.Sprintf(`  - name: metal
    hosts: [metal.test]
    backing: redfish
    upstream: %q
    health: {path: /healthz, interval: 50ms}
    idle: 10m
    wake_budget: 30s
    sleep_budget: 10s
    redfish: {endpoint: %q, sleep: graceful, shutdown_grace: 200ms, poll_interval: 50ms}
    ignore: {preset: monitors}
`, bmc.ServiceAddr("node-1"), bmc.URL)
	// The TLS edge: a certificate file (activator_tls_certificate_expiry_timestamp_seconds) and ACME on a
	// CA that nothing answers for, whose orders for the routes' hosts fail (activator_tls_acme_*).
	ca := tlstest.NewCA(t)
	certs := ca.Write(t, t.TempDir(), "edge", tlstest.Leaf{Label: "edge", Names: []string{"files.test"}})
	deadCA := fmt.Sprintf("  acme: {ca: %q, storage: %q}\n", "https://"+freeLoopbackAddr(t)+"/directory", filepath.Join(t.TempDir(), "acme"))
	// The fleet of route pool (activator_fleet_*): up on m1, without m2, whose executable is gone.
	gone := goneCommand(t)
	pool := fleetRoute(t, "pool", fleetOpts{members: 2, minReady: 1, tag: uniqueTag(t), gone: gone})
	s := startServed(t, tlsTop(freeLoopbackAddr(t), []registry.CertFile{certs}, deadCA)+configYAML(t, web, broken, stubborn)+metal+pool)
	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}

	prom := startPrometheus(t, promBin, s.admin, alertsAbs)
	// A second Prometheus with native histograms on asks for protobuf first: the route series
	// reach it through Metrics.Handler's protobuf writer, and it must see what the first one sees.
	promPB := startPrometheus(t, promBin, s.admin, alertsAbs, "--enable-feature=native-histograms")
	start := time.Now()
	prom.waitScrape(start) // the baseline: every counter at 0, no histogram yet
	promPB.waitScrape(start)

	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	ctx, cancel := context.WithTimeout(context.Background(), 3*patience)
	defer cancel()
	for range 2 { // the second round's events are increases over the first's
		exerciseRoutes(ctx, t, s, hc, web, broken, stubborn)
		prom.waitScrape(time.Now())
	}
	// web awake again, so that "instances awake" has one; pool up without m2, so that the fleet
	// panels and ActivatorFleetDegraded have a member that is down.
	if a := getFresh(ctx, s.edge, web.host(), "/"); a.err != nil || a.code != http.StatusOK {
		t.Fatalf("GET web: %d %v, want 200", a.code, a.err)
	}
	if a := getFresh(ctx, s.edge, "pool.test", "/"); a.err != nil || a.code != http.StatusOK {
		t.Fatalf("GET pool: %d %v, want 200 from m1", a.code, a.err)
	}
	if rec := settledWake(t, s, "pool"); rollup(rec) != "up, error" {
		t.Fatalf("pool: rollup %q, want up, error", rollup(rec))
	}
	// Two scrapes after the last event: the first of them is surely stored once the second has begun.
	last := time.Now()
	prom.waitScrape(prom.waitScrape(last))
	promPB.waitScrape(promPB.waitScrape(last))
	for _, name := range []string{"activator_instance_state", "activator_held_requests", "activator_wake_joined_requests_total",
		"activator_sleep_failures_total", "activator_sleep_failing", "activator_sleeps_total", "activator_wakes_total",
		"activator_tunnels_open", "activator_tunnels_closed_total"} {
		text, pb := promValues(prom.query(name)), promValues(promPB.query(name))
		if len(text) == 0 || !maps.Equal(text, pb) {
			t.Errorf("%s: scraped as text %v, as protobuf %v; want the same, and some", name, text, pb)
		}
	}

	// promtool check metrics over the body Prometheus scraped.
	body := adminGet(t, hc, s.admin, "/metrics")
	runPromtool(t, promtool, body, "check", "metrics")

	// Every panel's query, and the route variable.
	referenced := map[string]bool{}
	absent := absentHostMetrics(body)
	for _, q := range panels {
		expr := grafanaVars.Replace(q.expr)
		skip := ""
		for _, m := range metricNameRE.FindAllString(expr, -1) {
			if absent[baseMetric(m)] {
				skip = m
				continue
			}
			referenced[m] = true
		}
		if skip != "" {
			t.Logf("%s: not checked: %s exists only where the host enables its cgroup controller, and this one does not", q.where, skip)
			continue
		}
		res := prom.query(expr)
		t.Logf("%s: %d series", q.where, len(res))
		switch {
		case len(res) == 0:
			t.Errorf("%s: no data for %s", q.where, expr)
		case !anyFinite(res):
			t.Errorf("%s: only NaN or Inf for %s: %v", q.where, expr, res)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValuesRE.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: definition %q, want label_values(metric, label)", v.Name, v.Definition)
			continue
		}
		referenced[m[1]] = true
		vals := prom.labelValues(m[2], m[1])
		for _, want := range []string{"web", "broken", "metal"} {
			if !slices.Contains(vals, want) {
				t.Errorf("variable %s: %s gives %v, want it to hold %s", v.Name, v.Definition, vals, want)
			}
		}
	}

	// Every rule's expression, with its comparisons made bool.
	var alertNames []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alertNames = append(alertNames, r.Alert)
			for _, m := range metricNameRE.FindAllString(r.Expr, -1) {
				referenced[m] = true
			}
			expr := boolComparisons(r.Expr)
			res := prom.query(expr)
			t.Logf("rule %s: %d series for %s", r.Alert, len(res), expr)
			if len(res) == 0 {
				t.Errorf("rule %s: no data for %s", r.Alert, expr)
				continue
			}
			if _, byRoute := res[0].Metric["route"]; byRoute {
				for _, k := range []string{"summary", "description"} {
					if !strings.Contains(r.Annotations[k], "$labels.route") {
						t.Errorf("rule %s: its %s does not name the route ({{ $labels.route }})", r.Alert, k)
					}
				}
			}
		}
	}

	// Every metric name referenced has series.
	names := slices.Sorted(maps.Keys(referenced))
	for _, m := range names {
		if len(prom.series(m)) == 0 {
			t.Errorf("metric %s, referenced by the dashboard or the rules, has no series in Prometheus", m)
		}
	}

	// Prometheus's own evaluation of the rules: all healthy, and the provoked alerts active.
	prom.waitRules(time.Now(), alertNames, map[string]string{"ActivatorWakeFailed": "broken", "ActivatorSleepFailed": "metal",
		"ActivatorSleepForced": "stubborn", "ActivatorFleetDegraded": "pool"})
}

// exerciseRoutes wakes web with a held request, opens a WebSocket to it and closes it, and puts web to
// sleep, fails a wake of broken, wakes metal and fails its sleep, after a monitor's request to metal
// that its ignore: filters, and wakes stubborn and forces its sleep. Each step waits for its own
// result.
func exerciseRoutes(ctx context.Context, t *testing.T, s *served, hc *http.Client, web, broken, stubborn appRoute) {
	t.Helper()
	if a := getFresh(ctx, s.edge, web.host(), "/"); a.err != nil || a.code != http.StatusOK {
		t.Fatalf("GET web: %d %v %q, want 200", a.code, a.err, a.body)
	}
	// A WebSocket through the edge to web's echo, which the client closes (activator_tunnels_*).
	ws, _, err := websocket.Dial(ctx, "ws://"+s.edge+"/ws", &websocket.DialOptions{Host: web.host()})
	if err != nil {
		t.Fatalf("WebSocket to web: %v", err)
	}
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
		t.Fatalf("WebSocket to web: %v", err)
	}
	if _, msg, err := ws.Read(ctx); err != nil || string(msg) != "hi" {
		t.Fatalf("WebSocket to web: echo %q, %v", msg, err)
	}
	if err := ws.Close(websocket.StatusNormalClosure, ""); err != nil {
		t.Fatalf("WebSocket to web: closing: %v", err)
	}
	if code, b := adminPost(t, hc, s.admin, "/routes/web/sleep"); code != http.StatusOK {
		t.Fatalf("admin sleep web: %d %s, want 200", code, b)
	}

	// broken: out of the backoff of its last failure first, so that this request starts a wake.
	s.waitStatus(broken.Name, "out of its wake backoff", func(st activator.Status) bool {
		return st.RetryAt == nil || time.Now().After(*st.RetryAt)
	})
	before := s.status(broken.Name).LastWake
	if a := getFresh(ctx, s.edge, broken.host(), "/"); a.err != nil || a.code != http.StatusServiceUnavailable {
		t.Fatalf("GET broken: %d %v %q, want 503", a.code, a.err, a.body)
	}
	if st := s.status(broken.Name); st.LastWake == nil || st.LastWake.Result != activator.ResultFailed || (before != nil && st.LastWake.ID == before.ID) {
		t.Fatalf("broken: last wake %+v (before %+v), want a new failed one", st.LastWake, before)
	}

	// An uptime monitor's request to metal, which its ignore: filters (activator_filtered_requests_total).
	if a := getAs(ctx, s.edge, "metal.test", "/", uptimeRobotUA); a.err != nil {
		t.Fatalf("GET metal as UptimeRobot: %v", a.err)
	}
	if code, b := adminPost(t, hc, s.admin, "/routes/metal/wake"); code != http.StatusOK {
		t.Fatalf("admin wake metal: %d %s, want 200", code, b)
	}
	if code, b := adminPost(t, hc, s.admin, "/routes/metal/sleep"); code == http.StatusOK {
		t.Fatalf("admin sleep metal: %d %s, want a failure (its node ignores GracefulShutdown)", code, b)
	}
	if st := s.status("metal"); st.LastSleepError == "" {
		t.Fatalf("metal: no last_sleep_error after a failed sleep: %+v", st)
	}

	if code, b := adminPost(t, hc, s.admin, "/routes/"+stubborn.Name+"/wake"); code != http.StatusOK {
		t.Fatalf("admin wake stubborn: %d %s, want 200", code, b)
	}
	if code, b := adminPost(t, hc, s.admin, "/routes/"+stubborn.Name+"/sleep"); code != http.StatusOK {
		t.Fatalf("admin sleep stubborn: %d %s, want 200 (killed after stop_grace)", code, b)
	}
}

// hostMetrics exist only where the host enables a cgroup controller for the tenants (docs/exec.md,
// Containment): on a host without it, their panels cannot have data.
var hostMetrics = []string{"activator_tenant_memory_bytes", "activator_tenant_pids"}

// absentHostMetrics returns the hostMetrics that the /metrics body lacks.
func absentHostMetrics(body []byte) map[string]bool {
	out := map[string]bool{}
	for _, m := range hostMetrics {
		if !bytes.Contains(body, []byte("\n"+m+"{")) {
			out[m] = true
		}
	}
	return out
}

func adminGet(t *testing.T, hc *http.Client, admin, path string) []byte {
	t.Helper()
	resp, err := hc.Get("http://" + admin + path)
	if err != nil {
		t.Fatalf("admin GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("admin GET %s: %d %v", path, resp.StatusCode, err)
	}
	return b
}

// adminPost sends an admin action (JSON content type: the admin API's CSRF check) and returns the
// status code and body.
func adminPost(t *testing.T, hc *http.Client, admin, path string) (int, string) {
	t.Helper()
	resp, err := hc.Post("http://"+admin+path, "application/json", nil)
	if err != nil {
		t.Fatalf("admin POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("admin POST %s: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

// boolComparisons rewrites each comparison operator of expr outside label matchers and strings to its
// bool form, so that the expression keeps every series it compares (with 0 or 1) instead of filtering.
func boolComparisons(expr string) string {
	var b strings.Builder
	braces, brackets := 0, 0
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(expr) && expr[j] != c {
				if expr[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			b.WriteString(expr[i:min(j+1, len(expr))])
			i = j
			continue
		case c == '{':
			braces++
		case c == '}':
			braces--
		case c == '[':
			brackets++
		case c == ']':
			brackets--
		}
		if braces > 0 || brackets > 0 {
			b.WriteByte(c)
			continue
		}
		op := ""
		for _, o := range []string{"==", "!=", ">=", "<=", ">", "<"} {
			if strings.HasPrefix(expr[i:], o) {
				op = o
				break
			}
		}
		if op == "" {
			b.WriteByte(c)
			continue
		}
		b.WriteString(op)
		i += len(op) - 1
		if rest := strings.TrimLeft(expr[i+1:], " \t\n"); !strings.HasPrefix(rest, "bool") {
			b.WriteString(" bool")
		}
	}
	return b.String()
}

func TestAlertExprBoolComparisons(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`x > 0`, `x > bool 0`},
		{`sum by (route) (increase(a{result="failed",b!="x>y"}[15m])) > 0`, `sum by (route) (increase(a{result="failed",b!="x>y"}[15m])) > bool 0`},
		{`a{c=~"x"} >= 8000`, `a{c=~"x"} >= bool 8000`},
		{`a == bool 1`, `a == bool 1`},
		{`a != 1 and b <= 2`, `a != bool 1 and b <= bool 2`},
	} {
		if got := boolComparisons(tc.in); got != tc.want {
			t.Errorf("boolComparisons(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// promSample is one series of a query's result.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func anyFinite(res []promSample) bool {
	for _, s := range res {
		v, ok := s.Value[1].(string)
		if !ok {
			continue
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsNaN(f) && !math.IsInf(f, 0) {
			return true
		}
	}
	return false
}

// promServer is a prometheus process started by startPrometheus.
type promServer struct {
	t      *testing.T
	base   string // http://host:port
	hc     *http.Client
	exited chan struct{} // closed once the process has been waited for
}

// startPrometheus runs prometheus scraping target (host:port, /metrics) every second and evaluating
// rulesFile every second, on a fresh TSDB, and returns once it is ready. It is killed at cleanup; its
// log is printed if the test failed.
// promValues is an instant query's result as its label sets (printed) → value.
func promValues(res []promSample) map[string]string {
	out := map[string]string{}
	for _, r := range res {
		out[fmt.Sprint(r.Metric)] = fmt.Sprint(r.Value[1])
	}
	return out
}

func startPrometheus(t *testing.T, bin, target, rulesFile string, flags ...string) *promServer {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	conf := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: activator
    static_configs:
      - targets: [%q]
`, rulesFile, target)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeLoopbackAddr(t)
	cmd := exec.Command(bin, append([]string{"--config.file=" + cfg, "--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr, "--log.level=warn"}, flags...)...)
	out := &testenv.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("prometheus log:\n%s", out.String())
		}
	})
	p := &promServer{t: t, base: "http://" + addr, hc: &http.Client{Transport: &http.Transport{}, Timeout: patience}, exited: exited}
	t.Cleanup(p.hc.CloseIdleConnections)
	p.poll("ready", func() (bool, string) {
		resp, err := p.hc.Get(p.base + "/-/ready")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return p
}

// poll calls cond every 50ms until it holds, failing the test after patience or when prometheus
// exits. cond returns whether it holds, and what it saw (for the failure message).
func (p *promServer) poll(what string, cond func() (bool, string)) {
	p.t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(patience)
	defer deadline.Stop()
	for {
		ok, last := cond()
		if ok {
			return
		}
		select {
		case <-tick.C:
		case <-p.exited:
			p.t.Fatalf("prometheus exited while waiting until %s (last: %s)", what, last)
		case <-deadline.C:
			p.t.Fatalf("prometheus: not %s within %v (last: %s)", what, patience, last)
		}
	}
}

// api GETs a Prometheus API path and decodes its data into v.
func (p *promServer) api(path string, params url.Values, v any) error {
	resp, err := p.hc.Get(p.base + path + "?" + params.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return fmt.Errorf("%s: %s: %w", path, resp.Status, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s: %s", path, resp.Status, env.Error)
	}
	return json.Unmarshal(env.Data, v)
}

// waitScrape waits until the activator's target is up with a scrape that began after after, and
// returns that scrape's start.
func (p *promServer) waitScrape(after time.Time) time.Time {
	p.t.Helper()
	var at time.Time
	p.poll("scraped the activator after "+after.Format(time.StampMilli), func() (bool, string) {
		var data struct {
			ActiveTargets []struct {
				Health     string    `json:"health"`
				LastError  string    `json:"lastError"`
				LastScrape time.Time `json:"lastScrape"`
			} `json:"activeTargets"`
		}
		if err := p.api("/api/v1/targets", url.Values{"state": {"active"}}, &data); err != nil {
			return false, err.Error()
		}
		if len(data.ActiveTargets) != 1 {
			return false, fmt.Sprintf("%d targets", len(data.ActiveTargets))
		}
		tg := data.ActiveTargets[0]
		at = tg.LastScrape
		return tg.Health == "up" && tg.LastScrape.After(after), fmt.Sprintf("health %s, last scrape %v, error %q", tg.Health, tg.LastScrape, tg.LastError)
	})
	return at
}

// query runs an instant query and returns its result (a scalar as one sample), failing the test when
// Prometheus rejects the query.
func (p *promServer) query(expr string) []promSample {
	p.t.Helper()
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := p.api("/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		p.t.Errorf("query %s: %v", expr, err)
		return nil
	}
	switch data.ResultType {
	case "vector":
		var res []promSample
		if err := json.Unmarshal(data.Result, &res); err != nil {
			p.t.Errorf("query %s: %v", expr, err)
		}
		return res
	case "scalar":
		var v [2]any
		if err := json.Unmarshal(data.Result, &v); err != nil {
			p.t.Errorf("query %s: %v", expr, err)
		}
		return []promSample{{Value: v}}
	}
	p.t.Errorf("query %s: result type %s, want vector or scalar", expr, data.ResultType)
	return nil
}

// series returns the label sets of the series named metric.
func (p *promServer) series(metric string) []map[string]string {
	p.t.Helper()
	var data []map[string]string
	if err := p.api("/api/v1/series", url.Values{"match[]": {metric}}, &data); err != nil {
		p.t.Errorf("series %s: %v", metric, err)
	}
	return data
}

// labelValues is Grafana's label_values(metric, label).
func (p *promServer) labelValues(label, metric string) []string {
	p.t.Helper()
	var data []string
	if err := p.api("/api/v1/label/"+label+"/values", url.Values{"match[]": {metric}}, &data); err != nil {
		p.t.Errorf("label values %s of %s: %v", label, metric, err)
	}
	return data
}

// waitRules waits until Prometheus has evaluated every rule of names after after, each healthy, and
// each alert of active is active (pending or firing) for its route with the route in its summary.
func (p *promServer) waitRules(after time.Time, names []string, active map[string]string) {
	p.t.Helper()
	type alert struct {
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
		State       string            `json:"state"`
	}
	p.poll("evaluated the rules", func() (bool, string) {
		var data struct {
			Groups []struct {
				Rules []struct {
					Name           string    `json:"name"`
					Health         string    `json:"health"`
					LastError      string    `json:"lastError"`
					LastEvaluation time.Time `json:"lastEvaluation"`
					Alerts         []alert   `json:"alerts"`
				} `json:"rules"`
			} `json:"groups"`
		}
		if err := p.api("/api/v1/rules", url.Values{"type": {"alert"}}, &data); err != nil {
			return false, err.Error()
		}
		seen := map[string]bool{}
		for _, g := range data.Groups {
			for _, r := range g.Rules {
				seen[r.Name] = true
				if r.Health == "err" {
					p.t.Fatalf("rule %s: %s", r.Name, r.LastError)
				}
				if r.Health != "ok" || !r.LastEvaluation.After(after) {
					return false, fmt.Sprintf("rule %s: health %s, last evaluation %v", r.Name, r.Health, r.LastEvaluation)
				}
				if route, ok := active[r.Name]; ok {
					found := false
					for _, a := range r.Alerts {
						if a.Labels["route"] == route && (a.State == "firing" || a.State == "pending") {
							found = true
							if !strings.Contains(a.Annotations["summary"], route) {
								p.t.Fatalf("alert %s: summary %q does not name route %s", r.Name, a.Annotations["summary"], route)
							}
						}
					}
					if !found {
						return false, fmt.Sprintf("alert %s: not active for route %s: %+v", r.Name, route, r.Alerts)
					}
				}
			}
		}
		for _, n := range names {
			if !seen[n] {
				return false, "rule " + n + " not loaded"
			}
		}
		return true, ""
	})
}
