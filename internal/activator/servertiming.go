package activator

// Server-Timing and the wake id on every response to a request that was held (issue 14 §2): the time
// it was held and each phase of the wake it waited for, as browsers' developer tools show them. A
// request that found its route awake gets nothing and pays one nil check.

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// wakeIDHeader names, on a held request's response, the wake it waited for: the id that the logs,
// the admin API and `activator explain` know the wake by.
const wakeIDHeader = "Activator-Wake-Id"

// timingEntries renders a wake's phases as Server-Timing entries, "spawn;dur=2040.1, health;dur=12.5",
// once per wake (publishLocked), so a released herd does not render them once per request.
func timingEntries(phases []PhaseRecord) string {
	var b strings.Builder
	for i, p := range phases {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(timingToken(p.Name))
		b.WriteString(";dur=")
		b.WriteString(millis(p.Duration))
	}
	return b.String()
}

// serverTiming is a held request's Server-Timing value: the hold, then the wake's phases.
func serverTiming(held time.Duration, phases string) string {
	v := "hold;dur=" + millis(held)
	if phases != "" {
		v += ", " + phases
	}
	return v
}

// millis is d in milliseconds with one decimal, as Server-Timing's dur.
func millis(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64)
}

// timingToken makes a phase name a Server-Timing metric name, an RFC 8941 token: a letter or "*"
// first, then tchar, ":" or "/"; every other byte becomes "_". Backings name their phases in
// snake_case, which passes unchanged.
func timingToken(name string) string {
	if name == "" {
		return "phase"
	}
	b := []byte(name)
	for i, c := range b {
		if !isTokenChar(c) {
			b[i] = '_'
		}
	}
	if c := b[0]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '*') {
		return "p" + string(b)
	}
	return string(b)
}

func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
}

// noteWake remembers the wake a held request waited on (the last, if it took several turns).
func (c *holdCharge) noteWake(att *attempt) {
	if c != nil && att != nil {
		c.wake = att
	}
}

// writer is what the request's response is written to: sw for a request that was not held, else
// sw with Server-Timing and the wake id set now (for an error answered by the edge) and again when
// the upstream's header is written, since the proxy may have replaced or cleared them.
func (c *holdCharge) writer(sw *statusWriter) http.ResponseWriter {
	if c.wake == nil {
		return sw
	}
	var phases string
	select {
	case <-c.wake.done: // timing is written before done is closed
		phases = c.wake.timing
	default: // the request left before the wake ended: no phases yet
	}
	tw := &timedWriter{statusWriter: sw, timing: serverTiming(c.heldFor, phases), id: c.wake.rec.rec.ID}
	tw.set()
	return tw
}

// timedWriter adds a held request's Server-Timing entry and wake id to its final response header.
type timedWriter struct {
	*statusWriter
	timing, id string
	done       bool // the final header has them
}

func (w *timedWriter) set() {
	h := w.Header()
	if !slices.Contains(h["Server-Timing"], w.timing) {
		h["Server-Timing"] = append(h["Server-Timing"], w.timing) // after the tenant's own entries
	}
	h[wakeIDHeader] = []string{w.id}
}

func (w *timedWriter) WriteHeader(code int) {
	if code >= http.StatusOK && !w.done { // not on a 1xx: it is not the response
		w.done = true
		w.set()
	}
	w.statusWriter.WriteHeader(code)
}

func (w *timedWriter) Write(b []byte) (int, error) {
	if !w.done {
		w.WriteHeader(http.StatusOK)
	}
	return w.statusWriter.Write(b)
}

func (w *timedWriter) Unwrap() http.ResponseWriter { return w.statusWriter }
