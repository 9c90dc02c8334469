package bodybuf_test

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/activator/activator/internal/bodybuf"
)

// status maps Read's outcome as the edge's errors.go does.
func status(err error) int {
	switch {
	case err == nil:
		return http.StatusOK
	case errors.Is(err, bodybuf.ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, bodybuf.ErrIdle):
		return http.StatusRequestTimeout
	default:
		return http.StatusBadRequest
	}
}

// checkFunc inspects Read's outcome inside the handler, while the request is still open. It reports
// with t.Errorf (not Fatal: it runs on the handler's goroutine).
type checkFunc func(t *testing.T, r *http.Request, b *bodybuf.Body, err error)

// handler calls Read with o, runs check, closes the Body and answers status(err).
func handler(t *testing.T, o bodybuf.Options, check checkFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := bodybuf.Read(w, r, o)
		check(t, r, b, err)
		if cerr := b.Close(); cerr != nil {
			t.Errorf("Close: %v", cerr)
		}
		w.WriteHeader(status(err))
	})
}

// server is an HTTP/1.1 server running handler(t, o, check), closed (and its handlers joined) at
// the end of the test.
func server(t *testing.T, o bodybuf.Options, check checkFunc) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(handler(t, o, check))
	t.Cleanup(ts.Close)
	return ts
}

// dial opens a raw connection to ts. Its deadline fails a test that would otherwise hang; no
// assertion depends on it.
func dial(t *testing.T, ts *httptest.Server) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

func send(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatalf("send: %v", err)
	}
}

func readResponse(t *testing.T, br *bufio.Reader) *http.Response {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("reading the response body: %v", err)
	}
	return resp
}

// openIn counts this process's open descriptors of files in dir, and how many of those files are
// already unlinked. It reads /proc/self/fd, so it works on Linux only.
func openIn(t *testing.T, dir string) (open, unlinked int) {
	t.Helper()
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Errorf("EvalSymlinks: %v", err)
		return 0, 0
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Errorf("reading /proc/self/fd: %v", err)
		return 0, 0
	}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || !strings.HasPrefix(target, dir+string(filepath.Separator)) {
			continue // closed meanwhile, or not ours
		}
		open++
		if strings.HasSuffix(target, " (deleted)") {
			unlinked++
		}
	}
	return open, unlinked
}

func dirEntries(t *testing.T, dir string) int {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Errorf("reading %s: %v", dir, err)
	}
	return len(ents)
}

func randomBytes(n int) []byte {
	var seed [32]byte
	copy(seed[:], "bodybuf")
	p := make([]byte, n)
	_, _ = rand.NewChaCha8(seed).Read(p) // never fails
	return p
}

func sum(p []byte) string {
	h := sha256.Sum256(p)
	return hex.EncodeToString(h[:])
}

// TestRoundTrip sends bodies through a real server and checks, inside the handler, that the Body
// replays them byte for byte, whether they were kept in memory or spilled, and that a spilled body's
// file is unlinked before Close and closed by it.
func TestRoundTrip(t *testing.T) {
	const memory = 64 << 10
	big := randomBytes(10 << 20)
	tests := []struct {
		name    string
		size    int
		chunked bool
		memory  int64
		spilled bool
	}{
		{name: "small declared", size: 1000, memory: memory},
		{name: "small chunked", size: 1000, chunked: true, memory: memory},
		{name: "exactly memory declared", size: memory, memory: memory},
		{name: "exactly memory chunked", size: memory, chunked: true, memory: memory},
		{name: "memory+1 declared", size: memory + 1, memory: memory, spilled: true},
		{name: "memory+1 chunked", size: memory + 1, chunked: true, memory: memory, spilled: true},
		{name: "10MiB declared", size: 10 << 20, memory: memory, spilled: true},
		{name: "10MiB chunked", size: 10 << 20, chunked: true, memory: memory, spilled: true},
		{name: "one byte, memory 0", size: 1, memory: 0, spilled: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			want := big[:tt.size]
			o := bodybuf.Options{Memory: tt.memory, Dir: dir, Idle: 5 * time.Second}
			ts := server(t, o, func(t *testing.T, r *http.Request, b *bodybuf.Body, err error) {
				if err != nil {
					t.Errorf("Read: %v", err)
					return
				}
				if got := r.ContentLength == -1; got != tt.chunked {
					t.Errorf("request chunked = %v, want %v", got, tt.chunked)
				}
				if got := b.Len(); got != int64(tt.size) {
					t.Errorf("Len() = %d, want %d", got, tt.size)
				}
				switch mem := b.InMemory(); {
				case tt.spilled && mem != 0:
					t.Errorf("InMemory() = %d, want 0 for a spilled body", mem)
				case !tt.spilled && !tt.chunked && mem != int64(tt.size):
					t.Errorf("InMemory() = %d, want Len() = %d", mem, tt.size)
				case !tt.spilled && tt.chunked && (mem < int64(tt.size) || mem > tt.memory):
					t.Errorf("InMemory() = %d, want between Len() = %d and Memory = %d", mem, tt.size, tt.memory)
				}
				if n := dirEntries(t, dir); n != 0 {
					t.Errorf("%d files in Dir before Close, want 0 (unlinked at creation)", n)
				}
				if runtime.GOOS == "linux" {
					open, unlinked := openIn(t, dir)
					wantOpen := 0
					if tt.spilled {
						wantOpen = 1
					}
					if open != wantOpen || unlinked != wantOpen {
						t.Errorf("open files in Dir: %d (%d unlinked), want %d (%d)", open, unlinked, wantOpen, wantOpen)
					}
				}
				h := sha256.New()
				if _, err := io.Copy(h, b); err != nil {
					t.Errorf("replaying: %v", err)
				}
				if got := hex.EncodeToString(h.Sum(nil)); got != r.Header.Get("X-Sha256") {
					t.Errorf("replayed sha256 %s, sent %s", got, r.Header.Get("X-Sha256"))
				}
				if err := b.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				if runtime.GOOS == "linux" {
					if open, _ := openIn(t, dir); open != 0 {
						t.Errorf("%d files in Dir still open after Close, want 0", open)
					}
				}
			})
			var body io.Reader = bytes.NewReader(want)
			if tt.chunked {
				body = io.MultiReader(body) // hides the length: the client sends it chunked
			}
			req, err := http.NewRequest(http.MethodPost, ts.URL, body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Sha256", sum(want))
			resp, err := ts.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("status %d, want 200", resp.StatusCode)
			}
			if n := dirEntries(t, dir); n != 0 {
				t.Errorf("%d files left in Dir, want 0", n)
			}
		})
	}
}

// TestReplay checks the Body against testing/iotest's reader conformance test, in memory and spilled.
func TestReplay(t *testing.T) {
	data := randomBytes(100 << 10)
	for _, memory := range []int64{1 << 20, 1 << 10} {
		t.Run(fmt.Sprintf("memory %d", memory), func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(data))
			b, err := bodybuf.Read(nil, r, bodybuf.Options{Memory: memory, Dir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if err := iotest.TestReader(b, data); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestReplayAfterClose: Replay, the request's GetBody, gives the whole body again from the start,
// also after the Body it came from was half read and closed (http.Transport closes the Body it sent
// before it calls GetBody). The memory or spill file is kept, and counted in Spills, until the last of
// the Body and its replays closes, and not a moment longer; a Replay after that fails.
func TestReplayAfterClose(t *testing.T) {
	data := randomBytes(100 << 10)
	for _, memory := range []int64{1 << 20, 1 << 10} {
		t.Run(fmt.Sprintf("memory %d", memory), func(t *testing.T) {
			dir := t.TempDir()
			spills := &bodybuf.Spills{}
			r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(data))
			b, err := bodybuf.Read(nil, r, bodybuf.Options{Memory: memory, Dir: dir, Spills: spills})
			if err != nil {
				t.Fatal(err)
			}
			spilled := memory < int64(len(data))
			inUse := func(when string, want bool) {
				t.Helper()
				files, n := spills.InUse()
				if got := files == 1 && n == int64(len(data)); spilled && got != want {
					t.Errorf("%s: %d spill files, %d bytes in use; want the body's file counted: %v", when, files, n, want)
				}
				if open, _ := openIn(t, dir); spilled && (open == 1) != want {
					t.Errorf("%s: %d files open in Dir; want the body's open: %v", when, open, want)
				}
			}
			if _, err := io.ReadFull(b, make([]byte, 1000)); err != nil {
				t.Fatal(err)
			}
			again, err := b.Replay()
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			inUse("the Body closed, its replay open", true)
			third, err := b.Replay() // a Body closed still replays while a replay holds the bytes
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup // two replays read at once (run with -race)
			for _, rc := range []io.Reader{again, third} {
				wg.Go(func() {
					if err := iotest.TestReader(rc, data); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			if err := again.Close(); err != nil {
				t.Fatal(err)
			}
			inUse("one replay open", true)
			if err := third.Close(); err != nil {
				t.Fatal(err)
			}
			if err := third.Close(); err != nil { // a second Close gives nothing back twice
				t.Fatal(err)
			}
			inUse("all closed", false)
			if files, n := spills.InUse(); files != 0 || n != 0 {
				t.Errorf("all closed: %d spill files, %d bytes in use, want none", files, n)
			}
			if rc, err := b.Replay(); !errors.Is(err, http.ErrBodyReadAfterClose) {
				t.Errorf("Replay after every Body closed = %v, %v; want http.ErrBodyReadAfterClose", rc, err)
			}
		})
	}
	var empty *bodybuf.Body
	if rc, err := empty.Replay(); rc != http.NoBody || err != nil {
		t.Errorf("nil Body's Replay = %v, %v; want http.NoBody, nil", rc, err)
	}
}

// TestNoReadAfterEOF: Read stops at the first io.EOF, also when it comes with the last bytes (as
// net/http's does for a declared length) and those bytes start a spill file.
func TestNoReadAfterEOF(t *testing.T) {
	for _, tt := range []struct {
		name     string
		memory   int64
		declared int64
	}{
		{"in memory, declared", 1 << 10, 3},
		{"in memory, chunked", 1 << 10, -1},
		{"spilled, declared", 0, 3},
		{"spilled, chunked", 0, -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			eof := false
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.ContentLength = tt.declared
			r.Body = io.NopCloser(readFunc(func(p []byte) (int, error) {
				if eof {
					t.Error("read after io.EOF")
					return 0, io.EOF
				}
				eof = true
				return copy(p, "abc"), io.EOF
			}))
			b, err := bodybuf.Read(nil, r, bodybuf.Options{Memory: tt.memory, Dir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if got, err := io.ReadAll(b); string(got) != "abc" || err != nil {
				t.Errorf("replayed %q, %v; want \"abc\"", got, err)
			}
		})
	}
}

// TestNoBody: a request without a body gives a nil Body, without reading or allocating, and a nil
// Body is a valid empty one.
func TestNoBody(t *testing.T) {
	tests := []struct {
		name string
		req  func() *http.Request
	}{
		{"nil Body", func() *http.Request {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.Body = nil
			return r
		}},
		{"http.NoBody", func() *http.Request { return httptest.NewRequest(http.MethodGet, "/", nil) }},
		{"ContentLength 0 with a Body (HTTP/2)", func() *http.Request {
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Body = io.NopCloser(iotest.ErrReader(errors.New("read")))
			r.ContentLength = 0
			return r
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.req()
			o := bodybuf.Options{Memory: 64 << 10, Max: 1 << 20, Idle: time.Second}
			b, err := bodybuf.Read(nil, r, o)
			if b != nil || err != nil {
				t.Fatalf("Read = %v, %v; want nil, nil", b, err)
			}
			allocs := testing.AllocsPerRun(100, func() { _, _ = bodybuf.Read(nil, r, o) })
			if allocs != 0 {
				t.Errorf("Read allocates %v times, want 0", allocs)
			}
			if n, err := b.Read(make([]byte, 1)); n != 0 || err != io.EOF {
				t.Errorf("nil Body Read = %d, %v; want 0, io.EOF", n, err)
			}
			if b.Len() != 0 || b.InMemory() != 0 || b.Close() != nil {
				t.Errorf("nil Body: Len %d, InMemory %d, want 0, 0, and Close nil", b.Len(), b.InMemory())
			}
		})
	}
}

// TestRaw drives the server over raw connections: limits, malformed and stalled bodies. Every
// request that fails must get its answer with "Connection: close", even while its client still
// holds the rest of the body back.
func TestRaw(t *testing.T) {
	const max = 1000
	chunk := func(n int) string { return fmt.Sprintf("%x\r\n%s\r\n", n, strings.Repeat("x", n)) }
	tests := []struct {
		name    string
		idle    time.Duration
		request string // sent as is; without a body's end, the client stalls
		want    int
		wantErr error // errors.Is target; nil: none
		wantLen int64
	}{
		{
			name:    "declared over max, body never sent",
			request: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1001\r\n\r\n",
			want:    413, wantErr: bodybuf.ErrTooLarge,
		},
		{
			name:    "declared over max, expecting 100-continue",
			request: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1001\r\nExpect: 100-continue\r\n\r\n",
			want:    413, wantErr: bodybuf.ErrTooLarge,
		},
		{
			name:    "declared at max",
			request: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n" + strings.Repeat("x", max),
			want:    200, wantLen: max,
		},
		{
			name:    "chunked at max",
			request: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(600) + chunk(400) + "0\r\n\r\n",
			want:    200, wantLen: max,
		},
		{
			name:    "chunked over max, client stalls after",
			request: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(600) + chunk(401),
			want:    413, wantErr: bodybuf.ErrTooLarge,
		},
		{
			name:    "chunked, empty",
			request: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
			want:    200, wantLen: 0,
		},
		{
			name:    "declared, one byte then idle",
			idle:    200 * time.Millisecond,
			request: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nx",
			want:    408, wantErr: bodybuf.ErrIdle,
		},
		{
			name:    "chunked, mid-chunk then idle",
			idle:    200 * time.Millisecond,
			request: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
			want:    408, wantErr: bodybuf.ErrIdle,
		},
		{
			name:    "malformed chunk size",
			request: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n",
			want:    400,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := bodybuf.Options{Memory: 64 << 10, Dir: t.TempDir(), Max: max, Idle: tt.idle}
			ts := server(t, o, func(t *testing.T, r *http.Request, b *bodybuf.Body, err error) {
				switch {
				case tt.want == 200 && err != nil:
					t.Errorf("Read: %v", err)
				case tt.want != 200 && err == nil:
					t.Errorf("Read succeeded, want an error")
				case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
					t.Errorf("Read: %v, want %v", err, tt.wantErr)
				case tt.wantErr == nil && (errors.Is(err, bodybuf.ErrTooLarge) || errors.Is(err, bodybuf.ErrIdle)):
					t.Errorf("Read: %v, want neither sentinel", err)
				}
				if got := b.Len(); got != tt.wantLen {
					t.Errorf("Len() = %d, want %d", got, tt.wantLen)
				}
			})
			c, br := dial(t, ts)
			send(t, c, tt.request)
			resp := readResponse(t, br)
			if resp.StatusCode != tt.want {
				t.Errorf("status %d, want %d", resp.StatusCode, tt.want)
			}
			if wantClose := tt.want != 200; resp.Close != wantClose {
				t.Errorf("response closes the connection: %v, want %v", resp.Close, wantClose)
			}
		})
	}
}

// TestTooLargeStalledClientReleased: after a 413 for a chunked body the client never finishes, the
// server still reads some of the body after the handler (net/http looks for its end); the read
// deadline Read left in place ends that, and the connection closes.
func TestTooLargeStalledClientReleased(t *testing.T) {
	o := bodybuf.Options{Memory: 64 << 10, Max: 10, Idle: 300 * time.Millisecond}
	ts := server(t, o, func(t *testing.T, _ *http.Request, _ *bodybuf.Body, err error) {
		if !errors.Is(err, bodybuf.ErrTooLarge) {
			t.Errorf("Read: %v, want ErrTooLarge", err)
		}
	})
	c, br := dial(t, ts)
	send(t, c, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n0123456789abcdef\r\n")
	if resp := readResponse(t, br); resp.StatusCode != 413 {
		t.Fatalf("status %d, want 413", resp.StatusCode)
	}
	// Without the deadline this read would wait for the test's guard and fail with a timeout.
	if n, err := br.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("after the 413: read %d bytes, %v; want the connection closed", n, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestDeclaredTooLargeReadsNothing: a declared length over Max fails before the first read.
func TestDeclaredTooLargeReadsNothing(t *testing.T) {
	var reads int
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Body = io.NopCloser(readFunc(func(p []byte) (int, error) { reads++; return 0, io.EOF }))
	r.ContentLength = 101
	w := httptest.NewRecorder()
	b, err := bodybuf.Read(w, r, bodybuf.Options{Max: 100, Idle: time.Second})
	if b != nil || !errors.Is(err, bodybuf.ErrTooLarge) {
		t.Errorf("Read = %v, %v; want nil, ErrTooLarge", b, err)
	}
	if reads != 0 {
		t.Errorf("%d reads of the body, want 0", reads)
	}
	if got := w.Header().Get("Connection"); got != "close" {
		t.Errorf("Connection header %q, want close", got)
	}
}

type readFunc func([]byte) (int, error)

func (f readFunc) Read(p []byte) (int, error) { return f(p) }

// TestClientGone: a client that ends its body early gets neither sentinel; the cause is wrapped.
func TestClientGone(t *testing.T) {
	ts := server(t, bodybuf.Options{Memory: 64 << 10, Idle: 5 * time.Second},
		func(t *testing.T, _ *http.Request, b *bodybuf.Body, err error) {
			if !errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, bodybuf.ErrIdle) || errors.Is(err, bodybuf.ErrTooLarge) {
				t.Errorf("Read: %v, want a wrapped io.ErrUnexpectedEOF", err)
			}
		})
	c, br := dial(t, ts)
	send(t, c, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n0123456789")
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if resp := readResponse(t, br); resp.StatusCode != 400 {
		t.Errorf("status %d, want 400", resp.StatusCode)
	}
}

// TestHTTP2 runs a round trip and an idle client over HTTP/2, where the read deadline is the
// stream's, and where Read must not ask to close the connection other streams share.
func TestHTTP2(t *testing.T) {
	data := randomBytes(200 << 10)
	tests := []struct {
		name  string
		stall bool
		want  int
	}{
		{name: "round trip", want: 200},
		{name: "one byte then idle", stall: true, want: 408},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := bodybuf.Options{Memory: 64 << 10, Dir: t.TempDir(), Idle: 200 * time.Millisecond}
			if !tt.stall {
				o.Idle = 5 * time.Second
			}
			ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, err := bodybuf.Read(w, r, o)
				if r.ProtoMajor != 2 {
					t.Errorf("request over HTTP/%d, want 2", r.ProtoMajor)
				}
				if tt.stall && !errors.Is(err, bodybuf.ErrIdle) {
					t.Errorf("Read: %v, want ErrIdle", err)
				}
				if got := w.Header().Get("Connection"); got != "" {
					t.Errorf("Connection header %q on HTTP/2, want none", got)
				}
				if err == nil {
					got, rerr := io.ReadAll(b)
					if rerr != nil || !bytes.Equal(got, data) {
						t.Errorf("replayed %d bytes (%v), want the %d sent", len(got), rerr, len(data))
					}
				}
				if err := b.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				w.WriteHeader(status(err))
			}))
			ts.EnableHTTP2 = true
			ts.StartTLS()
			t.Cleanup(ts.Close)

			var body io.Reader = bytes.NewReader(data)
			var wg sync.WaitGroup
			pr, pw := io.Pipe()
			if tt.stall {
				body = pr
				wg.Go(func() { _, _ = pw.Write([]byte("x")) }) // then holds the rest back
			}
			req, err := http.NewRequest(http.MethodPost, ts.URL, body)
			if err != nil {
				t.Fatal(err)
			}
			client := ts.Client()
			client.Timeout = 10 * time.Second // fails a test that would otherwise hang
			resp, err := client.Do(req)
			pw.CloseWithError(errors.New("test over"))
			wg.Wait()
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.ProtoMajor != 2 || resp.StatusCode != tt.want {
				t.Errorf("HTTP/%d %d, want HTTP/2 %d", resp.ProtoMajor, resp.StatusCode, tt.want)
			}
		})
	}
}

// TestClose: Close releases memory or file even before the body was replayed, and may be called
// twice, or concurrently with Read.
func TestClose(t *testing.T) {
	data := randomBytes(100 << 10)
	for _, tt := range []struct {
		name   string
		memory int64
	}{{"in memory", 1 << 20}, {"spilled", 0}} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(data))
			b, err := bodybuf.Read(nil, r, bodybuf.Options{Memory: tt.memory, Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(b, make([]byte, 1000)); err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				if err := b.Close(); err != nil {
					t.Errorf("Close #%d: %v", i+1, err)
				}
			}
			if n, err := b.Read(make([]byte, 10)); n != 0 || !errors.Is(err, http.ErrBodyReadAfterClose) {
				t.Errorf("Read after Close = %d, %v; want 0, http.ErrBodyReadAfterClose", n, err)
			}
			if b.Len() != int64(len(data)) {
				t.Errorf("Len() after Close = %d, want %d", b.Len(), len(data))
			}
			if runtime.GOOS == "linux" {
				if open, _ := openIn(t, dir); open != 0 {
					t.Errorf("%d files in Dir open after Close, want 0", open)
				}
			}
		})
		t.Run(tt.name+", concurrent with Read", func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(data))
			b, err := bodybuf.Read(nil, r, bodybuf.Options{Memory: tt.memory, Dir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			wg.Go(func() {
				p := make([]byte, 100)
				for {
					if _, err := b.Read(p); err != nil {
						if err != io.EOF && !errors.Is(err, http.ErrBodyReadAfterClose) {
							t.Errorf("Read: %v", err)
						}
						return
					}
				}
			})
			if err := b.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			wg.Wait()
		})
	}
}

// TestSpillFails: a spill directory that does not exist is reported, wrapped, and is no sentinel.
func TestSpillFails(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("x"))
	b, err := bodybuf.Read(nil, r, bodybuf.Options{Dir: filepath.Join(t.TempDir(), "missing")})
	if b != nil || !errors.Is(err, fs.ErrNotExist) || errors.Is(err, bodybuf.ErrIdle) || errors.Is(err, bodybuf.ErrTooLarge) {
		t.Errorf("Read = %v, %v; want nil and a wrapped fs.ErrNotExist", b, err)
	}
}

// deadlineWriter is a ResponseWriter whose read deadline http.ResponseController can set; the
// benchmark's stands for the server's.
type deadlineWriter struct {
	*httptest.ResponseRecorder
	set func(time.Time)
}

func (w deadlineWriter) SetReadDeadline(d time.Time) error {
	if w.set != nil {
		w.set(d)
	}
	return nil
}

// replayBody is a request body the benchmark rewinds. Like net/http's, it returns io.EOF with the
// last bytes of a body of declared length.
type replayBody struct {
	data    []byte
	off     int
	chunked bool
}

func (r *replayBody) Read(p []byte) (int, error) {
	if r.off == len(r.data) {
		return 0, io.EOF
	}
	n := copy(p, r.data[r.off:])
	r.off += n
	if r.off == len(r.data) && !r.chunked {
		return n, io.EOF
	}
	return n, nil
}

func (*replayBody) Close() error { return nil }

// BenchmarkReadSmall reads a 1 KiB body into memory, with an idle bound, as the edge reads most
// bodies.
func BenchmarkReadSmall(b *testing.B) {
	for _, chunked := range []bool{false, true} {
		b.Run("chunked="+strconv.FormatBool(chunked), func(b *testing.B) {
			body := &replayBody{data: randomBytes(1 << 10), chunked: chunked}
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Body, r.ContentLength = body, int64(len(body.data))
			if chunked {
				r.ContentLength = -1
			}
			var w http.ResponseWriter = deadlineWriter{ResponseRecorder: httptest.NewRecorder()}
			o := bodybuf.Options{Memory: 64 << 10, Max: 1 << 20, Idle: 30 * time.Second}
			b.SetBytes(int64(len(body.data)))
			b.ReportAllocs()
			for b.Loop() {
				body.off = 0
				bb, err := bodybuf.Read(w, r, o)
				if err != nil || bb.Len() != int64(len(body.data)) {
					b.Fatalf("Read = %d bytes, %v", bb.Len(), err)
				}
				bb.Close()
			}
		})
	}
}

// TestSpills: spill files that share a Spills are bounded together, by files and by bytes; a body
// with no room is ErrSpillsFull and takes nothing; Close (and a failed read) gives back what a body
// took. Before, each body was bounded alone (Max), and enough slow uploads took every descriptor
// the process had, or the disk.
func TestSpills(t *testing.T) {
	dir := t.TempDir()
	var sp bodybuf.Spills
	sp.SetLimits(2, 3000)
	read := func(body []byte, chunked bool) (*bodybuf.Body, error) {
		r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		if chunked {
			r.ContentLength = -1
		}
		return bodybuf.Read(nil, r, bodybuf.Options{Memory: 100, Dir: dir, Spills: &sp})
	}
	inUse := func(files, bytes int64) {
		t.Helper()
		if f, b := sp.InUse(); f != files || b != bytes {
			t.Fatalf("in use: %d files, %d bytes; want %d, %d", f, b, files, bytes)
		}
	}
	small, err := read(randomBytes(50), false) // in memory: no file
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	inUse(0, 0)
	a, err := read(randomBytes(1000), false)
	if err != nil {
		t.Fatal(err)
	}
	inUse(1, 1000)
	// Over the bytes: a declared 2500 is refused at once, a chunked one as it crosses the cap.
	for _, chunked := range []bool{false, true} {
		if b, err := read(randomBytes(2500), chunked); !errors.Is(err, bodybuf.ErrSpillsFull) || b != nil {
			t.Fatalf("chunked=%v: a body past edge.max_spill_bytes: %v, %v; want ErrSpillsFull", chunked, b, err)
		}
		inUse(1, 1000)
	}
	c, err := read(randomBytes(1500), true)
	if err != nil {
		t.Fatal(err)
	}
	inUse(2, 2500)
	// Over the files: a third is refused, though its bytes would fit.
	if _, err := read(randomBytes(200), false); !errors.Is(err, bodybuf.ErrSpillsFull) || !strings.Contains(err.Error(), "edge.max_spill_files") {
		t.Fatalf("a third spill file past edge.max_spill_files: %v, want ErrSpillsFull naming the key", err)
	}
	inUse(2, 2500)
	a.Close()
	a.Close() // a second Close gives back nothing more
	inUse(1, 1500)
	if d, err := read(randomBytes(200), false); err != nil {
		t.Fatalf("after a Close there is room: %v", err)
	} else {
		d.Close()
	}
	c.Close()
	inUse(0, 0)
	// A body that fails after it spilled gives back its file and bytes.
	r := httptest.NewRequest(http.MethodPost, "/", io.MultiReader(bytes.NewReader(randomBytes(500)), iotest.ErrReader(errors.New("client gone"))))
	r.ContentLength = -1
	if _, err := bodybuf.Read(nil, r, bodybuf.Options{Memory: 100, Dir: dir, Spills: &sp}); err == nil {
		t.Fatal("a body that failed mid-way was read")
	}
	inUse(0, 0)
}

// trickle is a request body that gives at most step bytes a read, and records the largest buffer a
// read was given while fewer than each amount had arrived.
type trickle struct {
	data   []byte
	off    int
	step   int
	widest func(off, width int) // called with the bytes arrived so far and len(p), at each read
}

func (tr *trickle) Read(p []byte) (int, error) {
	tr.widest(tr.off, len(p))
	if tr.off == len(tr.data) {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), tr.step)], tr.data[tr.off:])
	tr.off += n
	return n, nil
}

func (*trickle) Close() error { return nil }

// TestBufferFollowsArrival: the memory a body waits in grows with what its client has sent, not
// with what it declared. Before, a body that declared up to Memory bytes got a buffer of that length
// before its first byte: a client that sent 250 such heads on one HTTP/2 connection, and no byte of
// any body, had the edge hold 250 × body_memory for it; one that declared more than Memory had a
// pooled 32 KiB buffer wait on its first byte. Now a read's buffer is at most max(4 KiB, what has
// arrived), so the memory held is at most twice what was sent; and the body comes out whole.
func TestBufferFollowsArrival(t *testing.T) {
	const memory = 64 << 10
	for _, tc := range []struct {
		name    string
		n       int
		chunked bool
	}{
		{"declared, in memory", memory, false},
		{"declared, spilled", 4 * memory, false},
		{"chunked, in memory", memory, true},
		{"chunked, spilled", 4 * memory, true},
		{"declared, small", 100, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := randomBytes(tc.n)
			reads := 0
			tr := &trickle{data: data, step: 10, widest: func(off, width int) {
				reads++
				if width > max(4<<10, off) {
					t.Fatalf("read %d was given %d bytes with %d arrived; want at most max(4 KiB, %d)", reads, width, off, off)
				}
			}}
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Body, r.ContentLength = tr, int64(tc.n)
			if tc.chunked {
				r.ContentLength = -1
			}
			b, err := bodybuf.Read(nil, r, bodybuf.Options{Memory: memory, Dir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			got, err := io.ReadAll(b)
			if err != nil || sum(got) != sum(data) {
				t.Fatalf("replayed %d bytes (%v), want the %d sent", len(got), err, len(data))
			}
			switch inMem := b.InMemory(); {
			case tc.n > memory && inMem != 0:
				t.Errorf("a spilled body holds %d bytes of memory, want 0", inMem)
			case tc.n <= memory && !tc.chunked && inMem != int64(tc.n):
				t.Errorf("a body of declared length %d holds %d bytes, want exactly its length", tc.n, inMem)
			case tc.n <= memory && (inMem < int64(tc.n) || inMem > memory):
				t.Errorf("a chunked body of %d holds %d bytes, want between its length and %d", tc.n, inMem, memory)
			}
		})
	}
}

// TestNoFileBeforeTheFirstByte: a body declared longer than Memory takes its spill file (a
// descriptor, and a place under edge.max_spill_files) at its first byte, not at its head.
func TestNoFileBeforeTheFirstByte(t *testing.T) {
	var sp bodybuf.Spills
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.ContentLength = 1 << 20
	r.Body = io.NopCloser(readFunc(func(p []byte) (int, error) {
		if f, _ := sp.InUse(); f != 0 {
			t.Errorf("%d spill files in use before the body's first byte, want 0", f)
		}
		return 0, io.ErrUnexpectedEOF
	}))
	if _, err := bodybuf.Read(nil, r, bodybuf.Options{Memory: 100, Dir: t.TempDir(), Spills: &sp}); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("Read: %v, want the body's error", err)
	}
}

// TestSpillRefusedAtTheSwitch: a chunked body that fills memory and then has its next byte refused by
// the spill budget gives back what its file took, once.
func TestSpillRefusedAtTheSwitch(t *testing.T) {
	var sp bodybuf.Spills
	sp.SetLimits(0, 100)
	r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(randomBytes(150)))
	r.ContentLength = -1
	if b, err := bodybuf.Read(nil, r, bodybuf.Options{Memory: 100, Dir: t.TempDir(), Spills: &sp}); !errors.Is(err, bodybuf.ErrSpillsFull) || b != nil {
		t.Fatalf("Read = %v, %v; want ErrSpillsFull", b, err)
	}
	if files, n := sp.InUse(); files != 0 || n != 0 {
		t.Fatalf("in use after the refusal: %d files, %d bytes; want none", files, n)
	}
}
