package registry_test

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/registry"
)

// lines joins its arguments as the lines of a config, so that a case's line numbers can be read off
// its position: the first argument is line 1.
func lines(ls ...string) string { return strings.Join(ls, "\n") + "\n" }

// webRoute is a valid route "web" on lines 1 to 6 (with "routes:"), requiring what requires says.
func webRoute(requires string) []string {
	return []string{
		"routes:",
		"  - name: web",
		"    hosts: [web.localhost]",
		"    backing: exec",
		"    upstream: 127.0.0.1:9001",
		"    exec: {argv: [/bin/web]}",
		"    requires: " + requires,
	}
}

// instance is a valid instance entry with the given name and port, and requires when not "".
func instance(name string, port int, requires string) []string {
	out := []string{
		"  - name: " + name,
		"    backing: exec",
		fmt.Sprintf("    upstream: 127.0.0.1:%d", port),
		"    exec: {argv: [/bin/" + name + "]}",
	}
	if requires != "" {
		out = append(out, "    requires: "+requires)
	}
	return out
}

func concat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func wantProblems(t *testing.T, data string, decoders map[string]registry.SettingsDecoder, want []string) {
	t.Helper()
	if got := problems(t, data, decoders); !reflect.DeepEqual(got, want) {
		t.Errorf("Load problems:\n got %s\nwant %s\nconfig:\n%s", strings.Join(got, "\n     "), strings.Join(want, "\n     "), numbered(data))
	}
}

// numbered prefixes each line of data with its number, for a failing case's message.
func numbered(data string) string {
	var b strings.Builder
	for i, l := range strings.Split(strings.TrimSuffix(data, "\n"), "\n") {
		fmt.Fprintf(&b, "%3d %s\n", i+1, l)
	}
	return b.String()
}

func mustLoad(t *testing.T, data string, decoders map[string]registry.SettingsDecoder) *registry.Config {
	t.Helper()
	cfg, err := registry.Load([]byte(data), decoders)
	if err != nil {
		t.Fatalf("Load: %v\n%s", err, numbered(data))
	}
	return cfg
}

// TestLoadInstances: instances parse like routes without hosts, are found by Config.Instance and not
// by Config.Route, and a route's requirements keep their written order.
func TestLoadInstances(t *testing.T) {
	data := lines(concat(webRoute("[db, cache]"), []string{"instances:"},
		instance("db", 5432, ""), []string{"    health: {tcp: true, passes: 2}", "    idle: 1h"},
		instance("cache", 6379, "[db]"))...)
	cfg := mustLoad(t, data, backings)
	if len(cfg.Routes) != 1 || len(cfg.Instances) != 2 {
		t.Fatalf("got %d routes and %d instances, want 1 and 2", len(cfg.Routes), len(cfg.Instances))
	}
	web, db, cache := cfg.Routes[0], cfg.Instance("db"), cfg.Instance("cache")
	if db == nil || cache == nil || cfg.Route("db") != nil || cfg.Instance("web") != nil {
		t.Fatalf("Instance(db) = %v, Instance(cache) = %v, Route(db) = %v, Instance(web) = %v", db, cache, cfg.Route("db"), cfg.Instance("web"))
	}
	if web.Instance || !db.Instance || !cache.Instance {
		t.Errorf("Instance flags: web %v, db %v, cache %v; want false, true, true", web.Instance, db.Instance, cache.Instance)
	}
	if got := web.Requires; !reflect.DeepEqual(got, []string{"db", "cache"}) {
		t.Errorf("web.Requires = %q, want [db cache] as written", got)
	}
	if got := cache.Requires; !reflect.DeepEqual(got, []string{"db"}) {
		t.Errorf("cache.Requires = %q, want [db]", got)
	}
	if db.Requires != nil || len(db.Hosts) != 0 || db.PathPrefix != "" {
		t.Errorf("db: Requires %q, Hosts %q, PathPrefix %q; want none", db.Requires, db.Hosts, db.PathPrefix)
	}
	wantHealth := registry.Health{TCP: true, Interval: time.Second, Timeout: 2 * time.Second, Passes: 2}
	if db.Health != wantHealth {
		t.Errorf("db.Health = %+v, want %+v", db.Health, wantHealth)
	}
	if db.Idle != time.Hour || db.Upstream.String() != "127.0.0.1:5432" {
		t.Errorf("db: idle %v, upstream %v", db.Idle, db.Upstream)
	}
	if s, ok := db.Settings.(*fakeExec); !ok || s.Argv[0] != "/bin/db" {
		t.Errorf("db.Settings = %#v, want the exec decoder's", db.Settings)
	}
}

// TestLoadInstanceRejects: an instance has no hosts and no request reaches it, so the keys that say
// where requests come from, and what a request sees, are errors. An instance's problems name it as one.
func TestLoadInstanceRejects(t *testing.T) {
	const noHosts = "it is woken as a requirement (requires:) or from the admin API"
	base := concat(webRoute("[]"), []string{"instances:"}, instance("db", 5432, "")) // lines 1-12
	tests := []struct {
		name  string
		extra []string // from line 13 on
		want  []string
	}{
		{
			name:  "hosts, host and path_prefix",
			extra: []string{"    hosts: [db.localhost]", "    host: db.example.com", "    path_prefix: /db"},
			want: []string{
				`line 13: instance "db": hosts: an instance has no hosts: ` + noHosts,
				`line 14: instance "db": host: an instance has no hosts: ` + noHosts,
				`line 15: instance "db": path_prefix: an instance has no path prefix: ` + noHosts,
			},
		},
		{
			name:  "waiting_page and ignore",
			extra: []string{"    waiting_page: false", "    ignore: {preset: monitors}"},
			want: []string{
				`line 13: instance "db": waiting_page: no request ever reaches an instance, so it shows no waiting page`,
				`line 14: instance "db": ignore: no request ever reaches an instance, so there is nothing to ignore`,
			},
		},
		{
			name:  "a hosts that does not decode is reported once",
			extra: []string{"    hosts: db.localhost"},
			want:  []string{`line 13: instance "db": hosts: want a list, got "db.localhost"`},
		},
		{
			name:  "the instance's own problems name it",
			extra: []string{"    idle: soon", "    max_upstream_conns: -1"},
			want: []string{
				`line 13: instance "db": idle: "soon" ` + notDuration,
				`line 14: instance "db": max_upstream_conns: must be positive, got -1`,
			},
		},
		{
			name:  "not a mapping",
			extra: []string{"  - db2"},
			want:  []string{`line 13: instance "#2": an instance must be a mapping`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantProblems(t, lines(append(base, tt.extra...)...), backings, tt.want)
		})
	}
}

// TestLoadInstanceErrorField: an instance's problem is an *Error with Instance set and Route its name.
func TestLoadInstanceErrorField(t *testing.T) {
	data := lines(concat(webRoute("[]"), []string{"instances:"}, instance("db", 5432, ""), []string{"    host: db.localhost"})...)
	_, err := registry.Load([]byte(data), backings)
	var re *registry.Error
	if list := registry.Errors(err); len(list) != 1 || !errors.As(list[0], &re) {
		t.Fatalf("Load problems = %v, want one *registry.Error", list)
	}
	if re.Route != "db" || !re.Instance || re.Key != "host" || re.Line != 13 {
		t.Errorf("Error = %+v, want Route db, Instance, Key host, Line 13", *re)
	}
}

// TestLoadNamesAcrossLists: names are unique across routes and instances; the later entry in the file
// is the one reported, whichever list is written first.
func TestLoadNamesAcrossLists(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{
			name: "an instance after a route",
			yaml: lines(concat(webRoute("[]"), []string{"instances:"}, instance("web", 5432, ""))...),
			want: []string{`line 9: instance "web": name: duplicate name (also route #1: names are unique across routes and instances)`},
		},
		{
			name: "a route after an instance",
			yaml: lines(concat([]string{"instances:"}, instance("web", 5432, ""), webRoute("[]"))...),
			want: []string{`line 7: route "web": name: duplicate name (also instance #1: names are unique across routes and instances)`},
		},
		{
			name: "two instances",
			yaml: lines(concat(webRoute("[]"), []string{"instances:"}, instance("db", 5432, ""), instance("db", 5433, ""))...),
			want: []string{`line 13: instance "db": name: duplicate instance name (also instance #1)`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantProblems(t, tt.yaml, backings, tt.want) })
	}
}

// TestLoadInstancesNeedRoutes: a config of instances alone has nothing to serve.
func TestLoadInstancesNeedRoutes(t *testing.T) {
	wantProblems(t, lines(concat([]string{"instances:"}, instance("db", 5432, ""))...), backings,
		[]string{"routes: no routes configured"})
}

// TestLoadRequires: each name in requires: must be an instance, and is listed once.
func TestLoadRequires(t *testing.T) {
	insts := concat([]string{"instances:"}, instance("db", 5432, ""), instance("cache", 6379, "")) // lines 8-16
	tests := []struct {
		name     string
		requires string // web's requires:, on line 7
		extra    []string
		want     []string
	}{
		{
			name:     "a route",
			requires: "[db, web]",
			want:     []string{`line 7: route "web": requires[1]: "web" is a route; requires names instances (instances:)`},
		},
		{
			name:     "an unknown name",
			requires: "[dbx]",
			want:     []string{`line 7: route "web": requires[0]: no instance named "dbx" (instances: db, cache)`},
		},
		{
			name:     "listed twice",
			requires: "[db, cache, db]",
			want:     []string{`line 7: route "web": requires[2]: "db" listed twice`},
		},
		{
			name:     "one that does not decode keeps the others' keys",
			requires: "[[db], nope]",
			want: []string{
				`line 7: route "web": requires[0]: cannot unmarshal !!seq into string`,
				`line 7: route "web": requires[1]: no instance named "nope" (instances: db, cache)`,
			},
		},
		{
			name:     "an instance requiring a route, on its own line",
			requires: "[]",
			extra:    []string{"    requires:", "      - web"},
			want:     []string{`line 18: instance "cache": requires[0]: "web" is a route; requires names instances (instances:)`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantProblems(t, lines(concat(webRoute(tt.requires), insts, tt.extra)...), backings, tt.want)
		})
	}
	t.Run("no instances at all", func(t *testing.T) {
		wantProblems(t, lines(webRoute("[db]")...), backings,
			[]string{`line 7: route "web": requires[0]: no instance named "db" (the config has no instances:)`})
	})
}

// TestLoadRequiresCycles: each cycle is reported once, on the requirement of its member written first,
// named in order from there; an instance that only leads into a cycle is not part of it.
func TestLoadRequiresCycles(t *testing.T) {
	data := lines(concat(webRoute("[a, x]"), []string{"instances:"},
		instance("a", 7001, "[a]"),        // lines 9-13: a cycle of one
		instance("b", 7002, "[c]"),        // 14-18: b → c → b
		instance("c", 7003, "[b]"),        // 19-23
		instance("x", 7004, "[z]"),        // 24-28: x leads into z → y → w → z
		instance("y", 7005, "[w]"),        // 29-33
		instance("z", 7006, "[b, y]"),     // 34-38: z also leads into b ↔ c
		instance("w", 7007, "[z, a]"))...) // 39-43
	wantProblems(t, data, backings, []string{
		`line 13: instance "a": requires[0]: requires cycle: a → a`,
		`line 18: instance "b": requires[0]: requires cycle: b → c → b`,
		`line 33: instance "y": requires[0]: requires cycle: y → w → z → y`,
	})
}

// TestLoadRequiresNoCycle: a diamond (two paths to one instance) is no cycle.
func TestLoadRequiresNoCycle(t *testing.T) {
	data := lines(concat(webRoute("[top]"), []string{"instances:"},
		instance("top", 7001, "[left, right]"), instance("left", 7002, "[base]"),
		instance("right", 7003, "[base]"), instance("base", 7004, ""))...)
	cfg := mustLoad(t, data, backings)
	if got := cfg.Instance("top").Requires; !reflect.DeepEqual(got, []string{"left", "right"}) {
		t.Errorf("top.Requires = %q", got)
	}
}

// fleetRoute is a route "web" on lines 1 to 6 whose exec block is on line 5, with a fleet whose
// members follow from line 8 on; tail goes after the members.
func fleetRoute(members []string, tail ...string) string {
	head := []string{
		"routes:",
		"  - name: web",
		"    hosts: [web.localhost]",
		"    backing: exec",
		"    exec: {argv: [/bin/web], env: {A: \"1\"}, stop: {grace: 2s}}",
		"    fleet:",
		"      members:",
	}
	return lines(concat(head, members, tail)...)
}

// TestLoadFleet: members inherit the route's backing block key by key, the decoder sees each member's
// own name and upstream, and the route's Upstream and Settings are the first member's.
func TestLoadFleet(t *testing.T) {
	type seen struct {
		name     string
		upstream string
	}
	var calls []seen
	decoders := map[string]registry.SettingsDecoder{"exec": func(r *registry.Route, n *yaml.Node) (any, error) {
		calls = append(calls, seen{r.Name, r.Upstream.String()})
		if r.Fleet != nil || r.Requires != nil {
			return nil, errors.New("a member's route has a fleet or requirements")
		}
		return decodeExec(r, n)
	}}
	cfg := mustLoad(t, fleetRoute([]string{
		"        - {name: b0, upstream: 127.0.0.1:9100}",
		"        - name: b1",
		"          upstream: unix:/run/b1.sock",
		"          exec: {env: {B: \"2\"}}",
	}, "      serial: true"), decoders)
	r := cfg.Routes[0]
	if want := []seen{{"web.b0", "127.0.0.1:9100"}, {"web.b1", "unix:/run/b1.sock"}}; !reflect.DeepEqual(calls, want) {
		t.Errorf("decoder calls = %+v, want %+v", calls, want)
	}
	f := r.Fleet
	if f == nil || len(f.Members) != 2 || f.MinReady != 2 || !f.Serial {
		t.Fatalf("Fleet = %+v, want 2 members, min_ready 2 (the default), serial", f)
	}
	b0, b1 := f.Members[0].Settings.(*fakeExec), f.Members[1].Settings.(*fakeExec)
	if !reflect.DeepEqual(b0.Env, map[string]string{"A": "1"}) || b0.Argv[0] != "/bin/web" {
		t.Errorf("b0's settings = %+v, want the route's block", b0)
	}
	// env is replaced whole (a top-level key), argv and stop are inherited.
	if !reflect.DeepEqual(b1.Env, map[string]string{"B": "2"}) || b1.Argv[0] != "/bin/web" || b1.Stop.Grace.D() != 2*time.Second {
		t.Errorf("b1's settings = %+v, want env {B: 2} over the route's argv and stop", b1)
	}
	if r.Upstream != f.Members[0].Upstream || r.Settings != f.Members[0].Settings {
		t.Errorf("route upstream %v and settings %p, want the first member's %v and %p", r.Upstream, r.Settings, f.Members[0].Upstream, f.Members[0].Settings)
	}
	if m := r.MemberRoute(f.Members[1]); m.Name != "web.b1" || m.Upstream.String() != "unix:/run/b1.sock" || m.Settings != f.Members[1].Settings {
		t.Errorf("MemberRoute(b1) = %s %v %p", m.Name, m.Upstream, m.Settings)
	}
}

// TestLoadFleetMinReady: min_ready defaults to every member and must be between 1 and their number.
func TestLoadFleetMinReady(t *testing.T) {
	members := []string{
		"        - {name: b0, upstream: 127.0.0.1:9100}",
		"        - {name: b1, upstream: 127.0.0.1:9101}",
		"        - {name: b2, upstream: 127.0.0.1:9102}",
	}
	get := func(c *registry.Config) any { return c.Routes[0].Fleet.MinReady }
	for _, kc := range []keyCase{
		{value: "", want: 3},
		{value: "1", want: 1},
		{value: "3", want: 3},
		{value: "0", problem: "must be between 1 and 3 (the number of members), got 0"},
		{value: "4", problem: "must be between 1 and 3 (the number of members), got 4"},
		{value: "-1", problem: "must be between 1 and 3 (the number of members), got -1"},
		{value: "all", problem: "cannot unmarshal !!str `all` into int"},
	} {
		t.Run("min_ready="+kc.value, func(t *testing.T) {
			var tail []string
			if kc.value != "" {
				tail = []string{"      min_ready: " + kc.value}
			}
			runKeyCase(t, fleetRoute(members, tail...), kc, `line 11: route "web": fleet.min_ready: `, get)
		})
	}
}

// decodeLined is decodeExec with each problem's line found in the block, as a real backing's decoder
// finds it (registry.KeyLine), so that a member's problem in an inherited key points at the route's
// block and one in its own block at the member's.
func decodeLined(r *registry.Route, n *yaml.Node) (any, error) {
	s, err := decodeExec(r, n)
	var out []error
	for _, e := range registry.Errors(err) {
		var re *registry.Error
		if errors.As(e, &re) && re.Line == 0 {
			c := *re
			c.Line = registry.KeyLine(n, re.Key)
			e = &c
		}
		out = append(out, e)
	}
	return s, errors.Join(out...)
}

// TestLoadFleetProblems: every problem of a fleet and its members, keyed below the member, with its
// line.
func TestLoadFleetProblems(t *testing.T) {
	const member0 = "        - {name: b0, upstream: 127.0.0.1:9100}" // line 8
	decoders := map[string]registry.SettingsDecoder{"exec": decodeLined, "unit": decodeLined}
	tests := []struct {
		name    string
		members []string // from line 8 on
		tail    []string
		want    []string
	}{
		{
			name:    "member keys in the member's block and in the route's",
			members: []string{member0, "        - name: b1", "          upstream: 127.0.0.1:9101", "          exec:", "            argv: [bin/b1]", "            stop: {grace: 1m}"},
			want: []string{
				`line 12: route "web": fleet.members[1].exec.argv[0]: "bin/b1" is not an absolute path`,
				`line 13: route "web": fleet.members[1].exec.stop.grace: 1m0s exceeds the route's sleep_budget 30s`,
			},
		},
		{
			name:    "an unknown key in a member's block",
			members: []string{member0, "        - name: b1", "          upstream: 127.0.0.1:9101", "          exec: {argvv: [/bin/b1]}"},
			want:    []string{`line 11: route "web": fleet.members[1].exec.argvv: unknown key (known keys: argv, dir, env, stop)`},
		},
		{
			name:    "names",
			members: []string{"        - {upstream: 127.0.0.1:9100}", "        - {name: B1, upstream: 127.0.0.1:9101}", "        - {name: b2, upstream: 127.0.0.1:9102}", "        - {name: b2, upstream: 127.0.0.1:9103}"},
			want: []string{
				`line 8: route "web": fleet.members[0].name: missing: the member's name`,
				`line 9: route "web": fleet.members[1].name: "B1" is not a valid member name (lower-case letters, digits, '-' and '_', at most 63)`,
				`line 11: route "web": fleet.members[3].name: duplicate member name (also fleet.members[2])`,
			},
		},
		{
			name:    "upstreams",
			members: []string{"        - {name: b0}", "        - {name: b1, upstream: localhost}", "        - {name: b2, upstream: 127.0.0.1:9102}", "        - {name: b3, upstream: 127.0.0.1:9102}", "        - {name: b4, upstream: 127.0.0.1:8080}"},
			want: []string{
				`line 8: route "web": fleet.members[0].upstream: missing: where does this member listen? (host:port or unix:/path)`,
				`line 9: route "web": fleet.members[1].upstream: upstream "localhost" is neither host:port nor a unix socket path`,
				`line 11: route "web": fleet.members[3].upstream: upstream 127.0.0.1:9102 is also that of fleet.members[2]: each member needs its own`,
				`line 12: route "web": fleet.members[4].upstream: upstream 127.0.0.1:8080 is the activator's own listen address 127.0.0.1:8080: requests would loop back to the edge (where does the woken tenant listen?)`,
			},
		},
		{
			name:    "an unknown member key, a member that is not a mapping, another backing's block",
			members: []string{member0, "        - {name: b1, upstream: 127.0.0.1:9101, weight: 2}", "        - b2", "        - name: b3", "          upstream: 127.0.0.1:9103", "          unit: {name: b3.service}"},
			want: []string{
				`line 9: route "web": fleet.members[1].weight: unknown key (known keys: name, upstream)`,
				`line 10: route "web": fleet.members[2]: want a mapping with name and upstream, got "b2"`,
				`line 13: route "web": fleet.members[3].unit: settings for backing "unit", but the route's backing is "exec"`,
			},
		},
		{
			name:    "no members",
			members: []string{"        []"},
			want:    []string{`line 7: route "web": fleet.members: missing: a fleet needs at least one member`},
		},
		{
			name:    "members that are not a list",
			members: []string{"        b0"},
			tail:    []string{"      min_ready: 5"},
			want:    []string{`line 8: route "web": fleet.members: want a list, got "b0"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantProblems(t, fleetRoute(tt.members, tt.tail...), decoders, tt.want)
		})
	}
}

// TestLoadFleetRouteProblems: the problems a fleet causes in the route's own keys.
func TestLoadFleetRouteProblems(t *testing.T) {
	const member0 = "        - {name: b0, upstream: 127.0.0.1:9100}" // line 8
	decoders := map[string]registry.SettingsDecoder{"exec": decodeLined}
	t.Run("an upstream of its own", func(t *testing.T) {
		wantProblems(t, fleetRoute([]string{member0}, "    upstream: 127.0.0.1:9001"), decoders, []string{
			`line 9: route "web": upstream: a fleet has no upstream of its own: each member has its own (fleet.members[N].upstream)`,
		})
	})
	t.Run("an inherited key's problem points at the route's block", func(t *testing.T) {
		data := strings.Replace(fleetRoute([]string{member0}), "argv: [/bin/web]", "argv: [bin/web]", 1)
		wantProblems(t, data, decoders, []string{`line 5: route "web": fleet.members[0].exec.argv[0]: "bin/web" is not an absolute path`})
	})
}

// TestLoadFleetOnInstance: an instance can be a fleet too.
func TestLoadFleetOnInstance(t *testing.T) {
	data := lines(concat(webRoute("[db]"), []string{"instances:",
		"  - name: db",
		"    backing: exec",
		"    exec: {argv: [/bin/db]}",
		"    health: {tcp: true}",
		"    fleet: {min_ready: 1, members: [{name: p, upstream: 127.0.0.1:5432}, {name: r, upstream: 127.0.0.1:5433}]}",
	})...)
	db := mustLoad(t, data, backings).Instance("db")
	if db.Fleet == nil || len(db.Fleet.Members) != 2 || db.Fleet.MinReady != 1 || db.Upstream.String() != "127.0.0.1:5432" {
		t.Errorf("db = %+v, fleet %+v", db, db.Fleet)
	}
}

// TestLoadHealthTCP: health.tcp makes the gate a connect check; the keys of an HTTP probe are errors
// beside it.
func TestLoadHealthTCP(t *testing.T) {
	cfg := mustLoad(t, oneRoute("hosts: [a.localhost]", "health: {tcp: true, timeout: 1s, budget: 10s}"), backings)
	want := registry.Health{TCP: true, Interval: time.Second, Timeout: time.Second, Passes: 1, Budget: 10 * time.Second}
	if got := cfg.Routes[0].Health; got != want {
		t.Errorf("Health = %+v, want %+v", got, want)
	}
	const unused = "not used with health.tcp: true (the gate only connects, it sends no request): remove it"
	wantProblems(t, oneRoute("hosts: [a.localhost]", "health:", "  tcp: true", "  path: /healthz", "  host: a.localhost", "  status: \"204\"", "  fail_fast_after: 0"), backings, []string{
		`line 9: route "a": health.path: ` + unused,
		`line 10: route "a": health.host: ` + unused,
		`line 11: route "a": health.status: ` + unused,
		`line 12: route "a": health.fail_fast_after: ` + unused,
	})
}

// TestSameFleet: Route.Same sees a change in any member, its settings among them.
func TestSameFleet(t *testing.T) {
	members := func(env string) []string {
		return []string{
			"        - {name: b0, upstream: 127.0.0.1:9100}",
			"        - {name: b1, upstream: 127.0.0.1:9101, exec: {env: {B: \"" + env + "\"}}}",
		}
	}
	load := func(data string) *registry.Route { return mustLoad(t, data, backings).Routes[0] }
	a := load(fleetRoute(members("2")))
	if b := load(fleetRoute(members("2"))); !a.Same(b) {
		t.Errorf("the same fleet loaded twice is not Same")
	}
	if b := load(fleetRoute(members("3"))); a.Same(b) {
		t.Errorf("a fleet whose second member's settings changed is Same")
	}
	if b := load(fleetRoute(members("2"), "      serial: true")); a.Same(b) {
		t.Errorf("a fleet that became serial is Same")
	}
	req := func(r string) *registry.Route {
		return mustLoad(t, lines(concat(webRoute(r), []string{"instances:"}, instance("db", 5432, ""), instance("mq", 5672, ""))...), backings).Routes[0]
	}
	if !req("[db]").Same(req("[db]")) {
		t.Errorf("the same requirements loaded twice are not Same")
	}
	if req("[db]").Same(req("[db, mq]")) {
		t.Errorf("a route that gained a requirement is Same")
	}
}
