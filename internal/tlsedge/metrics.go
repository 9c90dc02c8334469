package tlsedge

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Expiring is what a Source may also do: tell when each certificate it holds expires (its leaf's
// NotAfter), by host. The edge's metrics export those of Settings.SourceHosts beside the files'. It is
// called at each scrape, and must neither block on the network nor order anything.
type Expiring interface {
	CertificateExpiries() map[string]time.Time
}

var expiryDesc = prometheus.NewDesc("activator_tls_certificate_expiry_timestamp_seconds",
	"When each certificate the TLS edge serves expires (its NotAfter), in seconds since the epoch: a certificate file by its cert_file (source=\"file\"), an ACME certificate by its host (source=\"acme\").",
	[]string{"source", "certificate"}, nil)

// certMetrics exports the certificates of the Settings in force, read at each scrape: a reload that
// drops a certificate drops its series with it. Its labels are configured values only (a cert_file, a
// config host), never a hello's server name.
type certMetrics struct{ e *Edge }

func (m certMetrics) Describe(ch chan<- *prometheus.Desc) { ch <- expiryDesc }

func (m certMetrics) Collect(ch chan<- prometheus.Metric) {
	s := m.e.now.Load()
	seen := map[string]bool{} // a cert_file named by two entries is one certificate
	for _, c := range s.certs.servedCerts() {
		if !seen[c.file] {
			seen[c.file] = true
			ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, unixSeconds(c.notAfter), "file", c.file)
		}
	}
	src, ok := m.e.src.(Expiring)
	if !ok || len(s.sourceHosts) == 0 {
		return
	}
	for host, notAfter := range src.CertificateExpiries() {
		if s.sourceHosts[hostName(host)] {
			ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, unixSeconds(notAfter), "acme", host)
		}
	}
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// servedCerts are the pairs some hello can get; none for a nil Certs.
func (c *Certs) servedCerts() []servedCert {
	if c == nil {
		return nil
	}
	return c.served
}
