package exec

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/activator/activator/internal/tenant"
)

// Limits of the output kept for diagnostics.
const (
	// TailSize is how much of the child's latest combined stdout and stderr is kept (ExitError.Output).
	TailSize = 64 << 10
	// messageLines and messageBytes bound the output quoted in ExitError.Error.
	messageLines = 10
	messageBytes = 2 << 10
)

// ExitError is how a child that exited on its own ended: the Life's error, and Wake's error when the
// child exits before its ready marker. Error() is short enough for a 503 body: "exited with code 3:
// <the last lines of output>".
type ExitError struct {
	PID int
	// Code is the exit status, or -1 when a signal ended the process.
	Code int
	// Signal is the signal that ended the process, or 0.
	Signal syscall.Signal
	// Output is the last TailSize bytes of combined stdout and stderr, in the order they were read.
	Output []byte
}

func (e *ExitError) Error() string {
	if t := e.Tail(); t != "" {
		return e.Status() + ": " + t
	}
	return e.Status() + " (no output)"
}

// FaultClass implements tenant.Classer: retryable. A tenant that crashes at start may have met a
// transient fault (a database not up yet, a port still in TIME_WAIT, an out-of-memory kill); the
// activator's backoff paces the next wake, so a tenant that always crashes costs one spawn per backoff
// period, not a spin.
func (e *ExitError) FaultClass() tenant.Class { return tenant.ClassRetryable }

// DaemonError ends the Life of a tenant that forked into the background: its main process exited
// cleanly while its cgroup still held processes. Those were killed.
type DaemonError struct {
	PID       int   // the main process
	Leftovers []int // the processes it left in its cgroup, all killed
	Exit      *ExitError
}

func (e *DaemonError) Error() string {
	return fmt.Sprintf("the tenant forked into the background; run it in the foreground (nginx: `daemon off;`): pid %d %s and left %d process(es) %v in its cgroup, now killed",
		e.PID, e.Exit.Status(), len(e.Leftovers), e.Leftovers)
}

// Unwrap returns the main process's *ExitError.
func (e *DaemonError) Unwrap() error { return e.Exit }

// FaultClass implements tenant.Classer: terminal, whatever the wrapped *ExitError says. The tenant
// daemonizes every time it starts; only a change to its command line or configuration stops that.
func (e *DaemonError) FaultClass() tenant.Class { return tenant.ClassTerminal }

// Status is how the process ended, without output: "exited with code 3", "killed by SIGKILL".
func (e *ExitError) Status() string {
	if e.Signal != 0 {
		name := unix.SignalName(e.Signal)
		if name == "" {
			name = fmt.Sprintf("signal %d", int(e.Signal))
		}
		return "killed by " + name
	}
	return fmt.Sprintf("exited with code %d", e.Code)
}

// Tail is the end of the output quoted by Error: at most the last 10 lines and 2 KiB, trimmed.
func (e *ExitError) Tail() string { return quoteTail(e.Output) }

func quoteTail(out []byte) string {
	out = bytes.TrimRight(out, " \t\r\n")
	if len(out) > messageBytes {
		out = out[len(out)-messageBytes:]
		if i := bytes.IndexByte(out, '\n'); i >= 0 && i+1 < len(out) {
			out = out[i+1:] // drop the partial first line
		}
	}
	n := 0
	for i := len(out) - 1; i >= 0; i-- {
		if out[i] == '\n' {
			n++
			if n == messageLines {
				out = out[i+1:]
				break
			}
		}
	}
	return strings.TrimSpace(strings.ToValidUTF8(string(out), "\uFFFD"))
}

// tail keeps the last TailSize bytes written to it. It is safe for concurrent use.
type tail struct {
	mu  sync.Mutex // guards buf
	buf []byte
}

func (t *tail) Write(p []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*TailSize {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-TailSize:]...)
	}
}

// Bytes returns a copy of the kept output.
func (t *tail) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf
	if len(b) > TailSize {
		b = b[len(b)-TailSize:]
	}
	return bytes.Clone(b)
}
