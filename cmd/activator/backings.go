package main

import (
	"context"
	"log/slog"
	"slices"
	"sync"

	"go.yaml.in/yaml/v3"

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
	secrets  *secretNames // what the exec backing scrubs from its children's environments
}

// newBackings wires the backings. ctx is the process lifetime: backings that hold connections (the
// unit backing's D-Bus) keep them on it.
func newBackings(ctx context.Context, log *slog.Logger) *backings {
	secrets := newSecretNames()
	return &backings{
		decoders: map[string]registry.SettingsDecoder{
			"exec":    secrets.noting(exec.Decode),
			"kvm":     secrets.noting(kvm.Decode),
			"redfish": secrets.noting(redfish.Decode),
			"unit":    secrets.noting(unit.Decode),
		},
		provider: split.New(map[string]tenant.Opener{
			"exec":    exec.NewProvider(exec.Options{Logger: log, SecretEnv: secrets.list}),
			"kvm":     kvm.New(kvm.Options{Logger: log}),
			"redfish": redfish.NewProvider(redfish.Options{Logger: log}),
			"unit":    unit.NewProvider(unit.Options{Context: ctx, Logger: log}),
		}),
		secrets: secrets,
	}
}

// secretNames is every environment variable the config has named as a secret since the activator
// started (registry.SecretEnver settings, such as a Redfish route's password_env), and
// registry.AdminTokenEnv. The decoders note the names as each load and reload decodes the routes'
// settings, so a reload that names a new secret applies to the next exec spawn. Names are never
// dropped: a variable that held a secret under an older config stays out of children's environments
// until a restart, and so does a name from a reload that was rejected (scrubbing too much is safe).
type secretNames struct {
	mu    sync.Mutex // guards names
	names []string   // sorted, without repeats
}

func newSecretNames() *secretNames { return &secretNames{names: []string{registry.AdminTokenEnv}} }

// noting wraps dec so that the secret names of the settings it returns are added.
func (s *secretNames) noting(dec registry.SettingsDecoder) registry.SettingsDecoder {
	return func(r *registry.Route, node *yaml.Node) (any, error) {
		v, err := dec(r, node)
		if err == nil {
			s.add(registry.SettingsSecretEnv(v)...)
		}
		return v, err
	}
}

func (s *secretNames) add(names ...string) {
	if len(names) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.names = append(s.names, names...)
	slices.Sort(s.names)
	s.names = slices.Compact(s.names)
}

// list returns the names: exec.Options.SecretEnv, called at every spawn.
func (s *secretNames) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.names)
}
