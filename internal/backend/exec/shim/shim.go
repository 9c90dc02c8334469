// Package shim is the exec backing's shim: a process that sets LISTEN_PID to its own pid (listen_fds)
// and execve(2)s the tenant, after waiting at a gate when it is a route's standby. Importing the
// package is enough: its init turns the process into the shim when the exec backing started it as one.
//
// Why a shim: the systemd socket-activation protocol requires LISTEN_PID to equal the tenant's pid,
// which is unknown before fork, and Go's os/exec cannot run code between fork and exec. So the backend
// starts its own executable with Env=1 and argv [Arg0, path, argv...]; the shim sets LISTEN_PID and
// execs the tenant, which keeps the pid, the inherited fd 3, the process group and the parent-death
// signal. No shell is involved.
//
// A standby (`standby: true`) is the shim started ahead, while the route sleeps: GateEnv names an
// inherited pipe it blocks reading until the wake writes a line to it. End of file instead (the
// backend dropped the standby, or died) makes it exit with status 75 without exec'ing anything.
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
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// Env marks a process started as the shim; its value is the mode, ModeListenFDs or ModeExec. The shim
// removes it before exec'ing the tenant, so the tenant never sees it.
const Env = "ACTIVATOR_EXEC_SHIM"

// The shim's modes, Env's values.
const (
	ModeListenFDs = "1"    // set LISTEN_PID to the shim's pid, then exec
	ModeExec      = "exec" // exec the tenant with the environment as it is (a standby of listen: env or none)
)

// GateEnv, when set, is the number of an inherited file descriptor the shim reads one line from before
// it execs the tenant (a standby). It is removed from the tenant's environment, and the descriptor
// closed.
const GateEnv = "ACTIVATOR_EXEC_SHIM_GATE"

// Cancelled is the shim's exit status when its gate reached end of file without a line: the standby
// was dropped.
const Cancelled = 75

// Arg0 is the shim's argv[0], as ps shows it until it execs the tenant: an instant, or a whole sleep
// in a standby.
const Arg0 = "activator-exec-shim"

// init never returns in shim mode: it execs the tenant or exits with status 127 after printing why on
// stderr (which the backend captures into the ExitError).
func init() {
	if m := os.Getenv(Env); m != ModeListenFDs && m != ModeExec {
		return
	}
	os.Exit(Run(os.Args, os.Environ(), os.Stderr))
}

// Run execs args[2:] from path args[1], with LISTEN_PID set to this process's pid unless environ's Env
// is ModeExec, and after a line from the gate when environ has GateEnv; it returns only on failure (or
// a cancelled gate), with the exit status to use.
func Run(args, environ []string, stderr io.Writer) int {
	if len(args) < 3 {
		fmt.Fprintf(stderr, "%s: usage: %s PATH ARGV0 [ARG...] (started by the exec backing only)\n", Arg0, Arg0)
		return 127
	}
	mode, gate := ModeListenFDs, ""
	env := make([]string, 0, len(environ)+1)
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case Env:
			mode = v
			continue
		case GateEnv:
			gate = v
			continue
		}
		env = append(env, kv)
	}
	if mode != ModeExec { // the tenant's LISTEN_PID is the shim's pid, whatever came in
		env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "LISTEN_PID=") })
		env = append(env, "LISTEN_PID="+strconv.Itoa(os.Getpid()))
	}
	if gate != "" {
		if code := wait(gate, stderr); code != 0 {
			return code
		}
	}
	err := syscall.Exec(args[1], args[2:], env)
	fmt.Fprintf(stderr, "%s: exec %s: %v\n", Arg0, args[1], err)
	return 127
}

// wait reads from the gate descriptor fd until a newline, then closes it: 0 to go on, Cancelled at end
// of file, 127 when fd is no descriptor: decimal digits alone, 3 to 2^31-1 (a descriptor is a C int;
// Atoi took 4294967299, which the kernel read as 3, and a sign, which the native shim refuses).
func wait(fd string, stderr io.Writer) int {
	n, err := strconv.ParseInt(fd, 10, 32)
	if err != nil || n < 3 || strings.TrimLeft(fd, "0123456789") != "" {
		fmt.Fprintf(stderr, "%s: %s=%q is not an inherited descriptor\n", Arg0, GateEnv, fd)
		return 127
	}
	defer syscall.Close(int(n))
	var b [1]byte
	for {
		m, err := syscall.Read(int(n), b[:])
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			fmt.Fprintf(stderr, "%s: read the standby gate: %v\n", Arg0, err)
			return 127
		case m == 0:
			return Cancelled
		case b[0] == '\n':
			return 0
		}
	}
}
