package activator

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/activator/activator/internal/upstream"
)

// Metrics is the activator's narrow recorder. Every label value comes from configured route names,
// backing names and fixed vocabularies (results, phases, states, reasons), never from request data, so
// cardinality is bounded by the config. A nil *Metrics records nothing.
//
// A route's series belong to its instances (routeseries.go): the first instance of a route name
// creates them, an instance that replaces it on a reload shares them, and the last of them to retire
// deletes them. The series whose labels are fixed (the route's alone, or with a state, reason or
// result) exist from the start, at 0. The wake and hold histograms appear when a route's first wake
// begins; the tunnel series (activator_tunnels_open, activator_tunnels_closed_total) at its first
// tunnel, which few routes have; the phase histogram, the failures by class and
// activator_requests_total at their first observation; a fleet's series (routeseries.go's
// fleetCollector) at its first wake.
type Metrics struct {
	wakeDuration  *prometheus.HistogramVec
	phaseDuration *prometheus.HistogramVec
	holdDuration  *prometheus.HistogramVec
	requests      *prometheus.CounterVec
	filtered      *prometheus.CounterVec
	wakeFailures  *prometheus.CounterVec
	// The config's last load (ConfigLoaded): whether the last reload was applied, and when a config
	// last was, at start-up or by a reload.
	reloadOK, reloadAt prometheus.Gauge
	unknown            func(code int) // activator_requests_total{route="_unknown"}
	routes             *routeSet
	// routeReg holds routes alone, apart from the registry NewMetrics registers on: a text scrape
	// writes them itself (Handler), a protobuf one gathers both registries (Gatherer).
	routeReg *prometheus.Registry
}

// unknownRoute is the route label of requests whose Host matched no route.
const unknownRoute = "_unknown"

// NewMetrics creates the activator's metrics and registers them on reg, but for the route series
// that exist from the start (routeseries.go): those are served by Handler and gathered by Gatherer.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	// 1 ms to 10 min: exec wakes take milliseconds, bare-metal boots minutes. 20, 45 and 90 s keep the
	// quantiles near ActivatorWakeSlow's 30 s honest: with 30 then 60, two wakes of 32 s read as a p95
	// of 58.5 s (found by an operator trial).
	wakeBuckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120, 300, 600}
	m := &Metrics{
		wakeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "activator_wake_duration_seconds", Help: "Time from the start of a wake to its result (health gate passed or failure).", Buckets: wakeBuckets,
		}, []string{"route", "backing", "result"}),
		phaseDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "activator_wake_phase_duration_seconds", Help: "Duration of each phase of a wake.", Buckets: wakeBuckets,
		}, []string{"route", "phase"}),
		holdDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "activator_hold_duration_seconds", Help: "How long requests were held before being released or answered.", Buckets: wakeBuckets,
		}, []string{"route"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "activator_requests_total", Help: "Requests answered, by route and status code (route \"_unknown\" for unmatched hosts and requests refused before routing).",
		}, []string{"route", "code"}),
		filtered: newFilteredVec(),
		wakeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "activator_wake_failures_total",
			Help: "Failed wakes, by the phase they failed in and the fault's class (retryable, throttle, terminal).",
		}, []string{"route", "phase", "class"}),
		reloadOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "activator_config_last_reload_successful",
			Help: "1 when the last reload of the config file was applied (or none has been tried since the start), 0 when it was rejected or failed: the config on disk is then not the one in force.",
		}),
		reloadAt: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "activator_config_last_reload_success_timestamp_seconds",
			Help: "When a config was last loaded and applied, at start-up or by a reload (Unix time).",
		}),
		routes:   newRouteSet(),
		routeReg: prometheus.NewRegistry(),
	}
	m.reloadOK.Set(1)
	m.unknown = newRouteMetrics(m, unknownRoute).countFn
	reg.MustRegister(m.wakeDuration, m.phaseDuration, m.holdDuration, m.requests, m.filtered, m.wakeFailures, m.reloadOK, m.reloadAt,
		newFleetCollector(m.routes))
	m.routeReg.MustRegister(m.routes)
	return m
}

// requestCounter returns the request counter of a name that no instance owns: "_unknown", for requests
// whose Host matched no route, made once. Its series are never deleted.
func (m *Metrics) requestCounter(route string) func(code int) {
	switch {
	case m == nil:
		return func(int) {}
	case route == unknownRoute:
		return m.unknown
	}
	return newRouteMetrics(m, route).countFn
}

// instanceMetrics is one instance's hold on its route's series: it adds to the route's counters, and
// its state is the one exported while it is the route's newest instance. A nil one records nothing.
type instanceMetrics struct {
	rm           *routeMetrics
	st           atomic.Int32 // the instance's State
	sleepFailing atomic.Bool  // the instance's last sleep failed
}

func (im *instanceMetrics) setState(s State) {
	if im != nil {
		im.st.Store(int32(s))
	}
}

// requestCounter returns the route's activator_requests_total counter by status code.
func (im *instanceMetrics) requestCounter() func(code int) {
	if im == nil {
		return func(int) {}
	}
	return im.rm.countFn
}

// release lets go of the route's series (see Metrics.release).
func (im *instanceMetrics) release() {
	if im != nil {
		im.rm.m.release(im)
	}
}

func (im *instanceMetrics) joinedWake() {
	if im != nil {
		im.rm.joined.Add(1)
	}
}

// holdBegin and holdEnd count one held request into and out of the hold. A herd of 10,000 goes through
// them twice each, so neither hashes a label.
func (im *instanceMetrics) holdBegin() {
	if im != nil {
		im.rm.held.Add(1)
	}
}

func (im *instanceMetrics) holdEnd(d time.Duration) {
	if im == nil {
		return
	}
	rm := im.rm
	rm.held.Add(-1)
	if o := rm.holdObserver(); o != nil { // nil: the route's series are gone
		(*o).Observe(d.Seconds())
	}
}

// holdObserver returns the route's activator_hold_duration_seconds series, making it on first use.
func (rm *routeMetrics) holdObserver() *prometheus.Observer {
	if o := rm.holdDur.Load(); o != nil {
		return o
	}
	rm.lazily(func() {
		h := rm.m.holdDuration.WithLabelValues(rm.route)
		rm.holdDur.CompareAndSwap(nil, &h)
	})
	return rm.holdDur.Load()
}

// wakeBegun makes, at the route's first wake, the series that its end observes, at zero: the wake
// duration by result and the hold duration. Made at the first observation instead, they appeared
// with it, and rate() and increase() never see a series' first value rise from nothing: a route's
// first wake, slow or not, was lost to ActivatorWakeSlow and the dashboard's quantiles (found by an
// operator trial: two first wakes of 100 s each, holding 8,100 requests, fired nothing). A wake that
// lasts a scrape interval or more, as a slow one does, now rises from a scraped zero. Idle routes that
// never wake make none, which keeps a config of 100,000 routes as small as before. Each wake takes
// lazyMu to read primed, once: an atomic flag beside it, with the tunnel series' pointer, grew
// routeMetrics into the next size class, 16 bytes more for every route.
func (im *instanceMetrics) wakeBegun(backing string) {
	if im == nil {
		return
	}
	rm := im.rm
	rm.holdObserver()
	rm.lazily(func() {
		if rm.primed {
			return
		}
		rm.primed = true
		for _, result := range wakeResults() {
			rm.m.wakeDuration.WithLabelValues(rm.route, backing, result)
		}
	})
}

func (im *instanceMetrics) wakeDone(rec WakeRecord) {
	if im == nil {
		return
	}
	rm := im.rm
	results := wakeResults()
	if i := slices.Index(results[:], rec.Result); i >= 0 {
		rm.wakes[i].Add(1)
	}
	rm.lazily(func() {
		rm.m.wakeDuration.WithLabelValues(rm.route, rec.Backing, rec.Result).Observe(rec.Duration.Seconds())
		for _, p := range rec.Phases {
			rm.m.phaseDuration.WithLabelValues(rm.route, p.Name).Observe(p.Duration.Seconds())
		}
		if rec.Result == ResultFailed {
			rm.m.wakeFailures.WithLabelValues(rm.route, rec.FailedPhase, rec.Class).Inc()
		}
	})
}

// slept counts a sleep; reason is one of the Reason constants, and forced says the backing succeeded
// only by force (tenant.NoteForcedSleep).
func (im *instanceMetrics) slept(reason string, forced bool) {
	if im == nil {
		return
	}
	reasons := sleepReasons()
	if i := slices.Index(reasons[:], reason); i >= 0 {
		im.rm.sleeps[i].Add(1)
	}
	if forced {
		im.rm.sleepsForced.Add(1)
	}
}

// sleepFailed records a sleep's outcome: a failure is counted, and activator_sleep_failing says
// whether the last sleep failed until one succeeds.
func (im *instanceMetrics) sleepFailed(failed bool) {
	if im == nil {
		return
	}
	if failed {
		im.rm.sleepFailures.Add(1)
	}
	im.sleepFailing.Store(failed)
}

// tunnelOpened counts a tunnel (a WebSocket) opened to the route's tenant (upstream.Options.OnTunnelOpen);
// the route's first makes its tunnel series, every reason at 0. Nothing per plain request: only a 101
// comes here.
func (im *instanceMetrics) tunnelOpened() {
	if im != nil {
		im.rm.tunnelCounts().open.Add(1)
	}
}

// tunnelEnded counts a tunnel tunnelOpened counted as ended, for why (upstream.Options.OnTunnelEnd).
func (im *instanceMetrics) tunnelEnded(why upstream.TunnelReason) {
	if im == nil {
		return
	}
	tc := im.rm.tunnelCounts()
	tc.open.Add(-1)
	reasons := tunnelReasons()
	if i := slices.Index(reasons[:], why); i >= 0 {
		tc.closed[i].Add(1)
	}
}

// ConfigLoaded records a load of the config file at at: applied (ok), or rejected or failed, which
// leaves the config loaded before it in force. serve calls it once the start-up config is applied,
// and after every reload. Safe for concurrent use; a nil Metrics records nothing.
func (m *Metrics) ConfigLoaded(ok bool, at time.Time) {
	if m == nil {
		return
	}
	if !ok {
		m.reloadOK.Set(0)
		return
	}
	m.reloadOK.Set(1)
	m.reloadAt.Set(float64(at.UnixNano()) / 1e9)
}
