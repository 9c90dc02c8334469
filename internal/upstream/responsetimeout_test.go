package upstream

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestResponseTimeout: Options.ResponseTimeout bounds the wait for the answer's head, from the start
// of the exchange, on either path, and nothing after the head: a tenant that takes the request and
// never answers fails it with ErrResponseTimeout (not retried), one whose head comes in time streams
// its body for as long as it likes. Found with the real binary: a tenant that hung on a request held
// its client for ever, and, counted in flight, was never put to sleep. The connections are pipes, so
// the test runs on synctest's clock.
func TestResponseTimeout(t *testing.T) {
	const bound = 30 * time.Second
	answer := func(head time.Duration, rest time.Duration) func(b net.Conn) {
		return func(b net.Conn) {
			time.Sleep(head)
			io.WriteString(b, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345")
			time.Sleep(rest)
			io.WriteString(b, "67890")
		}
	}
	never := func(net.Conn) {}
	cases := []struct {
		name     string
		timeout  time.Duration
		post     bool          // a request with a body: the ReverseProxy's path
		readLate time.Duration // the tenant reads the request this late (the pipe blocks the write till then)
		tenant   func(b net.Conn)
		leave    time.Duration // the client leaves this long after the start (0: never)
		want     error         // nil: 200 with the whole body
		took     time.Duration
	}{
		{name: "no answer", timeout: bound, tenant: never, want: ErrResponseTimeout, took: bound},
		{name: "no answer, proxy path", timeout: bound, post: true, tenant: never, want: ErrResponseTimeout, took: bound},
		{name: "request read late, no answer", timeout: bound, readLate: 20 * time.Second, tenant: never, want: ErrResponseTimeout, took: bound},
		{name: "head past the grace, body past the bound", timeout: bound, tenant: answer(10*time.Second, time.Minute), took: 70 * time.Second},
		{name: "the same, proxy path", timeout: bound, post: true, tenant: answer(10*time.Second, time.Minute), took: 70 * time.Second},
		{name: "head at once, body past the bound", timeout: bound, tenant: answer(0, time.Minute), took: time.Minute},
		{name: "no bound", tenant: answer(time.Hour, 0), took: time.Hour},
		{name: "client leaves first", timeout: bound, tenant: never, leave: 5 * time.Second, want: context.Canceled, took: 5 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var failure error
				c := New(Options{Network: "tcp", Address: "127.0.0.1:1", MaxConns: 4, ResponseTimeout: tc.timeout,
					ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
						failure = err
						w.WriteHeader(http.StatusGatewayTimeout)
					}})
				a, b := net.Pipe()
				defer b.Close()
				if tc.post {
					c.transport.DialContext = func(context.Context, string, string) (net.Conn, error) { return a, nil }
				} else {
					c.Adopt(a)
				}
				go func() {
					time.Sleep(tc.readLate)
					br := bufio.NewReader(b)
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					tc.tenant(b)
				}()

				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tc.leave > 0 {
					time.AfterFunc(tc.leave, cancel)
				}
				var body io.Reader
				if tc.post {
					body = strings.NewReader("form=1")
				}
				r := httptest.NewRequest(http.MethodGet, "http://app.test/", body).WithContext(ctx)
				if tc.post {
					r.Method = http.MethodPost
				}
				w := httptest.NewRecorder()
				start := time.Now()
				c.Serve(w, r)
				took := time.Since(start)
				b.Close()
				c.CloseIdle()
				synctest.Wait()

				switch {
				case tc.want == nil && (failure != nil || w.Code != http.StatusOK || w.Body.String() != "1234567890"):
					t.Errorf("answer %d %q, error %v; want 200 and the whole body", w.Code, w.Body, failure)
				case tc.want != nil && !errors.Is(failure, tc.want):
					t.Errorf("error %v, want %v", failure, tc.want)
				case tc.want != context.Canceled && errors.Is(failure, ErrResponseTimeout) != (tc.want == ErrResponseTimeout):
					t.Errorf("error %v", failure)
				}
				if took != tc.took {
					t.Errorf("the request took %v, want %v", took, tc.took)
				}
			})
		})
	}
}
