package tlsedge

import (
	"crypto/tls"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tlsedge/tlstest"
)

// expiringSource is a Source that also reports its certificates' expiry (tlsedge.Expiring), as the ACME
// manager does.
type expiringSource struct {
	fakeSource
	expiries map[string]time.Time
}

func (s *expiringSource) CertificateExpiries() map[string]time.Time { return s.expiries }

// expiries gathers reg and returns activator_tls_certificate_expiry_timestamp_seconds by
// "source certificate", in unix seconds.
func expiries(t *testing.T, reg *prometheus.Registry) map[string]int64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	out := map[string]int64{}
	for _, mf := range mfs {
		if mf.GetName() != "activator_tls_certificate_expiry_timestamp_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if len(labels) != 2 {
				t.Errorf("series with labels %v, want source and certificate alone", labels)
			}
			out[labels["source"]+" "+labels["certificate"]] = int64(m.GetGauge().GetValue())
		}
	}
	return out
}

// TestCertificateExpiryMetrics: the edge exports the NotAfter of every certificate in force that a hello
// can get, files by their cert_file and the Source's by host (only the hosts it serves for the edge),
// follows reloads, and never labels a series with a hello's server name.
func TestCertificateExpiryMetrics(t *testing.T) {
	ca := tlstest.NewCA(t)
	dir := t.TempDir()
	day := time.Now().Truncate(time.Second).Add(24 * time.Hour)
	write := func(name string, notAfter time.Time, names ...string) registry.CertFile {
		return ca.Write(t, dir, name, tlstest.Leaf{Label: name, Names: names, NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter})
	}
	a := write("a", day, "a.test")
	b := write("b", day.Add(24*time.Hour), "b.test", "*.b.test")
	dup := write("dup", day.Add(48*time.Hour), "a.test") // every name an earlier pair's: never served
	load := func(files ...registry.CertFile) *Certs {
		c, _, err := LoadCerts(files, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	src := &expiringSource{
		fakeSource: fakeSource{asked: make(chan string, 16)},
		expiries:   map[string]time.Time{"acme.test": day.Add(72 * time.Hour), "gone.test": day},
	}
	reg := prometheus.NewRegistry()
	e := New(Settings{Certs: load(a, b, dup), SourceHosts: []string{"acme.test"}}, Options{Source: src, Registerer: reg})
	want := map[string]int64{
		"file " + a.CertFile: day.Unix(),
		"file " + b.CertFile: day.Add(24 * time.Hour).Unix(),
		"acme acme.test":     day.Add(72 * time.Hour).Unix(),
	}
	if got := expiries(t, reg); !maps.Equal(got, want) {
		t.Errorf("at start: %v, want %v", got, want)
	}

	// Hellos for names nothing configures: they get the default certificate, and no series.
	s := startTLS(t, e, Limits{Timeout: patience, Max: 8}, labelHandler())
	for i := range 3 {
		c, err := tls.Dial("tcp", s.addr(), &tls.Config{ServerName: fmt.Sprintf("random-%d.example", i), InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	for k := range expiries(t, reg) {
		if strings.Contains(k, "random-") {
			t.Errorf("a series for a hello's server name: %s", k)
		}
	}

	// A reload: b renewed, a dropped, ACME no longer serving.
	b2 := write("b", day.Add(90*24*time.Hour), "b.test")
	e.Reload(Settings{Certs: load(b2)})
	want = map[string]int64{"file " + b.CertFile: day.Add(90 * 24 * time.Hour).Unix()}
	if got := expiries(t, reg); !maps.Equal(got, want) {
		t.Errorf("after the reload: %v, want %v", got, want)
	}
}
