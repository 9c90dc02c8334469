package exec

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	osexec "os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/activator/activator/internal/tenant"
)

// drainGrace bounds how long the output of an exited child is read after its exit: a grandchild that
// escaped the process group may hold the pipes open forever.
const drainGrace = time.Second

// reapGrace bounds the wait for a SIGKILLed process group leader to be reaped (only a process stuck in
// uninterruptible sleep takes longer).
const reapGrace = 10 * time.Second

// proc is one child process, from spawn to reap.
type proc struct {
	pid    int // set before start returns
	tid    int // the OS thread that forked the child and stays locked to its owner goroutine
	life   *tenant.Life
	out    tail
	log    *outputLog    // logs the output, rate-limited; set before the drains start
	marker []byte        // nil: no ready marker
	ready  chan struct{} // closed when a line containing marker has been read
	once   sync.Once     // closes ready
	done   chan struct{} // closed after the child is reaped, its output drained and life ended
	exit   *ExitError    // how it ended; written before done is closed

	mu       sync.Mutex // guards the fields below
	reaped   bool       // the pid may be reused: signal nothing any more
	stopWhy  error      // non-nil once the backend decided to stop it: the Life's end reason
	stopping bool
}

// exited reports whether the child has been reaped and its Life ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// running reports whether the child's Life goes on: false as soon as the Life ended, even while the
// owner goroutine is still finishing.
func (p *proc) running() bool {
	select {
	case <-p.life.Done():
		return false
	default:
		return !p.exited()
	}
}

// signal sends sig to the child's process group, unless it has been reaped.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaped {
		return nil
	}
	if err := unix.Kill(-p.pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return err
	}
	return nil
}

// markStopping records why the backend is stopping the child; the first reason wins.
func (p *proc) markStopping(why error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.stopping {
		p.stopping, p.stopWhy = true, why
	}
}

// spec is what to execute.
type spec struct {
	path  string
	args  []string
	env   []string
	dir   string
	extra []*os.File // fd 3 onwards
}

// start spawns the child and returns once it runs (or failed to start). The child is owned by a
// goroutine that b.wg tracks; that goroutine holds its OS thread locked from fork to reap, because
// Linux delivers the parent-death signal when the *thread* that forked exits, and the Go runtime
// terminates a thread when a goroutine locked to it exits without unlocking. Keeping our goroutine
// locked to the forking thread means no other goroutine can ever run on it, so that thread lives
// exactly as long as the child, or until the whole activator dies (even by SIGKILL), which is when
// SIGKILL must reach the child.
//
// The caller holds b.mu and has checked that b is not closed.
func (b *Backend) startLocked(sp spec) (*proc, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	cmd := &osexec.Cmd{
		Path:       sp.path,
		Args:       sp.args,
		Env:        sp.env,
		Dir:        sp.dir,
		Stdout:     outW, // *os.File: the child writes to the pipe directly, no copying goroutine
		Stderr:     errW,
		ExtraFiles: sp.extra,
		SysProcAttr: &syscall.SysProcAttr{
			Setpgid:   true, // its own group, so stop signals reach its children too
			Pdeathsig: syscall.SIGKILL,
		},
	}
	p := &proc{
		life:  tenant.NewLife(),
		ready: make(chan struct{}),
		done:  make(chan struct{}),
	}
	if m := b.settings.ReadyMarker; m != "" {
		p.marker = []byte(m)
	}
	started := make(chan error, 1)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.own(p, cmd, started, outR, errR)
	}()
	err = <-started
	outW.Close()
	errW.Close()
	if err != nil {
		return nil, err
	}
	return p, nil
}

// own starts cmd on a locked OS thread, reports the start on started, then drains the child's output
// (and reports what the log's rate limit left out), reaps it and ends its Life.
func (b *Backend) own(p *proc, cmd *osexec.Cmd, started chan<- error, outR, errR *os.File) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread() // only after the child is reaped: see startLocked
	p.tid = unix.Gettid()
	if err := cmd.Start(); err != nil {
		outR.Close()
		errR.Close()
		started <- err
		return
	}
	p.pid = cmd.Process.Pid
	started <- nil

	p.log = newOutputLog(b.logger(), p.pid)
	var readers sync.WaitGroup
	readers.Go(func() { p.drain(outR, "stdout") })
	readers.Go(func() { p.drain(errR, "stderr") })
	reporting, endOutput := context.WithCancel(context.Background())
	reported := make(chan struct{})
	go func() { defer close(reported); p.log.run(reporting) }()

	// Observe the exit without reaping, so the pid (the process group's id) cannot be reused while
	// stragglers in the group are killed.
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	p.mu.Lock()
	_ = unix.Kill(-p.pid, syscall.SIGKILL) // leftovers of the group; the leader is a zombie already
	p.reaped = true
	p.mu.Unlock()
	_ = cmd.Wait() // reaps; the status is in cmd.ProcessState

	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	t := time.NewTimer(drainGrace)
	select {
	case <-drained:
	case <-t.C:
		b.logger().Warn("output pipes still open after exit; a process that left the group holds them", "pid", p.pid)
	}
	t.Stop()
	outR.Close() // unblocks readers still waiting
	errR.Close()
	<-drained
	endOutput() // the final report of suppressed lines comes before the exit's
	<-reported

	p.exit = exitError(p.pid, cmd.ProcessState, p.out.Bytes())
	p.mu.Lock()
	stopping, why := p.stopping, p.stopWhy
	p.mu.Unlock()
	if stopping {
		b.logger().Info("stopped", "pid", p.pid, "status", p.exit.Status())
		p.life.End(why)
	} else {
		b.logger().Warn("exited on its own", "pid", p.pid, "err", p.exit)
		p.life.End(p.exit)
	}
	close(p.done)
}

// drain reads one of the child's streams until EOF (or until its read end is closed), keeping the
// output, watching for the ready marker and logging each line within p.log's rate limit.
func (p *proc) drain(r io.Reader, stream string) {
	br := bufio.NewReaderSize(r, 16<<10)
	for {
		line, err := br.ReadSlice('\n') // a line longer than the buffer comes in pieces
		if len(line) > 0 {
			p.out.Write(line)
			if p.marker != nil && bytes.Contains(line, p.marker) {
				p.once.Do(func() { close(p.ready) })
			}
			p.log.line(stream, line)
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

func exitError(pid int, st *os.ProcessState, out []byte) *ExitError {
	e := &ExitError{PID: pid, Code: -1, Output: out}
	if st == nil {
		return e
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		e.Signal = ws.Signal()
		return e
	}
	e.Code = st.ExitCode()
	return e
}
