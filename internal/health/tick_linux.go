package health

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// timerfd is a periodic CLOCK_MONOTONIC timerfd read through an *os.File, so a wait parks the
// goroutine in the netpoller (no thread blocks) and the expiry wakes it without the epoll timeout's
// millisecond rounding.
type timerfd struct {
	fd int
	f  *os.File
}

func newTickSource() (tickSource, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("timerfd_create", err)
	}
	return &timerfd{fd: fd, f: os.NewFile(uintptr(fd), "health-pacer")}, nil
}

func (t *timerfd) set(period time.Duration) error {
	ts := unix.NsecToTimespec(period.Nanoseconds())
	return unix.TimerfdSettime(t.fd, 0, &unix.ItimerSpec{Interval: ts, Value: ts}, nil)
}

func (t *timerfd) arm(period time.Duration) error { return t.set(period) }

// disarm stops the timer; setting it also drops any expiry not yet read.
func (t *timerfd) disarm() { _ = t.set(0) }

func (t *timerfd) wait() error {
	var buf [8]byte // the number of expiries since the last read
	_, err := t.f.Read(buf[:])
	return err
}

// close releases the timerfd; a wait in progress returns an error.
func (t *timerfd) close() error { return t.f.Close() }
