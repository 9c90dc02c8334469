// Package foreign tells a backing, before it starts a tenant, whether the tenant's upstream address
// already answers, and if so who holds it. A stray daemon from an earlier run, or another service on
// the same port, would otherwise pass the route's health gate while the tenant the backing started
// fails to bind: the route looks healthy and every wake spawns one more copy.
//
// The owner is found the way ss(8) does it: the listening socket's inode in /proc/net/{tcp,tcp6,unix},
// then the process whose /proc/PID/fd links to socket:[inode]. It is best effort: another user's
// processes are invisible without privileges, and a remote address has no local owner.
package foreign

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/procfs"

	"github.com/activator/activator/internal/sockdiag"
	"github.com/activator/activator/internal/tenant"
)

// dialBound caps the probe: an address that neither accepts nor refuses within it is treated as
// free, and the backing's own start reports whatever is wrong with it.
const dialBound = time.Second

// maxScan bounds how many processes are searched for the socket's owner.
const maxScan = 100000

// HeldError says that something the backing did not start already answers at the tenant's upstream.
// It is terminal (tenant.ClassOf): the holder stays until an operator stops it or moves the route.
type HeldError struct {
	Network, Address string
	PID              int    // 0: the owner was not found (another user's process, or a remote host)
	Command          string // the owner's command line, shortened; empty when PID is 0
}

func (e *HeldError) Error() string {
	who := "by a process the activator cannot see (another user's, or on another host)"
	if e.PID != 0 {
		who = fmt.Sprintf("by pid %d (%s)", e.PID, e.Command)
	}
	return fmt.Sprintf("upstream %s already answers, held %s, which is not this route's tenant: "+
		"stop it, or point the route's upstream elsewhere", e.Address, who)
}

// FaultClass implements tenant.Classer: terminal. Waking again only spawns another tenant that cannot
// bind while the stranger passes the health gate.
func (e *HeldError) FaultClass() tenant.Class { return tenant.ClassTerminal }

// Check dials network/address and returns nil when nothing answers (refused, unreachable, or no
// answer within a second). When something does, it returns a *HeldError naming the holder where it
// can be found; nil when the holder is one of ours, processes the caller started (a kvm standby QEMU
// that holds the guest's forwarded port while it waits). Those are looked at first, one file table
// each, so a caller's own listener costs no search of every process. network is "tcp" or "unix".
// Check never writes to the connection it makes.
//
// For a loopback TCP address it asks the kernel first (freeLoopback): when nothing listens there,
// which is the answer on almost every wake, it returns nil without dialing.
func Check(ctx context.Context, network, address string, ours ...int) error {
	if network == "tcp" && freeLoopback(address) {
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, dialBound)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(dctx, network, address)
	if err != nil {
		return nil
	}
	c.Close()
	e := &HeldError{Network: network, Address: address}
	if fs, err := procfs.NewDefaultFS(); err == nil {
		if inode, ok := listenerInode(fs, network, address); ok {
			target := socketTarget(inode)
			for _, pid := range ours {
				if p, err := fs.Proc(pid); err == nil && holds(p, target) {
					return nil
				}
			}
			e.PID, e.Command = owner(fs, target)
		}
	}
	return e
}

// freeLoopback reports whether address is a loopback TCP address at which the kernel's socket lookup
// (package sockdiag) finds nothing listening, on a kernel whose lookups are seen to find this
// process's own listeners (sockdiag.Trusted). false means "dial to know": another address, a lookup
// that failed or found a socket, or a kernel that cannot tell.
func freeLoopback(address string) bool {
	at, err := netip.ParseAddrPort(address)
	if err != nil || !at.Addr().IsLoopback() {
		return false
	}
	c, err := sockdiag.Open()
	if err != nil {
		return false
	}
	defer c.Close()
	up, err := c.Listening(at)
	return err == nil && !up && sockdiag.Trusted(at.Addr())
}

func socketTarget(inode uint64) string { return "socket:[" + strconv.FormatUint(inode, 10) + "]" }

// holds reports whether p has the socket target ("socket:[INODE]") open.
func holds(p procfs.Proc, target string) bool {
	fds, err := p.FileDescriptorTargets()
	return err == nil && slices.Contains(fds, target)
}

// listenerInode finds the inode of the socket listening at address.
func listenerInode(fs procfs.FS, network, address string) (uint64, bool) {
	if network == "unix" {
		u, err := fs.NetUNIX()
		if err != nil {
			return 0, false
		}
		const unixListen = 1 << 16 // __SO_ACCEPTCON in /proc/net/unix flags
		for _, l := range u.Rows {
			if l.Path == address && l.Flags&unixListen != 0 {
				return l.Inode, true
			}
		}
		return 0, false
	}
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return 0, false
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return 0, false
	}
	want := net.ParseIP(host)
	if want == nil { // a name: compare by port only
		want = net.IPv4zero
	}
	const tcpListen = 10 // TCP_LISTEN in include/net/tcp_states.h
	var fallback uint64
	// procfs prefers netlink sock_diag; /proc/net/tcp is the kernel's stable text interface, read here
	// only on the error path (something already answers), where its cost does not matter.
	//lint:ignore SA1019 see above
	for _, read := range []func() (procfs.NetTCP, error){fs.NetTCP, fs.NetTCP6} {
		lines, err := read()
		if err != nil {
			continue
		}
		for _, l := range lines {
			if l.St != tcpListen || l.LocalPort != port {
				continue
			}
			if l.LocalAddr.Equal(want) {
				return l.Inode, true
			}
			if l.LocalAddr.IsUnspecified() || want.IsUnspecified() {
				fallback = l.Inode // a wildcard listener serves every local address
			}
		}
	}
	return fallback, fallback != 0
}

// owner returns the pid and command line of a process holding the socket target ("socket:[INODE]"),
// or 0 if none is visible.
func owner(fs procfs.FS, target string) (int, string) {
	procs, err := fs.AllProcs()
	if err != nil {
		return 0, ""
	}
	for i, p := range procs {
		if i >= maxScan {
			break
		}
		switch {
		case !holds(p, target):
		case p.PID == os.Getpid():
			return p.PID, "this activator" // e.g. another route's listen_fds socket
		default:
			return p.PID, command(p)
		}
	}
	return 0, ""
}

// command is p's command line, at most 120 bytes, or its comm name when the line is unreadable.
func command(p procfs.Proc) string {
	args, err := p.CmdLine()
	cmd := strings.Join(args, " ")
	if err != nil || cmd == "" {
		if comm, err := p.Comm(); err == nil {
			cmd = comm
		}
	}
	if len(cmd) > 120 {
		cmd = cmd[:117] + "..."
	}
	return cmd
}
