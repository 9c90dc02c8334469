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
	"sync"
	"time"

	"github.com/activator/activator/internal/registry"
)

// Probe pacing: FastProbes probes FastPause apart (a refused loopback connect costs microseconds, and
// a fast tenant listens within milliseconds: a coarse backoff here would be most of the wake), then
// the pause doubles up to the configured interval.
const (
	FastPause  = 200 * time.Microsecond
	FastProbes = 250
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
	cfg registry.Health
	url string
	up  registry.Upstream

	// The client is built on the first probe: with thousands of configured routes most never wake,
	// and an http.Transport per route was an eighth of the activator's heap.
	once   sync.Once
	client *http.Client // set once by once.Do, read after it
}

// New returns a Prober for the upstream with the route's health settings. Zero fields (as in a Health
// built by hand rather than by the registry) take the registry's defaults: path "/", status 200-399,
// a 2s timeout, a 1s interval, one pass.
func New(u registry.Upstream, h registry.Health) *Prober {
	if h.Path == "" {
		h.Path = "/"
	}
	if h.MinStatus == 0 && h.MaxStatus == 0 {
		h.MinStatus, h.MaxStatus = 200, 399
	}
	if h.Timeout <= 0 {
		h.Timeout = registry.DefaultProbeTimeout
	}
	if h.Interval <= 0 {
		h.Interval = registry.DefaultInterval
	}
	if h.Passes < 1 {
		h.Passes = 1
	}
	host := u.Address
	if u.Network == "unix" {
		host = "localhost"
	}
	return &Prober{cfg: h, url: "http://" + host + h.Path, up: u}
}

func (p *Prober) httpClient() *http.Client {
	p.once.Do(func() {
		u := p.up
		tr := &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return u.Dial(ctx)
			},
			// A probe measures a fresh connection: a pooled one may point at a process that is gone.
			DisableKeepAlives:     true,
			ResponseHeaderTimeout: p.cfg.Timeout,
		}
		p.client = &http.Client{Transport: tr, CheckRedirect: noRedirect}
	})
	return p.client
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
	resp, err := p.httpClient().Do(req)
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
// the interval, until the configured number of consecutive probes pass (nil), gone is closed (ErrGone),
// or ctx ends (*GateError). A probe in flight when gone closes is cut short, so ErrGone comes promptly
// even while a probe waits on an upstream that hangs; a probe that passes before Wait sees gone closed
// still counts. A nil gone never closes. Wait starts no goroutine that outlives it.
func (p *Prober) Wait(ctx context.Context, gone <-chan struct{}) error {
	var (
		pause  = FastPause
		passes int
		probes int
		last   error
		timer  *time.Timer
	)
	// Probes run on pctx, which also ends when gone closes.
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if gone != nil {
		var wg sync.WaitGroup
		stop := make(chan struct{})
		defer wg.Wait()
		defer close(stop)
		wg.Go(func() {
			select {
			case <-gone:
				cancel()
			case <-stop:
			}
		})
	}
	gateErr := func() error {
		return &GateError{Probes: probes, Last: last, Err: ctx.Err()}
	}
	for {
		probes++
		err := p.Probe(pctx)
		select {
		case <-gone:
			if err != nil {
				return ErrGone
			}
		default:
		}
		if err != nil && ctx.Err() != nil {
			// ctx ended during this probe: the previous probe's result says more than "deadline
			// exceeded".
			if last == nil {
				last = err
			}
			return gateErr()
		}
		if err != nil {
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
			return gateErr()
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
			return gateErr()
		case <-timer.C:
		}
		if probes >= FastProbes {
			if pause *= 2; pause > p.cfg.Interval {
				pause = p.cfg.Interval
			}
		}
	}
}
