package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The page cache a sleeping guest holds. With snapshot_ram: file the guest's RAM stays in its RAM file
// while it sleeps: page cache, which the kernel may reclaim (written back first where dirty). The
// harness measures how much of the RAM file is cached once the activator has flushed it (its sidecar
// says synced), drops the clean page cache (vm.drop_caches = 1) and measures again; the restore that
// follows faults the guest's pages back in from disk.

const dropCachesFile = "/proc/sys/vm/drop_caches"

// canDropCaches says why the harness cannot drop the page cache ("" when it can: root, and a
// writable /proc/sys).
func canDropCaches() string {
	if os.Geteuid() != 0 {
		return "dropping the page cache needs root"
	}
	f, err := os.OpenFile(dropCachesFile, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Sprintf("%s: %v", dropCachesFile, err)
	}
	f.Close()
	return ""
}

// dropGuestCache is the preparation of the dropped-cache restore: it waits until the sleeping guest's
// RAM file is on disk, measures how much of it is cached, drops the page cache and measures again.
func dropGuestCache(r guestRoute, fig *guestFigures) error {
	if _, err := waitSynced(r.ramFile()+".gen", 30*time.Second); err != nil {
		return err
	}
	before, err := cachedMiB(r.ramFile())
	if err != nil {
		return err
	}
	if err := os.WriteFile(dropCachesFile, []byte("1\n"), 0); err != nil {
		return fmt.Errorf("drop the page cache: %w", err)
	}
	after, err := cachedMiB(r.ramFile())
	if err != nil {
		return err
	}
	fig.cachedMiB, fig.droppedMiB = append(fig.cachedMiB, before), append(fig.droppedMiB, after)
	return nil
}

// waitSynced polls the RAM file's sidecar until the activator has marked the save durable, or budget
// passes, and returns how long that took. The activator flushes the RAM file in the background after
// the sleep; until then its dirty pages cannot be dropped.
func waitSynced(sidecar string, budget time.Duration) (time.Duration, error) {
	t0 := time.Now()
	for {
		var side struct {
			Synced bool `json:"synced"`
		}
		b, err := os.ReadFile(sidecar)
		if err == nil && json.Unmarshal(b, &side) == nil && side.Synced {
			return time.Since(t0), nil
		}
		if time.Since(t0) > budget {
			return 0, fmt.Errorf("RAM file not on disk %v after the sleep (sidecar %s: %v, %s)", budget, sidecar, err, b)
		}
		<-time.After(5 * time.Millisecond)
	}
}

// cachedMiB is how much of file is in the page cache: mincore(2) over a read-only shared mapping of
// it (mapping faults nothing in).
func cachedMiB(file string) (float64, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return 0, err
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, fmt.Errorf("mmap %s: %w", file, err)
	}
	defer unix.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	// x/sys/unix has no mincore wrapper on Linux.
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		return 0, fmt.Errorf("mincore %s: %w", file, errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return float64(n*page) / (1 << 20), nil
}

// rewarm reads the guest's kernel and initramfs back into the page cache after a drop, so the next
// round's cold boot is measured as the others were.
func rewarm(g testGuest) error {
	for _, file := range []string{g.kernel, g.initrd} {
		f, err := os.Open(file)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// removeAll removes files, those already gone included.
func removeAll(files ...string) error {
	for _, f := range files {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}
