package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Report is everything one run measured. It is written as JSON and rendered as Markdown.
type Report struct {
	Command  string    `json:"command"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Runs     int       `json:"runs"`
	Duration string    `json:"wrk_duration"`
	Machine  Machine   `json:"machine"`

	Targets    []Check        `json:"targets"`
	Warm       []WarmRow      `json:"warm,omitempty"`
	WarmRatios []RatioRow     `json:"warm_ratios,omitempty"`
	WarmH2     []WarmRow      `json:"warm_h2,omitempty"` // h2load over h2c; no latency percentiles
	Slow       []SlowRow      `json:"slow_clients,omitempty"`
	Cold       []ColdRow      `json:"cold,omitempty"`
	ColdExtra  []RatioRow     `json:"cold_vs_floor,omitempty"`
	Unit       []UnitRow      `json:"unit,omitempty"`
	UnitSleep  []UnitSleepRow `json:"unit_sleep_modes,omitempty"`
	Herd       []HerdRow      `json:"herd,omitempty"`
	HeldMem    []HeldMemRow   `json:"held_memory,omitempty"`
	Scale      *ScaleRow      `json:"scale,omitempty"`
	Guest      *GuestResult   `json:"guest,omitempty"`
	Fleet      *FleetRow      `json:"redfish_fleet,omitempty"`
	Chain      *ChainRow      `json:"chain,omitempty"`
	HTTPS      *HTTPSResult   `json:"https,omitempty"`
	Skipped    []Skip         `json:"skipped,omitempty"`
	Failures   []string       `json:"failures,omitempty"`
	Notes      []string       `json:"notes,omitempty"`
}

// Machine describes where the numbers come from.
type Machine struct {
	CPU       string            `json:"cpu"`
	CPUs      int               `json:"cpus"`
	Kernel    string            `json:"kernel"`
	Go        string            `json:"go"`
	Tools     map[string]string `json:"tools"`
	NofileMax uint64            `json:"nofile_limit"`
}

// Check is one target from the issue and whether this run met it.
type Check struct {
	Name   string `json:"name"`
	Value  string `json:"value"`
	Target string `json:"target"`
	Met    bool   `json:"met"`
}

// WarmRow is one target's warm-path result at one connection count.
type WarmRow struct {
	Mode   string `json:"mode"`
	Conns  int    `json:"conns"`
	Target string `json:"target"`
	RPS    Stat   `json:"rps"`
	P50us  Stat   `json:"p50_us"`
	P99us  Stat   `json:"p99_us"`
	Errors int64  `json:"errors"`
}

// RatioRow is a per-run ratio between two warm-path targets.
type RatioRow struct {
	Mode  string `json:"mode"`
	Conns int    `json:"conns"`
	Name  string `json:"name"`
	Value Stat   `json:"value"`
}

// SlowRow is one target of the slow-client experiment: wrk GETs on a route without and with slow
// clients trickling request bodies to the same route. Latency in µs; ratios run by run.
type SlowRow struct {
	Mode       string `json:"mode"`
	Target     string `json:"target"`
	Config     string `json:"config"` // what the target was told about request bodies
	Clients    int    `json:"slow_clients"`
	RPS        Stat   `json:"rps_without"`
	RPSSlow    Stat   `json:"rps_with"`
	P50us      Stat   `json:"p50_us_without"`
	P50usSlow  Stat   `json:"p50_us_with"`
	P99us      Stat   `json:"p99_us_without"`
	P99usSlow  Stat   `json:"p99_us_with"`
	Ratio      Stat   `json:"p99_with_over_without"`
	RPSRatio   Stat   `json:"rps_with_over_without"`
	Errors     int64  `json:"errors_without"`
	ErrorsSlow int64  `json:"errors_with"`
	// Runs whose p99 is only a lower bound (wrk timeouts, or no answer in the run), with and without.
	Bounded     int `json:"p99_lower_bound_runs_with"`
	BoundedBase int `json:"p99_lower_bound_runs_without"`
	// What became of the slow clients (the worst run): connected, still trickling when wrk ended,
	// answered by the server, closed by it without an answer.
	Connected   int    `json:"slow_connected"`
	Open        int    `json:"slow_open_at_end"`
	Answered    int    `json:"slow_answered"`
	Dropped     int    `json:"slow_dropped"`
	FirstAnswer string `json:"slow_first_answer,omitempty"`
	DialError   string `json:"slow_dial_error,omitempty"`
	Nofile      string `json:"nofile"` // the target's soft RLIMIT_NOFILE
}

// HeldMemRow is the activator's memory per held request for one herd size and kind of request.
type HeldMemRow struct {
	N            int    `json:"n"`
	Kind         string `json:"kind"`          // small, header limit
	RequestBytes int    `json:"request_bytes"` // one request (all header)
	Runs         int    `json:"runs"`
	Held         int    `json:"held"`        // worst run
	Refused      int    `json:"refused_503"` // worst run: refused by a hold cap
	Failed       int    `json:"failed"`      // worst run, refusals included
	RSSIdleKiB   int64  `json:"rss_idle_kib"`
	RSSHeldKiB   int64  `json:"rss_held_kib"`
	PerHeldKiB   Stat   `json:"kib_per_held"`            // (all held − asleep) ÷ held
	OverSmall    Stat   `json:"over_small"`              // PerHeldKiB ÷ the small requests', round by round
	FirstFailure string `json:"first_failure,omitempty"` // refusals included
}

// ColdRow is one cold-wake mode: first-byte times and their breakdown, in milliseconds.
type ColdRow struct {
	Mode      string `json:"mode"`
	Samples   int    `json:"samples"`
	Failed    int    `json:"failed"`
	FirstByte Stat   `json:"first_byte_ms"`
	AppStart  Stat   `json:"app_start_ms"` // bound_ns - main_ns: the app's own main()→listening
	Overhead  Stat   `json:"overhead_ms"`  // first byte - app start
	// The definition: first byte minus the app's own time from exec to listening, taken from
	// the app exec'd alone by the harness in the same round (exec modes only).
	AppAlone     Stat   `json:"app_alone_exec_to_listening_ms"`
	OverheadExec Stat   `json:"overhead_vs_app_alone_ms"`
	Spawn        Stat   `json:"spawn_ms"` // request sent → app main()
	GateProxy    Stat   `json:"gate_proxy_ms"`
	Note         string `json:"note,omitempty"`

	// Parts splits the first byte at the activator's wake record and the app's timestamps (exec modes).
	Parts []ColdPart `json:"parts,omitempty"`
}

// ColdPart is one stretch of a cold first byte, in milliseconds.
type ColdPart struct {
	Name string `json:"name"`
	Ms   Stat   `json:"ms"`
}

// UnitRow is one start delay of the unit-vs-socket-activation comparison.
type UnitRow struct {
	StartDelay string `json:"start_delay"`
	Socket     Stat   `json:"socket_activation_ms"`
	SocketLost int    `json:"socket_activation_lost"`
	Proxyd     Stat   `json:"proxyd_ms"`
	ProxydLost int    `json:"proxyd_lost"`
	Unit       Stat   `json:"unit_ms"`
	UnitLost   int    `json:"unit_lost"`
	Ratio      Stat   `json:"unit_over_socket"`
	// RatioProxyd is unit ÷ the .socket + proxyd pair, over the rounds the pair answered.
	RatioProxyd Stat `json:"unit_over_proxyd"`
	// The part of each first byte after the app was listening (the app's bound_ns → first byte).
	SocketPost Stat   `json:"socket_activation_listening_to_first_byte_ms"`
	ProxydPost Stat   `json:"proxyd_listening_to_first_byte_ms"`
	UnitPost   Stat   `json:"unit_listening_to_first_byte_ms"`
	Phases     string `json:"unit_wake_phases,omitempty"` // medians from the activator's wake records

	// Parts splits the first bytes: request → the app's main() for both, the unit wake's record.
	Parts []ColdPart `json:"parts,omitempty"`
}

// UnitSleepRow is the wake of a unit route from a sleep that keeps the process (sigstop, freeze).
type UnitSleepRow struct {
	Mode      string `json:"mode"`
	FirstByte Stat   `json:"first_byte_ms"`
	Lost      int    `json:"lost"`
	Phases    string `json:"wake_phases,omitempty"` // medians from the activator's wake records
}

// HerdRow is one herd size.
type HerdRow struct {
	N            int     `json:"n"`
	HeldMax      int     `json:"held_max"`
	Answered     int     `json:"answered"`
	Failed       int     `json:"failed"`
	Refused      int     `json:"refused_503"` // of Failed, answered 503 (a hold cap) before the release
	Spawns       int     `json:"spawns"`
	WakeMs       float64 `json:"wake_ms"`
	Runs         int     `json:"runs"`                // herds of this size; the numbers are medians over them
	Release      string  `json:"release_ms_spread"`   // "median (min–max)" of ReleaseMs
	PerHeld      string  `json:"kib_per_held_spread"` // "median (min–max)" of PerHeldKiB
	Released     int     `json:"released"`            // held requests the wake record says it let go (worst run)
	ReleaseMs    float64 `json:"release_spread_ms"`   // gate passed → the last held request left the hold
	SpreadMs     float64 `json:"response_spread_ms"`  // first → last response byte
	GateLastMs   float64 `json:"gate_to_last_ms"`     // gate passed → last response byte
	P50Ms        float64 `json:"gate_to_p50_ms"`      // gate passed → median response byte
	RSSIdleKiB   int64   `json:"rss_idle_kib"`        // activator, route asleep
	RSSHeldKiB   int64   `json:"rss_held_kib"`        // activator, all held
	PerHeldKiB   float64 `json:"kib_per_held"`        // (held - idle) / n
	Nofile       string  `json:"activator_nofile"`    // the activator's soft RLIMIT_NOFILE
	FirstFailure string  `json:"first_failure,omitempty"`

	Proto string `json:"proto"` // HTTP/1.1 (a connection a request) or h2c (streams sharing connections)
	Conns int    `json:"conns"` // client connections the herd dialed
	// The Go runtime's share of PerHeldKiB, from the activator's /metrics: heap in use and goroutine
	// stacks, all held − asleep, per held request.
	HeapPerHeldKiB  float64 `json:"heap_kib_per_held"`
	StackPerHeldKiB float64 `json:"stack_kib_per_held"`
}

// ScaleRow is the route-scale result.
type ScaleRow struct {
	Routes       int     `json:"routes"`
	RSSKiB       int64   `json:"rss_kib"`
	RSSSmallKiB  int64   `json:"rss_10_routes_kib"`
	HeapKiB      int64   `json:"heap_inuse_kib"`
	HeapSmallKiB int64   `json:"heap_inuse_10_routes_kib"`
	LoadMs       float64 `json:"load_ms"`
	LoadSmallMs  float64 `json:"load_10_routes_ms"`
	ReloadMs     Stat    `json:"reload_ms"`
	RPS          Stat    `json:"rps"`
	RPSSmall     Stat    `json:"rps_10_routes"`
	P50us        Stat    `json:"p50_us"`
	P50usSmall   Stat    `json:"p50_us_10_routes"`
	Ratio        Stat    `json:"rps_ratio"`

	Host         string  `json:"host"`                  // the route the warm requests go to (the middle one)
	RSSReloadKiB []int64 `json:"rss_after_reloads_kib"` // after each of the three reloads
	RSSWarmKiB   int64   `json:"rss_warm_kib"`          // after the warm requests
	ReloadCPUMs  Stat    `json:"reload_cpu_ms"`         // the activator's CPU time over each reload
	// ReloadDecoded is how many of the three reloads (each after an edit of one route) logged that they
	// decoded one entry, the others kept as they were.
	ReloadDecoded int `json:"reloads_decoding_one"`
	// ReloadAll* are the one reload after an edit of every route, which decodes every route again.
	ReloadAllMs    float64 `json:"reload_all_ms"`
	ReloadAllCPUMs float64 `json:"reload_all_cpu_ms"`
	// Settled: once the activator has gone quiet after the start-up or the reload (its host checks).
	RSSSettledKiB       int64   `json:"rss_settled_kib"`
	RSSReloadSettledKiB []int64 `json:"rss_after_reloads_settled_kib"`
	// Three /metrics scrapes after the load, as Prometheus makes them: each one's time, the size of
	// the (gzipped) answer, and the RSS once settled after them.
	ScrapeMs      []float64 `json:"scrape_ms"`
	ScrapeKiB     float64   `json:"scrape_gzip_kib"`
	RSSScrapedKiB int64     `json:"rss_after_scrapes_settled_kib"`
}

// GuestResult is the kvm experiment: one QEMU guest woken from each sleep mode, side by side.
type GuestResult struct {
	Setup  string     `json:"setup"` // QEMU version, accelerator, machine, memory, guest
	Rows   []GuestRow `json:"rows"`
	Ratios []RatioRow `json:"ratios"` // per round, then median (min–max)
	// Figures are other per-round quantities (sizes, memory), each named with its unit.
	Figures []RatioRow `json:"figures,omitempty"`
}

// GuestRow is one way of waking the guest: first-byte times through the activator, in milliseconds.
type GuestRow struct {
	Mode      string `json:"mode"`
	Samples   int    `json:"samples"`
	Failed    int    `json:"failed"`
	FirstByte Stat   `json:"first_byte_ms"` // request written → first response byte, through the edge
	Wake      Stat   `json:"wake_ms"`       // the activator's wake record: backend phases + health gate
	Sleep     Stat   `json:"sleep_ms"`      // the admin sleep before the sample (POST …/sleep until asleep)
	Phases    string `json:"wake_phases,omitempty"`
	Note      string `json:"note,omitempty"`
}

// FleetRow is the Redfish fleet experiment: two fleet routes of n nodes each, one waking its members
// one after another (serial: true) and one all at once, each woken by one request.
type FleetRow struct {
	Nodes        int     `json:"nodes"`          // members per fleet
	Delay        string  `json:"power_on_delay"` // the simulator's PoweringOn time per node
	Rounds       int     `json:"rounds"`
	Failed       int     `json:"failed_rounds"`
	Serial       Stat    `json:"serial_ms"`   // the serial fleet: request written → first byte (all members up)
	Parallel     Stat    `json:"parallel_ms"` // the same, the parallel fleet
	SerialWake   Stat    `json:"serial_wake_ms"`
	ParallelWake Stat    `json:"parallel_wake_ms"` // the fleets' own wake records
	PerWake      Stat    `json:"serial_per_node_ms"`
	Ratio        Stat    `json:"parallel_over_serial"`  // first byte, round by round
	Ideal        float64 `json:"ideal"`                 // 1/n
	Phases       string  `json:"wake_phases,omitempty"` // of one member, median over both fleets
	Note         string  `json:"note,omitempty"`
}

// ChainRow is the chain experiment: exec tenants a ← b ← route c, woken cold by one request to c.
// Milliseconds, median (min–max) over the rounds.
type ChainRow struct {
	Rounds    int    `json:"rounds"`
	Failed    int    `json:"failed_rounds"`
	FirstByte Stat   `json:"first_byte_ms"` // request written → first response byte, through the edge
	Wake      Stat   `json:"wake_ms"`       // route c's wake record, which spans its requirements' wakes
	Own       Stat   `json:"own_phases_ms"` // Σ over c's, b's and a's records of their phases but requires
	Overhead  Stat   `json:"overhead_ms"`   // Wake − Own, round by round
	Phases    string `json:"wake_phases,omitempty"`
	Note      string `json:"note,omitempty"`
}

// Skip is something this run could not measure, and why.
type Skip struct {
	What string `json:"what"`
	Why  string `json:"why"`
}

func newReport(o options) *Report {
	return &Report{
		Command:  "go run ./bench " + strings.Join(os.Args[1:], " "),
		Started:  time.Now().UTC(),
		Runs:     o.runs,
		Duration: o.dur.String(),
	}
}

func (r *Report) skip(what, why string, args ...any) {
	r.Skipped = append(r.Skipped, Skip{What: what, Why: fmt.Sprintf(why, args...)})
}

func (r *Report) check(name, value, target string, met bool) {
	r.Targets = append(r.Targets, Check{Name: name, Value: value, Target: target, Met: met})
}

func (r *Report) write(mdPath, jsonPath string) error {
	if mdPath != "" {
		if err := os.MkdirAll(filepath.Dir(mdPath), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(mdPath, []byte(r.markdown()), 0o644); err != nil {
			return err
		}
	}
	if jsonPath != "" {
		if err := os.MkdirAll(filepath.Dir(jsonPath), 0o755); err != nil {
			return err
		}
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(jsonPath, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// MarshalJSON writes NaN (nothing measured) as null.
func (s Stat) MarshalJSON() ([]byte, error) {
	type out struct {
		Median *float64 `json:"median"`
		Min    *float64 `json:"min"`
		Max    *float64 `json:"max"`
		N      int      `json:"n"`
	}
	f := func(v float64) *float64 {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil
		}
		v = math.Round(v*1000) / 1000
		return &v
	}
	return json.Marshal(out{f(s.Median), f(s.Min), f(s.Max), s.N})
}

// fmtStat renders "median (min–max)" with the given precision, or "–" when nothing was measured.
func fmtStat(s Stat, prec int) string {
	if !s.valid() {
		return "–"
	}
	if s.N == 1 || s.Min == s.Max {
		return fmt.Sprintf("%.*f", prec, s.Median)
	}
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, s.Median, prec, s.Min, prec, s.Max)
}

func fmtK(s Stat) string {
	if !s.valid() {
		return "–"
	}
	k := func(v float64) string { return fmt.Sprintf("%.1fk", v/1000) }
	if s.N == 1 {
		return k(s.Median)
	}
	return fmt.Sprintf("%s (%s–%s)", k(s.Median), k(s.Min), k(s.Max))
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "**no**"
}

// markdown renders the report.
func (r *Report) markdown() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("Command: `%s` — %s, %d run(s) of %s per warm-path cell, alternating targets.\n\n", strings.TrimSpace(r.Command), r.Started.Format("2006-01-02 15:04 UTC"), r.Runs, r.Duration)
	m := r.Machine
	p("Machine: %s, %d CPUs, Linux %s, %s; open-file limit %d.", m.CPU, m.CPUs, m.Kernel, m.Go, m.NofileMax)
	if len(m.Tools) > 0 {
		var ts []string
		for _, k := range []string{"wrk", "nginx", "caddy", "haproxy", "systemd"} {
			if v, ok := m.Tools[k]; ok {
				ts = append(ts, k+" "+v)
			}
		}
		p(" Tools: %s.", strings.Join(ts, ", "))
	}
	p("\n\n")

	if len(r.Targets) > 0 {
		p("#### Targets\n\n| target | measured | goal | met |\n|---|---|---|---|\n")
		for _, c := range r.Targets {
			p("| %s | %s | %s | %s |\n", c.Name, c.Value, c.Target, yes(c.Met))
		}
		p("\n")
	}

	if len(r.Warm) > 0 {
		p("#### Warm path (wrk, keep-alive, GET / of the same tiny app)\n\n")
		p("Median (min–max) over the runs. Latency in µs. *pinned*: wrk on CPU 0, proxy and app on CPU 1; *unpinned*: the scheduler decides.\n\n")
		p("| mode | conns | target | req/s | p50 µs | p99 µs | errors |\n|---|---|---|---|---|---|---|\n")
		for _, w := range r.Warm {
			p("| %s | %d | %s | %s | %s | %s | %d |\n", w.Mode, w.Conns, w.Target, fmtK(w.RPS), fmtStat(w.P50us, 0), fmtStat(w.P99us, 0), w.Errors)
		}
		p("\n")
	}
	if len(r.WarmH2) > 0 {
		p("HTTP/2 without TLS (h2c, prior knowledge): h2load, `-m %d` streams in flight per connection, `GET /` of the same app through the activator's plain listener and through nginx (`listen … http2`), both proxying over HTTP/1.1 keep-alive; placed as the rows above. h2load gives no percentiles. Median (min–max) over the runs:\n\n", h2Streams)
		p("| mode | conns | target | req/s | errors |\n|---|---|---|---|---|\n")
		for _, w := range r.WarmH2 {
			p("| %s | %d | %s | %s | %d |\n", w.Mode, w.Conns, w.Target, fmtK(w.RPS), w.Errors)
		}
		p("\n")
	}
	if len(r.WarmRatios) > 0 {
		p("Ratios, computed run by run (each run measures every target back to back), then median (min–max):\n\n")
		p("| mode | conns | ratio | value |\n|---|---|---|---|\n")
		for _, x := range r.WarmRatios {
			p("| %s | %d | %s | %s |\n", x.Mode, x.Conns, x.Name, fmtStat(x.Value, 2))
		}
		p("\n")
	}

	if len(r.Slow) > 0 {
		s0 := r.Slow[0]
		p("#### Slow clients: GETs on a route while %d clients trickle request bodies at 1 byte/s\n\n", s0.Clients)
		p("Each slow client sends `POST /echo` with `Content-Length: %d`, then one body byte a second, from %s before wrk starts until it ends; then all are closed. wrk c16 measures `GET /` on the same route (%s, as in the warm path); *without* is the same run with no slow client. Runs alternate; ratios are taken run by run, then median (min–max). Latency in µs. A p99 marked ≥ is a lower bound: wrk leaves requests unanswered within its %s timeout out of its percentiles.\n\n",
			slowBodyBytes, slowSettle, s0.Mode, wrkTimeout)
		p("| target | config | req/s without | req/s with | p50 without | p50 with | p99 without | p99 with | **p99 with ÷ without** | req/s with ÷ without | errors without / with |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, s := range r.Slow {
			ge := func(n int) string {
				if n > 0 {
					return "≥ "
				}
				return ""
			}
			p("| %s | %s | %s | %s | %s | %s | %s%s | %s%s | %s%s | %s | %d / %d |\n", s.Target, s.Config, fmtK(s.RPS), fmtK(s.RPSSlow), fmtStat(s.P50us, 0), fmtStat(s.P50usSlow, 0),
				ge(s.BoundedBase), fmtStat(s.P99us, 0), ge(s.Bounded), fmtStat(s.P99usSlow, 0), ge(s.Bounded), fmtStat(s.Ratio, 2), fmtStat(s.RPSRatio, 2), s.Errors, s.ErrorsSlow)
		}
		for _, s := range r.Slow {
			p("\n- %s: slow clients connected %d of %d, still trickling when wrk ended %d, answered early %d, closed without an answer %d (worst run); nofile %s", s.Target, s.Connected, s.Clients, s.Open, s.Answered, s.Dropped, s.Nofile)
			if s.FirstAnswer != "" {
				p("; an answer: `%s`", s.FirstAnswer)
			}
			if s.DialError != "" {
				p("; a failed connection: %s", s.DialError)
			}
		}
		p("\n\n")
	}

	if len(r.Cold) > 0 {
		p("#### Cold wake (first request to a sleeping route), milliseconds\n\n")
		p("*first byte*: request written → first response byte. *app start*: the app's own main()→listening (GET /bound). *overhead* = first byte − app start. *spawn*: request written → the app's main(). *gate+proxy*: app listening → first byte. *app alone*: the same app exec'd by the harness itself in the same round, exec → listening (its start-up with nothing in front). *overhead vs alone* = first byte − app alone, round by round: the issue's \"first byte minus the app's own time from exec to listening\".\n\n")
		p("| mode | samples | failed | first byte | app start | overhead | spawn | gate+proxy | app alone | overhead vs alone |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, c := range r.Cold {
			p("| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s |\n", c.Mode, c.Samples, c.Failed, fmtStat(c.FirstByte, 2), fmtStat(c.AppStart, 2), fmtStat(c.Overhead, 2), fmtStat(c.Spawn, 2), fmtStat(c.GateProxy, 2), fmtStat(c.AppAlone, 2), fmtStat(c.OverheadExec, 2))
		}
		if len(r.ColdExtra) > 0 {
			p("\nAgainst the floor, sample by sample (each round takes one sample of every mode):\n\n| comparison | value |\n|---|---|\n")
			for _, x := range r.ColdExtra {
				p("| %s | %s |\n", x.Name, fmtStat(x.Value, 2))
			}
		}
		if len(r.Cold[0].Parts) > 0 {
			p("\nWhere the first byte goes, from the activator's wake record (when it began, where its `health` phase ended) and the app's own timestamps. *excess to main()*: wake began → main() minus the same round's app alone exec → main(), sample by sample: the backing's work before the exec, and anything that slows the app's start under the activator. The `spawn` phase ends when the forking thread runs again, which can be after the app's main() (the child keeps the CPU it was forked on).\n\n| mode |")
			for _, x := range r.Cold[0].Parts {
				p(" %s |", x.Name)
			}
			p("\n|---|%s\n", strings.Repeat("---|", len(r.Cold[0].Parts)))
			for _, c := range r.Cold {
				if len(c.Parts) == 0 {
					continue
				}
				p("| %s |", c.Mode)
				for _, x := range c.Parts {
					p(" %s |", fmtStat(x.Ms, 2))
				}
				p("\n")
			}
		}
		for _, c := range r.Cold {
			if c.Note != "" {
				p("\n- %s: %s", c.Mode, c.Note)
			}
		}
		p("\n\n")
	}

	if c := r.Chain; c != nil {
		p("#### Chain wake: exec tenants a ← b ← route c, woken cold by one request, milliseconds\n\n")
		p("Instances `a` and `b` and route `c` (c requires b, b requires a), each the demo app on its own port. Each round puts c, b and a to sleep through the admin API, in that order, then sends one `GET /bound` to c on a fresh connection. *wake*: c's wake record, which spans b's and a's; *own phases*: the sum over the three records (c's and the requirements' records nested in it) of every phase but `requires`, that is what the backings and health gates took; *overhead* = wake − own phases, round by round: what the activator adds to run the chain.\n\n")
		p("| rounds | failed | first byte | wake | own phases | **overhead** |\n|---|---|---|---|---|---|\n")
		p("| %d | %d | %s | %s | %s | %s |\n", c.Rounds, c.Failed, fmtStat(c.FirstByte, 2), fmtStat(c.Wake, 2), fmtStat(c.Own, 2), fmtStat(c.Overhead, 3))
		if c.Phases != "" {
			p("\n- wake phases (each record's own, median): %s", c.Phases)
		}
		if c.Note != "" {
			p("\n- %s", c.Note)
		}
		p("\n\n")
	}

	if len(r.Unit) > 0 {
		p("#### Unit wake vs systemd socket activation, first byte in milliseconds\n\n")
		p("Each round stops the three and sends one GET /bound to each, in turn. *socket activation*: the app's own `.socket`, systemd hands it the listening socket; *socket + proxyd*: a `.socket` starting `systemd-socket-proxyd`, which needs the app service (the issue's comparison); *activator unit*: a unit route. Ratios are taken round by round. *listening → first byte*: the part of the first byte after the app was listening (its own bound_ns).\n\n")
		p("| app start delay | socket activation | lost | socket + proxyd | lost | activator unit | lost | unit ÷ socket + proxyd | unit ÷ socket activation |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, u := range r.Unit {
			p("| %s | %s | %d | %s | %d | %s | %d | %s | %s |\n", u.StartDelay, fmtStat(u.Socket, 1), u.SocketLost, fmtStat(u.Proxyd, 1), u.ProxydLost, fmtStat(u.Unit, 1), u.UnitLost, fmtStat(u.RatioProxyd, 2), fmtStat(u.Ratio, 2))
		}
		for _, u := range r.Unit {
			p("\n- listening → first byte at start delay %s (median ms): socket activation %s, socket + proxyd %s, activator unit %s", u.StartDelay, fmtMedian(u.SocketPost), fmtMedian(u.ProxydPost), fmtMedian(u.UnitPost))
		}
		for _, u := range r.Unit {
			if u.Phases != "" {
				p("\n- unit wake phases at start delay %s (activator's wake record, median): %s", u.StartDelay, u.Phases)
			}
		}
		for _, u := range r.Unit {
			if len(u.Parts) > 0 {
				var parts []string
				for _, x := range u.Parts {
					parts = append(parts, x.Name+" "+fmtStat(x.Ms, 2))
				}
				p("\n- where the first byte goes at start delay %s (ms): %s", u.StartDelay, strings.Join(parts, "; "))
			}
		}
		for _, u := range r.UnitSleep {
			p("\n- unit wake from `sleep: %s` (the app's process kept: the wake is a %s), first byte: %s ms, %d lost", u.Mode, map[string]string{"sigstop": "SIGCONT", "freeze": "thaw"}[u.Mode], fmtStat(u.FirstByte, 2), u.Lost)
			if r.Unit[0].Unit.valid() && u.FirstByte.valid() {
				p("; ÷ the stop-mode unit wake at start delay 0s: %.2f", u.FirstByte.Median/r.Unit[0].Unit.Median)
			}
			if u.Phases != "" {
				p("; phases (median): %s", u.Phases)
			}
		}
		p("\n\n")
	}

	if len(r.Herd) > 0 {
		p("#### Herd: N concurrent requests on a cold route\n\n")
		p("The tenant is held back (it waits on a FIFO) until all N requests are held, then released. *release*: health gate passed → the last held request left the hold (the activator's wake record); *spread*: first → last response byte; *gate→last*: health gate passed → last response byte. Medians over the runs (release and memory: median (min–max)); held, answered, spawns and failed: the worst run.\n\n")
		p("| N | protocol | conns | runs | held | answered | failed | spawns | release ms | spread ms | gate→p50 ms | gate→last ms | RSS asleep | RSS all held | per held request KiB | heap, stacks KiB per held | activator nofile |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, h := range r.Herd {
			p("| %d | %s | %d | %d | %d | %d | %d | %d | %s | %.1f | %.1f | %.1f | %.1f MiB | %.1f MiB | %s | %.1f, %.1f | %s |\n", h.N, h.Proto, h.Conns, h.Runs, h.HeldMax, h.Answered, h.Failed, h.Spawns, h.Release, h.SpreadMs, h.P50Ms, h.GateLastMs,
				float64(h.RSSIdleKiB)/1024, float64(h.RSSHeldKiB)/1024, h.PerHeld, h.HeapPerHeldKiB, h.StackPerHeldKiB, h.Nofile)
		}
		for _, h := range r.Herd {
			if h.FirstFailure != "" {
				p("\n- N=%d, first failure: %s", h.N, h.FirstFailure)
			}
		}
		p("\n\n")
	}

	if len(r.HeldMem) > 0 {
		p("#### Held memory: small requests and requests at the header limit\n\n")
		p("Herds as in the herd experiment, with the default config (held caps included): the tenant is held back until every request is held or refused. *per held request* = (activator RSS all held − asleep) ÷ requests held. *small*: `GET /pid`; *header limit*: the same with one `X-Pad` header, against `edge.max_header_bytes`' default %d KiB. The kinds alternate within each round; medians (min–max); held, refused and failed: the worst run.\n\n", headerLimit>>10)
		p("| N | request | request size | runs | held | refused (503) | failed | RSS asleep | RSS all held | **KiB per held request** | per held ÷ request size | ÷ small, round by round |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, h := range r.HeldMem {
			over := "–"
			if h.OverSmall.valid() {
				over = fmtStat(h.OverSmall, 1)
			}
			perByte := "–" // a small request's own size is not what its memory is made of
			if h.RequestBytes >= 1<<10 && h.PerHeldKiB.valid() {
				perByte = fmt.Sprintf("%.2f", h.PerHeldKiB.Median*1024/float64(h.RequestBytes))
			}
			p("| %d | %s | %.1f KiB | %d | %d | %d | %d | %.1f MiB | %.1f MiB | %s | %s | %s |\n", h.N, h.Kind, float64(h.RequestBytes)/1024, h.Runs, h.Held, h.Refused, h.Failed,
				float64(h.RSSIdleKiB)/1024, float64(h.RSSHeldKiB)/1024, fmtStat(h.PerHeldKiB, 1), perByte, over)
		}
		for _, h := range r.HeldMem {
			if h.FirstFailure != "" {
				p("\n- N=%d, %s, first failure: %s", h.N, h.Kind, h.FirstFailure)
			}
		}
		p("\n\n")
	}

	if s := r.Scale; s != nil {
		p("#### Route scale: %d configured idle exec routes vs 10\n\n", s.Routes)
		p("| | %d routes | 10 routes |\n|---|---|---|\n", s.Routes)
		p("| activator RSS after load: at the admin API's first answer, settled | %.1f MiB, %.1f MiB | %.1f MiB |\n", float64(s.RSSKiB)/1024, float64(s.RSSSettledKiB)/1024, float64(s.RSSSmallKiB)/1024)
		p("| three /metrics scrapes as Prometheus makes them (gzip): each, its size; RSS after them, settled | %s ms, %.0f KiB; %.1f MiB | |\n", fmtStat(summarize(s.ScrapeMs), 0), s.ScrapeKiB, float64(s.RSSScrapedKiB)/1024)
		for i, v := range s.RSSReloadKiB {
			settled := math.NaN()
			if i < len(s.RSSReloadSettledKiB) {
				settled = float64(s.RSSReloadSettledKiB[i]) / 1024
			}
			p("| activator RSS after reload %d: at \"config reloaded\", settled | %.1f MiB, %.1f MiB | |\n", i+1, float64(v)/1024, settled)
		}
		p("| activator RSS after the warm requests | %.1f MiB | |\n", float64(s.RSSWarmKiB)/1024)
		p("| Go heap in use (admin /metrics) | %.1f MiB | %.1f MiB |\n", float64(s.HeapKiB)/1024, float64(s.HeapSmallKiB)/1024)
		p("| start → admin API answers | %.0f ms | %.0f ms |\n", s.LoadMs, s.LoadSmallMs)
		p("| reload after one route's edit (SIGHUP → \"config reloaded\"; %d of 3 decoded just that route) | %s ms | |\n", s.ReloadDecoded, fmtStat(s.ReloadMs, 0))
		p("| the activator's CPU time over that reload | %s ms | |\n", fmtStat(s.ReloadCPUMs, 0))
		p("| reload after an edit of every route (each decoded again); its CPU time | %.0f ms; %.0f ms | |\n", s.ReloadAllMs, s.ReloadAllCPUMs)
		p("| warm req/s, one route (the middle one: %s; c16) | %s | %s |\n", s.Host, fmtK(s.RPS), fmtK(s.RPSSmall))
		p("| warm p50 µs | %s | %s |\n", fmtStat(s.P50us, 0), fmtStat(s.P50usSmall, 0))
		p("| req/s ratio (%d ÷ 10) | %s | |\n\n", s.Routes, fmtStat(s.Ratio, 2))
	}

	if g := r.Guest; g != nil {
		p("#### Guest wake (kvm): one QEMU guest, first request to a sleeping route, milliseconds\n\n")
		p("%s *first byte*: request written → first response byte through the edge. *wake*: the activator's wake record (QEMU phases + health gate). *sleep*: the admin sleep before each sample. Rounds alternate cold, restore and pause samples.\n\n", g.Setup)
		p("| wake | samples | failed | first byte | wake | sleep before |\n|---|---|---|---|---|---|\n")
		for _, w := range g.Rows {
			p("| %s | %d | %d | %s | %s | %s |\n", w.Mode, w.Samples, w.Failed, fmtStat(w.FirstByte, 1), fmtStat(w.Wake, 1), fmtStat(w.Sleep, 1))
		}
		if len(g.Ratios) > 0 {
			p("\n| ratio, round by round | value |\n|---|---|\n")
			for _, x := range g.Ratios {
				p("| %s | %s |\n", x.Name, fmtStat(x.Value, 3))
			}
		}
		if len(g.Figures) > 0 {
			p("\n| figure, round by round | value |\n|---|---|\n")
			for _, x := range g.Figures {
				p("| %s | %s |\n", x.Name, fmtStat(x.Value, 1))
			}
		}
		for _, w := range g.Rows {
			if w.Phases != "" || w.Note != "" {
				p("\n- %s: ", w.Mode)
				if w.Phases != "" {
					p("wake phases (activator's record, median): %s", w.Phases)
				}
				if w.Note != "" {
					if w.Phases != "" {
						p("; ")
					}
					p("%s", w.Note)
				}
			}
		}
		p("\n\n")
	}

	if f := r.Fleet; f != nil {
		p("#### Node wake (redfish): two fleets of %d simulated nodes, serial vs parallel, milliseconds\n\n", f.Nodes)
		p("Two fleet routes on the real `cmd/redfish-sim` (HTTPS, session auth), each node staying PoweringOn for %s: `fleet-parallel` (nodes 0–%d, members woken all at once) and `fleet-serial` (`serial: true`, nodes %d–%d, one after another). Each round puts both to sleep, then sends one request to each, alternating which goes first. *serial*, *parallel*: request written → first response byte; `min_ready` is all members, so the request is released when the last member is up. *wake*: the fleet's own wake record.\n\n", f.Delay, f.Nodes-1, f.Nodes, 2*f.Nodes-1)
		p("| rounds | failed | serial | per node (serial) | parallel | parallel ÷ serial | 1/n | serial wake | parallel wake |\n|---|---|---|---|---|---|---|---|---|\n")
		p("| %d | %d | %s | %s | %s | %s | %.3f | %s | %s |\n", f.Rounds, f.Failed, fmtStat(f.Serial, 0), fmtStat(f.PerWake, 0), fmtStat(f.Parallel, 0), fmtStat(f.Ratio, 3), f.Ideal, fmtStat(f.SerialWake, 0), fmtStat(f.ParallelWake, 0))
		if f.Phases != "" {
			p("\n- wake phases of one member (its record in the fleet's rollup, median over both fleets): %s", f.Phases)
		}
		if f.Note != "" {
			p("\n- %s", f.Note)
		}
		p("\n\n")
	}

	if r.HTTPS != nil {
		r.HTTPS.markdown(&b)
	}

	if len(r.Skipped) > 0 {
		p("#### Not measured in this run\n\n")
		for _, s := range r.Skipped {
			p("- **%s**: %s\n", s.What, s.Why)
		}
		p("\n")
	}
	if len(r.Failures) > 0 {
		p("#### Failures\n\n")
		for _, f := range r.Failures {
			p("- %s\n", strings.ReplaceAll(f, "\n", " "))
		}
		p("\n")
	}
	for _, n := range r.Notes {
		p("- %s\n", n)
	}
	return b.String()
}

// describeMachine reads the CPU model, kernel, Go and tool versions.
func describeMachine(nofile uint64) Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Tools: map[string]string{}, NofileMax: nofile}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m.CPU = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	version := func(name string, args ...string) {
		p, ok := lookTool(name)
		if !ok {
			return
		}
		out, _ := exec.Command(p, args...).CombinedOutput()
		s := strings.TrimSpace(string(out))
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[:i]
		}
		if len(s) > 60 {
			s = s[:60]
		}
		m.Tools[name] = s
	}
	version("wrk", "-v")
	version("nginx", "-v")
	version("caddy", "version")
	version("haproxy", "-v")
	version("systemd", "--version")
	for k, v := range m.Tools { // keep just the version number where it is easy to find
		for _, f := range strings.Fields(v) {
			if strings.ContainsAny(f, "0123456789") && (strings.Contains(f, ".") || k == "systemd") {
				m.Tools[k] = strings.TrimPrefix(strings.TrimPrefix(f, "nginx/"), "v")
				break
			}
		}
	}
	return m
}

// fmtMedian is s's median with two decimals, or "–" when it has no samples.
func fmtMedian(s Stat) string {
	if !s.valid() {
		return "–"
	}
	return fmt.Sprintf("%.2f", s.Median)
}
