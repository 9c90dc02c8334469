package activator

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

func TestAdminWakeHistory(t *testing.T) {
	b := &fakeBackend{}
	s, _ := newTestServer(t, b, passGate{})
	admin := httptest.NewServer(s.AdminHandler(nil, nil))
	t.Cleanup(admin.Close)
	for range 2 {
		if err := s.Wake(context.Background(), "app"); err != nil {
			t.Fatal(err)
		}
		if err := s.Sleep(context.Background(), "app"); err != nil {
			t.Fatal(err)
		}
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(admin.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	tests := []struct {
		path      string
		code      int
		kinds     []string // for 200
		errSubstr string   // for the others
	}{
		{path: "/routes/app/wakes", code: 200, kinds: []string{"wake", "sleep", "wake", "sleep"}},
		{path: "/routes/app/wakes?last=3", code: 200, kinds: []string{"sleep", "wake", "sleep"}},
		{path: "/routes/app/wakes?last=1", code: 200, kinds: []string{"sleep"}},
		{path: "/routes/nope/wakes", code: 404, errSubstr: "no such route: nope"},
		{path: "/routes/app/wakes?last=x", code: 400, errSubstr: "last"},
		{path: "/routes/app/wakes?last=-1", code: 400, errSubstr: "last"},
		{path: "/routes/app/wakes?last=51", code: 400, errSubstr: "from 1 to 50"}, // the route keeps 50
		{path: "/routes/app/wakes?last=", code: 400, errSubstr: "last"},
		{path: "/routes/app/wakes?bogus=1", code: 400, errSubstr: `unknown query key "bogus"`},
		{path: "/routes/app/wakes?last=1;x", code: 400, errSubstr: "malformed query"},
		{path: "/routes/app/wakes?last=%zz", code: 400, errSubstr: "malformed query"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			code, body := get(tt.path)
			if code != tt.code {
				t.Fatalf("GET %s = %d %s, want %d", tt.path, code, body, tt.code)
			}
			if tt.code != 200 {
				var e struct{ Error string }
				if err := json.Unmarshal([]byte(body), &e); err != nil || !strings.Contains(e.Error, tt.errSubstr) {
					t.Errorf("GET %s: error %q (%v), want one naming %q", tt.path, e.Error, err, tt.errSubstr)
				}
				return
			}
			var evs []Event
			if err := json.Unmarshal([]byte(body), &evs); err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, e := range evs {
				kinds = append(kinds, e.Kind)
			}
			if strings.Join(kinds, ",") != strings.Join(tt.kinds, ",") {
				t.Errorf("GET %s kinds = %v, want %v (oldest first)", tt.path, kinds, tt.kinds)
			}
		})
	}
}

// newestSleep is the record of in's newest sleep; a failed one is followed in the history by the
// wake that takes the tenant back.
func newestSleep(t *testing.T, in *instance) *SleepRecord {
	t.Helper()
	evs := in.hist.last(0)
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Sleep != nil {
			return evs[i].Sleep
		}
	}
	t.Fatalf("no sleep in the history %+v", evs)
	return nil
}

// TestSleepRecordNotes: what a backing notes during a sleep (tenant.NoteSleep) is in the sleep's
// record, whether the sleep succeeded or failed, and a sleep that notes nothing has no notes.
func TestSleepRecordNotes(t *testing.T) {
	b := &fakeBackend{}
	s, _ := newTestServer(t, b, passGate{})
	in := s.instance("app")
	sleep := func(say []string, fail error) *SleepRecord {
		t.Helper()
		if err := s.Wake(context.Background(), "app"); err != nil {
			t.Fatal(err)
		}
		b.set(func(f *fakeBackend) { f.sleepSay, f.sleepErr = say, fail })
		err := s.Sleep(context.Background(), "app")
		if (err != nil) != (fail != nil) {
			t.Fatalf("Sleep = %v, want the error %v", err, fail)
		}
		return newestSleep(t, in)
	}
	forced := []string{"still running 10s (stop_grace) after SIGTERM: killed (SIGKILL)"}
	if got := sleep(forced, nil); !slices.Equal(got.Notes, forced) || got.Result != ResultOK {
		t.Errorf("sleep record %+v, want result ok with the notes %q", got, forced)
	}
	if got := sleep(nil, nil); got.Notes != nil {
		t.Errorf("a sleep that noted nothing has the notes %q", got.Notes)
	}
	tried := []string{"tried once"}
	if got := sleep(tried, errors.New("no")); !slices.Equal(got.Notes, tried) || got.Result != ResultFailed {
		t.Errorf("failed sleep record %+v, want result failed with the notes %q", got, tried)
	}
}

// TestOperatorCallsMarked: the wakes and sleeps the admin API asks for by name reach the backend
// marked tenant.ByOperator (a backend may then try what it holds back from automatic ones: a BMC's
// rejected credentials); a request's wake does not.
func TestOperatorCallsMarked(t *testing.T) {
	b := &fakeBackend{}
	s, in := newTestServer(t, b, passGate{})
	if err := s.Wake(context.Background(), "app"); err != nil {
		t.Fatal(err)
	}
	if err := s.Sleep(context.Background(), "app"); err != nil {
		t.Fatal(err)
	}
	if n := b.byOperator.Load(); n != 2 {
		t.Fatalf("%d calls marked ByOperator after the admin API's wake and sleep, want 2", n)
	}
	release, err := in.acquire(context.Background(), triggerRequest)
	if err != nil {
		t.Fatal(err)
	}
	release()
	if err := s.Sleep(context.Background(), "app"); err != nil {
		t.Fatal(err)
	}
	if n, w := b.byOperator.Load(), b.wakes.Load(); n != 3 || w != 2 {
		t.Fatalf("%d marked of %d wakes (a request's wake must not be marked), want 3 of 2", n, w)
	}
}
