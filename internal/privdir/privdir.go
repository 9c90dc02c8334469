// Package privdir owns the activator's private directories: a directory it keeps sockets, pid files
// and snapshots in must be one that nobody but this user and root can change, at any step of the
// path to it. A directory under /tmp (the fallback when no runtime directory is set), or one an
// operator names under another user's tree, can otherwise be prepared by someone else: another local
// user creates /tmp/activator-0 first, owns it, and swaps what the activator later creates in it for
// a symbolic link to a file of theirs, or plants a record the activator trusts (a pid file, the list
// of snapshot dirs to clean up).
//
// The rules are chkpath's (Mark Wooding's checkpath, 1999), the same that OpenSSH's StrictModes and
// systemd's CHASE_SAFE apply in their ways. Every step from / to the directory, symbolic links
// followed and their targets checked the same way:
//   - is owned by root or by this user;
//   - is not writable by group or others, unless it is a directory with the sticky bit (as /tmp is)
//     and not the last step; under a sticky directory, what the next step names is owned by root or
//     by this user (the rule above), so nobody else can rename or replace it;
//   - is a directory or a symbolic link, and the last step is a directory owned by this user.
//
// No library in Go's ecosystem checks this (securejoin confines a path to a root, which is another
// question), so it is here, small.
package privdir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// maxLinks bounds the symbolic links followed on one path, as the kernel's 40 (ELOOP).
const maxLinks = 40

// Make creates dir and its missing parents (mode 0700), checks it by the package's rules and makes it
// 0700. The path is checked before anything is made, and each missing step as it is made (by this
// call or by anyone racing it), so nothing is made under a step someone else controls. dir must be
// absolute; it is cleaned first (as filepath.Join cleans the paths made in it), so a ".." in it is
// taken lexically, as those paths take it.
func Make(dir string) error {
	dir, err := absClean(dir)
	if err != nil {
		return err
	}
	p, missing := dir, []string(nil)
	for {
		_, err := os.Lstat(p)
		if err == nil {
			break
		}
		parent := filepath.Dir(p)
		if !errors.Is(err, fs.ErrNotExist) || parent == p {
			return fmt.Errorf("%s: %w", dir, err)
		}
		missing, p = append(missing, p), parent
	}
	// Each step on the way as it is found or made; dir itself once, by Check, below.
	if p != dir {
		if err := checkStep(dir, p); err != nil {
			return err
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s: %w", dir, err)
		}
		if missing[i] == dir {
			break
		}
		if err := checkStep(dir, missing[i]); err != nil {
			return err
		}
	}
	if err := Check(dir); err != nil {
		return err
	}
	return os.Chmod(dir, 0o700)
}

// Check reports whether dir, which must exist, is a directory of this user's that nobody but this
// user and root can change, nor any step of the path to it. The error names the step and why; one
// someone else could change matches ErrUnsafe. dir is cleaned first, as Make cleans it.
func Check(dir string) error {
	dir, err := absClean(dir)
	if err != nil {
		return err
	}
	w := walker{uid: uint32(os.Geteuid()), asked: dir}
	real, err := w.walk(dir, true)
	if err != nil {
		return err
	}
	st, err := w.lstat(real)
	if err != nil {
		return err
	}
	if st.Uid != w.uid {
		return unsafe(dir, real, "is owned by uid %d, not by this user (uid %d)", st.Uid, w.uid)
	}
	return nil
}

// CheckIfExists is Check for a directory that may not exist yet: then the nearest of its parents that
// exists is checked as a step on the way (/tmp may be that parent), so that a path someone else
// controls is refused before anything is made or read under it.
func CheckIfExists(dir string) error {
	dir, err := absClean(dir)
	if err != nil {
		return err
	}
	for p := dir; ; p = filepath.Dir(p) {
		_, err := os.Lstat(p)
		switch {
		case err == nil && p == dir:
			return Check(dir)
		case err == nil:
			return checkStep(dir, p)
		case !errors.Is(err, fs.ErrNotExist) || p == filepath.Dir(p):
			return fmt.Errorf("%s: %w", dir, err)
		}
	}
}

// checkStep checks p, dir or one of its parents, and the path to it: as the directory asked for when
// it is dir, else as a step on the way.
func checkStep(dir, p string) error {
	w := walker{uid: uint32(os.Geteuid()), asked: dir}
	_, err := w.walk(p, p == dir)
	return err
}

func absClean(dir string) (string, error) {
	if !filepath.IsAbs(dir) {
		return "", fmt.Errorf("%q is not an absolute path", dir)
	}
	return filepath.Clean(dir), nil
}

// ErrUnsafe is matched by the errors of a step someone else could change.
var ErrUnsafe = errors.New("not private to this user and root")

func unsafe(dir, step, format string, a ...any) error {
	why := fmt.Sprintf(format, a...)
	if step == dir {
		return fmt.Errorf("%s %s: %w", dir, why, ErrUnsafe)
	}
	return fmt.Errorf("%s: %s %s: %w", dir, step, why, ErrUnsafe)
}

type walker struct {
	uid   uint32
	asked string // the directory asked for, which errors name
	links int
}

// walk checks every step of path (absolute) from /, following symbolic links, and returns the path
// with the links resolved. final: path's last step is the directory asked for, not a step on the way.
// ".." is taken as the kernel takes it, to the parent of where the walk has got to, links resolved.
func (w *walker) walk(path string, final bool) (string, error) {
	cur := "/"
	st, err := w.lstat(cur)
	if err != nil {
		return "", err
	}
	var steps []string
	for _, c := range strings.Split(path, "/") {
		if c != "" && c != "." {
			steps = append(steps, c)
		}
	}
	if err := w.step(cur, st, final && len(steps) == 0); err != nil {
		return "", err
	}
	for i, c := range steps {
		last := final && i == len(steps)-1
		if c == ".." {
			cur = filepath.Dir(cur) // cur has no link in it: its parent is the kernel's
			if last {
				if st, err = w.lstat(cur); err != nil {
					return "", err
				}
				if err := w.step(cur, st, true); err != nil {
					return "", err
				}
			}
			continue
		}
		next := filepath.Join(cur, c)
		if st, err = w.lstat(next); err != nil {
			return "", err
		}
		if st.Mode&syscall.S_IFMT != syscall.S_IFLNK {
			if err := w.step(next, st, last); err != nil {
				return "", err
			}
			cur = next
			continue
		}
		if err := w.step(next, st, false); err != nil {
			return "", err
		}
		if w.links++; w.links > maxLinks {
			return "", fmt.Errorf("%s: too many symbolic links", w.asked)
		}
		target, err := os.Readlink(next)
		if err != nil {
			return "", err
		}
		if !strings.HasPrefix(target, "/") {
			target = cur + "/" + target
		}
		if cur, err = w.walk(target, last); err != nil {
			return "", err
		}
	}
	return cur, nil
}

// step checks one step, st at name. last: the directory asked for, which no sticky bit excuses.
func (w *walker) step(name string, st *syscall.Stat_t, last bool) error {
	if st.Uid != 0 && st.Uid != w.uid {
		return unsafe(w.asked, name, "is owned by uid %d, neither root nor this user (uid %d)", st.Uid, w.uid)
	}
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFLNK:
		return nil
	case syscall.S_IFDIR:
	default:
		return fmt.Errorf("%s: %s is not a directory", w.asked, name)
	}
	perm := st.Mode & 0o7777
	if perm&0o022 != 0 && (perm&syscall.S_ISVTX == 0 || last) {
		who := "others"
		if perm&0o002 == 0 {
			who = "its group"
		}
		return unsafe(w.asked, name, "is writable by %s (mode %04o)", who, perm)
	}
	return nil
}

// lstat is the step at p, an error naming the directory asked for when it cannot be had (a link of
// ours to a directory not made yet, for one).
func (w *walker) lstat(p string) (*syscall.Stat_t, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", w.asked, &fs.PathError{Op: "lstat", Path: p, Err: err})
	}
	return &st, nil
}
