package main

import (
	"os"
	"slices"
	"testing"

	"github.com/activator/activator/internal/backend/exec"
	"github.com/activator/activator/internal/registry"
)

// The chain experiment's config must pass the activator's own validation: two instances and a route,
// each requiring the one before it.
func TestChainConfigValidates(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := renderChainConfig(18080, 19090, chainSpecs([]int{20001, 20002, 20003}, []string{self, "app"}))
	c, err := registry.Load([]byte(cfg), map[string]registry.SettingsDecoder{"exec": exec.Decode})
	if err != nil {
		t.Fatalf("generated config rejected: %v\n%s", err, cfg)
	}
	if len(c.Instances) != 2 || len(c.Routes) != 1 {
		t.Fatalf("got %d instances and %d routes, want 2 and 1\n%s", len(c.Instances), len(c.Routes), cfg)
	}
	for _, tc := range []struct {
		r        *registry.Route
		name     string
		requires []string
	}{
		{c.Instances[0], "a", nil},
		{c.Instances[1], "b", []string{"a"}},
		{c.Routes[0], "c", []string{"b"}},
	} {
		if tc.r.Name != tc.name || !slices.Equal(tc.r.Requires, tc.requires) {
			t.Errorf("got %s requiring %q, want %s requiring %q", tc.r.Name, tc.r.Requires, tc.name, tc.requires)
		}
	}
}
