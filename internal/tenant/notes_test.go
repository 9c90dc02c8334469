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

// TestForcedSleep: NoteForcedSleep adds its note in order with the others and marks the sleep forced;
// NoteSleep alone does not, and a later plain note does not unmark it.
func TestForcedSleep(t *testing.T) {
	NoteForcedSleep(context.Background(), "nobody listens") // must not panic
	ctx, notes := WithSleepNotes(context.Background())
	NoteSleep(ctx, "pressed twice")
	if notes.Forced() {
		t.Fatal("a plain note marked the sleep forced")
	}
	NoteForcedSleep(ctx, "killed")
	NoteSleep(ctx, "after")
	if !notes.Forced() {
		t.Error("NoteForcedSleep did not mark the sleep forced")
	}
	if got, want := notes.List(), []string{"pressed twice", "killed", "after"}; !slices.Equal(got, want) {
		t.Errorf("notes %q, want %q", got, want)
	}
}
