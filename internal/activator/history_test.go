package activator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
	"github.com/activator/activator/internal/testenv"
)

func TestHistoryRingKeepsTheNewest(t *testing.T) {
	h := newHistory()
	for i := range HistorySize + 7 {
		h.add(Event{Kind: EventSleep, Sleep: &SleepRecord{Reason: fmt.Sprint(i)}}, nil)
	}
	all := h.last(0)
	if len(all) != HistorySize {
		t.Fatalf("len(last(0)) = %d, want %d", len(all), HistorySize)
	}
	if got, want := all[0].Sleep.Reason, "7"; got != want {
		t.Errorf("oldest kept = %s, want %s", got, want)
	}
	if got, want := all[len(all)-1].Sleep.Reason, fmt.Sprint(HistorySize+6); got != want {
		t.Errorf("newest = %s, want %s", got, want)
	}
	three := h.last(3)
	if len(three) != 3 || three[2].Sleep.Reason != all[len(all)-1].Sleep.Reason || three[0].Sleep.Reason != all[len(all)-3].Sleep.Reason {
		t.Errorf("last(3) = %+v, want the three newest, oldest first", three)
	}
	if got := newHistory().last(5); len(got) != 0 {
		t.Errorf("empty history: last(5) = %v", got)
	}
	if got := h.last(HistorySize + 100); len(got) != HistorySize {
		t.Errorf("last(more than kept) = %d events, want %d", len(got), HistorySize)
	}
}

// TestHistoryInTheOrderEventsBegan: events are listed in the order they began, though the ring has
// them in the order they ended: a wake that began before a sleep but ended after it (a reload's new
// instance shares the ring) comes first. Found by an operator trial: `explain --last 4` listed an event
// of 16:51:59 after one of 16:52:07.
func TestHistoryInTheOrderEventsBegan(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 16, 51, 0, 0, time.UTC)
	h := newHistory()
	h.add(Event{Kind: EventSleep, Sleep: &SleepRecord{Reason: "first", Started: t0}}, nil)
	h.add(Event{Kind: EventSleep, Sleep: &SleepRecord{Reason: "later", Started: t0.Add(67 * time.Second)}}, nil)
	h.add(Event{Kind: EventWake, Wake: &WakeRecord{Trigger: "earlier", Started: t0.Add(59 * time.Second), Duration: 9 * time.Second}}, nil)
	got := h.last(0)
	if len(got) != 3 || got[0].Sleep == nil || got[1].Wake == nil || got[2].Sleep == nil || got[2].Sleep.Reason != "later" {
		t.Fatalf("events %+v, want first, the wake that began earlier, later", got)
	}
	if two := h.last(2); len(two) != 2 || two[0].Wake == nil || two[1].Sleep.Reason != "later" {
		t.Errorf("last(2) = %+v, want the two that ended last, in the order they began", two)
	}
}

// tailErr is an error carrying an output tail, as exec's ExitError does.
type tailErr struct{}

func (tailErr) Error() string { return "exited with code 3: boom" }
func (tailErr) Tail() string  { return "line one\nboom" }

func TestHistoryRecordsWakesAndSleeps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		s, in := newTestServer(t, b, passGate{}, func(r *registry.Route) { r.Health.Budget = 20 * time.Second })
		if err := s.Wake(context.Background(), "app"); err != nil {
			t.Fatal(err)
		}
		if err := s.Sleep(context.Background(), "app"); err != nil {
			t.Fatal(err)
		}
		b.set(func(f *fakeBackend) { f.wakeErr = fmt.Errorf("spawn: %w", tailErr{}) })
		if err := s.Wake(context.Background(), "app"); err == nil {
			t.Fatal("wake with a failing backend succeeded")
		}
		evs := in.hist.last(0)
		if len(evs) != 3 {
			t.Fatalf("history has %d events, want 3 (wake, sleep, failed wake): %+v", len(evs), evs)
		}
		w := evs[0].Wake
		if evs[0].Kind != EventWake || w == nil || w.Result != ResultOK || w.Trigger != "admin" {
			t.Fatalf("event 0 = %+v, want an ok admin wake", evs[0])
		}
		if w.Budget != 30*time.Second {
			t.Errorf("wake budget = %v, want the route's 30s", w.Budget)
		}
		if len(w.Phases) != 2 || w.Phases[0].Name != "spawn" || w.Phases[1].Name != tenant.PhaseHealth {
			t.Fatalf("phases = %+v, want spawn, health", w.Phases)
		}
		if w.Phases[0].Start != 0 || w.Phases[1].Start < w.Phases[0].Start+w.Phases[0].Duration-1 {
			t.Errorf("phase starts = %v, %v: want 0 and after spawn", w.Phases[0].Start, w.Phases[1].Start)
		}
		if w.Phases[1].Budget != 20*time.Second || w.Phases[0].Budget != 0 {
			t.Errorf("phase budgets = %v, %v; want 0 and the health budget 20s", w.Phases[0].Budget, w.Phases[1].Budget)
		}
		sl := evs[1].Sleep
		if evs[1].Kind != EventSleep || sl == nil || sl.Reason != ReasonAdmin || sl.Result != ResultOK || sl.Route != "app" {
			t.Errorf("event 1 = %+v, want an ok admin sleep of app", evs[1])
		}
		f := evs[2].Wake
		if f == nil || f.Result != ResultFailed || f.OutputTail != "line one\nboom" || f.Error == "" {
			t.Errorf("event 2 = %+v, want a failed wake keeping the output tail", evs[2])
		}
	})
}

func TestHistoryRecordsTenantExit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		s, in := newTestServer(t, b, passGate{})
		if err := s.Wake(context.Background(), "app"); err != nil {
			t.Fatal(err)
		}
		b.mu.Lock()
		b.life.End(tailErr{})
		b.mu.Unlock()
		synctest.Wait()
		evs := in.hist.last(0)
		if len(evs) != 2 || evs[1].Sleep == nil || evs[1].Sleep.Reason != ReasonExited || evs[1].Sleep.OutputTail != "line one\nboom" {
			t.Fatalf("history = %+v, want the wake then an exited sleep keeping the output tail", evs)
		}
	})
}

func TestHistoryKeptAcrossReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		s, old := newTestServer(t, b, passGate{})
		if err := s.Wake(context.Background(), "app"); err != nil {
			t.Fatal(err)
		}
		// Unchanged: the same instance, so the same history.
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("app")}}); err != nil {
			t.Fatal(err)
		}
		if s.instance("app") != old {
			t.Fatal("an unchanged route got a new instance")
		}
		// Changed: a new instance, which carries the history over; the old one's reload sleep lands in it.
		r := testRoute("app")
		r.WakeBudget += time.Second // a change of the tenant's own (an edge-only one hands the tenant over: TestReloadHandsTheTenantOver)
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{r}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		evs := s.instance("app").hist.last(0)
		if len(evs) != 2 || evs[0].Kind != EventWake || evs[1].Sleep == nil || evs[1].Sleep.Reason != ReasonReload {
			t.Fatalf("history after the change = %+v, want the wake and the old instance's reload sleep", evs)
		}
		if n := b.lastSleeps.Load(); n != 1 {
			t.Errorf("the retiring instance's sleep was marked tenant.LastSleep %d times, want 1 (its backend is closed next)", n)
		}
	})
}

// TestStatusKeepsTheLastWakeAcrossReload: after a reload that changes a route, its status still shows
// the last wake, a failed one included, with its error, until the new instance has a wake of its own.
// Found by an operator trial: ActivatorWakeFailed sent the operator to `activator status`, which
// showed the route asleep with no last wake once the reload meant to fix it was in.
func TestStatusKeepsTheLastWakeAcrossReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{wakeErr: errors.New("exited with code 3: no config")}
		s, _ := newTestServer(t, b, passGate{})
		if err := s.Wake(context.Background(), "app"); err == nil {
			t.Fatal("the wake succeeded")
		}
		r := testRoute("app")
		r.WakeBudget *= 2
		if err := s.Apply(&registry.Config{Routes: []*registry.Route{r}}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		st := s.instance("app").status()
		if st.LastWake == nil || st.LastWake.Outcome != OutcomeFailed || !strings.Contains(st.LastWake.Error, "code 3") {
			t.Errorf("status after the reload: last wake %+v, want the failed one with its error", st.LastWake)
		}
	})
}

// TestWokeLogNamesTheWake: the log line of a wake that succeeded carries its wake_id, which every held
// request's answer carries too (Activator-Wake-Id), so the id a client reports finds the line. Found
// by an operator trial: only a failed wake's line had it.
func TestWokeLogNamesTheWake(t *testing.T) {
	var logs testenv.SyncBuffer
	s := New(Options{Opener: fakeProvider{&fakeBackend{}}, Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} }})
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("app")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Wake(context.Background(), "app"); err != nil {
		t.Fatal(err)
	}
	id := s.instance("app").status().LastWake.ID
	// The line is written just after the waiters are released, by the wake's goroutine, which
	// Shutdown waits for.
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), `"msg":"woke","route":"app","backing":"fake","wake_id":"`+id+`"`) {
		t.Errorf("no woke line with wake_id %s in %s", id, logs.String())
	}
}
