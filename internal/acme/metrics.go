package acme

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The operations a failure is counted under: a first order, or the renewal of a certificate held.
const (
	opObtain = "obtain"
	opRenew  = "renew"
)

var failuresDesc = prometheus.NewDesc("activator_tls_acme_failures_total",
	"Failed ACME attempts to obtain (operation=\"obtain\") or renew (operation=\"renew\") a managed host's certificate; each retry that fails counts.",
	[]string{"host", "operation"}, nil)

var failingDesc = prometheus.NewDesc("activator_tls_acme_failing",
	"1 while the last ACME attempt for a managed host's certificate failed, until one succeeds: its retries go on with backoff.",
	[]string{"host"}, nil)

// hostFailures are one managed host's failed attempts, and whether its last attempt failed.
type hostFailures struct {
	obtain, renew uint64
	failing       bool
}

// failureMetrics exports the Manager's failures: both operations of every managed host and its
// failing gauge, from 0, read at each scrape. A host removed from the config loses its series with it
// (and starts again from 0 if it comes back).
type failureMetrics struct{ m *Manager }

func (f failureMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- failuresDesc
	ch <- failingDesc
}

func (f failureMetrics) Collect(ch chan<- prometheus.Metric) {
	f.m.mu.RLock()
	defer f.m.mu.RUnlock()
	for h := range f.m.hosts {
		c := f.m.failures[h]
		failing := 0.0
		if c.failing {
			failing = 1
		}
		ch <- prometheus.MustNewConstMetric(failuresDesc, prometheus.CounterValue, float64(c.obtain), h, opObtain)
		ch <- prometheus.MustNewConstMetric(failuresDesc, prometheus.CounterValue, float64(c.renew), h, opRenew)
		ch <- prometheus.MustNewConstMetric(failingDesc, prometheus.GaugeValue, failing, h)
	}
}

// attempted records the result of an attempt for host when it is managed: certmagic names only what it
// was asked for, and that is only ever a managed host, but the label stays bounded by the config
// whatever it names.
func (m *Manager) attempted(host string, renewal, failed bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.hosts[host]; !ok {
		return
	}
	c := m.failures[host]
	switch {
	case failed && renewal:
		c.renew++
	case failed:
		c.obtain++
	}
	c.failing = failed
	m.failures[host] = c
}

// CertificateExpiries is when the certificate in memory of each managed host expires (its leaf's
// NotAfter): tlsedge.Expiring, for the edge's metrics. A host whose certificate is not in memory yet
// (its order has not succeeded) has none. It reads memory only.
func (m *Manager) CertificateExpiries() map[string]time.Time {
	m.mu.RLock()
	hosts := hostNames(m.hosts)
	m.mu.RUnlock()
	out := make(map[string]time.Time, len(hosts))
	for _, h := range hosts {
		for _, c := range m.cache.AllMatchingCertificates(h) {
			if c.Leaf == nil || !slices.Contains(c.Names, h) {
				continue // a wildcard's, which this manager never orders
			}
			if t, ok := out[h]; !ok || c.Leaf.NotAfter.After(t) {
				out[h] = c.Leaf.NotAfter
			}
		}
	}
	return out
}
