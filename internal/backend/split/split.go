// Package split is the activator's one Provider: it dispatches every route to the opener of the route's
// backing, so all backings share the activator's singleflight wakes, idle clock and state machine, and
// it owns the lifetime of openers that hold shared resources (the unit backing's D-Bus connections).
package split

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/registry"
)

// Opener opens one route's Backend for one backing.
type Opener interface {
	Open(r *registry.Route) (activator.Backend, error)
}

// Checker is an optional Opener ability: a live check of a route's settings against the host (e.g.
// "this systemd cannot freeze units"), run by `activator check` and at load. It must not wake anything.
type Checker interface {
	Check(ctx context.Context, r *registry.Route) error
}

// Closer is an optional Opener ability, called once when the activator shuts down, after every route's
// backend has been closed.
type Closer interface {
	Close() error
}

// Provider dispatches on Route.Backing. It is immutable after New and safe for concurrent use.
type Provider struct {
	openers map[string]Opener
}

var _ activator.Provider = (*Provider)(nil)

// New returns a Provider over the given openers, keyed by backing name.
func New(openers map[string]Opener) *Provider {
	return &Provider{openers: maps.Clone(openers)}
}

// Open opens r's backend with the opener of r.Backing.
func (p *Provider) Open(r *registry.Route) (activator.Backend, error) {
	o, ok := p.openers[r.Backing]
	if !ok {
		return nil, fmt.Errorf("route %q: backing %q is not available (have: %s)", r.Name, r.Backing, strings.Join(p.Backings(), ", "))
	}
	b, err := o.Open(r)
	if err != nil {
		return nil, fmt.Errorf("route %q: open %s backing: %w", r.Name, r.Backing, err)
	}
	return b, nil
}

// Check runs the live check of r's backing, if it has one.
func (p *Provider) Check(ctx context.Context, r *registry.Route) error {
	if c, ok := p.openers[r.Backing].(Checker); ok {
		if err := c.Check(ctx, r); err != nil {
			return fmt.Errorf("route %q: %s: %w", r.Name, r.Backing, err)
		}
	}
	return nil
}

// Backings lists the backing names this Provider serves, sorted.
func (p *Provider) Backings() []string { return slices.Sorted(maps.Keys(p.openers)) }

// Close closes every opener that has a Close.
func (p *Provider) Close() error {
	var errs []error
	for _, name := range p.Backings() {
		if c, ok := p.openers[name].(Closer); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}
