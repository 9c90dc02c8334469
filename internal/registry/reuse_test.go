package registry_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/registry"
)

// checkedExec is fakeExec with host checks, so that a Reloader may take it as it was: with env STAT=1
// its decode, and CheckHost, need argv[0] to exist.
type checkedExec fakeExec

func (s *checkedExec) CheckHost(*registry.HostCache) error {
	if s.Env["STAT"] != "1" {
		return nil
	}
	_, err := os.Stat(s.Argv[0])
	return err
}

func decodeChecked(r *registry.Route, node *yaml.Node) (any, error) {
	v, err := decodeExec(r, node)
	if err != nil {
		return nil, err
	}
	s := (*checkedExec)(v.(*fakeExec))
	if err := s.CheckHost(&registry.HostCache{}); err != nil {
		return nil, &registry.Error{Key: "argv[0]", Err: err}
	}
	return s, nil
}

var reusing = map[string]registry.SettingsDecoder{"exec": decodeChecked}

// reloadAgrees loads next with rl, and checks that the outcome is Load's, problems included. It
// returns how many entries rl decoded.
func reloadAgrees(t *testing.T, rl *registry.Reloader, next string) int {
	t.Helper()
	cfg, err := rl.Load([]byte(next))
	got := renderResult(t, cfg, err)
	cfg, err = registry.Load([]byte(next), reusing)
	want := renderResult(t, cfg, err)
	if !bytes.Equal(got, want) {
		t.Fatalf("Reloader.Load differs from Load for\n%s\n--- got\n%s\n--- want\n%s", next, got, want)
	}
	return rl.Decoded()
}

// loadThenEdit loads base with a new Reloader, which must decode all n of its entries, and then next,
// each outcome checked against Load's; unless decoded is -1, next must have decoded that many. It
// returns the Reloader.
func loadThenEdit(t *testing.T, base, next string, n, decoded int) *registry.Reloader {
	t.Helper()
	rl := registry.NewReloader(reusing)
	if d := reloadAgrees(t, rl, base); d != n {
		t.Fatalf("the first load decoded %d entries, want all %d", d, n)
	}
	if d := reloadAgrees(t, rl, next); decoded >= 0 && d != decoded {
		t.Errorf("decoded %d entries, want %d", d, decoded)
	}
	return rl
}

// reuseBase is a config with n routes, each requiring the instance db, and that instance.
func reuseBase(n int) string {
	var b strings.Builder
	b.WriteString("# reuse\nlisten: 127.0.0.1:8080\nadmin: 127.0.0.1:8081\nroutes:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - name: r%d\n    hosts: [r%d.test]\n    backing: exec\n    upstream: 127.0.0.1:%d\n    requires: [db]\n    exec:\n      argv: [/usr/bin/app, \"%d\"]\n", i, i, 9000+i, i)
	}
	b.WriteString("instances:\n  - name: db\n    backing: exec\n    upstream: 127.0.0.1:5432\n    exec: {argv: [/usr/bin/db]}\n")
	return b.String()
}

// TestReloaderKeepsAnchors: a file whose entries share values through anchors and aliases is cut and
// reused like any other, each run parsed behind the entries that may define its anchors, and every
// outcome is Load's. Before, any anchor sent every load to a whole one: the bench's 100,000 routes
// with one anchor reloaded a one-route edit in 11 s at a 1.4 GB peak.
func TestReloaderKeepsAnchors(t *testing.T) {
	base := strings.Replace(reuseBase(5), "    exec:\n      argv: [/usr/bin/app, \"0\"]\n", "    exec: &e\n      argv: [/usr/bin/app, \"0\"]\n", 1)
	for i := 1; i < 5; i++ {
		base = strings.Replace(base, fmt.Sprintf("    exec:\n      argv: [/usr/bin/app, \"%d\"]\n", i), "    exec: *e\n", 1)
	}
	if strings.Count(base, "*e") != 4 {
		t.Fatalf("the base config has %d aliases, want 4:\n%s", strings.Count(base, "*e"), base)
	}
	many := base // more entries that may define anchors than a run is parsed behind
	for i := range registry.MaxAnchorEntries + 1 {
		many = strings.Replace(many, "instances:\n", fmt.Sprintf("  - name: a%d\n    hosts: &h%d [a%d.test]\n    backing: exec\n    upstream: 127.0.0.1:%d\n    exec: *e\n", i, i, i, 10000+i)+"instances:\n", 1)
	}
	for _, tc := range []struct {
		name    string
		next    string
		decoded int // -1: any
	}{
		{"same file", base, 0},
		{"a route that aliases edited", strings.Replace(base, "127.0.0.1:9003", "127.0.0.1:9103", 1), 1},
		{"the anchor's value edited", strings.Replace(base, "[/usr/bin/app, \"0\"]", "[/usr/bin/app, \"zero\"]", 1), 6},
		{"the anchor renamed, its aliases not", strings.Replace(base, "&e", "&f", 1), -1},
		{"an alias before its anchor", strings.Replace(strings.Replace(base, "&e", "*e", 1), "    exec: *e\n", "    exec: &e\n      argv: [/usr/bin/app, \"1\"]\n", 2), -1},
		{"the anchor redefined halfway", strings.Replace(base, "  - name: r3\n    hosts: [r3.test]\n    backing: exec\n    upstream: 127.0.0.1:9003\n    requires: [db]\n    exec: *e\n",
			"  - name: r3\n    hosts: [r3.test]\n    backing: exec\n    upstream: 127.0.0.1:9003\n    requires: [db]\n    exec: &e {argv: [/usr/bin/three]}\n", 1), -1},
		{"an instance aliases a route's anchor", strings.Replace(base, "    exec: {argv: [/usr/bin/db]}\n", "    exec: *e\n", 1), 1},
		{"a '&' in a string", strings.Replace(base, "[r2.test]", "[r2.test]\n    path_prefix: \"/a&b\"", 1), -1},
		{"more anchors than a run is parsed behind", many, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rl := loadThenEdit(t, base, tc.next, 6, tc.decoded)
			reloadAgrees(t, rl, base)
			reloadAgrees(t, rl, tc.next)
		})
	}
}

// TestReloaderAgreesWithLoad loads a config and then edits of it, each with one Reloader, and checks
// every outcome against Load's: the Reloader must never give another config or other problems, and it
// must decode only the entries whose text changed.
func TestReloaderAgreesWithLoad(t *testing.T) {
	base := reuseBase(5)
	route := func(i int) string {
		return fmt.Sprintf("  - name: r%d\n    hosts: [r%d.test]\n    backing: exec\n    upstream: 127.0.0.1:%d\n    requires: [db]\n    exec:\n      argv: [/usr/bin/app, \"%d\"]\n", i, i, 9000+i, i)
	}
	newRoute := "  - name: extra\n    hosts: [extra.test]\n    backing: exec\n    upstream: 127.0.0.1:9999\n    exec: {argv: [/usr/bin/extra]}\n"
	for _, tc := range []struct {
		name    string
		next    string
		decoded int // -1: any (a whole load, or problems)
	}{
		{"same file", base, 0},
		{"one route edited", strings.Replace(base, "127.0.0.1:9002", "127.0.0.1:9102", 1), 1},
		{"a route added first", strings.Replace(base, "routes:\n", "routes:\n"+newRoute, 1), 1},
		{"a route added last", strings.Replace(base, "instances:\n", newRoute+"instances:\n", 1), 1},
		{"a route removed", strings.Replace(base, route(3), "", 1), 0},
		{"two routes swapped", strings.Replace(strings.Replace(strings.Replace(base, route(1), "SWAP", 1), route(2), route(1), 1), "SWAP", route(2), 1), 0},
		{"a comment inside a route", strings.Replace(base, "    requires: [db]\n    exec:\n      argv: [/usr/bin/app, \"4\"]", "    requires: [db]\n# a comment at column 0\n    exec:\n      argv: [/usr/bin/app, \"4\"]", 1), 1},
		{"a comment between routes", strings.Replace(base, route(2), "  # between\n"+route(2), 1), 1},
		{"the listen address changed", strings.Replace(base, "127.0.0.1:8080", "127.0.0.1:8090", 1), 6},
		{"listen_tls added", strings.Replace(base, "admin: ", "listen_tls: 127.0.0.1:8443\ntls: {cert_file: /x.pem, key_file: /x.key}\nadmin: ", 1), -1},
		{"a header comment changed", strings.Replace(base, "# reuse", "# reused", 1), 0},
		{"a top-level key added", strings.Replace(base, "admin: ", "shutdown_grace: 10s\nadmin: ", 1), 0},
		{"listen moved onto an unchanged route's upstream", strings.Replace(base, "listen: 127.0.0.1:8080", "listen: 127.0.0.1:9003", 1), -1},
		{"an upstream made one of the own addresses", strings.Replace(base, "127.0.0.1:9003", "127.0.0.1:8081", 1), -1},
		{"every route edited", strings.ReplaceAll(base, "/usr/bin/app", "/usr/bin/app2"), -1},
		{"a route moved to instances", strings.Replace(strings.Replace(base, route(4), "", 1), "instances:\n", "instances:\n"+strings.Replace(strings.Replace(route(4), "    hosts: [r4.test]\n", "", 1), "    requires: [db]\n", "", 1), 1), 1},
		{"a duplicate host beside unchanged routes", strings.Replace(base, "[r3.test]", "[r1.test]", 1), -1},
		{"a requirement removed", strings.Replace(base, "instances:\n  - name: db\n    backing: exec\n    upstream: 127.0.0.1:5432\n    exec: {argv: [/usr/bin/db]}\n", "", 1), -1},
		{"a route without a name", strings.Replace(base, "  - name: r2\n", "  - \n", 1), -1},
		{"an anchor and an alias", strings.Replace(strings.Replace(base, "hosts: [r1.test]", "hosts: &h [r1.test]", 1), "    hosts: [r2.test]\n", "    path_prefix: /x\n    hosts: *h\n", 1), -1},
		{"a dash alone on its line", strings.Replace(base, "  - name: r2\n", "  -\n    name: r2\n", 1), 1},
		{"the list at column 0", strings.ReplaceAll(strings.ReplaceAll(base, "\n  - ", "\n- "), "\n    ", "\n  "), 6},
		{"CRLF line ends", strings.ReplaceAll(base, "\n", "\r\n"), 6},
		{"no newline at the end", strings.TrimSuffix(base, "\n"), 1},
		{"routes in flow style", strings.Replace(strings.Replace(base, "routes:\n", "routes: [\n", 1), "instances:", "]\ninstances:", 1), -1},
		{"a bad top-level value after the lists", base + "shutdown_grace: soon\n", -1},
		{"a bad top-level value after the lists, and a bad route", strings.Replace(base, "127.0.0.1:9002", "127.0.0.1:99999", 1) + "shutdown_grace: soon\n", -1},
		{"a syntax error in one route", strings.Replace(base, "hosts: [r3.test]", "hosts: [r3.test", 1), -1},
		{"a block scalar", strings.Replace(base, "      argv: [/usr/bin/app, \"1\"]\n", "      argv: [/usr/bin/app, \"1\"]\n      env:\n        NOTE: |\n          - not an item\n\n          # not a comment\n", 1), 1},
		{"a bad value in a block scalar's place", strings.Replace(base, "  - name: r1\n", "  - name: r1\n    waiting_page: |\n      - not an item\n", 1), -1},
		{"a second document", base + "---\nroutes: []\n", -1},
		{"a line at the list's column that is no item", base + "  !\n", -1},
		{"a line left of the list's column", strings.Replace(base, "instances:\n", " x\ninstances:\n", 1), -1},
		{"a directive", "%YAML 1.1\n---\n" + base, -1},
		{"a CR alone breaks a line", strings.Replace(base, "      argv: [/usr/bin/app, \"2\"]\n", "      argv: [/usr/bin/app, \"2\"]\r0\n", 1), -1},
		{"a LINE SEPARATOR breaks a line", strings.Replace(base, "      argv: [/usr/bin/app, \"2\"]\n", "      argv: [/usr/bin/app, \"2\"]\u2028  - name: x\n", 1), -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rl := loadThenEdit(t, base, tc.next, 6, tc.decoded)
			// And back: after any outcome the Reloader still agrees with Load.
			reloadAgrees(t, rl, base)
			reloadAgrees(t, rl, tc.next)
		})
	}
}

// TestReloaderParsesInRuns: with more entries than one run takes, the entries to parse go in several
// runs, on several goroutines; every outcome must still be Load's, and a problem in one run must be
// reported as Load reports it, with the file's line.
func TestReloaderParsesInRuns(t *testing.T) {
	base := reuseBase(1300)
	everyThird := base
	for i := 0; i < 1300; i += 3 {
		everyThird = strings.Replace(everyThird, fmt.Sprintf("127.0.0.1:%d\n", 9000+i), fmt.Sprintf("127.0.0.1:%d\n", 19000+i), 1)
	}
	for _, tc := range []struct {
		name    string
		next    string
		decoded int // -1: any (a whole load, or problems)
	}{
		{"every route edited", strings.ReplaceAll(base, "/usr/bin/app", "/usr/bin/app2"), 1300},
		{"every third route edited", everyThird, 434},
		{"a syntax error in the third run", strings.Replace(base, "hosts: [r1100.test]", "hosts: [r1100.test", 1), -1},
		{"a bad key in the second run", strings.Replace(base, "    hosts: [r700.test]\n", "    hosts: [r700.test]\n    idel: 1m\n", 1), -1},
		{"a duplicate host across runs", strings.Replace(base, "[r1200.test]", "[r3.test]", 1), -1},
		{"an alias across runs", strings.Replace(strings.Replace(base, "hosts: [r10.test]", "hosts: &h [r10.test]", 1), "    hosts: [r1000.test]\n", "    path_prefix: /x\n    hosts: *h\n", 1), -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			loadThenEdit(t, base, tc.next, 1301, tc.decoded)
			// A first load of the edit, with no memo, parses every entry in runs.
			reloadAgrees(t, registry.NewReloader(reusing), tc.next)
		})
	}
}

// TestReloaderEntryCutShort: the last entry's flow mapping goes on at column 0, where the cut ends
// the list, so the cut leaves that entry short. The next file is the first without that line: the
// entry's text is then exactly the short one, and the file does not parse. Reusing the entry from a
// memo of the first load reported that file as good (FuzzReloader found it).
func TestReloaderEntryCutShort(t *testing.T) {
	first := reuseBase(2) + "  - name: cache\n    backing: exec\n    upstream: 127.0.0.1:6379\n    exec: {argv: [/usr/bin/cache,\n]}\n"
	next := strings.TrimSuffix(first, "]}\n")
	rl := registry.NewReloader(reusing)
	reloadAgrees(t, rl, first)
	if _, err := registry.Load([]byte(next), reusing); err == nil {
		t.Fatal("Load takes the file without its closing line; the test needs one it rejects")
	}
	reloadAgrees(t, rl, next)
}

// TestReloaderCorpus loads every pair of the golden inputs, one after the other, with one Reloader.
func TestReloaderCorpus(t *testing.T) {
	inputs, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil || len(inputs) == 0 {
		t.Fatal("no testdata/*.yaml", err)
	}
	data := make([]string, len(inputs))
	for i, in := range inputs {
		b, err := os.ReadFile(in)
		if err != nil {
			t.Fatal(err)
		}
		data[i] = string(b)
	}
	for i := range data {
		for j := range data {
			rl := registry.NewReloader(reusing)
			reloadAgrees(t, rl, data[i])
			reloadAgrees(t, rl, data[j])
			reloadAgrees(t, rl, data[j])
		}
	}
}

// TestReloaderChecksTheHostAgain: an unchanged route is taken as it was only while its host checks
// pass; when they fail, the load reports Load's problem, and once they pass again the route is reused.
func TestReloaderChecksTheHostAgain(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "app")
	page := filepath.Join(dir, "page.html")
	for _, f := range []string{bin, page} {
		if err := os.WriteFile(f, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	config := reuseBase(2) + fmt.Sprintf("  - name: checked\n    backing: exec\n    upstream: 127.0.0.1:7000\n    exec: {argv: [%s], env: {STAT: \"1\"}}\n", bin)
	config = strings.Replace(config, "  - name: r1\n", fmt.Sprintf("  - name: r1\n    waiting_page: {template: %s}\n", page), 1)
	rl := registry.NewReloader(reusing)
	reloadAgrees(t, rl, config)
	for _, f := range []string{bin, page} {
		if d := reloadAgrees(t, rl, config); d != 0 {
			t.Fatalf("decoded %d entries of an unchanged file", d)
		}
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
		if _, err := rl.Load([]byte(config)); err == nil {
			t.Fatalf("with %s removed, the reload passed", f)
		}
		reloadAgrees(t, rl, config) // the problem is Load's
		if err := os.WriteFile(f, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if d := reloadAgrees(t, rl, config); d != 0 {
		t.Errorf("decoded %d entries once the files were back", d)
	}
}

// TestReloaderKeepsRoutes: a reload's unchanged Routes are the last load's very ones, so that the
// server (which keeps a Route that is the Same) and the Reloader hold one copy between them, and a
// reload writes nothing to them (the race detector watches a reader). After a change of listen,
// which decodes everything again, the routes that come out the Same are the last load's too.
func TestReloaderKeepsRoutes(t *testing.T) {
	rl := registry.NewReloader(reusing)
	base := reuseBase(3)
	c1, err := rl.Load([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func(routes []*registry.Route) { // the server reading the routes in force
		defer close(done)
		for range 1000 {
			for _, r := range routes {
				_ = len(r.Requires) + len(r.Name)
			}
		}
	}(c1.Routes)
	edited := strings.Replace(base, "127.0.0.1:9001", "127.0.0.1:9101", 1)
	for _, tc := range []struct {
		name, next string
		changed    string // the route whose Route is new
	}{
		{"one route edited", edited, "r1"},
		{"the listen address changed", strings.Replace(edited, "127.0.0.1:8080", "127.0.0.1:8090", 1), ""},
	} {
		c2, err := rl.Load([]byte(tc.next))
		if err != nil {
			t.Fatal(err)
		}
		for i := range c1.Routes {
			if same := c1.Routes[i] == c2.Routes[i]; same == (c1.Routes[i].Name == tc.changed) {
				t.Errorf("%s: route %s is the last load's Route: %v", tc.name, c1.Routes[i].Name, same)
			}
		}
		if c1.Instances[0] != c2.Instances[0] {
			t.Errorf("%s: the instance is not the last load's Route", tc.name)
		}
		c1 = c2
	}
	<-done
}

// A decoder whose settings are not HostCheckers is decoded every time: a backing that does not say
// how to check the host again is never trusted to be unchanged.
func TestReloaderDecodesSettingsWithoutHostChecks(t *testing.T) {
	rl := registry.NewReloader(backings)
	base := reuseBase(3)
	for range 2 {
		if _, err := rl.Load([]byte(base)); err != nil {
			t.Fatal(err)
		}
		if rl.Decoded() != 4 {
			t.Fatalf("decoded %d entries, want every one", rl.Decoded())
		}
	}
}

// FuzzReloader loads one input and then another with one Reloader: each outcome must be Load's.
func FuzzReloader(f *testing.F) {
	base := reuseBase(3)
	f.Add([]byte(base), []byte(strings.Replace(base, "9001", "9101", 1)))
	f.Add([]byte(base), []byte(strings.Replace(base, "  - name: r1\n", "  - name: r1\n    hosts: &a [x.test]\n", 1)))
	f.Add([]byte(base), []byte(base+"  - name: r9\n    backing: exec\n    upstream: 127.0.0.1:1\n    exec: {argv: [/a]}\n"))
	f.Add([]byte(strings.Replace(base, "9001", "x", 1)), []byte(base)) // a first load's problems are the cut's
	anchored := strings.Replace(strings.Replace(base, "hosts: [r0.test]", "hosts: &h [r0.test]", 1), "    hosts: [r2.test]\n", "    path_prefix: /x\n    hosts: *h\n", 1)
	f.Add([]byte(anchored), []byte(strings.Replace(anchored, "9001", "9101", 1)))                 // an alias across entries, another entry edited
	f.Add([]byte(anchored), []byte(strings.Replace(anchored, "&h [r0.test]", "&h [r9.test]", 1))) // the anchor edited
	f.Fuzz(func(t *testing.T, a, b []byte) {
		if len(a) > 4<<10 || len(b) > 4<<10 {
			return // rendering large configs twice per input starves the fuzzer; the cut is per line
		}
		rl := registry.NewReloader(reusing)
		reloadAgrees(t, rl, string(a)) // a first load is cut and parsed in runs too
		reloadAgrees(t, rl, string(b))
	})
}
