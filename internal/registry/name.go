package registry

import "fmt"

// nameRule says in words what nameRE allows, for the errors that quote a name it refuses.
const nameRule = "lower-case letters, digits, '-' and '_', at most 63"

// CheckName returns nil when name can be a route's or an instance's name, else an error that quotes
// it (control characters and invalid UTF-8 escaped) and says the rule. The config's name: key is
// checked with it, and the CLI checks a ROUTE argument with it before asking the admin API, so that
// `activator explain ../healthz` is refused as what it is rather than sent as /routes/..%2Fhealthz.
func CheckName(name string) error {
	if nameRE.MatchString(name) {
		return nil
	}
	return fmt.Errorf("%q is not a valid route name (%s)", name, nameRule)
}
