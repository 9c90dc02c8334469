package registry

import (
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	"go.yaml.in/yaml/v3"
)

// Window is a keep_warm window: on Days, from From to To (minutes after midnight in Zone; To may be
// less than From for a window past midnight, which then belongs to the day it starts on). Inside a
// window the tenant is woken at its start and never idle-stopped.
type Window struct {
	Days     [7]bool // indexed by time.Weekday
	From, To int     // minutes after midnight, To up to 24*60
	Zone     *time.Location
	Text     string // as written, for status and explain
}

// Contains reports whether t lies inside the window.
func (w Window) Contains(t time.Time) bool {
	t = t.In(w.Zone)
	m := t.Hour()*60 + t.Minute()
	day := t.Weekday()
	if w.From < w.To {
		return w.Days[day] && m >= w.From && m < w.To
	}
	// Past midnight: the evening part belongs to today, the morning part to yesterday.
	return (w.Days[day] && m >= w.From) || (w.Days[(day+6)%7] && m < w.To)
}

// NextStart returns the first start of the window after t.
func (w Window) NextStart(t time.Time) time.Time {
	t = t.In(w.Zone)
	for d := 0; d <= 7; d++ {
		day := time.Date(t.Year(), t.Month(), t.Day()+d, 0, 0, 0, 0, w.Zone)
		if !w.Days[day.Weekday()] {
			continue
		}
		start := time.Date(day.Year(), day.Month(), day.Day(), w.From/60, w.From%60, 0, 0, w.Zone)
		if start.After(t) {
			return start
		}
	}
	return time.Time{} // no day set: parseDays rejects that
}

// End returns the end of the window occurrence that contains t (t must be inside the window).
func (w Window) End(t time.Time) time.Time {
	t = t.In(w.Zone)
	m := t.Hour()*60 + t.Minute()
	d := t.Day()
	if w.From >= w.To && m >= w.From { // the evening part: it ends tomorrow
		d++
	}
	// Wall-clock arithmetic (time.Date normalises 24:00 and day overflow), not elapsed time: on a DST
	// day "18:00" is not 18 hours after midnight.
	return time.Date(t.Year(), t.Month(), d, w.To/60, w.To%60, 0, 0, w.Zone)
}

// Same reports whether r and o configure the route identically, field by field: a reload compares
// every route of the running config with its new version, so this is kept to plain comparisons rather
// than a reflect.DeepEqual of the whole Route. Only the backing's Settings, whose type the registry
// does not know, go through reflect.DeepEqual. A nil and an empty
// list are the same. Time zones compare by name: a *time.Location caches the zone period in force when
// it was loaded, so the same zone loaded on either side of a DST change would otherwise differ, and a
// reload would replace (and restart) a route nobody changed. A wake_at schedule compares by its text
// (the schedule and its zone's name), user agents by their expressions, requires in the order written,
// and a fleet member by member, each with the settings its backing's decoder returned.
// TestSameSeesEveryField fails when a field of Route is added without being compared here.
func (r *Route) Same(o *Route) bool {
	if r == o {
		return true
	}
	return r.Name == o.Name && slices.Equal(r.Hosts, o.Hosts) && r.PathPrefix == o.PathPrefix && r.Backing == o.Backing &&
		r.Upstream == o.Upstream && r.MaxUpstreamConns == o.MaxUpstreamConns && r.RequestBuffering == o.RequestBuffering &&
		r.MaxBody == o.MaxBody && r.DetailedErrors == o.DetailedErrors && r.Health == o.Health &&
		r.Idle == o.Idle && r.ResponseTimeout == o.ResponseTimeout && r.WakeBudget == o.WakeBudget && r.SleepBudget == o.SleepBudget && r.Hold == o.Hold &&
		r.Backoff == o.Backoff && r.WaitingPage == o.WaitingPage && r.Ignore.same(&o.Ignore) &&
		slices.EqualFunc(r.KeepWarm, o.KeepWarm, Window.same) &&
		slices.EqualFunc(r.WakeAt, o.WakeAt, func(a, b Schedule) bool { return a.Text == b.Text }) &&
		r.Instance == o.Instance && slices.Equal(r.Requires, o.Requires) && r.Fleet.same(o.Fleet) &&
		reflect.DeepEqual(r.Settings, o.Settings)
}

// SameTenant reports whether a route changed from o to r keeps the same tenant: a route (not an
// instance, no requires) whose backing, settings block, upstream, wake_budget, sleep_budget and fleet
// block (none, or the same members in the same order, each with its name, upstream and settings, and
// the same min_ready and serial) are as they were, so that only keys of the edge changed (hosts, idle,
// response_timeout, hold, health, ...). A reload hands such a route's running tenant, or fleet, to its
// new instance instead of stopping it (internal/activator). The backings read nothing else of a route
// or a fleet member's route: a unit's sleep budget and a node's budgets are derived from the two
// budgets compared here.
func (r *Route) SameTenant(o *Route) bool { return r.TenantChange(o) == "" }

// TenantChange says why a route changed from o to r does not keep the same tenant (SameTenant), in
// the config's words, for the reload's log line: the first of the keys compared that differs, or
// what makes a route never keep it. "" when it keeps it.
func (r *Route) TenantChange(o *Route) string {
	switch {
	case r.Name != o.Name:
		return "another route"
	case r.Instance || o.Instance:
		return "an instance's tenant is always started again"
	case len(r.Requires) > 0 || len(o.Requires) > 0:
		return "a route with requires is always started again"
	case r.Backing != o.Backing:
		return "backing changed"
	case r.Upstream != o.Upstream:
		return "upstream changed"
	case r.WakeBudget != o.WakeBudget:
		return "wake_budget changed"
	case r.SleepBudget != o.SleepBudget:
		return "sleep_budget changed"
	case !r.Fleet.same(o.Fleet):
		return "fleet changed"
	case !reflect.DeepEqual(r.Settings, o.Settings):
		return "the " + r.Backing + " block changed"
	}
	return ""
}

// same is Same for a keep_warm window: its zone by name.
func (w Window) same(o Window) bool {
	return w.Days == o.Days && w.From == o.From && w.To == o.To && w.Text == o.Text && w.Zone.String() == o.Zone.String()
}

// same is Same for an ignore block: its user agents by their expressions.
func (ig *Ignore) same(o *Ignore) bool {
	return slices.Equal(ig.Methods, o.Methods) && slices.Equal(ig.Paths, o.Paths) && ig.Preset == o.Preset && ig.Status == o.Status &&
		slices.EqualFunc(ig.UserAgents, o.UserAgents, func(a, b *regexp.Regexp) bool { return a.String() == b.String() })
}

// same is Same for a fleet (nil for none).
func (f *Fleet) same(o *Fleet) bool {
	if f == nil || o == nil {
		return f == o
	}
	return f.MinReady == o.MinReady && f.Serial == o.Serial && slices.EqualFunc(f.Members, o.Members, func(a, b Member) bool {
		return a.Name == b.Name && a.Upstream == b.Upstream && reflect.DeepEqual(a.Settings, b.Settings)
	})
}

// Schedule is a wake_at entry: a cron schedule whose times pre-wake the tenant.
type Schedule struct {
	Text string // as written
	spec cron.Schedule
}

// Next returns the first scheduled time after t.
func (s Schedule) Next(t time.Time) time.Time { return s.spec.Next(t) }

type windowKeys struct {
	Days     yaml.Node `yaml:"days"`
	From     string    `yaml:"from"`
	To       string    `yaml:"to"`
	TimeZone string    `yaml:"time_zone"`
}

type wakeAtKeys struct {
	Cron     string `yaml:"cron"`
	TimeZone string `yaml:"time_zone"`
}

var weekdays = map[string]time.Weekday{
	"sun": time.Sunday, "mon": time.Monday, "tue": time.Tuesday, "wed": time.Wednesday,
	"thu": time.Thursday, "fri": time.Friday, "sat": time.Saturday,
}

// parseDays reads "mon-fri", "sat,sun", "mon-fri,sun" or a list of such; empty means every day.
func parseDays(n *yaml.Node) ([7]bool, error) {
	var days [7]bool
	var items []string
	switch n.Kind {
	case 0:
		return [7]bool{true, true, true, true, true, true, true}, nil
	case yaml.ScalarNode:
		items = strings.Split(n.Value, ",")
	case yaml.SequenceNode:
		for _, c := range n.Content {
			if c.Kind != yaml.ScalarNode {
				return days, fmt.Errorf("want day names, e.g. mon-fri")
			}
			items = append(items, strings.Split(c.Value, ",")...)
		}
	default:
		return days, fmt.Errorf("want day names, e.g. mon-fri or [sat, sun]")
	}
	for _, it := range items {
		it = strings.ToLower(strings.TrimSpace(it))
		a, b, isRange := strings.Cut(it, "-")
		from, ok1 := weekdays[a]
		to, ok2 := from, true
		if isRange {
			to, ok2 = weekdays[b]
		}
		if !ok1 || !ok2 {
			return days, fmt.Errorf("%q is not a day or a range of days (mon, tue, wed, thu, fri, sat, sun; e.g. mon-fri)", it)
		}
		for d := from; ; d = (d + 1) % 7 {
			days[d] = true
			if d == to {
				break
			}
		}
	}
	if days == [7]bool{} {
		return days, fmt.Errorf("no day: want at least one (mon, tue, … sun; e.g. mon-fri), or leave days out for every day")
	}
	return days, nil
}

// parseClock reads "HH:MM" (24-hour; "24:00" only when end is set) as minutes after midnight.
func parseClock(s string, end bool) (int, error) {
	h, m, ok := strings.Cut(s, ":")
	if strings.ContainsAny(s, "+- ") { // Atoi takes "+8" and "-0": "+8:00" read as 08:00
		ok = false
	}
	hh, err1 := strconv.Atoi(h)
	mm, err2 := strconv.Atoi(m)
	if !ok || err1 != nil || err2 != nil || len(m) != 2 || hh < 0 || mm < 0 || mm > 59 || hh > 24 || (hh == 24 && (mm != 0 || !end)) || (hh == 24 && !end) {
		return 0, fmt.Errorf("%q is not a time of day (HH:MM, 24-hour%s)", s, map[bool]string{true: "; 24:00 for midnight", false: ""}[end])
	}
	return hh*60 + mm, nil
}

// zone loads an IANA time zone name; "" is the host's local zone, as cron(8) uses.
func zone(name string) (*time.Location, error) {
	if name == "" {
		return time.Local, nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("%q is not an IANA time zone (e.g. Europe/Berlin, UTC): %v", name, err)
	}
	return loc, nil
}

// checkSchedules checks keep_warm and wake_at.
func (c *routeCheck) checkSchedules() {
	for i := range c.rk.KeepWarm {
		c.checkWindow(i, &c.rk.KeepWarm[i])
	}
	for i := range c.rk.WakeAt {
		c.checkWakeAt(i, &c.rk.WakeAt[i])
	}
	if (len(c.r.KeepWarm) > 0 || len(c.r.WakeAt) > 0) && c.r.Idle == 0 && !c.failed("idle") {
		c.add("idle", c.at("idle"), "is 0 (never sleep), so keep_warm and wake_at have nothing to do: set an idle window, or drop them")
	}
}

func (c *routeCheck) checkWindow(i int, k *windowKeys) {
	key := fmt.Sprintf("keep_warm[%d]", i)
	bad := func(sub string, err error) { c.add(key+"."+sub, c.at(key+"."+sub), "%v", err) }
	w := Window{Text: describeWindow(k)}
	var err error
	ok := true
	if w.Days, err = parseDays(&k.Days); err != nil {
		bad("days", err)
		ok = false
	}
	if k.From == "" {
		bad("from", fmt.Errorf("missing: the window's start, e.g. \"08:00\""))
		ok = false
	} else if w.From, err = parseClock(k.From, false); err != nil {
		bad("from", err)
		ok = false
	}
	if k.To == "" {
		bad("to", fmt.Errorf("missing: the window's end, e.g. \"18:00\""))
		ok = false
	} else if w.To, err = parseClock(k.To, true); err != nil {
		bad("to", err)
		ok = false
	}
	if ok && w.From == w.To {
		bad("to", fmt.Errorf("equals from (%s): an empty window; for all day write from: \"00:00\", to: \"24:00\"", k.From))
		ok = false
	}
	if w.Zone, err = zone(k.TimeZone); err != nil {
		bad("time_zone", err)
		ok = false
	}
	if ok {
		c.r.KeepWarm = append(c.r.KeepWarm, w)
	}
}

func describeWindow(k *windowKeys) string {
	days := "every day"
	switch k.Days.Kind {
	case yaml.ScalarNode:
		days = k.Days.Value
	case yaml.SequenceNode:
		var parts []string
		for _, c := range k.Days.Content {
			parts = append(parts, c.Value)
		}
		days = strings.Join(parts, ",")
	}
	z := k.TimeZone
	if z == "" {
		z = "local time"
	}
	return fmt.Sprintf("%s %s-%s %s", days, k.From, k.To, z)
}

func (c *routeCheck) checkWakeAt(i int, n *yaml.Node) {
	key := fmt.Sprintf("wake_at[%d]", i)
	var k wakeAtKeys
	switch n.Kind {
	case yaml.ScalarNode:
		k.Cron = n.Value
	case yaml.MappingNode:
		if err := DecodeStrict(n, &k); err != nil {
			c.l.addErr(c.label, key, n.Line, err)
			return
		}
	default:
		c.add(key, n.Line, "want a cron schedule (\"0 7 * * mon-fri\") or {cron: ..., time_zone: ...}")
		return
	}
	if k.Cron == "" {
		c.add(key, n.Line, "missing: a cron schedule, e.g. \"0 7 * * mon-fri\"")
		return
	}
	if strings.Contains(k.Cron, "TZ=") {
		c.add(key, n.Line, "%q: give the zone as time_zone:, not inside the schedule", k.Cron)
		return
	}
	if strings.HasPrefix(strings.TrimSpace(k.Cron), "@every") {
		// cron's own extension, not a time of day: "@every -5s" and "@every 500ms" ran every second.
		c.add(key, n.Line, "%q: @every is not a wake_at schedule (times of day, as cron(8) has them); keep a tenant up with keep_warm", k.Cron)
		return
	}
	loc, err := zone(k.TimeZone)
	if err != nil {
		c.add(key+".time_zone", n.Line, "%v", err)
		return
	}
	spec, err := cron.ParseStandard(k.Cron)
	if err != nil {
		c.add(key, n.Line, "%q is not a cron schedule (minute hour day-of-month month day-of-week, or @daily, @hourly): %v", k.Cron, err)
		return
	}
	if sc, ok := spec.(*cron.SpecSchedule); ok {
		sc.Location = loc
	}
	if spec.Next(time.Now()).IsZero() { // cron looks five years ahead
		c.add(key, n.Line, "%q never matches (30 February?)", k.Cron)
		return
	}
	text := k.Cron
	if k.TimeZone != "" {
		text += " " + k.TimeZone
	}
	c.r.WakeAt = append(c.r.WakeAt, Schedule{Text: text, spec: spec})
}
