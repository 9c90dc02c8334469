package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// userManager is a private `systemd --user` the harness starts for the unit experiment (its own
// XDG_RUNTIME_DIR and XDG_CONFIG_HOME), stopped by Stop. It mirrors internal/systemdtest, which is
// written for tests (testing.TB) and so cannot be used from this program.
type userManager struct {
	proc       *proc
	runtimeDir string
	unitDir    string
	address    string // the private D-Bus socket, for the unit backing's `bus:`
}

// startUserManager starts the manager and waits for its READY=1.
func startUserManager(ctx context.Context, tmp string) (*userManager, error) {
	bin, ok := lookTool("systemd")
	if !ok {
		for _, p := range []string{"/usr/lib/systemd/systemd", "/lib/systemd/systemd"} {
			if _, err := os.Stat(p); err == nil {
				bin, ok = p, true
			}
		}
	}
	if !ok {
		return nil, fmt.Errorf("no systemd binary (Debian package systemd)")
	}
	if _, err := os.Stat("/run/systemd/system"); err != nil {
		// A user manager refuses to run unless the host looks booted with systemd; the directory is
		// what it checks. Left in place (parallel test packages may rely on it too).
		if err := os.MkdirAll("/run/systemd/system", 0o755); err != nil {
			return nil, fmt.Errorf("systemd --user needs /run/systemd/system: %w", err)
		}
	}
	rt, err := os.MkdirTemp("", "bsd") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(rt, 0o700); err != nil {
		return nil, err
	}
	cfg := filepath.Join(tmp, "systemd-config")
	m := &userManager{runtimeDir: rt, unitDir: filepath.Join(cfg, "systemd", "user"), address: "unix:path=" + filepath.Join(rt, "systemd", "private")}
	if err := os.MkdirAll(m.unitDir, 0o755); err != nil {
		return nil, err
	}
	notifyPath := filepath.Join(rt, "ready.sock")
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		return nil, err
	}
	defer notify.Close()
	home := os.Getenv("HOME")
	if home == "" {
		home = "/root"
	}
	cmd := exec.Command(bin, "--user")
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + home,
		"XDG_RUNTIME_DIR=" + rt, "XDG_CONFIG_HOME=" + cfg, "NOTIFY_SOCKET=" + notifyPath, "SYSTEMD_LOG_TARGET=console"}
	t := &tail{}
	cmd.Stdout, cmd.Stderr = t, t
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start systemd --user: %w", err)
	}
	m.proc = &proc{name: "systemd --user", cmd: cmd, out: t, done: make(chan struct{})}
	go func() { m.proc.err = cmd.Wait(); close(m.proc.done) }()
	ready := make(chan error, 1)
	go func() {
		buf := make([]byte, 4096)
		_ = notify.SetReadDeadline(time.Now().Add(time.Minute))
		for {
			n, err := notify.Read(buf)
			if err != nil {
				ready <- err
				return
			}
			if strings.Contains("\n"+string(buf[:n])+"\n", "\nREADY=1\n") {
				ready <- nil
				return
			}
		}
	}()
	select {
	case err := <-ready:
		if err != nil {
			m.Stop()
			return nil, fmt.Errorf("systemd --user not ready: %w: %s", err, t.String())
		}
	case <-m.proc.done:
		return nil, fmt.Errorf("systemd --user exited at start: %v: %s", m.proc.err, t.String())
	case <-ctx.Done():
		m.Stop()
		return nil, ctx.Err()
	}
	return m, nil
}

// Stop stops the manager (it stops its units) and removes its runtime directory.
func (m *userManager) Stop() {
	if m.proc != nil {
		_ = m.proc.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.proc.done:
		case <-time.After(30 * time.Second):
			_ = m.proc.cmd.Process.Kill()
			<-m.proc.done
		}
	}
	_ = os.RemoveAll(m.runtimeDir)
}

// systemctl runs `systemctl --user ARGS` against this manager.
func (m *userManager) systemctl(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "systemctl", append([]string{"--user"}, args...)...)
	cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+m.runtimeDir, "DBUS_SESSION_BUS_ADDRESS=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("systemctl --user %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// writeUnits writes unit files and reloads the manager.
func (m *userManager) writeUnits(ctx context.Context, units map[string]string) error {
	for name, text := range units {
		if err := os.WriteFile(filepath.Join(m.unitDir, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return m.systemctl(ctx, "daemon-reload")
}
