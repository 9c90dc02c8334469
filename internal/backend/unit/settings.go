package unit

import (
	"errors"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/registry"
)

// SleepMode is how a route's unit is put to sleep.
type SleepMode string

// The sleep modes.
const (
	// SleepStop stops the unit (a stop job); wake starts it again. The default.
	SleepStop SleepMode = "stop"
	// SleepFreeze freezes the unit's cgroup (FreezeUnit); wake thaws it. Needs the cgroup v2 freezer.
	SleepFreeze SleepMode = "freeze"
	// SleepSIGSTOP sends SIGSTOP to every process of the unit (KillUnit); wake sends SIGCONT.
	SleepSIGSTOP SleepMode = "sigstop"
)

// Bus values with a meaning of their own; anything else is a D-Bus address.
const (
	BusSystem = "system" // the system manager (default)
	BusUser   = "user"   // the calling user's manager
)

// Settings is a route's validated `unit:` block. It is immutable after Decode.
type Settings struct {
	// Unit is the service the route wakes: `name`, or `template` with {name} replaced by the route name.
	Unit string
	// Template is the template it came from, if any (for status and docs).
	Template string
	// Bus is BusSystem, BusUser or a manager's private socket address ("unix:path=/…/systemd/private").
	Bus string
	// Sleep is the sleep mode (default SleepStop).
	Sleep SleepMode
	// Socket is the paired .socket unit, if any. It is not started or stopped by the backend: it stays
	// listening while the service sleeps; Check verifies that it exists.
	Socket string
}

// settingsYAML is the `unit:` block as written.
type settingsYAML struct {
	Name     string `yaml:"name"`
	Template string `yaml:"template"`
	Bus      string `yaml:"bus"`
	Sleep    string `yaml:"sleep"`
	Socket   string `yaml:"socket"`
}

// Decode is the unit backing's registry.SettingsDecoder. It decodes the `unit:` block strictly,
// validates it (unit names by systemd's rules, only .service units, a known sleep mode, a bus that is
// "system", "user" or a unix:path= address), applies the defaults and returns a *Settings, or every
// problem found as *registry.Error values whose Key is relative to the block.
func Decode(r *registry.Route, node *yaml.Node) (any, error) {
	if node == nil {
		return nil, &registry.Error{Err: errors.New("missing: a unit route needs `name` (a .service) or `template` (e.g. app@{name}.service)")}
	}
	var y settingsYAML
	if err := registry.DecodeStrict(node, &y); err != nil {
		return nil, err
	}
	var errs []error
	bad := func(key string, format string, args ...any) {
		errs = append(errs, &registry.Error{Key: key, Line: registry.KeyLine(node, key), Err: fmt.Errorf(format, args...)})
	}
	s := &Settings{Bus: y.Bus, Sleep: SleepMode(y.Sleep), Template: y.Template}
	switch {
	case y.Name != "" && y.Template != "":
		bad("template", "set either name or template, not both")
	case y.Name != "":
		if err := checkUnitName(y.Name, ".service"); err != nil {
			bad("name", "%v", err)
		}
		s.Unit = y.Name
	case y.Template != "":
		if n := strings.Count(y.Template, "{name}"); n != 1 {
			bad("template", "%q must contain {name} exactly once (as in app@{name}.service), found %d", y.Template, n)
			break
		}
		name := strings.ReplaceAll(y.Template, "{name}", r.Name)
		if err := checkUnitName(name, ".service"); err != nil {
			bad("template", "%q expands to %q for this route: %v", y.Template, name, err)
		}
		s.Unit = name
	default:
		bad("name", "missing: set name (a .service unit) or template (e.g. app@{name}.service)")
	}

	switch s.Sleep {
	case "":
		s.Sleep = SleepStop
	case SleepStop, SleepFreeze, SleepSIGSTOP:
	default:
		bad("sleep", "%q is not a sleep mode (one of: stop, freeze, sigstop)", y.Sleep)
	}

	switch s.Bus {
	case "":
		s.Bus = BusSystem
	case BusSystem, BusUser:
	default:
		if err := checkAddress(s.Bus); err != nil {
			bad("bus", "%v", err)
		}
	}

	if y.Socket != "" {
		if err := checkUnitName(y.Socket, ".socket"); err != nil {
			bad("socket", "%v", err)
		}
		s.Socket = y.Socket
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

// unitNameMax is systemd's UNIT_NAME_MAX minus the terminating NUL.
const unitNameMax = 255

// checkUnitName applies systemd's unit_name_is_valid rules for a plain or instance name (not a bare
// template such as "app@.service") and requires the given suffix. Allowed characters are ASCII
// letters, digits and ":-_.\"; '@' separates the instance, which may not be empty.
func checkUnitName(name, suffix string) error {
	if name == "" {
		return errors.New("empty unit name")
	}
	if len(name) > unitNameMax {
		return fmt.Errorf("unit name %.40q… is longer than %d characters", name, unitNameMax)
	}
	if !strings.HasSuffix(name, suffix) {
		return fmt.Errorf("%q is not a %s unit", name, suffix)
	}
	stem := strings.TrimSuffix(name, suffix)
	if stem == "" {
		return fmt.Errorf("%q has no name before %s", name, suffix)
	}
	for i := 0; i < len(stem); i++ {
		c := stem[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte(":-_.\\@", c) >= 0:
		default:
			return fmt.Errorf("%q is not a valid unit name: character %q is not allowed (letters, digits, \":-_.\\@\")", name, c)
		}
	}
	at := strings.IndexByte(stem, '@')
	switch {
	case at == 0:
		return fmt.Errorf("%q is not a valid unit name: it starts with '@'", name)
	case at == len(stem)-1:
		return fmt.Errorf("%q is a template, not a unit: give the instance (as in %s%s), or use template: with {name}", name, stem+"instance", suffix)
	}
	return nil
}

// checkAddress accepts the address of a manager's private socket: unix:path=/absolute/path.
func checkAddress(a string) error {
	p, ok := strings.CutPrefix(a, "unix:path=")
	if !ok {
		return fmt.Errorf("%q is neither system, user nor a manager's private socket address (unix:path=/run/user/1000/systemd/private)", a)
	}
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("%q: the socket path must be absolute", a)
	}
	if strings.ContainsAny(p, ",;") {
		return fmt.Errorf("%q: only a single unix:path= address without further options is accepted", a)
	}
	return nil
}

var _ registry.HostChecker = (*Settings)(nil)

// CheckHost implements registry.HostChecker: a unit's settings are decoded without consulting the
// host (the unit is looked up on the manager at each wake), so there is nothing to check again.
func (s *Settings) CheckHost(*registry.HostCache) error { return nil }
