package redfish

import (
	"errors"
	"strings"
	"testing"

	"github.com/activator/activator/internal/backend/redfish/redfishtest"
)

// TestSystemListNamesSystems: the error that lists a BMC's systems gives each one's Name beside its Id
// (Ids are often bare numbers, Names what the operator recognises), and the Id alone when the Name is
// the Id.
func TestSystemListNamesSystems(t *testing.T) {
	systems := []redfishtest.System{{ID: "1", Name: "WebFrontEnd483"}, {ID: "2", Name: "Blade2"}, {ID: "node-3"}}
	tests := []struct {
		name, yaml, want string
	}{
		{"not found", "system: node-9\n", `no system with Id or Name "node-9" (have: 1 (WebFrontEnd483), 2 (Blade2), node-3)`},
		{"several, none chosen", "", `the BMC has 3 systems: 1 (WebFrontEnd483), 2 (Blade2), node-3; set system`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, envConfig{yaml: tt.yaml, sim: redfishtest.Options{Systems: systems}})
			_, err := e.wake(t)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Wake = %v, want ErrConfig containing %q", err, tt.want)
			}
		})
	}
}
