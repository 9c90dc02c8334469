package activator

// Requests that must neither wake a tenant nor keep it awake (a route's ignore:): uptime monitors,
// crawlers, link previews, health checkers. See docs/filters.md.

import (
	"fmt"
	"net/http"
	"path"
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/activator/activator/internal/registry"
)

// ignoredRetryAfter is the Retry-After of the 503 an ignored request to a sleeping route gets: long
// enough that a crawler that honours it (Googlebot does) comes back later, not in a loop.
const ignoredRetryAfter = time.Minute

// IgnoredError answers a request that the route's ignore: matches while its tenant is not awake (or is
// about to sleep): it gets Status, and nothing is woken or held.
type IgnoredError struct {
	Route  string
	Status int // the route's ignore.status
}

func (e *IgnoredError) Error() string {
	return fmt.Sprintf("route %q is asleep, and its ignore: matches this request: such requests do not wake it", e.Route)
}

// The actions of activator_filtered_requests_total.
const (
	filterRefused = iota // the tenant was not awake: answered ignore.status, nothing woken
	filterServed         // the tenant was awake: served, the idle clock untouched
	numFilterActions
)

func filterActions() [numFilterActions]string { return [...]string{"refused", "served"} }

// filter is one instance's ignore: matcher, built once from the route's config; a route without
// ignore: has none (nil), and its requests pay one nil check.
type filter struct {
	methods []string
	paths   []pathPattern
	agents  []*regexp.Regexp // the ignore.user_agents that are not plain words (see literalFold)
	words   []string         // those that are, lower-cased: compared without the regexp engine
	preset  *agentSet        // nil without a preset
	status  int

	counts [numFilterActions]atomic.Uint64      // since the instance started, for its status
	series [numFilterActions]prometheus.Counter // nil when nothing records
}

// newFilter builds ig's matcher, and its metric series in im; nil when ig matches nothing.
func newFilter(ig *registry.Ignore, im *instanceMetrics) *filter {
	if !ig.Active() {
		return nil
	}
	f := &filter{methods: ig.Methods, status: ig.Status}
	for _, re := range ig.UserAgents {
		if words, ok := literalFold(re); ok {
			f.words = append(f.words, words...)
		} else {
			f.agents = append(f.agents, re)
		}
	}
	for _, p := range ig.Paths {
		f.paths = append(f.paths, newPathPattern(p))
	}
	if ig.Preset == "monitors" {
		f.preset = monitorsPreset
	}
	f.series = im.filterSeries()
	return f
}

// ignores reports whether r matches any of the lists: its method, its path, its User-Agent.
func (f *filter) ignores(r *http.Request) bool {
	if slices.Contains(f.methods, r.Method) {
		return true
	}
	for i := range f.paths {
		if f.paths[i].match(r.URL.Path) {
			return true
		}
	}
	// Every User-Agent field: a client that sends two is a bot if either says so (the tenant may read
	// either; net/http's Get reads the first).
	for _, ua := range r.Header["User-Agent"] {
		if ua != "" && f.agentIgnored(ua) {
			return true
		}
	}
	return false
}

// agentIgnored reports whether one User-Agent value matches the preset, a word or a pattern.
func (f *filter) agentIgnored(ua string) bool {
	if f.preset != nil && f.preset.match(ua) {
		return true
	}
	for _, w := range f.words {
		if containsFold(ua, w) {
			return true
		}
	}
	for _, re := range f.agents {
		if re.MatchString(ua) {
			return true
		}
	}
	return false
}

func (f *filter) note(action int) {
	f.counts[action].Add(1)
	if c := f.series[action]; c != nil {
		c.Inc()
	}
}

// FilterCounts are the requests a route's ignore: matched since the route (its current config)
// started: refused while the tenant was not awake, served while it was (without resetting its idle
// clock).
type FilterCounts struct {
	Refused uint64 `json:"refused"`
	Served  uint64 `json:"served"`
}

// snapshot is f's counts for the status; nil for a route without ignore:.
func (f *filter) snapshot() *FilterCounts {
	if f == nil {
		return nil
	}
	return &FilterCounts{Refused: f.counts[filterRefused].Load(), Served: f.counts[filterServed].Load()}
}

// pathPattern is one of ignore.paths: a path.Match glob over the whole path, or with a trailing "/**",
// a glob over a directory that also matches everything below it.
type pathPattern struct {
	glob    string
	deep    bool // glob is the directory of a "/**" pattern
	slashes int  // deep: the slashes in glob, that is the segments of the request path it matches
	literal bool // glob has no metacharacters: compared as a string
}

func newPathPattern(p string) pathPattern {
	pp := pathPattern{glob: p}
	if dir, ok := strings.CutSuffix(p, "/**"); ok {
		pp = pathPattern{glob: dir, deep: true, slashes: strings.Count(dir, "/")}
	}
	pp.literal = !strings.ContainsAny(pp.glob, `*?[\`)
	return pp
}

func (p *pathPattern) match(reqPath string) bool {
	if p.deep {
		// The request path's first p.slashes segments: up to its (p.slashes+1)-th slash, or all of it.
		end, n := len(reqPath), 0
		for i := 0; i < len(reqPath); i++ {
			if reqPath[i] == '/' {
				if n == p.slashes {
					end = i
					break
				}
				n++
			}
		}
		if n < p.slashes {
			return false // fewer segments than the directory has
		}
		reqPath = reqPath[:end]
	}
	if p.literal {
		return reqPath == p.glob
	}
	ok, _ := path.Match(p.glob, reqPath) // the registry has checked the pattern
	return ok
}

// ignores reports whether the route's ignore: matches r: such a request gets no waiting page either,
// since that page wakes the route.
func (in *instance) ignores(r *http.Request) bool { return in.filter != nil && in.filter.ignores(r) }

// acquireRequest is acquireFor for an edge request: one that the route's ignore: matches goes to
// acquireIgnored instead, which never holds, wakes or touches the hold's caps.
func (in *instance) acquireRequest(r *http.Request, c *holdCharge) (release func(), err error) {
	if in.ignores(r) {
		return in.acquireIgnored()
	}
	return in.acquireFor(r.Context(), triggerRequest, c)
}

// acquireIgnored lets an ignored request through to an awake tenant, counted in unseen rather than in
// flight: it neither stops nor restarts the idle clock. Otherwise (asleep, waking, stopping, failed,
// closed, or awake with its sleep due and waiting for ignored requests to end) it returns an
// *IgnoredError at once, or errRetired when a reload has replaced the instance and its tenant is not
// awake: the route's current instance decides then.
func (in *instance) acquireIgnored() (release func(), err error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.retiring && (in.state != Awake || in.closed) {
		return nil, errRetired // replaced by a reload: the route's current instance answers it (acquireRouted)
	}
	if in.state != Awake || in.closed || in.sleepDueLocked() {
		in.filter.note(filterRefused)
		return nil, &IgnoredError{Route: in.route.Name, Status: in.filter.status}
	}
	in.unseen++
	in.filter.note(filterServed)
	return in.releaseIgnoredFn, nil
}

// releaseIgnored ends an ignored request. The last one starts the sleep that came due while they
// were in flight (see postponeIdleLocked); it never arms the idle clock.
func (in *instance) releaseIgnored() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.unseen--
	if in.unseen == 0 && in.inflight == 0 && in.held == 0 && in.state == Awake && !in.closed && in.sleepDueLocked() {
		in.beginSleepLocked(ReasonIdle)
	}
	in.maybeRetireLocked()
}

// postponeIdleLocked is called by the idle timer of generation gen once the window has passed with
// nothing counted in flight. With ignored requests still in flight it marks the sleep due and reports
// true: the sleep waits for them, so a monitor's answer is never cut, and the last of them starts it.
// Meanwhile new ignored requests are refused, so a steady stream of them cannot postpone it for ever,
// and a counted request makes it stale (it moves idleGen on). The wait is bounded by the instance's
// grace (a reload's: shutdown_grace, at most half of hold.max_time): the idle timer is armed again
// for it, and when it fires with the sleep still due, the sleep goes ahead under them. Without the
// bound, one ignored request that stays open (a monitor's WebSocket or event stream, a long poll on
// an ignored path) kept the tenant awake for ever.
func (in *instance) postponeIdleLocked(gen uint64) bool {
	if in.unseen == 0 || in.grace <= 0 || in.sleepDueLocked() {
		return false
	}
	in.idleDue = gen
	in.idle.Reset(in.grace)
	in.idleArmed = true
	return true
}

// sleepDueLocked reports whether the idle window has passed and the sleep waits for ignored requests.
func (in *instance) sleepDueLocked() bool { return in.idleDue != 0 && in.idleDue == in.idleGen }

// filterSeries makes the route's activator_filtered_requests_total series, at 0, and returns them by
// action; none for a nil im.
func (im *instanceMetrics) filterSeries() (out [numFilterActions]prometheus.Counter) {
	if im == nil {
		return out
	}
	rm := im.rm
	rm.lazily(func() {
		for i, a := range filterActions() {
			out[i] = rm.m.filtered.WithLabelValues(rm.route, a)
		}
	})
	return out
}

// newFilteredVec is activator_filtered_requests_total.
func newFilteredVec() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "activator_filtered_requests_total",
		Help: "Requests a route's ignore: matched: refused (the tenant was not awake, nothing woken) or served (awake; the idle clock untouched).",
	}, []string{"route", "action"})
}

// agentSet matches a User-Agent against a list of case-insensitive substrings without allocating: a
// bitmap of every pattern's first two bytes rules out nearly every position of a browser's User-Agent
// with one lookup, and only the positions it lets through are compared.
type agentSet struct {
	pairs   [1 << 16 / 64]uint64 // bit k: some pattern begins with the two lower-cased bytes k
	byPair  map[uint16][]string  // the patterns, lower-cased, by their first two bytes
	minSize int
}

func newAgentSet(patterns []string) *agentSet {
	s := &agentSet{byPair: map[uint16][]string{}, minSize: len(patterns[0])}
	for _, p := range patterns {
		p = strings.ToLower(p)
		k := pairKey(p[0], p[1])
		s.pairs[k/64] |= 1 << (k % 64)
		s.byPair[k] = append(s.byPair[k], p)
		s.minSize = min(s.minSize, len(p))
	}
	return s
}

func lowerASCII(c byte) byte { return lowerTable[c] }

// lowerTable lower-cases ASCII letters by lookup, which the per-byte loop of match needs to be cheap.
var lowerTable = func() (t [256]byte) {
	for i := range t {
		t[i] = byte(i)
		if 'A' <= i && i <= 'Z' {
			t[i] = byte(i + 'a' - 'A')
		}
	}
	return t
}()

func pairKey(a, b byte) uint16 { return uint16(lowerTable[a])<<8 | uint16(lowerTable[b]) }

func (s *agentSet) match(ua string) bool {
	if len(ua) < s.minSize {
		return false
	}
	k := uint16(lowerTable[ua[0]])
	for i := 1; i <= len(ua)-s.minSize+1; i++ {
		k = k<<8 | uint16(lowerTable[ua[i]])
		if s.pairs[k/64]&(1<<(k%64)) == 0 {
			continue
		}
		for _, p := range s.byPair[k] {
			if len(ua)-i+1 >= len(p) && hasPrefixFold(ua[i-1:], p) {
				return true
			}
		}
	}
	return false
}

// literalFold returns the words of a case-insensitive pattern that is only ASCII words, or an
// alternation of them ("(?i)my-checker/" or "(?i)foo|bar"), lower-cased: the regexp engine takes a few
// microseconds per User-Agent over a case-insensitive literal, a plain comparison a tenth of that.
func literalFold(re *regexp.Regexp) (words []string, ok bool) {
	t, err := syntax.Parse(re.String(), syntax.Perl)
	if err != nil {
		return nil, false
	}
	word := func(t *syntax.Regexp) bool {
		if t.Op != syntax.OpLiteral || t.Flags&syntax.FoldCase == 0 || len(t.Rune) < 2 {
			return false
		}
		w := make([]byte, 0, len(t.Rune))
		for _, r := range t.Rune {
			if r >= utf8.RuneSelf {
				return false // non-ASCII folding is the regexp engine's
			}
			w = append(w, lowerTable[r])
		}
		words = append(words, string(w))
		return true
	}
	switch t.Op {
	case syntax.OpLiteral:
		return words, word(t)
	case syntax.OpAlternate:
		for _, sub := range t.Sub {
			if !word(sub) {
				return nil, false
			}
		}
		return words, true
	}
	return nil, false
}

// containsFold reports whether s contains the lower-case ASCII word w (len(w) >= 2), ignoring ASCII
// case.
func containsFold(s, w string) bool {
	a, b := w[0], w[1]
	for i := 0; i+len(w) <= len(s); i++ {
		if lowerTable[s[i]] == a && lowerTable[s[i+1]] == b && hasPrefixFold(s[i:], w) {
			return true
		}
	}
	return false
}

// hasPrefixFold reports whether s begins with the lower-case ASCII lower, ignoring ASCII case.
func hasPrefixFold(s, lower string) bool {
	for j := 0; j < len(lower); j++ {
		if lowerASCII(s[j]) != lower[j] {
			return false
		}
	}
	return true
}

// monitorAgents is the monitors preset (ignore: {preset: monitors}): substrings, matched
// case-insensitively anywhere in the User-Agent. Each names one client precisely enough that no
// browser, in-app browser or person's tool carries it (filter_test.go checks real ones); none is a
// bare word like "bot" or "monitor". docs/filters.md lists it, in this order (a test compares them).
var monitorAgents = [...]string{
	// Uptime monitors and synthetic checks.
	"UptimeRobot",
	"Pingdom",
	"StatusCake",
	"Better Uptime Bot", // Better Stack's checks say "Better Stack Better Uptime Bot"
	"Site24x7",
	"Freshping",
	"Uptime-Kuma",
	"Datadog/Synthetics",
	"NewRelicSynthetics",
	"NewRelicPinger",
	"Checkly",
	"HetrixTools",
	"updown.io",
	"Amazon-Route53-Health-Check-Service",
	"ELB-HealthChecker",
	"GoogleHC/",
	"kube-probe/",
	// Search and AI crawlers.
	"Googlebot",
	"AdsBot-Google",
	"Google-InspectionTool",
	"bingbot",
	"DuckDuckBot",
	"Baiduspider",
	"YandexBot",
	"Applebot",
	"AhrefsBot",
	"SemrushBot",
	"MJ12bot",
	"PetalBot",
	"Amazonbot",
	"Bytespider",
	"GPTBot",
	"ClaudeBot",
	"CCBot/",
	"PerplexityBot",
	// Link previews.
	"facebookexternalhit",
	"Twitterbot",
	"Slackbot",
	"Discordbot",
	"LinkedInBot",
	"TelegramBot",
	"WhatsApp/",
}

// monitorsPreset is monitorAgents compiled once: it is read-only, and shared by every route that
// names the preset.
var monitorsPreset = newAgentSet(monitorAgents[:])
