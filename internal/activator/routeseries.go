package activator

// A route's metric series: created with the route's first instance, shared by the instances that
// replace it on reloads, deleted by the last of them once it has retired. Whoever creates a series
// deletes it.

import (
	"bufio"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/activator/activator/internal/upstream"
)

// The label values a route has a counter for from the start: activator_sleeps_total by reason and
// activator_wakes_total by result; and from its first tunnel, activator_tunnels_closed_total by reason.
const (
	numSleepReasons  = 4
	numWakeResults   = 2
	numTunnelReasons = 3
)

func sleepReasons() [numSleepReasons]string {
	return [...]string{ReasonIdle, ReasonAdmin, ReasonExited, ReasonReload}
}

func wakeResults() [numWakeResults]string { return [...]string{ResultOK, ResultFailed} }

func tunnelReasons() [numTunnelReasons]upstream.TunnelReason {
	return [...]upstream.TunnelReason{upstream.TunnelIdle, upstream.TunnelClient, upstream.TunnelTenant}
}

// routeMetrics are one route's series, shared by the route's instances (see Metrics.open).
type routeMetrics struct {
	m       *Metrics
	route   string
	countFn func(code int) // count, bound once

	joined        atomic.Uint64
	sleepFailures atomic.Uint64
	sleepsForced  atomic.Uint64
	sleeps        [numSleepReasons]atomic.Uint64
	wakes         [numWakeResults]atomic.Uint64

	codes   sync.Map                            // int -> prometheus.Counter: activator_requests_total by code
	holdDur atomic.Pointer[prometheus.Observer] // activator_hold_duration_seconds, resolved at the first hold
	tunnels atomic.Pointer[tunnelCounts]        // made at the route's first tunnel (a WebSocket): few routes have one

	holders []*instanceMetrics // guarded by routeSet.mu; in the order opened, the newest last

	lazyMu sync.Mutex // guards lazy, gone and primed; held while the route's series in the vectors are made or deleted
	lazy   bool       // the route has series in the vectors: deleting its series looks for them
	gone   bool       // the route's series were deleted: make no more
	primed bool       // wakeBegun has made the route's wake series (metrics.go)

	// held, atomic: the requests held now. Beside the bools, in what would be their padding: at
	// 100,000 routes a struct that grows into the next size class costs 1.6 MB (TestRouteMetricsSize).
	// 32 bits hold any number of held requests: 2^31 of them would take terabytes of goroutine stacks.
	held atomic.Int32
}

// tunnelCounts are a route's tunnel series: the tunnels open now, and those closed by reason (indexed
// as tunnelReasons).
type tunnelCounts struct {
	open   atomic.Int64
	closed [numTunnelReasons]atomic.Uint64
}

// tunnelCounts returns the route's tunnel series, making them, at zero, on first use.
func (rm *routeMetrics) tunnelCounts() *tunnelCounts {
	if tc := rm.tunnels.Load(); tc != nil {
		return tc
	}
	rm.tunnels.CompareAndSwap(nil, new(tunnelCounts))
	return rm.tunnels.Load()
}

func newRouteMetrics(m *Metrics, route string) *routeMetrics {
	rm := &routeMetrics{m: m, route: route}
	rm.countFn = rm.count
	return rm
}

// count counts a request answered with code. Each code's counter is resolved once, so the hot path
// skips label hashing.
func (rm *routeMetrics) count(code int) {
	if c, ok := rm.codes.Load(code); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	rm.lazily(func() {
		c := rm.m.requests.WithLabelValues(rm.route, strconv.Itoa(code))
		rm.codes.Store(code, c)
		c.Inc()
	})
}

// lazily runs fn, which makes or updates the route's series in the histogram and request vectors,
// unless the route's series were deleted (a request that a retired instance answered 503).
func (rm *routeMetrics) lazily(fn func()) {
	rm.lazyMu.Lock()
	defer rm.lazyMu.Unlock()
	if !rm.gone {
		rm.lazy = true
		fn()
	}
}

// open gives a new instance of route its hold on the route's series, creating them (every counter and
// gauge at 0) if the route has none yet. The instance is the route's newest, so its state is the one
// exported from now on. The instance calls release exactly once, when it has retired or shut down; a
// nil Metrics returns nil, which records nothing.
func (m *Metrics) open(route string) *instanceMetrics {
	if m == nil {
		return nil
	}
	s := m.routes
	s.mu.Lock()
	defer s.mu.Unlock()
	rm := s.byName[route]
	if rm == nil {
		rm = newRouteMetrics(m, route)
		s.byName[route] = rm
	}
	im := &instanceMetrics{rm: rm}
	rm.holders = append(rm.holders, im)
	return im
}

// release lets go of im's hold on its route's series; the last holder deletes them. While an older
// instance still holds them (a changed route, then removed), its state is the one exported.
func (m *Metrics) release(im *instanceMetrics) {
	s := m.routes
	s.mu.Lock()
	defer s.mu.Unlock()
	rm := im.rm
	if i := slices.Index(rm.holders, im); i >= 0 {
		rm.holders = slices.Delete(rm.holders, i, i+1)
	}
	delete(s.fleets, im)
	if len(rm.holders) > 0 {
		return
	}
	delete(s.byName, rm.route)
	rm.lazyMu.Lock()
	defer rm.lazyMu.Unlock()
	rm.gone = true
	if rm.lazy {
		l := prometheus.Labels{"route": rm.route}
		m.wakeDuration.DeletePartialMatch(l)
		m.phaseDuration.DeletePartialMatch(l)
		m.holdDuration.DeletePartialMatch(l)
		m.requests.DeletePartialMatch(l)
		m.filtered.DeletePartialMatch(l)
		m.wakeFailures.DeletePartialMatch(l)
	}
}

// routeSet is every live route's routeMetrics, and the Collector that exports their counters and
// gauges. Between scrapes those are plain atomics, a word per series where a client_golang child costs
// a few hundred bytes: a route has eleven such series from the start, and a config may have 100,000
// routes. A text or protobuf scrape writes them straight to the response (writeText, writeProto);
// the Collector serves the rest (exposition.go), and tests.
type routeSet struct {
	descs []*prometheus.Desc // routeFamilies', in their order, for the Collector

	mu     sync.Mutex // guards byName, every routeMetrics' holders, and fleets
	byName map[string]*routeMetrics
	// fleets are the instances of fleets that have woken (fleetWoke), until they let go of their
	// route's series: fleetCollector's. Only fleets are in it, so single tenants pay nothing for it.
	fleets map[*instanceMetrics]fleetGauges

	rowBufs sync.Pool // *[]routeRow: a text scrape's rows, for the next one
}

// routeFamily is one metric family of routeSet: its name, help, type, the label it has besides route
// ("" for none), and each, which gives a row's series in it: the other label's value and the value.
type routeFamily struct {
	name, help string
	gauge      bool
	label      string
	each       func(r *routeRow, series func(other string, v int64))
}

// The families of routeSet, in the order a text or protobuf scrape writes them.
var (
	famState = routeFamily{"activator_instance_state", "1 for the state each route's instance is in; the other states have no series.", true, "state",
		func(r *routeRow, series func(string, int64)) { series(r.state.String(), 1) }}
	famHeld = routeFamily{"activator_held_requests", "Requests currently held while their route wakes.", true, "",
		func(r *routeRow, series func(string, int64)) { series("", int64(r.rm.held.Load())) }}
	famJoined = routeFamily{"activator_wake_joined_requests_total", "Requests that joined a wake already in progress instead of starting one.", false, "",
		func(r *routeRow, series func(string, int64)) { series("", int64(r.rm.joined.Load())) }}
	famSleepFailures = routeFamily{"activator_sleep_failures_total", "Sleeps whose backing failed: the tenant may still run.", false, "",
		func(r *routeRow, series func(string, int64)) { series("", int64(r.rm.sleepFailures.Load())) }}
	famSleepFailing = routeFamily{"activator_sleep_failing", "1 while the route's last sleep failed (the tenant runs on), until a sleep succeeds.", true, "",
		func(r *routeRow, series func(string, int64)) {
			v := int64(0)
			if r.failing {
				v = 1
			}
			series("", v)
		}}
	famSleeps = routeFamily{"activator_sleeps_total", "Times a route went to sleep, by reason (idle, admin, exited, reload).", false, "reason",
		func(r *routeRow, series func(string, int64)) {
			for i, reason := range sleepReasons() {
				series(reason, int64(r.rm.sleeps[i].Load()))
			}
		}}
	famSleepsForced = routeFamily{"activator_sleeps_forced_total", "Sleeps the backing did only by force: a SIGKILL after the stop grace, a node's ForceOff, a guest's power cut.", false, "",
		func(r *routeRow, series func(string, int64)) { series("", int64(r.rm.sleepsForced.Load())) }}
	famWakes = routeFamily{"activator_wakes_total", "Wakes by result.", false, "result",
		func(r *routeRow, series func(string, int64)) {
			for i, result := range wakeResults() {
				series(result, int64(r.rm.wakes[i].Load()))
			}
		}}
	// The tunnel families have series only for the routes that have had a tunnel.
	famTunnelsOpen = routeFamily{"activator_tunnels_open", "Upgraded connections (WebSockets) open now through the edge to the route's tenant.", true, "",
		func(r *routeRow, series func(string, int64)) {
			if r.tunneled {
				series("", r.rm.tunnels.Load().open.Load())
			}
		}}
	famTunnelsClosed = routeFamily{"activator_tunnels_closed_total", "Upgraded connections (WebSockets) that ended, by what ended them first: idle (the edge, after edge.tunnel_timeout without a byte), client, tenant.", false, "reason",
		func(r *routeRow, series func(string, int64)) {
			if r.tunneled {
				tc := r.rm.tunnels.Load()
				for i, why := range tunnelReasons() {
					series(why.String(), int64(tc.closed[i].Load()))
				}
			}
		}}
	routeFamilies = [...]*routeFamily{&famState, &famHeld, &famJoined, &famSleepFailures, &famSleepFailing, &famSleeps, &famSleepsForced, &famWakes,
		&famTunnelsOpen, &famTunnelsClosed}
)

func (f routeFamily) desc() *prometheus.Desc {
	labels := []string{"route"}
	if f.label != "" {
		labels = append(labels, f.label)
	}
	return prometheus.NewDesc(f.name, f.help, labels, nil)
}

func newRouteSet() *routeSet {
	s := &routeSet{byName: map[string]*routeMetrics{}}
	for _, f := range routeFamilies {
		s.descs = append(s.descs, f.desc())
	}
	return s
}

// Describe implements prometheus.Collector.
func (s *routeSet) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range s.descs {
		ch <- d
	}
}

// routeRow is one route in one scrape: its series and the state of its newest instance, and whether
// it has had a tunnel (rm.tunnels is set: it stays set), read once, so that writeProto's two passes see
// the same series.
type routeRow struct {
	rm       *routeMetrics
	state    State
	failing  bool
	tunneled bool
}

// rows returns every route's row, sorted by route name, in buf (which it grows as needed).
func (s *routeSet) rows(buf []routeRow) []routeRow {
	s.mu.Lock()
	rows := slices.Grow(buf[:0], len(s.byName))
	for _, rm := range s.byName {
		newest := rm.holders[len(rm.holders)-1]
		rows = append(rows, routeRow{rm, State(newest.st.Load()), newest.sleepFailing.Load(), rm.tunnels.Load() != nil})
	}
	s.mu.Unlock()
	slices.SortFunc(rows, func(a, b routeRow) int { return strings.Compare(a.rm.route, b.rm.route) })
	return rows
}

// Collect implements prometheus.Collector: every route's series, with the state of its newest
// instance, as const metrics (an object per series: the path of the scrapes writeText and
// writeProto do not serve).
func (s *routeSet) Collect(ch chan<- prometheus.Metric) {
	for _, r := range s.rows(nil) {
		for i, f := range routeFamilies {
			typ := prometheus.CounterValue
			if f.gauge {
				typ = prometheus.GaugeValue
			}
			f.each(&r, func(other string, v int64) {
				labels := []string{r.rm.route}
				if f.label != "" {
					labels = append(labels, other)
				}
				ch <- prometheus.MustNewConstMetric(s.descs[i], typ, float64(v), labels...)
			})
		}
	}
}

// withRows calls fn with every route's row, sorted by route name, in a slice an earlier scrape left
// in the pool if there is one.
func (s *routeSet) withRows(fn func([]routeRow) error) error {
	pooled, _ := s.rowBufs.Get().(*[]routeRow)
	if pooled == nil {
		pooled = new([]routeRow)
	}
	rows := s.rows(*pooled)
	defer func() {
		clear(rows) // no pointers to retired routes kept alive in the pool
		*pooled = rows[:0]
		s.rowBufs.Put(pooled)
	}()
	return fn(rows)
}

// writeText writes every route's series to w in the Prometheus text format (version 0.0.4), family by
// family, the series of each in route order: what Collect gives, without the registry's objects. At
// 100,000 routes the registry's way (protobuf objects per series, sorted, checked, then encoded) took
// 4.6 s and 666 MB of allocation a scrape (BenchmarkScrape); this one allocates nothing per series,
// and the rows (24 bytes a route) only when no earlier scrape's are left to reuse. It stops at the
// first failed write (a client that went away) and returns that error.
func (s *routeSet) writeText(w *bufio.Writer) error {
	return s.withRows(func(rows []routeRow) error {
		buf := make([]byte, 0, 256)
		var err error
		write := func() {
			if err == nil {
				_, err = w.Write(buf)
			}
		}
		// series writes one series of family f, route's, after f's HELP and TYPE if it is f's first:
		// a family with no series (the tunnels', where no route has had one) is left out, as the
		// registry leaves it out. Made once: a closure made per row would be an allocation per row
		// (each's argument escapes).
		var f *routeFamily
		var route string
		var begun bool // f's HELP and TYPE are written
		series := func(other string, v int64) {
			if !begun {
				begun = true
				typ := "counter"
				if f.gauge {
					typ = "gauge"
				}
				buf = append(buf[:0], "# HELP "...)
				buf = append(append(append(buf, f.name...), ' '), f.help...) // no help text holds a backslash or a newline
				buf = append(append(append(append(append(buf, "\n# TYPE "...), f.name...), ' '), typ...), '\n')
				write()
			}
			// f's other label goes before or after route, as their names sort.
			buf = append(append(buf[:0], f.name...), '{')
			if f.label != "" && f.label < "route" {
				buf = append(appendLabel(buf, f.label, other), ',')
			}
			buf = appendLabel(buf, "route", route)
			if f.label != "" && f.label > "route" {
				buf = appendLabel(append(buf, ','), f.label, other)
			}
			buf = append(strconv.AppendInt(append(buf, "} "...), v, 10), '\n')
			write()
		}
		for _, f = range routeFamilies {
			begun = false
			familySeries(rows, f, &route, &err, series)
		}
		return flushUnless(w, err)
	})
}

// familySeries calls f.each with series for every row, *route set to the row's route, until *err is
// set.
func familySeries(rows []routeRow, f *routeFamily, route *string, err *error, series func(string, int64)) {
	for i := 0; i < len(rows) && *err == nil; i++ {
		*route = rows[i].rm.route
		f.each(&rows[i], series)
	}
}

// flushUnless flushes w unless a write failed already (err), and returns the error.
func flushUnless(w *bufio.Writer, err error) error {
	if err != nil {
		return err
	}
	return w.Flush()
}

// The field numbers of io.prometheus.client's MetricFamily, Metric, LabelPair, Gauge and Counter
// (client_model's metrics.proto), and its MetricType values.
const (
	pbFamilyName, pbFamilyHelp, pbFamilyType, pbFamilyMetric = 1, 2, 3, 4
	pbMetricLabel, pbMetricGauge, pbMetricCounter            = 1, 2, 3
	pbLabelName, pbLabelValue                                = 1, 2
	pbValue                                                  = 1
	pbTypeCounter, pbTypeGauge                               = 0, 1
)

// writeProto writes every route's series to w as length-delimited protobuf MetricFamily messages,
// what promhttp writes for a protobuf scrape, with writeText's economy: each family's length is
// summed first (a series' size does not depend on its value: a double is 8 bytes), then its series
// are encoded one by one. Labels are sorted by name, as the registry sorts them.
func (s *routeSet) writeProto(w *bufio.Writer) error {
	return s.withRows(func(rows []routeRow) error {
		var metric, buf []byte
		var err error
		write := func(b []byte) {
			if err == nil {
				_, err = w.Write(b)
			}
		}
		appendMetric := func(f *routeFamily, route, other string, v int64) []byte {
			pair := func(b []byte, name, value string) []byte {
				b = protowire.AppendTag(b, pbMetricLabel, protowire.BytesType)
				b = protowire.AppendVarint(b, uint64(protowire.SizeTag(pbLabelName)+protowire.SizeBytes(len(name))+protowire.SizeTag(pbLabelValue)+protowire.SizeBytes(len(value))))
				b = protowire.AppendString(protowire.AppendTag(b, pbLabelName, protowire.BytesType), name)
				return protowire.AppendString(protowire.AppendTag(b, pbLabelValue, protowire.BytesType), value)
			}
			b := metric[:0]
			if f.label != "" && f.label < "route" {
				b = pair(b, f.label, other)
			}
			b = pair(b, "route", route)
			if f.label != "" && f.label > "route" {
				b = pair(b, f.label, other)
			}
			kind := protowire.Number(pbMetricCounter)
			if f.gauge {
				kind = pbMetricGauge
			}
			b = protowire.AppendTag(b, kind, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(protowire.SizeTag(pbValue)+protowire.SizeFixed64()))
			b = protowire.AppendTag(b, pbValue, protowire.Fixed64Type)
			return protowire.AppendFixed64(b, math.Float64bits(float64(v)))
		}
		// measure adds one series' size to size and counts it in n, series writes it; both made
		// once, as in writeText.
		var f *routeFamily
		var route string
		var size, n int
		measure := func(other string, v int64) {
			metric = appendMetric(f, route, other, v)
			size += protowire.SizeTag(pbFamilyMetric) + protowire.SizeBytes(len(metric))
			n++
		}
		series := func(other string, v int64) {
			metric = appendMetric(f, route, other, v)
			buf = protowire.AppendTag(buf[:0], pbFamilyMetric, protowire.BytesType)
			buf = append(protowire.AppendVarint(buf, uint64(len(metric))), metric...)
			write(buf)
		}
		for _, f = range routeFamilies {
			typ := uint64(pbTypeCounter)
			if f.gauge {
				typ = pbTypeGauge
			}
			head := protowire.AppendString(protowire.AppendTag(buf[:0], pbFamilyName, protowire.BytesType), f.name)
			head = protowire.AppendString(protowire.AppendTag(head, pbFamilyHelp, protowire.BytesType), f.help)
			head = protowire.AppendVarint(protowire.AppendTag(head, pbFamilyType, protowire.VarintType), typ)
			size, n = len(head), 0
			var none error
			familySeries(rows, f, &route, &none, measure)
			if n == 0 {
				continue // a family with no series is left out, as in writeText
			}
			buf = append(protowire.AppendVarint(nil, uint64(size)), head...)
			write(buf)
			familySeries(rows, f, &route, &err, series)
		}
		return flushUnless(w, err)
	})
}

// appendLabel appends name="value", the value escaped as the text format wants (a backslash, a double
// quote and a newline). Route names cannot hold any of them (registry's name rule); the escape is for
// the day that rule widens.
func appendLabel(buf []byte, name, value string) []byte {
	buf = append(append(buf, name...), `="`...)
	for i := 0; i < len(value); i++ {
		switch c := value[i]; c {
		case '\\', '"':
			buf = append(buf, '\\', c)
		case '\n':
			buf = append(buf, `\n`...)
		default:
			buf = append(buf, c)
		}
	}
	return append(buf, '"')
}

// fleetGauges is what the fleets' series read of a fleet at a scrape (fleet.go's fleetBackend).
type fleetGauges interface {
	minReady() int
	// eachReady calls fn with each member, in member order, and whether it is ready.
	eachReady(fn func(member string, ready bool))
}

// fleetWoke makes the fleet series of im's route, a fleet's, read from f from now on; the fleet calls
// it as each wake begins (the first, when they first say something, makes them; the others change
// nothing). They go with im's hold on the route's series (Metrics.release), and are the route's while
// im is its newest instance.
func (im *instanceMetrics) fleetWoke(f fleetGauges) {
	if im == nil {
		return
	}
	s := im.rm.m.routes
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(im.rm.holders, im) {
		return // released already: the route's series are gone
	}
	if s.fleets == nil {
		s.fleets = map[*instanceMetrics]fleetGauges{}
	}
	s.fleets[im] = f
}

// fleetCollector is the Collector of the fleets' series, read at each scrape from the fleet of each
// route's newest instance, if that is a fleet that has woken: activator_fleet_member_ready (by
// member) and activator_fleet_min_ready. Read, not kept: no count to keep in step with members that
// come and go, and nothing left of a member that a reload removed.
type fleetCollector struct {
	s               *routeSet
	ready, minReady *prometheus.Desc
}

func newFleetCollector(s *routeSet) fleetCollector {
	return fleetCollector{s: s,
		ready: prometheus.NewDesc("activator_fleet_member_ready",
			"1 while the fleet member is ready (it passed its health gate and has not left the fleet since), else 0. Fleets only, from their first wake.",
			[]string{"route", "member"}, nil),
		minReady: prometheus.NewDesc("activator_fleet_min_ready",
			"The fleet's quorum (fleet.min_ready): it is up while this many members are ready. Fleets only, from their first wake.",
			[]string{"route"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.ready
	ch <- c.minReady
}

// Collect implements prometheus.Collector.
func (c fleetCollector) Collect(ch chan<- prometheus.Metric) {
	type fleetRow struct {
		route string
		f     fleetGauges
	}
	var rows []fleetRow
	c.s.mu.Lock()
	for im, f := range c.s.fleets {
		if h := im.rm.holders; h[len(h)-1] == im {
			rows = append(rows, fleetRow{im.rm.route, f})
		}
	}
	c.s.mu.Unlock()
	for _, r := range rows {
		ch <- prometheus.MustNewConstMetric(c.minReady, prometheus.GaugeValue, float64(r.f.minReady()), r.route)
		r.f.eachReady(func(member string, ready bool) {
			v := 0.0
			if ready {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, v, r.route, member)
		})
	}
}
