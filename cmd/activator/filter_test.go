package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/activator/activator/internal/activator"
)

// Real User-Agent strings: an uptime monitor's and a desktop browser's.
const (
	uptimeRobotUA = "Mozilla/5.0+(compatible; UptimeRobot/2.0; http://www.uptimerobot.com/)"
	chromeUA      = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36"
)

// TestIgnoredMonitorNeitherWakesNorKeepsAwake runs `activator serve` with an exec route that ignores
// the monitors preset: an UptimeRobot request to the sleeping route gets 503 with Retry-After and
// spawns nothing; a browser's request wakes it; and the route goes to sleep after its idle window
// although the monitor keeps asking all the while, each of its requests served while the tenant is
// awake and refused (without a spawn) once it is not.
func TestIgnoredMonitorNeitherWakesNorKeepsAwake(t *testing.T) {
	t.Parallel()
	app := appRoute{Name: "quietly", Idle: "1s"}
	s := startServed(t, configYAML(t, app)+"    ignore: {preset: monitors}\n")
	ctx, cancel := context.WithTimeout(context.Background(), 3*patience)
	defer cancel()

	a := getAs(ctx, s.edge, app.host(), "/", uptimeRobotUA)
	if a.err != nil || a.code != http.StatusServiceUnavailable || a.retryAfter != "60" {
		t.Fatalf("UptimeRobot to a sleeping route: %d (Retry-After %q) %v %q, want 503 with Retry-After 60", a.code, a.retryAfter, a.err, a.body)
	}
	if n := len(s.logs.spawns(app.Name)); n != 0 {
		t.Fatalf("an ignored request spawned %d tenants, want none", n)
	}
	if st := s.status(app.Name); st.State != "asleep" || st.Filtered == nil || st.Filtered.Refused != 1 {
		t.Fatalf("after the monitor: state %s, filtered %+v; want asleep, 1 refused", st.State, st.Filtered)
	}

	if a := getAs(ctx, s.edge, app.host(), "/", chromeUA); a.err != nil || a.code != http.StatusOK {
		t.Fatalf("browser request: %d %v %q, want 200", a.code, a.err, a.body)
	}
	if n := len(s.logs.spawns(app.Name)); n != 1 {
		t.Fatalf("the browser's request spawned %d tenants, want 1", n)
	}

	// The monitor asks without pause until the route has slept. Had its requests restarted the idle
	// clock, the route would never sleep and this loop would end at the deadline.
	slept := func() bool {
		for _, r := range s.logs.matching("slept") {
			if r["route"] == app.Name && r["reason"] == activator.ReasonIdle {
				return true
			}
		}
		return false
	}
	deadline := time.NewTimer(patience)
	defer deadline.Stop()
	served, refused := 0, 0
	for !slept() {
		select {
		case <-deadline.C:
			t.Fatalf("route %s: no idle sleep within %v while a monitor kept asking (%d served, %d refused)", app.Name, patience, served, refused)
		default:
		}
		a := getAs(ctx, s.edge, app.host(), "/", uptimeRobotUA)
		switch {
		case a.err == nil && a.code == http.StatusOK:
			if refused > 0 {
				t.Fatalf("monitor request served after one was refused: the route woke for a monitor")
			}
			served++
		case a.err == nil && a.code == http.StatusServiceUnavailable && a.retryAfter == "60":
			refused++
		default:
			t.Fatalf("monitor request: %d (Retry-After %q) %v %q, want 200 while awake or 503 with Retry-After 60", a.code, a.retryAfter, a.err, a.body)
		}
	}
	t.Logf("while the idle window ran out: %d monitor requests served, %d refused", served, refused)
	if served == 0 {
		t.Errorf("no monitor request was served while the tenant was awake")
	}
	s.waitStatus(app.Name, "asleep", func(st activator.Status) bool { return st.State == "asleep" })
	if a := getAs(ctx, s.edge, app.host(), "/", uptimeRobotUA); a.err != nil || a.code != http.StatusServiceUnavailable {
		t.Errorf("UptimeRobot after the sleep: %d %v, want 503", a.code, a.err)
	}
	if n := len(s.logs.spawns(app.Name)); n != 1 {
		t.Errorf("%d spawns, want 1 (the browser's): a monitor woke the route", n)
	}
	st := s.status(app.Name)
	if st.Filtered == nil || st.Filtered.Served != uint64(served) || st.Filtered.Refused != uint64(refused)+2 {
		t.Errorf("status filtered %+v, want %d served, %d refused", st.Filtered, served, refused+2)
	}
	// explain counts them too.
	code, out := runMain(t, "explain", app.Name, "--admin", s.admin)
	want := fmt.Sprintf("%d refused (tenant asleep, not woken), %d served", refused+2, served)
	if code != 0 || !strings.Contains(out, want) {
		t.Errorf("explain: exit %d, output lacks %q:\n%s", code, want, out)
	}
}
