package activator

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics is the activator's narrow recorder. Every label value comes from configured route names,
// backing names and fixed vocabularies (results, phases, states, reasons), never from request data, so
// cardinality is bounded by the config. A nil *Metrics records nothing.
type Metrics struct {
	wakeDuration  *prometheus.HistogramVec
	phaseDuration *prometheus.HistogramVec
	wakes         *prometheus.CounterVec
	joined        *prometheus.CounterVec
	held          *prometheus.GaugeVec
	holdDuration  *prometheus.HistogramVec
	requests      *prometheus.CounterVec
	state         *prometheus.GaugeVec
	sleeps        *prometheus.CounterVec
	sleepFailures *prometheus.CounterVec
}

// States, in the order exported by activator_instance_state.
var allStates = []string{"asleep", "waking", "awake", "stopping", "failed"}

// NewMetrics creates the activator's metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	// 1 ms to 10 min: exec wakes take milliseconds, bare-metal boots minutes.
	wakeBuckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
	m := &Metrics{
		wakeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "activator_wake_duration_seconds", Help: "Time from the start of a wake to its result (health gate passed or failure).", Buckets: wakeBuckets,
		}, []string{"route", "backing", "result"}),
		phaseDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "activator_wake_phase_duration_seconds", Help: "Duration of each phase of a wake.", Buckets: wakeBuckets,
		}, []string{"route", "phase"}),
		wakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "activator_wakes_total", Help: "Wakes by result.",
		}, []string{"route", "result"}),
		joined: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "activator_wake_joined_requests_total", Help: "Requests that joined a wake already in progress instead of starting one.",
		}, []string{"route"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "activator_held_requests", Help: "Requests currently held while their route wakes.",
		}, []string{"route"}),
		holdDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "activator_hold_duration_seconds", Help: "How long requests were held before being released or answered.", Buckets: wakeBuckets,
		}, []string{"route"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "activator_requests_total", Help: "Requests answered, by route and status code (route \"_unknown\" for unmatched hosts).",
		}, []string{"route", "code"}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "activator_instance_state", Help: "1 for the state each route's instance is in, 0 for the others.",
		}, []string{"route", "state"}),
		sleeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "activator_sleeps_total", Help: "Times a route went to sleep, by reason (idle, admin, exited, reload, gate_failed).",
		}, []string{"route", "reason"}),
		sleepFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "activator_sleep_failures_total", Help: "Sleeps whose backing failed: the tenant may still run.",
		}, []string{"route"}),
	}
	reg.MustRegister(m.wakeDuration, m.phaseDuration, m.wakes, m.joined, m.held, m.holdDuration, m.requests, m.state, m.sleeps, m.sleepFailures)
	return m
}

func (m *Metrics) wakeDone(rec WakeRecord) {
	if m == nil {
		return
	}
	m.wakeDuration.WithLabelValues(rec.Route, rec.Backing, rec.Result).Observe(rec.Duration.Seconds())
	m.wakes.WithLabelValues(rec.Route, rec.Result).Inc()
	for _, p := range rec.Phases {
		m.phaseDuration.WithLabelValues(rec.Route, p.Name).Observe(p.Duration.Seconds())
	}
}

func (m *Metrics) joinedWake(route string) {
	if m != nil {
		m.joined.WithLabelValues(route).Inc()
	}
}

// holdMetrics are one route's hold gauge and histogram, resolved once: a herd of 10,000 released at
// once otherwise hashes the route label 20,000 times while the last of them wait to leave the hold.
type holdMetrics struct {
	held prometheus.Gauge
	dur  prometheus.Observer
}

// holdFor returns route's hold metrics; nil records nothing.
func (m *Metrics) holdFor(route string) *holdMetrics {
	if m == nil {
		return nil
	}
	return &holdMetrics{held: m.held.WithLabelValues(route), dur: m.holdDuration.WithLabelValues(route)}
}

func (h *holdMetrics) begin() {
	if h != nil {
		h.held.Inc()
	}
}

func (h *holdMetrics) end(d time.Duration) {
	if h != nil {
		h.held.Dec()
		h.dur.Observe(d.Seconds())
	}
}

// requestCounter returns the per-code request counter for one route. Counters are cached per code so
// the hot path skips label hashing; the route's curried vector is made on the first request, since
// most of many configured routes may never see one.
func (m *Metrics) requestCounter(route string) func(code int) {
	if m == nil {
		return func(int) {}
	}
	var (
		once  sync.Once
		cv    *prometheus.CounterVec
		cache sync.Map // int -> prometheus.Counter
	)
	return func(code int) {
		if c, ok := cache.Load(code); ok {
			c.(prometheus.Counter).Inc()
			return
		}
		once.Do(func() { cv = m.requests.MustCurryWith(prometheus.Labels{"route": route}) })
		c := cv.WithLabelValues(strconv.Itoa(code))
		cache.Store(code, c)
		c.Inc()
	}
}

func (m *Metrics) setState(route, from, to string) {
	if m == nil {
		return
	}
	// Only the current state has a series (value 1): five series per route cost a third of the heap
	// with 10,000 routes. Query with activator_instance_state{state="awake"} == 1, or sum by (state).
	if from != "" && from != to {
		m.state.DeleteLabelValues(route, from)
	}
	m.state.WithLabelValues(route, to).Set(1)
}

func (m *Metrics) slept(route, reason string) {
	if m != nil {
		m.sleeps.WithLabelValues(route, reason).Inc()
	}
}

func (m *Metrics) sleepFailed(route string) {
	if m != nil {
		m.sleepFailures.WithLabelValues(route).Inc()
	}
}

// forget drops a removed route's series so a reload does not leave stale gauges behind.
func (m *Metrics) forget(route string) {
	if m == nil {
		return
	}
	l := prometheus.Labels{"route": route}
	m.state.DeletePartialMatch(l)
	m.held.DeletePartialMatch(l)
	m.requests.DeletePartialMatch(l)
}
