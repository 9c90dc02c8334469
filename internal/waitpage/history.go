package waitpage

import (
	"slices"
	"sync"
	"time"
)

// historySize is how many recent wakes History keeps: enough for a stable estimate, few enough that a
// route whose wakes got slower (a bigger snapshot, a colder cache) shows it within a day's wakes.
const historySize = 20

// History keeps a route's most recent wake durations and estimates the next one. The zero value is
// ready to use; it is safe for concurrent use. The edge owns one per route and adds each successful
// wake (request to ready); a failed wake says nothing about how long a good one takes.
type History struct {
	mu   sync.Mutex // guards the fields below
	ring [historySize]time.Duration
	n    int // how many entries of ring are filled
	next int // where Add writes next
}

// Add records a wake that took d. Durations of zero or less are ignored.
func (h *History) Add(d time.Duration) {
	if d <= 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ring[h.next] = d
	h.next = (h.next + 1) % historySize
	h.n = min(h.n+1, historySize)
}

// Expected is the 75th percentile of the recent wakes (nearest rank), or 0 before the first: a bar
// that reaches its end before most wakes do promises less than it should, and one sized for the
// slowest wake crawls.
func (h *History) Expected() time.Duration {
	h.mu.Lock()
	recent := slices.Clone(h.ring[:h.n])
	h.mu.Unlock()
	if len(recent) == 0 {
		return 0
	}
	slices.Sort(recent)
	rank := (len(recent)*3 + 3) / 4 // ceil(0.75 n), 1-based
	return recent[rank-1]
}
