package kvm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDiskMoved: each way a disk can move on from a save is named, and only the disk as saved (or no
// disk, when the save had none) lets a snapshot be resumed.
func TestDiskMoved(t *testing.T) {
	const (
		savedDisk = iota // the save recorded the disk
		savedNone        // the save had no disk
		savedOld         // the save recorded nothing (an older activator's sidecar)
	)
	cases := []struct {
		name  string
		saved int
		now   string                                             // the route's disk now: "disk", "other" or "" (none)
		edit  func(t *testing.T, disk, other string, at *diskID) // what happened to the disk since the save
		want  string                                             // "" when the snapshot may be resumed
	}{
		{name: "unchanged", saved: savedDisk, now: "disk"},
		{name: "no disk, then or now", saved: savedNone, now: ""},
		{name: "older save", saved: savedOld, now: "disk", want: "without its disk's identity"},
		{name: "older save, no disk", saved: savedOld, now: ""},
		{name: "disk added", saved: savedNone, now: "disk", want: "saved with disk (none), the route's disk is now /"},
		{name: "disk removed from the config", saved: savedDisk, now: "", want: "the route's disk is now (none)"},
		{name: "another disk", saved: savedDisk, now: "other", want: "other.img"},
		{name: "disk gone", saved: savedDisk, now: "disk", edit: func(t *testing.T, disk, _ string, _ *diskID) {
			must(t, os.Remove(disk))
		}, want: "no such file"},
		{name: "replaced", saved: savedDisk, now: "disk", edit: func(t *testing.T, disk, other string, _ *diskID) {
			must(t, os.Rename(other, disk))
		}, want: "another file than at the save"},
		{name: "grown", saved: savedDisk, now: "disk", edit: func(t *testing.T, disk, _ string, _ *diskID) {
			must(t, os.Truncate(disk, 8192))
		}, want: "8192 bytes, 4096 at the save"},
		{name: "written", saved: savedDisk, now: "disk", edit: func(t *testing.T, disk, _ string, at *diskID) {
			// The same size, a later modification time: what any write in place leaves.
			must(t, os.Chtimes(disk, time.Time{}, time.Unix(0, at.MtimeNs).Add(time.Microsecond)))
		}, want: "was written after the save"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			disk, other := filepath.Join(dir, "disk.img"), filepath.Join(dir, "other.img")
			for _, f := range []string{disk, other} {
				must(t, os.WriteFile(f, make([]byte, 4096), 0o600))
			}
			at, err := readDiskID(disk)
			if err != nil {
				t.Fatal(err)
			}
			saved := map[int]*diskID{savedDisk: at, savedNone: {}, savedOld: nil}[c.saved]
			if c.edit != nil {
				c.edit(t, disk, other, at)
			}
			now := map[string]string{"disk": disk, "other": other, "": ""}[c.now]
			got := diskMoved(saved, now)
			if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
				t.Errorf("diskMoved = %q, want %q", got, c.want)
			}
		})
	}
}

// TestCheckCopy: a copied snapshot is loaded only with its sidecar, at the size it was saved with;
// one saved by an activator that wrote no sidecar is refused rather than trusted.
func TestCheckCopy(t *testing.T) {
	dir := t.TempDir()
	b := &Backend{s: &Settings{SnapshotDir: dir}}
	file := filepath.Join(dir, snapBase)
	src := snapshotSource{file: file, side: file + genExt}
	must(t, os.WriteFile(file, []byte("QEVM stream"), 0o600))
	for _, c := range []struct {
		name string
		side any // nil: no sidecar
		want string
	}{
		{"no sidecar", nil, "without a valid sidecar"},
		{"not JSON", "}", "without a valid sidecar"},
		{"another size", snapSidecar{Bytes: 3, Disk: &diskID{}}, "11 bytes, saved as 3"},
		{"no disk identity, no disk", snapSidecar{Bytes: 11}, ""},
		{"whole", snapSidecar{Bytes: 11, Disk: &diskID{}}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			_ = os.Remove(src.side)
			switch v := c.side.(type) {
			case nil:
			case string:
				must(t, os.WriteFile(src.side, []byte(v), 0o600))
			default:
				must(t, writeSidecar(src.side, v))
			}
			err := b.checkCopy(src)
			var re *refusedError
			switch {
			case c.want == "" && err != nil:
				t.Errorf("checkCopy = %v, want nil", err)
			case c.want != "" && (!errors.As(err, &re) || !strings.Contains(err.Error(), c.want)):
				t.Errorf("checkCopy = %v, want a refusal saying %q", err, c.want)
			}
		})
	}
}

// TestRemoveSnapshotsTakesTheTemps: removeSnapshots leaves nothing of a save behind, the sidecars'
// temp files included (an activator killed between writing a binding and putting it in place left
// guest.dev.gen.tmp and guest.ram.gen.tmp for good), and keeps what was moved aside.
func TestRemoveSnapshotsTakesTheTemps(t *testing.T) {
	dir := t.TempDir()
	b := &Backend{s: &Settings{SnapshotDir: dir}}
	for _, f := range []string{ramBase + genExt + ".tmp", devBase + genExt + ".tmp", devBase, devBase + genExt, snapBase + genExt + ".tmp", snapBase + ".zst", devBase + badExt} {
		must(t, os.WriteFile(filepath.Join(dir, f), nil, 0o600))
	}
	must(t, b.removeSnapshots())
	left, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].Name() != devBase+badExt {
		var names []string
		for _, e := range left {
			names = append(names, e.Name())
		}
		t.Errorf("left %q, want only %s", names, devBase+badExt)
	}
}
