// Command bench is the reproducible benchmark harness: it measures the activator side by side with the
// alternatives users would pick (the app alone, nginx, Caddy, HAProxy; systemd socket activation) on
// this machine, in one run, and reports ratios with their spread over repeated alternating runs.
//
//	go run ./bench                 # everything this machine can run (about 15 minutes)
//	go run ./bench -quick          # about a minute: one short run of each
//	go run ./bench -only warm,cold # a subset
//
// It installs nothing: a peer whose binary is missing is skipped with a message naming its Debian
// package. All load is on loopback and bounded in count and time. See bench/README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

// options are the command-line flags, fixed after parsing.
type options struct {
	quick       bool
	runs        int
	dur         time.Duration
	conns       []int
	only        map[string]bool
	coldSamples int
	herd        []int
	scaleRoutes int
	guestRuns   int // alternating rounds of the guest and node wakes
	herdRuns    int // herds per size, sizes alternating
	nodes       int // members of each Redfish fleet
	chainRuns   int // cold wakes of the chain a ← b ← c
	slowClients int // connections trickling request bodies in the slow-client experiment
	pinned      bool
	unpinned    bool
	mdOut       string
	jsonOut     string
	keep        bool
}

// env is what every experiment shares: the built activator, the tools found, the scratch directory.
type env struct {
	opts    options
	log     *slog.Logger
	tmp     string
	actBin  string
	tools   map[string]string // name -> path of the tools found
	report  *Report
	cpuLoad string // taskset CPU list for the load generator when pinned
	cpuSrv  string // taskset CPU list for the servers when pinned
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == handshakeChildArg { // the https experiment's client, re-executed
		os.Exit(handshakeChild(os.Args[2:]))
	}
	os.Exit(run())
}

func run() int {
	var o options
	var conns, only, herd string
	flag.BoolVar(&o.quick, "quick", false, "a short run (about a minute): 1 run of 2 s, c16 only, herd of 1000, 1000 routes, 2 guest rounds, 200 slow clients")
	flag.IntVar(&o.runs, "runs", 5, "alternating runs per warm-path measurement (the median and spread are reported)")
	flag.DurationVar(&o.dur, "duration", 5*time.Second, "length of one wrk run")
	flag.StringVar(&conns, "conns", "1,16,64", "wrk connection counts")
	flag.StringVar(&only, "only", "", "comma-separated subset of: warm,slow,cold,chain,unit,herd,heldmem,scale,guest,fleet,https (default all)")
	flag.IntVar(&o.coldSamples, "cold-samples", 60, "cold wakes per mode (the cold, unit and https experiments): a cold wake's medians need many, since the app's own start-up varies by 2x from round to round")
	flag.StringVar(&herd, "herd", "1000,10000", "herd sizes (concurrent requests on a cold route)")
	flag.IntVar(&o.scaleRoutes, "routes", 10000, "configured idle routes for the scale test")
	flag.IntVar(&o.herdRuns, "herd-runs", 5, "herds per size (the sizes alternate); medians and spread are reported")
	flag.IntVar(&o.guestRuns, "guest-runs", 7, "alternating rounds of the guest (QEMU) and node (Redfish fleet) wakes")
	flag.IntVar(&o.nodes, "nodes", 8, "members of each Redfish fleet (the simulator serves twice as many: a parallel fleet and a serial one)")
	flag.IntVar(&o.chainRuns, "chain-runs", 15, "cold wakes of the chain a ← b ← c")
	flag.IntVar(&o.slowClients, "slow-clients", 1000, "connections trickling request bodies at 1 byte/s in the slow-client experiment")
	flag.BoolVar(&o.pinned, "pinned", true, "measure with wrk on CPU 0 and the servers on CPU 1 (taskset)")
	flag.BoolVar(&o.unpinned, "unpinned", true, "also measure unpinned (reported apart)")
	flag.StringVar(&o.mdOut, "md", "bench/results/latest.md", "write the Markdown report here")
	flag.StringVar(&o.jsonOut, "json", "bench/results/latest.json", "write the JSON report here")
	flag.BoolVar(&o.keep, "keep", false, "keep the scratch directory (configs, logs)")
	flag.Parse()
	if o.quick {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["runs"] {
			o.runs = 1
		}
		if !set["duration"] {
			o.dur = 2 * time.Second
		}
		if !set["conns"] {
			conns = "16"
		}
		if !set["cold-samples"] {
			o.coldSamples = 5
		}
		if !set["herd"] {
			herd = "1000"
		}
		if !set["routes"] {
			o.scaleRoutes = 1000
		}
		if !set["herd-runs"] {
			o.herdRuns = 1
		}
		if !set["guest-runs"] {
			o.guestRuns = 2
		}
		if !set["chain-runs"] {
			o.chainRuns = 5
		}
		if !set["slow-clients"] {
			o.slowClients = 200
		}
		if !set["unpinned"] {
			o.unpinned = false
		}
	}
	var err error
	if o.conns, err = parseInts(conns); err != nil {
		fmt.Fprintln(os.Stderr, "bench: -conns:", err)
		return 2
	}
	if o.herd, err = parseInts(herd); err != nil {
		fmt.Fprintln(os.Stderr, "bench: -herd:", err)
		return 2
	}
	if only != "" {
		o.only = map[string]bool{}
		var names []string
		for _, x := range experiments() {
			names = append(names, x.name)
		}
		for _, s := range strings.Split(only, ",") {
			s = strings.TrimSpace(s)
			if !slices.Contains(names, s) {
				fmt.Fprintf(os.Stderr, "bench: -only: no experiment %q (want a comma-separated subset of %s)\n", s, strings.Join(names, ","))
				return 2
			}
			o.only[s] = true
		}
	}
	if o.runs < 1 || o.coldSamples < 1 || o.guestRuns < 1 || o.herdRuns < 1 || o.slowClients < 1 || o.chainRuns < 1 || o.nodes < 2 {
		fmt.Fprintln(os.Stderr, "bench: -runs, -cold-samples, -herd-runs, -guest-runs, -chain-runs and -slow-clients must be at least 1, -nodes at least 2")
		return 2
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	e, cleanup, err := setup(ctx, o, log)
	if err != nil {
		log.Error("setup failed", "err", err)
		return 1
	}
	defer cleanup()

	for _, x := range experiments() {
		if o.only != nil && !o.only[x.name] {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		log.Info("experiment", "name", x.name)
		t0 := time.Now()
		if err := x.run(ctx, e); err != nil {
			log.Error("experiment failed", "name", x.name, "err", err)
			e.report.Failures = append(e.report.Failures, fmt.Sprintf("%s: %v", x.name, err))
		}
		log.Info("experiment done", "name", x.name, "took", time.Since(t0).Round(time.Second))
	}
	e.report.Finished = time.Now().UTC()
	if err := e.report.write(o.mdOut, o.jsonOut); err != nil {
		log.Error("write report", "err", err)
		return 1
	}
	fmt.Print(e.report.markdown())
	log.Info("report written", "markdown", o.mdOut, "json", o.jsonOut)
	if ctx.Err() != nil {
		return 130
	}
	return 0
}

// experiment is one part of the harness, selected by name with -only.
type experiment struct {
	name string
	run  func(context.Context, *env) error
}

// experiments are the harness's parts, in the order they run.
func experiments() []experiment {
	return []experiment{
		{"warm", runWarm},
		{"slow", runSlow},
		{"cold", runCold},
		{"chain", runChain},
		{"unit", runUnit},
		{"herd", runHerd},
		{"heldmem", runHeldMem},
		{"scale", runScale},
		{"guest", runGuest},
		{"fleet", runFleet},
		{"https", runHTTPS},
	}
}

// setup builds the activator, finds the tools and raises the fd limit. cleanup removes the scratch
// directory.
func setup(ctx context.Context, o options, log *slog.Logger) (*env, func(), error) {
	tmp, err := os.MkdirTemp("", "activator-bench-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() {
		if o.keep {
			log.Info("scratch directory kept", "dir", tmp)
			return
		}
		_ = os.RemoveAll(tmp)
	}
	e := &env{opts: o, log: log, tmp: tmp, tools: map[string]string{}, cpuLoad: "0", cpuSrv: "1"}
	e.report = newReport(o)

	e.actBin = filepath.Join(tmp, "activator")
	log.Info("building the activator", "out", e.actBin)
	build := exec.CommandContext(ctx, "go", "build", "-o", e.actBin, "./cmd/activator")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("go build ./cmd/activator (run from the repository root): %w", err)
	}

	for _, t := range []string{"wrk", "taskset", "nginx", "caddy", "haproxy"} {
		if p, ok := lookTool(t); ok {
			e.tools[t] = p
		}
	}
	if runtime.NumCPU() < 2 && (o.pinned) {
		e.report.skip("pinned", "this machine has one CPU: pinned runs need two (wrk on CPU 0, servers on CPU 1)")
		e.opts.pinned = false
		e.opts.unpinned = true
	}
	if _, ok := e.tools["taskset"]; !ok && e.opts.pinned {
		e.report.skip("pinned", "taskset not found (Debian package util-linux): measuring unpinned only")
		e.opts.pinned = false
		e.opts.unpinned = true
	}
	lim, err := raiseNofileForHerds(o.herd)
	if err != nil {
		log.Warn("cannot raise the open-file limit", "err", err)
	}
	e.report.Machine = describeMachine(lim)
	return e, cleanup, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(f), &n); err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a list of positive integers", s)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

// modes lists the CPU placements to measure: name and the (load, server) taskset lists.
func (e *env) modes() []cpuMode {
	var m []cpuMode
	if e.opts.pinned {
		m = append(m, cpuMode{name: "pinned", load: e.cpuLoad, srv: e.cpuSrv, threads: 1, workers: 1})
	}
	if e.opts.unpinned {
		m = append(m, cpuMode{name: "unpinned", threads: 2, workers: 2})
	}
	return m
}

// cpuMode is one CPU placement.
type cpuMode struct {
	name      string
	load, srv string // taskset CPU lists; "" = unpinned
	threads   int    // wrk threads
	workers   int    // nginx workers / HAProxy threads
}
