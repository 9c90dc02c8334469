package bodybuf_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/activator/activator/internal/bodybuf"
)

// The edge reads the body before the request takes an upstream slot, then swaps the replay in.
func ExampleRead() {
	o := bodybuf.Options{Memory: 64 << 10, Dir: "", Max: 100 << 20, Idle: 30 * time.Second}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := bodybuf.Read(w, r, o)
		switch {
		case errors.Is(err, bodybuf.ErrTooLarge):
			http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
			return
		case errors.Is(err, bodybuf.ErrIdle):
			http.Error(w, err.Error(), http.StatusRequestTimeout)
			return
		case err != nil:
			http.Error(w, "bad request body", http.StatusBadRequest)
			return
		}
		defer b.Close()
		if b == nil {
			r.Body, r.ContentLength = http.NoBody, 0
		} else {
			r.Body, r.ContentLength = b, b.Len()
		}
		r.TransferEncoding = nil // the length is known now

		// ... hold, take the upstream slot and proxy r ...
		fmt.Println(r.ContentLength, "bytes,", b.InMemory(), "in memory")
	})
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", strings.NewReader("hello, tenant")))
	// Output: 13 bytes, 13 in memory
}
