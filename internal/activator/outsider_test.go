package activator

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// outsiderBackend is a fakeBackend that also says its tenant runs without the activator
// (tenant.Outsider), as the unit backing does of a unit an operator started by hand.
type outsiderBackend struct {
	*fakeBackend
	mu   sync.Mutex // guards says
	says string
}

func (o *outsiderBackend) RunningOutside() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.says
}

type outsiderProvider struct{ b *outsiderBackend }

func (p outsiderProvider) Open(*registry.Route) (tenant.Backend, error) { return p.b, nil }

// TestStatusShowsATenantRunningOutside: a route that is asleep while its backing sees the tenant run
// (a unit started by hand) says so in its status, as running_outside; before, it read plainly
// asleep. An awake route does not ask: its tenant is the activator's.
func TestStatusShowsATenantRunningOutside(t *testing.T) {
	const says = "unit app.service is active, started outside the activator"
	b := &outsiderBackend{fakeBackend: &fakeBackend{}, says: says}
	s := New(Options{
		Opener:  outsiderProvider{b},
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} },
	})
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("app")}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	in := s.instance("app")

	st := in.status()
	if st.State != Asleep.String() || st.RunningOutside != says {
		t.Fatalf("asleep: state %s, running_outside %q; want asleep, %q", st.State, st.RunningOutside, says)
	}
	j, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(j), `"running_outside":"`+says+`"`) {
		t.Errorf("the admin API's status %s does not carry running_outside", j)
	}
	if err := s.Wake(t.Context(), "app"); err != nil {
		t.Fatal(err)
	}
	if st := in.status(); st.RunningOutside != "" {
		t.Errorf("awake: running_outside %q, want none", st.RunningOutside)
	}
	b.mu.Lock()
	b.says = ""
	b.mu.Unlock()
	if err := s.Sleep(t.Context(), "app"); err != nil {
		t.Fatal(err)
	}
	if st := in.status(); st.State != Asleep.String() || st.RunningOutside != "" {
		t.Errorf("asleep, nothing running: state %s, running_outside %q; want asleep and none", st.State, st.RunningOutside)
	}
}

// warnerBackend is a fakeBackend with a warning to show (tenant.Warner), as the redfish backing has
// while its BMC rejects the credentials and the awake node goes unwatched.
type warnerBackend struct {
	*fakeBackend
	says string
}

func (w *warnerBackend) Warning() string { return w.says }

// TestStatusShowsTheBackendsWarning: the backing's warning is in the route's status in any state, the
// awake one included, where nothing else would show it. Found by an operator trial: a BMC whose
// password was changed on its side left the awake route plainly awake while its watch stopped.
func TestStatusShowsTheBackendsWarning(t *testing.T) {
	const says = "the BMC rejected the credentials: the power-state watch sends nothing until ..."
	b := &warnerBackend{fakeBackend: &fakeBackend{}, says: says}
	s := New(Options{
		Opener:  fakeProviderOf(b),
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		NewGate: func(*registry.Route) Gate { return passGate{} },
	})
	if err := s.Apply(&registry.Config{Routes: []*registry.Route{testRoute("app")}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown(context.Background()) })
	if err := s.Wake(t.Context(), "app"); err != nil {
		t.Fatal(err)
	}
	st := s.instance("app").status()
	if st.State != Awake.String() || st.Warning != says {
		t.Fatalf("state %s, warning %q; want awake with %q", st.State, st.Warning, says)
	}
	if j, _ := json.Marshal(st); !strings.Contains(string(j), `"warning":"`) {
		t.Errorf("the admin API's status %s does not carry the warning", j)
	}
}

type backendProvider struct{ b tenant.Backend }

func (p backendProvider) Open(*registry.Route) (tenant.Backend, error) { return p.b, nil }

func fakeProviderOf(b tenant.Backend) backendProvider { return backendProvider{b} }
