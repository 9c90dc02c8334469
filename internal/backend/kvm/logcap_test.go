package kvm

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/activator/activator/internal/tenant"
)

// onDisk is the bytes file takes on disk.
func onDisk(t *testing.T, file string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestCapLog: a log written past the cap, as QEMU writes it (one descriptor at its own offset, no
// O_APPEND), is cut to about logKeep on disk, keeps its newest bytes and its length, and the writer
// goes on at its offset.
func TestCapLog(t *testing.T) {
	file := filepath.Join(t.TempDir(), consoleName)
	w, err := os.OpenFile(file, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	line := []byte("activator-test-guest chatter 0123456789abcdef\n")
	chunk := bytes.Repeat(line, 1<<16/len(line))
	var size int64
	for size < 3*logCap {
		n, err := w.Write(chunk)
		if err != nil {
			t.Fatal(err)
		}
		size += int64(n)
	}
	if n, err := capLog(filepath.Join(t.TempDir(), "missing.log")); n != 0 || err != nil {
		t.Fatalf("capLog of a missing file = %d, %v; want 0, nil", n, err)
	}
	freed, err := capLog(file)
	if err != nil {
		t.Skipf("this filesystem cannot punch holes (%v): the backing warns of it", err)
	}
	if got := onDisk(t, file); got > logKeep+8<<10 || freed < size-logKeep-8<<10 {
		t.Fatalf("after the cut %d bytes on disk, %d freed; want about %d kept of %d", got, freed, logKeep, size)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(b)) != size {
		t.Fatalf("the cut changed the length: %d, want %d", len(b), size)
	}
	if b[0] != 0 || !bytes.HasSuffix(b, line) || !bytes.Contains(b[size-logKeep:], chunk[:1024]) {
		t.Fatal("after the cut the file does not start with zero bytes and end with the newest output")
	}
	if n, err := capLog(file); n != 0 || err != nil {
		t.Fatalf("a second capLog within the cap = %d, %v; want 0, nil", n, err)
	}
	// The writer goes on at its own offset, after the newest bytes.
	if _, err := w.Write([]byte("after the cut\n")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(file); !bytes.HasSuffix(b, []byte("\nafter the cut\n")) || int64(len(b)) != size+14 {
		t.Fatalf("after the cut a write did not land at the writer's offset: length %d, want %d", len(b), size+14)
	}
}

// TestConsoleLogCapped: a real guest that prints to its console without end (a loop of errors) takes
// no more than the cap on disk for console.log, which keeps its newest lines; the cut is logged.
// Before the cap, console.log grew for as long as the guest ran, in runtime_dir: under /run, a tmpfs,
// the host's memory.
func TestConsoleLogCapped(t *testing.T) {
	g := needGuestInit(t, 4)
	g.append += " activator_test.chatter=1"
	r := route(t, g, SleepPause, "")
	tap := newLogTap(t)
	b := openWith(t, New(Options{Logger: tap.logger()}), r)
	wake(t, b, r.Upstream, tenant.Discard)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	// await waits until done holds for file (a path, or QEMU's descriptor under /proc).
	await := func(file, what string, done func(size, disk int64) bool) {
		t.Helper()
		for {
			var st unix.Stat_t
			if err := unix.Stat(file, &st); err != nil {
				t.Fatal(err)
			}
			if done(st.Size, st.Blocks*512) {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s: %s is %d bytes long, %d on disk, after 4 minutes", what, file, st.Size, st.Blocks*512)
			case <-tick.C:
			}
		}
	}
	await(b.p.console, "the guest printed less than twice the cap", func(size, _ int64) bool { return size > 2*logCap })
	sleepB(t, b) // paused: the guest prints no more
	await(b.p.console, "console.log was never cut to the cap", func(_, disk int64) bool { return disk <= logCap })
	tail := logTail(b.p.console, 200)
	if !strings.Contains(tail, "activator-test-guest chatter\r\n") { // the pause may cut a line short
		t.Errorf("after the cut the console's last bytes are %q, want the guest's newest lines", tail)
	}
	if tap.find("kvm log cut", consoleName) == "" {
		t.Error("the cut was not logged")
	}

	// An operator removes console.log to make room (or a rotation moves it): QEMU writes on into the
	// removed file, which only its descriptor reaches; it is held to the cap all the same.
	pid := qemuPid(b.p)
	wake(t, b, r.Upstream, tenant.Discard)
	if err := os.Remove(b.p.console); err != nil {
		t.Fatal(err)
	}
	fd := qemuFD(pid, b.p.console)
	if fd == "" {
		t.Fatalf("QEMU (pid %d) has no descriptor open on the removed %s", pid, b.p.console)
	}
	var from int64
	await(fd, "", func(size, _ int64) bool { from = size; return true })
	await(fd, "the guest printed less than twice the cap into the removed console.log", func(size, _ int64) bool { return size > from+2*logCap })
	sleepB(t, b)
	await(fd, "the removed console.log was never cut to the cap", func(_, disk int64) bool { return disk <= logCap })
}
