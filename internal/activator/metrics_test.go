package activator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// newMetricsServer is newTestServer with a real Metrics registry, and returns what gathers all of its
// metrics. The registry is pedantic: it checks every collected series against its description.
func newMetricsServer(t *testing.T, b *fakeBackend, routes ...*registry.Route) (*Server, prometheus.Gatherer) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	s := New(Options{
		Opener:  fakeProvider{b},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} },
		Metrics: m,
	})
	if err := s.Apply(&registry.Config{Routes: routes}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s, m.Gatherer(reg)
}

// routeSeries gathers g and returns route's series as `name{label="value",…}` (the route label left
// out, labels sorted) → value; a histogram is its _count.
func routeSeries(t *testing.T, g prometheus.Gatherer, route string) map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			mine := false
			for _, l := range m.GetLabel() {
				if l.GetName() == "route" {
					mine = l.GetValue() == route
					continue
				}
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			if !mine {
				continue
			}
			slices.Sort(labels)
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			name := mf.GetName()
			if h := m.GetHistogram(); h != nil {
				v, name = float64(h.GetSampleCount()), name+"_count"
			}
			out[name+"{"+strings.Join(labels, ",")+"}"] = v
		}
	}
	return out
}

// wantValues checks that got has each series of want, with its value.
func wantValues(t *testing.T, got, want map[string]float64, when string) {
	t.Helper()
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s: %s = %v (present %v), want %v", when, k, g, ok, w)
		}
	}
}

// wantRetired fails the test unless in has retired.
func wantRetired(t *testing.T, in *instance) {
	t.Helper()
	select {
	case <-in.retired:
	default:
		t.Fatalf("the instance of %s did not retire", in.route.Name)
	}
}

// stateSeries returns the states route has a series for in activator_instance_state.
func stateSeries(series map[string]float64) []string {
	var out []string
	for k := range series {
		if s, ok := strings.CutPrefix(k, "activator_instance_state{state="); ok {
			out = append(out, strings.Trim(s, `"}`))
		}
	}
	slices.Sort(out)
	return out
}

// TestRouteSeriesExistFromStart: every series of a route whose labels are fixed is there, at 0, from the
// moment the route is configured, so `increase(…[1h]) > 0` alerts see the first event.
func TestRouteSeriesExistFromStart(t *testing.T) {
	_, reg := newMetricsServer(t, &fakeBackend{}, testRoute("app"))
	got := routeSeries(t, reg, "app")
	// Histograms and activator_requests_total appear at their first observation (docs/metrics.md).
	want := map[string]float64{
		`activator_instance_state{state="asleep"}`: 1,
		`activator_held_requests{}`:                0,
		`activator_wake_joined_requests_total{}`:   0,
		`activator_sleep_failures_total{}`:         0,
		`activator_sleep_failing{}`:                0,
		`activator_sleeps_total{reason="idle"}`:    0,
		`activator_sleeps_total{reason="admin"}`:   0,
		`activator_sleeps_total{reason="exited"}`:  0,
		`activator_sleeps_total{reason="reload"}`:  0,
		`activator_sleeps_forced_total{}`:          0,
		`activator_wakes_total{result="ok"}`:       0,
		`activator_wakes_total{result="failed"}`:   0,
	}
	wantValues(t, got, want, "from the start")
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected series %s at the start", k)
		}
	}
}

// TestRemovedRouteLeavesNoSeries: a route removed while awake takes every one of its series with it,
// once its instance has put the tenant to sleep and retired.
func TestRemovedRouteLeavesNoSeries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		s, reg := newMetricsServer(t, b, testRoute("app"), testRoute("other"))
		in := s.instance("app")
		if err := in.wakeNow(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := stateSeries(routeSeries(t, reg, "app")); !slices.Equal(got, []string{"awake"}) {
			t.Fatalf("state series %v while awake, want [awake]", got)
		}
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("other")}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		wantRetired(t, in)
		// A request that found the old table gets ErrClosed from the retired instance; its 503 must not
		// bring a series back.
		in.count(503)
		if got := routeSeries(t, reg, "app"); len(got) > 0 {
			t.Errorf("series left behind by the removed route: %v", got)
		}
		if got := routeSeries(t, reg, "other"); len(got) == 0 {
			t.Error("the remaining route lost its series")
		}
	})
}

// TestChangedRouteSeries: a changed route's old and new instance share the route label. The counters
// go on across the change (the old instance's reload sleep counts), the state series is the new
// instance's from the change on (one series, never the old instance's), the old instance's retirement
// deletes nothing, and the new instance deletes them all when it retires in its turn.
func TestChangedRouteSeries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		s, reg := newMetricsServer(t, b, testRoute("app"))
		old := s.instance("app")
		if err := old.wakeNow(context.Background()); err != nil {
			t.Fatal(err)
		}
		b.set(func(f *fakeBackend) { f.sleepGte = make(chan struct{}) })
		changed := testRoute("app")
		changed.WakeBudget *= 2 // a change of the tenant's own (an edge-only one hands the tenant over: TestReloadHandsTheTenantOver)
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{changed}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the old instance is stopping its tenant; the new one waits for it, asleep
		if st := old.status().State; st != "stopping" {
			t.Fatalf("old instance %s, want stopping", st)
		}
		if got := stateSeries(routeSeries(t, reg, "app")); !slices.Equal(got, []string{"asleep"}) {
			t.Errorf("state series %v while the old instance stops, want the new instance's [asleep]", got)
		}
		close(b.sleepGte)
		synctest.Wait()
		wantRetired(t, old)
		wantValues(t, routeSeries(t, reg, "app"), map[string]float64{
			`activator_instance_state{state="asleep"}`: 1,
			`activator_sleeps_total{reason="reload"}`:  1,
			`activator_wakes_total{result="ok"}`:       1,
			`activator_sleep_failures_total{}`:         0,
		}, "after the old instance retired")
		if err := s.Wake(context.Background(), "app"); err != nil {
			t.Fatal(err)
		}
		got := routeSeries(t, reg, "app")
		if st := stateSeries(got); !slices.Equal(st, []string{"awake"}) {
			t.Errorf("state series %v after the new instance woke, want [awake]", st)
		}
		wantValues(t, got, map[string]float64{`activator_wakes_total{result="ok"}`: 2}, "a wake by each instance")

		neu := s.instance("app")
		if err := s.Apply(&registry.Config{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		wantRetired(t, neu)
		if got := routeSeries(t, reg, "app"); len(got) > 0 {
			t.Errorf("series left behind once both instances retired: %v", got)
		}
	})
}

// failingOpener opens every route but one.
type failingOpener struct {
	b    *fakeBackend
	fail string
}

func (o failingOpener) Open(r *registry.Route) (tenant.Backend, error) {
	if r.Name == o.fail {
		return nil, errors.New("no such unit")
	}
	return o.b, nil
}

// TestFailedApplyLeavesNoSeries: a config that Apply gives up on (a backend that cannot be opened)
// changes nothing, and leaves no series of the routes it had begun to set up.
func TestFailedApplyLeavesNoSeries(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	s := New(Options{
		Opener:  failingOpener{b: &fakeBackend{}, fail: "bad"},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} },
		Metrics: m,
	})
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("app"), testRoute("bad")}}); err == nil {
		t.Fatal("Apply opened a backend that cannot be opened")
	}
	if got := routeSeries(t, m.Gatherer(reg), "app"); len(got) > 0 {
		t.Errorf("series of a config Apply gave up on: %v", got)
	}
}

// TestWakeFailuresByClass: a failed wake counts in activator_wake_failures_total with the phase it
// failed in and its fault's class, and the series goes with the route.
func TestWakeFailuresByClass(t *testing.T) {
	b := &fakeBackend{wakeErr: tenant.Terminal(errors.New("bad setting"))}
	s, reg := newMetricsServer(t, b, testRoute("app"))
	if err := s.Wake(t.Context(), "app"); err == nil {
		t.Fatal("wake succeeded")
	}
	got := routeSeries(t, reg, "app")
	if v := got[`activator_wake_failures_total{class="terminal",phase="spawn"}`]; v != 1 {
		t.Fatalf("activator_wake_failures_total: %v in %v", v, got)
	}
	in := s.instance("app")
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("other")}}); err != nil {
		t.Fatal(err)
	}
	<-in.retired
	in.wg.Wait()
	if got := routeSeries(t, reg, "app"); len(got) != 0 {
		t.Fatalf("series left after the route retired: %v", got)
	}
}

// TestWakeSeriesBeforeTheFirstWakeEnds: the series a wake's end observes (its duration by result, the
// hold's duration) are there at zero while the route's first wake runs, so a slow first wake rises
// from a scraped zero and rate() sees it. Found by an operator trial: two first wakes of 100 s, holding
// 8,100 requests each, never moved ActivatorWakeSlow, and the dashboard's quantiles read NaN.
func TestWakeSeriesBeforeTheFirstWakeEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{wakeGate: make(chan struct{})}
		s, reg := newMetricsServer(t, b, testRoute("app"))
		if _, ok := routeSeries(t, reg, "app")[`activator_wake_duration_seconds_count{backing="fake",result="ok"}`]; ok {
			t.Error("a route that never woke has a wake duration series: 100,000 idle routes would each have one")
		}
		held := request(s.instance("app"))
		synctest.Wait()
		wantValues(t, routeSeries(t, reg, "app"), map[string]float64{
			`activator_wake_duration_seconds_count{backing="fake",result="ok"}`:     0,
			`activator_wake_duration_seconds_count{backing="fake",result="failed"}`: 0,
			`activator_hold_duration_seconds_count{}`:                               0,
		}, "while the first wake runs")
		close(b.wakeGate)
		if err := <-held; err != nil {
			t.Fatal(err)
		}
		wantValues(t, routeSeries(t, reg, "app"), map[string]float64{
			`activator_wake_duration_seconds_count{backing="fake",result="ok"}`: 1,
			`activator_hold_duration_seconds_count{}`:                           1,
		}, "after it")
	})
}
