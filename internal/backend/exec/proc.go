package exec

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	osexec "os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/activator/activator/internal/cgroup"
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
	pid     int           // set before start returns
	tid     int           // the thread that forked the child, which its parent-death signal is tied to (fork.go)
	group   *cgroup.Group // the tenant's cgroup, which the child was spawned into; nil: process group only
	out     tail
	log     *outputLog    // logs the output, rate-limited; set before the drains start
	marker  []byte        // nil: no ready marker
	secrets []string      // spec.secrets: the names kept out of its environment
	ready   chan struct{} // closed when a line containing marker has been read
	once    sync.Once     // closes ready
	done    chan struct{} // closed after the child is reaped, its output drained and life ended
	exit    *ExitError    // how it ended; written before done is closed
	failed  error         // the Life's end when the child ended on its own: exit or a *DaemonError

	mu       sync.Mutex   // guards the fields below
	life     *tenant.Life // the current Life: a thaw after a freeze starts a new one
	frozen   bool         // Sleep froze its cgroup (sleep: freeze); Wake thaws it
	reaped   bool         // the pid may be reused: signal nothing any more
	stopWhy  error        // non-nil once the backend decided to stop it: the Life's end reason
	stopping bool
	standby  bool // waiting at its gate, not yet the tenant (standby.go)
}

// currentLife is the child's current Life.
func (p *proc) currentLife() *tenant.Life {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.life
}

// isFrozen reports whether Sleep froze the child (and no Wake has thawed it yet).
func (p *proc) isFrozen() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.frozen
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

// liveLife returns the child's current Life if it goes on, or nil once it has ended or the child has
// exited: one read, so that an ended Life never slips out between the check and the return.
func (p *proc) liveLife() *tenant.Life {
	life := p.currentLife()
	if life.Err() != nil || p.exited() {
		return nil
	}
	return life
}

// running reports whether the child's Life goes on: false as soon as the Life ended, even while the
// owner goroutine is still finishing.
func (p *proc) running() bool {
	select {
	case <-p.currentLife().Done():
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

// kill SIGKILLs the whole tenant: every process in its cgroup (cgroup.kill), or its process group.
func (p *proc) kill() error {
	if p.group == nil {
		return p.signal(syscall.SIGKILL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), reapGrace)
	defer cancel()
	err := p.group.Kill(ctx)
	if errors.Is(err, os.ErrNotExist) {
		// The owner removed the group while Kill waited for it to empty: a group is removed only once
		// empty, so the kill is done.
		return nil
	}
	return err
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
	// secrets are the variables kept out of env (Options.SecretEnv when it was built).
	secrets []string
}

// start spawns the child and returns once it runs (or failed to start). The child is owned by a
// goroutine that b.wg tracks, from spawn to reap. Linux delivers the parent-death signal when the
// *thread* that forked exits, so the child is forked from a thread locked to a goroutine that outlives
// it: its owner's own (held until the reap), or beyond maxDedicated children one of the shared
// forking threads, which end only with the activator (fork.go). Either way that thread lives until
// the child is gone or the whole activator dies (even by SIGKILL), which is when SIGKILL must reach
// the child. Its exit is awaited through its pidfd, so no thread blocks waiting for it.
//
// With a tenant cgroup g, the child is cloned straight into it (clone3 with CLONE_INTO_CGROUP), so
// not even its first instruction runs outside, and no fork of it can escape before it is moved.
//
// standby marks the child a standby (standby.go), which its owner's logs say.
//
// The caller holds b.mu and has checked that b is not closed.
func (b *Backend) startLocked(sp spec, g *cgroup.Group, standby bool) (*proc, error) {
	pidfd := -1
	attr := &syscall.SysProcAttr{
		Setpgid:   true, // its own group, so stop signals reach its children too
		Pdeathsig: syscall.SIGKILL,
		PidFD:     &pidfd, // its exit is awaited in the netpoller (awaitExit); -1 where the kernel has none
	}
	if g != nil {
		// A bare descriptor: an *os.File would try the netpoller first, a few syscalls more on the
		// spawn's critical path.
		dir, err := unix.Open(g.Dir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("cgroup: open %s: %w", g.Dir(), err)
		}
		defer unix.Close(dir) // after the start: the child holds no reference to it
		attr.UseCgroupFD, attr.CgroupFD = true, dir
	}
	outR, outW, err := outputPipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := outputPipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	cmd := &osexec.Cmd{
		Path:        sp.path,
		Args:        sp.args,
		Env:         sp.env,
		Dir:         sp.dir,
		Stdout:      outW, // *os.File: the child writes to the pipe directly, no copying goroutine
		Stderr:      errW,
		ExtraFiles:  sp.extra,
		SysProcAttr: attr,
	}
	p := &proc{
		group:   g,
		life:    tenant.NewLife(),
		ready:   make(chan struct{}),
		done:    make(chan struct{}),
		standby: standby,
		secrets: sp.secrets,
	}
	if m := b.settings.ReadyMarker; m != "" {
		p.marker = []byte(m)
	}
	started := make(chan error, 1)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.own(p, cmd, &pidfd, started, outR, errR)
	}()
	err = <-started
	outW.Close()
	errW.Close()
	if err != nil {
		return nil, err
	}
	return p, nil
}

// outputPipe is a pipe for one of the child's output streams: the read end non-blocking and in the
// netpoller, so that closing it ends a drain's Read; the write end blocking and outside it, as the child
// gets it. (os.Pipe makes both ends pollable, and Start then makes the write end blocking again: four
// syscalls more per pipe on the spawn's critical path.)
func outputPipe() (r, w *os.File, err error) { return pipe(true) }

// pipe is a close-on-exec pipe (a child gets an end only through ExtraFiles or Stdout/Stderr), both
// ends blocking but the read end when readNonblock is set.
func pipe(readNonblock bool) (r, w *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, os.NewSyscallError("pipe2", err)
	}
	if readNonblock {
		if err := unix.SetNonblock(p[0], true); err != nil {
			unix.Close(p[0])
			unix.Close(p[1])
			return nil, nil, os.NewSyscallError("fcntl", err)
		}
	}
	return os.NewFile(uintptr(p[0]), "|0"), os.NewFile(uintptr(p[1]), "|1"), nil
}

// own starts cmd from a thread locked for it (fork.go), reports the start on started, then drains the
// child's output (and reports what the log's rate limit left out), reaps it and ends its Life. pidfd
// is where the start stores the child's pidfd, which own closes.
func (b *Backend) own(p *proc, cmd *osexec.Cmd, pidfd *int, started chan<- error, outR, errR *os.File) {
	var err error
	if dedicated.Add(1) <= maxDedicated.Load() { // a thread of its own (fork.go)
		defer dedicated.Add(-1)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread() // only after the child is reaped
		p.tid = unix.Gettid()
		cmd, err = b.startInto(cmd, p.group)
	} else {
		dedicated.Add(-1)
		p.tid = onForkingThread(func() { cmd, err = b.startInto(cmd, p.group) })
	}
	if err != nil {
		if *pidfd >= 0 {
			unix.Close(*pidfd)
		}
		outR.Close()
		errR.Close()
		started <- startFault(err)
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
	awaitExit(p.pid, *pidfd)
	p.mu.Lock()
	stopping := p.stopping
	p.mu.Unlock()
	var leftovers []int
	if p.group != nil {
		// Everything else in the tenant's cgroup: workers, and what left the process group.
		if pids, err := p.group.Procs(); err == nil {
			leftovers = slices.DeleteFunc(pids, func(pid int) bool { return pid == p.pid })
		}
		ctx, cancel := context.WithTimeout(context.Background(), reapGrace)
		if err := p.group.Kill(ctx); err != nil {
			b.logger().Error("killing what is left in the tenant's cgroup", "pid", p.pid, "err", err)
		}
		cancel()
	} else {
		_ = unix.Kill(-p.pid, syscall.SIGKILL) // leftovers of the group; the leader is a zombie already
		reapGroup(p.pid)
	}
	p.mu.Lock()
	p.reaped = true
	p.mu.Unlock()
	_ = cmd.Wait() // reaps; the status is in cmd.ProcessState
	if p.group != nil {
		b.retire(p.group)
	}

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
	p.failed = p.exit
	if !stopping && len(leftovers) > 0 && p.exit.Signal == 0 && p.exit.Code == 0 {
		p.failed = &DaemonError{PID: p.pid, Leftovers: leftovers, Exit: p.exit}
	}
	p.mu.Lock()
	stopping, why, life, standby := p.stopping, p.stopWhy, p.life, p.standby
	p.mu.Unlock()
	switch {
	case standby && !stopping:
		b.logger().Warn("the standby exited before a wake released it; the next wake spawns", "pid", p.pid, "err", p.failed)
		life.End(p.failed)
	case stopping:
		b.logger().Info("stopped", "pid", p.pid, "status", p.exit.Status(), "leftovers_killed", len(leftovers))
		life.End(why)
	default:
		b.logger().Warn("exited on its own", "pid", p.pid, "err", p.failed, "leftovers_killed", len(leftovers))
		life.End(p.failed)
	}
	close(p.done)
}

// startInto starts cmd, cloned into g when cmd asks for it (SysProcAttr.UseCgroupFD). Where clone3
// is refused with ENOSYS (a seccomp filter: systemd's RestrictNamespaces= blocks clone3 as a whole),
// it starts the child as a plain fork and moves it into g at once; a process the tenant forks before
// the move stays in the activator's cgroup then. That is logged once per Containment. It returns the
// Cmd that started.
func (b *Backend) startInto(cmd *osexec.Cmd, g *cgroup.Group) (*osexec.Cmd, error) {
	err := cmd.Start()
	if g == nil || !errors.Is(err, unix.ENOSYS) {
		return cmd, err
	}
	if b.cont.noClone3.CompareAndSwap(false, true) {
		b.logger().Warn("clone3 is refused here (a seccomp filter, such as systemd's RestrictNamespaces=): each exec tenant is moved into its cgroup just after it starts, and what it forks before that escapes it",
			"err", err)
	}
	attr := *cmd.SysProcAttr
	attr.UseCgroupFD, attr.CgroupFD = false, 0
	retry := &osexec.Cmd{Path: cmd.Path, Args: cmd.Args, Env: cmd.Env, Dir: cmd.Dir, Stdout: cmd.Stdout, Stderr: cmd.Stderr,
		ExtraFiles: cmd.ExtraFiles, SysProcAttr: &attr}
	if err := retry.Start(); err != nil {
		return nil, err
	}
	if err := g.Write("cgroup.procs", strconv.Itoa(retry.Process.Pid)); err != nil {
		_ = unix.Kill(-retry.Process.Pid, unix.SIGKILL)
		_ = retry.Wait()
		return nil, fmt.Errorf("move the child into its cgroup: %w", err)
	}
	return retry, nil
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

// reapGroup reaps the members of process group pgid (but its leader, whom cmd.Wait reaps) that were
// reparented to the activator, its child subreaper, once they have died of the group's SIGKILL: without
// cgroups, that is how a tenant's grandchildren are reaped on sleep. It waits for the group's other
// members to die, at most reapGrace. Only processes of that group are waited for, so no other child
// of the activator (another backing's) loses its exit status.
func reapGroup(pgid int) {
	self := os.Getpid()
	deadline := time.Now().Add(reapGrace)
	for time.Now().Before(deadline) {
		pending := false
		for _, m := range groupMembers(pgid) {
			if m.pid == pgid {
				continue
			}
			switch {
			case m.zombie && m.ppid == self:
				var ws unix.WaitStatus
				_, _ = unix.Wait4(m.pid, &ws, unix.WNOHANG, nil)
			case !m.zombie:
				pending = true // SIGKILLed, not dead yet; or a zombie's parent may die and hand it to us
			}
		}
		if !pending {
			return
		}
		t := time.NewTimer(5 * time.Millisecond) // external process state: nothing to wait on but /proc
		<-t.C
	}
}

type member struct {
	pid, ppid int
	zombie    bool
}

// groupMembers lists the processes of process group pgid, from /proc.
func groupMembers(pgid int) []member {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var ms []member
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// "pid (comm) S ppid pgrp ...": the fields after the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 3 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pgrp, _ := strconv.Atoi(f[2])
		if pgrp == pgid {
			ms = append(ms, member{pid: pid, ppid: ppid, zombie: f[0] == "Z" || f[0] == "X"})
		}
	}
	return ms
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
