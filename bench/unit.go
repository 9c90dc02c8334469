package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// unitDelays are the app start delays (DEMOAPP_START_DELAY) of the unit experiment.
var unitDelays = []time.Duration{0, 50 * time.Millisecond, 200 * time.Millisecond}

// runUnit compares, on a private systemd user manager, the first request to a stopped service through
// (a) systemd socket activation of the app itself, (b) a .socket + systemd-socket-proxyd pair in front
// of a plain service, and (c) the activator's unit backing, at several app start delays; and counts the
// first requests each loses.
func runUnit(ctx context.Context, e *env) error {
	dir := filepath.Join(e.tmp, "unit")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	unitWired, why := backingWired(ctx, e, dir, "unit", "    unit: {name: x.service}\n")
	if !unitWired {
		e.report.skip("unit wake", "%s; measuring the socket-activation baselines only", why)
	}
	if _, err := exec.LookPath("systemctl"); err != nil {
		e.report.skip("unit wake vs socket activation", "systemctl not found (Debian package systemd)")
		return nil
	}
	proxyd := ""
	for _, p := range []string{"/usr/lib/systemd/systemd-socket-proxyd", "/lib/systemd/systemd-socket-proxyd"} {
		if _, err := os.Stat(p); err == nil {
			proxyd = p
		}
	}
	m, err := startUserManager(ctx, dir)
	if err != nil {
		e.report.skip("unit wake vs socket activation", "no private systemd user manager here: %v", err)
		return nil
	}
	defer m.Stop()

	app, err := harnessApp(ctx, e)
	if err != nil {
		return err
	}
	ports, err := freePorts(8)
	if err != nil {
		return err
	}
	saPort, pxApp, pxPort, unitApp := ports[0], ports[1], ports[2], ports[3]
	// The sleep-mode routes: the same app as a unit that sleeps by SIGSTOP, and one frozen by the
	// cgroup freezer. Their wake is a SIGCONT or a thaw of a process that is already listening.
	parked := []unitRoute{
		{name: "unit-sigstop", unit: "ss-app.service", sleep: "sigstop", port: ports[6]},
		{name: "unit-freeze", unit: "fz-app.service", sleep: "freeze", port: ports[7]},
	}
	var act *activatorProc
	for _, d := range unitDelays {
		delay := fmt.Sprintf("DEMOAPP_START_DELAY=%dms", d.Milliseconds())
		svc := func(extra string) string {
			return "[Unit]\nStartLimitIntervalSec=0\n[Service]\nType=exec\nExecStart=" + app + "\nEnvironment=" + delay + "\n" + extra
		}
		units := map[string]string{
			"sa-app.socket":  fmt.Sprintf("[Socket]\nListenStream=127.0.0.1:%d\nAccept=no\nTriggerLimitIntervalSec=0\n", saPort),
			"sa-app.service": svc(""),
			"ua-app.service": svc(fmt.Sprintf("Environment=PORT=%d\n", unitApp)),
		}
		for _, r := range parked {
			units[r.unit] = svc(fmt.Sprintf("Environment=PORT=%d\n", r.port))
		}
		if proxyd != "" {
			units["px-app.service"] = svc(fmt.Sprintf("Environment=PORT=%d\n", pxApp))
			units["px-proxy.service"] = fmt.Sprintf("[Unit]\nRequires=px-app.service\nAfter=px-app.service\nStartLimitIntervalSec=0\n[Service]\nExecStart=%s 127.0.0.1:%d\n", proxyd, pxApp)
			units["px-proxy.socket"] = fmt.Sprintf("[Socket]\nListenStream=127.0.0.1:%d\nAccept=no\nTriggerLimitIntervalSec=0\n", pxPort)
		}
		if err := m.writeUnits(ctx, units); err != nil {
			return err
		}
		if err := m.systemctl(ctx, "start", "sa-app.socket"); err != nil {
			return err
		}
		if proxyd != "" {
			if err := m.systemctl(ctx, "start", "px-proxy.socket"); err != nil {
				return err
			}
		}
		if unitWired && act == nil {
			routes := append([]unitRoute{{name: "unit", unit: "ua-app.service", sleep: "stop", port: unitApp}}, parked...)
			cfg := renderUnitConfig(ports[4], ports[5], m.address, routes)
			if act, _, err = startActivator(ctx, e, dir, "", cfg, ports[4], ports[5]); err != nil {
				e.report.Failures = append(e.report.Failures, fmt.Sprintf("unit: activator with a unit route: %v", err))
				unitWired = false
			} else {
				defer act.Stop(10 * time.Second)
			}
		}
		row := UnitRow{StartDelay: d.String()}
		var phases phaseLog
		// One entry per round in each, NaN for a lost request, so the ratios pair the same round.
		var sa, px, un, saPost, pxPost, unPost []float64
		var saSpawn, unParts []coldSample
		for i := 0; i < e.opts.coldSamples; i++ {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// Socket activation of the app itself.
			if err := m.systemctl(ctx, "stop", "sa-app.service"); err != nil {
				return err
			}
			ss, _, _, err := timeSample(ctx, fmt.Sprintf("127.0.0.1:%d", saPort), "127.0.0.1")
			if err != nil {
				row.SocketLost++
			}
			sa, saPost, saSpawn = append(sa, ss.firstByte), append(saPost, ss.gateProxy), append(saSpawn, ss)
			if proxyd != "" {
				if err := m.systemctl(ctx, "stop", "px-proxy.service", "px-app.service"); err != nil {
					return err
				}
				fb, post, err := timeFirst(ctx, fmt.Sprintf("127.0.0.1:%d", pxPort), "127.0.0.1")
				if err != nil {
					row.ProxydLost++
				}
				px, pxPost = append(px, fb), append(pxPost, post)
			}
			if unitWired {
				if err := act.adminPost(ctx, "/routes/unit/sleep"); err != nil {
					return err
				}
				us, r, b, err := timeSample(ctx, act.edge, "unit.localhost")
				if err != nil {
					row.UnitLost++
				} else {
					us.parts = readParts(ctx, act, "unit", "start", r, b)
				}
				un, unPost, unParts = append(un, us.firstByte), append(unPost, us.gateProxy), append(unParts, us)
				phases.add(ctx, act, "unit")
			}
		}
		row.Socket, row.Proxyd, row.Unit = summarize(sa), summarize(px), summarize(un)
		row.SocketPost, row.ProxydPost, row.UnitPost = summarize(saPost), summarize(pxPost), summarize(unPost)
		row.Phases = phases.String()
		row.Parts = unitParts(saSpawn, unParts)
		if unitWired {
			row.Ratio, row.RatioProxyd = ratios(un, sa), ratios(un, px)
			// The comparison is with the .socket + proxyd pair; where the pair lost most of its
			// first requests it has no first byte to compare with, and the app's own socket activation
			// is the yardstick. The latter, stricter ratio is reported at every delay.
			if proxyd != "" && row.ProxydLost*2 < e.opts.coldSamples {
				e.report.check("unit wake ÷ socket + proxyd pair, first byte, start delay "+d.String(), fmtStat(row.RatioProxyd, 2)+fmt.Sprintf(", %d lost (the pair lost %d)", row.UnitLost, row.ProxydLost), "≤ 1.1, 0 lost", row.RatioProxyd.valid() && row.RatioProxyd.Median <= 1.1 && row.UnitLost == 0)
			}
			// Issue 17 asks ≤ 1.0 at start delay 0, where the activator's own cost weighs most.
			limit := 1.1
			if d == 0 {
				limit = 1.0
			}
			e.report.check("unit wake ÷ the app's own socket activation (stricter), first byte, start delay "+d.String(), fmtStat(row.Ratio, 2)+fmt.Sprintf(", %d lost", row.UnitLost), fmt.Sprintf("≤ %.1f, 0 lost", limit), row.Ratio.valid() && row.Ratio.Median <= limit && row.UnitLost == 0)
		}
		e.report.Unit = append(e.report.Unit, row)
		e.log.Info("unit", "delay", d, "socket_ms", row.Socket.Median, "proxyd_ms", row.Proxyd.Median, "proxyd_lost", row.ProxydLost, "unit_ms", row.Unit.Median)
	}
	if proxyd == "" {
		e.report.skip("socket + proxyd baseline", "systemd-socket-proxyd not found (Debian package systemd)")
	}
	if unitWired {
		for _, r := range parked {
			if err := unitSleepMode(ctx, e, act, r); err != nil {
				return err
			}
		}
	}
	// The exec wake against the socket-activation figure of the same run.
	if len(e.report.Unit) > 0 && e.report.Unit[0].Socket.valid() {
		for _, c := range e.report.Cold {
			if strings.HasPrefix(c.Mode, "exec") && !strings.HasSuffix(c.Mode, "cgroup_root: off") && c.OverheadExec.valid() {
				r := c.OverheadExec.Median / e.report.Unit[0].Socket.Median
				e.report.check("cold exec overhead (vs the app alone) ÷ socket activation first byte ("+c.Mode+")", fmt.Sprintf("%.2f (%.2f ms ÷ %.2f ms)", r, c.OverheadExec.Median, e.report.Unit[0].Socket.Median), "≤ 0.3", r <= 0.3)
			}
		}
	}
	return nil
}

// unitParts splits the first bytes of the app's own socket activation (sa) and of the unit route (un),
// round by round: request → the app's main() for both, and the unit wake's stretches from its record.
func unitParts(sa, un []coldSample) []ColdPart {
	stat := func(ss []coldSample, f func(coldSample) float64) Stat {
		var v []float64
		for _, s := range ss {
			v = append(v, f(s))
		}
		return summarize(v)
	}
	parts := []ColdPart{
		{"socket activation: request → main()", stat(sa, func(s coldSample) float64 { return s.spawn })},
		{"socket activation: listening → first byte", stat(sa, func(s coldSample) float64 { return s.gateProxy })},
	}
	if len(un) == 0 {
		return parts
	}
	return append(parts,
		ColdPart{"unit: request → main()", stat(un, func(s coldSample) float64 { return s.spawn })},
		ColdPart{"unit: request → wake began", stat(un, func(s coldSample) float64 { return s.parts.edge })},
		ColdPart{"unit: start phase (StartUnit)", stat(un, func(s coldSample) float64 { return s.parts.first })},
		ColdPart{"unit: listening → gate passed", stat(un, func(s coldSample) float64 { return s.parts.notice })},
		ColdPart{"unit: gate passed → first byte", stat(un, func(s coldSample) float64 { return s.parts.proxy })},
	)
}

// unitRoute is one unit route of the unit experiment's activator.
type unitRoute struct {
	name, unit, sleep string // sleep: the unit backing's sleep mode (stop, sigstop, freeze)
	port              int    // the app's own port, the route's upstream
}

// renderUnitConfig is the unit experiment's activator config: one unit route per entry, on the private
// user manager at bus.
func renderUnitConfig(listen, admin int, bus string, routes []unitRoute) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# generated by go run ./bench\nlisten: 127.0.0.1:%d\nadmin: 127.0.0.1:%d\nroutes:\n", listen, admin)
	for _, r := range routes {
		fmt.Fprintf(&b, "  - name: %s\n    hosts: [%s.localhost]\n    backing: unit\n    upstream: 127.0.0.1:%d\n    idle: 1h\n    health: {path: /healthz}\n    unit: {name: %s, bus: %q, sleep: %s}\n",
			r.name, r.name, r.port, r.unit, bus, r.sleep)
	}
	return b.String()
}

// unitSleepMode times the wake of a unit route whose sleep keeps the app's process (sigstop, freeze):
// one untimed wake starts the app, then each round puts the route to sleep through the admin API and
// times one request. A mode the host cannot do (freeze without the cgroup v2 freezer) is reported as
// skipped with the activator's reason.
func unitSleepMode(ctx context.Context, e *env, act *activatorProc, r unitRoute) error {
	host := r.name + ".localhost"
	row := UnitSleepRow{Mode: r.sleep}
	if _, _, err := timeFirst(ctx, act.edge, host); err != nil {
		e.report.skip("unit wake, sleep: "+r.sleep, "the first (starting) wake failed: %v", err)
		return nil
	}
	var fbs []float64
	var phases phaseLog
	for i := 0; i < e.opts.coldSamples; i++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := act.adminPost(ctx, "/routes/"+r.name+"/sleep"); err != nil {
			e.report.skip("unit wake, sleep: "+r.sleep, "%v", err)
			return nil
		}
		fb, _, err := timeFirst(ctx, act.edge, host)
		if err != nil {
			row.Lost++
		}
		fbs = append(fbs, fb)
		phases.add(ctx, act, r.name)
	}
	row.FirstByte, row.Phases = summarize(fbs), phases.String()
	e.report.UnitSleep = append(e.report.UnitSleep, row)
	e.log.Info("unit sleep mode", "mode", r.sleep, "first_byte_ms", row.FirstByte.Median, "lost", row.Lost)
	return nil
}

// timeFirst sends one GET /bound on a fresh connection and returns the time to its first byte and
// the part of it after the app was listening (the demo app's bound_ns), in milliseconds; a failed or
// non-200 answer is an error (a lost first request), with NaN for both.
func timeFirst(ctx context.Context, addr, host string) (firstByteMs, postMs float64, err error) {
	s, _, _, err := timeSample(ctx, addr, host)
	return s.firstByte, s.gateProxy, err
}

// timeSample is timeFirst, returning the whole sample with the request's timing and the app's answer
// (for the wake record's breakdown); NaN figures with an error for a lost first request.
func timeSample(ctx context.Context, addr, host string) (coldSample, fbResult, boundInfo, error) {
	nan := math.NaN()
	lost := coldSample{firstByte: nan, appStart: nan, overhead: nan, spawn: nan, gateProxy: nan, parts: noParts()}
	r, err := firstByte(ctx, addr, "/bound", host, 30*time.Second)
	if err != nil {
		return lost, r, boundInfo{}, err
	}
	if r.code != 200 {
		return lost, r, boundInfo{}, fmt.Errorf("status %d", r.code)
	}
	var b boundInfo
	if err := json.Unmarshal(r.body, &b); err != nil {
		return lost, r, b, fmt.Errorf("GET /bound: %w (%q)", err, r.body)
	}
	return b.sample(r), r, b, nil
}

// backingWired asks the built activator whether it has a backing, by checking a one-route config
// (block is the route's settings block). It returns false and the reason when it does not.
func backingWired(ctx context.Context, e *env, dir, backing, block string) (bool, string) {
	cfg := fmt.Sprintf("routes:\n  - name: probe\n    hosts: [probe.localhost]\n    backing: %s\n    upstream: 127.0.0.1:1\n%s", backing, block)
	path := filepath.Join(dir, "probe-"+backing+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return false, err.Error()
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, e.actBin, "check", "--config", path).CombinedOutput()
	if strings.Contains(string(out), "not available in this build") {
		return false, fmt.Sprintf("the %s backing is not wired into cmd/activator yet (activator check: %q)", backing, firstLine(string(out), "not available"))
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return false, err.Error()
	}
	return true, ""
}

func firstLine(s, containing string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, containing) {
			return strings.TrimSpace(l)
		}
	}
	return strings.TrimSpace(s)
}
