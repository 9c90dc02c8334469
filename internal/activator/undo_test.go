package activator

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// adopting is a fakeBackend that finds its tenant running: Adopt hands over a Life, awake.
type adopting struct{ *fakeBackend }

func (a adopting) Adopt(context.Context) (*tenant.Life, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.life = tenant.NewLife()
	return a.life, true, nil
}

// adoptingStopper is a stopperBackend that finds its tenant running.
type adoptingStopper struct{ *stopperBackend }

func (a adoptingStopper) Adopt(ctx context.Context) (*tenant.Life, bool, error) {
	return adopting{&a.fakeBackend}.Adopt(ctx)
}

type anyProvider struct{ b tenant.Backend }

func (p anyProvider) Open(*registry.Route) (tenant.Backend, error) { return p.b, nil }

// TestFailedAdoptGateStopsTheTenant: a tenant adopted as running that never passes the health gate
// (a unit left SIGSTOPped by an activator in another sleep mode) is stopped for real, as after any
// failed wake: Stop when the backing has one, else Sleep. Left running, the next wake would take the
// same broken tenant again.
func TestFailedAdoptGateStopsTheTenant(t *testing.T) {
	for _, withStop := range []bool{true, false} {
		name := "Stopper"
		if !withStop {
			name = "Sleep"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				sb := &stopperBackend{}
				var b tenant.Backend = adopting{&sb.fakeBackend}
				if withStop {
					b = adoptingStopper{sb}
				}
				s := New(Options{
					Opener:  anyProvider{b},
					Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
					NewGate: func(*registry.Route) Gate { return passGate{err: errors.New("no answer within 2s")} },
				})
				if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("app")}}); err != nil {
					t.Fatal(err)
				}
				defer s.Shutdown(context.Background())
				synctest.Wait()
				sb.mu.Lock()
				adopted := sb.life
				sb.mu.Unlock()
				wantStops := 0
				if withStop {
					wantStops = 1
				}
				if stops, sleeps := sb.stops.Load(), sb.sleeps.Load(); stops != int32(wantStops) || sleeps != 1 {
					t.Fatalf("after a failed adopt gate: Stop %d, Sleep %d times; want Stop %d, Sleep 1", stops, sleeps, wantStops)
				}
				if adopted != nil {
					t.Fatal("the adopted tenant still has a Life: it was not stopped")
				}
				st := s.instance("app").status()
				if st.State != "failed" || st.LastWake == nil || st.LastWake.Trigger != string(triggerAdopt) {
					t.Fatalf("status %+v, want failed after the adopt", st)
				}
				if got := phaseNamesOf(*st.LastWake); got != "adopt health stop" {
					t.Errorf("adopt record phases %q, want \"adopt health stop\"", got)
				}
			})
		})
	}
}

func phaseNamesOf(rec WakeRecord) string {
	var names []string
	for _, p := range rec.Phases {
		names = append(names, p.Name)
	}
	return strings.Join(names, " ")
}

// TestFailedSleepShowsAwake: a sleep the backing could not do leaves the tenant running, and the
// route says so: the instance takes the tenant back as awake (a wake through the backing, which takes
// a running tenant as it is, and the health gate), the status and activator_instance_state say awake,
// and the failure stays in last_sleep_error and activator_sleep_failing until a sleep succeeds.
func TestFailedSleepShowsAwake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{sleepErr: errors.New("unit app.service: freeze: not supported by this host's systemd")}
		s, reg := newMetricsServer(t, b, testRoute("app"))
		in := s.instance("app")
		if err := in.wakeNow(context.Background()); err != nil {
			t.Fatal(err)
		}
		var se *SleepError
		if err := in.sleepNow(context.Background(), ReasonAdmin); !errors.As(err, &se) {
			t.Fatalf("sleepNow = %v, want a *SleepError", err)
		}
		synctest.Wait()
		st := in.status()
		if st.State != "awake" || !strings.Contains(st.LastSleepError, "not supported by this host") {
			t.Fatalf("after a failed sleep: state %s, last_sleep_error %q; want awake with the error", st.State, st.LastSleepError)
		}
		series := routeSeries(t, reg, "app")
		if got := stateSeries(series); len(got) != 1 || got[0] != "awake" {
			t.Errorf("activator_instance_state after a failed sleep: %q, want [awake]", got)
		}
		wantValues(t, series, map[string]float64{
			`activator_sleep_failures_total{}`: 1,
			`activator_sleep_failing{}`:        1,
		}, "after a failed sleep")
		// Requests go to the running tenant, without another wake.
		wakes := b.wakes.Load()
		if err := <-request(in); err != nil {
			t.Fatalf("request after the failed sleep: %v", err)
		}
		if got := b.wakes.Load(); got != wakes {
			t.Errorf("request after the failed sleep woke the backend again (%d wakes, want %d)", got, wakes)
		}
		// The idle sleep fails too: still awake, still failing.
		time.Sleep(testRoute("app").Idle + time.Millisecond)
		synctest.Wait()
		if st := in.status(); st.State != "awake" || st.LastSleepError == "" || !strings.Contains(st.LastSleepError, "(idle)") {
			t.Fatalf("after a failed idle sleep: state %s, last_sleep_error %q", st.State, st.LastSleepError)
		}
		// A sleep that succeeds clears the failure everywhere.
		b.set(func(f *fakeBackend) { f.sleepErr = nil })
		if err := in.sleepNow(context.Background(), ReasonAdmin); err != nil {
			t.Fatalf("sleepNow: %v", err)
		}
		synctest.Wait()
		if st := in.status(); st.State != "asleep" || st.LastSleepError != "" {
			t.Fatalf("after a sleep that succeeded: state %s, last_sleep_error %q", st.State, st.LastSleepError)
		}
		series = routeSeries(t, reg, "app")
		if got := stateSeries(series); len(got) != 1 || got[0] != "asleep" {
			t.Errorf("activator_instance_state after the sleep: %q, want [asleep]", got)
		}
		wantValues(t, series, map[string]float64{`activator_sleep_failing{}`: 0}, "after a sleep that succeeded")
	})
}

// TestCheckError: a route whose host check failed at start-up says so in its status, and a wake of it
// that fails carries the check's finding in its error and its record; nil clears it.
func TestCheckError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &fakeBackend{wakeErr: errors.New("listen: address already in use")}
		s, in := newTestServer(t, b, passGate{})
		s.SetCheckError("app", errors.New("127.0.0.1:8080 is held by pid 42 (nginx)"))
		s.SetCheckError("nosuch", errors.New("ignored: no such route"))
		if got := s.Statuses()[0].CheckError; !strings.Contains(got, "pid 42 (nginx)") {
			t.Fatalf("check_error %q, want the check's finding", got)
		}
		_, err := in.acquire(context.Background(), triggerRequest)
		if err == nil || !strings.Contains(err.Error(), "pid 42 (nginx)") || !strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("failed wake: %v, want the wake's error and the check's finding", err)
		}
		st := s.Statuses()[0]
		if st.LastWake == nil || !strings.Contains(strings.Join(st.LastWake.Notes, "; "), "pid 42 (nginx)") {
			t.Errorf("wake record %+v does not carry the check's finding", st.LastWake)
		}
		s.SetCheckError("app", nil)
		if got := s.Statuses()[0].CheckError; got != "" {
			t.Errorf("check_error %q after SetCheckError(nil), want none", got)
		}
	})
}
