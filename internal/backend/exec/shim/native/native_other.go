//go:build !(linux && amd64)

package native

// Open returns ErrUnsupported: this package holds an executable for linux/amd64 only.
func Open() (*Shim, error) { return nil, ErrUnsupported }

// Close does nothing.
func (s *Shim) Close() error { return nil }
