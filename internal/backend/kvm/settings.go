package kvm

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/registry"
)

// Sleep modes.
const (
	SleepPause    = "pause"    // QMP stop; the guest keeps its RAM; wake is a QMP cont
	SleepSnapshot = "snapshot" // RAM and device state to a file, QEMU quits; wake restores the file
	SleepPoweroff = "poweroff" // ACPI power button, QEMU quits; wake is a cold boot
)

// RAM modes of snapshot sleep (snapshot_ram): where a sleeping guest's memory is kept.
const (
	RAMAuto = "auto" // file, unless the settings or the host rule it out (Open logs which, and why)
	RAMFile = "file" // the guest's RAM is a shared file in snapshot_dir; the snapshot holds the device state only
	RAMCopy = "copy" // the RAM is copied into the snapshot file (QEMU migrates the whole guest to a file)
)

// Accelerator choices.
const (
	AccelAuto = "auto" // KVM when it can run guests, else TCG (the reason is logged)
	AccelKVM  = "kvm"
	AccelTCG  = "tcg"
)

// Network modes.
const (
	NetUser = "user" // QEMU user networking with a host-forward from the route's upstream
	NetNone = "none" // no network device; bring your own with extra_args
)

// Defaults applied by Decode.
const (
	DefaultQEMU        = "qemu-system-x86_64"
	DefaultMachine     = "microvm"
	DefaultMemoryMiB   = 128
	DefaultCPUs        = 1
	DefaultAppend      = "console=ttyS0 quiet"
	DefaultGuestPort   = 80
	DefaultDiskFormat  = "raw"
	DefaultQEMUStart   = 10 * time.Second
	DefaultQMP         = 10 * time.Second
	DefaultRestore     = 60 * time.Second
	DefaultRunning     = 10 * time.Second
	DefaultPowerdown   = 10 * time.Second
	DefaultQuit        = 10 * time.Second
	maxUnixSocketBytes = 107 // sun_path is 108 bytes, NUL included
)

// Settings is a kvm route's `kvm:` block after Decode: defaults applied, paths absolute, everything
// validated. It is immutable once returned.
type Settings struct {
	// QEMU is the emulator binary, looked up in PATH when it has no slash.
	QEMU string `yaml:"qemu"`
	// Machine is QEMU's -M value (microvm, pc, q35, ...).
	Machine string `yaml:"machine"`
	// Accel is auto, kvm or tcg.
	Accel string `yaml:"accel"`
	// Memory is the guest RAM in MiB.
	Memory int `yaml:"memory"`
	// CPUs is the number of virtual CPUs.
	CPUs int `yaml:"cpus"`
	// Kernel, Initrd and Append boot a kernel directly (absolute paths).
	Kernel string `yaml:"kernel"`
	Initrd string `yaml:"initrd"`
	Append string `yaml:"append"`
	// Disk is a disk image (absolute path) attached as a virtio block device; DiskFormat is raw or qcow2.
	Disk       string `yaml:"disk"`
	DiskFormat string `yaml:"disk_format"`
	// Network is the guest's network.
	Network Network `yaml:"network"`
	// ExtraArgs are appended to QEMU's command line as they are (no shell).
	ExtraArgs []string `yaml:"extra_args"`
	// Sleep is pause, snapshot or poweroff.
	Sleep string `yaml:"sleep"`
	// SnapshotDir holds the snapshot file (snapshot mode). Private (0700); created on demand.
	SnapshotDir string `yaml:"snapshot_dir"`
	// SnapshotCompress is none or zstd.
	SnapshotCompress string `yaml:"snapshot_compress"`
	// SnapshotRAM is auto, file or copy: whether a snapshot-mode guest's RAM lives in a shared file in
	// SnapshotDir, so that the snapshot holds only the device state, or is copied into the snapshot.
	SnapshotRAM string `yaml:"snapshot_ram"`
	// KeepSnapshot keeps the snapshot file after a successful restore.
	KeepSnapshot bool `yaml:"keep_snapshot"`
	// Standby (snapshot mode) starts the next QEMU, waiting for a migration (-incoming defer), as
	// the guest goes to sleep, so that a wake only loads the snapshot into it and continues the
	// guest. It costs one idle QEMU per sleeping guest, which holds the forwarded port (network: user).
	Standby bool `yaml:"standby"`
	// RuntimeDir holds the QMP socket, the pid file and the console log. Private (0700).
	RuntimeDir string `yaml:"runtime_dir"`
	// KeepRunningOnExit leaves the guest running when the activator shuts down (it is re-adopted on
	// the next start). By default Close quits QEMU.
	KeepRunningOnExit bool `yaml:"keep_running_on_exit"`
	// Budgets bound each phase of a wake and the slow steps of a sleep.
	Budgets Budgets `yaml:"budgets"`

	// Derived by Decode.
	hostAddr string // upstream host (IPv4 literal) for the host-forward
	hostPort int    // upstream port
}

// Network configures the guest's network device.
type Network struct {
	// Mode is user (default: user networking with a host-forward from the route's upstream to
	// GuestPort) or none.
	Mode string `yaml:"mode"`
	// GuestPort is the guest's TCP port the upstream is forwarded to (default 80).
	GuestPort int `yaml:"guest_port"`
	// Restrict isolates a user-networked guest (QEMU's restrict=on): only the forwarded port
	// reaches it, and it reaches nothing, the host included. Without it the guest reaches the host's
	// loopback at 10.0.2.2 (the admin API there, other tenants' ports) and the outside world.
	Restrict bool `yaml:"restrict"`
}

// Budgets bound the phases of a wake and the slow steps of a sleep. Each also ends with the caller's
// context (the route's wake or sleep budget), whichever comes first.
type Budgets struct {
	QEMUStart registry.Duration `yaml:"qemu_start"` // spawn until QEMU has daemonized
	QMP       registry.Duration `yaml:"qmp"`        // QMP connect and handshake
	Restore   registry.Duration `yaml:"restore"`    // loading a snapshot
	Running   registry.Duration `yaml:"running"`    // cont until the guest runs
	Powerdown registry.Duration `yaml:"powerdown"`  // poweroff mode: grace after the ACPI power button
	Quit      registry.Duration `yaml:"quit"`       // QMP quit until the process is gone, then SIGKILL
}

// Decode is the kvm backing's registry.SettingsDecoder. It returns a *Settings or every problem found,
// each an *registry.Error whose Key is relative to the `kvm:` block.
func Decode(r *registry.Route, node *yaml.Node) (any, error) {
	s := &Settings{}
	if err := registry.DecodeStrict(node, s); err != nil {
		return nil, err
	}
	line := func(key string) int { return registry.KeyLine(node, key) }
	var errs []error
	bad := func(key, format string, args ...any) {
		top, _, _ := strings.Cut(key, ".")
		top, _, _ = strings.Cut(top, "[")
		errs = append(errs, &registry.Error{Key: key, Line: line(top), Err: fmt.Errorf(format, args...)})
	}
	if node == nil {
		bad("", "missing: a kvm route needs at least `kernel:` or `disk:`")
		return nil, errors.Join(errs...)
	}

	s.QEMU = or(s.QEMU, DefaultQEMU)
	s.Machine = or(s.Machine, DefaultMachine)
	s.Accel = or(s.Accel, AccelAuto)
	s.Sleep = or(s.Sleep, SleepPause)
	s.SnapshotCompress = or(s.SnapshotCompress, "none")
	s.SnapshotRAM = or(s.SnapshotRAM, RAMAuto)
	s.DiskFormat = or(s.DiskFormat, DefaultDiskFormat)
	s.Network.Mode = or(s.Network.Mode, NetUser)
	if s.Memory == 0 {
		s.Memory = DefaultMemoryMiB
	}
	if s.CPUs == 0 {
		s.CPUs = DefaultCPUs
	}
	if s.Network.GuestPort == 0 {
		s.Network.GuestPort = DefaultGuestPort
	}
	defDur(&s.Budgets.QEMUStart, DefaultQEMUStart)
	defDur(&s.Budgets.QMP, DefaultQMP)
	defDur(&s.Budgets.Restore, DefaultRestore)
	defDur(&s.Budgets.Running, DefaultRunning)
	defDur(&s.Budgets.Powerdown, DefaultPowerdown)
	defDur(&s.Budgets.Quit, DefaultQuit)
	if s.RuntimeDir == "" {
		s.RuntimeDir = defaultRuntimeDir(r.Name)
	}
	if s.SnapshotDir == "" {
		s.SnapshotDir = defaultSnapshotDir(r.Name)
	}

	switch s.Accel {
	case AccelAuto, AccelKVM, AccelTCG:
	default:
		bad("accel", "%q is not one of auto, kvm, tcg", s.Accel)
	}
	switch s.Sleep {
	case SleepPause, SleepSnapshot, SleepPoweroff:
	default:
		bad("sleep", "%q is not one of pause, snapshot, poweroff", s.Sleep)
	}
	checkSnapshot(s, bad)
	switch s.DiskFormat {
	case "raw", "qcow2":
	default:
		bad("disk_format", "%q is not one of raw, qcow2", s.DiskFormat)
	}
	if s.Memory < 16 || s.Memory > 1<<20 {
		bad("memory", "%d MiB is out of range (16 to 1048576)", s.Memory)
	}
	if s.CPUs < 1 || s.CPUs > 255 {
		bad("cpus", "%d is out of range (1 to 255)", s.CPUs)
	}
	if strings.ContainsAny(s.Machine, ", \t") {
		bad("machine", "%q: give the machine type only (put machine options in extra_args)", s.Machine)
	}

	// Boot source.
	if s.Kernel == "" && s.Disk == "" {
		bad("kernel", "missing: set kernel (direct boot) or disk (boot from a disk image)")
	}
	if s.Kernel == "" && (s.Initrd != "" || s.Append != "") {
		bad("initrd", "initrd and append need kernel")
	}
	if s.Kernel != "" && s.Append == "" {
		s.Append = DefaultAppend
	}
	for _, f := range []struct{ key, path string }{{"kernel", s.Kernel}, {"initrd", s.Initrd}, {"disk", s.Disk}} {
		if f.path == "" {
			continue
		}
		if err := checkFile(f.path); err != nil {
			bad(f.key, "%v", err)
		}
	}
	if s.Disk != "" && strings.Contains(s.Disk, ",") {
		bad("disk", "%q: a comma in the path cannot be passed to QEMU's -drive", s.Disk)
	}

	// Directories.
	// Cleaned as filepath.Join cleans the paths made in them, so that a ".." means the same to the
	// backing, to QEMU and to the check of who may change them (privdir).
	s.RuntimeDir, s.SnapshotDir = filepath.Clean(s.RuntimeDir), filepath.Clean(s.SnapshotDir)
	for _, d := range []struct{ key, path string }{{"runtime_dir", s.RuntimeDir}, {"snapshot_dir", s.SnapshotDir}} {
		if !filepath.IsAbs(d.path) {
			bad(d.key, "%q must be an absolute path", d.path)
		}
		if strings.ContainsAny(d.path, ",\n") {
			bad(d.key, "%q: commas and newlines cannot be passed to QEMU", d.path)
		}
	}
	if n := len(filepath.Join(s.RuntimeDir, sockName)); n > maxUnixSocketBytes {
		bad("runtime_dir", "%q is too long for a unix socket path (%d bytes, at most %d with %q)", s.RuntimeDir, n, maxUnixSocketBytes, sockName)
	}

	// Network.
	switch s.Network.Mode {
	case NetUser:
		if r.Upstream.Network != "tcp" {
			bad("network.mode", "user networking forwards a TCP port, but the route's upstream %q is not host:port", r.Upstream.String())
			break
		}
		host, port, err := net.SplitHostPort(r.Upstream.Address)
		if err != nil {
			bad("network.mode", "upstream %q: %v", r.Upstream.Address, err)
			break
		}
		if host == "localhost" {
			host = "127.0.0.1"
		}
		ip := net.ParseIP(host)
		if ip == nil || ip.To4() == nil {
			bad("network.mode", "upstream host %q: QEMU's host-forward needs an IPv4 address such as 127.0.0.1", host)
		}
		s.hostAddr = host
		s.hostPort, _ = strconv.Atoi(port)
	case NetNone:
		if s.Network.Restrict {
			bad("network.restrict", "only user networking has a network to restrict; with mode none the guest has none")
		}
	default:
		bad("network.mode", "%q is not one of user, none", s.Network.Mode)
	}
	if s.Network.GuestPort < 1 || s.Network.GuestPort > 65535 {
		bad("network.guest_port", "%d is not a TCP port", s.Network.GuestPort)
	}

	for i, a := range s.ExtraArgs {
		if strings.HasPrefix(a, "-") && isReserved(strings.TrimLeft(a, "-")) {
			bad(fmt.Sprintf("extra_args[%d]", i), "%q is managed by the kvm backing and cannot be given here", a)
		}
	}
	if len(errs) > 0 {
		// In file order, as the operator reads the block.
		slices.SortStableFunc(errs, func(a, b error) int { return a.(*registry.Error).Line - b.(*registry.Error).Line })
		return nil, errors.Join(errs...)
	}
	return s, nil
}

// checkSnapshot validates the snapshot settings, reporting each problem to bad.
func checkSnapshot(s *Settings, bad func(key, format string, args ...any)) {
	switch s.SnapshotCompress {
	case "none", "zstd":
	default:
		bad("snapshot_compress", "%q is not one of none, zstd", s.SnapshotCompress)
	}
	switch s.SnapshotRAM {
	case RAMAuto, RAMCopy:
	case RAMFile:
		if why := fileRAMRuledOut(s); why != "" {
			bad("snapshot_ram", "file: %s; use snapshot_ram: copy (or auto)", why)
		}
	default:
		bad("snapshot_ram", "%q is not one of auto, file, copy", s.SnapshotRAM)
	}
	if s.Standby && s.Sleep != SleepSnapshot {
		bad("standby", "true needs sleep: snapshot (a standby QEMU waits for a snapshot to load; sleep is %s)", s.Sleep)
	}
}

// isReserved reports whether opt (without its dashes) is a QEMU option the backing sets itself or
// relies on not being set, which extra_args may not give: a second monitor (qmp-pretty, monitor, mon),
// QEMU's log that explains a failed restore (D), the process name the backing finds its QEMU by
// (name), a config file that can set any of them (readconfig), a guest that pauses instead of
// ending when it powers off (no-shutdown, action), a start from a snapshot of its own (loadvm), and
// the console and devices the backing sets up (serial, nodefaults, no-user-config, display,
// nographic).
func isReserved(opt string) bool {
	switch opt {
	case "qmp", "qmp-pretty", "pidfile", "daemonize", "incoming", "S", "monitor", "mon", "serial", "no-reboot",
		"accel", "enable-kvm", "M", "machine", "m", "smp", "kernel", "initrd", "append",
		"D", "name", "readconfig", "no-shutdown", "action", "loadvm", "preconfig",
		"nodefaults", "no-user-config", "display", "nographic":
		return true
	}
	return false
}

func checkFile(p string) error {
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%q must be an absolute path", p)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("%w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%q is not a regular file", p)
	}
	return nil
}

// defaultRuntimeDir is runtime_dir's default: systemd's RuntimeDirectory= when the activator runs
// under a unit that has one (the shipped unit: /run/activator), else /run/activator for root, else
// the user's runtime dir, else a dir under $TMPDIR (privdir refuses it if another user made it).
func defaultRuntimeDir(route string) string {
	return defaultDir(route, "RUNTIME_DIRECTORY", "kvm", func() string {
		if os.Geteuid() == 0 {
			return "/run/activator"
		}
		if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
			return filepath.Join(d, "activator")
		}
		return ""
	})
}

// defaultSnapshotDir is snapshot_dir's default: systemd's StateDirectory= (the shipped unit:
// /var/lib/activator), else /var/lib/activator for root, else the user's cache dir, else $TMPDIR.
func defaultSnapshotDir(route string) string {
	return defaultDir(route, "STATE_DIRECTORY", "kvm-snapshots", func() string {
		if os.Geteuid() == 0 {
			return "/var/lib/activator"
		}
		if d, err := os.UserCacheDir(); err == nil {
			return filepath.Join(d, "activator")
		}
		return ""
	})
}

// defaultDir is <base>/kvm/<route>, base the first directory systemd lists in env (as tls.acme.storage
// takes $STATE_DIRECTORY), else fallback's; without either, $TMPDIR/activator-<uid>/<tmpName>/<route>.
func defaultDir(route, env, tmpName string, fallback func() string) string {
	if first, _, _ := strings.Cut(os.Getenv(env), ":"); filepath.IsAbs(first) {
		return filepath.Join(first, "kvm", route)
	}
	if base := fallback(); filepath.IsAbs(base) {
		return filepath.Join(base, "kvm", route)
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("activator-%d", os.Geteuid()), tmpName, route)
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func defDur(d *registry.Duration, def time.Duration) {
	if *d == 0 {
		*d = registry.Duration(def)
	}
}

var _ registry.HostChecker = (*Settings)(nil)

// CheckHost implements registry.HostChecker: the kernel, initrd and disk files are still regular
// files (the runtime and snapshot directories come from the activator's user and environment, which
// a reload does not change).
func (s *Settings) CheckHost(c *registry.HostCache) error {
	for _, p := range []string{s.Kernel, s.Initrd, s.Disk} {
		if p != "" {
			if _, err := c.Do("kvm.file\x00"+p, func() (string, error) { return "", checkFile(p) }); err != nil {
				return err
			}
		}
	}
	return nil
}

// Owns names what a guest must have to itself (registry.Owner): its runtime_dir (QMP socket, pid
// file: a second guest there is reaped as the first one's orphan), its snapshot_dir (snapshot and RAM
// file) and its disk image. `activator check` and every load refuse two routes that share one.
func (s *Settings) Owns() []registry.Owned {
	return []registry.Owned{{Key: "runtime_dir", Value: filepath.Clean(s.RuntimeDir)}, {Key: "snapshot_dir", Value: filepath.Clean(s.SnapshotDir)}, {Key: "disk", Value: s.Disk}}
}

var _ registry.Owner = (*Settings)(nil)
