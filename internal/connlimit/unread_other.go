//go:build !linux

package connlimit

import (
	"errors"
	"net"
)

// unreadBytes is not known here: every connection that looks idle may be closed for room.
func unreadBytes(net.Conn) (int, error) { return 0, errors.ErrUnsupported }
