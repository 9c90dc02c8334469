package privdir

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// other is a uid that is neither root nor this user: the other local user of the attacks.
const other = 65534

// asOther gives p to the other user (the link itself for a symbolic link), skipping the test when
// this user may not (only root can give files away).
func asOther(t *testing.T, p string) {
	t.Helper()
	if err := os.Lchown(p, other, other); err != nil {
		t.Skipf("cannot give %s to uid %d, needed to play another local user: %v", p, other, err)
	}
}

// mkdir makes p with mode, a raw one (0o1777: sticky), past the umask.
func mkdir(t *testing.T, p string, mode uint32) string {
	t.Helper()
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestMakeCreatesPrivate(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "a", "b", "c")
	if err := Make(dir); err != nil {
		t.Fatalf("Make(%s): %v", dir, err)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 || !fi.IsDir() {
		t.Fatalf("after Make: %v, %v; want a directory of mode 0700", fi.Mode(), err)
	}
	// One that exists with a looser mode is made private.
	loose := mkdir(t, filepath.Join(base, "loose"), 0o755)
	if err := Make(loose); err != nil {
		t.Fatalf("Make(%s): %v", loose, err)
	}
	if fi, _ := os.Stat(loose); fi.Mode().Perm() != 0o700 {
		t.Fatalf("Make left %s at %v, want 0700", loose, fi.Mode().Perm())
	}
	if err := Make("relative/dir"); err == nil || !strings.Contains(err.Error(), "not an absolute path") {
		t.Fatalf("Make of a relative path: %v, want it refused as not absolute", err)
	}
}

// TestRefused is the attacks: each sets up a path someone else could change, and Make must refuse it,
// naming the step and why, and make nothing under it.
func TestRefused(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, base string) (dir, step string)
		why   string
	}{{
		// The /tmp attack: in a sticky, world-writable dir, another user made the activator's
		// dir first, open to all, to swap what the activator makes in it.
		name: "another user's dir under a sticky one",
		setup: func(t *testing.T, base string) (string, string) {
			tmp := mkdir(t, filepath.Join(base, "tmp"), 0o1777)
			pre := mkdir(t, filepath.Join(tmp, "activator-0"), 0o777)
			asOther(t, pre)
			return filepath.Join(pre, "kvm", "g"), pre
		},
		why: "is owned by uid 65534",
	}, {
		name: "a step writable by others, no sticky bit",
		setup: func(t *testing.T, base string) (string, string) {
			open := mkdir(t, filepath.Join(base, "open"), 0o777)
			return filepath.Join(open, "kvm"), open
		},
		why: "is writable by others (mode 0777)",
	}, {
		name: "a step writable by its group",
		setup: func(t *testing.T, base string) (string, string) {
			g := mkdir(t, filepath.Join(base, "shared"), 0o775)
			return filepath.Join(g, "kvm"), g
		},
		why: "is writable by its group (mode 0775)",
	}, {
		name: "the dir itself sticky and open to all",
		setup: func(t *testing.T, base string) (string, string) {
			d := mkdir(t, filepath.Join(base, "sticky"), 0o1777)
			return d, d
		},
		why: "is writable by others (mode 1777)",
	}, {
		name: "another user's link in a sticky dir, to a dir of ours",
		setup: func(t *testing.T, base string) (string, string) {
			tmp := mkdir(t, filepath.Join(base, "tmp"), 0o1777)
			ours := mkdir(t, filepath.Join(base, "ours"), 0o700)
			link := filepath.Join(tmp, "activator-0")
			if err := os.Symlink(ours, link); err != nil {
				t.Fatal(err)
			}
			asOther(t, link)
			return filepath.Join(link, "kvm"), link
		},
		why: "is owned by uid 65534",
	}, {
		name: "our link to another user's dir",
		setup: func(t *testing.T, base string) (string, string) {
			theirs := mkdir(t, filepath.Join(base, "theirs"), 0o755)
			asOther(t, theirs)
			link := filepath.Join(base, "link")
			if err := os.Symlink(theirs, link); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(link, "kvm"), theirs
		},
		why: "is owned by uid 65534",
	}, {
		name: "a file where a dir should be",
		setup: func(t *testing.T, base string) (string, string) {
			f := filepath.Join(base, "file")
			if err := os.WriteFile(f, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			return f, f
		},
		why: "is not a directory",
	}, {
		name: "a loop of links",
		setup: func(t *testing.T, base string) (string, string) {
			a, b := filepath.Join(base, "la"), filepath.Join(base, "lb")
			if err := os.Symlink(b, a); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(a, b); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(a, "kvm"), ""
		},
		why: "symbolic links",
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base := t.TempDir()
			dir, step := c.setup(t, base)
			err := Make(dir)
			if err == nil {
				t.Fatalf("Make(%s) = nil, want it refused (%s)", dir, c.why)
			}
			if !strings.Contains(err.Error(), c.why) || !strings.Contains(err.Error(), step) || !strings.HasPrefix(err.Error(), dir) {
				t.Fatalf("Make(%s) = %q, want it to name %s and say %q", dir, err, step, c.why)
			}
			if unsafe := c.why != "is not a directory" && step != ""; errors.Is(err, ErrUnsafe) != unsafe {
				t.Fatalf("error %q: matches ErrUnsafe %v, want %v", err, !unsafe, unsafe)
			}
			if _, err := os.Lstat(filepath.Join(step, "kvm")); step != dir && step != "" && err == nil {
				t.Fatalf("Make created %s under the refused step", filepath.Join(step, "kvm"))
			}
		})
	}
}

// TestAllowed: what a sound setup looks like passes: /tmp's shape as a step on the way, links of
// ours, and ".." after a link taken as the kernel takes it.
func TestAllowed(t *testing.T) {
	base := t.TempDir()
	tmp := mkdir(t, filepath.Join(base, "tmp"), 0o1777)
	if err := Make(filepath.Join(tmp, "activator-0", "kvm", "g")); err != nil {
		t.Fatalf("under a sticky dir, a dir of ours: %v", err)
	}
	real := mkdir(t, filepath.Join(base, "real"), 0o755)
	mkdir(t, filepath.Join(real, "sub"), 0o755)
	link := filepath.Join(base, "link")
	if err := os.Symlink("real/sub", link); err != nil {
		t.Fatal(err)
	}
	if err := Make(filepath.Join(link, "kvm")); err != nil {
		t.Fatalf("through a relative link of ours: %v", err)
	}
	if _, err := os.Stat(filepath.Join(real, "sub", "kvm")); err != nil {
		t.Fatalf("Make through the link did not make the dir at its target: %v", err)
	}
	// A ".." in a link's target is taken as the kernel takes it: l3 -> link/.. is real (link's
	// target's parent), not base. A step open to all there would be missed if ".." were lexical.
	if err := os.Symlink("link/../sub", filepath.Join(base, "l3")); err != nil {
		t.Fatal(err)
	}
	if err := Check(filepath.Join(base, "l3", "kvm")); err != nil {
		t.Fatalf("through a link whose target has \"..\": %v", err)
	}
	if err := os.Chmod(real, 0o777); err != nil {
		t.Fatal(err)
	}
	err := Check(filepath.Join(base, "l3", "kvm"))
	if !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), real+" is writable by others") {
		t.Fatalf("Check through l3: %v, want %s refused as writable by others", err, real)
	}
	// A link of ours to a directory not made yet: the error names the directory asked for.
	dangling := filepath.Join(base, "dangling")
	if err := os.Symlink(filepath.Join(base, "not-yet"), dangling); err != nil {
		t.Fatal(err)
	}
	if err := Make(filepath.Join(dangling, "kvm")); err == nil || !strings.HasPrefix(err.Error(), filepath.Join(dangling, "kvm")+": ") {
		t.Fatalf("Make through a dangling link: %v, want an error naming the directory", err)
	}
	if err := CheckIfExists(filepath.Join(base, "no", "such")); err != nil {
		t.Fatalf("CheckIfExists of a dir not made yet under a sound path: %v", err)
	}
}
