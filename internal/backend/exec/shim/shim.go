// Package shim is the exec backing's listen_fds shim: a process that sets LISTEN_PID to its own pid
// and execve(2)s the tenant. Importing the package is enough: its init turns the process into the
// shim when the exec backing started it as one.
//
// Why a shim: the systemd socket-activation protocol requires LISTEN_PID to equal the tenant's pid,
// which is unknown before fork, and Go's os/exec cannot run code between fork and exec. So the backend
// starts its own executable with Env=1 and argv [Arg0, path, argv...]; the shim sets LISTEN_PID and
// execs the tenant, which keeps the pid, the inherited fd 3, the process group and the parent-death
// signal. No shell is involved.
//
// Why in an init, in a package of its own: the shim is the activator's 17 MB binary, and running all
// of its packages' initialisers (net/http, Prometheus, the D-Bus, QMP and Redfish clients, YAML)
// before main() took about 2.8 ms, most of a listen_fds wake's overhead. Go initialises packages in
// import-path order as their imports allow, so this package, which imports only a few standard
// packages, runs its init before those heavy ones and execs the tenant before they ever run.
package shim

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Env marks a process started as the shim. The shim removes it before exec'ing the tenant, so the
// tenant never sees it.
const Env = "ACTIVATOR_EXEC_SHIM"

// Arg0 is the shim's argv[0], as ps shows it for the instant before it execs the tenant.
const Arg0 = "activator-exec-shim"

// init never returns in shim mode: it execs the tenant or exits with status 127 after printing why on
// stderr (which the backend captures into the ExitError).
func init() {
	if os.Getenv(Env) != "1" {
		return
	}
	os.Exit(Run(os.Args, os.Environ(), os.Stderr))
}

// Run execs args[2:] from path args[1] with LISTEN_PID set to this process's pid; it returns only on
// failure, with the exit status to use.
func Run(args, environ []string, stderr io.Writer) int {
	if len(args) < 3 {
		fmt.Fprintf(stderr, "%s: usage: %s PATH ARGV0 [ARG...] (started by the exec backing only)\n", Arg0, Arg0)
		return 127
	}
	env := make([]string, 0, len(environ)+1)
	for _, kv := range environ {
		if strings.HasPrefix(kv, Env+"=") || strings.HasPrefix(kv, "LISTEN_PID=") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "LISTEN_PID="+strconv.Itoa(os.Getpid()))
	err := syscall.Exec(args[1], args[2:], env)
	fmt.Fprintf(stderr, "%s: exec %s: %v\n", Arg0, args[1], err)
	return 127
}
