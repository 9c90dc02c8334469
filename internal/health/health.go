// Package health owns probing a tenant's upstream: one HTTP GET per probe, and the gate that waits for
// N consecutive passes, probing every FastPause at first, so a fast tenant is released within a
// fraction of a millisecond of listening while a slow one is not hammered.
package health

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
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
	up  registry.Upstream
	req []byte // the probe request, written as is on each fresh connection
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
	// A probe measures a fresh connection (a pooled one may point at a process that is gone), so it
	// asks the tenant to close it.
	req := "GET " + h.Path + " HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: activator-health\r\nConnection: close\r\n\r\n"
	return &Prober{cfg: h, up: u, req: []byte(req)}
}

// Probe makes one GET on a fresh connection within the configured timeout and returns nil when the
// status is in range. Redirects are not followed: a 3xx is judged by the status range like any other.
//
// It is one dial, one write and one read in the calling goroutine, not an http.Client round trip: the
// gate probes every FastPause while a tenant starts, and a client's dial and read goroutines per probe
// were CPU taken from the tenant starting on the same cores.
func (p *Prober) Probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	err := p.probe(ctx)
	if err != nil && ctx.Err() != nil {
		// The connection's deadline fired because ctx ended: say that, not "i/o timeout".
		err = ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("GET %s: %w", p.cfg.Path, err)
	}
	return nil
}

func (p *Prober) probe(ctx context.Context) error {
	c, err := p.up.Dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	// ctx ending (timeout, the caller, or the tenant gone) cuts a probe that waits on a hanging
	// tenant.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := c.Write(p.req); err != nil {
		return err
	}
	br := readers.Get().(*bufio.Reader)
	br.Reset(c)
	defer func() { br.Reset(nil); readers.Put(br) }()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode < p.cfg.MinStatus || resp.StatusCode > p.cfg.MaxStatus {
		return fmt.Errorf("status %d, want %d-%d", resp.StatusCode, p.cfg.MinStatus, p.cfg.MaxStatus)
	}
	return nil
}

var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4096) }}

// Wait probes at once, then every FastPause for FastProbes probes, then with a doubling pause up to
// the interval, until the configured number of consecutive probes pass (nil), gone is closed (ErrGone),
// or ctx ends (*GateError). A probe in flight when gone closes is cut short, so ErrGone comes promptly
// even while a probe waits on an upstream that hangs; a probe that passes before Wait sees gone closed
// still counts. A nil gone never closes. Wait starts no goroutine that outlives it, except the shared
// ticks' (tick.go), which ends within a FastPause of the last gate leaving them.
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
	// The fast phase pauses on the shared precise ticks when there are any (tick.go); a gate joins
	// them at its first pause, so one whose first probe passes costs nothing.
	var precise, joined bool
	defer func() {
		if precise {
			fastTicks.leave()
		}
	}()
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
		if !joined && probes < FastProbes {
			joined = true
			precise = fastTicks.join()
		}
		var tick <-chan struct{}
		if precise {
			tick = fastTicks.tick()
		}
		if tick != nil {
			select {
			case <-gone:
				return ErrGone
			case <-ctx.Done():
				return gateErr()
			case <-tick:
			}
		} else {
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
		}
		if probes == FastProbes && precise {
			fastTicks.leave()
			precise = false
		}
		if probes >= FastProbes {
			if pause *= 2; pause > p.cfg.Interval {
				pause = p.cfg.Interval
			}
		}
	}
}
