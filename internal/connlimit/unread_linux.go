package connlimit

import (
	"errors"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// unreadBytes is how many bytes c's socket has received that nobody has read (SIOCINQ, as FIONREAD).
func unreadBytes(c net.Conn) (int, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, errors.ErrUnsupported
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var ioErr error
	if err := raw.Control(func(fd uintptr) { n, ioErr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil {
		return 0, err
	}
	return n, ioErr
}
