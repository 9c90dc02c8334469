package main

import (
	"context"
	"log/slog"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
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
	// loader loads the config at start-up and at each reload with decoders, decoding again only the
	// entries whose text changed (registry.Reloader).
	loader   *registry.Reloader
	provider *split.Provider
	exec     *exec.Provider // also in provider: contain sets up its tenants' containment
	secrets  *secretNames   // what the exec backing scrubs from its children's environments
}

// newBackings wires the backings. ctx is the process lifetime: backings that hold connections (the
// unit backing's D-Bus) keep them on it. oneShot is for a process that checks and exits (`activator
// check`): its errors give no advice only a running server can follow.
func newBackings(ctx context.Context, log *slog.Logger, oneShot bool) *backings {
	secrets := newSecretNames()
	ex := exec.NewProvider(exec.Options{Logger: log, SecretEnv: secrets.list})
	decoders := map[string]registry.SettingsDecoder{
		"exec":    secrets.noting(exec.Decode),
		"kvm":     secrets.noting(kvm.Decode),
		"redfish": secrets.noting(redfish.Decode),
		"unit":    secrets.noting(unit.Decode),
	}
	return &backings{
		decoders: decoders,
		loader:   registry.NewReloader(decoders),
		provider: split.New(map[string]tenant.Opener{
			"exec":    ex,
			"kvm":     kvm.New(kvm.Options{Logger: log}),
			"redfish": redfish.NewProvider(redfish.Options{Logger: log, OneShot: oneShot}),
			"unit":    unit.NewProvider(unit.Options{Context: ctx, Logger: log}),
		}),
		exec:    ex,
		secrets: secrets,
	}
}

// contain settles how exec tenants are contained, once, at start-up before any route is applied (so
// before anything spawns): in a cgroup each below cfg.CgroupRoot, where what an earlier activator left
// is killed now, or by process group (exec.Contain logs which, and why). It registers the tenants'
// cgroup usage on reg. An error (a cgroup_root another activator holds) must stop the start-up.
// cgroup_root is read here only: a reload that changes it takes effect at the next start.
func (bk *backings) contain(ctx context.Context, cfg *registry.Config, reg prometheus.Registerer) error {
	if err := bk.exec.Contain(ctx, cfg.CgroupRoot); err != nil {
		return err
	}
	return reg.Register(tenantUsage{bk.exec})
}

// tenantUsage exports the exec tenants' cgroup usage (exec.Provider.Usage) at each scrape. A series
// exists only while its route's Backend does, so none outlives its route; memory and pids series
// only while the tenant runs (or is frozen) and where their controller is enabled for it.
type tenantUsage struct{ p *exec.Provider }

var (
	tenantCPUDesc = prometheus.NewDesc("activator_tenant_cpu_seconds_total",
		"CPU time used by an exec tenant's processes (its cgroup's cpu.stat usage_usec), over all its wakes.", []string{"route"}, nil)
	tenantMemoryDesc = prometheus.NewDesc("activator_tenant_memory_bytes",
		"Memory used by an exec tenant's cgroup (memory.current), while it runs or is frozen.", []string{"route"}, nil)
	tenantPidsDesc = prometheus.NewDesc("activator_tenant_pids",
		"Processes and threads in an exec tenant's cgroup (pids.current), while it runs or is frozen.", []string{"route"}, nil)
)

func (tenantUsage) Describe(ch chan<- *prometheus.Desc) {
	ch <- tenantCPUDesc
	ch <- tenantMemoryDesc
	ch <- tenantPidsDesc
}

func (u tenantUsage) Collect(ch chan<- prometheus.Metric) {
	for _, t := range u.p.Usage() {
		ch <- prometheus.MustNewConstMetric(tenantCPUDesc, prometheus.CounterValue, t.CPU.Seconds(), t.Route)
		if t.HasMemory {
			ch <- prometheus.MustNewConstMetric(tenantMemoryDesc, prometheus.GaugeValue, float64(t.Memory), t.Route)
		}
		if t.HasPids {
			ch <- prometheus.MustNewConstMetric(tenantPidsDesc, prometheus.GaugeValue, float64(t.Pids), t.Route)
		}
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
