package registry

import (
	"fmt"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

// WaitingPage is what a browser navigation to a sleeping route gets (waiting_page:). The page itself
// is internal/waitpage's; a template's contents are checked by the caller that can parse it
// (cmd/activator), since the registry knows config, not HTML.
type WaitingPage struct {
	// Off (waiting_page: false) holds browsers like every other client.
	Off bool
	// Template is a custom html/template file (waiting_page: {template: PATH}); "" is the built-in
	// page.
	Template string
}

// Ignore matches requests that must neither wake the route's tenant nor keep it awake (ignore:):
// uptime monitors, crawlers, health checkers. A request is ignored when it matches any one of the
// lists. A matched request to a sleeping tenant gets Status (with Retry-After when it is 503); one to
// an awake tenant is served, without resetting the idle clock.
type Ignore struct {
	Methods    []string         // upper case
	Paths      []string         // path.Match patterns over the whole path; a trailing "/**" matches any depth
	UserAgents []*regexp.Regexp // matched anywhere in the User-Agent header, case-insensitively
	// Preset names a built-in list of User-Agent patterns the edge adds ("monitors": well-known uptime
	// monitors and crawlers); "" for none.
	Preset string
	Status int // the status a matched request to a sleeping tenant gets; default 503
}

// Active reports whether any request can match.
func (ig Ignore) Active() bool {
	return len(ig.Methods)+len(ig.Paths)+len(ig.UserAgents) > 0 || ig.Preset != ""
}

// IgnorePresets are the preset names ignore.preset accepts; the lists themselves are the edge's.
var IgnorePresets = []string{"monitors"}

type ignoreKeys struct {
	Methods    []string `yaml:"methods"`
	Paths      []string `yaml:"paths"`
	UserAgents []string `yaml:"user_agents"`
	Preset     string   `yaml:"preset"`
	Status     int      `yaml:"status"`
}

// checkPeople checks waiting_page and ignore.
func (c *routeCheck) checkPeople() {
	c.checkWaitingPage()
	c.checkIgnore()
}

func (c *routeCheck) checkWaitingPage() {
	n := &c.rk.WaitingPage // not a copy: one that escapes (DecodeStrict) costs every route an allocation
	if n.Kind == 0 {
		return
	}
	line := c.at("waiting_page")
	switch n.Kind {
	case yaml.ScalarNode:
		var on bool
		if err := n.Decode(&on); err != nil {
			c.add("waiting_page", line, "%q: want true, false or a mapping with template:", n.Value)
			return
		}
		c.r.WaitingPage.Off = !on
	case yaml.MappingNode:
		var k struct {
			Template string `yaml:"template"`
		}
		if err := DecodeStrict(n, &k); err != nil {
			c.l.addErr(c.label, "waiting_page", line, err)
			return
		}
		if k.Template == "" {
			c.add("waiting_page.template", line, "missing: the path of an html/template file (or write waiting_page: true)")
			return
		}
		if err := checkTemplateFile(k.Template); err != nil {
			c.add("waiting_page.template", line, "%v", err)
		}
		c.r.WaitingPage.Template = k.Template
	default:
		c.add("waiting_page", line, "want true, false or a mapping with template:")
	}
}

// checkTemplateFile reports why path cannot be a waiting page's template file: at a decode, and again
// at a reload that keeps the route (checkHostAgain).
func checkTemplateFile(path string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("%q is not an absolute path", path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	return nil
}

var methodRE = regexp.MustCompile(`^[A-Z]+$`)

func (c *routeCheck) checkIgnore() {
	k := c.rk.Ignore
	ig := &c.r.Ignore
	for i, m := range k.Methods {
		key := fmt.Sprintf("ignore.methods[%d]", i)
		m = strings.ToUpper(m)
		if !methodRE.MatchString(m) {
			c.add(key, c.at(key), "%q is not an HTTP method", k.Methods[i])
			continue
		}
		ig.Methods = append(ig.Methods, m)
	}
	for i, p := range k.Paths {
		key := fmt.Sprintf("ignore.paths[%d]", i)
		if !strings.HasPrefix(p, "/") {
			c.add(key, c.at(key), "%q must start with /", p)
			continue
		}
		if _, err := path.Match(strings.TrimSuffix(p, "/**"), ""); err != nil {
			c.add(key, c.at(key), "%q: %v (patterns are path.Match globs: *, ?, [a-z]; a trailing /** matches any depth)", p, err)
			continue
		}
		ig.Paths = append(ig.Paths, p)
	}
	for i, u := range k.UserAgents {
		key := fmt.Sprintf("ignore.user_agents[%d]", i)
		if u == "" {
			c.add(key, c.at(key), "empty pattern: it would match every request")
			continue
		}
		re, err := regexp.Compile("(?i)" + u)
		if err != nil {
			c.add(key, c.at(key), "%q is not a regular expression: %v", u, err)
			continue
		}
		ig.UserAgents = append(ig.UserAgents, re)
	}
	if k.Preset != "" {
		ok := false
		for _, p := range IgnorePresets {
			ok = ok || p == k.Preset
		}
		if !ok {
			c.add("ignore.preset", c.at("ignore.preset"), "%q is not a preset (one of: %s)", k.Preset, strings.Join(IgnorePresets, ", "))
		}
		ig.Preset = k.Preset
	}
	ig.Status = http.StatusServiceUnavailable
	if k.Status != 0 {
		if k.Status < 200 || k.Status > 599 {
			c.add("ignore.status", c.at("ignore.status"), "%d is not a final HTTP status (200-599)", k.Status)
		}
		ig.Status = k.Status
	}
}
