package activator

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/activator/activator/internal/registry"
)

// droppingTenant reads each request's whole body and answers with its length and SHA-256, except the
// second request on any connection, which it reads and then drops: the connection is closed with no
// answer, as a tenant whose keep-alive timeout fires just as a request arrives does (Node's 5 s
// default makes that race common behind a proxy). seen counts the POSTs whose bodies it read whole.
type droppingTenant struct {
	mu    sync.Mutex
	calls map[string]int // requests per connection (RemoteAddr)
	seen  int
	drops int
}

func (d *droppingTenant) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := sha256.New()
	n, err := io.Copy(h, r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if r.Method != http.MethodPost {
		fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
		return
	}
	d.mu.Lock()
	d.seen++
	d.calls[r.RemoteAddr]++
	drop := d.calls[r.RemoteAddr] == 2
	if drop {
		d.drops++
	}
	d.mu.Unlock()
	if drop {
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			c.Close()
			return
		}
	}
	fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
}

// TestBufferedBodyIsRetried: a buffered body can be sent again. When the tenant closes a kept-alive
// connection just as a request with an Idempotency-Key arrives on it, net/http's Transport retries the
// request on a new connection, but only with the request's GetBody to rewind its body; without it the
// client got 502 for a request the tenant never answered. Bodies kept in memory and spilled to a file
// alike, and the spill file is given back once both sends are done.
func TestBufferedBodyIsRetried(t *testing.T) {
	for _, tc := range []struct {
		name string
		size int
	}{{"memory", 500}, {"spilled", 64 << 10}} {
		t.Run(tc.name, func(t *testing.T) {
			tenant := &droppingTenant{calls: map[string]int{}}
			g := newEdgeRig(t, &fakeBackend{}, registry.EdgeLimits{BodyMemory: 1 << 10, BodyTimeout: time.Minute}, tenant, func(r *registry.Route) {
				r.RequestBuffering = true
			})
			g.wake(t) // a GET: the fast path's connection, not the Transport's
			body := bytes.Repeat([]byte("b"), tc.size)
			want := fmt.Sprintf("%d %x", len(body), sha256.Sum256(body))
			for i := range 2 { // the second goes on the Transport's kept-alive connection, and is dropped
				c := g.dial(t)
				if err := send(c, fmt.Sprintf("POST /up HTTP/1.1\nHost: app.test\nIdempotency-Key: k%d\nContent-Length: %d", i, len(body)), body); err != nil {
					t.Fatal(err)
				}
				a, err := answer(c)
				if err != nil {
					t.Fatal(err)
				}
				if a.code != http.StatusOK || a.body != want {
					t.Fatalf("POST %d: %d %q, want 200 %q", i+1, a.code, a.body, want)
				}
			}
			tenant.mu.Lock()
			seen, drops := tenant.seen, tenant.drops
			tenant.mu.Unlock()
			if drops != 1 || seen != 3 {
				t.Fatalf("the tenant read %d bodies and dropped %d connections, want 3 and 1: the retry did not happen as set up", seen, drops)
			}
			until(t, func() (bool, string) {
				files, bytes := g.s.spills.InUse()
				return files == 0 && bytes == 0, fmt.Sprintf("%d spill files, %d bytes in use after the uploads, want none", files, bytes)
			})
		})
	}
}
