package waitpage

import (
	"sync"
	"testing"
	"time"
)

func TestHistoryExpected(t *testing.T) {
	var h History
	if got := h.Expected(); got != 0 {
		t.Errorf("empty: Expected = %v, want 0", got)
	}
	h.Add(0)
	h.Add(-time.Second)
	if got := h.Expected(); got != 0 {
		t.Errorf("after non-positive durations: Expected = %v, want 0", got)
	}
	h.Add(2 * time.Second)
	if got := h.Expected(); got != 2*time.Second {
		t.Errorf("one wake: Expected = %v, want 2s", got)
	}
	for _, s := range []int{1, 3, 4} {
		h.Add(time.Duration(s) * time.Second)
	}
	if got := h.Expected(); got != 3*time.Second {
		t.Errorf("1,2,3,4 s: Expected = %v, want the p75, 3s", got)
	}
	// 30 more wakes of 10 s push every older one out of the ring.
	for range 30 {
		h.Add(10 * time.Second)
	}
	if got := h.Expected(); got != 10*time.Second {
		t.Errorf("after 30 wakes of 10s: Expected = %v, want 10s", got)
	}
	for i := range historySize {
		h.Add(time.Duration(i+1) * time.Second) // 1..20 s
	}
	if got := h.Expected(); got != 15*time.Second {
		t.Errorf("1..20 s: Expected = %v, want 15s", got)
	}
}

func TestHistoryConcurrent(t *testing.T) {
	var h History
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 100 {
				h.Add(time.Duration(i*100+j+1) * time.Millisecond)
				_ = h.Expected()
			}
		})
	}
	wg.Wait()
	if got := h.Expected(); got <= 0 {
		t.Errorf("Expected = %v after 800 wakes", got)
	}
}
