package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// wrkResult is what one wrk run reports.
type wrkResult struct {
	RPS      float64 // requests per second
	P50, P99 float64 // latency in microseconds
	Requests int64
	Errors   int64 // socket errors + non-2xx/3xx responses
	Timeouts int64 // of Errors, requests that got no answer within wrkTimeout (not in the latencies)
}

// wrkTimeout is wrk's --timeout: a request unanswered for this long counts as a timeout error, and
// its latency is left out of the percentiles.
const wrkTimeout = 5 * time.Second

// wrkRun is one load run: conns connections for dur against url, wrk pinned to cpus ("" = unpinned).
type wrkRun struct {
	url     string
	conns   int
	threads int
	dur     time.Duration
	cpus    string
	host    string // Host header ("" = from the URL)
}

// run executes wrk, bounded by the run's duration plus a margin.
func (w wrkRun) run(ctx context.Context, wrkPath string) (wrkResult, error) {
	args := []string{wrkPath, "-t", strconv.Itoa(w.threads), "-c", strconv.Itoa(w.conns),
		"-d", fmt.Sprintf("%ds", max(1, int(w.dur.Round(time.Second)/time.Second))), "--latency", "--timeout", fmt.Sprintf("%ds", int(wrkTimeout/time.Second)), w.url}
	if w.host != "" {
		args = append(args[:1], append([]string{"-H", "Host: " + w.host}, args[1:]...)...)
	}
	if w.cpus != "" {
		args = append([]string{"taskset", "-c", w.cpus}, args...)
	}
	ctx, cancel := context.WithTimeout(ctx, w.dur+30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return wrkResult{}, fmt.Errorf("wrk: %w: %s", err, out)
	}
	return parseWrk(string(out))
}

// parseWrk reads wrk --latency output.
func parseWrk(out string) (wrkResult, error) {
	var r wrkResult
	var haveRPS, have50, have99 bool
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "Requests/sec:":
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return r, fmt.Errorf("wrk: bad Requests/sec %q", f[1])
			}
			r.RPS, haveRPS = v, true
		case len(f) == 2 && (f[0] == "50%" || f[0] == "99%"):
			v, err := parseWrkDuration(f[1])
			if err != nil {
				return r, err
			}
			if f[0] == "50%" {
				r.P50, have50 = v, true
			} else {
				r.P99, have99 = v, true
			}
		case len(f) >= 3 && f[1] == "requests" && f[2] == "in":
			r.Requests, _ = strconv.ParseInt(f[0], 10, 64)
		case len(f) >= 5 && f[0] == "Non-2xx":
			n, _ := strconv.ParseInt(f[len(f)-1], 10, 64)
			r.Errors += n
		case len(f) >= 3 && f[0] == "Socket" && f[1] == "errors:":
			// Socket errors: connect 0, read 0, write 0, timeout 0
			for i := 2; i+1 < len(f); i += 2 {
				n, _ := strconv.ParseInt(strings.TrimSuffix(f[i+1], ","), 10, 64)
				r.Errors += n
				if f[i] == "timeout" {
					r.Timeouts = n
				}
			}
		}
	}
	if !haveRPS || !have50 || !have99 {
		return r, fmt.Errorf("wrk: unexpected output:\n%s", out)
	}
	return r, nil
}

// parseWrkDuration turns wrk's "195.00us", "1.23ms", "2.00s", "1.00m" into microseconds.
func parseWrkDuration(s string) (float64, error) {
	units := []struct {
		suffix string
		us     float64
	}{{"us", 1}, {"ms", 1e3}, {"s", 1e6}, {"m", 60e6}, {"h", 3600e6}}
	for _, u := range units {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("wrk: bad duration %q", s)
			}
			return f * u.us, nil
		}
	}
	return 0, fmt.Errorf("wrk: bad duration %q", s)
}

// h2loadRun is one HTTP/2 load run: h2load over h2c (prior knowledge, as h2load speaks to an http://
// URL), conns connections with streams requests in flight on each, for dur, pinned to cpus ("" =
// unpinned).
type h2loadRun struct {
	url     string
	conns   int
	streams int
	threads int
	dur     time.Duration
	cpus    string
}

// run executes h2load, bounded by the run's duration plus a margin. h2load reports no latency
// percentiles: P50 and P99 are NaN.
func (h h2loadRun) run(ctx context.Context, path string) (wrkResult, error) {
	args := []string{path, "-t", strconv.Itoa(h.threads), "-c", strconv.Itoa(h.conns), "-m", strconv.Itoa(h.streams),
		"-D", strconv.Itoa(max(1, int(h.dur.Round(time.Second)/time.Second))), h.url}
	if h.cpus != "" {
		args = append([]string{"taskset", "-c", h.cpus}, args...)
	}
	ctx, cancel := context.WithTimeout(ctx, h.dur+30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return wrkResult{}, fmt.Errorf("h2load: %w: %s", err, out)
	}
	return parseH2load(string(out))
}

// parseH2load reads h2load's summary: "finished in 5.00s, 7608.67 req/s, …" and "requests: N total,
// N started, N done, N succeeded, N failed, N errored, N timeout". Errors are the failed, errored
// and timed-out requests; one that was not done at all means the protocol was not spoken.
func parseH2load(out string) (wrkResult, error) {
	r := wrkResult{P50: math.NaN(), P99: math.NaN()}
	var haveRPS, haveReq bool
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "finished in "):
			f := strings.Split(line, ", ")
			if len(f) >= 2 {
				v, err := strconv.ParseFloat(strings.TrimSuffix(f[1], " req/s"), 64)
				if err != nil {
					return r, fmt.Errorf("h2load: bad req/s in %q", line)
				}
				r.RPS, haveRPS = v, true
			}
		case strings.HasPrefix(line, "requests: "):
			for item := range strings.SplitSeq(strings.TrimPrefix(line, "requests: "), ", ") {
				n, what, _ := strings.Cut(item, " ")
				v, err := strconv.ParseInt(n, 10, 64)
				if err != nil {
					return r, fmt.Errorf("h2load: bad count in %q", line)
				}
				switch what {
				case "done":
					r.Requests, haveReq = v, true
				case "failed", "errored":
					r.Errors += v
				case "timeout":
					r.Errors += v
					r.Timeouts = v
				}
			}
		}
	}
	if !haveRPS || !haveReq || r.Requests == 0 {
		return r, fmt.Errorf("h2load: no requests done:\n%s", out)
	}
	return r, nil
}
