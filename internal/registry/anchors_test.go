package registry

import "testing"

// TestMayAnchor: every anchor counts, and a '&' inside a word does not, so that a config whose
// entries carry URLs with queries is still cut into runs without them parsed in front.
func TestMayAnchor(t *testing.T) {
	for text, want := range map[string]bool{
		"  - name: a\n    health: &h {path: /}\n":        true,
		"  - &r\n    name: a\n":                          true,
		"  - name: a\n    hosts: [&x a.test]\n":          true,
		"  - name: a\n    exec: {env: {A: &v x}}\n":      true,
		"  - name: a\n    exec: !!map &e {argv: [/a]}\n": true,
		"&top\n":                                        true,
		"  - {name: a,&n x: 1}\n":                       true,
		"  - name: a\n    x: \"Tom &Jerry\"\n":          true, // not an anchor, but it costs a parse only
		"  - name: a\n    env: {DSN: \"db?a=1&b=2\"}\n": false,
		"  - name: a\n    path_prefix: /a&b\n":          false,
		"  - name: a\n    note: a & b\n":                false,
		"  - name: a\n    note: a &\n":                  false,
		"  - name: a\n    health: *h\n":                 false,
		"&":                                             false,
	} {
		if got := mayAnchor([]byte(text)); got != want {
			t.Errorf("mayAnchor(%q) = %v, want %v", text, got, want)
		}
	}
}
