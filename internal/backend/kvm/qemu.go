package kvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/activator/activator/internal/tenant"
)

// Files in the runtime dir and the snapshot dir.
const (
	sockName    = "qmp.sock"
	pidName     = "qemu.pid"
	consoleName = "console.log"
	logName     = "qemu.log"            // QEMU's messages (-D), e.g. why a snapshot did not load
	startName   = "qemu-start.log"      // the daemonizing parent's output
	migName     = "mig.sock"            // file mode: the device state's migration socket
	writerName  = "snapshot-writer.log" // copy mode: the snapshot writer's (cat, zstd) errors
	snapBase    = "guest.snap"          // + ".zst" when compressed
)

// hostFacts is what accel auto looks at. readHostFacts fills it from the running system; tests build
// their own.
type hostFacts struct {
	devKVM     error    // nil when /dev/kvm opens read-write
	cpuVirt    bool     // /proc/cpuinfo has the vmx or svm flag
	kvmModules []string // loaded modules named kvm_* (kvm_intel, kvm_amd, kvm_pvm, ...)
}

func readHostFacts() hostFacts {
	var h hostFacts
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err == nil {
		f.Close()
	}
	h.devKVM = err
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "flags" {
				for _, fl := range strings.Fields(v) {
					if fl == "vmx" || fl == "svm" {
						h.cpuVirt = true
					}
				}
				break
			}
		}
	}
	if ents, err := os.ReadDir("/sys/module"); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "kvm_") {
				h.kvmModules = append(h.kvmModules, e.Name())
			}
		}
	}
	return h
}

// chooseAccel resolves accel auto: KVM only when /dev/kvm opens, the CPU has hardware virtualisation
// and a hardware KVM module (kvm_intel or kvm_amd) is loaded. A /dev/kvm from a software hypervisor
// (kvm_pvm) runs guests in an instruction emulator far slower than TCG, so auto falls back to TCG. The
// reason says why, for the log.
func chooseAccel(want string, h hostFacts) (accel, reason string) {
	hw := false
	for _, m := range h.kvmModules {
		if m == "kvm_intel" || m == "kvm_amd" {
			hw = true
		}
	}
	switch want {
	case AccelKVM:
		return AccelKVM, "accel: kvm configured"
	case AccelTCG:
		return AccelTCG, "accel: tcg configured"
	}
	switch {
	case h.devKVM != nil:
		return AccelTCG, fmt.Sprintf("accel auto: TCG, /dev/kvm unusable (%v)", h.devKVM)
	case !h.cpuVirt:
		return AccelTCG, fmt.Sprintf("accel auto: TCG, /dev/kvm exists but the CPU has no vmx/svm flag (kvm modules: %s): a software KVM is slower than TCG", moduleList(h.kvmModules))
	case !hw:
		return AccelTCG, fmt.Sprintf("accel auto: TCG, /dev/kvm exists but neither kvm_intel nor kvm_amd is loaded (kvm modules: %s)", moduleList(h.kvmModules))
	}
	return AccelKVM, "accel auto: KVM (hardware virtualisation available)"
}

func moduleList(m []string) string {
	if len(m) == 0 {
		return "none"
	}
	return strings.Join(m, ", ")
}

// paths are the files of one route.
type paths struct {
	sock, pid, console, log, start, mig, writer string

	dirs string // the record of the route's snapshot dirs (leftover.go)
}

func newPaths(s *Settings) paths {
	return paths{
		sock:    filepath.Join(s.RuntimeDir, sockName),
		pid:     filepath.Join(s.RuntimeDir, pidName),
		console: filepath.Join(s.RuntimeDir, consoleName),
		log:     filepath.Join(s.RuntimeDir, logName),
		start:   filepath.Join(s.RuntimeDir, startName),
		mig:     filepath.Join(s.RuntimeDir, migName),
		writer:  filepath.Join(s.RuntimeDir, writerName),
		dirs:    filepath.Join(s.RuntimeDir, dirsName),
	}
}

// launch is what a QEMU is started for. incoming waits for a snapshot (-incoming defer). ram, when set,
// is the locked RAM file the guest's memory is mapped from (file mode): QEMU inherits it as descriptor
// ramFD, maps it through /proc/self/fd (so it maps the very file that is locked) and so holds its lock
// until it exits.
type launch struct {
	incoming bool
	ram      *os.File
}

// argv builds QEMU's arguments (without the binary).
func argv(name string, s *Settings, p paths, accel string, l launch) []string {
	a := []string{"-name", "guest=" + name + ",process=activator-kvm-" + name}
	switch accel {
	case AccelKVM:
		a = append(a, "-accel", "kvm", "-cpu", "host")
	default:
		a = append(a, "-accel", "tcg")
	}
	machine := s.Machine
	if l.ram != nil {
		id := ramBlockID(s.Machine)
		machine += ",memory-backend=" + id
		a = append(a, "-object", fmt.Sprintf("memory-backend-file,id=%s,size=%dM,mem-path=/proc/self/fd/%d,share=on", id, s.Memory, ramFD))
	}
	a = append(a,
		"-M", machine,
		"-m", strconv.Itoa(s.Memory),
		"-smp", strconv.Itoa(s.CPUs),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", "file:"+p.console,
		"-qmp", "unix:"+p.sock+",server=on,wait=off",
		"-pidfile", p.pid,
		"-D", p.log,
		"-daemonize",
	)
	micro := s.Machine == "microvm"
	if s.Kernel != "" {
		a = append(a, "-kernel", s.Kernel)
		if s.Initrd != "" {
			a = append(a, "-initrd", s.Initrd)
		}
		a = append(a, "-append", s.Append)
	}
	if s.Disk != "" {
		a = append(a, "-drive", "id=disk0,if=none,file="+s.Disk+",format="+s.DiskFormat)
		if micro {
			a = append(a, "-device", "virtio-blk-device,drive=disk0")
		} else {
			a = append(a, "-device", "virtio-blk-pci,drive=disk0")
		}
	}
	if s.Network.Mode == NetUser {
		nd := fmt.Sprintf("user,id=net0,hostfwd=tcp:%s:%d-:%d", s.hostAddr, s.hostPort, s.Network.GuestPort)
		if s.Network.Restrict {
			nd += ",restrict=on"
		}
		a = append(a, "-netdev", nd)
		if micro {
			a = append(a, "-device", "virtio-net-device,netdev=net0")
		} else {
			a = append(a, "-device", "virtio-net-pci,netdev=net0,romfile=")
		}
	}
	a = append(a, s.ExtraArgs...)
	if l.incoming {
		a = append(a, "-incoming", "defer")
	}
	return a
}

// spawn runs QEMU, which daemonizes once its monitor socket exists, and returns the daemon's pid.
// QEMU's own output before it daemonizes goes to logFile and ends up in the error. ram, when not nil,
// becomes QEMU's descriptor ramFD. If ctx ends first, or QEMU fails, nothing is left running.
func spawn(ctx context.Context, bin string, args []string, p paths, ram *os.File) (int, error) {
	_ = os.Remove(p.log)
	out, err := os.OpenFile(p.start, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, err
	}
	defer out.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout = out
	cmd.Stderr = out
	if ram != nil {
		cmd.ExtraFiles = []*os.File{ram} // descriptor 3: ramFD
	}
	if err := cmd.Start(); err != nil {
		return 0, startFault(fmt.Errorf("start %s: %w", bin, err))
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		if pid, perr := readPid(p.pid); perr == nil {
			_ = killAndWait(pid)
		}
		// A daemon forked before the end whose pid file was not written yet carries our QMP socket
		// in its command line: it would otherwise go on booting the guest, for the next activator
		// to adopt as running.
		for _, pid := range ourQEMUs(p.sock) {
			_ = killAndWait(pid)
		}
		return 0, fmt.Errorf("qemu did not start: %w", ctx.Err())
	}
	if err != nil {
		// Why is only in QEMU's words (an option it refuses, an image it cannot open, a lock another
		// QEMU holds), which the backing does not parse: retryable, as for a tenant that crashes at
		// start, and the message quotes them for the operator.
		return 0, tenant.Retryable(fmt.Errorf("qemu failed to start (%v): %s", err, strings.TrimSpace(logTail(p.start, 1000)+"\n"+logTail(p.log, 1000))))
	}
	pid, err := readPid(p.pid)
	if err != nil {
		return 0, fmt.Errorf("qemu started but its pid file is unreadable: %w", err)
	}
	return pid, nil
}

// starting describes a QEMU that has not daemonized yet, with the last of what it printed (a
// daemonizing QEMU writes to its -D log, the parent to the start log): the last state observed when
// budgets.qemu_start runs out.
func starting(p paths) string {
	if out := strings.TrimSpace(logTail(p.start, 300) + "\n" + logTail(p.log, 300)); out != "" {
		return "qemu still starting, not daemonized; it said: " + strings.ReplaceAll(out, "\n", "; ")
	}
	return "qemu still starting, not daemonized, no output"
}

func readPid(file string) (int, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("pid file %s: bad content %q", file, b)
	}
	return pid, nil
}

// alive reports whether pid is a live process: not a zombie, or a zombie main thread whose other
// threads still run.
func alive(pid int) bool {
	switch procState(fmt.Sprintf("/proc/%d/stat", pid)) {
	case 0:
		return false
	case 'Z', 'X':
		// A killed QEMU's main thread can be a zombie while its other threads still exit, holding
		// its files (the guest's forwarded port among them) until the last of them is gone.
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		for _, t := range tasks {
			if st := procState(t); st != 0 && st != 'Z' && st != 'X' {
				return true
			}
		}
		return false
	}
	return true
}

// procState is the state letter in a /proc stat file, or 0 when it cannot be read.
func procState(path string) byte {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	// The state follows the parenthesised command name, which may itself contain ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// isOurQEMU reports whether pid is alive and was started with our QMP socket, which guards against a
// pid file that outlived its process and a pid reused since.
func isOurQEMU(pid int, sock string) bool {
	if !alive(pid) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	return bytes.Contains(b, []byte("unix:"+sock+","))
}

// ourQEMUs returns the live processes started with our QMP socket (isOurQEMU), found in /proc.
func ourQEMUs(sock string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if isOurQEMU(pid, sock) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func killPid(pid int) {
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// waitGone waits until pid has exited (or is a zombie), or ctx ends. QEMU daemonizes, so it is not
// our child and cannot be waited for: a pidfd tells when it exits, and alive confirms (polling, where
// pidfds are missing).
func waitGone(ctx context.Context, pid int) error {
	waitPidfd(ctx, pid)
	if err := pollUntil(ctx, func() bool { return !alive(pid) }); err != nil {
		return fmt.Errorf("qemu pid %d still running: %w", pid, err)
	}
	return nil
}

// waitPidfd returns once pid has exited, ctx has ended, or pidfd_open fails (no pidfds, or no such
// process). A pidfd becomes readable when the process exits.
func waitPidfd(ctx context.Context, pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	for ctx.Err() == nil {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 50)
		if n > 0 || (err != nil && !errors.Is(err, unix.EINTR)) {
			return
		}
	}
}

// pollUntil checks cond at once, then with a pause doubling from 1 ms to 50 ms, until it holds (nil) or
// ctx ends (ctx's error). For what gives no event to wait on: a process that is not our child, a file
// another process renames into place.
func pollUntil(ctx context.Context, cond func() bool) error {
	d := time.Millisecond
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if cond() {
			return nil
		}
		d = min(2*d, 50*time.Millisecond)
		t.Reset(d)
	}
}

// killAndWait kills pid and waits (bounded) until it is gone.
func killAndWait(pid int) error {
	killPid(pid)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return waitGone(ctx, pid)
}

// removeStale removes the runtime files of a QEMU that no longer runs.
func removeStale(p paths) {
	_ = os.Remove(p.sock)
	_ = os.Remove(p.pid)
}

// shellQuote quotes s for /bin/sh (QEMU runs exec: migration URIs with sh -c).
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// logTail returns up to the last n bytes of file, trimmed ("" when it cannot be read).
//
// It reads only those bytes: a guest can make QEMU write to qemu.log without end (device errors
// it provokes), and reading the whole file into memory, as it did, put the activator at the mercy
// of the file's size.
func logTail(file string, n int) string {
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > int64(n) {
		if _, err := f.Seek(-int64(n), io.SeekEnd); err != nil {
			return ""
		}
	}
	b, _ := io.ReadAll(io.LimitReader(f, int64(n)))
	return string(bytes.TrimSpace(b))
}
