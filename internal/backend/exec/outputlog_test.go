package exec

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/activator/activator/internal/backend/backendtest"
	"github.com/activator/activator/internal/testenv"
)

// logCounts is what a logCounter saw: every record at Info and above, the "output" lines per child and
// stream, and the suppression reports.
type logCounts struct {
	level slog.Level // the least level counted (and Enabled)

	mu      sync.Mutex // guards the fields below
	records int
	lines   map[streamKey]int
	reports []report
}

type streamKey struct {
	pid    int
	stream string
}

// report is one record that carries a "suppressed" count.
type report struct {
	at     time.Time
	msg    string
	route  string
	pid    int
	stream string
	n      int
}

func newLogCounts() *logCounts { return &logCounts{lines: map[streamKey]int{}} }

// logger returns a logger whose records c counts.
func (c *logCounts) logger() *slog.Logger { return slog.New(logCounter{c: c}) }

// total is the number of records logged so far.
func (c *logCounts) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.records
}

// logged is the number of "output" records of pid's stream.
func (c *logCounts) logged(pid int, stream string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lines[streamKey{pid, stream}]
}

// reportsOf is the suppression reports about pid's stream, in the order they were logged.
func (c *logCounts) reportsOf(pid int, stream string) []report {
	c.mu.Lock()
	defer c.mu.Unlock()
	var rs []report
	for _, r := range c.reports {
		if r.pid == pid && r.stream == stream {
			rs = append(rs, r)
		}
	}
	return rs
}

// suppressed is the sum of the counts that reports give.
func suppressed(rs []report) int {
	n := 0
	for _, r := range rs {
		n += r.n
	}
	return n
}

// logCounter is a slog.Handler that counts into c.
type logCounter struct {
	c     *logCounts
	attrs []slog.Attr // from WithAttrs
}

func (h logCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= h.c.level }

func (h logCounter) WithAttrs(as []slog.Attr) slog.Handler {
	return logCounter{c: h.c, attrs: append(h.attrs[:len(h.attrs):len(h.attrs)], as...)}
}

func (h logCounter) WithGroup(string) slog.Handler { return h }

func (h logCounter) Handle(_ context.Context, r slog.Record) error {
	rep := report{at: r.Time, msg: r.Message, n: -1}
	see := func(a slog.Attr) bool {
		switch a.Key {
		case "route":
			rep.route = a.Value.String()
		case "pid":
			rep.pid = int(a.Value.Int64())
		case "stream":
			rep.stream = a.Value.String()
		case "suppressed":
			rep.n = int(a.Value.Int64())
		}
		return true
	}
	for _, a := range h.attrs {
		see(a)
	}
	r.Attrs(see)
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	h.c.records++
	if r.Message == "output" {
		h.c.lines[streamKey{rep.pid, rep.stream}]++
	}
	if rep.n >= 0 {
		h.c.reports = append(h.c.reports, rep)
	}
	return nil
}

// outputRig runs a child's output path as own does (a drain per stream, the report loop) over pipes a
// test writes to, inside the test's synctest bubble, with a logCounter behind the logger.
type outputRig struct {
	t       *testing.T
	p       *proc
	logs    *logCounts
	start   time.Time
	w       map[string]*io.PipeWriter
	written map[string]int // lines per stream
	all     []byte         // everything written, in the order it was read
	end     func()         // closes the pipes and waits for the drains and the final report; idempotent
}

// rigPID is the pid the rig's records carry.
const rigPID = 4242

func newOutputRig(t *testing.T, level slog.Level) *outputRig {
	logs := newLogCounts()
	logs.level = level
	p := &proc{pid: rigPID, marker: []byte("READY"), ready: make(chan struct{})}
	p.log = newOutputLog(logs.logger().With("backing", "exec", "route", "app"), p.pid)
	rig := &outputRig{t: t, p: p, logs: logs, start: time.Now(), w: map[string]*io.PipeWriter{}, written: map[string]int{}}
	ctx, endOutput := context.WithCancel(context.Background())
	var drains, reporter sync.WaitGroup
	for _, stream := range []string{"stdout", "stderr"} {
		r, w := io.Pipe()
		rig.w[stream] = w
		drains.Go(func() { p.drain(r, stream) })
	}
	reporter.Go(func() { p.log.run(ctx) })
	rig.end = sync.OnceFunc(func() {
		for _, w := range rig.w {
			w.Close()
		}
		drains.Wait()
		endOutput()
		reporter.Wait()
	})
	t.Cleanup(rig.end) // inside the bubble, also when the test fails early
	return rig
}

// write writes n lines ("<stream> <i> <text>") to stream at once and returns when the drain has handled
// them.
func (rig *outputRig) write(stream string, n int, text string) {
	rig.t.Helper()
	var b []byte
	for range n {
		b = fmt.Appendf(b, "%s %d %s\n", stream, rig.written[stream], text)
		rig.written[stream]++
	}
	if _, err := rig.w[stream].Write(b); err != nil {
		rig.t.Fatal(err)
	}
	synctest.Wait()
	rig.all = append(rig.all, b...)
}

// checkAccounted checks that every line written to stream was either logged or reported suppressed.
func (rig *outputRig) checkAccounted(stream string) {
	rig.t.Helper()
	logged, rs := rig.logs.logged(rigPID, stream), rig.logs.reportsOf(rigPID, stream)
	if got, want := suppressed(rs), rig.written[stream]-logged; got != want {
		rig.t.Errorf("%s: reports say %d suppressed, want %d (written %d, logged %d); reports %+v", stream, got, want, rig.written[stream], logged, rs)
	}
	for _, r := range rs {
		if r.msg != wantReport(r.n) || r.route != "app" || r.pid != rigPID || r.n <= 0 {
			rig.t.Errorf("%s: report %+v, want %q with route app and pid %d", stream, r, wantReport(r.n), rigPID)
		}
	}
}

// checkTail checks that the tail kept is the end of everything written, whatever was logged.
func (rig *outputRig) checkTail() {
	rig.t.Helper()
	want := rig.all[max(0, len(rig.all)-TailSize):]
	if got := rig.p.out.Bytes(); !bytes.Equal(got, want) {
		rig.t.Errorf("tail of %d bytes is not the last %d bytes written; it ends %q", len(got), len(want), got[max(0, len(got)-100):])
	}
}

func TestOutputLog(t *testing.T) {
	perLine := time.Second / logRate

	// A burst at once is logged up to the bucket's size; the rest is reported when the output ends. The
	// ready marker counts in a line that is not logged.
	t.Run("burst", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rig := newOutputRig(t, slog.LevelInfo)
			rig.write("stdout", 5000, "")
			rig.write("stdout", 1, "READY")
			rig.write("stdout", 4999, "")
			rig.write("stderr", 10000, "")
			rig.end()
			if got, want := rig.logs.logged(rigPID, "stdout"), logBurst; got != want {
				t.Errorf("stdout: logged %d lines, want the burst, %d", got, want)
			}
			if got := rig.logs.logged(rigPID, "stderr"); got != 0 {
				t.Errorf("stderr: logged %d lines after the burst was spent, want 0", got)
			}
			for _, stream := range []string{"stdout", "stderr"} {
				rig.checkAccounted(stream)
				if rs := rig.logs.reportsOf(rigPID, stream); len(rs) != 1 || !rs[0].at.Equal(rig.start) {
					t.Errorf("%s: reports %+v, want one when the output ended, at once", stream, rs)
				}
			}
			select {
			case <-rig.p.ready:
			default:
				t.Error("the ready marker in a suppressed line was not seen")
			}
			rig.checkTail()
		})
	})

	// A steady flood on both streams: the burst, then one line per refill, never more than burst + rate
	// × elapsed; reports come at most once per interval, and once more at the end.
	t.Run("sustained", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rig := newOutputRig(t, slog.LevelInfo)
			var elapsed time.Duration
			for elapsed = 0; ; elapsed += 10 * time.Millisecond {
				rig.write("stdout", 10, "a steady flood")
				rig.write("stderr", 10, "on both streams")
				if elapsed == 30*time.Second-10*time.Millisecond {
					break
				}
				time.Sleep(10 * time.Millisecond) // the bubble's clock
			}
			rig.end()
			logged := rig.logs.logged(rigPID, "stdout") + rig.logs.logged(rigPID, "stderr")
			bound := logBurst + int(elapsed.Seconds()*logRate)
			if want := logBurst + int(elapsed/perLine); logged != want || logged > bound {
				t.Errorf("logged %d lines in %v, want %d (at most burst + rate × elapsed = %d)", logged, elapsed, want, bound)
			}
			for _, stream := range []string{"stdout", "stderr"} {
				rig.checkAccounted(stream)
				rs := rig.logs.reportsOf(rigPID, stream)
				if most := 1 + int(elapsed/logReportEvery); len(rs) < 2 || len(rs) > most {
					t.Errorf("%s: %d reports in %v, want 2 to %d", stream, len(rs), elapsed, most)
				}
				for i := 1; i < len(rs)-1; i++ { // the last one is the end's, due at once
					if gap := rs[i].at.Sub(rs[i-1].at); gap < logReportEvery {
						t.Errorf("%s: reports %d and %d %v apart, want at least %v", stream, i-1, i, gap, logReportEvery)
					}
				}
			}
			rig.checkTail()
		})
	})

	// Lines suppressed and then silence: the report comes after the interval, without waiting for the
	// output to end, and the bucket refills meanwhile.
	t.Run("quiet_after_flood", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rig := newOutputRig(t, slog.LevelInfo)
			rig.write("stdout", 500, "")
			time.Sleep(logReportEvery + 5*time.Second) // the bubble's clock
			rs := rig.logs.reportsOf(rigPID, "stdout")
			if len(rs) != 1 || rs[0].n != 500-logBurst || !rs[0].at.Equal(rig.start.Add(logReportEvery)) {
				t.Fatalf("reports %+v while the child is quiet, want one of %d after %v", rs, 500-logBurst, logReportEvery)
			}
			rig.write("stderr", logBurst+1, "") // the bucket is full again
			rig.end()
			if got := rig.logs.logged(rigPID, "stderr"); got != logBurst {
				t.Errorf("stderr: logged %d lines after the refill, want %d", got, logBurst)
			}
			if rs := rig.logs.reportsOf(rigPID, "stdout"); len(rs) != 1 {
				t.Errorf("stdout: reports %+v, want only the one already made", rs)
			}
			if rs := rig.logs.reportsOf(rigPID, "stderr"); len(rs) != 1 || rs[0].n != 1 {
				t.Errorf("stderr: reports %+v, want one of 1 line at the end", rs)
			}
			rig.checkAccounted("stdout")
			rig.checkAccounted("stderr")
			rig.checkTail()
		})
	})

	// Output lines are logged at Info: when Info is off, nothing is logged and nothing reported.
	t.Run("info_disabled", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rig := newOutputRig(t, slog.LevelWarn)
			rig.write("stdout", 1000, "")
			rig.end()
			if got := rig.logs.total(); got != 0 {
				t.Errorf("%d records with Info disabled, want 0", got)
			}
			rig.checkTail()
		})
	})
}

// wantReport is the message of a report of n suppressed lines.
func wantReport(n int) string {
	return fmt.Sprintf("tenant output rate-limited: suppressed %d lines", n)
}

// A tenant that floods its stdout is logged at the limit's pace, at most logBurst lines plus logRate a
// second while it lives, and the lines left out are reported with their exact count; its output tail is
// whole, and it wakes, serves and sleeps as usual. Each child has a bucket of its own.
func TestOutputFlood(t *testing.T) {
	const n = 200_000
	logs := newLogCounts()
	f := newFixtureLog(t, testenv.FreeTCP(t), fmt.Sprintf("ready_marker: demoapp ready\nenv: {%s: \"%d\"}\n", floodEnv, n), logs.logger())
	out := append(floodLines(n), "demoapp ready on "+f.up.Address+"\n"...) // all the child prints on stdout
	const written = n + 1
	for cycle := range 2 {
		before := logs.total()
		start := time.Now()
		f.wake(t)
		p := f.b.proc
		backendtest.Get(t, f.subject())
		backendtest.Sleep(t, f.subject())
		elapsed := time.Since(start) // the child lived less than that: the limit's bound
		pid := p.pid

		bound := logBurst + int(elapsed.Seconds()*logRate)
		logged := logs.logged(pid, "stdout")
		if logged > bound || logged < logBurst {
			t.Errorf("cycle %d: logged %d of %d lines in %v, want from %d (the burst) to %d (burst + rate × elapsed)", cycle, logged, written, elapsed, logBurst, bound)
		}
		rs := logs.reportsOf(pid, "stdout")
		if got, want := suppressed(rs), written-logged; got != want {
			t.Errorf("cycle %d: reports say %d lines suppressed, want %d (written %d, logged %d); reports %+v", cycle, got, want, written, logged, rs)
		}
		if most := 1 + int(elapsed/logReportEvery); len(rs) == 0 || len(rs) > most {
			t.Errorf("cycle %d: %d reports in %v, want 1 to %d", cycle, len(rs), elapsed, most)
		}
		for _, r := range rs {
			if r.msg != wantReport(r.n) || r.route != "app" {
				t.Errorf("cycle %d: report %q route %q, want %q route app", cycle, r.msg, r.route, wantReport(r.n))
			}
		}
		if got := logs.logged(pid, "stderr") + len(logs.reportsOf(pid, "stderr")); got != 0 {
			t.Errorf("cycle %d: %d records about stderr, which the child never wrote to", cycle, got)
		}
		// Besides the output and its reports: spawned and stopped, and room for a warning or two.
		if got, most := logs.total()-before, bound+len(rs)+10; got > most {
			t.Errorf("cycle %d: %d log records, want at most %d", cycle, got, most)
		}

		t.Logf("cycle %d: child %d printed %d lines in %v: %d logged, %d suppressed in %d reports, %d records in all",
			cycle, pid, written, elapsed.Round(time.Millisecond), logged, suppressed(rs), len(rs), logs.total()-before)

		if want := out[len(out)-TailSize:]; !bytes.Equal(p.exit.Output, want) {
			t.Errorf("cycle %d: output tail (%d bytes) is not the last %d bytes printed; it ends %q", cycle, len(p.exit.Output), TailSize, p.exit.Output[max(0, len(p.exit.Output)-100):])
		}
	}
}
