package kvm

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/registry"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// fakeFiles creates a kernel, an initrd and a disk image to point settings at.
func fakeFiles(t *testing.T) (kernel, initrd, disk string) {
	t.Helper()
	d := t.TempDir()
	kernel, initrd, disk = filepath.Join(d, "vmlinux"), filepath.Join(d, "initrd.img"), filepath.Join(d, "disk.img")
	for _, f := range []string{kernel, initrd, disk} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return kernel, initrd, disk
}

func decode(t *testing.T, upstream, doc string) (*Settings, error) {
	t.Helper()
	u, err := registry.ParseUpstream(upstream)
	if err != nil {
		t.Fatal(err)
	}
	r := &registry.Route{Name: "vm", Backing: "kvm", Upstream: u}
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(doc), &n); err != nil {
		t.Fatal(err)
	}
	var node *yaml.Node
	if len(n.Content) > 0 {
		node = n.Content[0]
	}
	s, err := Decode(r, node)
	if err != nil {
		return nil, err
	}
	return s.(*Settings), nil
}

func TestDecodeDefaults(t *testing.T) {
	kernel, _, _ := fakeFiles(t)
	s, err := decode(t, "127.0.0.1:8081", "kernel: "+kernel+"\n")
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"qemu", s.QEMU, DefaultQEMU},
		{"machine", s.Machine, "microvm"},
		{"accel", s.Accel, AccelAuto},
		{"memory", s.Memory, 128},
		{"cpus", s.CPUs, 1},
		{"append", s.Append, DefaultAppend},
		{"sleep", s.Sleep, SleepPause},
		{"snapshot_compress", s.SnapshotCompress, "none"},
		{"snapshot_ram", s.SnapshotRAM, RAMAuto},
		{"network.mode", s.Network.Mode, NetUser},
		{"network.guest_port", s.Network.GuestPort, 80},
		{"budgets.qemu_start", s.Budgets.QEMUStart.D(), 10 * time.Second},
		{"budgets.restore", s.Budgets.Restore.D(), time.Minute},
		{"budgets.powerdown", s.Budgets.Powerdown.D(), 10 * time.Second},
		{"host-forward", s.hostAddr, "127.0.0.1"},
		{"host-forward port", s.hostPort, 8081},
		{"runtime_dir absolute", filepath.IsAbs(s.RuntimeDir), true},
		{"runtime_dir per route", filepath.Base(s.RuntimeDir), "vm"},
		{"snapshot_dir per route", filepath.Base(s.SnapshotDir), "vm"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestDecodeErrors(t *testing.T) {
	kernel, initrd, disk := fakeFiles(t)
	cases := []struct {
		name     string
		upstream string
		doc      string
		keys     []string // the keys of the problems, in order
		contains string   // in the first problem's message
	}{
		{"no block", "127.0.0.1:1", "", []string{""}, "kernel"},
		{"no boot source", "127.0.0.1:1", "memory: 64\n", []string{"kernel"}, "disk"},
		{"missing kernel file", "127.0.0.1:1", "kernel: /nonexistent/vmlinux\n", []string{"kernel"}, "no such file"},
		{"relative kernel", "127.0.0.1:1", "kernel: vmlinux\n", []string{"kernel"}, "absolute"},
		{"initrd without kernel", "127.0.0.1:1", "disk: " + disk + "\ninitrd: " + initrd + "\n", []string{"initrd"}, "need kernel"},
		{"bad sleep", "127.0.0.1:1", "kernel: " + kernel + "\nsleep: hibernate\n", []string{"sleep"}, "pause, snapshot, poweroff"},
		{"bad accel", "127.0.0.1:1", "kernel: " + kernel + "\naccel: hvf\n", []string{"accel"}, "auto, kvm, tcg"},
		{"unix upstream", "unix:/run/app.sock", "kernel: " + kernel + "\n", []string{"network.mode"}, "not host:port"},
		{"ipv6 upstream", "[::1]:8080", "kernel: " + kernel + "\n", []string{"network.mode"}, "IPv4"},
		{"unix upstream, no network", "unix:/run/app.sock", "kernel: " + kernel + "\nnetwork: {mode: none}\n", nil, ""},
		{"bad guest port", "127.0.0.1:1", "kernel: " + kernel + "\nnetwork: {guest_port: 70000}\n", []string{"network.guest_port"}, "TCP port"},
		{"memory", "127.0.0.1:1", "kernel: " + kernel + "\nmemory: 4\n", []string{"memory"}, "out of range"},
		{"reserved extra arg", "127.0.0.1:1", "kernel: " + kernel + "\nextra_args: [-device, virtio-rng-device, -qmp, 'unix:/x']\n", []string{"extra_args[2]"}, "managed"},
		// Found with the real binary: check accepted these, each of which undoes something the backing relies on.
		{"reserved extra args a trial found", "127.0.0.1:1", "kernel: " + kernel + "\nextra_args: [-qmp-pretty, 'unix:/y', -D, /tmp/q.log, -name, x, -readconfig, /tmp/q.cfg, -no-shutdown, -action, shutdown=pause]\n",
			[]string{"extra_args[0]", "extra_args[2]", "extra_args[4]", "extra_args[6]", "extra_args[8]", "extra_args[9]"}, "managed"},
		{"long runtime dir", "127.0.0.1:1", "kernel: " + kernel + "\nruntime_dir: /" + strings.Repeat("d", 120) + "\n", []string{"runtime_dir"}, "too long"},
		{"relative snapshot dir", "127.0.0.1:1", "kernel: " + kernel + "\nsnapshot_dir: snaps\n", []string{"snapshot_dir"}, "absolute"},
		{"compress", "127.0.0.1:1", "kernel: " + kernel + "\nsnapshot_compress: gzip\n", []string{"snapshot_compress"}, "none, zstd"},
		{"snapshot_ram", "127.0.0.1:1", "kernel: " + kernel + "\nsnapshot_ram: shared\n", []string{"snapshot_ram"}, "auto, file, copy"},
		{"snapshot_ram file, zstd", "127.0.0.1:1", "kernel: " + kernel + "\nsleep: snapshot\nsnapshot_ram: file\nsnapshot_compress: zstd\n", []string{"snapshot_ram"}, "snapshot_compress: zstd"},
		{"snapshot_ram file, keep_snapshot", "127.0.0.1:1", "kernel: " + kernel + "\nsleep: snapshot\nsnapshot_ram: file\nkeep_snapshot: true\n", []string{"snapshot_ram"}, "keep_snapshot"},
		{"snapshot_ram file, unknown machine", "127.0.0.1:1", "kernel: " + kernel + "\nmachine: virt\nsnapshot_ram: file\n", []string{"snapshot_ram"}, "RAM block"},
		{"snapshot_ram file, hugepages", "127.0.0.1:1", "kernel: " + kernel + "\nsnapshot_ram: file\nextra_args: [-mem-path, /dev/hugepages]\n", []string{"snapshot_ram"}, "extra_args"},
		{"standby without snapshot", "127.0.0.1:1", "kernel: " + kernel + "\nstandby: true\n", []string{"standby"}, "needs sleep: snapshot"},
		{"standby with snapshot", "127.0.0.1:1", "kernel: " + kernel + "\nsleep: snapshot\nstandby: true\n", nil, ""},
		{"unknown key", "127.0.0.1:1", "kernel: " + kernel + "\nmemroy: 64\n", []string{"memroy"}, "unknown key"},
		{"bad duration", "127.0.0.1:1", "kernel: " + kernel + "\nbudgets: {restore: soon}\n", []string{"budgets.restore"}, "not a duration"},
		{"all at once", "unix:/x.sock", "kernel: /no/such\nsleep: nap\naccel: x\n", []string{"kernel", "network.mode", "sleep", "accel"}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := decode(t, c.upstream, c.doc)
			var keys []string
			for _, e := range registry.Errors(err) {
				var re *registry.Error
				if !errors.As(e, &re) {
					t.Fatalf("problem %v is a %T, want *registry.Error", e, e)
				}
				keys = append(keys, re.Key)
			}
			if !slices.Equal(keys, c.keys) {
				t.Fatalf("problem keys = %q, want %q (err: %v)", keys, c.keys, err)
			}
			if c.contains != "" && !strings.Contains(registry.Errors(err)[0].Error(), c.contains) {
				t.Errorf("first problem %q does not mention %q", registry.Errors(err)[0], c.contains)
			}
		})
	}
}

// TestDecodeGolden checks the operator-facing text of the problems with a bad block, line numbers
// included, against testdata/errors.golden (go test -run Golden -update rewrites it).
func TestDecodeGolden(t *testing.T) {
	doc, err := os.ReadFile("testdata/bad.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, derr := decode(t, "unix:/run/vm.sock", string(doc))
	var lines []string
	for _, e := range registry.Errors(derr) {
		lines = append(lines, e.Error())
	}
	got := strings.Join(lines, "\n") + "\n"
	golden := "testdata/errors.golden"
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("problems:\n%s\nwant (%s):\n%s", got, golden, want)
	}
}

func TestChooseAccel(t *testing.T) {
	cases := []struct {
		name      string
		want      string
		facts     hostFacts
		accel     string
		reasonHas string
	}{
		{"no /dev/kvm", AccelAuto, hostFacts{devKVM: os.ErrNotExist}, AccelTCG, "unusable"},
		{"software kvm (kvm_pvm)", AccelAuto, hostFacts{kvmModules: []string{"kvm_pvm"}}, AccelTCG, "no vmx/svm"},
		{"flags but no hw module", AccelAuto, hostFacts{cpuVirt: true, kvmModules: []string{"kvm_pvm"}}, AccelTCG, "neither kvm_intel nor kvm_amd"},
		{"intel", AccelAuto, hostFacts{cpuVirt: true, kvmModules: []string{"kvm_intel"}}, AccelKVM, "hardware"},
		{"amd", AccelAuto, hostFacts{cpuVirt: true, kvmModules: []string{"kvm_amd"}}, AccelKVM, "hardware"},
		{"forced tcg", AccelTCG, hostFacts{cpuVirt: true, kvmModules: []string{"kvm_intel"}}, AccelTCG, "configured"},
		{"forced kvm", AccelKVM, hostFacts{devKVM: os.ErrNotExist}, AccelKVM, "configured"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			accel, reason := chooseAccel(c.want, c.facts)
			if accel != c.accel || !strings.Contains(reason, c.reasonHas) {
				t.Errorf("chooseAccel = %q (%q), want %q (reason mentioning %q)", accel, reason, c.accel, c.reasonHas)
			}
		})
	}
}

func TestArgv(t *testing.T) {
	kernel, initrd, disk := fakeFiles(t)
	for _, c := range []struct {
		machine string
		want    []string
	}{
		{"microvm", []string{"virtio-net-device,netdev=net0", "virtio-blk-device,drive=disk0"}},
		{"q35", []string{"virtio-net-pci,netdev=net0,romfile=", "virtio-blk-pci,drive=disk0"}},
	} {
		t.Run(c.machine, func(t *testing.T) {
			s, err := decode(t, "127.0.0.1:8081", "machine: "+c.machine+"\nkernel: "+kernel+"\ninitrd: "+initrd+"\ndisk: "+disk+"\nnetwork: {guest_port: 8000}\nextra_args: [-device, virtio-rng-device]\n")
			if err != nil {
				t.Fatal(err)
			}
			a := argv("vm", s, newPaths(s), AccelTCG, launch{incoming: true})
			joined := strings.Join(a, " ")
			if strings.Contains(joined, "memory-backend") {
				t.Errorf("argv without a RAM file names a memory backend:\n%s", joined)
			}
			for _, w := range append(c.want,
				"-accel tcg", "-M "+c.machine, "-m 128", "-daemonize", "-no-reboot",
				"-qmp unix:"+filepath.Join(s.RuntimeDir, sockName)+",server=on,wait=off",
				"user,id=net0,hostfwd=tcp:127.0.0.1:8081-:8000",
				"-kernel "+kernel, "-initrd "+initrd,
				"-device virtio-rng-device -incoming defer") {
				if !strings.Contains(joined, w) {
					t.Errorf("argv lacks %q:\n%s", w, joined)
				}
			}
		})
	}
}

// With a RAM file (file mode) the guest's memory is the inherited descriptor ramFD, shared, under the
// machine's own RAM block name.
func TestArgvRAMFile(t *testing.T) {
	kernel, _, _ := fakeFiles(t)
	for machine, id := range map[string]string{"microvm": "microvm.ram", "q35": "pc.ram", "pc-i440fx-7.2": "pc.ram"} {
		t.Run(machine, func(t *testing.T) {
			s, err := decode(t, "127.0.0.1:8081", "machine: "+machine+"\nkernel: "+kernel+"\nsleep: snapshot\nmemory: 256\n")
			if err != nil {
				t.Fatal(err)
			}
			ram, err := os.CreateTemp(t.TempDir(), "ram")
			if err != nil {
				t.Fatal(err)
			}
			defer ram.Close()
			joined := strings.Join(argv("vm", s, newPaths(s), AccelTCG, launch{ram: ram}), " ")
			for _, w := range []string{
				"-object memory-backend-file,id=" + id + ",size=256M,mem-path=/proc/self/fd/3,share=on",
				"-M " + machine + ",memory-backend=" + id + " -m 256",
			} {
				if !strings.Contains(joined, w) {
					t.Errorf("argv lacks %q:\n%s", w, joined)
				}
			}
		})
	}
}

// CheckHost passes while the kernel, initrd and disk are regular files, and fails once one is not.
func TestCheckHost(t *testing.T) {
	kernel, initrd, disk := fakeFiles(t)
	s, err := decode(t, "127.0.0.1:8081", "kernel: "+kernel+"\ninitrd: "+initrd+"\ndisk: "+disk+"\n")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CheckHost(&registry.HostCache{}); err != nil {
		t.Fatalf("unchanged host: %v", err)
	}
	for _, f := range []string{initrd, disk} {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
		if err := s.CheckHost(&registry.HostCache{}); err == nil {
			t.Errorf("%s removed: CheckHost passed", f)
		}
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(kernel); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(kernel, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckHost(&registry.HostCache{}); err == nil {
		t.Error("kernel replaced by a directory: CheckHost passed")
	}
}

// TestLoadRefusesSharedDirs: two guests that share a runtime_dir reap each other's QEMU as an orphan
// (found with the real binary: a reload adding the second route killed the first route's guest), and
// two that share a snapshot_dir or a disk resume or corrupt each other's state. A load refuses each,
// for routes, instances and fleet members alike, naming both owners; guests with their own directories
// (the defaults, per route and member) load.
func TestLoadRefusesSharedDirs(t *testing.T) {
	kernel, _, disk := fakeFiles(t)
	d := t.TempDir()
	cfg := `routes:
  - name: g1
    host: g1.test
    backing: kvm
    upstream: 127.0.0.1:9101
    kvm: {kernel: ` + kernel + `, runtime_dir: ` + d + `/run, snapshot_dir: ` + d + `/snap1, disk: ` + disk + `}
  - name: g2
    host: g2.test
    backing: kvm
    upstream: 127.0.0.1:9102
    kvm: {kernel: ` + kernel + `, runtime_dir: ` + d + `/run/, snapshot_dir: ` + d + `/snap2}
  - name: fleet
    host: f.test
    backing: kvm
    kvm: {kernel: ` + kernel + `, runtime_dir: ` + d + `/frun}
    fleet:
      members:
        - {name: a, upstream: 127.0.0.1:9103, kvm: {snapshot_dir: ` + d + `/fa}}
        - {name: b, upstream: 127.0.0.1:9104, kvm: {snapshot_dir: ` + d + `/fb}}
instances:
  - name: i1
    backing: kvm
    upstream: 127.0.0.1:9105
    kvm: {kernel: ` + kernel + `, snapshot_dir: ` + d + `/snap1, disk: ` + disk + `}
  - name: fine1
    backing: kvm
    upstream: 127.0.0.1:9106
    kvm: {kernel: ` + kernel + `}
  - name: fine2
    backing: kvm
    upstream: 127.0.0.1:9107
    kvm: {kernel: ` + kernel + `}
`
	_, err := registry.Load([]byte(cfg), map[string]registry.SettingsDecoder{"kvm": Decode})
	if err == nil {
		t.Fatal("Load of guests sharing directories succeeded")
	}
	msg := err.Error()
	for _, want := range []string{
		`runtime_dir "` + d + `/run" is also that of route "g1" (kvm.runtime_dir)`,
		`runtime_dir "` + d + `/frun" is also that of route "fleet" member "a" (kvm.runtime_dir)`,
		`snapshot_dir "` + d + `/snap1" is also that of route "g1" (kvm.snapshot_dir)`,
		`disk "` + disk + `" is also that of route "g1" (kvm.disk)`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("Load's error does not say %q:\n%s", want, msg)
		}
	}
	if n := strings.Count(msg, "is also that of"); n != 4 {
		t.Errorf("Load found %d shared things, want 4 (fine1 and fine2 have their own defaults):\n%s", n, msg)
	}
}

// TestNetworkRestrict: network.restrict isolates a user-networked guest (restrict=on): without it the
// guest reaches the host's loopback at 10.0.2.2, the admin API there included, and check says so.
func TestNetworkRestrict(t *testing.T) {
	kernel, _, _ := fakeFiles(t)
	for _, c := range []struct {
		doc      string
		restrict bool
	}{
		{"kernel: " + kernel + "\n", false},
		{"kernel: " + kernel + "\nnetwork: {restrict: true}\n", true},
	} {
		s, err := decode(t, "127.0.0.1:8081", c.doc)
		if err != nil {
			t.Fatal(err)
		}
		joined := strings.Join(argv("vm", s, newPaths(s), AccelTCG, launch{}), " ")
		if got := strings.Contains(joined, "hostfwd=tcp:127.0.0.1:8081-:80,restrict=on"); got != c.restrict {
			t.Errorf("%q: restrict=on in argv: %v, want %v:\n%s", c.doc, got, c.restrict, joined)
		}
		notes := New(Options{}).Notes(context.Background(), &registry.Route{Name: "vm", Settings: s})
		warned := slices.ContainsFunc(notes, func(n string) bool { return strings.HasPrefix(n, "network: the guest reaches the host's loopback") })
		if warned == c.restrict {
			t.Errorf("%q: notes %q; want the loopback note: %v", c.doc, notes, !c.restrict)
		}
	}
	if _, err := decode(t, "127.0.0.1:8081", "kernel: "+kernel+"\nnetwork: {mode: none, restrict: true}\n"); err == nil || !strings.Contains(err.Error(), "network.restrict") {
		t.Errorf("restrict with mode none: %v, want a problem naming network.restrict", err)
	}
}

// TestLogTail: logTail reads the end of a log it quotes, not the whole file: a guest can make QEMU
// write to qemu.log without end.
func TestLogTail(t *testing.T) {
	f := filepath.Join(t.TempDir(), "qemu.log")
	body := strings.Repeat("device error\n", 400000) + "the last line\n" // about 5 MB
	if err := os.WriteFile(f, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := logTail(f, 20); got != "error\nthe last line" {
		t.Fatalf("logTail = %q, want the last 20 bytes, trimmed", got)
	}
	if got := logTail(filepath.Join(t.TempDir(), "none"), 20); got != "" {
		t.Fatalf("logTail of a missing file = %q", got)
	}
}

// TestDefaultDirs: runtime_dir and snapshot_dir default to systemd's RuntimeDirectory= and
// StateDirectory= when the unit has them (the shipped unit runs as an unprivileged user, for whom the
// defaults were $TMPDIR, private to the unit and lost at each restart, and the user's cache dir, which
// ProtectSystem=strict makes read-only), then to root's or the user's own.
func TestDefaultDirs(t *testing.T) {
	type dirs struct{ runtime, snapshot string }
	own := dirs{"/run/user/1000/activator/kvm/g", "/home/u/.cache/activator/kvm/g"}
	if os.Geteuid() == 0 {
		own = dirs{"/run/activator/kvm/g", "/var/lib/activator/kvm/g"}
	}
	cases := []struct {
		name string
		env  map[string]string
		want dirs
	}{
		{"systemd's", map[string]string{"RUNTIME_DIRECTORY": "/run/activator:/run/other", "STATE_DIRECTORY": "/var/lib/activator"},
			dirs{"/run/activator/kvm/g", "/var/lib/activator/kvm/g"}},
		{"relative ones ignored", map[string]string{"RUNTIME_DIRECTORY": "run", "STATE_DIRECTORY": "state"}, own},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
			t.Setenv("XDG_CACHE_HOME", "/home/u/.cache")
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			if got := defaultRuntimeDir("g"); got != c.want.runtime {
				t.Errorf("runtime_dir default %q, want %q", got, c.want.runtime)
			}
			if got := defaultSnapshotDir("g"); got != c.want.snapshot {
				t.Errorf("snapshot_dir default %q, want %q", got, c.want.snapshot)
			}
		})
	}
}
