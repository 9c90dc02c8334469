package activator

// Keep-warm windows and scheduled wakes (schedule.go). The behaviour tests run in a synctest bubble
// whose clock the Server sees shifted to a chosen wall-clock time (schedClock), so a day of schedule
// passes without real waiting; the bubble also fails a test that leaves a goroutine behind.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/registry"
)

// schedClock is a clock that reads the bubble's time shifted so that it starts at start; jump moves
// it on by d at once, as a wall-clock step (NTP, a resumed VM) does, while timers keep their pace.
type schedClock struct{ off atomic.Int64 }

func newSchedClock(start time.Time) *schedClock {
	c := &schedClock{}
	c.off.Store(int64(time.Until(start)))
	return c
}

func (c *schedClock) now() time.Time       { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *schedClock) jump(d time.Duration) { c.off.Add(int64(d)) }

// until is how long the bubble must sleep for the clock to read at.
func (c *schedClock) until(at time.Time) time.Duration { return at.Sub(c.now()) }

// office is a window on every day, 08:00 to 18:00 UTC.
func office() registry.Window {
	return registry.Window{Days: [7]bool{true, true, true, true, true, true, true}, From: 8 * 60, To: 18 * 60, Zone: time.UTC,
		Text: "every day 08:00-18:00 UTC"}
}

// wakeAt parses wake_at entries (YAML, as in a config) through the registry: a Schedule has no other
// constructor.
func wakeAt(t *testing.T, entries string) []registry.Schedule {
	t.Helper()
	cfg, err := registry.Load([]byte(`
routes:
  - name: app
    host: app.test
    backing: fake
    upstream: 127.0.0.1:1
    idle: 1m
    wake_at: `+entries+`
`), map[string]registry.SettingsDecoder{"fake": func(*registry.Route, *yaml.Node) (any, error) { return nil, nil }})
	if err != nil {
		t.Fatalf("wake_at %s: %v", entries, err)
	}
	return cfg.Routes[0].WakeAt
}

// newScheduleServer is newTestServer with the clock c and the route changed by mut.
func newScheduleServer(t *testing.T, b *fakeBackend, c *schedClock, mut func(*registry.Route)) (*Server, *instance) {
	t.Helper()
	r := testRoute("app")
	mut(r)
	s := New(Options{
		Opener:  fakeProvider{b},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} },
		Now:     c.now,
	})
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{r}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s, s.instance("app")
}

func utc(s string) time.Time {
	v, err := time.Parse("2006-01-02 15:04:05", s)
	if err != nil {
		panic(err)
	}
	return v
}

// sleepUntil advances the bubble until c reads at, and lets everything due run.
func sleepUntil(c *schedClock, at string) {
	time.Sleep(c.until(utc(at)))
	synctest.Wait()
}

func wantState(t *testing.T, in *instance, at, want string) Status {
	t.Helper()
	st := in.status()
	if st.State != want {
		t.Fatalf("at %s: state %s, want %s (last sleep %q)", at, st.State, want, st.LastSleep)
	}
	return st
}

// TestKeepWarmWindow: a window's start wakes the tenant, inside it the idle window never puts it to
// sleep, and after its end the idle window applies again, counted from the window's end.
func TestKeepWarmWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		c := newSchedClock(utc("2026-12-07 07:00:00"))
		_, in := newScheduleServer(t, b, c, func(r *registry.Route) { r.KeepWarm = []registry.Window{office()} })

		st := wantState(t, in, "07:00", "asleep")
		if ev := st.NextEvent; ev == nil || ev.What != "keep_warm start" || !ev.At.Equal(utc("2026-12-07 08:00:00")) ||
			ev.Text != "every day 08:00-18:00 UTC" {
			t.Fatalf("next event before the window = %+v, want keep_warm start at 08:00", ev)
		}
		if st.KeepWarmUntil != nil {
			t.Fatalf("keep_warm_until %v outside the window", st.KeepWarmUntil)
		}

		sleepUntil(c, "2026-12-07 07:59:59")
		wantState(t, in, "07:59:59", "asleep")
		sleepUntil(c, "2026-12-07 08:00:01")
		st = wantState(t, in, "08:00:01", "awake")
		if st.LastWake == nil || st.LastWake.Trigger != "schedule" || st.LastWake.Result != ResultOK {
			t.Fatalf("wake at the window's start: %+v, want trigger schedule, ok", st.LastWake)
		}
		if ev := st.NextEvent; ev == nil || ev.What != "keep_warm end" || !ev.At.Equal(utc("2026-12-07 18:00:00")) {
			t.Fatalf("next event inside the window = %+v, want keep_warm end at 18:00", ev)
		}
		if u := st.KeepWarmUntil; u == nil || !u.Equal(utc("2026-12-07 18:00:00")) {
			t.Fatalf("keep_warm_until = %v, want 18:00", u)
		}
		raw, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`"next_event":{"at":"2026-12-07T18:00:00Z","what":"keep_warm end","text":"every day 08:00-18:00 UTC"}`,
			`"keep_warm_until":"2026-12-07T18:00:00Z"`} {
			if !strings.Contains(string(raw), want) {
				t.Errorf("status JSON %s lacks %s", raw, want)
			}
		}

		// A request inside the window, then hours with nothing in flight: the idle window (1m) passes
		// many times over, and the tenant stays up.
		rel, err := in.acquire(context.Background(), triggerRequest)
		if err != nil {
			t.Fatal(err)
		}
		rel()
		sleepUntil(c, "2026-12-07 13:00:00")
		wantState(t, in, "13:00", "awake")
		// The last request ends at 17:59:30. Its idle window would end at 18:00:30; it counts from the
		// window's end instead, the later of the two.
		sleepUntil(c, "2026-12-07 17:59:30")
		if rel, err = in.acquire(context.Background(), triggerRequest); err != nil {
			t.Fatal(err)
		}
		rel()
		sleepUntil(c, "2026-12-07 18:00:45")
		wantState(t, in, "18:00:45", "awake")
		sleepUntil(c, "2026-12-07 18:01:01")
		st = wantState(t, in, "18:01:01", "asleep")
		if st.LastSleep != ReasonIdle {
			t.Fatalf("slept for %q after the window, want idle", st.LastSleep)
		}
		if got := b.wakes.Load(); got != 1 {
			t.Fatalf("woken %d times, want 1", got)
		}
		if ev := st.NextEvent; ev == nil || ev.What != "keep_warm start" || !ev.At.Equal(utc("2026-12-08 08:00:00")) {
			t.Fatalf("next event after the window = %+v, want tomorrow's start", ev)
		}
	})
}

// TestWakeAt: a wake_at time wakes the tenant, which then sleeps after its idle window as usual.
func TestWakeAt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		c := newSchedClock(utc("2026-12-07 06:30:00"))
		schedules := wakeAt(t, `["0 7 * * mon-fri", {cron: "30 12 * * *", time_zone: UTC}]`)
		_, in := newScheduleServer(t, b, c, func(r *registry.Route) { r.WakeAt = schedules })

		if ev := in.status().NextEvent; ev == nil || ev.What != "wake_at" || ev.Text != "0 7 * * mon-fri" {
			t.Fatalf("next event = %+v, want wake_at 0 7 * * mon-fri", ev)
		}
		sleepUntil(c, "2026-12-07 06:59:59")
		wantState(t, in, "06:59:59", "asleep")
		sleepUntil(c, "2026-12-07 07:00:01")
		st := wantState(t, in, "07:00:01", "awake")
		if st.LastWake == nil || st.LastWake.Trigger != "schedule" {
			t.Fatalf("wake at 07:00: %+v, want trigger schedule", st.LastWake)
		}
		if st.KeepWarmUntil != nil {
			t.Fatalf("keep_warm_until %v without a window", st.KeepWarmUntil)
		}
		if ev := st.NextEvent; ev == nil || ev.What != "wake_at" || ev.Text != "30 12 * * * UTC" || !ev.At.Equal(utc("2026-12-07 12:30:00")) {
			t.Fatalf("next event after 07:00 = %+v, want wake_at 12:30", ev)
		}
		sleepUntil(c, "2026-12-07 07:01:02")
		wantState(t, in, "07:01:02", "asleep")
		sleepUntil(c, "2026-12-07 12:30:01")
		wantState(t, in, "12:30:01", "awake")
		if got := b.wakes.Load(); got != 2 {
			t.Fatalf("woken %d times, want 2", got)
		}
	})
}

// TestKeepWarmMidWindow: an instance that starts inside a window, at start-up or because a reload
// added or changed its route, wakes the tenant at once.
func TestKeepWarmMidWindow(t *testing.T) {
	t.Run("start-up", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newSchedClock(utc("2026-12-07 10:00:00"))
			_, in := newScheduleServer(t, &fakeBackend{}, c, func(r *registry.Route) { r.KeepWarm = []registry.Window{office()} })
			synctest.Wait()
			if st := wantState(t, in, "10:00", "awake"); st.LastWake.Trigger != "schedule" {
				t.Fatalf("woken by %s, want schedule", st.LastWake.Trigger)
			}
		})
	})
	t.Run("reload", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := &fakeBackend{}
			c := newSchedClock(utc("2026-12-07 10:00:00"))
			s, in := newScheduleServer(t, b, c, func(*registry.Route) {})
			synctest.Wait()
			wantState(t, in, "10:00", "asleep")
			r := testRoute("app")
			r.KeepWarm = []registry.Window{office()}
			if err := s.Apply(&registry.Config{Routes: []*registry.Route{r}}); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			if st := wantState(t, s.instance("app"), "10:00", "awake"); st.LastWake.Trigger != "schedule" {
				t.Fatalf("woken by %s, want schedule", st.LastWake.Trigger)
			}
			if got := b.wakes.Load(); got != 1 {
				t.Fatalf("woken %d times, want 1", got)
			}
		})
	})
}

// TestScheduledWakeFails: a scheduled wake that fails is recorded and backs off like any other, and is
// not retried until the next event.
func TestScheduledWakeFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{wakeErr: errors.New("exited with code 3")}
		c := newSchedClock(utc("2026-12-07 07:00:00"))
		_, in := newScheduleServer(t, b, c, func(r *registry.Route) { r.KeepWarm = []registry.Window{office()} })
		sleepUntil(c, "2026-12-07 08:00:01")
		st := wantState(t, in, "08:00:01", "failed")
		if st.LastWake == nil || st.LastWake.Trigger != "schedule" || st.LastWake.Result != ResultFailed {
			t.Fatalf("failed scheduled wake recorded as %+v", st.LastWake)
		}
		sleepUntil(c, "2026-12-07 17:00:00")
		if got := b.wakes.Load(); got != 1 {
			t.Fatalf("woken %d times in the window after a failure, want 1 (no retry loop)", got)
		}
		b.set(func(f *fakeBackend) { f.wakeErr = nil })
		sleepUntil(c, "2026-12-08 08:00:01")
		wantState(t, in, "next day 08:00:01", "awake")
	})
}

// TestScheduleClockStep: a wall-clock step is noticed within a minute, though the timer runs on the
// monotonic clock.
func TestScheduleClockStep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newSchedClock(utc("2026-12-07 06:00:00"))
		_, in := newScheduleServer(t, &fakeBackend{}, c, func(r *registry.Route) { r.KeepWarm = []registry.Window{office()} })
		synctest.Wait()
		c.jump(3 * time.Hour) // 09:00: inside the window
		time.Sleep(61 * time.Second)
		synctest.Wait()
		wantState(t, in, "09:01 after the step", "awake")
	})
}

// TestRetireStopsSchedule: a removed route's scheduler ends with it, so the instance's goroutines join
// (Apply's pruneRetiredLocked waits on them under the Server's lock) and no wake follows.
func TestRetireStopsSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{}
		c := newSchedClock(utc("2026-12-07 07:00:00"))
		s, in := newScheduleServer(t, b, c, func(r *registry.Route) {
			r.KeepWarm = []registry.Window{office()}
			r.WakeAt = wakeAt(t, `["*/5 * * * *"]`)
		})
		if err := s.Apply(&registry.Config{}); err != nil {
			t.Fatal(err)
		}
		joined := make(chan struct{})
		go func() {
			<-in.retired
			in.wg.Wait()
			close(joined)
		}()
		synctest.Wait()
		select {
		case <-joined:
		default:
			t.Fatal("the retired instance's goroutines did not join: its scheduler is still running")
		}
		time.Sleep(c.until(utc("2026-12-07 09:00:00")))
		synctest.Wait()
		if got := b.wakes.Load(); got != 0 {
			t.Fatalf("a retired route was woken %d times", got)
		}
	})
}

// TestNextEventDST: windows and schedules are computed on the wall clock of their zone across the
// changes of the clocks in Europe/Berlin (the last Sundays of March and October 2026).
func TestNextEventDST(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		v, err := time.ParseInLocation("2006-01-02 15:04", s, berlin)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	daily := registry.Window{Days: [7]bool{true, true, true, true, true, true, true}, From: 8 * 60, To: 18 * 60, Zone: berlin, Text: "daily"}
	night := registry.Window{Days: [7]bool{time.Saturday: true}, From: 22 * 60, To: 6 * 60, Zone: berlin, Text: "night"}
	seven := wakeAt(t, `[{cron: "0 7 * * *", time_zone: Europe/Berlin}]`)
	cases := []struct {
		name    string
		windows []registry.Window
		wakeAt  []registry.Schedule
		now     string
		what    string
		at      string // in Berlin
		until   string // keep_warm_until, "" when outside
	}{
		{"march: next start", []registry.Window{daily}, nil, "2026-03-28 19:00", "keep_warm start", "2026-03-29 08:00", ""},
		{"march: end inside", []registry.Window{daily}, nil, "2026-03-29 10:00", "keep_warm end", "2026-03-29 18:00", "2026-03-29 18:00"},
		{"march: night across the change", []registry.Window{night}, nil, "2026-03-28 23:00", "keep_warm end", "2026-03-29 06:00", "2026-03-29 06:00"},
		{"october: next start", []registry.Window{daily}, nil, "2026-10-24 19:00", "keep_warm start", "2026-10-25 08:00", ""},
		{"october: end inside", []registry.Window{daily}, nil, "2026-10-25 10:00", "keep_warm end", "2026-10-25 18:00", "2026-10-25 18:00"},
		{"october: night across the change", []registry.Window{night}, nil, "2026-10-24 23:00", "keep_warm end", "2026-10-25 06:00", "2026-10-25 06:00"},
		{"march: wake_at", nil, seven, "2026-03-28 12:00", "wake_at", "2026-03-29 07:00", ""},
		{"october: wake_at", nil, seven, "2026-10-24 12:00", "wake_at", "2026-10-25 07:00", ""},
		{"wake_at before the window", []registry.Window{daily}, seven, "2026-03-28 19:00", "wake_at", "2026-03-29 07:00", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &registry.Route{KeepWarm: c.windows, WakeAt: c.wakeAt}
			ev, until, ok := nextEvent(r, at(c.now))
			if !ok || ev.What != c.what || !ev.At.Equal(at(c.at)) {
				t.Errorf("next event at %s = %s at %v (ok %v), want %s at %v", c.now, ev.What, ev.At, ok, c.what, at(c.at))
			}
			if c.until == "" && !until.IsZero() || c.until != "" && !until.Equal(at(c.until)) {
				t.Errorf("keep_warm_until at %s = %v, want %q", c.now, until, c.until)
			}
		})
	}
}

// TestKeepWarmStartDuringBackoff: a window that starts while the route backs off from a failed wake
// (a request's, a minute before) wakes the tenant once the backoff is over, inside the window. Found
// with the real binary: the window's start was refused by the backoff, nothing tried again, and the
// window stayed cold to its end.
func TestKeepWarmStartDuringBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{wakeErr: errors.New("exited with code 3")}
		c := newSchedClock(utc("2026-12-07 07:59:00"))
		_, in := newScheduleServer(t, b, c, func(r *registry.Route) {
			r.KeepWarm = []registry.Window{office()}
			r.Backoff = registry.Backoff{Initial: 100 * time.Second, Max: time.Hour}
		})
		if err := <-request(in); err == nil {
			t.Fatal("the failing wake succeeded")
		}
		b.set(func(f *fakeBackend) { f.wakeErr = nil }) // fixed, but the route backs off until 08:00:40
		sleepUntil(c, "2026-12-07 08:00:01")
		wantState(t, in, "08:00:01", "failed")
		sleepUntil(c, "2026-12-07 08:00:41")
		st := wantState(t, in, "08:00:41", "awake")
		if st.LastWake == nil || st.LastWake.Trigger != "schedule" {
			t.Errorf("the wake after the backoff: %+v, want a scheduled one", st.LastWake)
		}
	})
}

// TestWindowStartsAsAnotherEnds: of two windows, one ending as the other starts, the second's start
// is an event: the tenant, put to sleep inside the first, wakes at it. The first's end had won the
// tie, after which the second's start was a day away.
func TestWindowStartsAsAnotherEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		every := [7]bool{true, true, true, true, true, true, true}
		first := registry.Window{Days: every, From: 8 * 60, To: 9 * 60, Zone: time.UTC, Text: "08:00-09:00"}
		second := registry.Window{Days: every, From: 9 * 60, To: 11 * 60, Zone: time.UTC, Text: "09:00-11:00"}
		b := &fakeBackend{}
		c := newSchedClock(utc("2026-12-07 07:59:00"))
		s, in := newScheduleServer(t, b, c, func(r *registry.Route) { r.KeepWarm = []registry.Window{first, second} })
		sleepUntil(c, "2026-12-07 08:00:01")
		wantState(t, in, "08:00:01", "awake")
		if err := s.Sleep(t.Context(), "app"); err != nil {
			t.Fatal(err)
		}
		sleepUntil(c, "2026-12-07 09:00:01")
		wantState(t, in, "09:00:01", "awake")
	})
}

// TestWakeAtAsAWindowEnds: a wake_at time that is also a keep_warm window's end wakes a tenant put to
// sleep inside the window. Both events fell at one time, the window's end was taken, and the next
// look, for events after it, had passed the wake_at: that day's wake_at never fired.
func TestWakeAtAsAWindowEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		every := [7]bool{true, true, true, true, true, true, true}
		window := registry.Window{Days: every, From: 8 * 60, To: 9 * 60, Zone: time.UTC, Text: "08:00-09:00"}
		nine := wakeAt(t, `[{cron: "0 9 * * *", time_zone: UTC}]`)
		b := &fakeBackend{}
		c := newSchedClock(utc("2026-12-07 07:59:00"))
		s, in := newScheduleServer(t, b, c, func(r *registry.Route) {
			r.KeepWarm = []registry.Window{window}
			r.WakeAt = nine
		})
		sleepUntil(c, "2026-12-07 08:00:01")
		wantState(t, in, "08:00:01", "awake")
		if err := s.Sleep(t.Context(), "app"); err != nil {
			t.Fatal(err)
		}
		sleepUntil(c, "2026-12-07 09:00:01")
		st := wantState(t, in, "09:00:01", "awake")
		if st.LastWake == nil || st.LastWake.Trigger != "schedule" {
			t.Fatalf("wake at 09:00: %+v, want trigger schedule", st.LastWake)
		}
	})
}
