package registry

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// AdminAccess is how the admin API is reached and who may use it: the keys beside admin.
type AdminAccess struct {
	// Socket is the mode and group of a unix admin socket the activator binds itself (admin:
	// unix:/path). A socket that systemd passes in keeps the unit's SocketMode= and SocketGroup=.
	Socket AdminSocket
	// TokenFile is admin_token_file, an absolute path, or "" for no token.
	TokenFile string
	// Token is the file's content less trailing newlines, read by Load (so again on each reload).
	Token []byte
	// MetricsOpen (admin_metrics_open) leaves GET /metrics open without the token.
	MetricsOpen bool
	// Hosts (admin_hosts) are Host header names accepted beside the loopback names, lower case.
	Hosts []string
	// KeepAliveTimeout (admin_keepalive_timeout, default 2m) closes an admin connection idle this long
	// between requests; MaxConns (admin_max_conns, default 128) is how many admin connections may be
	// open at once, more waiting in the kernel's accept queue. Both bound what the admin listener
	// costs the process: its connections take file descriptors from the same limit as the edge's.
	KeepAliveTimeout time.Duration
	MaxConns         int
}

// The admin listener's defaults. A scraping Prometheus keeps one connection and comes back every
// 15s; an operator's CLI opens one a command. 128 leaves room for many of both, and is nothing
// beside the file-descriptor limit the edge needs.
const (
	DefaultAdminKeepAliveTimeout = 2 * time.Minute
	DefaultAdminMaxConns         = 128
)

// AdminSocket is admin_socket: the mode (default 0600) and the group (a name or number, "" for the
// activator's own) of a unix admin socket. The group is looked up when serve binds the socket.
type AdminSocket struct {
	Mode  os.FileMode
	Group string
}

// DefaultAdminSocketMode is the unix admin socket's mode when admin_socket.mode is left out.
const DefaultAdminSocketMode os.FileMode = 0o600

// AdminAddr is a parsed admin address.
type AdminAddr struct {
	Network string // "tcp" or "unix"
	Address string // host:port or an absolute socket path
}

// ParseAdminAddr accepts "host:port" and "unix:/absolute/path". serve binds what it returns, and check
// uses it too, so check never passes an address serve cannot bind.
func ParseAdminAddr(s string) (AdminAddr, error) {
	const forms = "(want host:port, as in 127.0.0.1:9090, or unix:/path)"
	if p, ok := strings.CutPrefix(s, "unix:"); ok {
		switch {
		case p == "":
			return AdminAddr{}, fmt.Errorf("%q names no socket path %s", s, forms)
		case !filepath.IsAbs(p):
			return AdminAddr{}, fmt.Errorf("%q: the socket path must be absolute %s", s, forms)
		}
		return AdminAddr{Network: "unix", Address: filepath.Clean(p)}, nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil || port == "" {
		return AdminAddr{}, fmt.Errorf("%q is not an address to listen on %s", s, forms)
	}
	n, err := strconv.Atoi(port)
	switch {
	case err != nil || port != strconv.Itoa(n):
		return AdminAddr{}, fmt.Errorf("%q: port %q is not a number (1-65535)", s, port)
	case n < 0 || n > 65535:
		return AdminAddr{}, fmt.Errorf("%q: port %d is out of range 1-65535", s, n)
	}
	if host != "" && net.ParseIP(host) == nil && strings.Trim(host, "0123456789.") == "" {
		return AdminAddr{}, fmt.Errorf("%q: %q is not a valid IP address", s, host)
	}
	return AdminAddr{Network: "tcp", Address: s}, nil
}

// Loopback reports whether a is reachable from this host only: a unix socket, or a TCP address on a
// loopback IP or localhost. A wildcard host ("", 0.0.0.0, ::) is not.
func (a AdminAddr) Loopback() bool {
	if a.Network == "unix" {
		return true
	}
	host, _, _ := net.SplitHostPort(a.Address)
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// adminKeys are the top-level keys beside admin.
type adminKeys struct {
	Socket struct {
		Mode  string `yaml:"mode"`
		Group string `yaml:"group"`
	} `yaml:"admin_socket"`
	TokenFile        string    `yaml:"admin_token_file"`
	MetricsOpen      bool      `yaml:"admin_metrics_open"`
	Hosts            []string  `yaml:"admin_hosts"`
	KeepAliveTimeout *Duration `yaml:"admin_keepalive_timeout"`
	MaxConns         *int      `yaml:"admin_max_conns"`
}

// checkAdmin checks admin and the keys beside it, and reads the token file.
func (c topCheck) checkAdmin(admin string, k adminKeys) AdminAccess {
	a := AdminAccess{
		Socket:           AdminSocket{Mode: DefaultAdminSocketMode, Group: k.Socket.Group},
		TokenFile:        k.TokenFile,
		MetricsOpen:      k.MetricsOpen,
		KeepAliveTimeout: c.duration("admin_keepalive_timeout", k.KeepAliveTimeout, DefaultAdminKeepAliveTimeout),
		MaxConns:         valueOr(k.MaxConns, DefaultAdminMaxConns),
	}
	if a.MaxConns <= 0 {
		c.add("admin_max_conns", "must be positive, got %d (leave the key out for the default %d)", a.MaxConns, DefaultAdminMaxConns)
	}
	if _, err := ParseAdminAddr(admin); err != nil {
		c.add("admin", "%v", err)
	}
	if m := k.Socket.Mode; m != "" {
		n, err := strconv.ParseUint(m, 8, 32)
		switch {
		case err != nil:
			c.add("admin_socket.mode", "%q is not an octal mode (as in \"0660\")", m)
		case n&^0o777 != 0:
			c.add("admin_socket.mode", "%q has bits beyond 0777", m)
		case n&0o600 != 0o600:
			c.add("admin_socket.mode", "%q does not let the activator's own user connect (want at least 0600)", m)
		default:
			a.Socket.Mode = os.FileMode(n)
		}
	}
	if f := k.TokenFile; f != "" {
		if !filepath.IsAbs(f) {
			c.add("admin_token_file", "%q is not an absolute path", f)
		} else if b, err := os.ReadFile(f); err != nil {
			c.add("admin_token_file", "cannot read the token: %v", err)
		} else if a.Token = bytes.TrimRight(b, "\r\n"); len(a.Token) == 0 {
			c.add("admin_token_file", "%s is empty (write a long random token into it, e.g. `openssl rand -hex 32`)", f)
		}
	}
	for i, h := range k.Hosts {
		h = strings.ToLower(strings.TrimSpace(h))
		if h == "" || strings.ContainsAny(h, " /:") && !strings.HasPrefix(h, "[") {
			c.add(fmt.Sprintf("admin_hosts[%d]", i), "%q is not a host name (give the name without a port or scheme)", k.Hosts[i])
			continue
		}
		a.Hosts = append(a.Hosts, h)
	}
	return a
}
