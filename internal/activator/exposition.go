package activator

// Serving /metrics. The route series that exist from the start are eleven a route, 1.1 million at
// 100,000 routes: client_golang's registry makes protobuf objects of each, sorts, checks and encodes
// them. Measured there (session 20, docs/benchmarks.md): a scrape took 6.1 s of the activator's one
// CPU, allocated 666 MB (BenchmarkScrape), and the RSS went from 382 to 1,217 MiB over three scrapes
// and stayed there. So a scrape in the text format (what Prometheus asks for by default) or in
// delimited protobuf (what it asks for first with native histograms) gets the registry's metrics
// encoded by client_golang, followed by the route series written straight from their atomics
// (routeSet.writeText, routeSet.writeProto). Only protobuf's text and compact forms, which a client
// must ask for by name, get both registries through promhttp, at the old cost.

import (
	"bufio"
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
)

// Gatherer returns g with the route series added: every metric the activator has, as client_golang's
// objects (for a protobuf scrape, and for tests). A nil Metrics returns g.
func (m *Metrics) Gatherer(g prometheus.Gatherer) prometheus.Gatherer {
	if m == nil {
		return g
	}
	return prometheus.Gatherers{g, m.routeReg}
}

// Handler serves /metrics: reg's metrics and the route series. It registers
// promhttp_metric_handler_errors_total on reg, as promhttp does, and counts its failures there.
func (m *Metrics) Handler(reg *prometheus.Registry) http.Handler {
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "promhttp_metric_handler_errors_total",
		Help: "Total number of internal errors encountered by the promhttp metric handler.",
	}, []string{"cause"})
	errs.WithLabelValues("gathering")
	errs.WithLabelValues("encoding")
	if err := reg.Register(errs); err != nil {
		if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
			errs = are.ExistingCollector.(*prometheus.CounterVec)
		} else {
			panic(err)
		}
	}
	// promhttp finds errs registered and counts into it too.
	full := promhttp.HandlerFor(m.Gatherer(reg), promhttp.HandlerOpts{Registry: reg})
	if m == nil {
		return full
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		format := expfmt.NegotiateAccept(r.Header, expfmt.DefaultAcceptedFormats()...)
		var routes func(*bufio.Writer) error
		switch format.FormatType() {
		case expfmt.TypeTextPlain:
			routes = m.routes.writeText
		case expfmt.TypeProtoDelim:
			routes = m.routes.writeProto
		default: // protobuf's text and compact forms, asked for by name only
			full.ServeHTTP(w, r)
			return
		}
		mfs, err := reg.Gather()
		if err != nil {
			errs.WithLabelValues("gathering").Inc()
			http.Error(w, "An error has occurred while serving metrics:\n\n"+err.Error(), http.StatusInternalServerError)
			return
		}
		h := w.Header()
		h.Add("Vary", "Accept")
		h.Add("Vary", "Accept-Encoding")
		h.Set("Content-Type", string(format))
		var out io.Writer = w
		if acceptsGzip(r.Header.Values("Accept-Encoding")) {
			h.Set("Content-Encoding", "gzip")
			gz := gzipWriters.Get().(*gzip.Writer)
			gz.Reset(w)
			defer func() { _ = gz.Close(); gzipWriters.Put(gz) }()
			out = gz
		}
		bw := bufio.NewWriterSize(out, 64<<10)
		enc := expfmt.NewEncoder(bw, format)
		for _, mf := range mfs {
			if err = enc.Encode(mf); err != nil {
				break
			}
		}
		if err == nil {
			err = routes(bw)
		}
		if err != nil {
			// The status is sent: a client that went away is all this can be.
			errs.WithLabelValues("encoding").Inc()
		}
	})
}

// gzipWriters are the text scrapes' compressors, at gzip's fastest level: compressing the 58 MB a
// scrape of 100,000 routes writes took 0.38 s of a CPU at the default level (promhttp's) and takes
// about 0.15 s at this one (BenchmarkScrape), for 3.1 MB on the wire rather than 2.8.
var gzipWriters = sync.Pool{New: func() any {
	w, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed) // BestSpeed is a valid level: no error
	return w
}}

// acceptsGzip reports whether an Accept-Encoding header's values allow gzip: named with a q-value
// other than 0, or not named and "*" allowed. promhttp's own negotiation is internal to it.
func acceptsGzip(values []string) bool {
	gzipQ, starQ := -1.0, -1.0
	for _, v := range values {
		for _, part := range strings.Split(v, ",") {
			coding, params, _ := strings.Cut(part, ";")
			q := 1.0
			for _, p := range strings.Split(params, ";") {
				if k, val, ok := strings.Cut(p, "="); ok && strings.EqualFold(strings.TrimSpace(k), "q") {
					var err error
					if q, err = strconv.ParseFloat(strings.TrimSpace(val), 64); err != nil {
						q = 0
					}
				}
			}
			switch strings.ToLower(strings.TrimSpace(coding)) {
			case "gzip":
				gzipQ = q
			case "*":
				starQ = q
			}
		}
	}
	if gzipQ >= 0 {
		return gzipQ > 0
	}
	return starQ > 0
}
