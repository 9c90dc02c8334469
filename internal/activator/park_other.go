//go:build !linux

package activator

// hangups is park_linux.go's watcher; elsewhere each parked request watches its own connection.
type hangups struct{}

func newHangups() *hangups                         { return nil }
func (h *hangups) add(p *parkedReq) bool           { return false }
func (h *hangups) remove(p *parkedReq) (gone bool) { return false }
func (h *hangups) close()                          {}
