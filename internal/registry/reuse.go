package registry

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/robfig/cron/v3"
	"go.yaml.in/yaml/v3"
)

// A reload that changes one route of 100,000 should not cost what loading them all does: parsing the
// file with yaml.v3 alone takes seconds at that size. Reloader therefore cuts the file at its entries
// (the items of routes: and instances:) by their lines, before parsing it, and keeps each entry's
// decoded Route from the last load by a hash of its text. The next load parses only the rest of the
// file (the header) and the entries whose text is new, and takes the others' Routes as they were,
// once their host checks pass again. An entry's decode depends on nothing in the header but the
// activator's own addresses (listen, admin, listen_tls: no upstream may be one of them), so the memo
// holds for as long as those stay the same. The entries to parse (all of them at a first load) are
// parsed in runs of consecutive ones on every CPU, so a load of 100,000 new entries is not held to
// one CPU by one parse of the whole file. An entry's aliases may name anchors in earlier entries, so
// the entries that may define one are parsed in front of each run and their text is part of every
// later entry's hash (noteAnchors, parseEntries). Whatever the cut cannot vouch for falls back to a
// whole load: see splitEntries, loadSplit and newMemo.

// HostChecker is implemented by backing settings whose decoder consults the host (a directory
// exists, an executable is found in PATH, an image file is a regular file). CheckHost returns nil when
// decoding the same block again now would give the same settings without problems. Reloader takes an
// unchanged entry's settings as they were only when they implement it (or are nil) and it returns nil;
// otherwise the entry is decoded again, so a backing that does not implement it is only slower.
type HostChecker interface{ CheckHost(c *HostCache) error }

// HostCache answers each question about the host once per load: 100,000 routes that run one
// executable look it up once, not 100,000 times. Safe for concurrent use.
type HostCache struct{ m sync.Map }

type hostAnswer struct {
	v   string
	err error
}

// Do returns what f returned the first time this load asked key; f runs then. Keys are the caller's
// to make unique ("exec.resolve\x00" + argv[0] + ...).
func (c *HostCache) Do(key string, f func() (string, error)) (string, error) {
	if a, ok := c.m.Load(key); ok {
		return a.(hostAnswer).v, a.(hostAnswer).err
	}
	v, err := f()
	c.m.Store(key, hostAnswer{v, err})
	return v, err
}

// Reloader loads one config again and again, as the activator's reloads do, decoding again only the
// entries whose text changed since its last good load (see above). Its results and errors are Load's:
// an entry it does not decode is one that decoded without problems from the same text, with the same
// own addresses, and whose host checks pass now; a load that finds any problem is done again with
// every entry decoded (and, unless each problem is an entry's, as a whole), so the problems reported
// are exactly Load's. A Reloader is not safe for concurrent use.
type Reloader struct {
	backings map[string]SettingsDecoder
	memo     *memo // of the last good load; nil before one, or when its file could not be cut
	decoded  int   // entries decoded by the last load, the rest taken from memo
}

// NewReloader returns a Reloader for the given backings' decoders (as Load takes them).
func NewReloader(backings map[string]SettingsDecoder) *Reloader {
	return &Reloader{backings: backings}
}

// LoadFile reads a config file and loads it: see Load and Reloader.
func (rl *Reloader) LoadFile(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return rl.Load(data)
}

// Load loads data as Load does, reusing what it can of the last good load.
func (rl *Reloader) Load(data []byte) (*Config, error) {
	sp := splitEntries(data)
	cfg, err := rl.loadSplit(sp, rl.memo)
	parsedAll := rl.memo == nil        // every entry was parsed from its own text
	if errors.Is(err, errOwnChanged) { // every entry is decoded again, against the new addresses
		cfg, err = rl.loadSplit(sp, nil)
		parsedAll = true
	}
	if err == nil {
		return cfg, nil
	}
	if !errors.Is(err, errNoCut) && !errors.Is(err, errOwnChanged) {
		// Problems. When they were found beside reused entries, whose placeholders have no lines of
		// their own, the same cut is loaded again with every entry parsed from its own text. That
		// gives each entry's node the file's lines, so when every problem is an entry's the cut names
		// them as a whole load does, parsing on every CPU where a whole load parses on one (a typo in
		// one route of 100,000 took 3.3–3.9 s to be reported on 2 CPUs, 2.9 s this way, against 0.4 s
		// for a good reload of the same edit), and without the whole file's tree (`activator check`
		// of 100,000 routes with one typo: 990 MB of RSS and 10.9 s through the whole load). The
		// header's lines are not the file's (entrySplit): a problem there, or one an entry cannot
		// own, is left to the whole load.
		if !parsedAll {
			if cfg, err = rl.loadSplit(sp, nil); err == nil {
				return cfg, nil // good after all: a reused entry's host check failed, and passes now
			}
		}
		if entriesOnly(err) {
			return nil, err // the memo stays, as below
		}
	}
	doc, err := parse(data)
	if err != nil {
		return nil, err
	}
	cfg, ents, _, err := loadDoc(&doc, rl.backings, nil)
	if err != nil {
		return nil, err // the memo stays: it is still right for its own addresses and entries
	}
	// A whole load leaves no memo. Its entries were not parsed from their own text, so the cut's
	// hashes cannot vouch for them: an entry whose flow collection went on at column 0 was cut short
	// there, and a later file that ended at the cut would have reused it where Load rejects that file.
	rl.memo, rl.decoded = nil, len(ents)
	return cfg, nil
}

// entriesOnly reports whether err is a list of problems each of which names its entry (a route or an
// instance): none is the header's, and none is the cut's (errNoCut).
func entriesOnly(err error) bool {
	list := Errors(err)
	for _, e := range list {
		var re *Error
		if !errors.As(e, &re) || re.Route == "" {
			return false
		}
	}
	return len(list) > 0
}

// Decoded is how many entries the last successful Load decoded; the others were taken as they were.
func (rl *Reloader) Decoded() int { return rl.decoded }

// memo is what a good load leaves for the next: the own addresses its entries were checked against,
// and each entry's Route by the hash of its text.
type memo struct {
	own     []ownAddr
	entries map[sum]*Route
}

type sum [16]byte // the first half of a SHA-256: the entries are the operator's, not an attacker's

// loadSplit loads sp entry by entry: the header and the entries not in the memo (every entry, without
// one) are parsed, the others taken from the memo. The entries to parse go in runs of consecutive
// ones, each run's text parsed as one list by the worker that then decodes its entries, on up to
// GOMAXPROCS goroutines (loadRoutes): a reload that changes every entry of 100,000 (or the first load)
// parses on every CPU, where one parse of the whole file runs on one, and holds the trees of the runs
// being decoded, where the whole file's would outweigh everything else the load holds. m is the memo
// to take unchanged entries from (nil: none, every entry is decoded). It fails, and leaves the work to
// a whole load, when the header has an anchor or an alias (which entries may use, or name), a run's
// text does not parse as exactly its entries behind those that may define its anchors (errNoCut), or
// the load finds any problem (which Load then names, from the cut when each is an entry's); with
// errOwnChanged when the own addresses are not m's.
func (rl *Reloader) loadSplit(sp *entrySplit, m *memo) (*Config, error) {
	if sp == nil {
		return nil, errNoCut
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(sp.header, &doc); err != nil || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode || hasAnchors(&doc) {
		return nil, errNoCut
	}
	root := doc.Content[0]
	cut := &cutLoad{sp: sp, runs: map[bool][]parseRun{}}
	reuse := map[bool][]*Route{}
	decoded := 0
	// One placeholder serves every entry: the top level decodes it as a node, as it would the entry's
	// own. A reused entry's is read only for the line of a problem, and any problem sends the load to
	// a whole one; an entry to decode is parsed from its run instead (loadRoutes).
	placeholder := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	for li, list := range sp.lists {
		val := mappingValue(root, list.key)
		if val == nil || val.Kind != yaml.ScalarNode || val.ShortTag() != "!!null" {
			return nil, errNoCut
		}
		instance := list.key == "instances"
		*val = yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Line: list.chunks[0].line, Column: list.col + 1, Content: make([]*yaml.Node, len(list.chunks))}
		rs := make([]*Route, len(list.chunks))
		var runs []parseRun
		for i, ch := range list.chunks {
			val.Content[i] = placeholder
			if m != nil {
				if r := m.entries[ch.sum]; r != nil && r.Instance == instance && reusable(r) {
					rs[i] = r
					continue
				}
			}
			decoded++
			if n := len(runs); n > 0 && runs[n-1].end == i && i-runs[n-1].start < parseRunMax {
				runs[n-1].end++
			} else {
				runs = append(runs, parseRun{list: li, start: i, end: i + 1})
			}
		}
		reuse[instance], cut.runs[instance] = rs, runs
	}
	if m != nil { // without a memo, a load of every entry: nothing to reuse, no own addresses to match
		cut.reuse = &reuseSet{routes: reuse, hosts: &HostCache{}, own: m.own}
	}
	cfg, ents, own, err := loadDoc(&doc, rl.backings, cut)
	if err != nil {
		return nil, err // errNoCut, errOwnChanged, or problems: a whole load names them
	}
	if m != nil { // the reused entries are the memo's Routes already
		rl.memo, rl.decoded = newMemo(sp, ents, own, nil), decoded
		return cfg, nil
	}
	rl.memo, rl.decoded = newMemo(sp, ents, own, rl.memo), decoded
	cfg.Routes, cfg.Instances = routesOf(ents) // newMemo may have taken the last memo's Routes
	return cfg, nil
}

// cutLoad is what a load by the cut (loadSplit) gives loadDoc. The document's lists hold a placeholder
// for each entry: the entries to decode are in runs (by list, true for instances:, in file order) of
// sp's text, each parsed as it is decoded (loadRoutes); reuse is the Routes taken as they were (nil:
// none, every entry is in a run).
type cutLoad struct {
	sp    *entrySplit
	runs  map[bool][]parseRun
	reuse *reuseSet
}

// errNoCut ends a load by the cut that the cut cannot serve (see loadSplit): a whole load follows.
var errNoCut = errors.New("the file's cut does not serve this load")

// parseRun is entries start to end (exclusive) of sp.lists[list], to be parsed together.
type parseRun struct {
	list, start, end int
}

// parseRunMax bounds a run, so that the runs of a file whose every entry is new share out over the
// CPUs; a parse's own setup is small beside 512 entries.
const parseRunMax = 512

// parseEntries parses one run's text (its entries' lines, consecutive in the file) on its own and
// returns each entry's node, moved to the file's line numbers (the text is not padded with the lines
// before it: that made a reload that changes every entry quadratic in the file's length). The entries
// before the run that may define anchors (entrySplit.anchors) are parsed in front of it, so that its
// aliases mean what they mean in the whole file. It reports false when the run's text is not a list
// of exactly its entries, each starting on one of its own lines, or when those entries are too many
// or in a list of another column: the cut (splitEntries) was wrong there, or the text is one a whole
// load must judge.
func parseEntries(sp *entrySplit, run parseRun) ([]*yaml.Node, bool) {
	list := &sp.lists[run.list]
	chunks := list.chunks[run.start:run.end]
	text := sp.data[chunks[0].start:chunks[len(chunks)-1].end]
	before := sp.anchors[:chunks[0].anchorsBefore]
	lines := 0 // the lines of the anchors' entries in front of the run's
	if len(before) > 0 {
		if len(before) > maxAnchorEntries {
			return nil, false
		}
		var front []byte
		for _, a := range before {
			if sp.lists[a.list].col != list.col {
				return nil, false // one sequence cannot hold items at two columns
			}
			ch := sp.lists[a.list].chunks[a.chunk]
			front = append(front, sp.data[ch.start:ch.end]...)
			if front[len(front)-1] != '\n' {
				front = append(front, '\n')
			}
			if len(front) > maxAnchorBytes {
				return nil, false
			}
		}
		lines = bytes.Count(front, []byte{'\n'})
		text = append(front, text...)
	}
	var d yaml.Node
	if err := yaml.Unmarshal(text, &d); err != nil || len(d.Content) != 1 {
		return nil, false
	}
	seq := d.Content[0]
	if seq.Kind != yaml.SequenceNode || len(seq.Content) != len(before)+len(chunks) {
		return nil, false
	}
	items := seq.Content[len(before):]
	by := chunks[0].line - 1 - lines
	for i, item := range items {
		shiftLines(item, by)
		if ch := chunks[i]; item.Line < ch.line || item.Line >= ch.next || !ch.mayAnchor && definesAnchor(item) {
			// The last: an anchor mayAnchor missed, which the entries after it would not be parsed
			// behind, nor their sums hold. mayAnchor misses none, but a reuse it would make stale
			// must not rest on that.
			return nil, false
		}
	}
	return items, true
}

// definesAnchor reports whether the tree under n defines an anchor.
func definesAnchor(n *yaml.Node) bool {
	if n.Anchor != "" {
		return true
	}
	for _, c := range n.Content {
		if definesAnchor(c) {
			return true
		}
	}
	return false
}

// maxAnchorEntries and maxAnchorBytes bound the entries parsed in front of each run for their anchors
// (parseEntries): a file with more leaves the cut for a whole load, as every file with anchors did.
// A config that shares a few defaults through anchors in its first entries stays far below them.
const (
	maxAnchorEntries = 64
	maxAnchorBytes   = 64 << 10
)

// shiftLines adds by to the line of every node under n.
func shiftLines(n *yaml.Node, by int) {
	n.Line += by
	for _, c := range n.Content {
		shiftLines(c, by)
	}
}

// newMemo records a good load's entries by their text's hash: ents are the load's entries (all
// usable, each parsed from its own chunk's text), own the addresses they were checked against. An
// entry whose text prev has, and whose Route came out the Same again (a load after a change of the own
// addresses), takes prev's Route: that is the one the server keeps, and the memo must not hold a copy
// beside it.
func newMemo(sp *entrySplit, ents []entry, own []ownAddr, prev *memo) *memo {
	m := &memo{own: own, entries: make(map[sum]*Route, len(ents))}
	for i := range ents {
		e := &ents[i]
		key := "routes"
		if e.r.Instance {
			key = "instances"
		}
		list := sp.list(key)
		if list == nil || e.idx >= len(list.chunks) {
			return nil
		}
		s := list.chunks[e.idx].sum
		if prev != nil {
			if old := prev.entries[s]; old != nil && old.Same(e.r) {
				e.r = old
			}
		}
		m.entries[s] = e.r
	}
	return m
}

// reusable reports whether r's host checks can be run again without decoding it: its settings, and
// its fleet members', implement HostChecker or are nil.
func reusable(r *Route) bool {
	for _, s := range routeSettings(r) {
		if _, ok := s.(HostChecker); s != nil && !ok {
			return false
		}
	}
	return true
}

func routeSettings(r *Route) []any {
	out := []any{r.Settings}
	if r.Fleet != nil {
		for _, m := range r.Fleet.Members {
			out = append(out, m.Settings)
		}
	}
	return out
}

// errHostChanged stands for a problem found by an unchanged entry's host check. It is never reported:
// any problem sends the load to a whole one, which decodes the entry and names the problem.
var errHostChanged = errors.New("the host no longer passes this entry's checks")

// reuseSet is what a Reloader gives a load: by list (true for instances:), the Routes it takes as they
// were, at their index in the list (nil for an entry to decode); the load's answers about the host;
// and the own addresses those Routes were checked against (the load fails with errOwnChanged when
// the file's are others).
type reuseSet struct {
	routes map[bool][]*Route
	hosts  *HostCache
	own    []ownAddr
}

// errOwnChanged ends a load of changed entries whose own addresses are not the memo's: the reused
// Routes' upstreams were checked against those. The whole load that follows checks every route.
var errOwnChanged = errors.New("the activator's own addresses changed")

// reusedEntry is the entry of an unchanged route r at idx, n its placeholder node. r itself is the
// entry's Route, so that the server, which keeps a Route that is the Same, keeps this very one and no
// copy lives on beside it: nothing after the decode writes to a reused Route (checkRequires leaves its
// Requires, the same already). Its host checks run again; a failure is its one problem.
func reusedEntry(r *Route, n *yaml.Node, idx int, hosts *HostCache) (entry, []error) {
	e := entry{r: r, idx: idx, label: r.Name, ok: true, reused: true}
	for i, name := range r.Requires {
		e.reqs = append(e.reqs, reqAt{name: name, key: fmt.Sprintf("requires[%d]", i)})
	}
	e.withLines(n)
	if err := checkHostAgain(r, hosts); err != nil {
		e.ok = false
		return e, []error{&Error{Route: r.Name, Line: n.Line, Err: fmt.Errorf("%w: %w", errHostChanged, err)}}
	}
	return e, nil
}

// checkHostAgain runs again the checks of r's decode that consult the host: its waiting page's
// template, the time zones of its keep_warm windows and wake_at schedules (from the host's zoneinfo),
// and its settings' (HostChecker).
func checkHostAgain(r *Route, hosts *HostCache) error {
	if t := r.WaitingPage.Template; t != "" {
		if err := checkTemplateFile(t); err != nil {
			return fmt.Errorf("waiting_page.template: %w", err)
		}
	}
	var zones []*time.Location
	for _, w := range r.KeepWarm {
		zones = append(zones, w.Zone)
	}
	for _, s := range r.WakeAt {
		if sc, ok := s.spec.(*cron.SpecSchedule); ok {
			zones = append(zones, sc.Location)
		}
	}
	for _, z := range zones {
		if z == nil || z == time.Local {
			continue
		}
		if _, err := hosts.Do("zone\x00"+z.String(), func() (string, error) { _, err := zone(z.String()); return "", err }); err != nil {
			return err
		}
	}
	for _, s := range routeSettings(r) {
		if hc, ok := s.(HostChecker); ok {
			if err := hc.CheckHost(hosts); err != nil {
				return err
			}
		}
	}
	return nil
}

// hasAnchors reports whether the tree under n has an anchor or an alias.
func hasAnchors(n *yaml.Node) bool {
	if n.Anchor != "" || n.Kind == yaml.AliasNode {
		return true
	}
	for _, c := range n.Content {
		if hasAnchors(c) {
			return true
		}
	}
	return false
}

// mappingValue is the value of key in the mapping n, or nil.
func mappingValue(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// entrySplit is a config file cut at its entries by its lines, without parsing it (splitEntries).
type entrySplit struct {
	data []byte
	// header is data without the entries' lines: its nodes' lines are not the file's, which matters
	// only for a problem's line, and any problem sends the load to a whole one.
	header []byte
	lists  []entryList
	// anchors is the entries that may define an anchor (mayAnchor), in file order (noteAnchors).
	anchors []entryRef
}

// entryRef is one entry of an entrySplit: chunk of lists[list].
type entryRef struct{ list, chunk int }

// entryList is the entries of one top-level list: routes: or instances:.
type entryList struct {
	key    string
	col    int // the column of its items' dashes, 0-based
	chunks []chunk
}

// chunk is one entry: its lines in data, from the one with its dash to the last before the next item
// or the end of the list (comments and blank lines included).
type chunk struct {
	start, end int // byte offsets in data
	line, next int // its first line (1-based) and the line after its last
	// sum is of its text (the memo checks the list: Route.Instance) and, after an entry that may
	// define an anchor, of those entries' text too (noteAnchors).
	sum           sum
	anchorsBefore int  // how many of entrySplit.anchors come before it
	mayAnchor     bool // it is one of entrySplit.anchors
}

func (sp *entrySplit) list(key string) *entryList {
	for i := range sp.lists {
		if sp.lists[i].key == key {
			return &sp.lists[i]
		}
	}
	return nil
}

// splitEntries cuts data at the items of its top-level routes: and instances: lists, written in block
// style: a key at column 0 with nothing after it but a comment, and its items each starting with a
// dash at one column. An item runs to the next line, not blank and not a comment, at that column or
// left of it. The cut is by lines alone, so it is checked: the entries' text, parsed in runs of
// consecutive entries, must give exactly those entries, each starting on one of its own lines
// (parseRuns). An entry cut short (a flow collection or a quoted scalar that goes on at the list's
// column or left of it) does not parse, and a cut inside one gives more entries than the parse. A
// file with a line break other than LF and CRLF (otherBreaks), a directive or a
// second document is not cut (nil); a list in flow style, or indented otherwise, is left in the header.
func splitEntries(data []byte) *entrySplit {
	if otherBreaks(data) {
		return nil
	}
	sp := &entrySplit{data: data}
	var cur *entryList // the list being cut, or nil
	open := false      // an entry of cur is being cut: its last chunk
	closeChunk := func(end, next int) {
		if !open {
			return
		}
		ch := &cur.chunks[len(cur.chunks)-1]
		ch.end, ch.next = end, next
		full := sha256.Sum256(data[ch.start:ch.end])
		copy(ch.sum[:], full[:])
		open = false
	}
	line := 0
	for off, next := 0, 0; off < len(data); off = next {
		line++
		end := bytes.IndexByte(data[off:], '\n')
		if end < 0 {
			end, next = len(data), len(data)
		} else {
			end += off
			next = end + 1
		}
		rest := bytes.TrimLeft(data[off:end], " ")
		indent := end - off - len(rest)
		if t := bytes.TrimSpace(rest); len(t) == 0 || t[0] == '#' {
			continue // blank or a comment: part of whatever it is in
		}
		if indent == 0 && (rest[0] == '%' || (line > 1 && (bytes.HasPrefix(rest, []byte("---")) || bytes.HasPrefix(rest, []byte("..."))))) {
			return nil
		}
		item := rest[0] == '-' && (len(rest) == 1 || rest[1] == ' ' || rest[1] == '\r')
		if cur != nil {
			switch {
			case cur.col < 0 && item:
				cur.col = indent
			case cur.col < 0:
				cur = nil // not a block list: the header keeps it
			case indent > cur.col:
				continue // inside the open entry
			case indent == cur.col && item:
			case indent > 0:
				// Neither in an entry nor a top-level key: not YAML a whole parse accepts, but the
				// header alone might parse (" !" after the items read as the list's tag there), and a
				// cut load would accept a file Load rejects. Found by FuzzReloader.
				return nil
			default:
				closeChunk(off, line)
				cur = nil
			}
		}
		if cur != nil { // a new entry starts on this line
			closeChunk(off, line)
			cur.chunks = append(cur.chunks, chunk{start: off, line: line})
			open = true
			continue
		}
		for _, key := range []string{"routes", "instances"} {
			if indent == 0 && isListKey(rest, key) {
				if sp.list(key) != nil {
					return nil // twice: the parse reports it
				}
				sp.lists = append(sp.lists, entryList{key: key, col: -1})
				cur = &sp.lists[len(sp.lists)-1]
			}
		}
	}
	closeChunk(len(data), line+1)
	// The header: data without the entries' bytes (lists do not interleave, so this is in order).
	from := 0
	kept := sp.lists[:0]
	for _, list := range sp.lists {
		for _, ch := range list.chunks {
			sp.header = append(sp.header, data[from:ch.start]...)
			from = ch.end
		}
		if len(list.chunks) > 0 {
			kept = append(kept, list)
		}
	}
	sp.header = append(sp.header, data[from:]...)
	sp.lists = kept
	sp.noteAnchors()
	return sp
}

// noteAnchors lists the entries that may define an anchor (mayAnchor), and folds their text into the
// sum of every entry after them. An alias means what the anchors before it say, in whichever entry
// they are: a Route decoded with an alias is reused only while the entries that may define its anchor
// are unchanged too. A file without such an entry keeps each entry's sum of its own text.
func (sp *entrySplit) noteAnchors() {
	var ctx sum // of the anchors' entries so far
	for li := range sp.lists {
		for ci := range sp.lists[li].chunks {
			ch := &sp.lists[li].chunks[ci]
			own := ch.sum
			ch.anchorsBefore = len(sp.anchors)
			if len(sp.anchors) > 0 {
				ch.sum = mixSums(own, ctx)
			}
			if ch.mayAnchor = mayAnchor(sp.data[ch.start:ch.end]); ch.mayAnchor {
				sp.anchors = append(sp.anchors, entryRef{li, ci})
				ctx = mixSums(ctx, own)
			}
		}
	}
}

// mayAnchor reports whether text may define an anchor: it has a '&' where a node may start (after a
// space, a tab, a line's start, '[', '{', ',' or ':') with a name after it. That is every anchor, and a
// few things that are not (" &x" inside a quoted string or a comment), which cost only a parse in
// front of the runs after them; a '&' inside a word, as in a URL's query ("?a=1&b=2"), is not one.
func mayAnchor(text []byte) bool {
	for i := bytes.IndexByte(text, '&'); i >= 0; {
		if i+1 < len(text) && !bytes.ContainsRune([]byte(" \t\r\n"), rune(text[i+1])) &&
			(i == 0 || bytes.ContainsRune([]byte(" \t\n[{,:"), rune(text[i-1]))) {
			return true
		}
		j := bytes.IndexByte(text[i+1:], '&')
		if j < 0 {
			return false
		}
		i += j + 1
	}
	return false
}

// mixSums is the sum of a then b.
func mixSums(a, b sum) sum {
	full := sha256.Sum256(append(a[:], b[:]...))
	var s sum
	copy(s[:], full[:])
	return s
}

// otherBreaks reports whether data has a line break the cut does not see: yaml.v3 (after libyaml)
// also breaks lines at a CR alone and at NEL, LINE SEPARATOR and PARAGRAPH SEPARATOR, where the cut
// breaks only at LF (a CR before it is part of the line).
func otherBreaks(data []byte) bool {
	for rest := data; ; {
		i := bytes.IndexByte(rest, '\r')
		if i < 0 {
			break
		}
		if i+1 == len(rest) || rest[i+1] != '\n' {
			return true
		}
		rest = rest[i+2:]
	}
	return bytes.Contains(data, []byte("\u0085")) || bytes.Contains(data, []byte("\u2028")) || bytes.Contains(data, []byte("\u2029"))
}

// isListKey reports whether line (at column 0) is key followed by a colon and nothing but spaces or a
// comment.
func isListKey(line []byte, key string) bool {
	rest, ok := bytes.CutPrefix(line, []byte(key+":"))
	if !ok {
		return false
	}
	rest = bytes.TrimSpace(rest)
	return len(rest) == 0 || rest[0] == '#'
}
