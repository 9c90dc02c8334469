package registry

import (
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestSameSeesEveryField changes each exported field of a Route, at any depth (inside Health, a
// keep_warm window, a fleet member...), one at a time, and checks that Same reports the change. A
// field added to Route or below it without a comparison in Same fails here.
func TestSameSeesEveryField(t *testing.T) {
	var paths [][]int
	leafPaths(reflect.TypeFor[Route](), nil, &paths)
	if len(paths) < 40 {
		t.Fatalf("only %d fields found: the walk is broken", len(paths))
	}
	for _, p := range paths {
		a, b := &Route{}, &Route{}
		name := set(reflect.ValueOf(a).Elem(), p, false)
		set(reflect.ValueOf(b).Elem(), p, true)
		if !a.Same(a) {
			t.Errorf("%s: a route is not the same as itself", name)
		}
		if a.Same(b) || b.Same(a) {
			t.Errorf("%s: a change reads as the same route", name)
		}
	}
}

// TestSameNilAndEmpty: a nil and an empty list configure the same route.
func TestSameNilAndEmpty(t *testing.T) {
	a := &Route{Name: "r"}
	b := &Route{Name: "r", Hosts: []string{}, KeepWarm: []Window{}, Requires: []string{}, Ignore: Ignore{Methods: []string{}}}
	if !a.Same(b) {
		t.Error("nil and empty lists read as a change")
	}
}

// TestSameUserAgents: user agents compare by their expressions, not by the compiled programs.
func TestSameUserAgents(t *testing.T) {
	a := &Route{Ignore: Ignore{UserAgents: []*regexp.Regexp{regexp.MustCompile("(?i)bot")}}}
	b := &Route{Ignore: Ignore{UserAgents: []*regexp.Regexp{regexp.MustCompile("(?i)bot")}}}
	c := &Route{Ignore: Ignore{UserAgents: []*regexp.Regexp{regexp.MustCompile("(?i)spider")}}}
	if !a.Same(b) {
		t.Error("the same user agent compiled twice reads as a change")
	}
	if a.Same(c) {
		t.Error("another user agent reads as unchanged")
	}
}

// leafPaths lists the field index paths of t's comparable leaves: every exported field, descending
// into structs, pointers to structs and the elements of slices. A *time.Location, a *regexp.Regexp
// and an interface are leaves.
func leafPaths(t reflect.Type, prefix []int, out *[][]int) {
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		p := append(append([]int(nil), prefix...), i)
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			if ft == reflect.TypeFor[*time.Location]() || ft == reflect.TypeFor[*regexp.Regexp]() {
				break
			}
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft != reflect.TypeFor[time.Location]() {
			leafPaths(ft, p, out)
			continue
		}
		*out = append(*out, p)
	}
}

// set walks v along path, making one element of each slice and the target of each nil pointer on the
// way, and sets the leaf to a value of its type: the zero-like one, or another when other is set. It
// returns the path's field names.
func set(v reflect.Value, path []int, other bool) string {
	var names []string
	for _, i := range path {
		for v.Kind() == reflect.Pointer || v.Kind() == reflect.Slice {
			if v.Kind() == reflect.Slice {
				if v.Len() == 0 {
					v.Set(reflect.MakeSlice(v.Type(), 1, 1))
				}
				v = v.Index(0)
				continue
			}
			if v.IsNil() {
				v.Set(reflect.New(v.Type().Elem()))
			}
			v = v.Elem()
		}
		names = append(names, v.Type().Field(i).Name)
		v = v.Field(i)
	}
	setLeaf(v, other)
	return strings.Join(names, ".")
}

func setLeaf(v reflect.Value, other bool) {
	pick := func(a, b any) reflect.Value {
		if other {
			return reflect.ValueOf(b)
		}
		return reflect.ValueOf(a)
	}
	switch {
	case v.Type() == reflect.TypeFor[*time.Location]():
		v.Set(pick(time.UTC, time.FixedZone("Other/Zone", 3600)))
	case v.Type() == reflect.TypeFor[[]*regexp.Regexp]():
		v.Set(pick([]*regexp.Regexp{regexp.MustCompile("a")}, []*regexp.Regexp{regexp.MustCompile("b")}))
	case v.Kind() == reflect.Interface:
		v.Set(pick(any("a"), any("b")).Convert(v.Type()))
	case v.Kind() == reflect.String:
		v.SetString(map[bool]string{false: "a", true: "b"}[other])
	case v.Kind() == reflect.Bool:
		v.SetBool(other)
	case v.CanInt():
		v.SetInt(map[bool]int64{false: 1, true: 2}[other])
	case v.Kind() == reflect.Array:
		v.Index(0).Set(reflect.ValueOf(other))
	case v.Kind() == reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		setLeaf(v.Index(0), other)
	default:
		panic("setLeaf: no value for " + v.Type().String())
	}
}

// TestSameTenant: a route keeps its tenant across a change of the edge's keys, a fleet too, and not
// across a change of what the backing runs, where it listens, its budgets, its fleet (added, removed,
// a member or the quorum changed), or for a dependent or an instance.
func TestSameTenant(t *testing.T) {
	base := func() *Route {
		return &Route{Name: "app", Backing: "exec", Upstream: Upstream{Network: "tcp", Address: "127.0.0.1:9001"},
			Hosts: []string{"app.test"}, Idle: time.Minute, WakeBudget: time.Minute, SleepBudget: 30 * time.Second,
			Settings: map[string]any{"argv": []string{"/bin/app"}}}
	}
	for _, c := range []struct {
		name string
		edit func(r *Route)
		same bool
	}{
		{"nothing", func(*Route) {}, true},
		{"idle", func(r *Route) { r.Idle = time.Hour }, true},
		{"hosts", func(r *Route) { r.Hosts = []string{"other.test"} }, true},
		{"response_timeout", func(r *Route) { r.ResponseTimeout = time.Second }, true},
		{"health", func(r *Route) { r.Health.Path = "/healthz" }, true},
		{"hold", func(r *Route) { r.Hold.MaxTime = time.Second }, true},
		{"settings", func(r *Route) { r.Settings = map[string]any{"argv": []string{"/bin/other"}} }, false},
		{"backing", func(r *Route) { r.Backing = "unit" }, false},
		{"upstream", func(r *Route) { r.Upstream.Address = "127.0.0.1:9002" }, false},
		{"wake_budget", func(r *Route) { r.WakeBudget = time.Hour }, false},
		{"sleep_budget", func(r *Route) { r.SleepBudget = time.Hour }, false},
		{"requires", func(r *Route) { r.Requires = []string{"db"} }, false},
		{"an instance", func(r *Route) { r.Instance = true }, false},
		{"a fleet", func(r *Route) { r.Fleet = &Fleet{} }, false},
	} {
		r := base()
		c.edit(r)
		if got := base().SameTenant(r); got != c.same {
			t.Errorf("%s: SameTenant = %v, want %v", c.name, got, c.same)
		}
	}
	fleet := func() *Route {
		r := base()
		r.Fleet = &Fleet{MinReady: 1, Members: []Member{
			{Name: "a", Upstream: Upstream{Network: "tcp", Address: "127.0.0.1:9001"}, Settings: map[string]any{"argv": []string{"/bin/a"}}},
			{Name: "b", Upstream: Upstream{Network: "tcp", Address: "127.0.0.1:9002"}, Settings: map[string]any{"argv": []string{"/bin/b"}}},
		}}
		return r
	}
	for _, c := range []struct {
		name string
		edit func(r *Route)
		same bool
	}{
		{"nothing", func(*Route) {}, true},
		{"idle", func(r *Route) { r.Idle = time.Hour }, true},
		{"health", func(r *Route) { r.Health.Path = "/healthz" }, true},
		{"hosts", func(r *Route) { r.Hosts = []string{"other.test"} }, true},
		{"min_ready", func(r *Route) { r.Fleet.MinReady = 2 }, false},
		{"serial", func(r *Route) { r.Fleet.Serial = true }, false},
		{"a member added", func(r *Route) { r.Fleet.Members = append(r.Fleet.Members, Member{Name: "c"}) }, false},
		{"a member removed", func(r *Route) { r.Fleet.Members = r.Fleet.Members[:1] }, false},
		{"the members reordered", func(r *Route) { r.Fleet.Members[0], r.Fleet.Members[1] = r.Fleet.Members[1], r.Fleet.Members[0] }, false},
		{"a member renamed", func(r *Route) { r.Fleet.Members[1].Name = "c" }, false},
		{"a member's upstream", func(r *Route) { r.Fleet.Members[1].Upstream.Address = "127.0.0.1:9003" }, false},
		{"a member's settings", func(r *Route) { r.Fleet.Members[1].Settings = map[string]any{"argv": []string{"/bin/c"}} }, false},
		{"no fleet", func(r *Route) { r.Fleet = nil }, false},
		{"requires", func(r *Route) { r.Requires = []string{"db"} }, false},
		{"an instance", func(r *Route) { r.Instance = true }, false},
	} {
		r := fleet()
		c.edit(r)
		if got := fleet().SameTenant(r); got != c.same {
			t.Errorf("fleet, %s: SameTenant = %v, want %v", c.name, got, c.same)
		}
	}
}

// TestTenantChange: the reload's log names what made a route's tenant not kept, in the config's words.
func TestTenantChange(t *testing.T) {
	base := func() *Route {
		return &Route{Name: "app", Backing: "exec", Upstream: Upstream{Network: "tcp", Address: "127.0.0.1:9001"},
			WakeBudget: time.Minute, SleepBudget: 30 * time.Second, Settings: map[string]any{"argv": []string{"/bin/app"}},
			Fleet: &Fleet{MinReady: 1, Members: []Member{{Name: "a"}}}}
	}
	for want, edit := range map[string]func(r *Route){
		"":                       func(r *Route) { r.Idle = time.Hour },
		"fleet changed":          func(r *Route) { r.Fleet.MinReady = 2 },
		"the exec block changed": func(r *Route) { r.Settings = map[string]any{"argv": []string{"/bin/other"}} },
		"sleep_budget changed":   func(r *Route) { r.SleepBudget = time.Hour },
		"backing changed":        func(r *Route) { r.Backing = "unit" },
		"a route with requires is always started again": func(r *Route) { r.Requires = []string{"db"} },
	} {
		r := base()
		edit(r)
		if got := r.TenantChange(base()); got != want {
			t.Errorf("TenantChange = %q, want %q", got, want)
		}
	}
}
