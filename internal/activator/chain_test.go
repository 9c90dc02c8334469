package activator

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// journal records the order of wakes and sleeps across backends.
type journal struct {
	mu  sync.Mutex
	ops []string
}

func (j *journal) add(op string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.ops = append(j.ops, op)
}

func (j *journal) list() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.ops)
}

// loggedBackend is a fakeBackend that writes its wakes and sleeps to a journal.
type loggedBackend struct {
	*fakeBackend
	name string
	j    *journal
}

func (b loggedBackend) Wake(ctx context.Context, t tenant.Tracker) (*tenant.Life, error) {
	life, err := b.fakeBackend.Wake(ctx, t)
	if err == nil {
		b.j.add("wake " + b.name)
	}
	return life, err
}

func (b loggedBackend) Sleep(ctx context.Context) error {
	b.j.add("sleep " + b.name)
	return b.fakeBackend.Sleep(ctx)
}

// byName opens each route's (or member's) backend by its name.
type byName map[string]tenant.Backend

func (p byName) Open(r *registry.Route) (tenant.Backend, error) {
	if b, ok := p[r.Name]; ok {
		return b, nil
	}
	return nil, errors.New("no backend for " + r.Name)
}

func testInstance(name string, requires ...string) *registry.Route {
	r := testRoute(name)
	r.Hosts, r.Instance, r.Requires = nil, true, requires
	return r
}

func newChainServer(t *testing.T, p tenant.Opener, cfg *registry.Config) *Server {
	t.Helper()
	s := New(Options{Opener: p, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} }})
	if err := s.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	return s
}

// TestChainWakesInOrderSleepsInReverse: node ← guest ← app. A request to app wakes node, then guest,
// then app, each past its gate; the record shows the tree; after the idle windows they sleep app
// first, node last, each idle window starting when its last dependent has slept.
func TestChainWakesInOrderSleepsInReverse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &journal{}
		p := byName{}
		for _, n := range []string{"node", "guest", "app"} {
			p[n] = loggedBackend{&fakeBackend{}, n, j}
		}
		app := testRoute("app")
		app.Requires = []string{"guest"}
		s := newChainServer(t, p, &registry.Config{Routes: []*registry.Route{app},
			Instances: []*registry.Route{testInstance("node"), testInstance("guest", "node")}})
		if err := s.Wake(t.Context(), "app"); err != nil {
			t.Fatal(err)
		}
		if got, want := j.list(), []string{"wake node", "wake guest", "wake app"}; !slices.Equal(got, want) {
			t.Fatalf("wakes %v, want %v", got, want)
		}
		rec := s.instance("app").status().LastWake
		if rec.Outcome != OutcomeSucceeded || len(rec.Requires) != 1 || rec.Requires[0].Instance != "guest" || rec.Requires[0].Wake == nil {
			t.Fatalf("app record %+v", rec)
		}
		inner := rec.Requires[0].Wake
		if inner.Outcome != OutcomeSucceeded || len(inner.Requires) != 1 || inner.Requires[0].Instance != "node" ||
			inner.Requires[0].State != "woken" || inner.Requires[0].Wake.Outcome != OutcomeSucceeded {
			t.Fatalf("guest record %+v", inner)
		}
		if by := s.instance("node").status().RequiredBy; !slices.Equal(by, []string{"guest"}) {
			t.Fatalf("node required_by %v", by)
		}
		time.Sleep(time.Minute + time.Second) // app's idle window; synctest's clock
		synctest.Wait()
		if got := j.list()[3:]; !slices.Equal(got, []string{"sleep app"}) {
			t.Fatalf("after one idle window: %v", got)
		}
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		if got, want := j.list()[3:], []string{"sleep app", "sleep guest", "sleep node"}; !slices.Equal(got, want) {
			t.Fatalf("sleeps %v, want %v", got, want)
		}
	})
}

// TestSharedRequirementWakesOnce: two routes that require one instance, woken at the same moment by
// many requests each, start it once.
func TestSharedRequirementWakesOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := &fakeBackend{wakeGate: make(chan struct{})}
		p := byName{"db": db, "a": &fakeBackend{}, "b": &fakeBackend{}}
		a, b := testRoute("a"), testRoute("b")
		a.Requires, b.Requires = []string{"db"}, []string{"db"}
		s := newChainServer(t, p, &registry.Config{Routes: []*registry.Route{a, b}, Instances: []*registry.Route{testInstance("db")}})
		var wg sync.WaitGroup
		errs := make(chan error, 40)
		for i := range 40 {
			in := s.instance([]string{"a", "b"}[i%2])
			wg.Go(func() {
				release, err := in.acquire(t.Context(), triggerRequest)
				if err == nil {
					release()
				}
				errs <- err
			})
		}
		synctest.Wait()
		close(db.wakeGate)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if n := db.wakes.Load(); n != 1 {
			t.Fatalf("db woken %d times", n)
		}
		if by := s.instance("db").status().RequiredBy; !slices.Equal(by, []string{"a", "b"}) {
			t.Fatalf("required_by %v", by)
		}
	})
}

// TestFailedRequirementNamesIt: node ← guest ← app, and guest's start fails for want of a binary. The
// app's wake fails naming guest, its phase and the terminal class; node, woken for that wake alone,
// goes back to sleep after its idle window; nothing hangs.
func TestFailedRequirementNamesIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		node := &fakeBackend{}
		p := byName{"node": node, "guest": &fakeBackend{wakeErr: exec.ErrNotFound}, "app": &fakeBackend{}}
		app := testRoute("app")
		app.Requires = []string{"guest"}
		s := newChainServer(t, p, &registry.Config{Routes: []*registry.Route{app},
			Instances: []*registry.Route{testInstance("node"), testInstance("guest", "node")}})
		rr := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "http://app.test/", nil)
		req.Header.Set("Accept", "application/json")
		s.ServeHTTP(rr, req)
		if rr.Code != http.StatusServiceUnavailable || rr.Header().Get("Retry-After") == "" {
			t.Fatalf("status %d, Retry-After %q", rr.Code, rr.Header().Get("Retry-After"))
		}
		if body := rr.Body.String(); !strings.Contains(body, `"fault_class":"terminal"`) || !strings.Contains(body, "phase requires (terminal fault)") {
			t.Fatalf("body %s", body)
		}
		rec := s.instance("app").status().LastWake
		if rec.Outcome != OutcomeFailed || rec.FailedPhase != phaseRequires || rec.Class != "terminal" {
			t.Fatalf("record %+v", rec)
		}
		if c := rec.Culprit; c == nil || c.Instance != "guest" || c.Phase != "spawn" || c.Class != "terminal" {
			t.Fatalf("culprit %+v", rec.Culprit)
		}
		if g := rec.Requires[0].Wake; g == nil || g.Outcome != OutcomeFailed || g.Culprit == nil || g.Culprit.Instance != "guest" {
			t.Fatalf("guest's nested record %+v", rec.Requires[0].Wake)
		}
		if st := s.instance("node").status(); st.State != "awake" || len(st.RequiredBy) != 0 {
			t.Fatalf("node %s, required by %v", st.State, st.RequiredBy)
		}
		time.Sleep(time.Minute + time.Second)
		synctest.Wait()
		if st := s.instance("node").status().State; st != "asleep" || node.sleeps.Load() != 1 {
			t.Fatalf("node %s after its idle window, %d sleeps", st, node.sleeps.Load())
		}
	})
}

// TestSleepRefusedWhileRequired: an admin sleep of an instance that an awake route requires is
// refused with 409, naming the route.
func TestSleepRefusedWhileRequired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := byName{"db": &fakeBackend{}, "app": &fakeBackend{}}
		app := testRoute("app")
		app.Requires = []string{"db"}
		s := newChainServer(t, p, &registry.Config{Routes: []*registry.Route{app}, Instances: []*registry.Route{testInstance("db")}})
		if err := s.Wake(t.Context(), "app"); err != nil {
			t.Fatal(err)
		}
		err := s.Sleep(t.Context(), "db")
		var re *RequiredError
		if !errors.As(err, &re) || !slices.Equal(re.By, []string{"app"}) {
			t.Fatalf("err %v", err)
		}
		if code, _ := statusFor(err); code != http.StatusConflict {
			t.Fatalf("status %d", code)
		}
		if err := s.Sleep(t.Context(), "app"); err != nil {
			t.Fatal(err)
		}
		if err := s.Sleep(t.Context(), "db"); err != nil {
			t.Fatalf("db once app slept: %v", err)
		}
	})
}

func asErr[T error](err error, target *T) bool { return errors.As(err, target) }

// TestReloadReplacesDependents: a reload that changes a requirement replaces its dependents too, so
// the old requirement is let go and retires, and the new one wakes for the new dependent.
func TestReloadReplacesDependents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := byName{"db": &fakeBackend{}, "app": &fakeBackend{}, "other": &fakeBackend{}}
		cfg := func(idle time.Duration) *registry.Config {
			app, other, db := testRoute("app"), testRoute("other"), testInstance("db")
			app.Requires, db.Idle = []string{"db"}, idle
			return &registry.Config{Routes: []*registry.Route{app, other}, Instances: []*registry.Route{db}}
		}
		s := newChainServer(t, p, cfg(time.Minute))
		if err := s.Wake(t.Context(), "app"); err != nil {
			t.Fatal(err)
		}
		oldApp, oldDB, oldOther := s.instance("app"), s.instance("db"), s.instance("other")
		if err := s.Apply(cfg(2 * time.Minute)); err != nil {
			t.Fatal(err)
		}
		if s.instance("app") == oldApp || s.instance("db") == oldDB || s.instance("other") != oldOther {
			t.Fatal("a changed requirement must replace its dependent, and only it")
		}
		synctest.Wait()
		select {
		case <-oldDB.retired:
		default:
			t.Fatal("the old requirement did not retire once its dependent had")
		}
		if err := s.Wake(t.Context(), "app"); err != nil {
			t.Fatal(err)
		}
		if by := s.instance("db").status().RequiredBy; !slices.Equal(by, []string{"app"}) {
			t.Fatalf("new db required_by %v", by)
		}
	})
}

// TestRequirementThatStopsIsWokenAgain: an instance whose tenant stops on its own while a route that
// requires it is awake is woken again (an instance stays awake while anything awake requires it): at
// once, or, for one that ran for less than backoff.initial, that long after its wake. Found with the real binary: a node powered off behind the activator's back stayed down, shown
// asleep with its dependent's hold in flight, while the route requiring it went on serving.
func TestRequirementThatStopsIsWokenAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := &fakeBackend{}
		app := testRoute("app")
		app.Requires = []string{"db"}
		s := newChainServer(t, byName{"app": &fakeBackend{}, "db": db}, &registry.Config{Routes: []*registry.Route{app},
			Instances: []*registry.Route{testInstance("db")}})
		if err := s.Wake(t.Context(), "app"); err != nil {
			t.Fatal(err)
		}
		db.set(func(f *fakeBackend) { f.life.End(errors.New("powered off behind our back")) })
		// It ran for no time at all: woken again a backoff.initial (5s) after its wake, not in a loop.
		time.Sleep(5*time.Second - time.Millisecond)
		synctest.Wait()
		if n := db.wakes.Load(); n != 1 {
			t.Fatalf("the requirement's wakes = %d before backoff.initial, want 1", n)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if n := db.wakes.Load(); n != 2 {
			t.Fatalf("the requirement's wakes = %d, want 2 (woken again)", n)
		}
		st := s.instance("db").status()
		if st.State != Awake.String() || st.LastWake == nil || st.LastWake.Trigger != string(triggerRequired) {
			t.Errorf("the requirement after it stopped: %s, last wake %+v; want awake again, woken for its dependents", st.State, st.LastWake)
		}
	})
}

// TestDependentBudgetEndsBeforeItsRequirement: a dependent whose own wake_budget ends while its
// requirement still wakes fails in phase requires with itself as the culprit, and the requirement
// shows as still waking, not failed: it goes on to wake. Found with the real binary: the record named
// the requirement the culprit and kept saying it failed after it had woken fine.
func TestDependentBudgetEndsBeforeItsRequirement(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := &fakeBackend{wakeGate: make(chan struct{})}
		app := testRoute("app")
		app.Requires, app.WakeBudget = []string{"db"}, 5*time.Second
		dbr := testInstance("db")
		dbr.WakeBudget = time.Minute
		s := newChainServer(t, byName{"app": &fakeBackend{}, "db": db}, &registry.Config{Routes: []*registry.Route{app},
			Instances: []*registry.Route{dbr}})
		if err := s.Wake(t.Context(), "app"); err == nil {
			t.Fatal("the dependent woke within its budget")
		}
		rec := s.instance("app").status().LastWake
		if rec == nil || rec.Culprit == nil || rec.Culprit.Instance != "app" || rec.Culprit.Phase != "requires" {
			t.Errorf("the dependent's record %+v, want itself the culprit in phase requires", rec)
		}
		if rec != nil && (len(rec.Requires) != 1 || rec.Requires[0].State != "waking") {
			t.Errorf("the requirement's part %+v, want state waking", rec.Requires)
		}
		close(db.wakeGate)
		synctest.Wait()
		if st := s.instance("db").status(); st.State != Awake.String() {
			t.Errorf("the requirement is %s, want awake: its wake went on", st.State)
		}
	})
}
