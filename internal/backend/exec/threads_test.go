package exec

import (
	"bytes"
	"context"
	"errors"
	"os"
	osexec "os/exec"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/activator/activator/internal/testenv"
)

// osThreads is the number of OS threads of this process.
func osThreads(t *testing.T) int {
	t.Helper()
	st, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range bytes.Lines(st) {
		if v, ok := bytes.CutPrefix(line, []byte("Threads:")); ok {
			n, err := strconv.Atoi(string(bytes.TrimSpace(v)))
			if err != nil {
				t.Fatalf("/proc/self/status: %q", line)
			}
			return n
		}
	}
	t.Fatal("/proc/self/status has no Threads line")
	return 0
}

// Running tenants and standbys must not each keep an OS thread of the activator: the Go runtime
// aborts a process beyond 10,000 threads, so a thread per child would let ten thousand woken routes
// (a scanner asking for every host name of a large config) take the activator down, and every
// tenant with it. The first maxDedicated children get a thread each (lowered here to 4); the rest
// share the forking threads. The children are started one after another, so that no burst of
// blocking calls makes the runtime start threads of its own.
func TestTenantsHoldNoThread(t *testing.T) {
	const n, own = 24, 4
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	warm := newFixture(t, testenv.FreeTCP(t), "") // forked on a thread of its own, as the rest may be
	warm.wake(t)
	was := maxDedicated.Swap(own)
	t.Cleanup(func() { maxDedicated.Store(was) })
	before := osThreads(t)
	for range n {
		newFixture(t, testenv.FreeTCP(t), "").wake(t)
		f := newFixture(t, testenv.FreeTCP(t), "standby: true\n")
		f.b.Prepare(ctx)
		if f.standbyPID() == 0 {
			t.Fatal("Prepare started no standby")
		}
	}
	grown := osThreads(t) - before
	t.Logf("%d running tenants and %d standbys: %d OS threads more", n, n, grown)
	if grown >= own+n/4 {
		t.Fatalf("%d running tenants and %d standbys grew the activator by %d OS threads, want fewer than %d", n, n, grown, own+n/4)
	}
}

// awaitExit returns once the child has exited and leaves it to be reaped, with its pidfd in the
// netpoller and with the blocking waitid it falls back to.
func TestAwaitExit(t *testing.T) {
	for _, withPidfd := range []bool{true, false} {
		pidfd := -1
		cmd := osexec.Command("/bin/sh", "-c", "read x; exit 3")
		cmd.SysProcAttr = &syscall.SysProcAttr{PidFD: &pidfd}
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if pidfd < 0 {
			t.Fatal("no pidfd from the start")
		}
		fd := pidfd
		if !withPidfd {
			unix.Close(pidfd)
			fd = -1
		}
		exited := make(chan struct{})
		go func() { awaitExit(cmd.Process.Pid, fd); close(exited) }()
		select {
		case <-exited:
			t.Fatalf("pidfd %v: awaitExit returned while the child runs", withPidfd)
		default:
		}
		in.Close() // the child reads EOF and exits
		<-exited
		if !alive(cmd.Process.Pid) && !zombie(cmd.Process.Pid) {
			t.Errorf("pidfd %v: the child was reaped by awaitExit", withPidfd)
		}
		err = cmd.Wait()
		var ee *osexec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 3 {
			t.Errorf("pidfd %v: Wait after awaitExit: %v, want exit status 3", withPidfd, err)
		}
	}
}

// zombie reports whether pid is an unreaped dead process.
func zombie(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}
