package exec

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"
)

// The rate limit on a child's output lines in the activator's log. A burst such as a start-up banner or
// a stack trace is logged whole; a flood is logged at a trickle, and the lines left out are counted and
// reported. Only the log is limited: the output tail (ExitError.Output) and the ready marker see every
// line.
const (
	// logBurst is how many lines are logged at once before the limit applies.
	logBurst = 100
	// logRate is how many lines a second are logged after the burst. The bucket refills at this rate, up
	// to logBurst.
	logRate = 20
	// logReportEvery is the shortest time between two reports of suppressed lines, except the final one.
	logReportEvery = 10 * time.Second
)

// outputLog logs one child's output lines at Info. A single token bucket covers stdout and stderr
// together. Lines beyond the limit are counted per stream and reported at Warn as "tenant output
// rate-limited: suppressed N lines". run reports them at most once per logReportEvery, and once more
// when it returns, so every suppressed line is counted in a report. line is safe for concurrent use by
// the two drains.
type outputLog struct {
	log  *slog.Logger  // the route's logger
	pid  int           // logged with every line
	kick chan struct{} // buffered 1: a line was suppressed, so run starts its report interval

	mu         sync.Mutex     // guards the fields below
	tokens     int            // lines that may be logged now, at most logBurst
	refilled   time.Time      // time up to which tokens has been refilled
	suppressed map[string]int // lines left out since the last report, per stream
}

func newOutputLog(log *slog.Logger, pid int) *outputLog {
	return &outputLog{
		log:        log,
		pid:        pid,
		kick:       make(chan struct{}, 1),
		tokens:     logBurst,
		refilled:   time.Now(),
		suppressed: map[string]int{},
	}
}

// line logs a line of stream, unless Info is disabled or the limit is reached.
func (l *outputLog) line(stream string, line []byte) {
	if !l.log.Enabled(context.Background(), slog.LevelInfo) || !l.allow(stream) {
		return
	}
	l.log.Info("output", "stream", stream, "pid", l.pid, "line", string(bytes.TrimRight(line, "\r\n")))
}

// allow takes a token for a line of stream. Without a token left, it counts the line as suppressed.
func (l *outputLog) allow(stream string) bool {
	const perLine = time.Second / logRate
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := now.Sub(l.refilled) / perLine; n > 0 {
		l.tokens = int(min(logBurst, int64(l.tokens)+int64(n)))
		l.refilled = l.refilled.Add(n * perLine)
		if l.tokens == logBurst {
			l.refilled = now // a full bucket saves no credit
		}
	}
	if l.tokens > 0 {
		l.tokens--
		return true
	}
	l.suppressed[stream]++
	select {
	case l.kick <- struct{}{}:
	default: // run already knows
	}
	return false
}

// run reports suppressed lines at most logReportEvery after they were suppressed, and at most once per
// logReportEvery. It returns once ctx ends, after a final report. The owner cancels ctx after both
// drains have returned.
func (l *outputLog) run(ctx context.Context) {
	defer l.report()
	for {
		select {
		case <-l.kick:
		case <-ctx.Done():
			return
		}
		t := time.NewTimer(logReportEvery)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		l.report()
	}
}

// report logs the lines suppressed since the last report, one record per stream, and resets the counts.
func (l *outputLog) report() {
	l.mu.Lock()
	counts := l.suppressed
	if len(counts) > 0 {
		l.suppressed = map[string]int{}
	}
	l.mu.Unlock()
	for _, stream := range slices.Sorted(maps.Keys(counts)) {
		n := counts[stream]
		l.log.Warn(fmt.Sprintf("tenant output rate-limited: suppressed %d lines", n), "stream", stream, "pid", l.pid, "suppressed", n)
	}
}
