// Package split is the activator's one tenant.Opener: it dispatches every route to the opener of the
// route's backing, runs a route's live checks (its backing's, tenant.Checker, and those every route
// shares), and owns the lifetime of openers that hold resources their routes share
// (tenant.SharedCloser: the unit backing's D-Bus connections).
package split

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
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
	_ tenant.Noter        = (*Provider)(nil)
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

// Check runs the live checks every route shares (a unix upstream that is a directory), then that of
// r's backing, if it has one, and returns every problem found.
func (p *Provider) Check(ctx context.Context, r *registry.Route) error {
	var errs []error
	if err := checkUpstream(r.Upstream); err != nil {
		errs = append(errs, fmt.Errorf("route %q: %w", r.Name, err))
	}
	if c, ok := p.openers[r.Backing].(tenant.Checker); ok {
		if err := c.Check(ctx, r); err != nil {
			errs = append(errs, fmt.Errorf("route %q: %s: %w", r.Name, r.Backing, err))
		}
	}
	return errors.Join(errs...)
}

// Notes returns what r's backing has to say about it on this host (tenant.Noter), if anything.
func (p *Provider) Notes(ctx context.Context, r *registry.Route) []string {
	if n, ok := p.openers[r.Backing].(tenant.Noter); ok {
		return n.Notes(ctx, r)
	}
	return nil
}

// checkUpstream reports a unix upstream whose path is a directory: no tenant can listen there. A path
// that does not exist yet is fine (the tenant creates its socket). The registry does not look at the
// filesystem, so this is a live check.
func checkUpstream(u registry.Upstream) error {
	if u.Network != "unix" {
		return nil
	}
	if fi, err := os.Stat(u.Address); err == nil && fi.IsDir() {
		return fmt.Errorf("upstream %s is a directory", u)
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
