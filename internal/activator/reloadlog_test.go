package activator

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
)

// TestApplyNamesFewChanges: a reload that changes or removes many routes names the first
// namedChanges of each kind and then logs their numbers once, instead of a line per route (a reload
// of 100,000 edited routes wrote 100,000 lines, and journald's rate limit then drops what follows).
func TestApplyNamesFewChanges(t *testing.T) {
	var logs bytes.Buffer
	s := loggedServer(t, &logs)
	const n = 3 * namedChanges
	routes := make([]*registry.Route, n)
	for i := range routes {
		routes[i] = testRoute(fmt.Sprintf("r%d", i))
	}
	if err := s.Apply(&registry.Config{Routes: routes}); err != nil {
		t.Fatal(err)
	}
	// A few changed and removed: each named, no summary.
	few := make([]*registry.Route, 0, n)
	for i, r := range routes {
		switch {
		case i < 3:
			c := *r
			c.Idle = 2 * time.Minute
			few = append(few, &c)
		case i < 5: // removed
		default:
			few = append(few, r)
		}
	}
	logs.Reset()
	if err := s.Apply(&registry.Config{Routes: few}); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if c, r := strings.Count(out, `msg="route changed"`), strings.Count(out, `msg="route removed"`); c != 3 || r != 2 || strings.Contains(out, "more routes") {
		t.Fatalf("a reload changing 3 and removing 2 routes logged %d changed, %d removed lines:\n%s", c, r, out)
	}
	// Every remaining route changed but ten, and those removed.
	var most []*registry.Route
	for _, r := range few[:len(few)-10] {
		c := *r
		c.Idle = 3 * time.Minute
		most = append(most, &c)
	}
	logs.Reset()
	if err := s.Apply(&registry.Config{Routes: most}); err != nil {
		t.Fatal(err)
	}
	out = logs.String()
	wantChanged := len(most)
	if c, r := strings.Count(out, `msg="route changed"`), strings.Count(out, `msg="route removed"`); c != namedChanges || r != 10 {
		t.Fatalf("a reload changing %d routes and removing 10 logged %d changed and %d removed lines, want %d and 10:\n%s", wantChanged, c, r, namedChanges, out)
	}
	want := fmt.Sprintf(`msg="more routes added, changed or removed than are named one by one" added=0 changed=%d removed=10 named_at_most=%d`, wantChanged, namedChanges)
	if !strings.Contains(out, want) {
		t.Fatalf("no summary line %q in:\n%s", want, out)
	}
}

// TestApplyNamesAddedRoutes: a reload that adds a route says so, as it says a route changed or was
// removed; the first config's routes are the start-up's and are not named. Found by an operator trial:
// a route added by a reload left only "config reloaded ... decoded=1" in the log.
func TestApplyNamesAddedRoutes(t *testing.T) {
	var logs bytes.Buffer
	s := loggedServer(t, &logs)
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("a")}}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "route added") {
		t.Errorf("the first config's route was logged as added:\n%s", logs.String())
	}
	logs.Reset()
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("a"), testRoute("b")}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), `msg="route added" route=b`) || strings.Contains(logs.String(), "route=a") {
		t.Errorf("a reload adding b logged:\n%s", logs.String())
	}
}

// loggedServer is a Server of fake backends whose log goes to logs, shut down at the test's end.
func loggedServer(t *testing.T, logs *bytes.Buffer) *Server {
	s := New(Options{
		Opener:  fakeProvider{&fakeBackend{}},
		Logger:  slog.New(slog.NewTextHandler(logs, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} },
	})
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

// TestRouteChangedSaysWhatBecomesOfTheTenant: the reload's "route changed" line says whether the
// route's running tenant is kept (only keys of the edge changed) or not, and then which key made the
// difference. Found by an operator trial: a fleet edited in its min_ready logged the same line as one
// edited in its idle, and nothing said why its nodes were then shut down.
func TestRouteChangedSaysWhatBecomesOfTheTenant(t *testing.T) {
	var logs bytes.Buffer
	s := loggedServer(t, &logs)
	a, b := testRoute("a"), testRoute("b")
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{a, b}}); err != nil {
		t.Fatal(err)
	}
	a2, b2 := *a, *b
	a2.Idle = 2 * time.Minute
	b2.WakeBudget = time.Minute
	logs.Reset()
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{&a2, &b2}}); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	for _, want := range []string{
		`msg="route changed" route=a tenant="kept running (only keys of the edge changed)"`,
		`msg="route changed" route=b tenant="not kept (wake_budget changed): put to sleep once the old instance's requests end; the next request wakes it"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no line %s in:\n%s", want, out)
		}
	}
}
