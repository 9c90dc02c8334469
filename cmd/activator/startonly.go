package main

// The keys a reload cannot change: read once, when serve starts.

import (
	"cmp"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/activator/activator/internal/registry"
)

// startValue is one key read only at start-up, with its value in a config as the warning shows it.
type startValue struct {
	key   string // the config key, as the docs name it
	what  string // how the warning names it: the key, or "listen address" for an address
	value string
	// socket is, when the key's listener came from systemd (socket activation), its
	// FileDescriptorName: the config's value then does not apply even after a restart, and
	// the warning says where the value does come from.
	socket string
}

// startOnly lists the keys of cfg that a running activator reads only at start-up, whatever a reload
// says: the listeners' addresses (bound once), with a unix admin socket its admin_socket (the file's
// mode and group, set when it is bound), the admin listener's limits (admin_keepalive_timeout,
// admin_max_conns), cgroup_root (taken before anything spawns), the edge
// http.Server's own limits (header_timeout, keepalive_timeout, send_timeout, max_header_bytes), and, when cfg has
// a TLS listener, its handshake limits and tls.acme. A flag that overrides listen or admin leaves
// that key out: the config's value never applies. A listener systemd passed in (o.activated) keeps
// its key, marked with the socket's name: a restart keeps that listener too, so its warning points
// at the socket unit instead of a restart.
//
// Every other key follows reloads. Why these do not: a bound listener cannot move without a window
// where connections are refused; net/http reads its Server's limits without a lock, so they cannot
// change under it, nor can the admin listener's cap; the cgroup root is locked for the process's life; the ACME manager keeps its
// account and storage.
func startOnly(cfg *registry.Config, o serveOptions) []startValue {
	var out []startValue
	add := func(key, what, value string) { out = append(out, startValue{key: key, what: what, value: value}) }
	// from marks the last key added as the listener systemd passed in under name, if it did.
	from := func(name string) {
		if o.activated[name] != "" {
			out[len(out)-1].socket = name
		}
	}
	if o.listen == "" {
		add("listen", "listen address", cmp.Or(cfg.Listen, "none"))
		from("edge")
	}
	if o.admin == "" {
		add("admin", "admin address", cmp.Or(cfg.Admin, "none"))
		from("admin")
	}
	add("listen_tls", "listen_tls address", cmp.Or(cfg.ListenTLS, "none"))
	if cfg.ListenTLS != "" { // without listen_tls a restart closes systemd's edge-tls socket: that one does apply
		from("edge-tls")
	}
	// The socket file's mode and group, set once it is bound; systemd's admin socket has the socket
	// unit's (and a TCP one from systemd has none, whatever the config's admin says).
	unixAdmin := o.activated["admin"] == "unix"
	if o.activated["admin"] == "" {
		a, err := registry.ParseAdminAddr(cmp.Or(o.admin, cfg.Admin))
		unixAdmin = err == nil && a.Network == "unix"
	}
	if unixAdmin {
		sock, group := cfg.AdminAccess.Socket, "the activator's"
		if sock.Group != "" {
			group = strconv.Quote(sock.Group)
		}
		add("admin_socket", "admin_socket", fmt.Sprintf("{mode: %04o, group: %s}", uint32(sock.Mode.Perm()), group))
		from("admin")
	}
	add("admin_keepalive_timeout", "admin_keepalive_timeout", cfg.AdminAccess.KeepAliveTimeout.String())
	add("admin_max_conns", "admin_max_conns", strconv.Itoa(cfg.AdminAccess.MaxConns))
	add("cgroup_root", "cgroup_root", cmp.Or(cfg.CgroupRoot, "automatic"))
	e := cfg.Edge
	add("edge.header_timeout", "edge.header_timeout", e.HeaderTimeout.String())
	add("edge.keepalive_timeout", "edge.keepalive_timeout", e.KeepAliveTimeout.String())
	add("edge.send_timeout", "edge.send_timeout", e.SendTimeout.String())
	add("edge.max_header_bytes", "edge.max_header_bytes", strconv.FormatInt(e.MaxHeaderBytes, 10)+" bytes")
	maxConns := "the default (from the open-file limit)"
	if e.MaxConns > 0 {
		maxConns = strconv.Itoa(e.MaxConns)
	}
	add("edge.max_conns", "edge.max_conns", maxConns)
	loops := strconv.Itoa(e.EventLoops)
	if e.EventLoops == registry.EventLoopsAuto {
		loops = "the default (one per CPU)"
	}
	add("edge.event_loops", "edge.event_loops", loops)
	if cfg.ListenTLS != "" {
		add("edge.tls_handshake_timeout", "edge.tls_handshake_timeout", e.TLSHandshakeTimeout.String())
		add("edge.max_tls_handshakes", "edge.max_tls_handshakes", strconv.Itoa(e.MaxTLSHandshakes))
		acme := "off"
		if a := cfg.TLS.ACME; a != nil {
			acme = fmt.Sprintf("{email: %q, ca: %q, storage: %q, ca_root: %q}", a.Email, a.CA, a.Storage, a.CARoot)
		}
		add("tls.acme", "tls.acme", acme)
	}
	return out
}

// warnStartOnly logs a warning for each key of started (startOnly of the config serve started with)
// whose value in next (startOnly of a reloaded config) differs: the reload applied the rest, and
// this key keeps its value until a restart, or, for a listener systemd passed in, for as long as
// the socket unit says. A key only one of them lists (the TLS limits, when listen_tls itself changed)
// is not compared: the listen_tls warning says it all.
func warnStartOnly(log *slog.Logger, started, next []startValue) {
	for _, n := range next {
		for _, s := range started {
			if s.key != n.key || s.value == n.value {
				continue
			}
			if s.socket != "" && n.socket != "" {
				// Neither value is in force: the socket's is.
				log.Warn(fmt.Sprintf("%s changed from %s to %s, but this listener is systemd's (socket activation, FileDescriptorName=%s), which a restart keeps; %s",
					s.what, s.value, n.value, s.socket, socketUnitHint(s.key)),
					"key", s.key, "previous", s.value, "configured", n.value, "socket", s.socket)
				continue
			}
			log.Warn(fmt.Sprintf("%s changed from %s to %s; restart the activator to apply it", s.what, s.value, n.value),
				"key", s.key, "in_force", s.value, "configured", n.value)
		}
	}
}

// socketUnitHint says what to change in the socket unit instead of key.
func socketUnitHint(key string) string {
	if key == "admin_socket" {
		return "set SocketMode= and SocketGroup= in its .socket unit instead"
	}
	return "change ListenStream= in its .socket unit to move it"
}
