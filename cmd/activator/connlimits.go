package main

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/activator/activator/internal/connlimit"
	"github.com/activator/activator/internal/registry"
)

// Every connection, edge or admin, takes a file descriptor from the one open-file limit the process
// also needs for its upstream connections, its tenants' pipes, cgroup files and probes. Before the
// caps, 19,990 idle connections took every descriptor under a 20,000 limit: accept4 failed with EMFILE
// on every listener, and nothing answered until they went. So each listener is capped (package
// connlimit): at its cap the connection idle longest (or silent longest, past a grace) is closed for a
// new one, and a new one waits only while no connection may be closed.

// The warnings logged when a listener reaches its cap, at most once a minute each.
const (
	edgeCapMsg  = "the edge is at its connection cap (edge.max_conns): idle connections are closed for new ones, and new ones wait while none is idle"
	adminCapMsg = "the admin API is at its connection cap (admin_max_conns): idle connections are closed for new ones, and new ones wait while none is idle"
)

// fileReserve is how many descriptors the default edge cap leaves for everything but edge and admin
// connections: an eighth of the open-file limit, and at least minFileReserve.
func fileReserve(nofile uint64) uint64 { return max(nofile/8, minFileReserve) }

const (
	minFileReserve = 64
	minEdgeConns   = 16 // the least default edge cap, however low the open-file limit
)

// edgeConnCap returns edge.max_conns, or, when the config leaves it out, what the open-file limit
// nofile leaves after admin_max_conns and fileReserve; and a warning when a configured cap leaves
// less than minFileReserve for the rest ("" when not).
func edgeConnCap(cfg *registry.Config, nofile uint64) (int, string) {
	admin := uint64(cfg.AdminAccess.MaxConns)
	if n := cfg.Edge.MaxConns; n > 0 {
		if uint64(n)+admin+minFileReserve > nofile {
			return n, fmt.Sprintf("edge.max_conns %d with admin_max_conns %d leaves fewer than %d of the open-file limit %d for upstream connections and tenants: at the cap they may fail with EMFILE (raise LimitNOFILE=, or lower edge.max_conns)", n, admin, minFileReserve, nofile)
		}
		return n, ""
	}
	if nofile <= admin+fileReserve(nofile)+minEdgeConns {
		return minEdgeConns, ""
	}
	return int(nofile - admin - fileReserve(nofile)), ""
}

// spillFiles is edge.max_spill_files's default: half of fileReserve, the descriptors the default
// edge cap leaves for the rest. Each request body past edge.body_memory holds a spill file while it
// arrives and while it is held: without a bound, about 450 slow uploads under a 1,024 limit (one
// HTTP/2 connection carries 250) took every descriptor the edge cap had left, and accepts, upstream
// dials and spawns failed with EMFILE.
func spillFiles(nofile uint64) int { return int(fileReserve(nofile) / 2) }

// openFileLimit is the process's RLIMIT_NOFILE, as the Go runtime raised it at start (to the hard
// limit); 1024 when it cannot be read.
func openFileLimit() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == unix.RLIM_INFINITY {
		return 1024
	}
	return rl.Cur
}

// newConnLimit returns a connlimit.Limit of n that logs msg at its cap, naming key.
func newConnLimit(n int, log *slog.Logger, msg, key string) *connlimit.Limit {
	return connlimit.New(n, func(s connlimit.Stats) {
		log.Warn(msg, "open", s.Open, key, s.Max, "closed_for_room", s.Closed)
	})
}

// connMetrics are the listeners' connection counts as the admin API's /metrics serves them.
type connMetrics map[string]*connlimit.Limit // by listener: "edge", "admin"

var (
	connOpenDesc = prometheus.NewDesc("activator_connections", "Connections open at the listener (edge: plain and TLS together).", []string{"listener"}, nil)
	connMaxDesc  = prometheus.NewDesc("activator_connections_max", "The listener's connection cap (edge.max_conns, admin_max_conns).", []string{"listener"}, nil)
	connRoomDesc = prometheus.NewDesc("activator_connections_closed_for_room_total", "Idle connections closed to make room for new ones at the listener's cap.", []string{"listener"}, nil)
)

func (m connMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- connOpenDesc
	ch <- connMaxDesc
	ch <- connRoomDesc
}

func (m connMetrics) Collect(ch chan<- prometheus.Metric) {
	for name, l := range m {
		s := l.Stats()
		ch <- prometheus.MustNewConstMetric(connOpenDesc, prometheus.GaugeValue, float64(s.Open), name)
		ch <- prometheus.MustNewConstMetric(connMaxDesc, prometheus.GaugeValue, float64(s.Max), name)
		ch <- prometheus.MustNewConstMetric(connRoomDesc, prometheus.CounterValue, float64(s.Closed), name)
	}
}
