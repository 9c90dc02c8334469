package registry

import (
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func window(t *testing.T, days, from, to, tz string) Window {
	t.Helper()
	var d yaml.Node
	if days != "" {
		d = yaml.Node{Kind: yaml.ScalarNode, Value: days}
	}
	var l errs
	c := &routeCheck{l: &l, r: &Route{}, n: &yaml.Node{}}
	c.checkWindow(0, &windowKeys{Days: d, From: from, To: to, TimeZone: tz})
	if len(l.list) > 0 || len(c.r.KeepWarm) != 1 {
		t.Fatalf("window %s %s-%s %s: %v", days, from, to, tz, l.list)
	}
	return c.r.KeepWarm[0]
}

func TestWindow(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		v, err := time.ParseInLocation("2006-01-02 15:04", s, berlin)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	office := window(t, "mon-fri", "08:00", "18:00", "Europe/Berlin")
	night := window(t, "fri", "22:00", "02:00", "Europe/Berlin")
	// 2026-12-04 is a Friday.
	cases := []struct {
		name   string
		w      Window
		t      string
		in     bool
		next   string // NextStart
		endsAt string // End, when in
	}{
		{"office before", office, "2026-12-04 07:59", false, "2026-12-04 08:00", ""},
		{"office start", office, "2026-12-04 08:00", true, "2026-12-07 08:00", "2026-12-04 18:00"},
		{"office end is outside", office, "2026-12-04 18:00", false, "2026-12-07 08:00", ""},
		{"office saturday", office, "2026-12-05 12:00", false, "2026-12-07 08:00", ""},
		{"night friday evening", night, "2026-12-04 23:00", true, "2026-12-11 22:00", "2026-12-05 02:00"},
		{"night saturday morning", night, "2026-12-05 01:30", true, "2026-12-11 22:00", "2026-12-05 02:00"},
		{"night saturday evening", night, "2026-12-05 23:00", false, "2026-12-11 22:00", ""},
		{"night thursday morning", night, "2026-12-03 01:00", false, "2026-12-04 22:00", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			now := at(c.t)
			if got := c.w.Contains(now); got != c.in {
				t.Errorf("Contains(%s) = %v, want %v", c.t, got, c.in)
			}
			if got, want := c.w.NextStart(now), at(c.next); !got.Equal(want) {
				t.Errorf("NextStart(%s) = %v, want %v", c.t, got, want)
			}
			if c.in {
				if got, want := c.w.End(now), at(c.endsAt); !got.Equal(want) {
					t.Errorf("End(%s) = %v, want %v", c.t, got, want)
				}
			}
		})
	}
	// The same instant seen from another zone is judged in the window's own zone.
	if !office.Contains(at("2026-12-04 09:00").UTC()) {
		t.Error("a UTC time inside Berlin office hours is judged outside")
	}
}

func TestScheduleZone(t *testing.T) {
	var l errs
	c := &routeCheck{l: &l, r: &Route{}, n: &yaml.Node{}}
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(`{cron: "30 7 * * mon-fri", time_zone: Asia/Tokyo}`), &n); err != nil {
		t.Fatal(err)
	}
	c.checkWakeAt(0, n.Content[0])
	if len(l.list) > 0 {
		t.Fatal(l.list)
	}
	tokyo, _ := time.LoadLocation("Asia/Tokyo")
	from := time.Date(2026, 12, 4, 8, 0, 0, 0, tokyo) // a Friday, after 07:30
	if got, want := c.r.WakeAt[0].Next(from), time.Date(2026, 12, 7, 7, 30, 0, 0, tokyo); !got.Equal(want) {
		t.Errorf("Next = %v, want %v", got, want)
	}
}

// End on the days Europe/Berlin changes its clocks: the window ends at 18:00 wall clock, not 18 hours
// after midnight.
func TestWindowEndDST(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	w := window(t, "", "08:00", "18:00", "Europe/Berlin")
	for _, day := range []int{29, 25} { // 2026-03-29 and 2026-10-25
		month := time.March
		if day == 25 {
			month = time.October
		}
		noon := time.Date(2026, month, day, 12, 0, 0, 0, berlin)
		if got, want := w.End(noon), time.Date(2026, month, day, 18, 0, 0, 0, berlin); !got.Equal(want) {
			t.Errorf("End(%v) = %v, want %v", noon, got, want)
		}
	}
}

// Same: a route loaded twice is the same route, even though each load has its own *time.Location.
func TestRouteSameAcrossLoads(t *testing.T) {
	a := &Route{Name: "r", KeepWarm: []Window{window(t, "mon", "08:00", "09:00", "Europe/Berlin")}}
	b := &Route{Name: "r", KeepWarm: []Window{window(t, "mon", "08:00", "09:00", "Europe/Berlin")}}
	b.KeepWarm[0].Zone = time.FixedZone("Europe/Berlin", 3600) // same name, other internals
	if !a.Same(b) {
		t.Error("the same keep_warm window in the same zone reads as a change")
	}
	c := &Route{Name: "r", KeepWarm: []Window{window(t, "mon", "08:00", "09:00", "UTC")}}
	if a.Same(c) {
		t.Error("a window in another zone reads as unchanged")
	}
	d := &Route{Name: "r", KeepWarm: a.KeepWarm, Idle: time.Minute}
	if a.Same(d) {
		t.Error("another idle reads as unchanged")
	}
}
