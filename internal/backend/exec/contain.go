package exec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/activator/activator/internal/cgroup"
	"github.com/activator/activator/internal/tenant"
)

// Containment is how exec tenants are kept from outliving the activator, decided once at start-up
// (Contain): each tenant's whole process tree in a cgroup v2 of its own below a root the activator
// holds, or, where no writable cgroup v2 exists, the process group with the parent-death signal and
// the activator as child subreaper.
//
// The root is held with an flock(2) on its directory for as long as the activator runs, so two
// activators never share one: whatever a root that nobody holds contains was left by an activator
// that died, and Contain kills it.
type Containment struct {
	log    *slog.Logger
	root   cgroup.Group // the tenants' parent; valid when cgroups is true
	cgroup bool         // tenants get cgroups; false: process groups only
	reason string       // when !cgroup: why not, for the log and for check
	lock   *os.File     // the flock on root; closed by Close; guarded by mu after Contain
	mark   bool         // this kernel keeps user.* xattrs on cgroups: tenant groups are marked

	noClone3 atomic.Bool // clone3 was refused (ENOSYS): children are moved into their cgroup after start

	mu    sync.Mutex      // guards the fields below
	names map[string]bool // tenant group names in use (a reload's new Backend may overlap the old)
	moved bool            // the activator moved itself into <own>/supervisor (see enable)
}

// markAttr marks a tenant's cgroup as the activator's, so that start-up cleanup of a cgroup_root never
// touches groups someone else made there.
const markAttr = "user.activator.tenant"

// autoRoots bounds the automatic roots tried below the activator's own cgroup: tenants, tenants-2, …
const autoRoots = 64

// Contain decides how tenants are contained and, with cgroups, takes the root and kills every tenant
// cgroup an earlier activator left in it. root is the config's cgroup_root: "" picks the first of
// <own cgroup>/tenants, tenants-2, … tenants-64 that no running activator holds (falling back to
// process groups when the own cgroup is not writable); "off" chooses process groups; a path (as in
// /proc/self/cgroup) must be free, or Contain fails. It logs the mode. Without cgroups it makes this
// process a child subreaper, so that grandchildren of a tenant are reparented to it and reaped.
func Contain(ctx context.Context, root string, log *slog.Logger) (*Containment, error) {
	if log == nil {
		log = slog.Default()
	}
	c := &Containment{log: log, names: map[string]bool{}}
	if err := c.takeRoot(root); err != nil {
		return nil, err
	}
	if !c.cgroup {
		if err := prctlSubreaper(); err != nil {
			log.Warn("exec tenants: cannot become a child subreaper", "err", err)
		}
		log.Warn("exec tenants are contained by process group only (parent-death signal, child subreaper): a process that leaves its group (setsid, double fork) can outlive the activator",
			"containment", "process-group", "reason", c.reason)
		return c, nil
	}
	c.mark = unix.Setxattr(c.root.Dir(), "user.activator.root", []byte("1"), 0) == nil
	killed, err := c.killLeft(ctx, "killed an exec tenant left running by an earlier activator")
	if err != nil {
		c.Close()
		return nil, err
	}
	log.Info("exec tenants are contained in cgroups", "containment", "cgroup", "cgroup_root", c.root.Dir(), "orphans_killed", killed)
	return c, nil
}

// takeRoot settles c.root (and takes its lock) or c.reason.
func (c *Containment) takeRoot(root string) error {
	if root == "off" {
		c.reason = "cgroup_root: off"
		return nil
	}
	mnt, err := cgroup.Mount()
	if err != nil {
		c.reason = err.Error()
		return nil
	}
	if root != "" {
		g := cgroup.At(filepath.Join(mnt, root))
		if err := g.Make(); err != nil {
			return fmt.Errorf("exec: cgroup_root %s: %w", root, err)
		}
		lock, ok, err := g.TryLock()
		if err != nil {
			return fmt.Errorf("exec: cgroup_root %s: %w", root, err)
		}
		if !ok {
			return fmt.Errorf("exec: cgroup_root %s is held by another running activator; give each activator a cgroup_root of its own", root)
		}
		c.root, c.lock, c.cgroup = g, lock, true
		return nil
	}
	self, err := cgroup.Self()
	if err != nil {
		c.reason = err.Error()
		return nil
	}
	own := cgroup.At(filepath.Join(mnt, self))
	if filepath.Base(self) == supervisor {
		own = cgroup.At(filepath.Dir(own.Dir())) // moved there by an earlier start (see enable)
	}
	for i := 1; i <= autoRoots; i++ {
		name := "tenants"
		if i > 1 {
			name += "-" + strconv.Itoa(i)
		}
		g := own.Child(name)
		if err := g.Make(); err != nil {
			c.reason = fmt.Sprintf("the activator's own cgroup %s is not writable: %v (with systemd: Delegate=yes)", own.Dir(), err)
			return nil
		}
		lock, ok, err := g.TryLock()
		if err != nil {
			c.reason = err.Error()
			return nil
		}
		if ok {
			c.root, c.lock, c.cgroup = g, lock, true
			return nil
		}
	}
	return fmt.Errorf("exec: every automatic cgroup_root %s/tenants…tenants-%d is held by a running activator; set cgroup_root", own.Dir(), autoRoots)
}

// killLeft kills and removes the tenant groups in the root, logging why with each that had processes.
// At start-up none is ours yet, so each was left by an activator that died (it held the root's lock
// until then); at Close each is a tenant whose stop outlasted the shutdown.
func (c *Containment) killLeft(ctx context.Context, why string) (int, error) {
	kids, err := c.root.Children()
	if err != nil {
		return 0, err
	}
	var errs []error
	n := 0
	for _, g := range kids {
		if c.mark {
			if _, err := unix.Getxattr(g.Dir(), markAttr, nil); err != nil {
				continue // not a tenant's group: someone else's, leave it be
			}
		}
		pids, _ := g.Procs()
		// A group can go while it is killed: its Backend, seeing its tenant die, removes it.
		if err := g.Kill(ctx); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		if err := g.Remove(); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		if len(pids) > 0 {
			n++
			c.log.Warn(why, "cgroup", g.Dir(), "pids", pids)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return n, fmt.Errorf("exec: cleaning up cgroup_root %s: %w", c.root.Dir(), err)
	}
	return n, nil
}

// Close releases the root: it removes the root's directory if it is empty and drops the lock. The
// tenants' Backends remove their own groups on Close.
//
// First it kills every tenant group still there: a tenant whose stop was still running when the
// shutdown's grace ended (a stop_grace longer than what was left of it, a wake or a sleep cut off by
// the shutdown). Its main process would die of its parent-death signal, but what left its process
// group (setsid, a double fork) would outlive the activator in its cgroup, which the docs promise
// never happens. Found with the real binary: a SIGTERM with such a tenant left its daemonized child
// running in the cgroup, three runs in three.
func (c *Containment) Close() error {
	if c == nil || !c.cgroup {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeKillBound)
	defer cancel()
	_, err := c.killLeft(ctx, "killed an exec tenant still running as the activator exits (its stop outlasted the shutdown)")
	_ = c.root.Remove() // busy if a tenant group remains: then it stays for the next start to clean
	c.mu.Lock()
	defer c.mu.Unlock()
	return errors.Join(err, c.lock.Close())
}

// closeKillBound bounds Close's kill of the tenants left: cgroup.kill ends them at once, and the
// activator must exit even if one cannot be.
const closeKillBound = 5 * time.Second

// retake locks the root again once it has been made anew (see Backend.groupLocked): the root is empty
// whenever every tenant sleeps, so anyone may remove it, and the lock taken at start-up stays on the
// removed directory. Without a new lock a second activator could take the root and kill this one's
// tenants as an earlier activator's orphans (found with the real binary). It fails when another
// activator holds the new root already.
func (c *Containment) retake() error {
	lock, ok, err := c.root.TryLock()
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("cgroup_root %s was removed while this activator ran, and another running activator holds it now", c.root.Dir())
	}
	if c.mark {
		_ = unix.Setxattr(c.root.Dir(), "user.activator.root", []byte("1"), 0)
	}
	c.mu.Lock()
	old := c.lock
	c.lock = lock
	c.mu.Unlock()
	c.log.Warn("cgroup_root was removed while this activator ran: made it again and locked it", "cgroup_root", c.root.Dir())
	return old.Close()
}

// claim returns the group for a tenant of route, unique among the live Backends: the route's name, or
// route.2, route.3, … while an older Backend of the same route (a reload) still has its group.
func (c *Containment) claim(route string) cgroup.Group {
	c.mu.Lock()
	defer c.mu.Unlock()
	name := route
	for i := 2; c.names[name]; i++ {
		name = route + "." + strconv.Itoa(i)
	}
	c.names[name] = true
	return c.root.Child(name)
}

// release returns a name claim handed out.
func (c *Containment) release(g cgroup.Group) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.names, filepath.Base(g.Dir()))
}

// supervisor is the leaf the activator moves itself into when it must enable controllers in its own
// cgroup (the "no internal processes" rule: only a group without processes can enable controllers for
// its children).
const supervisor = "supervisor"

// controllers maps each limit to its controller and control file.
func (l Limits) controllers() []struct{ ctrl, file, key, value string } {
	all := []struct{ ctrl, file, key, value string }{
		{"memory", "memory.max", "memory_max", l.Memory},
		{"cpu", "cpu.max", "cpu_max", l.CPU},
		{"pids", "pids.max", "pids_max", l.Pids},
	}
	return slices.DeleteFunc(all, func(x struct{ ctrl, file, key, value string }) bool { return x.value == "" })
}

// check reports each setting of s this containment cannot honour: sleep: freeze and limits without
// cgroups, a limit whose controller the root's parent does not offer. Nil: all can be honoured. What
// it reports is terminal: the host must change, or the route's settings.
func (c *Containment) check(s *Settings) error {
	var errs []error
	if !c.cgroup {
		if s.Sleep == SleepFreeze {
			errs = append(errs, fmt.Errorf("sleep: freeze is unavailable: it needs the tenant in a cgroup of its own, and exec tenants are not in cgroups here (%s)", c.reason))
		}
		for _, l := range s.Limits.controllers() {
			errs = append(errs, fmt.Errorf("%s is unavailable: exec tenants are not in cgroups here (%s)", l.key, c.reason))
		}
		return tenant.Terminal(errors.Join(errs...))
	}
	limits := s.Limits.controllers()
	if len(limits) == 0 {
		return nil // nothing to look up: most routes set no limits, and a reload checks every route
	}
	parent := cgroup.At(filepath.Dir(c.root.Dir()))
	have, err := parent.Controllers()
	if err != nil {
		return err
	}
	for _, l := range limits {
		if !slices.Contains(have, l.ctrl) {
			errs = append(errs, fmt.Errorf("%s is unavailable: the %s controller is not enabled for %s (its cgroup.controllers: %q); enable it in the parent's cgroup.subtree_control (with systemd: Delegate=yes)",
				l.key, l.ctrl, parent.Dir(), strings.Join(have, " ")))
		}
	}
	return tenant.Terminal(errors.Join(errs...))
}

// enable makes the controllers of l available to the tenant groups: it enables them in the
// subtree_control of the root's parent and of the root. Where the parent still holds processes and
// they are all this activator's (its own cgroup, under systemd's Delegate=yes), the activator first
// moves itself into <parent>/supervisor.
func (c *Containment) enable(l Limits) error {
	ctrls := l.controllers()
	if len(ctrls) == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	parent := cgroup.At(filepath.Dir(c.root.Dir()))
	for _, g := range []cgroup.Group{parent, c.root} {
		on, err := g.Subtree()
		if err != nil {
			return err
		}
		for _, x := range ctrls {
			if slices.Contains(on, x.ctrl) {
				continue
			}
			err := g.Write("cgroup.subtree_control", "+"+x.ctrl)
			if errors.Is(err, unix.EBUSY) && g == parent && !c.moved {
				if merr := c.moveSelfLocked(parent); merr != nil {
					return fmt.Errorf("%s: %w (and moving the activator out of %s: %v)", x.key, err, parent.Dir(), merr)
				}
				err = g.Write("cgroup.subtree_control", "+"+x.ctrl)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", x.key, err)
			}
		}
	}
	return nil
}

// moveSelfLocked moves this process into <parent>/supervisor, if it is the only one in parent.
func (c *Containment) moveSelfLocked(parent cgroup.Group) error {
	pids, err := parent.Procs()
	if err != nil {
		return err
	}
	if len(pids) != 1 || pids[0] != os.Getpid() {
		return fmt.Errorf("it holds other processes (%v)", pids)
	}
	leaf := parent.Child(supervisor)
	if err := leaf.Make(); err != nil {
		return err
	}
	if err := leaf.Write("cgroup.procs", strconv.Itoa(os.Getpid())); err != nil {
		return err
	}
	c.moved = true
	c.log.Info("moved the activator into a leaf cgroup to enable controllers for its tenants", "cgroup", leaf.Dir())
	return nil
}

// reasonOr is why tenants are not in cgroups; for a nil Containment (a Backend built without one).
func (c *Containment) reasonOr() string {
	if c == nil {
		return "the backend was opened without containment"
	}
	return c.reason
}

// checkOrOff is check for a Backend that may have no Containment at all.
func (c *Containment) checkOrOff(s *Settings) error {
	if c == nil {
		c = &Containment{reason: c.reasonOr()}
	}
	if err := c.check(s); err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	return nil
}

// probe is the Containment Contain would choose with the automatic root, found without creating,
// locking or killing anything: for `activator check`, which runs beside a serving activator.
func probe(root string) *Containment {
	c := &Containment{}
	if root == "off" {
		c.reason = "cgroup_root: off"
		return c
	}
	mnt, err := cgroup.Mount()
	if err != nil {
		c.reason = err.Error()
		return c
	}
	if root != "" {
		dir := filepath.Join(mnt, root)
		// serve creates the root if need be: what must be writable is it, or its nearest existing parent.
		at := dir
		for range 64 {
			if _, err := os.Stat(at); err == nil || at == mnt {
				break
			}
			at = filepath.Dir(at)
		}
		if err := unix.Access(at, unix.W_OK); err != nil {
			c.reason = fmt.Sprintf("cgroup_root %s: %s is not writable: %v", root, at, err)
			return c
		}
		c.root, c.cgroup = cgroup.At(dir), true
		return c
	}
	self, err := cgroup.Self()
	if err != nil {
		c.reason = err.Error()
		return c
	}
	own := filepath.Join(mnt, self)
	if err := unix.Access(own, unix.W_OK); err != nil {
		c.reason = fmt.Sprintf("the activator's own cgroup %s is not writable: %v (with systemd: Delegate=yes)", own, err)
		return c
	}
	c.root, c.cgroup = cgroup.At(own).Child("tenants"), true
	return c
}

// prctlSubreaper makes this process a child subreaper: orphans among its descendants are reparented
// to it rather than to init.
func prctlSubreaper() error { return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }
