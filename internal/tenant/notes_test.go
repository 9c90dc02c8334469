package tenant

import (
	"context"
	"slices"
	"testing"
)

// TestSleepNotes: NoteSleep adds to the notes its ctx carries, in order, and does nothing on a ctx
// without any (a Sleep called by a test, or by Close); List returns a copy.
func TestSleepNotes(t *testing.T) {
	NoteSleep(context.Background(), "nobody listens") // must not panic
	ctx, notes := WithSleepNotes(context.Background())
	if got := notes.List(); got != nil {
		t.Fatalf("new notes hold %q", got)
	}
	NoteSleep(ctx, "one")
	NoteSleep(context.WithoutCancel(ctx), "two") // a derived ctx carries the same notes
	got := notes.List()
	if want := []string{"one", "two"}; !slices.Equal(got, want) {
		t.Fatalf("notes %q, want %q", got, want)
	}
	got[0] = "changed"
	if notes.List()[0] != "one" {
		t.Error("List's result shares the notes' storage")
	}
}
