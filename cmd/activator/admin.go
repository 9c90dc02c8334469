package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"strconv"
	"time"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/registry"
)

// listenAdmin binds the admin API at addr (registry.ParseAdminAddr). A unix socket gets sock's mode
// and group; a stale socket file at its path (one nobody listens on) is removed first, anything else
// there is an error.
func listenAdmin(addr string, sock registry.AdminSocket) (net.Listener, error) {
	a, err := registry.ParseAdminAddr(addr)
	if err != nil {
		return nil, err
	}
	if a.Network == "tcp" {
		return net.Listen("tcp", a.Address)
	}
	gid := -1
	if sock.Group != "" {
		if gid, err = lookupGroup(sock.Group); err != nil {
			return nil, fmt.Errorf("admin_socket.group: %w", err)
		}
	}
	if err := removeStaleSocket(a.Address); err != nil {
		return nil, err
	}
	ln, err := net.Listen("unix", a.Address)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(a.Address, sock.Mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("admin_socket.mode: %w", err)
	}
	if gid >= 0 {
		if err := os.Chown(a.Address, -1, gid); err != nil {
			ln.Close()
			return nil, fmt.Errorf("admin_socket.group %q: %w (the activator's user must be a member)", sock.Group, err)
		}
	}
	return ln, nil
}

// lookupGroup returns the id of a group given by name or number.
func lookupGroup(g string) (int, error) {
	if n, err := strconv.Atoi(g); err == nil && n >= 0 {
		return n, nil
	}
	gr, err := user.LookupGroup(g)
	if err != nil {
		return 0, fmt.Errorf("no group %q on this host: %w", g, err)
	}
	return strconv.Atoi(gr.Gid)
}

// removeStaleSocket removes the socket file at path unless something listens on it. A path that does
// not exist is fine; one that is not a socket is an error.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case fi.Mode()&fs.ModeSocket == 0:
		return fmt.Errorf("%s exists and is not a socket; not removing it", path)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("%s is in use: another process listens on it", path)
	}
	return os.Remove(path)
}

// adminPolicy is the access policy cfg sets.
func adminPolicy(cfg *registry.Config) activator.AdminPolicy {
	a := cfg.AdminAccess
	return activator.AdminPolicy{Token: a.Token, MetricsOpen: a.MetricsOpen, Hosts: a.Hosts}
}

// listenerAddr is a bound listener's address as registry.ParseAdminAddr would give it.
func listenerAddr(a net.Addr) registry.AdminAddr {
	if a.Network() == "unix" {
		return registry.AdminAddr{Network: "unix", Address: a.String()}
	}
	return registry.AdminAddr{Network: "tcp", Address: a.String()}
}

// adminWarnings are what check and serve warn about in cfg's admin settings, the admin API listening
// at addr: a listener beyond loopback without a token, and a token file others may read.
func adminWarnings(cfg *registry.Config, addr registry.AdminAddr) []string {
	var out []string
	if !addr.Loopback() && len(cfg.AdminAccess.Token) == 0 {
		out = append(out, fmt.Sprintf("the admin API listens on %s, beyond loopback, without a token: whoever reaches it can wake and stop every tenant (set admin_token_file, or use admin: unix:/path)", addr.Address))
	}
	if f := cfg.AdminAccess.TokenFile; f != "" {
		if fi, err := os.Stat(f); err == nil && fi.Mode().Perm()&0o077 != 0 {
			out = append(out, fmt.Sprintf("admin_token_file %s is readable by its group or others (mode %04o): chmod 600 it", f, fi.Mode().Perm()))
		}
	}
	return out
}

// adminApplier applies each reloaded config to the edge, then puts its admin policy (a re-read token,
// admin_hosts, admin_metrics_open) in force. The admin address and socket are bound once.
type adminApplier struct {
	applier
	access *activator.AdminAccess
}

func (a adminApplier) Apply(cfg *registry.Config) error {
	if err := a.applier.Apply(cfg); err != nil {
		return err
	}
	a.access.Set(adminPolicy(cfg))
	return nil
}
