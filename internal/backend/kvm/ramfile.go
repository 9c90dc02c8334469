package kvm

// The RAM file of snapshot_ram: file. The guest's memory is a memory-backend-file (share=on) on a file
// in the route's snapshot dir, so a sleeping guest's memory is page cache the kernel can reclaim, a
// restore faults pages in as the guest touches them, and the snapshot holds only the device state
// (QEMU's x-ignore-shared migration capability, set on both sides, leaves shared RAM out of it).
//
// A device state is resumed only on the RAM it was saved with. At the save, once QEMU has exited, a
// random generation goes into a sidecar of the RAM file and into one of the device state (with the
// device state's size and SHA-256); a restore checks both, the RAM file's size and, after a host
// restart, that the save had reached the disk, and refuses on any mismatch (*refusedError). The RAM
// file's sidecar is removed before a QEMU maps the file, so a RAM file that has run since matches no
// saved device state. While a QEMU maps the RAM file it holds an exclusive flock on it (the backend
// takes it, QEMU inherits the descriptor), so no second QEMU can share a guest's RAM.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Files of file mode in the snapshot dir, and the RAM file's descriptor in QEMU.
const (
	ramBase = "guest.ram" // the guest's RAM
	devBase = "guest.dev" // the device state: QEMU's migration stream without the RAM
	genExt  = ".gen"      // the sidecar of the RAM file or of the device state: their generation
	badExt  = ".bad"      // a snapshot moved aside: it did not load, or was refused
	ramFD   = 3           // the first of exec.Cmd.ExtraFiles
)

// errRAMBusy is a RAM file whose lock another process holds: a QEMU maps it.
var errRAMBusy = errors.New("RAM file in use by another QEMU")

// refusedError is a saved snapshot that restore will not resume: it does not match its own sidecar,
// its RAM file or disk does not match it, or another route saved it (savedBy: that route's name).
type refusedError struct {
	why     string
	savedBy string
}

func (e *refusedError) Error() string { return "snapshot refused: " + e.why }

// checkOwner refuses a snapshot that route saved when it is not this backend's route: a snapshot_dir
// that two routes have used (shared by mistake, or kept across a rename) must not resume one route's
// guest in another. A snapshot saved before sidecars named their route ("") is resumed, as it was
// before: its snapshot_dir was the route's own by config, and the next save names the route.
func (b *Backend) checkOwner(route string) error {
	if route == "" || route == b.name {
		return nil
	}
	return &refusedError{why: fmt.Sprintf("saved by route %q, not by this route %q (a snapshot_dir that both have used)", route, b.name), savedBy: route}
}

// ramSidecar is the RAM file's sidecar (guest.ram.gen), written at a save and removed before a QEMU
// maps the file again.
type ramSidecar struct {
	Generation string `json:"generation"`
	Bytes      int64  `json:"bytes"`        // the RAM file's size at the save
	HostBoot   string `json:"host_boot_id"` // the host's boot id at the save
	Synced     bool   `json:"synced"`       // the RAM file, the device state and its sidecar are on disk
}

// devSidecar is the device state's sidecar (guest.dev.gen): its commit.
type devSidecar struct {
	Generation string  `json:"generation"`
	Bytes      int64   `json:"bytes"`
	SHA256     string  `json:"sha256"`
	RAMBytes   int64   `json:"ram_bytes"`
	Disk       *diskID `json:"disk"`            // the guest's disk at the save (disk.go)
	Route      string  `json:"route,omitempty"` // the route that saved it (checkOwner); "" from an activator before it
}

// ramPlan is how a snapshot-mode route keeps its guest's RAM, and why. Open decides it once; Check
// reports it.
type ramPlan struct {
	file   bool // the guest's RAM is the route's RAM file, and a snapshot its device state only
	reason string
}

func (p ramPlan) mode() string {
	if p.file {
		return RAMFile
	}
	return RAMCopy
}

// ramHost is what the host says about giving a route's guest a RAM file. readRAMHost fills it from
// the running system; tests build their own.
type ramHost struct {
	fsType  int64 // statfs f_type of snapshot_dir, or of its nearest existing parent
	fsErr   error
	backend error // nil when QEMU's machine takes the memory-backend property
}

func readRAMHost(ctx context.Context, bin string, s *Settings) ramHost {
	h := ramHost{backend: machineTakesBackend(ctx, bin, s.Machine)}
	dir := s.SnapshotDir
	for {
		var st unix.Statfs_t
		err := unix.Statfs(dir, &st)
		if err == nil || !errors.Is(err, unix.ENOENT) || dir == filepath.Dir(dir) {
			h.fsType, h.fsErr = st.Type, err
			return h
		}
		dir = filepath.Dir(dir)
	}
}

// problem says why the host cannot give the guest a RAM file that frees its memory while it sleeps
// ("" when it can).
func (h ramHost) problem(dir string) string {
	switch {
	case h.backend != nil:
		return fmt.Sprintf("qemu cannot map the guest's RAM from a file: %v", h.backend)
	case h.fsErr != nil:
		return fmt.Sprintf("snapshot_dir: %v", h.fsErr)
	case h.fsType == unix.TMPFS_MAGIC || h.fsType == unix.RAMFS_MAGIC:
		return fmt.Sprintf("snapshot_dir %s is in memory (tmpfs or ramfs): a RAM file there is never reclaimed while the guest sleeps", dir)
	}
	return ""
}

// planRAM decides where a snapshot-mode guest's RAM lives. auto takes a RAM file unless the settings
// (fileRAMRuledOut) or the host (ramHost.problem) rule it out; file is taken as configured (Check
// reports a host that cannot do it).
func planRAM(s *Settings, h ramHost) ramPlan {
	if s.Sleep != SleepSnapshot {
		return ramPlan{reason: "sleep: " + s.Sleep + " takes no snapshot"}
	}
	switch s.SnapshotRAM {
	case RAMCopy:
		return ramPlan{reason: "snapshot_ram: copy configured"}
	case RAMFile:
		if why := h.problem(s.SnapshotDir); why != "" {
			return ramPlan{file: true, reason: "snapshot_ram: file configured, but " + why}
		}
		return ramPlan{file: true, reason: "snapshot_ram: file configured"}
	}
	if why := fileRAMRuledOut(s); why != "" {
		return ramPlan{reason: "snapshot_ram auto: copy, as " + why}
	}
	if why := h.problem(s.SnapshotDir); why != "" {
		return ramPlan{reason: "snapshot_ram auto: copy, as " + why}
	}
	return ramPlan{file: true, reason: fmt.Sprintf("snapshot_ram auto: file, as QEMU maps machine %s's RAM from a file and snapshot_dir is on disk", s.Machine)}
}

// fileRAMRuledOut says why the route's settings rule out a RAM file ("" when they do not).
func fileRAMRuledOut(s *Settings) string {
	switch {
	case s.SnapshotCompress == "zstd":
		return "snapshot_compress: zstd compresses a copy of the RAM, and a RAM file is not compressed"
	case s.KeepSnapshot:
		return "keep_snapshot: a kept snapshot can be restored again only from its own copy of the RAM"
	case ramBlockID(s.Machine) == "":
		return fmt.Sprintf("machine %q: the name of its RAM block is not known to the backing", s.Machine)
	}
	for _, a := range s.ExtraArgs {
		opt := strings.TrimLeft(a, "-")
		if strings.HasPrefix(a, "-") && (opt == "mem-path" || opt == "mem-prealloc" || opt == "numa") || strings.Contains(a, "memory-backend") {
			return fmt.Sprintf("extra_args configure the guest's memory themselves (%q)", a)
		}
	}
	return ""
}

// ramBlockID is the name QEMU gives the machine's RAM block when the machine allocates it itself
// (MachineClass default_ram_id). The memory backend takes it as its id, so the RAM block is named alike
// in both modes and a copied snapshot loads into a QEMU whose RAM is the file, and back.
func ramBlockID(machine string) string {
	switch {
	case machine == "microvm":
		return "microvm.ram"
	case machine == "isapc" || strings.HasPrefix(machine, "pc") || strings.HasPrefix(machine, "q35"):
		return "pc.ram"
	}
	return ""
}

// machineTakesBackend runs `qemu -M MACHINE,help`: nil when the machine lists the memory-backend
// property (QEMU 5.0 and later; x-ignore-shared is older). The answer is a fact of the binary, asked
// by every snapshot route's Check (at start-up and at each reload), its Open and its notes in
// `activator check`, and each run of QEMU costs 30–50 ms of CPU here. So an answer is kept for as long
// as the binary's file stays the same (machineAnswers); a run that failed is asked again next time.
func machineTakesBackend(ctx context.Context, bin, machine string) error {
	var st unix.Stat_t
	keyed := unix.Stat(bin, &st) == nil
	key := machineKey{bin: bin, machine: machine, dev: uint64(st.Dev), ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano()}
	if keyed {
		if v, ok := machineAnswers.Load(key); ok {
			return v.(machineAnswer).err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "-M", machine+",help").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s -M %s,help: %v: %.200s", bin, machine, err, bytes.TrimSpace(out))
	}
	if !bytes.Contains(out, []byte("memory-backend=")) {
		err = fmt.Errorf("machine %s has no memory-backend property (QEMU 5.0 or later has it)", machine)
	}
	if keyed {
		machineAnswers.Store(key, machineAnswer{err})
	}
	return err
}

// machineAnswers holds machineTakesBackend's answers (machineAnswer) by machineKey: a binary replaced
// or upgraded in place has another key, and is asked again.
var machineAnswers sync.Map

// machineKey is a QEMU binary, by its path and its file's identity, and a machine type.
type machineKey struct {
	bin, machine string
	dev, ino     uint64
	size, mtime  int64
}

type machineAnswer struct{ err error }

func (b *Backend) ramPath() string { return filepath.Join(b.s.SnapshotDir, ramBase) }
func (b *Backend) devPath() string { return filepath.Join(b.s.SnapshotDir, devBase) }
func (b *Backend) ramBytes() int64 { return int64(b.s.Memory) << 20 }

// freshRAM readies the RAM file for a guest that continues no saved RAM (a cold boot, or the restore
// of a copied snapshot): it is locked, its sidecar and any device state saved with it are removed, and
// it is emptied to the guest's size. It returns the file locked, for start.
func (b *Backend) freshRAM() (*os.File, error) {
	if err := b.useSnapshotDir(); err != nil {
		return nil, fmt.Errorf("snapshot dir: %w", err)
	}
	f, err := lockRAM(b.ramPath(), true)
	if err != nil {
		return nil, err
	}
	if err := b.invalidate(); err != nil {
		f.Close()
		return nil, err
	}
	if err := resetRAM(f, b.ramBytes()); err != nil {
		f.Close()
		return nil, fmt.Errorf("RAM file %s: %w", b.ramPath(), err)
	}
	return f, nil
}

// invalidate removes the RAM file's sidecar (durably, when there was one: a host crash must not bring
// it back for a RAM file that has run since), then the device state and its sidecar.
func (b *Backend) invalidate() error {
	b.gen.Lock()
	defer b.gen.Unlock()
	b.savedGen = ""
	err := os.Remove(b.ramPath() + genExt)
	if err == nil {
		err = syncPaths(b.s.SnapshotDir)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("invalidate the RAM file: %w", err)
	}
	return removeFiles(b.devPath(), b.devPath()+genExt)
}

// savedRAM checks the device state in guest.dev and that the RAM file belongs to it, and returns the RAM
// file locked, its sidecar removed: from here on the guest changes its RAM, which then matches no
// saved device state. A mismatch is a *refusedError; a RAM file another QEMU holds, errRAMBusy. held:
// the route's standby QEMU holds the RAM file (and its lock): the checks are the same, and the file
// is not returned (nil).
func (b *Backend) savedRAM(held bool) (*os.File, error) {
	dev, err := checkDevice(b.devPath())
	if err != nil {
		return nil, err
	}
	if err := b.checkOwner(dev.Route); err != nil {
		return nil, err
	}
	if why := diskMoved(dev.Disk, b.s.Disk); why != "" {
		return nil, &refusedError{why: why}
	}
	if held {
		fi, err := os.Stat(b.ramPath())
		if errors.Is(err, fs.ErrNotExist) {
			return nil, &refusedError{why: "RAM file " + ramBase + " missing"}
		}
		if err != nil {
			return nil, err
		}
		return nil, b.claimRAM(dev, fi.Size())
	}
	f, err := lockRAM(b.ramPath(), false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, &refusedError{why: "RAM file " + ramBase + " missing"}
	}
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err == nil {
		err = b.claimRAM(dev, fi.Size())
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// claimRAM matches the RAM file's sidecar with the device state's and removes it, durably when the save
// had reached the disk (after a host crash an unsynced sidecar is refused anyway).
func (b *Backend) claimRAM(dev devSidecar, size int64) error {
	b.gen.Lock()
	defer b.gen.Unlock()
	b.savedGen = ""
	side := b.ramPath() + genExt
	var rs ramSidecar
	if err := readSidecar(side, &rs); errors.Is(err, fs.ErrNotExist) {
		return &refusedError{why: "the RAM file has no generation: it has run since the save"}
	} else if err != nil {
		return &refusedError{why: fmt.Sprintf("the RAM file's sidecar: %v", err)}
	}
	if why := matchRAM(rs, dev, size, b.ramBytes(), hostBootID()); why != "" {
		return &refusedError{why: why}
	}
	if err := os.Remove(side); err != nil {
		return fmt.Errorf("claim the RAM file: %w", err)
	}
	if rs.Synced {
		return syncPaths(b.s.SnapshotDir)
	}
	return nil
}

// matchRAM says why a RAM file of size bytes, with sidecar rs, cannot resume the device state whose
// sidecar is dev in a guest of want bytes on host boot boot ("" when it can).
func matchRAM(rs ramSidecar, dev devSidecar, size, want int64, boot string) string {
	switch {
	case rs.Generation != dev.Generation:
		return fmt.Sprintf("the RAM file is of generation %.8s, the device state of %.8s", rs.Generation, dev.Generation)
	case size != want:
		return fmt.Sprintf("the RAM file is %d bytes, the guest's memory %d", size, want)
	case size != rs.Bytes || size != dev.RAMBytes:
		return fmt.Sprintf("the RAM file is %d bytes, it was %d at the save", size, rs.Bytes)
	case !rs.Synced && (rs.HostBoot == "" || rs.HostBoot != boot):
		return "the host restarted after the save, before the RAM file had reached the disk"
	}
	return ""
}

// checkDevice checks the device state against its sidecar: its size and SHA-256.
func checkDevice(file string) (devSidecar, error) {
	var dev devSidecar
	if err := readSidecar(file+genExt, &dev); err != nil {
		return dev, &refusedError{why: fmt.Sprintf("device state without a valid sidecar (%v)", err)}
	}
	sum, n, err := hashFile(file)
	if err != nil {
		return dev, &refusedError{why: fmt.Sprintf("device state unreadable (%v)", err)}
	}
	if n != dev.Bytes || sum != dev.SHA256 {
		return dev, &refusedError{why: fmt.Sprintf("device state corrupt: %d bytes, sha256 %.12s; saved as %d bytes, sha256 %.12s", n, sum, dev.Bytes, dev.SHA256)}
	}
	return dev, nil
}

// binding is a device state's binding to the RAM file, written beside both sidecars before QEMU quits
// (prepareBind) and put in place once it has (commitBind). Writing is what can fail for want of room,
// and while QEMU still runs the guest a failed write can still be undone: the guest is continued and
// the sleep fails. Found on a snapshot_dir with room for the device state but not its sidecar: the
// binding failed after QEMU had quit, the sleep had already said ok, and the guest was lost.
type binding struct {
	rs             ramSidecar
	ramTmp, devTmp string // the sidecars, written beside their final paths
}

// prepareBind writes the binding of the device state just saved (dev: its size and hash) to the RAM
// file beside both sidecars: a new generation, in the RAM file's and in the device state's, which
// also records the guest's disk (disk.go). QEMU has stopped the guest and saved its devices, so the
// RAM file no longer changes (it keeps its size), nor does the disk. On failure nothing of it is left.
func (b *Backend) prepareBind(dev devSidecar) (*binding, error) {
	fi, err := os.Stat(b.ramPath())
	if err != nil {
		return nil, fmt.Errorf("RAM file: %w", err)
	}
	if dev.Disk, err = readDiskID(b.s.Disk); err != nil {
		return nil, err
	}
	dev.Route = b.name
	bd := &binding{rs: ramSidecar{Generation: newGeneration(), Bytes: fi.Size(), HostBoot: hostBootID()}}
	dev.Generation, dev.RAMBytes = bd.rs.Generation, fi.Size()
	if bd.ramTmp, err = writeSidecarTemp(b.ramPath()+genExt, bd.rs); err != nil {
		return nil, fmt.Errorf("bind the snapshot to its RAM file: %w", err)
	}
	if bd.devTmp, err = writeSidecarTemp(b.devPath()+genExt, dev); err != nil {
		_ = os.Remove(bd.ramTmp)
		return nil, fmt.Errorf("bind the snapshot to its RAM file: %w", err)
	}
	return bd, nil
}

// discard removes a binding that will not be committed.
func (bd *binding) discard() { _ = removeFiles(bd.ramTmp, bd.devTmp) }

// commitBind puts a prepared binding in place once QEMU has exited (its lock on the RAM file is free,
// so nothing writes the RAM any more): the RAM file's sidecar first, then the device state's, which
// commits the snapshot. Making the save durable is left to syncSaved.
func (b *Backend) commitBind(bd *binding) error {
	f, err := lockRAM(b.ramPath(), false)
	if err != nil {
		bd.discard()
		return fmt.Errorf("RAM file after qemu quit: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err == nil && fi.Size() != bd.rs.Bytes {
		err = fmt.Errorf("RAM file is %d bytes after qemu quit, %d at the save", fi.Size(), bd.rs.Bytes)
	}
	if err != nil {
		bd.discard()
		return err
	}
	b.gen.Lock()
	defer b.gen.Unlock()
	if err := os.Rename(bd.ramTmp, b.ramPath()+genExt); err != nil {
		bd.discard()
		return fmt.Errorf("write sidecar: %w", err)
	}
	if err := os.Rename(bd.devTmp, b.devPath()+genExt); err != nil {
		bd.discard()
		return fmt.Errorf("write sidecar: %w", err)
	}
	b.savedGen = bd.rs.Generation
	b.wg.Add(1)
	go b.syncSaved(bd.rs)
	return nil
}

// syncSaved makes the save of generation rs durable: the RAM file's dirty pages, the device state and
// its sidecar reach the disk, then the RAM file's sidecar is rewritten with synced set, which lets a
// restore after a host restart trust the RAM file. A wake or boot that begins meanwhile clears
// savedGen, and then nothing is rewritten; nor is a sidecar that is no longer the one commitBind put in place.
// Close joins it.
func (b *Backend) syncSaved(rs ramSidecar) {
	defer b.wg.Done()
	started := time.Now()
	if err := syncPaths(b.ramPath(), b.devPath(), b.devPath()+genExt, b.s.SnapshotDir); err != nil {
		b.log.Warn("snapshot not made durable: after a host restart the guest will cold-boot", "err", err)
		return
	}
	b.gen.Lock()
	defer b.gen.Unlock()
	if b.savedGen != rs.Generation {
		return
	}
	// The sidecar as commitBind put it in place, or nothing: one removed or rewritten meanwhile (by hand, or
	// damage) unbinds the RAM file, and rewriting it would bind it again (swapSidecar).
	side := b.ramPath() + genExt
	synced := rs
	synced.Synced = true
	swapped, err := swapSidecar(side, rs, synced)
	if err == nil && !swapped {
		b.log.Warn("snapshot not marked durable: the RAM file's sidecar changed after the save, so the next wake refuses the snapshot", "sidecar", side)
		return
	}
	if err == nil {
		err = syncPaths(side, b.s.SnapshotDir)
	}
	if err != nil {
		b.log.Warn("snapshot not marked durable: after a host restart the guest will cold-boot", "err", err)
		return
	}
	b.log.Debug("snapshot durable", "ms", sinceMs(started))
}

// dropRAM removes the RAM file and its sidecar unless a QEMU holds it: after a guest's QEMU has quit
// without a snapshot, or its RAM went into a copy, the file holds nothing of use.
func (b *Backend) dropRAM() {
	f, err := lockRAM(b.ramPath(), false)
	if err != nil {
		return
	}
	defer f.Close()
	b.gen.Lock()
	defer b.gen.Unlock()
	b.savedGen = ""
	_ = removeFiles(b.ramPath()+genExt, b.ramPath())
}

// savedSnapshot names the snapshot a restore would find (the device state, or a copied snapshot in
// either compression), or "" when there is none.
func (b *Backend) savedSnapshot() string {
	file, other := b.snapFile()
	for _, f := range []string{b.devPath(), file, other} {
		if exists(f) {
			return filepath.Base(f)
		}
	}
	return ""
}

// removeSnapshots removes every saved snapshot of the route (both modes, temp files and sidecars
// included, not those moved aside) and the RAM file's sidecar: a live guest supersedes them. The
// sidecars' own temp files go too, as far as they can: an activator killed between writing a binding
// and putting it in place left them for good (found by an operator trial). One that cannot be removed
// fails the write that would use its name, with its own error, not this removal.
func (b *Backend) removeSnapshots() error {
	file, other := b.snapFile()
	b.gen.Lock()
	defer b.gen.Unlock()
	b.savedGen = ""
	_ = removeFiles(b.ramPath()+genExt+".tmp", b.devPath()+genExt+".tmp", file+genExt+".tmp", other+genExt+".tmp")
	return removeFiles(b.ramPath()+genExt, b.devPath()+genExt, b.devPath(), b.devPath()+".tmp",
		file, file+".tmp", file+genExt, other, other+".tmp", other+genExt)
}

// lockRAM opens the RAM file (creating it with create) and takes its exclusive flock without waiting.
// The lock belongs to the open file: QEMU inherits the descriptor, and holds the lock until it exits.
func lockRAM(path string, create bool) (*os.File, error) {
	flag := os.O_RDWR
	if create {
		flag |= os.O_CREATE
	}
	f, err := os.OpenFile(path, flag, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", errRAMBusy, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// resetRAM empties f and gives it size bytes of zeros, allocated on disk where the filesystem can: a
// guest that touches a page of a sparse file on a full disk kills QEMU (SIGBUS). When the disk has not
// the room, f is left empty: an allocation that failed half-way must not keep what it took of a
// disk that is already short of space.
func resetRAM(f *os.File, size int64) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	err := unix.Fallocate(int(f.Fd()), 0, 0, size)
	switch {
	case errors.Is(err, unix.EOPNOTSUPP):
		return f.Truncate(size)
	case err != nil:
		_ = f.Truncate(0)
	}
	return err
}

// holdsFile reports whether process pid has file open.
func holdsFile(pid int, file string) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == file {
			return true
		}
	}
	return false
}

// prefetch asks the kernel to read file into the page cache in the background (posix_fadvise
// WILLNEED), so a copied snapshot gone cold on disk is read while QEMU starts.
func prefetch(file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_WILLNEED)
}

func hashFile(file string) (sum string, n int64, err error) {
	f, err := os.Open(file)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err = io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil)), n, err
}

// writeSidecar writes v as JSON through a temp file and a rename: a reader finds the old sidecar or
// the new one, never a part.
func writeSidecar(path string, v any) error {
	tmp, err := writeSidecarTemp(path, v)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write sidecar: %w", err)
	}
	return nil
}

// writeSidecarTemp writes v beside the sidecar at path, for a rename or an exchange, and returns
// where.
func writeSidecarTemp(path string, v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		_ = os.Remove(tmp) // a part written before the disk filled, or the empty file
		return "", fmt.Errorf("write sidecar: %w", err)
	}
	return tmp, nil
}

// swapSidecar puts v in place of the RAM file's sidecar at path only if path holds exactly was at that
// moment, and reports whether it did. A check before a plain rename (writeSidecar) leaves a window in
// which a sidecar removed or rewritten by someone else is brought back, binding a RAM file that was
// unbound (found as a flake of TestStandbyRefusesUnboundRAM). So v is written beside path and
// exchanged with it in one step (renameat2 RENAME_EXCHANGE), which fails when path is gone; what
// comes back is checked against was, and put back when it is not. Where the filesystem cannot
// exchange (EINVAL), it checks path and then renames as writeSidecar does, which leaves that window.
func swapSidecar(path string, was, v ramSidecar) (bool, error) {
	tmp, err := writeSidecarTemp(path, v)
	if err != nil {
		return false, err
	}
	err = unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_EXCHANGE)
	switch {
	case errors.Is(err, unix.ENOENT): // path was removed
		_ = os.Remove(tmp)
		return false, nil
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS):
		var cur ramSidecar
		if err := readSidecar(path, &cur); err != nil || cur != was {
			_ = os.Remove(tmp)
			return false, nil
		}
		if err := os.Rename(tmp, path); err != nil {
			return false, fmt.Errorf("write sidecar: %w", err)
		}
		return true, nil
	case err != nil:
		_ = os.Remove(tmp)
		return false, fmt.Errorf("write sidecar: %w", err)
	}
	// tmp holds what path held until the exchange.
	var prev ramSidecar
	if err := readSidecar(tmp, &prev); err != nil || prev != was {
		if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_EXCHANGE); err != nil {
			return true, fmt.Errorf("put back the sidecar written meanwhile: %w", err)
		}
		_ = os.Remove(tmp)
		return false, nil
	}
	return true, os.Remove(tmp)
}

func readSidecar(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return nil
}

// removeFiles removes files, those already gone included; it returns the first other failure.
func removeFiles(files ...string) error {
	var first error
	for _, f := range files {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) && first == nil {
			first = err
		}
	}
	return first
}

// hostBootID is the kernel's boot id, new at every host boot ("" when unreadable).
func hostBootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func newGeneration() string {
	return rand.Text()
}
