package warmloop

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The loop's system calls on its sockets and its epoll fd, made raw: without telling Go's scheduler
// that the goroutine is in a system call (entersyscall, exitsyscall). Every one of them is
// non-blocking and takes microseconds. Told, the runtime's monitor (sysmon) sees the loop's P in a
// system call whenever the kernel preempts the loop's thread inside one (writing to a socket wakes
// the reader, which on a shared CPU may run at once), wakes every 20 µs to look, takes the P away and
// hands it to another thread, which the loop's thread then has to win back. Measured on the warm path
// pinned at c64 (the activator and the app on one CPU), session 33: perf's sched_switch put 37% of the
// activator's context switches in sysmon's sleeps and 10% in futex waits for a P; made raw, the
// activator's context switches (all its threads, /proc) went from 0.21 and 0.18 a request to 0.09 and
// 0.08 (HAProxy's: 0.05). At c16 they stayed at 0.19. The req/s it gains is within the box's noise
// (docs/benchmarks.md, session 33).
//
// The errors are unix.Errno values, as the unix package's functions return them; n is meaningless
// when err is not nil.

func rawRead(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(bufPtr(p)), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func rawWrite(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(bufPtr(p)), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// rawPeek peeks at fd's next byte without waiting (recv with MSG_PEEK|MSG_DONTWAIT).
func rawPeek(fd int, b *[1]byte) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 1,
		uintptr(unix.MSG_PEEK|unix.MSG_DONTWAIT), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// rawEpollReady takes the events ready on ep now, without waiting (epoll_pwait, no signal mask).
func rawEpollReady(ep int, evs []unix.EpollEvent) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&evs[0])), uintptr(len(evs)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func bufPtr(p []byte) unsafe.Pointer {
	if len(p) == 0 {
		return nil
	}
	return unsafe.Pointer(&p[0])
}
