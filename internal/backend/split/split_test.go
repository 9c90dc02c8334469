package split

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

type nopBackend struct{ name string }

func (nopBackend) Wake(context.Context, tenant.Tracker) (*tenant.Life, error) {
	return tenant.NewLife(), nil
}
func (nopBackend) Sleep(context.Context) error { return nil }

// opener records what it was asked; it optionally checks and closes.
type opener struct {
	name     string
	opened   []string
	checkErr error
	closed   int
}

func (o *opener) Open(r *registry.Route) (tenant.Backend, error) {
	o.opened = append(o.opened, r.Name)
	if r.Name == "broken" {
		return nil, errors.New("cannot open")
	}
	return nopBackend{o.name}, nil
}

type checkingOpener struct{ *opener }

func (c checkingOpener) Check(context.Context, *registry.Route) error { return c.checkErr }
func (c checkingOpener) Close() error                                 { c.closed++; return nil }

func TestDispatchOnBacking(t *testing.T) {
	ex, un := &opener{name: "exec"}, &opener{name: "unit", checkErr: errors.New("cannot freeze")}
	p := New(map[string]tenant.Opener{"exec": ex, "unit": checkingOpener{un}})
	for _, tc := range []struct {
		route, backing, want, wantErr string
	}{
		{"a", "exec", "exec", ""},
		{"b", "unit", "unit", ""},
		{"c", "kvm", "", `route "c": backing "kvm" is not available (have: exec, unit)`},
		{"broken", "exec", "", `route "broken": open exec backing: cannot open`},
	} {
		b, err := p.Open(&registry.Route{Name: tc.route, Backing: tc.backing})
		if tc.wantErr != "" {
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("Open(%s/%s) err = %v, want %q", tc.route, tc.backing, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("Open(%s/%s): %v", tc.route, tc.backing, err)
		}
		if got := b.(nopBackend).name; got != tc.want {
			t.Errorf("Open(%s/%s) went to %s, want %s", tc.route, tc.backing, got, tc.want)
		}
	}
	if len(ex.opened) != 2 || len(un.opened) != 1 {
		t.Errorf("opened exec=%v unit=%v", ex.opened, un.opened)
	}

	// Check reaches only openers that have it, and names the route and backing.
	if err := p.Check(context.Background(), &registry.Route{Name: "a", Backing: "exec"}); err != nil {
		t.Errorf("Check on an opener without Check: %v", err)
	}
	err := p.Check(context.Background(), &registry.Route{Name: "b", Backing: "unit"})
	if err == nil || !strings.Contains(err.Error(), `route "b": unit: cannot freeze`) {
		t.Errorf("Check = %v, want the unit opener's error naming route and backing", err)
	}

	if err := p.Close(); err != nil || un.closed != 1 {
		t.Errorf("Close = %v, unit opener closed %d times, want once", err, un.closed)
	}
	if got := strings.Join(p.Backings(), ","); got != "exec,unit" {
		t.Errorf("Backings = %s", got)
	}
}
