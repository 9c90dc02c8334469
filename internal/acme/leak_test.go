package acme

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests but certmagic's process-wide ones: the
// rate limiter of each CA and account (kept for the process's life), and the refresher of a
// storage lock (gone within 5s of the unlock). The Manager's own, certmagic's maintenance loop,
// must have ended with Run.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/caddyserver/certmagic.(*RingBufferRateLimiter).loop"),
		goleak.IgnoreAnyFunction("github.com/caddyserver/certmagic.keepLockfileFresh"),
	)
}
