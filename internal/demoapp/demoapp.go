// Package demoapp is a tiny HTTP tenant: the app `activator demo` wakes (the activator binary
// re-executed in a hidden mode) and the app every integration test and benchmark starts as a real
// child process, systemd unit or (in spirit) guest service. It is configured by environment so it works
// the same under exec, systemd units and test re-execution.
//
// Where it listens, first match wins:
//   - LISTEN_FDS (systemd socket activation protocol, LISTEN_PID must match): the first inherited socket;
//   - SOCKET=/path: a unix socket (removed first if stale);
//   - PORT=n (HOST defaults to 127.0.0.1): TCP.
//
// Behaviour knobs:
//   - DEMOAPP_START_DELAY=200ms   wait this long before listening (a slow-starting app);
//   - DEMOAPP_HOLD_FILE=/path     while this file exists, wait before listening (a start that hangs
//     until a test lets it go);
//   - DEMOAPP_EXIT_CODE=3         print DEMOAPP_EXIT_MESSAGE (or a default) to stderr and exit before listening;
//   - DEMOAPP_UNHEALTHY=1         /healthz always answers 503;
//   - DEMOAPP_BODY=text           the body of GET / (default "hello from demoapp");
//   - DEMOAPP_READY=text          printed on stdout once listening (default "demoapp ready");
//   - DEMOAPP_CHATTY=n            print n lines on stdout and stderr before listening (pipe-drain tests);
//   - DEMOAPP_IGNORE_TERM=1       ignore SIGTERM (stop only by SIGINT or SIGKILL: stop-grace tests).
//
// Endpoints: / (body), /healthz, /echo (echoes the request body), /sse?n=3 (server-sent events,
// flushed one by one), /ws (WebSocket echo), /pid, /bound (JSON: pid, main_ns, bound_ns, wall clock
// unix nanoseconds), /slow?d=100ms, and /twice, a tenant bug on purpose: it answers "the answer",
// then, once /twice/release is asked (which answers after it), writes a second answer no request asked
// for (500, "a second answer nobody asked for", as a framework writing its error page after the
// handler's answer) and closes the connection; /glued is the same bug with no wait: the two answers
// go out in one write, and the connection stays open until the client closes it (at most a minute).
package demoapp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/coreos/go-systemd/v22/activation"
)

// ChildEnv is the variable that makes a test binary run the demo app instead of its tests: a test
// package's TestMain calls RunIfChild, and a test starts os.Args[0] with ChildEnv=1.
const ChildEnv = "ACTIVATOR_DEMOAPP"

// RunIfChild runs the app and exits when ChildEnv=1 is set; otherwise it returns at once. Call it first
// thing in TestMain.
func RunIfChild() {
	if os.Getenv(ChildEnv) == "1" {
		os.Exit(Main())
	}
}

// Main runs the app until SIGTERM or SIGINT and returns the exit code.
func Main() int {
	mainNS := time.Now().UnixNano()
	stopSignals := []os.Signal{syscall.SIGTERM, syscall.SIGINT}
	if os.Getenv("DEMOAPP_IGNORE_TERM") == "1" {
		signal.Ignore(syscall.SIGTERM)
		stopSignals = stopSignals[1:]
	}
	if d, err := time.ParseDuration(os.Getenv("DEMOAPP_START_DELAY")); err == nil && d > 0 {
		time.Sleep(d) // the app is deliberately slow to start; this is its behaviour, not test timing
	}
	if hold := os.Getenv("DEMOAPP_HOLD_FILE"); hold != "" {
		for range 100 * 60 * 10 { // ten minutes at most: a hung start, not a hung test
			if _, err := os.Stat(hold); err != nil {
				break
			}
			time.Sleep(10 * time.Millisecond) // the app's own behaviour: it polls for its release
		}
	}
	if n, _ := strconv.Atoi(os.Getenv("DEMOAPP_CHATTY")); n > 0 {
		line := fmt.Sprintf("%0200d", 0)
		for i := 0; i < n; i++ {
			fmt.Fprintf(os.Stdout, "out %d %s\n", i, line)
			fmt.Fprintf(os.Stderr, "err %d %s\n", i, line)
		}
	}
	if code, err := strconv.Atoi(os.Getenv("DEMOAPP_EXIT_CODE")); err == nil {
		msg := os.Getenv("DEMOAPP_EXIT_MESSAGE")
		if msg == "" {
			msg = "demoapp: failing on purpose before listening"
		}
		fmt.Fprintln(os.Stderr, msg)
		return code
	}
	// What the serving needs is set up before listening, and the ready line printed once it serves: a
	// connection that waits in the backlog (a health probe, the first request) is accepted at once.
	ready := os.Getenv("DEMOAPP_READY")
	if ready == "" {
		ready = "demoapp ready"
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals...)
	defer stop()
	ln, err := listen()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demoapp:", err)
		return 1
	}
	boundNS := time.Now().UnixNano()
	srv.Handler = Handler(mainNS, boundNS)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	fmt.Fprintf(os.Stdout, "%s on %s\n", ready, ln.Addr())

	select {
	case err := <-errc:
		fmt.Fprintln(os.Stderr, "demoapp:", err)
		return 1
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return 0
}

func listen() (net.Listener, error) {
	if os.Getenv("LISTEN_FDS") != "" {
		lns, err := activation.Listeners()
		if err != nil {
			return nil, fmt.Errorf("LISTEN_FDS: %w", err)
		}
		for _, l := range lns {
			if l != nil {
				return l, nil
			}
		}
		return nil, errors.New("LISTEN_FDS set but no listening socket inherited (does LISTEN_PID match?)")
	}
	if p := os.Getenv("SOCKET"); p != "" {
		_ = os.Remove(p)
		return net.Listen("unix", p)
	}
	if port := os.Getenv("PORT"); port != "" {
		host := os.Getenv("HOST")
		if host == "" {
			host = "127.0.0.1"
		}
		return net.Listen("tcp", net.JoinHostPort(host, port))
	}
	return nil, errors.New("nowhere to listen: set LISTEN_FDS, SOCKET or PORT")
}

// boundJSON is /bound's body: {"bound_ns":…,"main_ns":…,"pid":…} and a newline, as encoding/json
// writes that map.
func boundJSON(pid int, mainNS, boundNS int64) []byte {
	b := append([]byte(`{"bound_ns":`), strconv.FormatInt(boundNS, 10)...)
	b = append(append(b, `,"main_ns":`...), strconv.FormatInt(mainNS, 10)...)
	b = append(append(b, `,"pid":`...), strconv.Itoa(pid)...)
	return append(b, "}\n"...)
}

// Handler is the app's HTTP handler; mainNS and boundNS are reported by /bound.
func Handler(mainNS, boundNS int64) http.Handler {
	body := os.Getenv("DEMOAPP_BODY")
	if body == "" {
		body = "hello from demoapp"
	}
	unhealthy := os.Getenv("DEMOAPP_UNHEALTHY") == "1"
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, body)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if unhealthy {
			http.Error(w, "unhealthy on purpose", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		// Read everything first: an HTTP/1.1 server discards the unread rest of a request body once the
		// response header goes out, so streaming the echo would return only its first 512 bytes.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
		_, _ = w.Write(body)
	})
	mux.HandleFunc("/pid", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, os.Getpid())
	})
	// /bound is often a cold start's first answer, which the benchmarks time: it is written by hand, as
	// encoding/json's first use of a type costs the fresh process its reflection on the critical path.
	bound := boundJSON(os.Getpid(), mainNS, boundNS)
	mux.HandleFunc("/bound", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(bound)
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		d, _ := time.ParseDuration(r.URL.Query().Get("d"))
		select {
		case <-time.After(d):
		case <-r.Context().Done():
		}
		fmt.Fprintln(w, "slow done")
	})
	release := make(chan chan struct{})
	mux.HandleFunc("/twice", func(w http.ResponseWriter, r *http.Request) {
		conn, bw, ok := hijack(w)
		if !ok {
			return
		}
		defer conn.Close()
		writeRaw(bw, "200 OK", "the answer\n")
		var done chan struct{}
		select {
		case done = <-release:
		case <-r.Context().Done():
			return
		}
		writeRaw(bw, "500 Internal Server Error", "a second answer nobody asked for\n")
		close(done)
	})
	mux.HandleFunc("/glued", func(w http.ResponseWriter, r *http.Request) {
		conn, bw, ok := hijack(w)
		if !ok {
			return
		}
		defer conn.Close()
		fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
		writeRaw(bw, "500 Internal Server Error", "a second answer nobody asked for\n") // flushes both
		_ = conn.SetReadDeadline(time.Now().Add(time.Minute))
		_, _ = conn.Read(make([]byte, 1))
	})
	mux.HandleFunc("/twice/release", func(w http.ResponseWriter, r *http.Request) {
		done := make(chan struct{})
		select {
		case release <- done:
		case <-r.Context().Done():
			return
		}
		<-done
		fmt.Fprintln(w, "released")
	})
	mux.HandleFunc("/sse", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		if n <= 0 {
			n = 3
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f, _ := w.(http.Flusher)
		for i := 0; i < n; i++ {
			fmt.Fprintf(w, "data: event %d\n\n", i)
			if f != nil {
				f.Flush()
			}
			// Wait for the client to ask for more by waiting on a tiny interval only when asked to.
			if d, err := time.ParseDuration(r.URL.Query().Get("every")); err == nil {
				select {
				case <-time.After(d):
				case <-r.Context().Done():
					return
				}
			}
		}
	})
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, msg); err != nil {
				return
			}
		}
	})
	return mux
}

// hijack takes w's connection over, for the endpoints that answer as a buggy tenant would; when it
// cannot (HTTP/2), it answers 500 itself and reports false.
func hijack(w http.ResponseWriter) (net.Conn, *bufio.ReadWriter, bool) {
	conn, bw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return nil, nil, false
	}
	return conn, bw, true
}

// writeRaw writes a whole HTTP/1.1 answer, status and a text body, to bw and flushes it.
func writeRaw(bw *bufio.ReadWriter, status, body string) {
	fmt.Fprintf(bw, "HTTP/1.1 %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n\r\n%s", status, len(body), body)
	_ = bw.Flush()
}
