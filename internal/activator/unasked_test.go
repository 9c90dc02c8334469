package activator

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
)

// TestUnaskedLogOncePerMinute: the first connection closed for bytes no request asked for is logged at
// once; the ones after it within unaskedEvery only counted, and the next line, once it has passed,
// gives their count. A tenant with that bug has it on every answer: a line each would flood the log.
func TestUnaskedLogOncePerMinute(t *testing.T) {
	var logs bytes.Buffer
	now := time.Unix(1_800_000_000, 0)
	in := &instance{route: &registry.Route{Name: "blog", Backing: "exec"}, baseLog: slog.New(slog.NewTextHandler(&logs, nil)),
		now: func() time.Time { return now }}
	u := &unaskedLog{in: in, upstream: "127.0.0.1:8001"}
	lines := func() []string {
		var out []string
		for l := range strings.Lines(logs.String()) {
			if strings.Contains(l, "no request asked for") {
				out = append(out, l)
			}
		}
		return out
	}
	steps := []struct {
		after     time.Duration // the clock moves on by this much, then one note
		lines     int           // lines logged so far
		lastCount string        // the last line's connections=
	}{
		{0, 1, "connections=1"},
		{time.Second, 1, ""},
		{30 * time.Second, 1, ""},
		{28 * time.Second, 1, ""},               // 59 s after the first line
		{time.Second, 2, "connections=4"},       // a minute after it: the three counted and this one
		{unaskedEvery - time.Nanosecond, 2, ""}, // just short of a minute after the second
		{2 * unaskedEvery, 3, "connections=2"},
	}
	for i, s := range steps {
		now = now.Add(s.after)
		u.note()
		got := lines()
		if len(got) != s.lines {
			t.Fatalf("step %d: %d lines logged, want %d:\n%s", i, len(got), s.lines, logs.String())
		}
		if s.lastCount != "" {
			last := got[len(got)-1]
			for _, want := range []string{s.lastCount, "route=blog", "upstream=127.0.0.1:8001", "level=WARN"} {
				if !strings.Contains(last, want) {
					t.Errorf("step %d: line %q lacks %q", i, last, want)
				}
			}
		}
	}
}
