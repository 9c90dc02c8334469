package kvm

import (
	"errors"
	"io/fs"
	"os"
	"slices"
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
// within the cap, or missing).
func capLog(file string) (freed int64, err error) {
	f, err := os.OpenFile(file, os.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
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

// capLogs holds the instance's logs to logCap each, checking every logEvery until the monitor closes
// (QEMU gone, or the instance detached: a QEMU left running past the activator is not watched).
func (in *instance) capLogs(files []string) {
	t := time.NewTicker(logEvery)
	defer t.Stop()
	var (
		cuts     int
		freed    int64
		cut      []string // the files cut since the last line
		logged   time.Time
		failures = map[string]bool{} // files whose cut failed, warned of once
	)
	for {
		select {
		case <-in.monClosed:
			return
		case <-t.C:
		}
		for _, f := range files {
			n, err := capLog(f)
			if err != nil {
				if !failures[f] {
					failures[f] = true
					in.log.Warn("kvm log cannot be held to its cap: it grows while the guest writes to it", "file", f, "cap_bytes", logCap, "err", err,
						"fix", "put runtime_dir on a filesystem that can punch holes (tmpfs, ext4, xfs, btrfs)")
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
