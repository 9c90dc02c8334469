package foreign

import (
	"context"
	"net"
	"testing"

	"github.com/activator/activator/internal/testenv"
)

// BenchmarkCheckFree is the check every start of an exec, unit or kvm tenant makes, at a free loopback
// port: the kernel's socket lookup (lookup) against the dial it replaced (dial, what Check does for an
// address the lookup cannot vouch for).
func BenchmarkCheckFree(b *testing.B) {
	addr := testenv.FreeTCP(b).Address
	ctx := context.Background()
	b.Run("lookup", func(b *testing.B) {
		if !freeLoopback(addr) {
			b.Skip("no socket lookups here")
		}
		for b.Loop() {
			if err := Check(ctx, "tcp", addr); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("dial", func(b *testing.B) {
		var d net.Dialer
		for b.Loop() {
			if c, err := d.DialContext(ctx, "tcp", addr); err == nil {
				c.Close()
				b.Fatal("the free port answered")
			}
		}
	})
}
