// Package health owns probing a tenant's upstream: one HTTP GET per probe, and the gate that waits for
// N consecutive passes, probing every millisecond at first, so a fast tenant is released
// within milliseconds of listening while a slow one is not hammered.
package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/activator/activator/internal/registry"
)

// Probe pacing: FastProbes probes FastPause apart (a refused loopback connect costs microseconds, and
// a fast tenant listens within milliseconds: a coarse backoff here would be most of the wake), then
// the pause doubles up to the configured interval.
const (
	FastPause  = time.Millisecond
	FastProbes = 50
)

// ErrGone is returned by Wait when the gone channel closed: the tenant stopped while being gated.
var ErrGone = errors.New("tenant stopped before it turned healthy")

// GateError is returned by Wait when ctx ended before the gate passed. It carries the last probe's
// result so the operator sees "last probe: connection refused", not just a timeout.
type GateError struct {
	Probes int
	Last   error
	Err    error // ctx's error
}

func (e *GateError) Error() string {
	if e.Last == nil {
		return fmt.Sprintf("health gate did not pass (%d probes): %v", e.Probes, e.Err)
	}
	return fmt.Sprintf("health gate did not pass after %d probes: last probe: %v", e.Probes, e.Last)
}

func (e *GateError) Unwrap() error { return e.Err }

// Prober probes one upstream. It is safe for concurrent use.
type Prober struct {
	cfg    registry.Health
	url    string
	client *http.Client
}

// New returns a Prober for the upstream with the route's health settings.
func New(u registry.Upstream, h registry.Health) *Prober {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return u.Dial(ctx)
		},
		// A probe measures a fresh connection: a pooled one may point at a process that is gone.
		DisableKeepAlives:     true,
		ResponseHeaderTimeout: h.Timeout,
	}
	host := u.Address
	if u.Network == "unix" {
		host = "localhost"
	}
	return &Prober{
		cfg:    h,
		url:    "http://" + host + h.Path,
		client: &http.Client{Transport: tr, CheckRedirect: noRedirect},
	}
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Probe makes one GET within the configured timeout and returns nil when the status is in range.
func (p *Prober) Probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "activator-health")
	resp, err := p.client.Do(req)
	if err != nil {
		var ue interface{ Unwrap() error }
		if errors.As(err, &ue) {
			err = ue.Unwrap() // drop the url.Error wrapper: the URL is always the same
		}
		return fmt.Errorf("GET %s: %w", p.cfg.Path, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < p.cfg.MinStatus || resp.StatusCode > p.cfg.MaxStatus {
		return fmt.Errorf("GET %s: status %d, want %d-%d", p.cfg.Path, resp.StatusCode, p.cfg.MinStatus, p.cfg.MaxStatus)
	}
	return nil
}

// Wait probes at once, then every FastPause for FastProbes probes, then with a doubling pause up to
// the interval, until the configured
// number of consecutive probes pass (nil), gone is closed (ErrGone), or ctx ends (*GateError). A nil
// gone never closes.
func (p *Prober) Wait(ctx context.Context, gone <-chan struct{}) error {
	var (
		pause  = FastPause
		passes int
		probes int
		last   error
		timer  *time.Timer
	)
	for {
		probes++
		if err := p.Probe(ctx); err != nil {
			passes = 0
			last = err
		} else {
			passes++
			last = nil
			if passes >= p.cfg.Passes {
				return nil
			}
		}
		select {
		case <-gone:
			return ErrGone
		case <-ctx.Done():
			return &GateError{Probes: probes, Last: last, Err: ctx.Err()}
		default:
		}
		if timer == nil {
			timer = time.NewTimer(pause)
			defer timer.Stop()
		} else {
			timer.Reset(pause)
		}
		select {
		case <-gone:
			return ErrGone
		case <-ctx.Done():
			return &GateError{Probes: probes, Last: last, Err: ctx.Err()}
		case <-timer.C:
		}
		if probes >= FastProbes {
			if pause *= 2; pause > p.cfg.Interval {
				pause = p.cfg.Interval
			}
		}
	}
}
