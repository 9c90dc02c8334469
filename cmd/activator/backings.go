package main

import (
	"context"
	"log/slog"

	"github.com/activator/activator/internal/backend/exec"
	"github.com/activator/activator/internal/backend/kvm"
	"github.com/activator/activator/internal/backend/redfish"
	"github.com/activator/activator/internal/backend/split"
	"github.com/activator/activator/internal/backend/unit"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// backings is every backing this build has: the decoders the registry validates settings with, and
// the split provider the activator opens backends from.
type backings struct {
	decoders map[string]registry.SettingsDecoder
	provider *split.Provider
}

// newBackings wires the backings. ctx is the process lifetime: backings that hold connections (the
// unit backing's D-Bus) keep them on it.
func newBackings(ctx context.Context, log *slog.Logger) *backings {
	return &backings{
		decoders: map[string]registry.SettingsDecoder{
			"exec":    exec.Decode,
			"kvm":     kvm.Decode,
			"redfish": redfish.Decode,
			"unit":    unit.Decode,
		},
		provider: split.New(map[string]tenant.Opener{
			"exec":    exec.NewProvider(exec.Options{Logger: log}),
			"kvm":     kvm.New(kvm.Options{Logger: log}),
			"redfish": redfish.NewProvider(redfish.Options{Logger: log}),
			"unit":    unit.NewProvider(unit.Options{Context: ctx, Logger: log}),
		}),
	}
}
