package registry

// Fleets (fleet:): several members of one backing behind one route or instance, each with its own
// upstream and its own settings laid over the route's.

import (
	"fmt"
	"maps"
	"reflect"
	"slices"

	"go.yaml.in/yaml/v3"
)

// fleetKeys is the fleet: block. Members stay nodes: beside name and upstream, a member may have a
// block under the route's backing name, which only the backing's decoder knows.
type fleetKeys struct {
	Members  []yaml.Node `yaml:"members"`
	MinReady *int        `yaml:"min_ready"`
	Serial   bool        `yaml:"serial"`
}

// memberKeys are a member's common keys.
type memberKeys struct {
	Name     string `yaml:"name"`
	Upstream string `yaml:"upstream"`
}

// memberAt is one member under validation: its key ("fleet.members[1]") and its backing blocks, which
// checkBacking checks and decodes once the route's backing is known to be valid.
type memberAt struct {
	key    string
	blocks map[string]block
}

// checkFleet checks the fleet block: at least one member, each named and with an upstream of its own,
// and min_ready within the members. It sets Route.Fleet (members without settings yet) and
// Route.Upstream to the first member's.
func (c *routeCheck) checkFleet(backings map[string]SettingsDecoder) {
	fk := c.rk.Fleet
	if fk == nil {
		return
	}
	f := &Fleet{Serial: fk.Serial}
	if len(fk.Members) == 0 && !c.failedBelow("fleet.members") {
		c.add("fleet.members", c.at("fleet.members"), "missing: a fleet needs at least one member")
	}
	names := map[string]string{}
	ups := map[Upstream]string{}
	for i := range fk.Members {
		f.Members = append(f.Members, c.checkMember(i, &fk.Members[i], backings, names, ups))
	}
	n := len(fk.Members)
	f.MinReady = valueOr(fk.MinReady, n)
	if (f.MinReady < 1 || f.MinReady > n) && n > 0 && !c.failed("fleet.min_ready") && !c.failedBelow("fleet.members") {
		c.add("fleet.min_ready", c.at("fleet.min_ready"), "must be between 1 and %d (the number of members), got %d", n, f.MinReady)
	}
	if n > 0 {
		c.r.Upstream = f.Members[0].Upstream
	}
	c.r.Fleet = f
}

// checkMember checks fleet.members[i] and records it in c.members. names and ups map the names and
// upstreams of the members before it to their keys.
func (c *routeCheck) checkMember(i int, n *yaml.Node, backings map[string]SettingsDecoder, names map[string]string, ups map[Upstream]string) Member {
	key := fmt.Sprintf("fleet.members[%d]", i)
	if n.Kind != yaml.MappingNode {
		c.add(key, n.Line, "want a mapping with name and upstream, got %s", describe(n))
		c.members = append(c.members, memberAt{key: key})
		return Member{}
	}
	common, blocks := splitByBacking(n, c.rk.Backing, reflect.TypeFor[memberKeys](), backings)
	c.members = append(c.members, memberAt{key: key, blocks: blocks})
	var mk memberKeys
	start := len(c.l.list)
	if err := DecodeStrict(common, &mk); err != nil {
		c.l.addErr(c.label, key, n.Line, err)
	}
	bad := errorKeys(c.l.list[start:])
	nk, uk := key+".name", key+".upstream"
	switch name := mk.Name; {
	case bad[nk]:
	case name == "":
		c.add(nk, c.at(nk), "missing: the member's name")
	case !nameRE.MatchString(name):
		c.add(nk, c.at(nk), "%q is not a valid member name (lower-case letters, digits, '-' and '_', at most 63)", name)
	case names[name] != "":
		c.add(nk, c.at(nk), "duplicate member name (also %s)", names[name])
	default:
		names[name] = key
	}
	m := Member{Name: mk.Name}
	if bad[uk] {
		return m
	}
	u, err := ParseUpstream(mk.Upstream)
	switch {
	case mk.Upstream == "":
		c.add(uk, c.at(uk), "missing: where does this member listen? (host:port or unix:/path)")
	case err != nil:
		c.add(uk, c.at(uk), "%v", err)
	case ups[u] != "":
		c.add(uk, c.at(uk), "upstream %s is also that of %s: each member needs its own", u, ups[u])
	default:
		ups[u] = key
		m.Upstream = u
		c.checkNotOwn(uk, u)
	}
	return m
}

// checkMemberBlocks reports a member's block for a backing other than the route's.
func (c *routeCheck) checkMemberBlocks(backing string) {
	for _, ma := range c.members {
		for _, k := range slices.Sorted(maps.Keys(ma.blocks)) {
			if k != backing {
				c.add(ma.key+"."+k, ma.blocks[k].line, "settings for backing %q, but the route's backing is %q", k, backing)
			}
		}
	}
}

// decodeMembers has the backing's decoder check each member's settings: the route's block (own) with
// the member's block laid over it key by key, decoded for the member's Route (its name and upstream).
// Problems are keyed below the member ("fleet.members[1].exec.argv"). The route's Settings are the
// first member's.
func (c *routeCheck) decodeMembers(dec SettingsDecoder, backing string, own block) {
	f := c.r.Fleet
	for i, ma := range c.members {
		mb, has := ma.blocks[backing]
		line := KeyLine(c.n, ma.key)
		switch {
		case has:
			line = mb.line
		case own.node != nil:
			line = own.line
		}
		m := f.Members[i]
		m.Settings = nil
		settings, err := dec(c.r.MemberRoute(m), mergeBlocks(own.node, mb.node))
		if err != nil {
			c.l.addErr(c.label, ma.key+"."+backing, line, err)
			continue
		}
		f.Members[i].Settings = settings
	}
	c.r.Settings = f.Members[0].Settings
}

// mergeBlocks lays the mapping over onto the mapping base, top-level key by key: a key of over replaces
// base's (its whole value), base's other keys are kept, and over's new ones follow. Each node
// keeps its line, so a problem in an inherited key points at the route's block. A nil or null over is
// base; a base that is not a mapping, or an over that is not one, yields over, for the decoder to
// report.
func mergeBlocks(base, over *yaml.Node) *yaml.Node {
	base, over = resolve(base), resolve(over)
	switch {
	case over == nil || over.Kind == yaml.ScalarNode && over.ShortTag() == "!!null":
		return base
	case base == nil || base.Kind != yaml.MappingNode || over.Kind != yaml.MappingNode:
		return over
	}
	overs := map[string]int{} // key → index of its key node in over.Content
	for i := 0; i+1 < len(over.Content); i += 2 {
		overs[over.Content[i].Value] = i
	}
	out := *over
	out.Content = nil
	used := map[int]bool{}
	for i := 0; i+1 < len(base.Content); i += 2 {
		if j, ok := overs[base.Content[i].Value]; ok {
			out.Content = append(out.Content, over.Content[j], over.Content[j+1])
			used[j] = true
			continue
		}
		out.Content = append(out.Content, base.Content[i], base.Content[i+1])
	}
	for i := 0; i+1 < len(over.Content); i += 2 {
		if !used[i] {
			out.Content = append(out.Content, over.Content[i], over.Content[i+1])
		}
	}
	return &out
}

// resolve returns the node an alias stands for, or n itself.
func resolve(n *yaml.Node) *yaml.Node {
	if n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		return n.Alias
	}
	return n
}
