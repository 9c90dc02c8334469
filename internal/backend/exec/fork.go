package exec

import (
	"errors"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Every child is forked with its parent-death signal set, and its exit is awaited through a pidfd in
// the netpoller, so no thread blocks waiting for it. Linux sends the parent-death signal (Pdeathsig)
// when the *thread* that forked the child exits, not the process, and the Go runtime ends a thread
// when a goroutine locked to it exits; so a child's forking thread must stay locked to a goroutine
// that outlives the child. There are two ways, taken in this order:
//
//   - Its own thread: the child's owner goroutine locks the thread it runs on, forks, and stays
//     locked until the child is reaped. The fork costs no hand-over between threads, which a cold
//     wake would wait for; at most maxDedicated children at once are forked this way.
//   - A shared forking thread: beyond maxDedicated, one of a few threads locked to goroutines that
//     never return (they end only with the activator, even one SIGKILLed, which is exactly when the
//     children must die) forks it, and the owner goroutine holds no thread.
//
// So the activator's threads stay bounded however many tenants run: the Go runtime aborts a process
// beyond 10,000 threads (runtime/debug.SetMaxThreads), and with a thread per child, ten thousand woken
// routes (a client asking for every host name of a large config) would take the activator, and every
// tenant with it, down.

// maxDedicated bounds the children forked on a thread of their own at once: 256 (tests lower it).
// Each costs the activator an OS thread for the child's life (12–17 KiB of its RSS each, measured
// with 500 tenants, and the kernel's stack), and saves a cold wake two hand-overs between threads,
// which cost 0.07–0.37 ms of its overhead in six paired runs (docs/benchmarks.md, session 14).
var maxDedicated atomic.Int64

func init() { maxDedicated.Store(256) }

// dedicated counts the children forked on a thread of their own that have not been reaped.
var dedicated atomic.Int64

// maxForkers bounds the forking threads. One more starts while every one is busy forking (a fork
// waits for the child's execve), so a burst of wakes does not queue behind one slow exec; they are
// never ended, because their children depend on them.
const maxForkers = 16

var (
	forkJobs = make(chan forkJob) // unbuffered: a send succeeds when a forker is idle
	forkMu   sync.Mutex
	forkers  int // forking threads started, guarded by forkMu
)

type forkJob struct {
	fn  func()
	tid chan<- int
}

// onForkingThread runs fn on one of the forking threads and returns that thread's id: what fn
// forks keeps its parent-death signal tied to a thread that lives as long as the activator.
func onForkingThread(fn func()) int {
	tid := make(chan int, 1)
	job := forkJob{fn: fn, tid: tid}
	select {
	case forkJobs <- job:
	default:
		forkMu.Lock()
		if forkers < maxForkers {
			forkers++
			go forkLoop()
		}
		forkMu.Unlock()
		forkJobs <- job
	}
	return <-tid
}

// forkLoop is a shared forking thread: it locks its OS thread and never returns.
func forkLoop() {
	runtime.LockOSThread() // never unlocked: the thread must outlive every child it forked
	tid := unix.Gettid()
	for job := range forkJobs {
		job.fn()
		job.tid <- tid
	}
}

// awaitExit returns once the child pid has exited, leaving it unreaped: a zombie's pid, its process
// group's id, cannot be reused while the group's stragglers are killed. With the child's pidfd
// (pidfd ≥ 0, closed here) the wait is in the netpoller and holds no thread; without one (a kernel
// older than 5.3), or where the pidfd cannot be polled, a thread blocks in waitid.
func awaitExit(pid, pidfd int) {
	if pidfd >= 0 && awaitPidfd(pidfd) == nil {
		return
	}
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// errNotPollable: the pidfd could not be put in the netpoller.
var errNotPollable = errors.New("pidfd not pollable")

// awaitPidfd waits, in the netpoller, until the process of pidfd has exited (it becomes readable
// then), and closes pidfd. An error means the caller must wait another way.
func awaitPidfd(pidfd int) error {
	if err := unix.SetNonblock(pidfd, true); err != nil {
		unix.Close(pidfd)
		return err
	}
	f := os.NewFile(uintptr(pidfd), "pidfd") // non-blocking: NewFile puts it in the netpoller
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	err = rc.Read(func(fd uintptr) bool {
		var info unix.Siginfo
		werr = unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOWAIT|unix.WNOHANG, nil)
		switch {
		case errors.Is(werr, unix.EINTR), errors.Is(werr, unix.EAGAIN):
			werr = nil
		case werr != nil:
			return true
		case info.Signo != 0: // WNOHANG leaves the siginfo zeroed while the child runs
			return true
		}
		return false // not yet: wait until the pidfd is readable
	})
	if err != nil {
		// A descriptor the netpoller refused: Read cannot wait on it.
		return errors.Join(errNotPollable, err)
	}
	return werr
}
