package activator

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/activator/activator/internal/registry"
)

// TestFailedSleepIsReported: a sleep the backing cannot do (a freeze the host does not support, a node
// that will not power off) is not reported as done. The admin sleep answers 502 with the backing's
// reason, the status and a counter keep it until a sleep succeeds, and the route is awake after it.
func TestFailedSleepIsReported(t *testing.T) {
	b := &fakeBackend{sleepErr: errors.New("unit app.service: freeze: not supported by this host's systemd")}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	s := New(Options{
		Opener:  fakeProvider{b},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} },
		Metrics: m,
	})
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("app")}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	admin := httptest.NewServer(s.AdminHandler(nil, nil))
	t.Cleanup(admin.Close)
	post := func(path string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, admin.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(CSRFHeader, "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		return resp.StatusCode, body
	}

	if code, body := post("/routes/app/wake"); code != http.StatusOK {
		t.Fatalf("wake: %d %v", code, body)
	}
	code, body := post("/routes/app/sleep")
	msg, _ := body["error"].(string)
	if code != http.StatusBadGateway || !strings.Contains(msg, `route "app": sleep (admin) failed`) || !strings.Contains(msg, "not supported by this host") {
		t.Errorf("failed sleep answered %d %q, want 502 naming the route and the backing's reason", code, msg)
	}
	st := s.instance("app").status()
	// The tenant still runs, so the route is taking it back (waking) or has (awake), never asleep.
	if (st.State != "waking" && st.State != "awake") || !strings.Contains(st.LastSleepError, "not supported by this host") {
		t.Errorf("status after the failed sleep: state %s, last_sleep_error %q", st.State, st.LastSleepError)
	}
	if got := counterValue(t, m.Gatherer(reg), "activator_sleep_failures_total"); got != 1 {
		t.Errorf("activator_sleep_failures_total = %v, want 1", got)
	}
	// A failed sleep is not a sleep (it was counted as one, under its reason).
	if got := counterSum(t, m.Gatherer(reg), "activator_sleeps_total"); got != 0 {
		t.Errorf("activator_sleeps_total summed over reasons = %v after a failed sleep, want 0", got)
	}

	// The next wake takes the tenant as it is; a sleep that succeeds clears the failure.
	b.set(func(f *fakeBackend) { f.sleepErr = nil })
	if code, body := post("/routes/app/wake"); code != http.StatusOK {
		t.Fatalf("wake after the failed sleep: %d %v", code, body)
	}
	if code, body := post("/routes/app/sleep"); code != http.StatusOK {
		t.Fatalf("sleep: %d %v", code, body)
	}
	if st := s.instance("app").status(); st.LastSleepError != "" {
		t.Errorf("last_sleep_error %q after a sleep that succeeded, want none", st.LastSleepError)
	}
}

// counterValue is the value of the named counter's one series in g (0 when it has none).
func counterValue(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// counterSum is the sum of a counter family's series.
func counterSum(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestForcedSleepIsCounted: a sleep the backing did only by force (tenant.NoteForcedSleep) succeeds,
// is marked forced in its record and counted in activator_sleeps_forced_total; a sleep with a plain
// note is neither, and a forced attempt that still failed is a failure, not a forced sleep.
func TestForcedSleepIsCounted(t *testing.T) {
	b := &fakeBackend{}
	s, g := newMetricsServer(t, b, testRoute("app"))
	in := s.instance("app")
	sleep := func(force bool, fail error) *SleepRecord {
		t.Helper()
		if err := s.Wake(context.Background(), "app"); err != nil {
			t.Fatal(err)
		}
		b.set(func(f *fakeBackend) { f.sleepSay, f.forceSay, f.sleepErr = []string{"a note"}, force, fail })
		if err := s.Sleep(context.Background(), "app"); (err != nil) != (fail != nil) {
			t.Fatalf("Sleep = %v, want the error %v", err, fail)
		}
		return newestSleep(t, in)
	}
	forced := func() float64 { return counterValue(t, g, "activator_sleeps_forced_total") }

	if rec := sleep(false, nil); rec.Forced || forced() != 0 {
		t.Errorf("a sleep with a plain note: forced %v, activator_sleeps_forced_total %v; want neither", rec.Forced, forced())
	}
	if rec := sleep(true, nil); !rec.Forced || rec.Result != ResultOK || forced() != 1 {
		t.Errorf("a forced sleep: record %+v, activator_sleeps_forced_total %v; want forced, ok, 1", rec, forced())
	}
	if rec := sleep(true, errors.New("still on after ForceOff")); rec.Forced || rec.Result != ResultFailed || forced() != 1 {
		t.Errorf("a forced sleep that failed: record %+v, activator_sleeps_forced_total %v; want failed, not forced, 1", rec, forced())
	}
}
