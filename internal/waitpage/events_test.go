package waitpage

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// sseRecorder is a flushable ResponseWriter that hands each flushed frame to the test. Only the
// Events goroutine touches it until a frame is received, so the channel orders every access.
type sseRecorder struct {
	header http.Header
	code   int
	buf    bytes.Buffer
	frames chan string
}

func newSSERecorder() *sseRecorder {
	return &sseRecorder{header: http.Header{}, frames: make(chan string, 64)}
}

func (s *sseRecorder) Header() http.Header { return s.header }

func (s *sseRecorder) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
}

func (s *sseRecorder) Write(b []byte) (int, error) {
	s.WriteHeader(http.StatusOK)
	return s.buf.Write(b)
}

func (s *sseRecorder) Flush() {
	s.WriteHeader(http.StatusOK)
	s.frames <- s.buf.String()
	s.buf.Reset()
}

// stream runs Events over src until it returns; next gives its frames in order, "" for a bare flush.
type stream struct {
	t      *testing.T
	rec    *sseRecorder
	done   chan struct{}
	cancel context.CancelFunc
}

func startStream(t *testing.T, src Source) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	s := &stream{t: t, rec: newSSERecorder(), done: make(chan struct{}), cancel: cancel}
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, "http://shop.test"+EventsPath+"?wake=w-1", nil)
	go func() {
		defer close(s.done)
		Events(s.rec, r, src)
	}()
	if f := s.next(); f != "" {
		t.Fatalf("first frame = %q, want the headers alone", f)
	}
	return s
}

func (s *stream) next() string {
	s.t.Helper()
	select {
	case f := <-s.rec.frames:
		return f
	case <-s.done:
		select {
		case f := <-s.rec.frames:
			return f
		default:
		}
		s.t.Fatal("Events returned; want another frame")
		return ""
	}
}

// ended reports whether Events has returned once every goroutine of the bubble is blocked.
func (s *stream) ended() bool {
	synctest.Wait()
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// parseEvent splits one SSE frame into its event name and its data.
func parseEvent(t *testing.T, frame string) (string, eventData) {
	t.Helper()
	if !strings.HasSuffix(frame, "\n\n") || strings.Count(frame, "\n") != 3 {
		t.Fatalf("frame %q is not one event of two lines ended by a blank line", frame)
	}
	lines := strings.Split(strings.TrimSuffix(frame, "\n\n"), "\n")
	name, ok := strings.CutPrefix(lines[0], "event: ")
	data, ok2 := strings.CutPrefix(lines[1], "data: ")
	if !ok || !ok2 {
		t.Fatalf("frame %q: want an event: line and a data: line", frame)
	}
	var d eventData
	if err := json.Unmarshal([]byte(data), &d); err != nil {
		t.Fatalf("frame %q: data is not JSON: %v", frame, err)
	}
	return name, d
}

func TestEventsFollowAWake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewProgress("w-1", time.Now(), 3*time.Second)
		s := startStream(t, p)
		for key, want := range map[string]string{
			"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no",
		} {
			if got := s.rec.header.Get(key); got != want {
				t.Errorf("%s = %q, want %q", key, got, want)
			}
		}
		if s.rec.code != http.StatusOK {
			t.Errorf("status %d, want 200", s.rec.code)
		}

		name, d := parseEvent(t, s.next())
		if name != "phase" || d.Phase != "" || len(d.Phases) != 0 || d.WakeID != "w-1" || d.ExpectedMS != 3000 {
			t.Errorf("first event %s %+v, want the state as it is: phase, no phases yet, w-1, 3000 ms", name, d)
		}

		time.Sleep(500 * time.Millisecond) // the bubble's clock: the wake's first phase begins 0.5 s in
		p.Phase("start")
		name, d = parseEvent(t, s.next())
		if name != "phase" || d.Phase != "start" || d.ElapsedMS != 500 {
			t.Errorf("after start: %s %+v, want phase start at 500 ms", name, d)
		}
		p.Phase("start") // the same phase again is no change
		p.Phase("health")
		name, d = parseEvent(t, s.next())
		if name != "phase" || d.Phase != "health" || strings.Join(d.Phases, ",") != "start,health" {
			t.Errorf("after health: %s %+v, want phases start,health", name, d)
		}
		p.Ready()
		name, d = parseEvent(t, s.next())
		if name != "ready" || strings.Join(d.Phases, ",") != "start,health" {
			t.Errorf("last event %s %+v, want ready with both phases", name, d)
		}
		if !s.ended() {
			t.Error("Events still runs after the ready event")
		}
	})
}

// TestEventsMissedPhases: phases that began between two snapshots all arrive in the next one.
func TestEventsMissedPhases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewProgress("w-1", time.Now(), 0)
		p.Phase("spawn")
		p.Phase("start")
		s := startStream(t, p)
		_, d := parseEvent(t, s.next())
		if strings.Join(d.Phases, ",") != "spawn,start" || d.Phase != "start" {
			t.Errorf("late subscriber got %+v, want phases spawn,start", d)
		}
		s.cancel()
		if !s.ended() {
			t.Error("Events still runs after the client went")
		}
	})
}

func TestEventsFailed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewProgress("w-9", time.Now(), time.Second)
		s := startStream(t, p)
		s.next()
		p.Fail(`route "x": wake failed in phase <script>health</script>`, 4*time.Second)
		p.Ready() // too late: the first final state counts
		frame := s.next()
		if strings.Contains(frame, "<script>") {
			t.Errorf("frame %q carries markup unescaped", frame)
		}
		name, d := parseEvent(t, frame)
		if name != "failed" || d.Cause != `route "x": wake failed in phase <script>health</script>` ||
			d.WakeID != "w-9" || d.RetryAfterMS != 4000 {
			t.Errorf("got %s %+v, want failed with the cause, w-9 and 4000 ms", name, d)
		}
		if !s.ended() {
			t.Error("Events still runs after the failed event")
		}
	})
}

// TestEventsAlreadyOver: a page that connects after the wake ended gets the outcome alone.
func TestEventsAlreadyOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := NewProgress("w-1", time.Now(), 0)
		p.Phase("start")
		time.Sleep(2 * time.Second)
		p.Ready()
		time.Sleep(time.Minute) // elapsed stays what it was when the tenant became ready
		s := startStream(t, p)
		name, d := parseEvent(t, s.next())
		if name != "ready" || d.ElapsedMS != 2000 {
			t.Errorf("got %s %+v, want ready at 2000 ms", name, d)
		}
		if !s.ended() {
			t.Error("Events still runs after the ready event")
		}
	})
}

func TestEventsHeartbeatAndLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		s := startStream(t, NewProgress("w-1", start, 0))
		s.next()
		// Blocking on the next frame lets the bubble's clock run to the heartbeat.
		if f := s.next(); f != ": heartbeat\n\n" {
			t.Errorf("frame %q, want a heartbeat comment", f)
		}
		if got := time.Since(start); got != heartbeatEvery {
			t.Errorf("heartbeat after %v, want %v", got, heartbeatEvery)
		}
		// A wake that never ends: the stream ends at maxStream all the same.
		for i := 0; i < int(maxStream/heartbeatEvery); i++ {
			select {
			case <-s.rec.frames:
			case <-s.done:
			}
		}
		if !s.ended() {
			t.Fatal("Events still runs past maxStream")
		}
		if got := time.Since(start); got != maxStream {
			t.Errorf("stream ended after %v, want %v", got, maxStream)
		}
	})
}

func TestEventsNeedFlush(t *testing.T) {
	rec := httptest.NewRecorder()
	w := struct{ http.ResponseWriter }{rec} // hides the recorder's Flush
	Events(w, httptest.NewRequest(http.MethodGet, "http://shop.test"+EventsPath, nil), NewProgress("w", time.Now(), 0))
	if rec.Code != http.StatusInternalServerError {
		t.Errorf("status %d without Flush, want 500", rec.Code)
	}
}

func TestProgressWatch(t *testing.T) {
	p := NewProgress("w-1", time.Now(), 0)
	_, changed := p.Watch()
	p.Phase("start")
	select {
	case <-changed:
	default:
		t.Fatal("Phase did not close the watched channel")
	}
	ev, changed := p.Watch()
	if ev.State != Waking || ev.Phase != "start" || changed == nil {
		t.Errorf("Watch = %+v, %v; want waking in start, with a channel", ev, changed)
	}
	ev.Phases[0] = "mutated" // a snapshot is the caller's own
	p.Ready()
	p.Phase("late")
	p.Fail("late", time.Second)
	ev, changed = p.Watch()
	if ev.State != Ready || strings.Join(ev.Phases, ",") != "start" || changed != nil {
		t.Errorf("after Ready: %+v, %v; want ready, phases [start], no channel", ev, changed)
	}
	for s, want := range map[State]string{Waking: "phase", Ready: "ready", Failed: "failed"} {
		if s.String() != want {
			t.Errorf("%d.String() = %q, want %q", s, s.String(), want)
		}
	}
}
