package kvm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The guest's serial console (console.log) and QEMU's own messages (qemu.log, where QEMU's stderr goes
// once it has daemonized) are files QEMU writes for as long as it runs, without bound: a guest that
// prints in a loop, or provokes device errors, would fill runtime_dir's filesystem, and under /run
// that is a tmpfs, the host's memory. While the backing watches a QEMU, each file is held to logCap
// bytes on disk: past it, all but about the last logKeep bytes are punched out of it (fallocate's
// PUNCH_HOLE). That frees them and leaves alone the offset QEMU writes at (QEMU opens both without
// O_APPEND, so a truncation would only have it go on writing at the old offset, past the new end).
// The file keeps its length; the part cut reads as zero bytes, and its last bytes are the newest.
const (
	logCap   = 1 << 20   // bytes a log may take on disk before it is cut
	logKeep  = 256 << 10 // bytes kept at the end of a log cut
	logEvery = time.Second
	// logCutEvery: how often, at most, the cuts are logged (the first at once): a guest that prints
	// without end has its console cut every few seconds.
	logCutEvery = 10 * time.Minute
)

// capLog holds file to logCap bytes on disk. It returns the bytes it freed (0 when the file is
// within the cap, or missing). file is a path (whose last step may not be a link) or QEMU's own
// descriptor for it under /proc (qemuFD).
func capLog(file string) (freed int64, err error) {
	flags := os.O_WRONLY | unix.O_NONBLOCK
	if !strings.HasPrefix(file, "/proc/") {
		flags |= unix.O_NOFOLLOW
	}
	f, err := os.OpenFile(file, flags, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fd := int(f.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Blocks*512 <= logCap {
		return 0, nil
	}
	end := (st.Size - logKeep) &^ (4<<10 - 1) // whole pages: a partial one would only be zeroed
	if end <= 0 {
		return 0, nil
	}
	if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, end); err != nil {
		return 0, err
	}
	before := st.Blocks * 512
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	return before - st.Blocks*512, nil
}

// qemuFD returns QEMU's own descriptor for file, /proc/<pid>/fd/N, or "" when QEMU has none open.
// Through it the cap reaches the file QEMU writes even after someone removed or renamed the path (a
// log rotation, an rm to make room), which would otherwise grow unseen.
func qemuFD(pid int, file string) string {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if p := filepath.Join(dir, e.Name()); namesFile(p, file) {
			return p
		}
	}
	return ""
}

// namesFile reports whether the descriptor link fd (/proc/<pid>/fd/N) is open on file, which may
// have been removed since.
func namesFile(fd, file string) bool {
	t, err := os.Readlink(fd)
	return err == nil && (t == file || t == file+" (deleted)")
}

// capLogs holds the instance's logs to logCap each, checking every logEvery until the monitor closes
// (QEMU gone, or the instance detached: a QEMU left running past the activator is not watched). Each
// is reached through QEMU's own descriptor for it when QEMU has one (qemuFD), else by its path.
func (in *instance) capLogs(files []string) {
	t := time.NewTicker(logEvery)
	defer t.Stop()
	var (
		cuts     int
		freed    int64
		cut      []string // the files cut since the last line
		logged   time.Time
		fds      = map[string]string{} // file -> QEMU's descriptor for it
		failures = map[string]bool{}   // files whose cut failed, warned of once per QEMU
	)
	for tick := 0; ; tick++ {
		select {
		case <-in.monClosed:
			return
		case <-t.C:
		}
		for _, f := range files {
			target := f
			if fd := fds[f]; fd != "" && namesFile(fd, f) { // checked again: the pid could be another's
				target = fd
			} else if tick%10 == 0 {
				if fds[f] = qemuFD(in.pid, f); fds[f] != "" {
					target = fds[f]
				}
			}
			n, err := capLog(target)
			if err != nil {
				if !failures[f] {
					failures[f] = true
					fix := "see the error"
					if errors.Is(err, unix.EOPNOTSUPP) {
						fix = "put runtime_dir on a filesystem that can punch holes (tmpfs, ext4, xfs, btrfs)"
					}
					in.log.Warn("kvm log cannot be held to its cap: it grows while the guest writes to it", "file", f, "cap_bytes", logCap, "err", err, "fix", fix)
				}
				continue
			}
			if n > 0 {
				cuts++
				freed += n
				if !slices.Contains(cut, f) {
					cut = append(cut, f)
				}
			}
		}
		if cuts > 0 && time.Since(logged) >= logCutEvery {
			in.log.Warn("kvm log cut: the guest (or QEMU) wrote past the cap; the start of the file now reads as zero bytes, the newest kept",
				"files", cut, "cap_bytes", logCap, "kept_bytes", logKeep, "cuts", cuts, "freed_bytes", freed)
			cuts, freed, cut, logged = 0, 0, nil, time.Now()
		}
	}
}
