package redfish

import (
	"context"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"
)

// endpointState is what every Backend a Provider opened on one BMC endpoint shares: the BMC's throttle
// gate, and the credentials it has rejected.
type endpointState struct {
	gate  *throttleGate
	creds *rejections
}

// endpoints hands out the state of each BMC endpoint: one per endpoint, shared by every Backend opened
// on it, and dropped when the last of them is closed.
type endpoints struct {
	// pause is given to each new throttle gate (nil: the package's pause).
	pause func(ctx context.Context, d time.Duration) error
	// now is the clock of each new record of rejected credentials (nil: time.Now); tests step it to
	// bring the timed retry (retryRejected) without waiting an hour.
	now func() time.Time
	// oneShot is Options.OneShot, for each new record of rejected credentials.
	oneShot bool

	mu sync.Mutex // guards m
	m  map[string]*endpointRef
}

type endpointRef struct {
	state *endpointState
	users int
}

// acquire returns endpoint's state and the func that gives it back, which must be called once.
func (es *endpoints) acquire(endpoint string) (*endpointState, func()) {
	key := endpointKey(endpoint)
	es.mu.Lock()
	defer es.mu.Unlock()
	if es.m == nil {
		es.m = map[string]*endpointRef{}
	}
	ref := es.m[key]
	if ref == nil {
		ref = &endpointRef{state: &endpointState{gate: newThrottleGate(es.pause), creds: newRejections(es.now, es.oneShot)}}
		es.m[key] = ref
	}
	ref.users++
	return ref.state, func() {
		es.mu.Lock()
		defer es.mu.Unlock()
		if ref.users--; ref.users == 0 {
			delete(es.m, key)
		}
	}
}

// endpointKey names the BMC an endpoint URL points at: scheme, host (case folded), port (the scheme's
// default made explicit) and path, so that spellings of one endpoint share one state.
func endpointKey(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil {
		return endpoint
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return u.Scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port) + strings.TrimSuffix(u.Path, "/")
}
