//go:build !linux

package health

import "errors"

func newTickSource() (tickSource, error) {
	return nil, errors.New("no precise tick source on this platform")
}
