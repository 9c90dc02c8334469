//go:build !linux

package health

import "errors"

func newListenSource() (listenSource, error) {
	return nil, errors.New("no listener lookup on this platform")
}
