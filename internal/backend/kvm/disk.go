package kvm

// The guest's disk at a save. A snapshot holds the guest's memory and devices, not its disk: the disk
// stays where it is, and the guest resumes over whatever it then holds. A guest resumed over a disk
// written since its save (by a later boot of the same disk, a route that switched snapshot_dir and back,
// or a hand) finds file systems whose state its page cache contradicts, and corrupts them. So a save
// records the disk's identity (diskID) in its sidecar, and a restore resumes it only over the same
// file, unwritten since; anything else is refused and the wake cold-boots.
//
// The identity is taken once the save has completed and before QEMU quits: QEMU stops the guest
// (draining and flushing its disk I/O) before saving, and inactivates its block devices when the
// migration completes, so nothing writes the disk after that. TestSnapshotOverAChangedDisk checks that
// QEMU's quit, and the incoming QEMU's open of the disk, leave the identity as recorded.

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// diskID identifies the guest's disk image as a save left it: the file (device and inode), its size
// and its modification time to the nanosecond, which any write moves. Path is "" for a guest without
// a disk.
type diskID struct {
	Path    string `json:"path"`
	Dev     uint64 `json:"dev,omitempty"`
	Ino     uint64 `json:"ino,omitempty"`
	Bytes   int64  `json:"bytes,omitempty"`
	MtimeNs int64  `json:"mtime_ns,omitempty"`
}

// readDiskID is the identity of the disk image at path now ("": no disk).
func readDiskID(path string) (*diskID, error) {
	if path == "" {
		return &diskID{}, nil
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, fmt.Errorf("the guest's disk %s: %w", path, err)
	}
	return &diskID{Path: path, Dev: st.Dev, Ino: st.Ino, Bytes: st.Size, MtimeNs: st.Mtim.Nano()}, nil
}

// diskMoved says why a snapshot saved over the disk saved must not be resumed over the route's disk at
// path now ("" when it may be). A save that recorded no disk (saved nil: an older activator's) is
// resumed only by a route without a disk: over a disk, nothing says it has not moved on.
func diskMoved(saved *diskID, path string) string {
	if saved == nil { // a sidecar written before disks were recorded
		if path == "" {
			return ""
		}
		return "saved without its disk's identity (by an older activator?)"
	}
	if saved.Path != path {
		return fmt.Sprintf("saved with disk %s, the route's disk is now %s", orNone(saved.Path), orNone(path))
	}
	now, err := readDiskID(path)
	switch {
	case err != nil:
		return err.Error()
	case now.Dev != saved.Dev || now.Ino != saved.Ino:
		return fmt.Sprintf("the disk %s is another file than at the save (replaced since)", path)
	case now.Bytes != saved.Bytes:
		return fmt.Sprintf("the disk %s is %d bytes, %d at the save", path, now.Bytes, saved.Bytes)
	case now.MtimeNs != saved.MtimeNs:
		return fmt.Sprintf("the disk %s was written after the save (modified %s, saved over %s)", path, stamp(now.MtimeNs), stamp(saved.MtimeNs))
	}
	return ""
}

func orNone(path string) string {
	if path == "" {
		return "(none)"
	}
	return path
}

func stamp(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }
