package bodybuf_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"testing/synctest"
	"time"

	"github.com/activator/activator/internal/bodybuf"
)

// conn fakes, on synctest's clock, what Read sees of a connection: a read deadline that
// http.ResponseController sets, and a client that sends each step's bytes after a pause.
type conn struct {
	deadline time.Time
	sets     []deadlineSet
	steps    []step
}

type deadlineSet struct{ at, deadline time.Time }

type step struct {
	after time.Duration
	data  string
}

func (c *conn) setReadDeadline(d time.Time) {
	c.deadline = d
	c.sets = append(c.sets, deadlineSet{time.Now(), d})
}

// Read waits for the next step; when the deadline comes first, it fails as a net.Conn does.
func (c *conn) Read(p []byte) (int, error) {
	if len(c.steps) == 0 {
		return 0, io.EOF
	}
	s := c.steps[0]
	if !c.deadline.IsZero() && !time.Now().Add(s.after).Before(c.deadline) {
		time.Sleep(time.Until(c.deadline))
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	}
	time.Sleep(s.after)
	c.steps = c.steps[1:]
	return copy(p, s.data), nil
}

func (*conn) Close() error { return nil }

// TestIdle checks the idle bound on synctest's clock: it bounds each wait for a byte, not the
// whole body; it is set before every read and cleared after the last, and left in place on error.
func TestIdle(t *testing.T) {
	const idle = time.Second
	trickle := make([]step, 10)
	for i := range trickle {
		trickle[i] = step{after: idle - time.Millisecond, data: "x"}
	}
	tests := []struct {
		name      string
		idle      time.Duration
		deadlines bool // whether the writer can set read deadlines
		steps     []step
		want      string // the body; "" with wantIdle
		wantIdle  bool
		wantTime  time.Duration // time Read takes
	}{
		{
			name: "trickle, every pause under idle", idle: idle, deadlines: true,
			steps: trickle, want: "xxxxxxxxxx", wantTime: 10 * (idle - time.Millisecond),
		},
		{
			name: "pause over idle", idle: idle, deadlines: true,
			steps:    []step{{0, "ab"}, {500 * time.Millisecond, "c"}, {idle + time.Millisecond, "d"}},
			wantIdle: true, wantTime: 500*time.Millisecond + idle,
		},
		{
			name: "no idle bound", idle: 0, deadlines: true,
			steps: []step{{time.Hour, "a"}}, want: "a", wantTime: time.Hour,
		},
		{
			name: "writer without read deadlines: no bound", idle: idle, deadlines: false,
			steps: []step{{time.Hour, "a"}}, want: "a", wantTime: time.Hour,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := &conn{steps: tt.steps}
				var w http.ResponseWriter = httptest.NewRecorder()
				if tt.deadlines {
					w = deadlineWriter{ResponseRecorder: httptest.NewRecorder(), set: c.setReadDeadline}
				}
				r := httptest.NewRequest(http.MethodPost, "/", nil)
				r.Body, r.ContentLength = c, -1
				start := time.Now()
				b, err := bodybuf.Read(w, r, bodybuf.Options{Memory: 1 << 10, Idle: tt.idle})
				if took := time.Since(start); took != tt.wantTime {
					t.Errorf("Read took %v, want %v", took, tt.wantTime)
				}
				if got := errors.Is(err, bodybuf.ErrIdle); got != tt.wantIdle {
					t.Fatalf("Read: %v; want ErrIdle: %v", err, tt.wantIdle)
				}
				if err == nil {
					got, _ := io.ReadAll(b)
					if string(got) != tt.want {
						t.Errorf("body %q, want %q", got, tt.want)
					}
					b.Close()
				}
				if tt.idle == 0 || !tt.deadlines {
					if len(c.sets) != 0 {
						t.Errorf("%d read deadlines set, want none", len(c.sets))
					}
					return
				}
				// One deadline per read: a step each, then the read that sees io.EOF, unless it failed.
				reads := len(tt.steps) - len(c.steps) + 1
				for i, s := range c.sets[:reads] {
					if want := s.at.Add(tt.idle); !s.deadline.Equal(want) {
						t.Errorf("deadline #%d: %v after the set, want %v", i+1, s.deadline.Sub(s.at), tt.idle)
					}
				}
				last := c.sets[len(c.sets)-1].deadline
				switch {
				case err == nil && (len(c.sets) != reads+1 || !last.IsZero()):
					t.Errorf("%d deadlines set, the last %v; want %d, the last zero", len(c.sets), last, reads+1)
				case err != nil && len(c.sets) != reads:
					t.Errorf("%d deadlines set, want %d and the last left in place", len(c.sets), reads)
				}
			})
		})
	}
}
