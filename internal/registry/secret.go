package registry

import "slices"

// SecretEnver is implemented by a backing's decoded settings that name environment variables holding
// secrets (a Redfish route's password_env). The registry holds it because settings are the registry's
// concept: it is a property of what a SettingsDecoder returned, not an ability of a running backend.
// The exec backing scrubs every name so reported from its tenants' environments.
type SecretEnver interface {
	// SecretEnv returns the names of the environment variables the settings read secrets from; empty
	// when they read none.
	SecretEnv() []string
}

// AdminTokenEnv is the environment variable the admin API's bearer token may be read from. It is a
// secret whatever the config says.
const AdminTokenEnv = "ACTIVATOR_ADMIN_TOKEN"

// SecretEnv returns, sorted and without repeats, every environment variable c names as a secret: each
// route's SecretEnver settings, and AdminTokenEnv.
func (c *Config) SecretEnv() []string {
	names := []string{AdminTokenEnv}
	for _, r := range c.Routes {
		names = append(names, SettingsSecretEnv(r.Settings)...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// SettingsSecretEnv returns the secret names of one route's settings, nil when they implement no
// SecretEnver.
func SettingsSecretEnv(settings any) []string {
	if s, ok := settings.(SecretEnver); ok {
		return s.SecretEnv()
	}
	return nil
}
