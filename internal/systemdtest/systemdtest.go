// Package systemdtest gives tests a real systemd manager: a private `systemd --user` started for one
// test (its own XDG_RUNTIME_DIR and XDG_CONFIG_HOME, stopped on cleanup), a D-Bus connection to it,
// and helpers to write unit files, reload, start/stop/kill units and read their properties over D-Bus.
// It also writes the units the tests need: a demoapp service (the test binary re-executed as the app),
// a socket-activated demoapp pair, and a `.socket` + systemd-socket-proxyd pair in front of the
// demoapp (the socket-activation baseline the benchmarks compare the activator against).
//
// A test that cannot have a manager (no systemd binary, not root and no /run/systemd/system, the
// manager fails to come up) goes through testenv.Missing: skipped, or failed under
// ACTIVATOR_INTEGRATION=required.
//
// systemd is not PID 1 on the machines this runs on; a user manager still runs once
// /run/systemd/system exists, which Start creates when it is missing and it may (it leaves it in
// place: other test packages running in parallel may rely on it).
package systemdtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"

	"github.com/activator/activator/internal/testenv"
)

// startBudget bounds how long a manager may take to come up or go down. It is a generous upper bound
// that turns a hang into a failure, not a performance expectation.
const startBudget = 60 * time.Second

// Manager is a private systemd user manager owned by one test. Its fields are immutable.
type Manager struct {
	// RuntimeDir is the manager's XDG_RUNTIME_DIR (mode 0700).
	RuntimeDir string
	// ConfigHome is the manager's XDG_CONFIG_HOME.
	ConfigHome string
	// UnitDir is where unit files go ($XDG_CONFIG_HOME/systemd/user).
	UnitDir string
	// Address is the D-Bus address of the manager's private socket (peer-to-peer: no Hello).
	Address string
	// PID is the manager's process id.
	PID int
	// LogPath is the manager's log (stdout and stderr).
	LogPath string

	conn *sddbus.Conn // the harness's own connection, closed on cleanup
}

// Start starts a private `systemd --user` for t and stops it when t ends. It calls testenv.Missing when
// systemd cannot be had here.
func Start(t testing.TB) *Manager {
	t.Helper()
	bin, err := exec.LookPath("systemd")
	if err != nil {
		for _, p := range []string{"/usr/lib/systemd/systemd", "/lib/systemd/systemd"} {
			if _, serr := os.Stat(p); serr == nil {
				bin, err = p, nil
				break
			}
		}
	}
	if err != nil {
		testenv.Missing(t, "no systemd binary (apt-get install systemd): %v", err)
	}
	if _, err := os.Stat("/run/systemd/system"); err != nil {
		if err := os.MkdirAll("/run/systemd/system", 0o755); err != nil {
			testenv.Missing(t, "systemd --user needs /run/systemd/system and it cannot be created: %v", err)
		}
	}

	// Unix socket paths are limited to 108 bytes: keep the runtime dir short rather than under t.TempDir.
	rt, err := os.MkdirTemp("", "sdt")
	if err != nil {
		t.Fatalf("runtime dir: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(rt) })
	if err := os.Chmod(rt, 0o700); err != nil {
		t.Fatalf("chmod runtime dir: %v", err)
	}
	cfg := filepath.Join(t.TempDir(), "config")
	m := &Manager{
		RuntimeDir: rt,
		ConfigHome: cfg,
		UnitDir:    filepath.Join(cfg, "systemd", "user"),
		Address:    "unix:path=" + filepath.Join(rt, "systemd", "private"),
	}
	if err := os.MkdirAll(m.UnitDir, 0o755); err != nil {
		t.Fatalf("unit dir: %v", err)
	}

	// The manager reports READY=1 on NOTIFY_SOCKET once it is up: wait for that instead of polling.
	notifyPath := filepath.Join(rt, "ready.sock")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		t.Fatalf("notify socket: %v", err)
	}
	defer notify.Close()

	logPath := filepath.Join(t.TempDir(), "systemd.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("manager log: %v", err)
	}
	defer logf.Close()
	home := os.Getenv("HOME")
	if home == "" {
		home = "/root"
	}
	cmd := exec.Command(bin, "--user")
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + home,
		"XDG_RUNTIME_DIR=" + rt,
		"XDG_CONFIG_HOME=" + cfg,
		"NOTIFY_SOCKET=" + notifyPath,
		"SYSTEMD_LOG_TARGET=console",
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		testenv.Missing(t, "start systemd --user: %v", err)
	}
	m.PID = cmd.Process.Pid
	m.LogPath = logPath
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { m.stop(t, cmd, exited, logPath) })

	ready := make(chan error, 1)
	go func() { ready <- waitReady(notify) }()
	select {
	case err := <-ready:
		if err != nil {
			testenv.Missing(t, "systemd --user did not report ready: %v; log:\n%s", err, readTail(logPath))
		}
	case err := <-exited:
		exited <- err // let cleanup see it
		testenv.Missing(t, "systemd --user exited at start (%v); log:\n%s", err, readTail(logPath))
	case <-time.After(startBudget):
		testenv.Missing(t, "systemd --user not ready within %v; log:\n%s", startBudget, readTail(logPath))
	}

	// The connection lives as long as the test: it is closed on cleanup, not by a context.
	conn, err := m.Dial(context.Background())
	if err != nil {
		testenv.Missing(t, "connect to the user manager at %s: %v", m.Address, err)
	}
	m.conn = conn
	t.Cleanup(conn.Close)
	return m
}

// waitReady reads notification datagrams until one says READY=1. It returns when the socket is
// closed (the caller's deferred Close) with an error.
func waitReady(c *net.UnixConn) error {
	buf := make([]byte, 4096)
	_ = c.SetReadDeadline(time.Now().Add(startBudget))
	for {
		n, err := c.Read(buf)
		if err != nil {
			return err
		}
		for _, l := range strings.Split(string(buf[:n]), "\n") {
			if l == "READY=1" {
				return nil
			}
		}
	}
}

// stop terminates the manager (SIGTERM: it stops its units and exits), escalating to SIGKILL.
func (m *Manager) stop(t testing.TB, cmd *exec.Cmd, exited chan error, logPath string) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return
	case <-time.After(startBudget):
	}
	t.Logf("systemd --user (pid %d) ignored SIGTERM for %v; killing it. log:\n%s", m.PID, startBudget, readTail(logPath))
	_ = cmd.Process.Kill()
	<-exited
}

func readTail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// DialRaw opens a godbus connection to the manager's private socket, authenticated with EXTERNAL and
// without Hello (the socket is peer-to-peer). The connection closes when ctx ends.
func DialRaw(ctx context.Context, address string) (*godbus.Conn, error) {
	c, err := godbus.Dial(address, godbus.WithContext(ctx))
	if err != nil {
		return nil, err
	}
	if err := c.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Dial returns a new go-systemd connection to the manager. The caller closes it. The connection
// closes on its own when ctx ends.
func (m *Manager) Dial(ctx context.Context) (*sddbus.Conn, error) {
	return sddbus.NewConnection(func() (*godbus.Conn, error) { return DialRaw(ctx, m.Address) })
}

// Conn is the harness's own connection to the manager (closed on cleanup).
func (m *Manager) Conn() *sddbus.Conn { return m.conn }

// WriteUnit writes a unit file into UnitDir and reloads the manager.
func (m *Manager) WriteUnit(t testing.TB, name, text string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(m.UnitDir, name), []byte(text), 0o644); err != nil {
		t.Fatalf("write unit %s: %v", name, err)
	}
	m.Reload(t)
}

// Reload is `systemctl --user daemon-reload` over D-Bus.
func (m *Manager) Reload(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startBudget)
	defer cancel()
	if err := m.conn.ReloadContext(ctx); err != nil {
		t.Fatalf("daemon-reload: %v", err)
	}
}

// StartUnit starts a unit and waits for its job, failing t unless the result is "done".
func (m *Manager) StartUnit(t testing.TB, name string) {
	t.Helper()
	m.job(t, "start", name, m.conn.StartUnitContext)
}

// StopUnit stops a unit behind any backend's back (systemctl --user stop) and waits for the job.
func (m *Manager) StopUnit(t testing.TB, name string) {
	t.Helper()
	m.job(t, "stop", name, m.conn.StopUnitContext)
}

func (m *Manager) job(t testing.TB, what, name string, f func(context.Context, string, string, chan<- string) (int, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startBudget)
	defer cancel()
	ch := make(chan string, 1)
	if _, err := f(ctx, name, "replace", ch); err != nil {
		t.Fatalf("%s %s: %v", what, name, err)
	}
	select {
	case res := <-ch:
		if res != "done" {
			t.Fatalf("%s %s: job %s", what, name, res)
		}
	case <-ctx.Done():
		t.Fatalf("%s %s: no job result within %v", what, name, startBudget)
	}
}

// Kill sends sig to the unit's processes (whom: "main" or "all").
func (m *Manager) Kill(t testing.TB, name, whom string, sig syscall.Signal) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startBudget)
	defer cancel()
	if err := m.conn.KillUnitWithTarget(ctx, name, sddbus.Who(whom), int32(sig)); err != nil {
		t.Fatalf("kill %s %s: %v", name, sig, err)
	}
}

// Props returns the unit's org.freedesktop.systemd1.Unit properties.
func (m *Manager) Props(t testing.TB, name string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startBudget)
	defer cancel()
	p, err := m.conn.GetUnitPropertiesContext(ctx, name)
	if err != nil {
		t.Fatalf("properties of %s: %v", name, err)
	}
	return p
}

// ActiveState returns the unit's ActiveState ("active", "inactive", "failed", ...).
func (m *Manager) ActiveState(t testing.TB, name string) string {
	t.Helper()
	s, _ := m.Props(t, name)["ActiveState"].(string)
	return s
}

// MainPID returns the service's main PID (0 when it has none).
func (m *Manager) MainPID(t testing.TB, name string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startBudget)
	defer cancel()
	p, err := m.conn.GetUnitTypePropertyContext(ctx, name, "Service", "MainPID")
	if err != nil {
		t.Fatalf("MainPID of %s: %v", name, err)
	}
	pid, _ := p.Value.Value().(uint32)
	return int(pid)
}

// PIDs lists the processes in the unit's cgroup, read from the manager.
func (m *Manager) PIDs(t testing.TB, name string) []int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startBudget)
	defer cancel()
	raw, err := DialRaw(ctx, m.Address)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer raw.Close()
	var procs []struct {
		Path string
		PID  uint32
		Cmd  string
	}
	obj := raw.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1")
	if err := obj.CallWithContext(ctx, "org.freedesktop.systemd1.Manager.GetUnitProcesses", 0, name).Store(&procs); err != nil {
		t.Fatalf("processes of %s: %v", name, err)
	}
	out := make([]int, 0, len(procs))
	for _, p := range procs {
		out = append(out, int(p.PID))
	}
	return out
}

// WaitState polls the unit's ActiveState until it is want or the budget runs out (a bounded loop:
// used where a test checks an outcome from outside, not to synchronise with the code under test).
func (m *Manager) WaitState(t testing.TB, name, want string, budget time.Duration) {
	t.Helper()
	deadline := time.Now().Add(budget)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		got := m.ActiveState(t, name)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("unit %s: ActiveState %q, want %q within %v", name, got, want, budget)
		}
		<-tick.C
	}
}

// ProcState returns the state letter of /proc/PID/stat ("R", "S", "T", ...).
func ProcState(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The comm field is in parentheses and may contain spaces: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return "", fmt.Errorf("unexpected /proc/%d/stat: %q", pid, s)
	}
	return s[i+2 : i+3], nil
}

// Demo describes a service unit that runs the demoapp: the current test binary re-executed with
// ACTIVATOR_DEMOAPP=1 (the test package's TestMain must call demoapp.RunIfChild first).
type Demo struct {
	// Port is the TCP port the app listens on (PORT); 0 with Socket-activated units (LISTEN_FDS).
	Port int
	// Type is the service Type= (default "exec": the start job fails when the binary cannot run).
	Type string
	// ExecStart overrides the command (default: the test binary).
	ExecStart string
	// Env adds Environment= entries (KEY=value).
	Env []string
	// Service adds raw lines to the [Service] section.
	Service []string
	// Unit adds raw lines to the [Unit] section.
	Unit []string
}

// Text renders the unit file. Start limits are off (StartLimitIntervalSec=0): tests sleep and wake fast.
func (d Demo) Text(t testing.TB) string {
	t.Helper()
	exe := d.ExecStart
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			t.Fatalf("test binary: %v", err)
		}
	}
	typ := d.Type
	if typ == "" {
		typ = "exec"
	}
	var b strings.Builder
	b.WriteString("[Unit]\nDescription=activator test demoapp\nStartLimitIntervalSec=0\n")
	for _, l := range d.Unit {
		b.WriteString(l + "\n")
	}
	fmt.Fprintf(&b, "[Service]\nType=%s\nExecStart=%s\nEnvironment=ACTIVATOR_DEMOAPP=1\n", typ, exe)
	if d.Port != 0 {
		fmt.Fprintf(&b, "Environment=PORT=%d\n", d.Port)
	}
	for _, e := range d.Env {
		fmt.Fprintf(&b, "Environment=%s\n", e)
	}
	for _, l := range d.Service {
		b.WriteString(l + "\n")
	}
	return b.String()
}

// WriteDemo writes a demoapp service unit named name and reloads.
func (m *Manager) WriteDemo(t testing.TB, name string, d Demo) {
	t.Helper()
	m.WriteUnit(t, name, d.Text(t))
}

// WriteSocketPair writes <base>.socket listening on 127.0.0.1:port (Accept=no, no trigger limit) and
// <base>.service running the demoapp on the inherited socket (LISTEN_FDS), then reloads and starts the
// socket. It returns the service's name.
func (m *Manager) WriteSocketPair(t testing.TB, base string, port int, d Demo) string {
	t.Helper()
	d.Port = 0
	m.WriteUnit(t, base+".service", d.Text(t))
	m.WriteUnit(t, base+".socket", fmt.Sprintf(
		"[Unit]\nDescription=activator test socket\n[Socket]\nListenStream=127.0.0.1:%d\nAccept=no\nTriggerLimitIntervalSec=0\n", port))
	m.StartUnit(t, base+".socket")
	return base + ".service"
}

// ProxydPath is where Debian installs systemd-socket-proxyd.
func ProxydPath() (string, error) {
	for _, p := range []string{"/usr/lib/systemd/systemd-socket-proxyd", "/lib/systemd/systemd-socket-proxyd"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("systemd-socket-proxyd not found (package systemd)")
}

// ProxyPair is a `.socket` + systemd-socket-proxyd service in front of a demoapp service: the
// socket-activation baseline. A connection to Listen starts the proxy, which (Requires=/After=) starts
// the app and forwards to it.
type ProxyPair struct {
	Listen  string // host:port clients connect to
	Socket  string // <base>-proxy.socket
	Proxy   string // <base>-proxy.service
	App     string // <base>-app.service
	AppPort int
}

// WriteProxyPair writes and loads the three units of a ProxyPair named after base, and starts the
// socket. The app is stopped; the first connection wakes it.
func (m *Manager) WriteProxyPair(t testing.TB, base string, d Demo) ProxyPair {
	t.Helper()
	proxyd, err := ProxydPath()
	if err != nil {
		testenv.Missing(t, "%v", err)
	}
	p := ProxyPair{
		Socket:  base + "-proxy.socket",
		Proxy:   base + "-proxy.service",
		App:     base + "-app.service",
		AppPort: testenv.FreePort(t),
	}
	p.Listen = fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	d.Port = p.AppPort
	m.WriteUnit(t, p.App, d.Text(t))
	m.WriteUnit(t, p.Proxy, fmt.Sprintf("[Unit]\nRequires=%s\nAfter=%s\nStartLimitIntervalSec=0\n[Service]\nExecStart=%s 127.0.0.1:%d\n",
		p.App, p.App, proxyd, p.AppPort))
	m.WriteUnit(t, p.Socket, fmt.Sprintf("[Socket]\nListenStream=%s\nAccept=no\nTriggerLimitIntervalSec=0\n", p.Listen))
	m.StartUnit(t, p.Socket)
	return p
}

// StopProxyPair stops the proxy and the app (the socket keeps listening), so the next connection is a
// cold start again.
func (m *Manager) StopProxyPair(t testing.TB, p ProxyPair) {
	t.Helper()
	m.StopUnit(t, p.Proxy)
	m.StopUnit(t, p.App)
}

// BusProxy forwards connections from a socket of its own to the manager's private socket, and can cut
// them all at once: a deterministic stand-in for the manager dropping its clients (systemd restart,
// daemon-reexec), which the code under test must survive by reconnecting through the same address.
type BusProxy struct {
	// Address is the D-Bus address to give the code under test.
	Address string

	ln     *net.UnixListener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex // guards the fields below
	conns map[net.Conn]struct{}
	sent  []byte // everything clients sent to the manager
}

// NewBusProxy starts a proxy in front of m's private socket; it stops when t ends.
func (m *Manager) NewBusProxy(t testing.TB) *BusProxy {
	t.Helper()
	path := filepath.Join(m.RuntimeDir, fmt.Sprintf("proxy%d.sock", time.Now().UnixNano()))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatalf("bus proxy: %v", err)
	}
	p := &BusProxy{
		Address: "unix:path=" + path,
		ln:      ln,
		target:  strings.TrimPrefix(m.Address, "unix:path="),
		conns:   map[net.Conn]struct{}{},
	}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

func (p *BusProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("unix", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, up)
		go p.pipe(recorder{p: p, Conn: up}, c)
	}
}

// pipe copies src to dst; when either side ends, both are closed.
func (p *BusProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// recorder keeps a copy of what clients send.
type recorder struct {
	net.Conn
	p *BusProxy
}

func (r recorder) Write(b []byte) (int, error) {
	r.p.mu.Lock()
	r.p.sent = append(r.p.sent, b...)
	r.p.mu.Unlock()
	return r.Conn.Write(b)
}

// Calls counts the method calls named member (e.g. "StartUnit") that clients have sent through the
// proxy so far. A call a client made and got the reply to has passed the proxy, so the count is exact
// once the client's operation has returned. The member's name must not be a prefix of another one it
// sends ("StartUnit" also matches "StartUnitReplace"; this package's clients do not use that).
func (p *BusProxy) Calls(member string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	// In a message header the member is a D-Bus string: the name followed by a NUL byte.
	return bytes.Count(p.sent, append([]byte(member), 0))
}

// Cut closes every proxied connection; new ones are still accepted.
func (p *BusProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Conns returns how many client connections the proxy carries now (each counts its two sides once).
func (p *BusProxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns) / 2
}
