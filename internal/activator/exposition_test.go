package activator

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/activator/activator/internal/upstream"
)

// scrapeMetrics is a Metrics with routes "a", "b" and "c" in different states, with counts in every
// route series and in the registry's vectors; only "a" has had tunnels.
func scrapeMetrics(t *testing.T) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	a, b, c := m.open("a"), m.open("b"), m.open("c")
	t.Cleanup(func() { a.release(); b.release(); c.release() })
	a.setState(Awake)
	a.wakeDone(WakeRecord{Backing: "exec", Result: ResultOK, Duration: 3 * time.Millisecond, Phases: []PhaseRecord{{Name: "spawn", Duration: time.Millisecond}}})
	a.joinedWake()
	a.requestCounter()(200)
	a.slept(ReasonIdle, false)
	a.slept(ReasonIdle, false)
	a.slept(ReasonReload, false)
	a.tunnelOpened() // a's tunnel series; b and c have none
	a.tunnelOpened()
	a.tunnelEnded(upstream.TunnelIdle)
	b.setState(Failed)
	b.wakeDone(WakeRecord{Backing: "unit", Result: ResultFailed, FailedPhase: "start", Class: "terminal", Duration: time.Second})
	b.sleepFailed(true)
	b.holdBegin()
	b.holdBegin()
	c.holdBegin()
	c.holdEnd(time.Millisecond)
	m.unknown(404)
	return m, reg
}

// scrape GETs /metrics from h with the given request headers.
func scrape(t *testing.T, h http.Handler, header map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	for k, v := range header {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("GET /metrics %v: %d %s", header, w.Code, w.Body)
	}
	return w
}

// seriesOf flattens families into "name{labels} type help" → value, labels sorted; a histogram is its
// count and sum, a summary is not expected.
func seriesOf(t *testing.T, mfs []*dto.MetricFamily) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			slices.Sort(labels)
			key := fmt.Sprintf("%s{%s} %s %q", mf.GetName(), strings.Join(labels, ","), mf.GetType(), mf.GetHelp())
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[key] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[key] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[key+" count"] = float64(m.GetHistogram().GetSampleCount())
				out[key+" sum"] = m.GetHistogram().GetSampleSum()
			default:
				t.Errorf("%s: unexpected type %s", mf.GetName(), mf.GetType())
			}
		}
	}
	return out
}

func parseText(t *testing.T, body io.Reader) []*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	byName, err := p.TextToMetricFamilies(body)
	if err != nil {
		t.Fatalf("the text scrape does not parse: %v", err)
	}
	return slices.Collect(maps.Values(byName))
}

// TestTextScrapeMatchesRegistry: a text scrape, which writes the route series itself, says exactly
// what client_golang's registry says of the same metrics (every series, type, help and value), plain
// and gzipped; a protobuf scrape still goes through the registry and says the same.
func TestTextScrapeMatchesRegistry(t *testing.T) {
	m, reg := scrapeMetrics(t)
	h := m.Handler(reg) // registers promhttp_metric_handler_errors_total on reg
	mfs, err := m.Gatherer(reg).Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := seriesOf(t, mfs)
	for _, name := range []string{"activator_instance_state", "activator_sleeps_total", "activator_wakes_total", "activator_held_requests", "activator_wake_duration_seconds", "activator_requests_total", "activator_tunnels_open", "activator_tunnels_closed_total", "promhttp_metric_handler_errors_total"} {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(want)), func(k string) bool { return strings.HasPrefix(k, name+"{") }) {
			t.Fatalf("the registry has no %s: the test's metrics are not what it thinks", name)
		}
	}
	prom := map[string]string{"Accept": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"}
	w := scrape(t, h, prom)
	if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("Content-Type %q, want the text format", ct)
	}
	text := w.Body.String()
	if got := seriesOf(t, parseText(t, strings.NewReader(text))); !maps.Equal(got, want) {
		t.Errorf("text scrape:\n%s\nwant what the registry has:\n%s", dump(got), dump(want))
	}
	if !strings.Contains(text, "\nactivator_sleeps_total{reason=\"idle\",route=\"a\"} 2\n") ||
		!strings.Contains(text, "\nactivator_tunnels_closed_total{reason=\"idle\",route=\"a\"} 1\n") ||
		!strings.Contains(text, "\nactivator_instance_state{route=\"b\",state=\"failed\"} 1\n") {
		t.Errorf("labels not in name order or values wrong:\n%s", text)
	}

	// What Prometheus 2 and 3 ask for by default (OpenMetrics first, which the handler does not
	// offer): the text format, so the route series' fast path.
	for _, accept := range []string{
		"application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
		"application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1",
		"",
	} {
		w := scrape(t, h, map[string]string{"Accept": accept})
		if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain;") {
			t.Errorf("Accept %q: Content-Type %q, want the text format", accept, ct)
		}
	}

	gz := scrape(t, h, map[string]string{"Accept-Encoding": "gzip"})
	if ce := gz.Header().Get("Content-Encoding"); ce != "gzip" {
		t.Fatalf("Content-Encoding %q with Accept-Encoding: gzip", ce)
	}
	zr, err := gzip.NewReader(gz.Body)
	if err != nil {
		t.Fatal(err)
	}
	if got := seriesOf(t, parseText(t, zr)); !maps.Equal(got, want) {
		t.Errorf("gzipped text scrape:\n%s\nwant:\n%s", dump(got), dump(want))
	}

	pb := scrape(t, h, map[string]string{"Accept": protoDelim, "Accept-Encoding": "gzip"})
	if ce := pb.Header().Get("Content-Encoding"); ce != "gzip" {
		t.Fatalf("protobuf scrape: Content-Encoding %q with Accept-Encoding: gzip", ce)
	}
	zr, err = gzip.NewReader(pb.Body)
	if err != nil {
		t.Fatal(err)
	}
	pbBody, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	format := expfmt.ResponseFormat(pb.Result().Header)
	if format.FormatType() != expfmt.TypeProtoDelim {
		t.Fatalf("protobuf scrape answered as %q", format)
	}
	dec := expfmt.NewDecoder(bytes.NewReader(pbBody), format)
	var got []*dto.MetricFamily
	for {
		mf := &dto.MetricFamily{}
		if err := dec.Decode(mf); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		got = append(got, mf)
	}
	if got := seriesOf(t, got); !maps.Equal(got, want) {
		t.Errorf("protobuf scrape:\n%s\nwant:\n%s", dump(got), dump(want))
	}

	// Protobuf's text form, asked for by name, still goes through the registry.
	pt := scrape(t, h, map[string]string{"Accept": "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text"})
	// (prototext varies its spacing on purpose, so the name is matched with any.)
	if ct := pt.Header().Get("Content-Type"); !strings.Contains(ct, "encoding=text") || !regexp.MustCompile(`name:\s+"activator_sleeps_total"`).MatchString(pt.Body.String()) {
		t.Errorf("protobuf text scrape: %q\n%.300s", ct, pt.Body)
	}
}

func dump(m map[string]float64) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "  %s = %v\n", k, m[k])
	}
	return b.String()
}

// discardWriter is a ResponseWriter that keeps nothing of the body, so a scrape's allocations are its
// own.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}

// TestScrapeDoesNotAllocatePerSeries: a text or protobuf scrape's allocations do not grow with the
// routes (eleven series each from the start). Through client_golang's registry each series cost a dozen objects, so
// at 100,000 routes a scrape took six seconds of a CPU and a gigabyte of garbage.
func TestScrapeDoesNotAllocatePerSeries(t *testing.T) {
	allocs := func(routes int, accept string) float64 {
		reg := prometheus.NewRegistry()
		m := NewMetrics(reg)
		for i := range routes {
			im := m.open(fmt.Sprintf("r%d", i))
			defer im.release()
		}
		h := m.Handler(reg)
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		r.Header.Set("Accept", accept)
		w := &discardWriter{h: http.Header{}}
		return testing.AllocsPerRun(3, func() { h.ServeHTTP(w, r) })
	}
	for _, accept := range []string{"text/plain;version=0.0.4", protoDelim} {
		small, big := allocs(100, accept), allocs(5000, accept)
		// The rows' slice grows with the routes, as one allocation; allow a few for anything else
		// that depends on the count, never one a route.
		if big-small > 50 {
			t.Errorf("Accept %s: a scrape of 5,000 routes allocates %.0f objects, of 100 routes %.0f: %.2f more a route (want none)", accept, big, small, (big-small)/4900)
		}
	}
}

// protoDelim is the Accept header of a protobuf scrape.
const protoDelim = "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited"

func TestAcceptsGzip(t *testing.T) {
	for _, c := range []struct {
		values []string
		want   bool
	}{
		{nil, false},
		{[]string{"gzip"}, true},
		{[]string{"identity"}, false},
		{[]string{"br, GZIP;q=0.5"}, true},
		{[]string{"gzip;q=0"}, false},
		{[]string{"gzip; q=0.0, *"}, false},
		{[]string{"*"}, true},
		{[]string{"*;q=0"}, false},
		{[]string{"deflate", "gzip"}, true},
		{[]string{"gzip;q=junk"}, false},
	} {
		if got := acceptsGzip(c.values); got != c.want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", c.values, got, c.want)
		}
	}
}

// BenchmarkScrape: one /metrics scrape of 100,000 idle routes (1.1 million series) through Handler, in
// the text format Prometheus asks for by default and in delimited protobuf, and through
// client_golang's registry (what every scrape cost before).
func BenchmarkScrape(b *testing.B) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	for i := range 100000 {
		im := m.open(fmt.Sprintf("r%d", i))
		b.Cleanup(im.release)
	}
	h := m.Handler(reg)
	for _, c := range []struct{ name, accept, encoding string }{
		{"text", "text/plain;version=0.0.4", ""},
		{"text-gzip", "text/plain;version=0.0.4", "gzip"},
		{"protobuf", protoDelim, ""},
	} {
		b.Run(c.name, func(b *testing.B) {
			r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
			r.Header.Set("Accept", c.accept)
			r.Header.Set("Accept-Encoding", c.encoding)
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				h.ServeHTTP(w, r)
			}
		})
	}
	// The registry's way, what every scrape cost before writeText and writeProto.
	b.Run("registry", func(b *testing.B) {
		full := promhttp.HandlerFor(m.Gatherer(reg), promhttp.HandlerOpts{})
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		r.Header.Set("Accept", protoDelim)
		w := &discardWriter{h: http.Header{}}
		b.ReportAllocs()
		for b.Loop() {
			full.ServeHTTP(w, r)
		}
	})
}

// TestScrapeWhileRoutesChange: text and protobuf scrapes run beside routes being added, counted and
// removed (a reload's work) and beside each other. Under -race this checks that the writers read
// only their snapshot and the atomics, and the decoding checks that writeProto's sizes, summed before
// its series are written, still hold when values change in between, and when a route's first tunnel
// makes its tunnel series in between.
func TestScrapeWhileRoutesChange(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	h := m.Handler(reg)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 300 {
			im := m.open(fmt.Sprintf("r%d", i%20))
			im.setState(Awake)
			im.slept(ReasonIdle, false)
			im.holdBegin()
			im.holdEnd(time.Millisecond)
			if i%3 == 0 { // a route's first tunnel, between a protobuf scrape's two passes or not
				im.tunnelOpened()
				im.tunnelEnded(upstream.TunnelClient)
			}
			im.release()
		}
	}()
	var scrapers sync.WaitGroup
	for range 2 {
		scrapers.Add(1)
		go func() {
			defer scrapers.Done()
			for j := range 30 {
				r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
				if j%2 == 1 {
					r.Header.Set("Accept", protoDelim)
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if j%2 == 0 {
					p := expfmt.NewTextParser(model.LegacyValidation)
					if _, err := p.TextToMetricFamilies(w.Body); err != nil {
						t.Errorf("a text scrape during changes does not parse: %v", err)
						return
					}
					continue
				}
				dec := expfmt.NewDecoder(w.Body, expfmt.ResponseFormat(w.Result().Header))
				for {
					var mf dto.MetricFamily
					if err := dec.Decode(&mf); err == io.EOF {
						break
					} else if err != nil {
						t.Errorf("a protobuf scrape during changes does not decode: %v", err)
						return
					}
				}
			}
		}()
	}
	scrapers.Wait()
	<-done
}

// TestTunnelSeriesOnlyWithTunnels: a route has tunnel series from its first tunnel on, every reason at
// 0, and none before: a family no route has series of is left out of a text and a protobuf scrape, as
// the registry leaves it out, and both still say what the registry says.
func TestTunnelSeriesOnlyWithTunnels(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	a, b := m.open("a"), m.open("b")
	t.Cleanup(func() { a.release(); b.release() })
	h := m.Handler(reg)
	check := func(when string, want map[string]float64) {
		t.Helper()
		mfs, err := m.Gatherer(reg).Gather()
		if err != nil {
			t.Fatal(err)
		}
		registry := seriesOf(t, mfs)
		text := scrape(t, h, nil).Body.String()
		pb := scrape(t, h, map[string]string{"Accept": protoDelim})
		dec := expfmt.NewDecoder(pb.Body, expfmt.ResponseFormat(pb.Result().Header))
		var pbFamilies []*dto.MetricFamily
		for {
			mf := &dto.MetricFamily{}
			if err := dec.Decode(mf); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("%s: protobuf scrape: %v", when, err)
			}
			if len(mf.GetMetric()) == 0 {
				t.Errorf("%s: protobuf scrape has family %s with no series", when, mf.GetName())
			}
			pbFamilies = append(pbFamilies, mf)
		}
		for format, got := range map[string]map[string]float64{"text": seriesOf(t, parseText(t, strings.NewReader(text))), "protobuf": seriesOf(t, pbFamilies)} {
			if !maps.Equal(got, registry) {
				t.Errorf("%s: %s scrape:\n%s\nwant what the registry has:\n%s", when, format, dump(got), dump(registry))
			}
			tunnels := map[string]float64{}
			for k, v := range got {
				if strings.HasPrefix(k, "activator_tunnels") {
					tunnels[k[:strings.Index(k, "}")+1]] = v
				}
			}
			if !maps.Equal(tunnels, want) {
				t.Errorf("%s: %s scrape's tunnel series %v, want %v", when, format, tunnels, want)
			}
		}
		if len(want) == 0 && strings.Contains(text, "activator_tunnels") {
			t.Errorf("%s: the text scrape names a tunnel family with no series:\n%s", when, text)
		}
	}
	check("before any tunnel", map[string]float64{})
	a.tunnelOpened()
	check("a's first tunnel open", map[string]float64{
		`activator_tunnels_open{route="a"}`:                         1,
		`activator_tunnels_closed_total{reason="client",route="a"}`: 0,
		`activator_tunnels_closed_total{reason="idle",route="a"}`:   0,
		`activator_tunnels_closed_total{reason="tenant",route="a"}`: 0,
	})
	a.tunnelEnded(upstream.TunnelTenant)
	check("a's first tunnel ended", map[string]float64{
		`activator_tunnels_open{route="a"}`:                         0,
		`activator_tunnels_closed_total{reason="client",route="a"}`: 0,
		`activator_tunnels_closed_total{reason="idle",route="a"}`:   0,
		`activator_tunnels_closed_total{reason="tenant",route="a"}`: 1,
	})
}

// TestRouteMetricsSize: a route's series fit in 208 bytes, a size class of Go's allocator, as they did
// before the tunnel series: one more word grows every route by 16 bytes, 1.6 MB at 100,000 routes,
// where few have a tunnel.
func TestRouteMetricsSize(t *testing.T) {
	if size := unsafe.Sizeof(routeMetrics{}); size > 208 {
		t.Errorf("routeMetrics is %d bytes, want at most 208", size)
	}
}

type failingWriter struct{ writes int }

func (f *failingWriter) Write([]byte) (int, error) { f.writes++; return 0, errors.New("client gone") }

// TestWriteTextStopsAtFailedWrite: a scrape whose client went away ends with the write's error.
func TestWriteTextStopsAtFailedWrite(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	for i := range 2000 {
		im := m.open(fmt.Sprintf("r%d", i))
		defer im.release()
	}
	fw := &failingWriter{}
	if err := m.routes.writeText(bufio.NewWriterSize(fw, 4096)); err == nil || err.Error() != "client gone" {
		t.Fatalf("writeText to a failing writer = %v, want its error", err)
	}
	if fw.writes != 1 {
		t.Errorf("the failing writer saw %d writes, want 1", fw.writes)
	}
}
