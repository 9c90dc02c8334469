package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/activator/activator/internal/activator"
)

// TestPrintStatusNextEvent: the status table's note shows a route's next keep_warm or wake_at event,
// after its errors.
func TestPrintStatusNextEvent(t *testing.T) {
	now := time.Date(2026, 12, 7, 7, 0, 0, 0, time.UTC)
	ev := &activator.ScheduledEvent{At: now.Add(time.Hour), What: "keep_warm start", Text: "mon-fri 08:00-18:00 UTC"}
	var out bytes.Buffer
	printStatus(&out, []activator.Status{
		{Route: "office", Backing: "exec", State: "asleep", Since: now, NextEvent: ev},
		{Route: "broken", Backing: "exec", State: "failed", Since: now, LastError: "wake failed", NextEvent: ev},
	}, now, statusNoteMax)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("got %d lines, want a header and 2 routes:\n%s", len(lines), out.String())
	}
	if !strings.HasSuffix(lines[1], "  next keep_warm start 2026-12-07T08:00:00Z") {
		t.Errorf("line %q does not end with the next event", lines[1])
	}
	if !strings.HasSuffix(lines[2], "  wake failed; next keep_warm start 2026-12-07T08:00:00Z") {
		t.Errorf("line %q does not show the error, then the next event", lines[2])
	}
}
