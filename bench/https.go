package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The HTTPS experiment (-only https): the activator terminating TLS itself beside nginx, Caddy and
// HAProxy terminating it with the same certificate, in front of the same app: the warm path over
// HTTPS (wrk), new TLS handshakes per second (a Go client re-executed from this binary, one full
// handshake per request), and a cold wake over HTTPS against the same wake over plain HTTP.

const (
	// handshakeChildArg, as the first argument, makes this binary the handshake client (see main).
	handshakeChildArg = "__tls-handshakes"
	// handshakeConns is how many connections the handshake client keeps in flight.
	handshakeConns = 16
	// handshakeMax bounds the connections of one handshake run, whatever its duration.
	handshakeMax = 1 << 20
	// tlsConnTimeout bounds one connection of the handshake client and of the cold HTTPS sample.
	tlsConnTimeout = 5 * time.Second
)

// HTTPSResult is the HTTPS experiment.
type HTTPSResult struct {
	Setup           string         `json:"setup"`
	Runs            int            `json:"runs"` // rounds of the warm path and of the handshakes
	Warm            []WarmRow      `json:"warm,omitempty"`
	WarmRatios      []RatioRow     `json:"warm_ratios,omitempty"`
	Handshakes      []HandshakeRow `json:"handshakes,omitempty"`
	HandshakeRatios []RatioRow     `json:"handshake_ratios,omitempty"`
	Cold            []HTTPSColdRow `json:"cold,omitempty"`
	ColdExtra       []RatioRow     `json:"cold_https_vs_plain,omitempty"` // sample pairs, same round
	Notes           []string       `json:"notes,omitempty"`
}

// HandshakeRow is one server's rate of new TLS connections, each a full handshake and one request.
type HandshakeRow struct {
	Mode       string `json:"mode"`
	Target     string `json:"target"`
	Conns      int    `json:"conns"`
	Rate       Stat   `json:"handshakes_per_s"`
	P50us      Stat   `json:"connect_handshake_p50_us"` // dial → handshake done, per connection
	P99us      Stat   `json:"connect_handshake_p99_us"`
	ClientCPU  Stat   `json:"client_cpu"`      // the client's CPU time ÷ the run's wall time
	ServerCPU  Stat   `json:"server_cpu_busy"` // busy share of the servers' CPU (pinned only)
	Errors     int64  `json:"errors"`
	Resumed    int64  `json:"resumed"`     // should stay 0: the client keeps no sessions
	FailedRuns int    `json:"failed_runs"` // runs that measured nothing
	Negotiated string `json:"negotiated,omitempty"`
	FirstError string `json:"first_error,omitempty"`
}

// HTTPSColdRow is one way of sending the first request to a sleeping route, in milliseconds.
type HTTPSColdRow struct {
	Mode      string `json:"mode"`
	Samples   int    `json:"samples"`
	Failed    int    `json:"failed"`
	FirstByte Stat   `json:"first_byte_ms"` // plain: request written; HTTPS: handshake began → first byte
	Handshake Stat   `json:"handshake_ms"`  // HTTPS: handshake began → done
	Request   Stat   `json:"request_ms"`    // request written → first byte
	Note      string `json:"note,omitempty"`
}

// benchCert is the one certificate every TLS server of the experiment serves: a self-signed ECDSA
// P-256 leaf for localhost, *.localhost and 127.0.0.1.
type benchCert struct {
	certFile, keyFile string // PEM: the certificate; its key (PKCS#8)
	combined          string // PEM: the certificate, then its key, as HAProxy's crt takes it
	der               []byte // the leaf, which the harness's clients pin
}

// writeBenchCert makes the certificate and writes its files into dir.
func writeBenchCert(dir string, now time.Time) (benchCert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return benchCert{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return benchCert{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "activator bench"},
		DNSNames:              []string{"localhost", "*.localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return benchCert{}, err
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return benchCert{}, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})
	c := benchCert{certFile: filepath.Join(dir, "bench.crt"), keyFile: filepath.Join(dir, "bench.key"), combined: filepath.Join(dir, "bench.pem"), der: der}
	for _, f := range []struct {
		path string
		data []byte
	}{{c.certFile, certPEM}, {c.keyFile, keyPEM}, {c.combined, append(append([]byte(nil), certPEM...), keyPEM...)}} {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return benchCert{}, err
		}
	}
	return c, nil
}

// clientTLS is the harness's side of every TLS connection: no session cache, so every connection
// makes a full handshake; X25519 only, the group OpenSSL 3.0 and Go share (Go's default would offer
// its post-quantum hybrid first, which nginx and HAProxy here cannot take); HTTP/1.1; and the peer's
// leaf pinned to der instead of a chain verification, which would cost the client more than the
// server's signature costs the server.
func clientTLS(der []byte, serverName string) *tls.Config {
	return &tls.Config{
		ServerName:         serverName,
		NextProtos:         []string{"http/1.1"},
		CurvePreferences:   []tls.CurveID{tls.X25519},
		ClientSessionCache: nil,
		InsecureSkipVerify: true, // the pin below replaces the chain verification
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, der) {
				return errors.New("the server did not present the bench certificate")
			}
			return nil
		},
	}
}

// describeTLS names what a connection negotiated.
func describeTLS(cs tls.ConnectionState) string {
	return fmt.Sprintf("%s, %s, %s", tls.VersionName(cs.Version), tls.CipherSuiteName(cs.CipherSuite), cs.CurveID)
}

// addTLS returns cfg, a config from renderConfig, with a TLS listener on port serving c.
func addTLS(cfg string, port int, c benchCert) string {
	return cfg + fmt.Sprintf("listen_tls: 127.0.0.1:%d\ntls:\n  certificates:\n    - {cert_file: %s, key_file: %s}\n",
		port, strconv.Quote(c.certFile), strconv.Quote(c.keyFile))
}

// tlsAnswer is one request on a fresh TLS connection.
type tlsAnswer struct {
	code      int
	handshake time.Duration // dial began → handshake done
	state     tls.ConnectionState
}

// tlsGet dials addr, makes a full handshake, sends GET / for host with Connection: close, reads the
// whole answer, and closes with a reset (SO_LINGER 0), so that no connection of a handshake run is
// left in TIME_WAIT on either side.
func tlsGet(ctx context.Context, addr, host string, cfg *tls.Config) (tlsAnswer, error) {
	ctx, cancel := context.WithTimeout(ctx, tlsConnTimeout)
	defer cancel()
	var a tlsAnswer
	t0 := time.Now()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return a, err
	}
	defer raw.Close()
	if tc, ok := raw.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(dl)
	}
	c := tls.Client(raw, cfg)
	if err := c.HandshakeContext(ctx); err != nil {
		return a, fmt.Errorf("handshake: %w", err)
	}
	a.handshake = time.Since(t0)
	a.state = c.ConnectionState()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n"); err != nil {
		return a, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return a, fmt.Errorf("response: %w", err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return a, fmt.Errorf("response body: %w", err)
	}
	a.code = resp.StatusCode
	return a, nil
}

// waitTLS polls addr with tlsGet until it answers 2xx, p exits, or budget has passed.
func waitTLS(ctx context.Context, p *proc, addr, host string, cfg *tls.Config, budget time.Duration) (tls.ConnectionState, error) {
	deadline := time.Now().Add(budget)
	for {
		a, err := tlsGet(ctx, addr, host, cfg)
		if err == nil && a.code >= 200 && a.code < 300 {
			return a.state, nil
		}
		if p.exited() {
			return tls.ConnectionState{}, fmt.Errorf("%s exited before answering over TLS on %s: %v\n%s", p.name, addr, p.err, p.out.String())
		}
		if time.Now().After(deadline) {
			return tls.ConnectionState{}, fmt.Errorf("%s did not answer GET / over TLS within %v (last: %d %v)\n%s", addr, budget, a.code, err, p.out.String())
		}
		select {
		case <-ctx.Done():
			return tls.ConnectionState{}, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// handshakeResult is what one run of the handshake client measured.
type handshakeResult struct {
	Handshakes int64   `json:"handshakes"` // connections with a full handshake and a 2xx answer
	Errors     int64   `json:"errors"`
	Resumed    int64   `json:"resumed"`
	FirstError string  `json:"first_error,omitempty"`
	ElapsedNS  int64   `json:"elapsed_ns"`
	CPUNS      int64   `json:"cpu_ns"` // the client's own user + system time (0 when run in-process)
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
	Negotiated string  `json:"negotiated,omitempty"`
}

// rate is the handshakes per second.
func (r handshakeResult) rate() float64 {
	if r.ElapsedNS <= 0 {
		return math.NaN()
	}
	return float64(r.Handshakes) / (float64(r.ElapsedNS) / 1e9)
}

// handshakeLoop runs conns goroutines that each open connections to addr one after another
// (tlsGet) until dur has passed or max connections have been started, and joins them. A connection
// under way at the end is finished and counted; the elapsed time runs until the last one is.
func handshakeLoop(ctx context.Context, addr, host string, cfg *tls.Config, conns int, dur time.Duration, max int64) handshakeResult {
	var (
		started, ok, failed, resumed atomic.Int64
		mu                           sync.Mutex // guards the fields below
		lat                          []float64
		firstErr, negotiated         string
	)
	t0 := time.Now()
	end := t0.Add(dur)
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(end) && started.Add(1) <= max {
				a, err := tlsGet(ctx, addr, host, cfg)
				if err == nil && (a.code < 200 || a.code > 299) {
					err = fmt.Errorf("answered %d", a.code)
				}
				if err != nil {
					failed.Add(1)
					mu.Lock()
					if firstErr == "" {
						firstErr = err.Error()
					}
					mu.Unlock()
					continue
				}
				ok.Add(1)
				if a.state.DidResume {
					resumed.Add(1)
				}
				mu.Lock()
				lat = append(lat, float64(a.handshake.Microseconds()))
				if negotiated == "" {
					negotiated = describeTLS(a.state)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return handshakeResult{Handshakes: ok.Load(), Errors: failed.Load(), Resumed: resumed.Load(), FirstError: firstErr,
		ElapsedNS: time.Since(t0).Nanoseconds(), P50us: percentile(lat, 50), P99us: percentile(lat, 99), Negotiated: negotiated}
}

// handshakeChild is the handshake client as its own process (pinned like wrk): it runs handshakeLoop
// with its flags and prints the result as JSON.
func handshakeChild(args []string) int {
	fs := flag.NewFlagSet(handshakeChildArg, flag.ContinueOnError)
	addr := fs.String("addr", "", "host:port")
	sni := fs.String("sni", "localhost", "server name")
	host := fs.String("host", "localhost", "Host header")
	certFile := fs.String("cert", "", "PEM file of the certificate to pin")
	conns := fs.Int("conns", handshakeConns, "connections in flight")
	dur := fs.Duration("duration", 5*time.Second, "run length")
	maxConns := fs.Int64("max", handshakeMax, "at most this many connections")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	b, err := os.ReadFile(*certFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	blk, _ := pem.Decode(b)
	if blk == nil || *addr == "" || *conns < 1 || *maxConns < 1 {
		fmt.Fprintln(os.Stderr, "need -addr, -cert (PEM), -conns ≥ 1, -max ≥ 1")
		return 2
	}
	var before, after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	r := handshakeLoop(context.Background(), *addr, *host, clientTLS(blk.Bytes, *sni), *conns, min(*dur, 10*time.Minute), *maxConns)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := func(u syscall.Rusage) int64 { return u.Utime.Nano() + u.Stime.Nano() }
	r.CPUNS = cpu(after) - cpu(before)
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		return 1
	}
	return 0
}

// runHandshakeClient runs this binary as the handshake client against addr, pinned to cpus ("" =
// unpinned), bounded by dur plus a margin.
func runHandshakeClient(ctx context.Context, certFile, addr, cpus string, dur time.Duration) (handshakeResult, error) {
	self, err := os.Executable()
	if err != nil {
		return handshakeResult{}, err
	}
	args := []string{self, handshakeChildArg, "-addr", addr, "-cert", certFile, "-conns", strconv.Itoa(handshakeConns),
		"-duration", dur.String(), "-max", strconv.Itoa(handshakeMax)}
	if cpus != "" {
		args = append([]string{"taskset", "-c", cpus}, args...)
	}
	ctx, cancel := context.WithTimeout(ctx, dur+30*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return handshakeResult{}, fmt.Errorf("handshake client: %w: %s", err, stderr.String())
	}
	var r handshakeResult
	if err := json.Unmarshal(out, &r); err != nil {
		return handshakeResult{}, fmt.Errorf("handshake client: %w (%q)", err, out)
	}
	return r, nil
}

// cpuTimes reads one CPU's line of /proc/stat: busy and total jiffies.
func cpuTimes(cpu string) (busy, total uint64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 6 || f[0] != "cpu"+cpu {
			continue
		}
		var idle uint64
		for i, s := range f[1:] {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("/proc/stat: %q", l)
			}
			if i >= 8 { // guest and guest_nice are already in user and nice
				break
			}
			total += v
			if i == 3 || i == 4 { // idle, iowait
				idle += v
			}
		}
		return total - idle, total, nil
	}
	return 0, 0, fmt.Errorf("/proc/stat: no cpu%s", cpu)
}

// runHTTPS runs the experiment's three parts; a part that fails is reported and the others still run.
func runHTTPS(ctx context.Context, e *env) error {
	dir := filepath.Join(e.tmp, "https")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cert, err := writeBenchCert(dir, time.Now())
	if err != nil {
		return fmt.Errorf("certificate: %w", err)
	}
	res := &HTTPSResult{Runs: e.opts.runs}
	e.report.HTTPS = res
	load0 := loadAvg()
	modes := e.modes()
	var errs []error
	if len(modes) == 0 {
		e.report.skip("https warm path and handshakes", "neither -pinned nor -unpinned")
	} else if err := httpsServed(ctx, e, dir, cert, modes[0], res); err != nil {
		errs = append(errs, err)
	}
	if err := httpsCold(ctx, e, dir, cert, res); err != nil {
		errs = append(errs, fmt.Errorf("cold: %w", err))
	}
	ossl := "OpenSSL"
	if p, ok := lookTool("openssl"); ok {
		if out, err := exec.Command(p, "version").Output(); err == nil {
			if f := strings.Fields(string(out)); len(f) >= 2 {
				ossl = f[0] + " " + f[1]
			}
		}
	}
	res.Setup = fmt.Sprintf("One self-signed certificate for every server: ECDSA P-256 (SHA-256 signature), for localhost, *.localhost and 127.0.0.1, made by crypto/x509 for this run. wrk uses the system's OpenSSL (%s); the harness's Go client offers only X25519 and HTTP/1.1 and keeps no sessions. Load average (1 min) %s at the start, %s at the end.", ossl, load0, loadAvg())
	return errors.Join(errs...)
}

// loadAvg is the 1-minute load average, or "?".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// httpsServed starts the app, the activator with a TLS listener and each peer terminating TLS, then
// measures the warm path (wrk over https) and the handshake rate, in mode.
func httpsServed(ctx context.Context, e *env, dir string, cert benchCert, mode cpuMode, res *HTTPSResult) error {
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.Stop(5 * time.Second)
		}
	}()
	app, appPort, err := startBenchApp(ctx, e, mode.srv)
	if app != nil {
		procs = append(procs, app)
	}
	if err != nil {
		return err
	}
	cfg := clientTLS(cert.der, "localhost")

	// The activator: its own copy of the app as an exec tenant, woken over the plain listener.
	ports, err := freePorts(4)
	if err != nil {
		return err
	}
	conf := addTLS(renderConfig(ports[0], ports[1], []routeSpec{{name: "https", hosts: []string{"127.0.0.1", "localhost"}, port: ports[2], argv: []string{e.actBin, "app"}}}), ports[3], cert)
	adir := filepath.Join(dir, "activator")
	if err := os.MkdirAll(adir, 0o755); err != nil {
		return err
	}
	act, _, err := startActivator(ctx, e, adir, mode.srv, conf, ports[0], ports[1])
	if err != nil {
		return fmt.Errorf("activator: %w", err)
	}
	procs = append(procs, act.proc)
	if err := waitHTTP(ctx, act.proc, act.edge, "/", time.Minute); err != nil {
		return fmt.Errorf("activator: first request: %w", err)
	}
	tlsAddr := fmt.Sprintf("127.0.0.1:%d", ports[3])
	st, err := waitTLS(ctx, act.proc, tlsAddr, "localhost", cfg, 30*time.Second)
	if err != nil {
		return fmt.Errorf("activator: %w", err)
	}
	targets := []warmTarget{{name: "activator", addr: tlsAddr, tls: true, proc: act.proc}}
	negotiated := map[string]string{"activator": describeTLS(st)}

	peers := []struct {
		name, binary, pkg string
		start             func(e *env, dir string, listen, app int, cpus string, workers int, c benchCert) (*proc, error)
	}{
		{"nginx", "nginx", "nginx-light (or nginx)", startNginxTLS},
		{"caddy", "caddy", "caddy", startCaddyTLS},
		{"haproxy", "haproxy", "haproxy", startHAProxyTLS},
	}
	for _, pd := range peers {
		if _, ok := e.tools[pd.binary]; !ok {
			e.report.skip(pd.name+" (https)", "%s not found (Debian package %s)", pd.binary, pd.pkg)
			continue
		}
		port, err := freePort()
		if err != nil {
			return err
		}
		pdir := filepath.Join(dir, pd.name)
		if err := os.MkdirAll(pdir, 0o755); err != nil {
			return err
		}
		p, err := pd.start(e, pdir, port, appPort, mode.srv, mode.workers, cert)
		if err != nil {
			e.report.skip(pd.name+" (https)", "cannot start: %v", err)
			continue
		}
		procs = append(procs, p)
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		st, err := waitTLS(ctx, p, addr, "localhost", cfg, 30*time.Second)
		if err != nil {
			e.report.skip(pd.name+" (https)", "did not answer over TLS: %v", err)
			continue
		}
		negotiated[pd.name] = describeTLS(st)
		targets = append(targets, warmTarget{name: pd.name, addr: addr, tls: true, proc: p})
	}

	var errs []error
	if wrk, ok := e.tools["wrk"]; ok {
		warm := append(append([]warmTarget(nil), targets...), warmTarget{name: "activator (plain HTTP)", addr: act.edge, proc: act.proc})
		if err := httpsWarm(ctx, e, wrk, mode, warm, res); err != nil {
			errs = append(errs, fmt.Errorf("warm: %w", err))
		}
	} else {
		e.report.skip("https warm path", "wrk not found (Debian package wrk)")
	}
	if err := httpsHandshakes(ctx, e, cert, mode, targets, negotiated, res); err != nil {
		errs = append(errs, fmt.Errorf("handshakes: %w", err))
	}
	return errors.Join(errs...)
}

// httpsConns are the warm path's connection counts: -conns without c1 (a latency figure, which the
// plain warm path has), unless c1 is all there is.
func httpsConns(conns []int) []int {
	var out []int
	for _, c := range conns {
		if c > 1 {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		return conns
	}
	return out
}

// httpsWarm is the warm path over HTTPS: wrk keep-alive at each connection count, the targets
// rotated round by round, as runWarm does it over plain HTTP.
func httpsWarm(ctx context.Context, e *env, wrk string, mode cpuMode, targets []warmTarget, res *HTTPSResult) error {
	conns := httpsConns(e.opts.conns)
	smp, err := measureRounds(ctx, e, "wrk https", mode, targets, conns, 64, wrkMeasure(wrk, mode))
	if err != nil {
		return err
	}
	res.Warm = append(res.Warm, smp.rows(mode.name, conns, targets)...)
	for _, c := range conns {
		a := roundKey{"activator", c}
		add := func(name string, v Stat) {
			res.WarmRatios = append(res.WarmRatios, RatioRow{Mode: mode.name, Conns: c, Name: name, Value: v})
		}
		for _, t := range targets[1:] {
			add("activator ÷ "+t.name+", req/s", ratios(smp.rps[a], smp.rps[roundKey{t.name, c}]))
		}
		for _, t := range targets[1:] {
			add("activator p99 ÷ "+t.name+" p99", ratios(smp.p99[a], smp.p99[roundKey{t.name, c}]))
		}
	}
	return nil
}

// httpsHandshakes measures new TLS connections per second against each target, the targets rotated
// round by round, the client pinned where wrk is.
func httpsHandshakes(ctx context.Context, e *env, cert benchCert, mode cpuMode, targets []warmTarget, negotiated map[string]string, res *HTTPSResult) error {
	type runs struct {
		rate, p50, p99, client, server []float64
		errors, resumed                int64
		failed                         int
		firstErr                       string
	}
	by := map[string]*runs{}
	for _, t := range targets {
		by[t.name] = &runs{}
	}
	for run := 0; run < e.opts.runs; run++ {
		for i := range targets {
			t := targets[(i+run)%len(targets)]
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if t.proc.exited() {
				return fmt.Errorf("%s exited: %v\n%s", t.name, t.proc.err, t.proc.out.String())
			}
			rs := by[t.name]
			var b0, t0 uint64
			if mode.srv != "" {
				b0, t0, _ = cpuTimes(mode.srv)
			}
			r, err := runHandshakeClient(ctx, cert.certFile, t.addr, mode.load, e.opts.dur)
			if err == nil && r.Handshakes == 0 {
				err = fmt.Errorf("no handshake completed: %s", r.FirstError)
			}
			if err != nil {
				e.log.Warn("handshake run failed", "target", t.name, "err", err)
				rs.failed++
				if rs.firstErr == "" {
					rs.firstErr = err.Error()
				}
				for _, v := range []*[]float64{&rs.rate, &rs.p50, &rs.p99, &rs.client, &rs.server} {
					*v = append(*v, math.NaN())
				}
				continue
			}
			server := math.NaN()
			if mode.srv != "" {
				if b1, t1, err := cpuTimes(mode.srv); err == nil && t1 > t0 {
					server = float64(b1-b0) / float64(t1-t0)
				}
			}
			rs.rate = append(rs.rate, r.rate())
			rs.p50 = append(rs.p50, r.P50us)
			rs.p99 = append(rs.p99, r.P99us)
			rs.client = append(rs.client, float64(r.CPUNS)/float64(r.ElapsedNS))
			rs.server = append(rs.server, server)
			rs.errors += r.Errors
			rs.resumed += r.Resumed
			if rs.firstErr == "" && r.FirstError != "" {
				rs.firstErr = r.FirstError
			}
			e.log.Info("tls handshakes", "mode", mode.name, "run", run+1, "target", t.name, "per_s", int(r.rate()), "errors", r.Errors)
		}
	}
	for _, t := range targets {
		rs := by[t.name]
		res.Handshakes = append(res.Handshakes, HandshakeRow{Mode: mode.name, Target: t.name, Conns: handshakeConns,
			Rate: summarize(rs.rate), P50us: summarize(rs.p50), P99us: summarize(rs.p99),
			ClientCPU: summarize(rs.client), ServerCPU: summarize(rs.server),
			Errors: rs.errors, Resumed: rs.resumed, FailedRuns: rs.failed, Negotiated: negotiated[t.name], FirstError: rs.firstErr})
	}
	for _, r := range res.Handshakes {
		if r.ClientCPU.valid() && r.ClientCPU.Median >= 0.9 {
			res.Notes = append(res.Notes, fmt.Sprintf("handshakes, %s: the client used %.0f%% of its CPU, so it may have set the pace: the rate is a lower bound of the server's", r.Target, 100*r.ClientCPU.Median))
		}
	}
	a := by["activator"]
	for _, t := range targets[1:] {
		res.HandshakeRatios = append(res.HandshakeRatios, RatioRow{Mode: mode.name, Conns: handshakeConns,
			Name: "activator ÷ " + t.name + ", handshakes/s", Value: ratios(a.rate, by[t.name].rate)})
	}
	return nil
}

// httpsCold times the first request to a sleeping exec route over plain HTTP and over HTTPS (a fresh
// connection and a full handshake), one of each per round, alternating which goes first. Unpinned, as
// the plain cold wake is.
func httpsCold(ctx context.Context, e *env, dir string, cert benchCert, res *HTTPSResult) error {
	app, err := harnessApp(ctx, e)
	if err != nil {
		return err
	}
	ports, err := freePorts(4)
	if err != nil {
		return err
	}
	const route = "cold-tls"
	host := route + ".localhost"
	conf := addTLS(renderConfig(ports[0], ports[1], []routeSpec{{name: route, hosts: []string{host}, port: ports[2], argv: []string{app}}}), ports[3], cert)
	adir := filepath.Join(dir, "cold")
	if err := os.MkdirAll(adir, 0o755); err != nil {
		return err
	}
	act, _, err := startActivator(ctx, e, adir, "", conf, ports[0], ports[1])
	if err != nil {
		return fmt.Errorf("activator: %w", err)
	}
	defer act.Stop(10 * time.Second)
	tlsAddr := fmt.Sprintf("127.0.0.1:%d", ports[3])
	cfg := clientTLS(cert.der, host) // the name is served by the certificate's *.localhost

	type sample = coldTLSSample
	takes := []func() (sample, error){
		func() (sample, error) {
			if err := act.adminPost(ctx, "/routes/"+route+"/sleep"); err != nil {
				return sample{}, err
			}
			r, err := firstByte(ctx, act.edge, "/bound", host, time.Minute)
			if err != nil {
				return sample{}, err
			}
			if err := checkCold(r, r.sent); err != nil {
				return sample{}, err
			}
			fb := float64(r.first.Sub(r.sent).Nanoseconds()) / 1e6
			return sample{firstByte: fb, handshake: math.NaN(), request: fb}, nil
		},
		func() (sample, error) {
			if err := act.adminPost(ctx, "/routes/"+route+"/sleep"); err != nil {
				return sample{}, err
			}
			return coldTLS(ctx, tlsAddr, host, cfg)
		},
	}
	names := []string{"plain HTTP", "HTTPS (fresh connection, full handshake)"}
	for j, take := range takes { // warm-up: page cache, the activator's and the client's first use
		if _, err := take(); err != nil {
			return fmt.Errorf("%s: warm-up: %w", names[j], err)
		}
	}
	samples := make([][]sample, len(takes))
	failed := make([]int, len(takes))
	firstErr := make([]string, len(takes))
	var diff, ratio, reqDiff []float64
	for i := 0; i < e.opts.coldSamples; i++ {
		got := make([]sample, len(takes))
		okRound := true
		for k := range takes {
			j := (k + i) % len(takes) // alternate which goes first
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s, err := takes[j]()
			if err != nil {
				failed[j]++
				okRound = false
				if firstErr[j] == "" {
					firstErr[j] = err.Error()
				}
				continue
			}
			got[j] = s
			samples[j] = append(samples[j], s)
		}
		if okRound {
			diff = append(diff, got[1].firstByte-got[0].firstByte)
			ratio = append(ratio, got[1].firstByte/got[0].firstByte)
			reqDiff = append(reqDiff, got[1].request-got[0].request)
		}
	}
	for j, name := range names {
		stat := func(f func(sample) float64) Stat {
			var v []float64
			for _, s := range samples[j] {
				v = append(v, f(s))
			}
			return summarize(v)
		}
		row := HTTPSColdRow{Mode: name, Samples: len(samples[j]), Failed: failed[j],
			FirstByte: stat(func(s sample) float64 { return s.firstByte }),
			Handshake: stat(func(s sample) float64 { return s.handshake }),
			Request:   stat(func(s sample) float64 { return s.request }),
		}
		if firstErr[j] != "" {
			row.Note = "first failure: " + firstErr[j]
		}
		res.Cold = append(res.Cold, row)
	}
	res.ColdExtra = append(res.ColdExtra,
		RatioRow{Name: "HTTPS first byte − plain first byte (ms): the handshake's extra", Value: summarize(diff)},
		RatioRow{Name: "HTTPS first byte ÷ plain first byte", Value: summarize(ratio)},
		RatioRow{Name: "HTTPS request → first byte − plain (ms): the wake itself over TLS", Value: summarize(reqDiff)})
	e.log.Info("cold https", "extra_ms", summarize(diff).Median)
	return nil
}

// coldTLSSample is one cold first request of httpsCold, in milliseconds (handshake NaN over plain HTTP).
type coldTLSSample struct{ firstByte, handshake, request float64 }

// coldTLS dials addr, makes a full handshake with cfg, sends GET /bound for host and times it: from
// the handshake's start (the TCP connection made) to the first response byte.
func coldTLS(ctx context.Context, addr, host string, cfg *tls.Config) (coldTLSSample, error) {
	var s coldTLSSample
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return s, err
	}
	defer raw.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(dl)
	}
	c := tls.Client(raw, cfg)
	t0 := time.Now()
	if err := c.HandshakeContext(ctx); err != nil {
		return s, fmt.Errorf("handshake: %w", err)
	}
	hs := time.Now()
	r, err := exchange(c, "/bound", host)
	if err != nil {
		return s, err
	}
	if err := checkCold(r, t0); err != nil {
		return s, err
	}
	ms := func(a, b time.Time) float64 { return float64(b.Sub(a).Nanoseconds()) / 1e6 }
	s.firstByte, s.handshake, s.request = ms(t0, r.first), ms(t0, hs), ms(r.sent, r.first)
	return s, nil
}

// checkCold checks that r is the app's GET /bound answer from a process whose main() ran after since:
// a sample that found its route awake is no cold wake.
func checkCold(r fbResult, since time.Time) error {
	if r.code != 200 {
		return fmt.Errorf("first request answered %d: %s", r.code, r.body)
	}
	var b boundInfo
	if err := json.Unmarshal(r.body, &b); err != nil {
		return fmt.Errorf("GET /bound: %w (%q)", err, r.body)
	}
	if b.MainNS < since.UnixNano() {
		return errors.New("the route was awake: the app's main() ran before the request")
	}
	return nil
}

// startNginxTLS starts nginx terminating TLS with c on listen, as startNginx proxies plain HTTP.
func startNginxTLS(e *env, dir string, listen, app int, cpus string, workers int, c benchCert) (*proc, error) {
	server := fmt.Sprintf("listen 127.0.0.1:%d ssl;\n    ssl_certificate %s;\n    ssl_certificate_key %s;\n    ssl_protocols TLSv1.2 TLSv1.3;",
		listen, c.certFile, c.keyFile)
	return startNginxConf(e, dir, server, app, cpus, workers, "")
}

// startCaddyTLS starts Caddy terminating TLS with c (tls cert key) on listen.
func startCaddyTLS(e *env, dir string, listen, app int, cpus string, workers int, c benchCert) (*proc, error) {
	return startCaddyConf(e, dir, fmt.Sprintf("https://127.0.0.1:%[1]d, https://localhost:%[1]d {\n\ttls %[3]s %[4]s\n\treverse_proxy 127.0.0.1:%[2]d\n}\n",
		listen, app, c.certFile, c.keyFile), cpus)
}

// startHAProxyTLS starts HAProxy terminating TLS with c (bind … ssl crt) on listen.
func startHAProxyTLS(e *env, dir string, listen, app int, cpus string, workers int, c benchCert) (*proc, error) {
	return startHAProxyConf(e, dir, "  ssl-default-bind-options ssl-min-ver TLSv1.2\n", fmt.Sprintf("127.0.0.1:%d ssl crt %s", listen, c.combined), app, cpus, workers)
}

// markdown renders the experiment into b.
func (h *HTTPSResult) markdown(b *strings.Builder) {
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("#### HTTPS: the activator terminating TLS beside nginx, Caddy and HAProxy\n\n%s\n\n", h.Setup)
	if len(h.Warm) > 0 {
		p("Warm path over HTTPS: wrk keep-alive, `GET /` of the same tiny app behind each, every target measured in every round, the order rotated. *activator (plain HTTP)*: the same activator's plain listener, for the cost of TLS itself. Median (min–max) over the rounds; latency in µs; errors are wrk's socket errors and non-2xx answers, summed; *rounds*: the wrk runs that reported, of those made.\n\n")
		p("| mode | conns | target | rounds | req/s | p50 µs | p99 µs | errors |\n|---|---|---|---|---|---|---|---|\n")
		for _, w := range h.Warm {
			p("| %s | %d | %s | %d/%d | %s | %s | %s | %d |\n", w.Mode, w.Conns, w.Target, w.RPS.N, h.Runs, fmtK(w.RPS), fmtStat(w.P50us, 0), fmtStat(w.P99us, 0), w.Errors)
		}
		p("\n| mode | conns | ratio, round by round | value |\n|---|---|---|---|\n")
		for _, x := range h.WarmRatios {
			p("| %s | %d | %s | %s |\n", x.Mode, x.Conns, x.Name, fmtStat(x.Value, 2))
		}
		p("\n")
	}
	if len(h.Handshakes) > 0 {
		p("New TLS connections per second: this binary re-executed as a Go client (pinned where wrk is), %d connections in flight, each dialing, making a full handshake (no session cache), sending one `GET /` with `Connection: close`, reading the answer and closing; for `-duration` per round, at most %d connections a round. *connect+handshake*: dial → handshake done, per connection. *client CPU*: the client's CPU time ÷ the run's wall time (near 1 pinned: the client, not the server, set the pace). *server CPU busy*: the servers' CPU from /proc/stat, which counts anything else running there. *failed runs*: rounds that measured nothing.\n\n", handshakeConns, handshakeMax)
		p("| mode | target | handshakes/s | connect+handshake p50 µs | p99 µs | client CPU | server CPU busy | errors | resumed | failed runs | negotiated |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range h.Handshakes {
			p("| %s | %s | %s | %s | %s | %s | %s | %d | %d | %d | %s |\n", r.Mode, r.Target, fmtStat(r.Rate, 0), fmtStat(r.P50us, 0), fmtStat(r.P99us, 0),
				fmtStat(r.ClientCPU, 2), fmtStat(r.ServerCPU, 2), r.Errors, r.Resumed, r.FailedRuns, r.Negotiated)
		}
		p("\n| mode | ratio, round by round | value |\n|---|---|---|\n")
		for _, x := range h.HandshakeRatios {
			p("| %s | %s | %s |\n", x.Mode, x.Name, fmtStat(x.Value, 2))
		}
		for _, r := range h.Handshakes {
			if r.FirstError != "" {
				p("\n- %s, first error: %s", r.Target, r.FirstError)
			}
		}
		p("\n\n")
	}
	if len(h.Cold) > 0 {
		p("Cold wake over HTTPS, milliseconds: one exec route (`listen: env`, the harness's demo app), put to sleep through the admin API before each sample, then `GET /bound` on a fresh connection, unpinned as the plain cold wake is. Each round takes one plain sample and one HTTPS sample, alternating which goes first. *plain HTTP*: request written → first byte. *HTTPS*: handshake began (TCP connected) → first byte, the handshake a full one with SNI `cold-tls.localhost`. A sample that found the app already running counts as failed.\n\n")
		p("| request | samples | failed | first byte | handshake | request → first byte |\n|---|---|---|---|---|---|\n")
		for _, c := range h.Cold {
			p("| %s | %d | %d | %s | %s | %s |\n", c.Mode, c.Samples, c.Failed, fmtStat(c.FirstByte, 2), fmtStat(c.Handshake, 2), fmtStat(c.Request, 2))
		}
		p("\n| sample pairs, same round | value |\n|---|---|\n")
		for _, x := range h.ColdExtra {
			p("| %s | %s |\n", x.Name, fmtStat(x.Value, 2))
		}
		for _, c := range h.Cold {
			if c.Note != "" {
				p("\n- %s: %s", c.Mode, c.Note)
			}
		}
		p("\n\n")
	}
	for _, n := range h.Notes {
		p("- %s\n", n)
	}
	if len(h.Notes) > 0 {
		p("\n")
	}
}
