// Package native is the exec backing's shim as a static executable of about 2 KB (csrc/shim.c, built
// by build.sh (go generate) into shim-linux-amd64 and embedded here), which keeps package shim's protocol exactly:
// the same argv, the same two environment variables, the same exit statuses. The exec backing starts
// it in place of /bin/sh or the activator's own binary where this package has it (linux/amd64).
//
// Why a program in C when package shim exists: a listen_fds tenant's LISTEN_PID must be its own pid,
// so some process must run between fork and the tenant's exec. The activator's own binary costs about
// 2.4 ms there and /bin/sh about 0.8 ms (dash's dynamic linking and start, measured here as fork, exec
// and exit against /bin/true alone); this one about 0.1 ms, as it maps two pages and makes four system
// calls. A standby waiting at its gate holds a few pages instead of dash's 0.1 MiB.
//
// Open writes the executable into a sealed memfd, so it needs no file on disk and nothing can alter
// it, and runs it once to prove the kernel lets it execute from there (vm.memfd_noexec, a /proc that
// is not mounted); the exec backing falls back to the shell or its own binary when Open fails.
package native

import "errors"

// Name is the memfd's name, as /proc/PID/exe shows it for a waiting standby ("/memfd:" Name
// " (deleted)").
const Name = "activator-exec-shim"

// ErrUnsupported is Open's error where this package holds no executable for the platform.
var ErrUnsupported = errors.New("no native shim for this platform")

// Shim is the native shim, held in a memfd; Path names it for exec until Close.
type Shim struct {
	fd   int
	path string
}

// Path is the executable's path for exec: /proc/self/fd/N, which in a child between fork and exec
// names the descriptor the child inherited. N is at least minFD, above the descriptors Go's fork
// renumbers for the child, so the child's own arrangement of its files cannot overwrite it.
func (s *Shim) Path() string { return s.path }
