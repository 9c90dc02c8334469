// Package cgroup drives cgroup v2 directories for the exec backing: it finds the unified hierarchy
// and the process's own cgroup, creates a group, puts a group to sleep (cgroup.freeze) and wakes it,
// kills every process in it (cgroup.kill, or a freeze and SIGKILL of each pid where the kernel lacks
// cgroup.kill), reads its usage (cpu.stat, memory.current, pids.current), enables controllers for its
// children and removes it.
//
// A Group is a directory path and nothing else: it holds no file open, so it needs no Close, and
// copies of it are interchangeable. Every wait (frozen, thawed, emptied) watches cgroup.events with
// inotify and is bounded by its context, or by DefaultWait when the context has no deadline.
package cgroup

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultWait bounds a wait on cgroup.events whose context has no deadline.
const DefaultWait = 30 * time.Second

// Mount is the mount point of the cgroup v2 hierarchy (/sys/fs/cgroup on a unified host,
// /sys/fs/cgroup/unified on a hybrid one), from /proc/self/mountinfo.
func Mount() (string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("cgroup: %w", err)
	}
	return parseMountinfo(data)
}

// parseMountinfo finds the first cgroup2 mount in a mountinfo file.
func parseMountinfo(data []byte) (string, error) {
	for line := range strings.SplitSeq(string(data), "\n") {
		// "36 25 0:31 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw": the fs type follows " - ".
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		if f := strings.Fields(post); len(f) == 0 || f[0] != "cgroup2" {
			continue
		}
		if f := strings.Fields(pre); len(f) >= 5 {
			return unescapeMount(f[4]), nil
		}
	}
	return "", errors.New("cgroup: no cgroup2 filesystem is mounted (see /proc/self/mountinfo)")
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Self is this process's cgroup v2 path, relative to the hierarchy's root ("/init.scope",
// "/system.slice/activator.service"): the "0::" line of /proc/self/cgroup.
func Self() (string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("cgroup: %w", err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("cgroup: /proc/self/cgroup has no cgroup v2 (0::) line")
}

// Group is one cgroup v2 directory.
type Group struct {
	dir string // absolute path in the cgroup2 file system
}

// At is the group at dir, an absolute path in the cgroup2 file system. It creates nothing.
func At(dir string) Group { return Group{dir: filepath.Clean(dir)} }

// Dir is the group's directory.
func (g Group) Dir() string { return g.dir }

// Child is the group name below g. It creates nothing.
func (g Group) Child(name string) Group { return Group{dir: filepath.Join(g.dir, name)} }

// Make creates the group's directory, and its parents, if they do not exist.
func (g Group) Make() error {
	if err := os.MkdirAll(g.dir, 0o755); err != nil {
		return fmt.Errorf("cgroup: create %s: %w", g.dir, err)
	}
	return nil
}

// Remove removes the group's directory; one that does not exist is no error. A group that still has
// processes or children cannot be removed (EBUSY).
func (g Group) Remove() error {
	if err := unix.Rmdir(g.dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("cgroup: remove %s: %w", g.dir, err)
	}
	return nil
}

// Children lists the groups directly below g.
func (g Group) Children() ([]Group, error) {
	ents, err := os.ReadDir(g.dir)
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	var kids []Group
	for _, e := range ents {
		if e.IsDir() {
			kids = append(kids, g.Child(e.Name()))
		}
	}
	return kids, nil
}

// OpenDir opens the group's directory, for clone3's CLONE_INTO_CGROUP (syscall.SysProcAttr.CgroupFD).
// The caller closes it.
func (g Group) OpenDir() (*os.File, error) {
	f, err := os.OpenFile(g.dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	return f, nil
}

// TryLock takes an exclusive flock(2) on the group's directory without waiting, and reports false when
// another process holds it. The lock lasts until the returned file is closed (or the process dies).
func (g Group) TryLock() (*os.File, bool, error) {
	f, err := g.OpenDir()
	if err != nil {
		return nil, false, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("cgroup: lock %s: %w", g.dir, err)
	}
	return f, true, nil
}

// Write writes value to one of the group's files (memory.max, cgroup.subtree_control, …).
func (g Group) Write(file, value string) error {
	f, err := os.OpenFile(filepath.Join(g.dir, file), os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cgroup: write %q to %s: %w", value, filepath.Join(g.dir, file), err)
	}
	return nil
}

func (g Group) read(file string) ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(g.dir, file))
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	return data, nil
}

// Controllers lists the controllers available to g (cgroup.controllers): those its parent enabled.
func (g Group) Controllers() ([]string, error) {
	data, err := g.read("cgroup.controllers")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(data)), nil
}

// Subtree lists the controllers g enabled for its children (cgroup.subtree_control).
func (g Group) Subtree() ([]string, error) {
	data, err := g.read("cgroup.subtree_control")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(data)), nil
}

// Procs lists the pids in the group (cgroup.procs).
func (g Group) Procs() ([]int, error) {
	data, err := g.read("cgroup.procs")
	if err != nil {
		return nil, err
	}
	var pids []int
	for f := range strings.FieldsSeq(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// events reads cgroup.events: key -> value ("populated" -> 1, "frozen" -> 0).
func (g Group) events() (map[string]int, error) {
	data, err := g.read("cgroup.events")
	if err != nil {
		return nil, err
	}
	return keyed(data), nil
}

// keyed parses "key value" lines with integer values; other lines are skipped.
func keyed(data []byte) map[string]int {
	m := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if n, err := strconv.Atoi(strings.TrimSpace(v)); ok && err == nil {
			m[k] = n
		}
	}
	return m
}

// Populated reports whether any process lives in the group or below it.
func (g Group) Populated() (bool, error) {
	ev, err := g.events()
	if err != nil {
		return false, err
	}
	return ev["populated"] == 1, nil
}

// Freeze freezes every process in the group and returns once cgroup.events says frozen 1.
func (g Group) Freeze(ctx context.Context) error {
	if err := g.Write("cgroup.freeze", "1"); err != nil {
		return err
	}
	return g.await(ctx, "frozen", 1)
}

// Thaw thaws the group and returns once cgroup.events says frozen 0.
func (g Group) Thaw(ctx context.Context) error {
	if err := g.Write("cgroup.freeze", "0"); err != nil {
		return err
	}
	return g.await(ctx, "frozen", 0)
}

// Frozen reports whether the group is frozen.
func (g Group) Frozen() (bool, error) {
	ev, err := g.events()
	if err != nil {
		return false, err
	}
	return ev["frozen"] == 1, nil
}

// Kill SIGKILLs every process in the group and below it, and returns once it is empty (cgroup.events:
// populated 0). It writes cgroup.kill (Linux 5.14); where that file is missing it freezes the group,
// so that nothing can fork, SIGKILLs every pid in cgroup.procs (fatal signals pass the freezer),
// and thaws it. Killing an empty group is no error; so is one that does not exist.
func (g Group) Kill(ctx context.Context) error {
	err := g.Write("cgroup.kill", "1")
	switch {
	case errors.Is(err, os.ErrNotExist):
		if _, serr := os.Stat(g.dir); errors.Is(serr, os.ErrNotExist) {
			return nil
		}
		if err := g.killEach(ctx); err != nil {
			return err
		}
	case err != nil:
		return err
	}
	return g.await(ctx, "populated", 0)
}

// killEach is Kill without cgroup.kill (one directory level: the exec backing makes no subgroups).
func (g Group) killEach(ctx context.Context) error {
	if err := g.Freeze(ctx); err != nil {
		return err
	}
	for range 100 { // each round kills what the last listing showed; a frozen group cannot fork
		pids, err := g.Procs()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("cgroup: kill pid %d in %s: %w", pid, g.dir, err)
			}
		}
		if err := g.await(ctx, "populated", 0); err == nil {
			break
		}
	}
	return g.Write("cgroup.freeze", "0")
}

// await waits until cgroup.events has key at want, watching the file with inotify (the kernel signals
// every change to it as a modification). It gives up when ctx ends, or after DefaultWait when ctx has
// no deadline. A group removed meanwhile is empty: a wait for populated 0 ends there without an
// error. (The exec backing removes a tenant's group once it exits: a Kill racing that exit found the
// group gone under its wait, and read ENODEV from cgroup.events.)
func (g Group) await(ctx context.Context, key string, want int) error {
	removed := func(err error) bool {
		return key == "populated" && want == 0 && (errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENODEV))
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultWait)
		defer cancel()
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("cgroup: inotify: %w", err)
	}
	defer unix.Close(fd)
	path := filepath.Join(g.dir, "cgroup.events")
	if _, err := unix.InotifyAddWatch(fd, path, unix.IN_MODIFY); err != nil {
		if removed(err) {
			return nil
		}
		return fmt.Errorf("cgroup: watch %s: %w", path, err)
	}
	buf := make([]byte, 4096)
	deadline, _ := ctx.Deadline()
	for {
		ev, err := g.events()
		if err != nil {
			if removed(err) {
				return nil
			}
			return err
		}
		if ev[key] == want {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return fmt.Errorf("cgroup: %s: %s is %d, waiting for %d: %w", g.dir, key, ev[key], want, context.Cause(ctx))
		}
		// A bounded wait for the next change: the poll's timeout also notices ctx's cancellation
		// within 100ms when it ends before its deadline.
		ms := int(min(left, 100*time.Millisecond) / time.Millisecond)
		if _, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, max(ms, 1)); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("cgroup: poll: %w", err)
		}
		for { // drain the inotify queue
			if n, err := unix.Read(fd, buf); n <= 0 || err != nil {
				break
			}
		}
	}
}

// Stat is a group's usage, as far as its controllers tell.
type Stat struct {
	CPU       time.Duration // cpu.stat usage_usec: always present
	Memory    int64         // memory.current, bytes; HasMemory says whether the memory controller is on
	HasMemory bool
	Pids      int64 // pids.current; HasPids says whether the pids controller is on
	HasPids   bool
}

// Stat reads the group's usage: cpu.stat (present in every non-root group), memory.current and
// pids.current where their controllers are enabled.
func (g Group) Stat() (Stat, error) {
	var s Stat
	data, err := g.read("cpu.stat")
	if err != nil {
		return s, err
	}
	s.CPU = time.Duration(keyed(data)["usage_usec"]) * time.Microsecond
	if n, ok := g.readInt("memory.current"); ok {
		s.Memory, s.HasMemory = n, true
	}
	if n, ok := g.readInt("pids.current"); ok {
		s.Pids, s.HasPids = n, true
	}
	return s, nil
}

func (g Group) readInt(file string) (int64, bool) {
	data, err := os.ReadFile(filepath.Join(g.dir, file))
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return n, err == nil
}
