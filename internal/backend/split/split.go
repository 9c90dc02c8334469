// Package split is the activator's one tenant.Opener: it dispatches every route to the opener of the
// route's backing, runs a backing's live check of a route (tenant.Checker), and owns the lifetime of
// openers that hold resources their routes share (tenant.SharedCloser: the unit backing's D-Bus
// connections).
package split

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// Provider dispatches on Route.Backing. It is immutable after New and safe for concurrent use.
type Provider struct {
	openers map[string]tenant.Opener
}

var (
	_ tenant.Opener       = (*Provider)(nil)
	_ tenant.Checker      = (*Provider)(nil)
	_ tenant.SharedCloser = (*Provider)(nil)
)

// New returns a Provider over the given openers, keyed by backing name.
func New(openers map[string]tenant.Opener) *Provider {
	return &Provider{openers: maps.Clone(openers)}
}

// Open opens r's backend with the opener of r.Backing.
func (p *Provider) Open(r *registry.Route) (tenant.Backend, error) {
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
	if c, ok := p.openers[r.Backing].(tenant.Checker); ok {
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
		if c, ok := p.openers[name].(tenant.SharedCloser); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}
