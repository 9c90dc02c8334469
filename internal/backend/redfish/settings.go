package redfish

import (
	"cmp"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/registry"
)

// Defaults for the keys of a route's `redfish:` block.
const (
	DefaultTimeout       = 10 * time.Second
	DefaultPollInterval  = 2 * time.Second
	DefaultWatchInterval = 30 * time.Second
)

// DefaultResetOrder returns the Reset types tried, in order, to power a node on.
func DefaultResetOrder() []string { return []string{"On", "ForceOn", "PushPowerButton"} }

// powerOnReset reports whether reset_order may name rt: a Reset type that powers an Off system on.
func powerOnReset(rt string) bool { return rt == "On" || rt == "ForceOn" || rt == "PushPowerButton" }

// Auth modes.
const (
	AuthAuto    = "auto"
	AuthSession = "session"
	AuthBasic   = "basic"
)

// Sleep modes.
const (
	SleepGraceful = "graceful"
	SleepNone     = "none"
)

// Settings is a route's decoded, validated `redfish:` block. It never holds the password: that is
// read from PasswordFile or PasswordEnv each time the backend logs in, so it can rotate and so
// Settings can be printed.
type Settings struct {
	// Endpoint is the BMC's base URL (scheme and host, e.g. "https://10.0.0.17"), without a trailing /.
	Endpoint string `yaml:"endpoint"`
	// System is the ComputerSystem's Id or Name; empty when the BMC has exactly one system.
	System       string `yaml:"system"`
	Username     string `yaml:"username"`
	PasswordFile string `yaml:"password_file"`
	PasswordEnv  string `yaml:"password_env"`
	TLS          TLS    `yaml:"tls"`
	// Auth is session, basic or auto (session when the service offers a SessionService).
	Auth string `yaml:"auth"`
	// Timeout bounds each HTTP call to the BMC.
	Timeout registry.Duration `yaml:"timeout"`
	// ResetOrder lists power-on Reset types by preference; the first the system allows is used.
	ResetOrder []string `yaml:"reset_order"`
	// Sleep is graceful (GracefulShutdown, then optionally ForceOff) or none (never power off).
	Sleep string `yaml:"sleep"`
	// ShutdownGrace bounds the wait for Off after GracefulShutdown.
	ShutdownGrace registry.Duration `yaml:"shutdown_grace"`
	// ForceOff allows a ForceOff when the grace runs out.
	ForceOff bool `yaml:"force_off"`
	// PowerOnBudget bounds the wait for On after the Reset.
	PowerOnBudget registry.Duration `yaml:"power_on_budget"`
	// PowerOffBudget bounds the wait for Off after ForceOff.
	PowerOffBudget registry.Duration `yaml:"power_off_budget"`
	// PollInterval is the pause between PowerState reads while waiting for a state, and the first
	// pause of the retry backoff.
	PollInterval registry.Duration `yaml:"poll_interval"`
	// WatchInterval is the pause between the background PowerState reads that notice a node powering
	// off on its own while awake.
	WatchInterval registry.Duration `yaml:"watch_interval"`

	// undoWindow is how long after a failed wake the node is watched for a late power-on: the route's
	// sleep_budget.
	undoWindow time.Duration
}

// TLS is the `tls:` block.
type TLS struct {
	// CAFile is a PEM bundle of the CAs that may sign the BMC's certificate (default: system roots).
	CAFile string `yaml:"ca_file"`
	// InsecureSkipVerify turns certificate verification off; the backend logs a warning when it is on.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// Decode is the registry.SettingsDecoder of the `redfish:` block. It validates every key, applies the
// defaults (some derived from the route's wake_budget and sleep_budget) and returns a *Settings, or
// every problem as a *registry.Error keyed relative to the block.
func Decode(r *registry.Route, node *yaml.Node) (any, error) {
	s := &Settings{}
	if node == nil {
		return nil, &registry.Error{Err: errors.New("missing: a redfish route needs at least an endpoint")}
	}
	if err := registry.DecodeStrict(node, s); err != nil {
		return nil, err
	}
	line := func(key string) int { return registry.KeyLine(node, key) }
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &registry.Error{Key: key, Line: line(strings.SplitN(key, ".", 2)[0]), Err: fmt.Errorf(format, args...)})
	}

	// Endpoint.
	if s.Endpoint == "" {
		bad("endpoint", "missing: the BMC's URL, e.g. https://10.0.0.17")
	} else if u, err := url.Parse(s.Endpoint); err != nil {
		bad("endpoint", "%q is not a URL", s.Endpoint)
	} else {
		switch {
		case u.Scheme != "http" && u.Scheme != "https":
			bad("endpoint", "%q: the scheme must be https (or http)", s.Endpoint)
		case u.Host == "":
			bad("endpoint", "%q has no host", s.Endpoint)
		case u.User != nil:
			bad("endpoint", "credentials do not belong in the URL: use username and password_file or password_env")
		case u.RawQuery != "" || u.Fragment != "":
			bad("endpoint", "%q must not have a query or fragment", u.Redacted())
		}
		s.Endpoint = strings.TrimSuffix(s.Endpoint, "/")
		if u.Scheme == "http" && (s.TLS.CAFile != "" || s.TLS.InsecureSkipVerify) {
			bad("tls", "tls settings given, but the endpoint is plain http")
		}
	}

	// Credentials.
	switch {
	case s.Username == "" && (s.PasswordFile != "" || s.PasswordEnv != ""):
		bad("username", "missing: a password is configured without a username")
	case s.Username != "" && s.PasswordFile != "" && s.PasswordEnv != "":
		bad("password_file", "give password_file or password_env, not both")
	case s.Username != "" && s.PasswordFile == "" && s.PasswordEnv == "":
		bad("password_file", "missing: give password_file or password_env for user %q", s.Username)
	case s.Username != "": // the password's source is on this host: the check CheckHost runs again
		if _, err := s.password(); err != nil {
			key, _ := s.passwordSource()
			bad(key, "%v", err)
		}
	}

	// TLS.
	if s.TLS.CAFile != "" && s.TLS.InsecureSkipVerify {
		bad("tls.insecure_skip_verify", "set together with tls.ca_file: choose one")
	}
	if s.TLS.CAFile != "" {
		if _, err := loadCAs(s.TLS.CAFile); err != nil {
			bad("tls.ca_file", "%v", err)
		}
	}

	// Auth.
	switch s.Auth {
	case "":
		s.Auth = AuthAuto
	case AuthAuto, AuthSession, AuthBasic:
	default:
		bad("auth", "%q is not one of session, basic, auto", s.Auth)
	}
	if s.Username == "" && (s.Auth == AuthSession || s.Auth == AuthBasic) {
		bad("auth", "%s authentication needs a username", s.Auth)
	}

	// Reset order.
	if len(s.ResetOrder) == 0 {
		s.ResetOrder = DefaultResetOrder()
	}
	for i, rt := range s.ResetOrder {
		if !powerOnReset(rt) {
			bad(fmt.Sprintf("reset_order[%d]", i), "%q is not a power-on Reset type (one of: %s)", rt, strings.Join(DefaultResetOrder(), ", "))
		} else if slices.Index(s.ResetOrder, rt) != i {
			bad(fmt.Sprintf("reset_order[%d]", i), "%q listed twice", rt)
		}
	}

	// Sleep.
	switch s.Sleep {
	case "":
		s.Sleep = SleepGraceful
	case SleepGraceful, SleepNone:
	default:
		bad("sleep", "%q is not one of graceful, none", s.Sleep)
	}

	// Timing.
	if s.Timeout == 0 {
		s.Timeout = registry.Duration(DefaultTimeout)
	}
	if s.PollInterval == 0 {
		s.PollInterval = registry.Duration(DefaultPollInterval)
	}
	if s.WatchInterval == 0 {
		s.WatchInterval = registry.Duration(DefaultWatchInterval)
	}
	if s.PowerOnBudget == 0 {
		s.PowerOnBudget = registry.Duration(r.WakeBudget)
	} else if s.PowerOnBudget.D() > r.WakeBudget {
		bad("power_on_budget", "%v exceeds the route's wake_budget %v", s.PowerOnBudget.D(), r.WakeBudget)
	}
	if s.Sleep == SleepGraceful {
		explicitGrace := s.ShutdownGrace != 0
		if !explicitGrace {
			s.ShutdownGrace = registry.Duration(r.SleepBudget)
			if s.ForceOff {
				s.ShutdownGrace = registry.Duration(r.SleepBudget / 2)
			}
		}
		if s.ForceOff && s.PowerOffBudget == 0 {
			s.PowerOffBudget = registry.Duration(r.SleepBudget - s.ShutdownGrace.D())
		}
		switch {
		case s.ShutdownGrace.D() > r.SleepBudget:
			bad("shutdown_grace", "%v exceeds the route's sleep_budget %v", s.ShutdownGrace.D(), r.SleepBudget)
		case s.ForceOff && s.PowerOffBudget == 0:
			bad("power_off_budget", "no time left for ForceOff: shutdown_grace %v takes the whole sleep_budget %v", s.ShutdownGrace.D(), r.SleepBudget)
		case s.ForceOff && s.ShutdownGrace.D()+s.PowerOffBudget.D() > r.SleepBudget:
			bad("power_off_budget", "shutdown_grace %v + power_off_budget %v exceed the route's sleep_budget %v",
				s.ShutdownGrace.D(), s.PowerOffBudget.D(), r.SleepBudget)
		}
	}
	s.undoWindow = cmp.Or(r.SleepBudget, s.PowerOnBudget.D())
	if s.PollInterval.D() > s.PowerOnBudget.D() {
		bad("poll_interval", "%v is longer than power_on_budget %v", s.PollInterval.D(), s.PowerOnBudget.D())
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

var _ registry.HostChecker = (*Settings)(nil)

// CheckHost implements registry.HostChecker: what Decode found on the host still holds (the password
// file reads and is not empty, the password variable is set, the CA file holds a certificate), so a
// reload may keep these settings without decoding their text again. Each file is read once per load
// (c), however many nodes share it; the cache keeps no password, only whether it was there.
func (s *Settings) CheckHost(c *registry.HostCache) error {
	if s.Username != "" {
		key, source := s.passwordSource()
		if _, err := c.Do("redfish."+key+"\x00"+source, func() (string, error) { _, err := s.password(); return "", err }); err != nil {
			return err
		}
	}
	if p := s.TLS.CAFile; p != "" {
		if _, err := c.Do("redfish.ca_file\x00"+p, func() (string, error) { _, err := loadCAs(p); return "", err }); err != nil {
			return err
		}
	}
	return nil
}

// readPasswordFile returns the file's content without its trailing newline. Errors name the file, never
// its content.
func readPasswordFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read password file: %w", err)
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

// passwordSource is where a user's password comes from: the key that says so and its value (the file,
// or the variable's name).
func (s *Settings) passwordSource() (key, value string) {
	if s.PasswordFile != "" {
		return "password_file", s.PasswordFile
	}
	return "password_env", s.PasswordEnv
}

// password returns the configured password ("" without a username).
func (s *Settings) password() (string, error) {
	switch {
	case s.Username == "":
		return "", nil
	case s.PasswordFile != "":
		p, err := readPasswordFile(s.PasswordFile)
		if err == nil && p == "" {
			err = fmt.Errorf("password file %s is empty", s.PasswordFile)
		}
		return p, err
	default:
		p := os.Getenv(s.PasswordEnv)
		if p == "" {
			return "", fmt.Errorf("environment variable %s is not set or empty", s.PasswordEnv)
		}
		return p, nil
	}
}

// The settings name their secret variable, which the exec backing scrubs from its tenants.
var _ registry.SecretEnver = (*Settings)(nil)

// SecretEnv implements registry.SecretEnver: the password_env variable, if one is set.
func (s *Settings) SecretEnv() []string {
	if s.PasswordEnv == "" {
		return nil
	}
	return []string{s.PasswordEnv}
}

func loadCAs(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}
