package exec

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// shimEnv marks a process started as the listen_fds shim. The shim removes it before exec'ing the
// tenant, so the tenant never sees it.
const shimEnv = "ACTIVATOR_EXEC_SHIM"

// shimArg0 is the shim's argv[0], as ps shows it for the instant before it execs the tenant.
const shimArg0 = "activator-exec-shim"

// RunShimIfRequested turns the current process into the listen_fds shim when the exec backing started
// it as one, and otherwise returns at once. main() and every TestMain whose tests use `listen:
// listen_fds` must call it first thing.
//
// Why a shim: the systemd socket-activation protocol requires LISTEN_PID to equal the tenant's pid,
// which is unknown before fork, and Go's os/exec cannot run code between fork and exec. So the backend
// starts its own executable with ACTIVATOR_EXEC_SHIM=1 and argv [shim, path, argv...]; the shim sets
// LISTEN_PID to its own pid and execve(2)s the tenant, which keeps the pid, the inherited fd 3, the
// process group and the parent-death signal. No shell is involved. The cost is one extra exec (and a
// Go runtime start, about a millisecond) per wake in listen_fds mode only.
//
// It never returns in shim mode: it execs the tenant or exits with status 127 after printing why on
// stderr (which the backend captures into the ExitError).
func RunShimIfRequested() {
	if os.Getenv(shimEnv) != "1" {
		return
	}
	os.Exit(runShim(os.Args, os.Environ(), os.Stderr))
}

// runShim execs args[2:] from path args[1]; it returns only on failure.
func runShim(args, environ []string, stderr io.Writer) int {
	if len(args) < 3 {
		fmt.Fprintf(stderr, "%s: usage: %s PATH ARGV0 [ARG...] (started by the exec backing only)\n", shimArg0, shimArg0)
		return 127
	}
	env := make([]string, 0, len(environ)+1)
	for _, kv := range environ {
		if strings.HasPrefix(kv, shimEnv+"=") || strings.HasPrefix(kv, "LISTEN_PID=") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "LISTEN_PID="+strconv.Itoa(os.Getpid()))
	err := syscall.Exec(args[1], args[2:], env)
	fmt.Fprintf(stderr, "%s: exec %s: %v\n", shimArg0, args[1], err)
	return 127
}
