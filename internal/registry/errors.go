package registry

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Error is one configuration problem. It names the route or instance (when there is one), the key
// (dotted, as in "health.interval" or "exec.argv") and the line of the config file.
type Error struct {
	Route string
	// Instance is set when Route names an entry of instances: rather than of routes:; the problem then
	// reads `instance "db": …`.
	Instance bool
	Key      string
	Line     int
	Err      error
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	switch {
	case e.Route != "" && e.Instance:
		fmt.Fprintf(&b, "instance %q: ", e.Route)
	case e.Route != "":
		fmt.Fprintf(&b, "route %q: ", e.Route)
	}
	if e.Key != "" {
		fmt.Fprintf(&b, "%s: ", e.Key)
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Errors flattens an error returned by Load (or a SettingsDecoder) into its individual problems, in
// the order they were found.
func Errors(err error) []error {
	if err == nil {
		return nil
	}
	var out []error
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		out = append(out, e)
	}
	walk(err)
	return out
}

// errs collects problems for one Load.
type errs struct{ list []error }

func (l *errs) add(route, key string, line int, format string, args ...any) {
	l.list = append(l.list, &Error{Route: route, Key: key, Line: line, Err: fmt.Errorf(format, args...)})
}

func (l *errs) addErr(route, key string, line int, err error) {
	// A decoder's own *Error keeps its key but gains the route and a line when it lacks them, with the
	// backing's key prefixed so the operator sees the full dotted path.
	for _, e := range Errors(err) {
		var re *Error
		if errors.As(e, &re) {
			c := *re
			if c.Route == "" {
				c.Route = route
			}
			if key != "" && c.Key != key && !strings.HasPrefix(c.Key, key+".") && !strings.HasPrefix(c.Key, key+"[") {
				if c.Key == "" {
					c.Key = key
				} else {
					c.Key = key + "." + c.Key
				}
			}
			if c.Line == 0 {
				c.Line = line
			}
			l.list = append(l.list, &c)
			continue
		}
		l.list = append(l.list, &Error{Route: route, Key: key, Line: line, Err: e})
	}
}

// err joins the problems in file order (stable for problems on one line or without a line), so that
// `activator check` reads top to bottom like the file.
func (l *errs) err() error {
	slices.SortStableFunc(l.list, func(a, b error) int { return cmp.Compare(lineOf(a), lineOf(b)) })
	return errors.Join(l.list...)
}

func lineOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Line
	}
	return 0
}
