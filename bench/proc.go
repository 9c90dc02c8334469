package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one server process the harness started (an app, a proxy, the activator). Its owner stops it
// with Stop, which signals, waits a bounded time, kills and joins.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *tail
	done chan struct{} // closed when the process has been waited for
	err  error         // the wait error; read after done
}

// tail keeps the last bytes a process wrote to stdout/stderr, for error messages, and lets a caller
// wait for a line containing a marker.
type tail struct {
	mu      sync.Mutex // guards the fields below
	buf     []byte
	waiters []*lineWaiter
}

type lineWaiter struct {
	marker string
	ch     chan time.Time // buffered 1: receives when the marker was seen
}

const tailMax = 16 << 10

func (t *tail) Write(p []byte) (int, error) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailMax {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-tailMax:]...)
	}
	kept := t.waiters[:0]
	for _, w := range t.waiters {
		if bytes.Contains(p, []byte(w.marker)) {
			w.ch <- now
			continue
		}
		kept = append(kept, w)
	}
	t.waiters = kept
	return len(p), nil
}

// expect registers interest in the next write that contains marker.
func (t *tail) expect(marker string) <-chan time.Time {
	w := &lineWaiter{marker: marker, ch: make(chan time.Time, 1)}
	t.mu.Lock()
	t.waiters = append(t.waiters, w)
	t.mu.Unlock()
	return w.ch
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// procSpec says how to start a process.
type procSpec struct {
	name string
	cpus string // taskset CPU list; "" = unpinned
	env  []string
	argv []string
	dir  string
}

// startProc starts spec. The process is put in its own process group so Stop also reaches its
// children (nginx workers, an exec tenant of the activator that outlived it).
func startProc(spec procSpec) (*proc, error) {
	argv := spec.argv
	if spec.cpus != "" {
		argv = append([]string{"taskset", "-c", spec.cpus}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), spec.env...)
	cmd.Dir = spec.dir
	t := &tail{}
	cmd.Stdout, cmd.Stderr = t, t
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", spec.name, err)
	}
	p := &proc{name: spec.name, cmd: cmd, out: t, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// pid is the process id (taskset execs the command, so it is the server's own).
func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM to the process group, waits up to grace, then SIGKILLs the group, and joins.
func (p *proc) Stop(grace time.Duration) {
	if p == nil {
		return
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
		<-p.done
	}
	// Whatever is left in the group (a child that ignored the signal) goes too.
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
}

// waitHTTP polls addr with GET path (with the given Host header when not empty) until it answers
// 2xx, the process exits, or the deadline passes. Polling is bounded in time and count.
func waitHTTP(ctx context.Context, p *proc, addr, path string, budget time.Duration) error {
	deadline := time.Now().Add(budget)
	for i := 0; ; i++ {
		code, _, err := rawGet(ctx, addr, path, "127.0.0.1", time.Second)
		if err == nil && code >= 200 && code < 300 {
			return nil
		}
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited before answering on %s: %v\n%s", p.name, addr, p.err, p.out.String())
		}
		if time.Now().After(deadline) || i > 100000 {
			msg := ""
			if p != nil {
				msg = "\n" + p.out.String()
			}
			return fmt.Errorf("%s did not answer GET %s within %v (last: %d %v)%s", addr, path, budget, code, err, msg)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// rawGet sends one HTTP/1.1 GET on a fresh connection and returns the status and body.
func rawGet(ctx context.Context, addr, path, host string, timeout time.Duration) (int, []byte, error) {
	r, err := firstByte(ctx, addr, path, host, timeout)
	if err != nil {
		return 0, nil, err
	}
	return r.code, r.body, nil
}

// fbResult is one request's timing: sent is just before the request was written, first when its
// first response byte arrived (wall clock, comparable with the app's unix-ns stamps).
type fbResult struct {
	sent, first time.Time
	code        int
	body        []byte
}

// firstByte dials addr, writes a GET with Connection: close and reads the whole response, noting when
// the first byte came back.
func firstByte(ctx context.Context, addr, path, host string, timeout time.Duration) (fbResult, error) {
	var d net.Dialer
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fbResult{}, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	return exchange(c, path, host)
}

// exchange writes one GET on c and reads the response.
func exchange(c net.Conn, path, host string) (fbResult, error) {
	return exchangeWith(c, path, host, nil)
}

// exchangeWith is exchange, calling written (when not nil) once the request is on the wire.
func exchangeWith(c net.Conn, path, host string, written func()) (fbResult, error) {
	return exchangeHeader(c, path, host, "", written)
}

// exchangeHeader is exchangeWith, sending header (complete lines, each ending in CRLF) after Host.
func exchangeHeader(c net.Conn, path, host, header string, written func()) (fbResult, error) {
	req := "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\n" + header + "Connection: close\r\n\r\n"
	var r fbResult
	r.sent = time.Now()
	_, err := c.Write([]byte(req))
	if written != nil {
		written()
	}
	if err != nil {
		return r, err
	}
	br := bufio.NewReader(c)
	if _, err := br.Peek(1); err != nil {
		return r, fmt.Errorf("no response: %w", err)
	}
	r.first = time.Now()
	status, err := br.ReadString('\n')
	if err != nil {
		return r, err
	}
	f := strings.Fields(status)
	if len(f) < 2 {
		return r, fmt.Errorf("bad status line %q", status)
	}
	r.code, _ = strconv.Atoi(f[1])
	var rest bytes.Buffer
	_, err = rest.ReadFrom(br)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return r, err
	}
	if _, body, ok := bytes.Cut(rest.Bytes(), []byte("\r\n\r\n")); ok {
		r.body = body
	}
	return r, nil
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// rssKiB reads VmRSS of pid from /proc.
func rssKiB(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				return strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

// nofileLimit reads the soft RLIMIT_NOFILE of pid from /proc/PID/limits.
func nofileLimit(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "Max open files") {
			f := strings.Fields(l)
			if len(f) >= 5 {
				return f[3]
			}
		}
	}
	return "?"
}

// raiseNofile raises this process's RLIMIT_NOFILE (children inherit it) to want, or as far as allowed.
func raiseNofile(want uint64) (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	if rl.Cur >= want {
		return rl.Cur, nil
	}
	nl := syscall.Rlimit{Cur: want, Max: max(want, rl.Max)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &nl); err != nil {
		// Not root: the soft limit can still go up to the hard one.
		nl = syscall.Rlimit{Cur: rl.Max, Max: rl.Max}
		if err2 := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &nl); err2 != nil {
			return rl.Cur, fmt.Errorf("raise RLIMIT_NOFILE: %w", err)
		}
		return rl.Max, nil
	}
	return want, nil
}

// rawPost sends POST path to addr and returns the status and body.
func rawPost(ctx context.Context, addr, path string, timeout time.Duration) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+path, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("X-Activator", "1") // the admin API refuses a POST a browser could send cross-site
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// getJSON GETs path from addr and decodes the JSON answer into v.
func getJSON(ctx context.Context, addr, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// dialCtx dials addr over TCP.
func dialCtx(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// getText GETs path from addr with net/http (which undoes chunked encoding) and returns the body.
func getText(ctx context.Context, addr, path string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// harnessApp returns the harness's own build of the demo app (./bench/app: internal/demoapp and
// nothing else), building it into the scratch directory on first use. The cold and unit experiments
// start it instead of the activator binary's `app` mode, whose exec maps and faults in the whole
// activator: their figures then hold the activator's own cost, not its size.
func harnessApp(ctx context.Context, e *env) (string, error) {
	bin := filepath.Join(e.tmp, "demoapp")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, "./bench/app")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./bench/app (run from the repository root): %w: %s", err, out)
	}
	return bin, nil
}
