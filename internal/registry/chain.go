package registry

// Instances (instances:), the requirements between tenants (requires:), and the checks across entries:
// unique names, requirements that name instances, no cycle.

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"

	"go.yaml.in/yaml/v3"
	"golang.org/x/sync/errgroup"
)

// entry is one route or instance as loaded, problems and all: what the checks across entries see, so
// that a duplicate name or a bad requirement is reported even beside the entry's own problems.
type entry struct {
	r     *Route // nil when the entry is not a mapping
	idx   int    // position in its list
	label string // the name, or "#N"
	ok    bool   // the entry has no problem of its own
	reqs  []reqAt
	// The lines of the keys that the checks across entries report: they are taken while the entry's
	// node is at hand, and the node is not kept, so that each entry's tree can be collected as soon as
	// it is decoded (a large file's trees outweigh everything else a load holds).
	nameLine, hostsLine, backingLine int
	// reused is set for an entry a Reloader took from its last load: r is that load's Route, compact
	// already, and its lines are those of a placeholder node.
	reused bool
}

// reqAt is one decoded entry of requires:, its key ("requires[2]") and that key's line.
type reqAt struct {
	name, key string
	line      int
}

// withLines sets e's lines (and its requirements') from n, the entry's node, as KeyLine finds them.
func (e *entry) withLines(n *yaml.Node) {
	e.nameLine, e.hostsLine = KeyLine(n, "name"), KeyLine(n, "hosts")
	if e.r != nil {
		e.backingLine = KeyLine(n, e.r.Backing)
	}
	for i := range e.reqs {
		e.reqs[i].line = KeyLine(n, e.reqs[i].key)
	}
}

// kind is how problems and hints name the entry's list.
func (e *entry) kind() string {
	if e.r != nil && e.r.Instance {
		return "instance"
	}
	return "route"
}

func (e *entry) add(l *errs, key string, line int, format string, args ...any) {
	l.add(e.label, key, line, format, args...)
	markInstance(l.list[len(l.list)-1:], e.r != nil && e.r.Instance)
}

// markInstance marks the problems in list as an instance's (Error.Instance) when instance is set.
func markInstance(list []error, instance bool) {
	if !instance {
		return
	}
	for _, err := range list {
		if e, ok := err.(*Error); ok {
			e.Instance = true
		}
	}
}

// loadEntries loads the routes and the instances, the list written first first, and checks that their
// names are unique across both lists and that no two routes share a host and path prefix. It returns
// every entry, usable or not, in file order; with false, and nothing else, when a run of cut's does
// not parse as its entries (see loadRoutes).
func loadEntries(l *errs, doc *yaml.Node, fc *fileConfig, backings map[string]SettingsDecoder, own []ownAddr, cut *cutLoad) ([]entry, bool) {
	lists := []struct {
		nodes    []yaml.Node
		instance bool
	}{{fc.Routes, false}, {fc.Instances, true}}
	if KeyLine(doc, "instances") < KeyLine(doc, "routes") {
		lists[0], lists[1] = lists[1], lists[0]
	}
	// Sized up front: growing them to a large config's every name and host rehashes them again and again.
	n := len(fc.Routes) + len(fc.Instances)
	ents := make([]entry, 0, n)
	names := make(map[string]*entry, n)
	hosts := make(map[string]string, len(fc.Routes))
	owned := map[string]string{}
	for _, list := range lists {
		lrs, ok := loadRoutes(list.nodes, list.instance, backings, own, cut)
		if !ok {
			return nil, false
		}
		for _, lr := range lrs {
			l.list = append(l.list, lr.problems...)
			if lr.e.r == nil {
				continue
			}
			ents = append(ents, lr.e)
			checkUnique(l, &ents[len(ents)-1], names, hosts)
			checkOwned(l, &ents[len(ents)-1], owned)
		}
	}
	return ents, true
}

// loaded is one entry as loadRoute left it, with the problems it found.
type loaded struct {
	e        entry
	problems []error
}

// loadChunk is how many entries a loadRoutes worker takes at a time: enough that handing them out
// costs nothing beside decoding them, few enough that the workers finish together.
const loadChunk = 256

// loadRoutes runs loadRoute over every entry of one list, on up to GOMAXPROCS goroutines: each entry
// is decoded and checked on its own (its backing's decoder included), so a large config's load scales
// with the CPUs. Each entry's problems are kept apart and the result is in file order, so that the
// caller reports them, and the checks across entries, just as one loop would.
//
// The entries are nodes, the list as the document decoded it, unless cut (a Reloader's load by the
// cut) is set. Then the nodes are placeholders: an entry in one of cut's runs is parsed from the
// file's text, with the rest of its run, by the worker that decodes it, and an entry with a Route in
// cut's reuse (at the entry's index) is not decoded: its host checks run again. Either way the entry's
// tree is let go of once it is decoded (loadDoc does not read the document's lists after this), so that
// a large file's trees, several times the size of the Routes decoded from them, are not all held until
// the load ends. It reports false when a run does not parse as its entries (parseEntries); no run
// starts after that.
func loadRoutes(nodes []yaml.Node, instance bool, backings map[string]SettingsDecoder, own []ownAddr, cut *cutLoad) ([]loaded, bool) {
	out := make([]loaded, len(nodes))
	var (
		runs  []parseRun
		reuse []*Route
		hosts *HostCache
	)
	if cut != nil {
		runs = cut.runs[instance]
		if cut.reuse != nil {
			reuse, hosts = cut.reuse.routes[instance], cut.reuse.hosts
		}
	}
	decode := func(n *yaml.Node, i int) {
		var l errs
		out[i].e = loadRoute(&l, n, i, instance, backings, own)
		out[i].problems = l.list
	}
	spans := spansOf(len(nodes), runs)
	ok := inParallel(len(spans), 1, func(k, _ int) bool {
		sp := spans[k]
		if sp.run != nil {
			items, ok := parseEntries(cut.sp, *sp.run)
			if !ok {
				return false
			}
			for j, n := range items {
				decode(n, sp.lo+j)
				items[j] = nil // the entry's tree: see above
			}
			return true
		}
		for i := sp.lo; i < sp.hi; i++ {
			if i < len(reuse) && reuse[i] != nil {
				out[i].e, out[i].problems = reusedEntry(reuse[i], &nodes[i], i, hosts)
				continue
			}
			decode(&nodes[i], i)
			nodes[i] = yaml.Node{} // the entry's tree: see above
		}
		return true
	})
	return out, ok
}

// span is the entries lo to hi (exclusive) of a list, as one loadRoutes worker takes them: a run to
// parse, or (run nil) entries whose nodes are at hand.
type span struct {
	lo, hi int
	run    *parseRun
}

// spansOf cuts a list of n entries into spans: each of runs (in order, as loadSplit makes them) whole,
// and the entries between them in spans of at most loadChunk.
func spansOf(n int, runs []parseRun) []span {
	var out []span
	add := func(lo, hi int) {
		for ; lo < hi; lo += loadChunk {
			out = append(out, span{lo: lo, hi: min(lo+loadChunk, hi)})
		}
	}
	at := 0
	for k := range runs {
		add(at, runs[k].start)
		out = append(out, span{lo: runs[k].start, hi: runs[k].end, run: &runs[k]})
		at = runs[k].end
	}
	add(at, n)
	return out
}

// inParallel calls do over [0, n) in batches of at most batch indexes (lo to hi, exclusive), in
// order, on up to GOMAXPROCS goroutines at once, until every batch is done or a call reports false
// (no batch starts after that); it reports whether none did, once every call has returned.
func inParallel(n, batch int, do func(lo, hi int) bool) bool {
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	var failed atomic.Bool
	for lo := 0; lo < n && !failed.Load(); lo += batch {
		g.Go(func() error {
			if !do(lo, min(lo+batch, n)) {
				failed.Store(true)
			}
			return nil
		})
	}
	_ = g.Wait()
	return !failed.Load()
}

// checkUnique reports e's name when an earlier route or instance has it already, and each of a route's
// hosts under its path prefix when an earlier route has it, and records e's for the entries after it.
// An entry with problems of its own takes part too, so that fixing those does not reveal a duplicate
// only then.
func checkUnique(l *errs, e *entry, names map[string]*entry, hosts map[string]string) {
	r := e.r
	switch prev, dup := names[r.Name]; {
	case dup && prev.kind() == e.kind():
		e.add(l, "name", e.nameLine, "duplicate %s name (also %s #%d)", e.kind(), prev.kind(), prev.idx+1)
	case dup:
		e.add(l, "name", e.nameLine, "duplicate name (also %s #%d: names are unique across routes and instances)", prev.kind(), prev.idx+1)
	case r.Name != "":
		names[r.Name] = e
	}
	for _, h := range r.Hosts {
		k := h + r.PathPrefix
		if other, dup := hosts[k]; dup {
			e.add(l, "hosts", e.hostsLine, "host %q with path prefix %q is already routed to %q", h, r.PathPrefix, other)
			continue
		}
		hosts[k] = e.label
	}
}

// Owner is implemented by a backing's decoded settings that name things on the host a route must have
// to itself, such as a kvm guest's runtime_dir (its QMP socket and pid file) and snapshot_dir (its
// snapshot and RAM file): two guests sharing one reap and resume each other's. Load reports a value
// that two routes, instances or fleet members name.
type Owner interface {
	Owns() []Owned
}

// Owned is one thing a route's settings name that must be the route's own: the key that sets it
// within the backing's block ("runtime_dir") and its value.
type Owned struct{ Key, Value string }

// checkOwned reports each thing e's settings (each fleet member's, for a fleet) own (Owner) that an
// earlier entry owns already, and records e's for the entries after it. Values are compared as
// written, after the backing's defaults and cleaning.
func checkOwned(l *errs, e *entry, owned map[string]string) {
	r := e.r
	if r.Fleet == nil {
		ow, ok := r.Settings.(Owner) // asked first: most backings own nothing, and 100,000 routes must cost nothing
		if ok {
			checkOwner(l, e, ow, func() string { return fmt.Sprintf("%s %q", e.kind(), r.Name) }, owned)
		}
		return
	}
	for _, m := range r.Fleet.Members {
		if ow, ok := m.Settings.(Owner); ok {
			checkOwner(l, e, ow, func() string { return fmt.Sprintf("%s %q member %q", e.kind(), r.Name, m.Name) }, owned)
		}
	}
}

// checkOwner is checkOwned for one owner: who names it, in an error or in owned.
func checkOwner(l *errs, e *entry, ow Owner, who func() string, owned map[string]string) {
	r := e.r
	for _, it := range ow.Owns() {
		if it.Value == "" {
			continue
		}
		key := r.Backing + "." + it.Key
		if prev, dup := owned[it.Value]; dup {
			e.add(l, key, e.backingLine, "%s %q is also that of %s: no two may share it", it.Key, it.Value, prev)
			continue
		}
		owned[it.Value] = fmt.Sprintf("%s (%s)", who(), key)
	}
}

// checkNoHosts reports the keys that place a route in the request space, which an instance has none of.
func (c *routeCheck) checkNoHosts() {
	for _, k := range []struct{ key, what string }{{"host", "hosts"}, {"hosts", "hosts"}, {"path_prefix", "path prefix"}} {
		if hasKey(c.n, k.key) && !c.failedBelow(k.key) {
			c.add(k.key, c.at(k.key), "an instance has no %s: it is woken as a requirement (requires:) or from the admin API", k.what)
		}
	}
}

// checkNoPeople reports waiting_page and ignore on an instance: no request ever reaches one.
func (c *routeCheck) checkNoPeople() {
	if hasKey(c.n, "waiting_page") {
		c.add("waiting_page", c.at("waiting_page"), "no request ever reaches an instance, so it shows no waiting page")
	}
	if hasKey(c.n, "ignore") && !c.failedBelow("ignore") {
		c.add("ignore", c.at("ignore"), "no request ever reaches an instance, so there is nothing to ignore")
	}
}

// hasKey reports whether the mapping n has key.
func hasKey(n *yaml.Node, key string) bool {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return true
		}
	}
	return false
}

// requireKeys pairs each decoded entry of requires: with its key. Entries that failed to decode are
// missing from rk.Requires: their positions are skipped to find each key.
func (c *routeCheck) requireKeys() []reqAt {
	var out []reqAt
	pos := 0
	for _, name := range c.rk.Requires {
		for c.undecoded[fmt.Sprintf("requires[%d]", pos)] {
			pos++
		}
		out = append(out, reqAt{name: name, key: fmt.Sprintf("requires[%d]", pos)})
		pos++
	}
	return out
}

// checkRequires checks every entry's requires: each name an instance, none listed twice; it sets
// Route.Requires to the names that are, in the order written. Then it reports each cycle among the
// instances' requirements once.
func checkRequires(l *errs, ents []entry) {
	instances := map[string]int{} // name → index in ents, of the first instance with it
	routes := map[string]bool{}
	var names []string
	for i := range ents {
		r := ents[i].r
		if _, dup := instances[r.Name]; r.Instance && !dup && r.Name != "" {
			instances[r.Name] = i
			names = append(names, r.Name)
		} else if !r.Instance {
			routes[r.Name] = true
		}
	}
	hint := "(the config has no instances:)"
	if len(names) > 0 {
		hint = "(instances: " + strings.Join(names, ", ") + ")"
	}
	for i := range ents {
		e := &ents[i]
		var seen map[string]bool
		if len(e.reqs) > 0 {
			seen = map[string]bool{}
		}
		var reqs []string
		for _, q := range e.reqs {
			line := q.line
			_, isInstance := instances[q.name]
			switch {
			case seen[q.name]:
				e.add(l, q.key, line, "%q listed twice", q.name)
			case isInstance:
				reqs = append(reqs, q.name)
			case routes[q.name]:
				e.add(l, q.key, line, "%q is a route; requires names instances (instances:)", q.name)
			default:
				e.add(l, q.key, line, "no instance named %q %s", q.name, hint)
			}
			seen[q.name] = true
		}
		// A reused entry's Route is the last load's, which the server may be reading: its Requires,
		// from the same text, are these already.
		if !e.reused {
			e.r.Requires = reqs
		}
	}
	checkCycles(l, ents, instances)
}

// checkCycles reports each cycle in the instances' requirements once, as "a → b → c → a" starting at
// the member written first, on that member's requirement of the next.
func checkCycles(l *errs, ents []entry, instances map[string]int) {
	f := cycleFinder{ents: ents, instances: instances, state: make([]int8, len(ents))}
	for i := range ents {
		if ents[i].r.Instance && f.state[i] == unvisited {
			f.visit(i)
		}
	}
	for _, cyc := range f.cycles {
		first := slices.Index(cyc, slices.Min(cyc))
		cyc = append(cyc[first:], cyc[:first]...)
		path := make([]string, 0, len(cyc)+1)
		for _, i := range cyc {
			path = append(path, ents[i].r.Name)
		}
		path = append(path, path[0])
		e := &ents[cyc[0]]
		next := path[1]
		i := slices.IndexFunc(e.reqs, func(q reqAt) bool { return q.name == next })
		e.add(l, e.reqs[i].key, e.reqs[i].line, "requires cycle: %s", strings.Join(path, " → "))
	}
}

// Depth-first search states.
const (
	unvisited int8 = iota
	onPath         // on the current path: an edge back to it closes a cycle
	done
)

// cycleFinder is a depth-first search over the instances' requirements. Each edge back to an instance
// on the current path closes one cycle, and no two such edges close the same one, so each cycle found
// is reported once however many members it has.
type cycleFinder struct {
	ents      []entry
	instances map[string]int
	state     []int8
	path      []int
	cycles    [][]int // indices into ents, in requirement order
}

func (f *cycleFinder) visit(i int) {
	f.state[i] = onPath
	f.path = append(f.path, i)
	for _, name := range f.ents[i].r.Requires {
		j := f.instances[name]
		switch f.state[j] {
		case unvisited:
			f.visit(j)
		case onPath:
			f.cycles = append(f.cycles, slices.Clone(f.path[slices.Index(f.path, j):]))
		}
	}
	f.path = f.path[:len(f.path)-1]
	f.state[i] = done
}
