package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// fleetDelay is how long each simulated node stays PoweringOn (and PoweringOff). It is long against the
// activator's own share of a node wake (a Reset, PowerState polls, the health gate), so the fleet ratio
// says whether the members' wakes overlap, not how fast the harness's CPUs are.
const fleetDelay = 300 * time.Millisecond

// fleetRoute is one fleet route of the node experiment: its members are the simulator's nodes first
// to first+len(ports)-1, each with its own service port.
type fleetRoute struct {
	name   string
	serial bool
	first  int
	ports  []int
}

func (f fleetRoute) host() string { return f.name + ".localhost" }

// node is the simulator's name of the fleet's i-th member.
func (f fleetRoute) node(i int) string { return fmt.Sprintf("node-%d", f.first+i) }

// runFleet wakes two fleets of n nodes of the real Redfish simulator, each one route of the activator
// configured with fleet:, one waking its members in parallel and one serially (serial: true), with one
// request each in alternating rounds, and reports parallel ÷ serial against the ideal 1/n.
func runFleet(ctx context.Context, e *env) error {
	dir := filepath.Join(e.tmp, "fleet")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if ok, why := backingWired(ctx, e, dir, "redfish", "    redfish: {}\n"); !ok {
		e.report.skip("node wake (redfish fleet)", "%s", why)
		return nil
	}
	if _, err := os.Stat("cmd/redfish-sim"); err != nil {
		e.report.skip("node wake (redfish fleet)", "cmd/redfish-sim not found (%v): run the harness from the repository root", err)
		return nil
	}
	simBin := filepath.Join(e.tmp, "redfish-sim")
	build := exec.CommandContext(ctx, "go", "build", "-o", simBin, "./cmd/redfish-sim")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("go build ./cmd/redfish-sim: %w", err)
	}
	n := e.opts.nodes
	ports, err := freePorts(2*n + 3)
	if err != nil {
		return err
	}
	edge, admin, bmc, nodePorts := ports[0], ports[1], ports[2], ports[3:]
	par := fleetRoute{name: "fleet-parallel", first: 0, ports: nodePorts[:n]}
	ser := fleetRoute{name: "fleet-serial", serial: true, first: n, ports: nodePorts[n:]}
	fleets := []fleetRoute{par, ser}
	pw, ca := filepath.Join(dir, "bmc-password"), filepath.Join(dir, "bmc-ca.pem")
	if err := os.WriteFile(pw, []byte("bench-password\n"), 0o600); err != nil {
		return err
	}
	var systems []string
	for i, p := range nodePorts {
		systems = append(systems, fmt.Sprintf("node-%d=127.0.0.1:%d", i, p))
	}
	sim, err := startProc(procSpec{name: "redfish-sim", argv: []string{simBin, "-addr", fmt.Sprintf("127.0.0.1:%d", bmc),
		"-tls", "-ca-out", ca, "-user", "bench", "-password-file", pw, "-systems", strings.Join(systems, ","), "-delay", fleetDelay.String()}})
	if err != nil {
		return err
	}
	defer sim.Stop(5 * time.Second)
	if err := waitOutput(ctx, sim, "Redfish simulator running", 30*time.Second); err != nil {
		return err
	}

	act, _, err := startActivator(ctx, e, dir, "", renderFleetConfig(edge, admin, bmc, fleets, pw, ca), edge, admin)
	if err != nil {
		return err
	}
	defer act.Stop(30 * time.Second)

	// Warm-up, not counted: sessions, TLS connections to the BMC, the activator's pools.
	for _, f := range fleets {
		if _, _, err := wakeFleet(ctx, act, f); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	row := &FleetRow{Nodes: n, Delay: fleetDelay.String(), Rounds: e.opts.guestRuns, Ideal: 1 / float64(n),
		Note: "cmd/redfish-sim over HTTPS (self-signed CA) with session auth; members poll PowerState every 20 ms; min_ready is all members; sleeps (GracefulShutdown) are not timed"}
	// Per round, in the order of fleets (parallel, serial): first byte and the fleet's wake record.
	fb := [2][]float64{}
	wake := [2][]float64{}
	var phases phaseLog
	firstErr := ""
	for i := 0; i < e.opts.guestRuns; i++ {
		order := []int{1, 0} // serial first in even rounds, as the wakes of separate routes were
		if i%2 == 1 {
			order = []int{0, 1}
		}
		v, w := [2]float64{math.NaN(), math.NaN()}, [2]float64{math.NaN(), math.NaN()}
		err := sleepFleets(ctx, act, fleets)
		for _, j := range order {
			if err != nil {
				break
			}
			if err = alive(ctx, act); err != nil {
				return err
			}
			v[j], w[j], err = fleetSample(ctx, act, fleets[j], &phases)
		}
		if err != nil {
			row.Failed++
			v, w = [2]float64{math.NaN(), math.NaN()}, [2]float64{math.NaN(), math.NaN()}
			if firstErr == "" {
				firstErr = err.Error()
			}
		}
		for j := range fleets {
			fb[j], wake[j] = append(fb[j], v[j]), append(wake[j], w[j])
		}
		e.log.Info("redfish fleet round", "round", i+1, "serial_ms", v[1], "parallel_ms", v[0])
	}
	row.Serial, row.Parallel, row.Ratio = summarize(fb[1]), summarize(fb[0]), ratios(fb[0], fb[1])
	row.SerialWake, row.ParallelWake = summarize(wake[1]), summarize(wake[0])
	var per []float64
	for _, s := range fb[1] {
		per = append(per, s/float64(n))
	}
	row.PerWake = summarize(per)
	row.Phases = phases.String()
	if firstErr != "" {
		row.Note += "; first failure: " + firstErr
	}
	e.report.Fleet = row
	e.report.check(fmt.Sprintf("node wake: fleet of %d, parallel ÷ serial (median of rounds)", n),
		fmt.Sprintf("%s; 1/n = %.3f", fmtStat(row.Ratio, 3), row.Ideal), fmt.Sprintf("≤ %.3f (1.5/n)", 1.5/float64(n)),
		row.Ratio.valid() && row.Ratio.Median <= 1.5/float64(n))
	e.log.Info("redfish fleet", "serial_ms", row.Serial.Median, "parallel_ms", row.Parallel.Median, "ratio", row.Ratio.Median)
	return nil
}

// renderFleetConfig renders one redfish route per fleet, each member one system of the simulator at
// bmc (its upstream: the node's own service port; its redfish block: the system), logging in as
// "bench" with the password file pw and trusting the simulator's certificate ca.
func renderFleetConfig(edge, admin, bmc int, fleets []fleetRoute, pw, ca string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# generated by go run ./bench\nlisten: 127.0.0.1:%d\nadmin: 127.0.0.1:%d\nroutes:\n", edge, admin)
	for _, f := range fleets {
		fmt.Fprintf(&b, `  - name: %s
    hosts: [%s]
    backing: redfish
    idle: 1h
    wake_budget: 1m
    sleep_budget: 1m
    health: {path: /, interval: 10ms, timeout: 1s}
    redfish:
      endpoint: https://127.0.0.1:%d
      username: bench
      password_file: %s
      tls: {ca_file: %s}
      poll_interval: 20ms
      force_off: true
    fleet:
      serial: %t
      members:
`, f.name, f.host(), bmc, strconv.Quote(pw), strconv.Quote(ca), f.serial)
		for i, p := range f.ports {
			fmt.Fprintf(&b, "        - {name: %s, upstream: 127.0.0.1:%d, redfish: {system: %s}}\n", f.node(i), p, f.node(i))
		}
	}
	return b.String()
}

// sleepFleets puts every fleet to sleep, all at once, through the admin API.
func sleepFleets(ctx context.Context, act *activatorProc, fleets []fleetRoute) error {
	errs := make([]error, len(fleets))
	var wg sync.WaitGroup
	for i, f := range fleets {
		wg.Go(func() { errs[i] = act.adminPost(ctx, "/routes/"+f.name+"/sleep") })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// fleetSample wakes the sleeping fleet f with one request and checks its wake record: succeeded, every
// member up. It returns the first byte and the record's duration in milliseconds, and records the
// members' phases.
func fleetSample(ctx context.Context, act *activatorProc, f fleetRoute, phases *phaseLog) (fb, wake float64, err error) {
	fb, w, err := wakeFleet(ctx, act, f)
	if err != nil {
		return math.NaN(), math.NaN(), err
	}
	if w.Outcome != "succeeded" || len(w.Members) != len(f.ports) {
		return math.NaN(), math.NaN(), fmt.Errorf("%s: wake %s with %d of %d members", f.name, w.Outcome, len(w.Members), len(f.ports))
	}
	for _, m := range w.Members {
		if m.Status != "up" {
			return math.NaN(), math.NaN(), fmt.Errorf("%s: member %s %s: %s", f.name, m.Name, m.Status, m.Error)
		}
	}
	for _, m := range w.Members {
		phases.recordPhases(m.Phases)
	}
	return fb, msOf(w.Duration), nil
}

// wakeFleet sends one request to the fleet's route on a fresh connection and returns its first byte in
// milliseconds (min_ready is all members: the request is released when the last is up) and the
// route's last wake record. The answer must come from one of the fleet's nodes.
func wakeFleet(ctx context.Context, act *activatorProc, f fleetRoute) (float64, *wakeRecord, error) {
	r, err := firstByte(ctx, act.edge, "/", f.host(), time.Minute)
	if err != nil {
		return 0, nil, fmt.Errorf("%s: %w", f.name, err)
	}
	var id int
	_, scanErr := fmt.Sscanf(string(r.body), "hello from node-%d", &id)
	if r.code != 200 || scanErr != nil || id < f.first || id >= f.first+len(f.ports) {
		return 0, nil, fmt.Errorf("%s: status %d: %.200s", f.name, r.code, bytes.TrimSpace(r.body))
	}
	var st routeStatus
	if err := getJSON(ctx, act.admin, "/routes/"+f.name, &st); err != nil {
		return 0, nil, err
	}
	if st.LastWake == nil {
		return 0, nil, fmt.Errorf("%s: no wake record", f.name)
	}
	return msOf(r.first.Sub(r.sent)), st.LastWake, nil
}
