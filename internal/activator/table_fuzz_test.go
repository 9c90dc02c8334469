package activator

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/activator/activator/internal/registry"
)

// FuzzLookup checks the routing table against refLookup, a plain reading of lookup's rules, over
// tables built from up to 8 routes. routes has one route a line, "host[,host…] [path_prefix]"; hosts
// the registry would refuse are left out, and so is a host already routed under the same prefix, as
// the registry refuses that too. Besides host and path as given, it looks up every route's host (a
// wildcard's with a label for "*"), alone and below host, and every path below every route's prefix, so
// that each input has lookups that hit the table.
func FuzzLookup(f *testing.F) {
	f.Fuzz(func(t *testing.T, routes, host, path string) {
		if len(routes) > 256 || len(host) > 128 || len(path) > 128 {
			t.Skip("longer than any input this needs, and slow to minimize")
		}
		refs, cfg := fuzzTable(routes)
		if len(refs) == 0 {
			t.Skip("no valid route")
		}
		instances := map[string]*instance{}
		for _, r := range cfg.Routes {
			instances[r.Name] = &instance{route: r}
		}
		tb := buildTable(cfg, instances)

		hosts := []string{host}
		paths := []string{path}
		for _, r := range refs {
			for _, h := range r.hosts {
				c := strings.Replace(h, "*", "w", 1)
				hosts = append(hosts, c, host+"."+c)
			}
			paths = append(paths, r.prefix+path)
		}
		slices.Sort(hosts)
		slices.Sort(paths)
		for _, h := range slices.Compact(hosts) {
			ref := refHost(h)
			for _, p := range slices.Compact(paths) {
				got := ""
				if rt := tb.lookup(h, p); rt != nil {
					got = rt.in.route.Name
				}
				if want := refLookup(refs, ref, p); got != want {
					t.Fatalf("lookup(%q, %q) = %q, want %q; routes:\n%s", h, p, got, want, routes)
				}
			}
		}
	})
}

// refRoute is one route as refLookup reads it.
type refRoute struct {
	name   string
	hosts  []string
	prefix string
}

// hostRE is the registry's rule for a route's host: DNS labels, lower case, the first one maybe "*".
var hostRE = regexp.MustCompile(`^(\*\.)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)

// fuzzTable reads FuzzLookup's routes into the routes for refLookup and the config for buildTable.
func fuzzTable(spec string) ([]refRoute, *registry.Config) {
	var refs []refRoute
	cfg := &registry.Config{}
	routed := map[string]bool{} // host + prefix
	for i, line := range strings.Split(spec, "\n") {
		if len(refs) == 8 {
			break
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		r := refRoute{name: fmt.Sprintf("r%d", i)}
		if len(fields) > 1 && strings.HasPrefix(fields[1], "/") {
			r.prefix = strings.TrimSuffix(fields[1], "/") // as the registry stores it
		}
		for _, h := range strings.Split(fields[0], ",") {
			if len(r.hosts) == 4 || !hostRE.MatchString(h) || routed[h+" "+r.prefix] {
				continue
			}
			routed[h+" "+r.prefix] = true
			r.hosts = append(r.hosts, h)
		}
		if len(r.hosts) == 0 {
			continue
		}
		refs = append(refs, r)
		rt := testRoute(r.name)
		rt.Hosts, rt.PathPrefix = r.hosts, r.prefix
		cfg.Routes = append(cfg.Routes, rt)
	}
	return refs, cfg
}

// refHost is a Host header as refLookup compares it: without its port (whatever follows the last
// colon, unless a "]" follows that colon: an IPv6 literal's own colons) and one trailing dot, in ASCII
// lower case.
func refHost(h string) string {
	if i := strings.LastIndex(h, ":"); i >= 0 && !strings.Contains(h[i:], "]") {
		h = h[:i]
	}
	return refLower(strings.TrimSuffix(h, "."))
}

// refLookup is the routing rule read plainly: of the routes with a host that matches and a prefix that
// matches, the one whose host is most specific (exact, then the wildcard with the longest suffix), then
// whose prefix is longest. A host (from refHost) matches when equal; "*.x" matches any name ending in
// ".x". A prefix matches the path equal to it or continuing with "/".
func refLookup(routes []refRoute, host, path string) string {
	best, bestHost, bestPrefix := "", -1, -1
	for _, r := range routes {
		if r.prefix != "" && path != r.prefix && !strings.HasPrefix(path, r.prefix+"/") {
			continue
		}
		for _, h := range r.hosts {
			rank := -1
			switch {
			case h == host:
				rank = math.MaxInt
			case strings.HasPrefix(h, "*.") && strings.HasSuffix(host, h[1:]):
				rank = len(h)
			}
			if rank > bestHost || rank == bestHost && rank >= 0 && len(r.prefix) > bestPrefix {
				best, bestHost, bestPrefix = r.name, rank, len(r.prefix)
			}
		}
	}
	return best
}

func refLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
