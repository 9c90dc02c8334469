package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/activator"
	"github.com/activator/activator/internal/backend/split"
	"github.com/activator/activator/internal/registry"
)

func cmdCheck(args []string) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "config file (YAML)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "activator check: unexpected %q (the config is --config FILE)\n", fs.Args())
		return 2
	}
	if *cfgPath == "" {
		fmt.Fprintln(os.Stderr, "activator check: --config FILE is required")
		return 2
	}
	logger, _ := newLogger(os.Stderr, "text", "error")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bk := newBackings(ctx, logger, true)
	defer bk.provider.Close()
	// The Reloader, as serve loads: it parses the file in runs of entries, each dropped once decoded,
	// where registry.Load holds the whole file's tree (about 1 GB at 100,000 routes); its verdict and
	// every problem it names are Load's.
	cfg, err := bk.loader.LoadFile(*cfgPath)
	if err == nil {
		err = checkWaitingPages(cfg) // waitpage.go: what the registry cannot check
	}
	if err != nil {
		printConfigErrors(os.Stderr, *cfgPath, err)
		return 1
	}
	// Live checks: what only the host can tell (a systemd that cannot freeze, say), for all routes at
	// once and each bounded, as at start-up; printed in route order.
	bk.exec.CheckRoot(cfg.CgroupRoot)
	found := make(map[string]error, len(cfg.Routes))
	var mu sync.Mutex
	liveCheck(ctx, slog.New(slog.DiscardHandler), bk.provider, tenants(cfg), func(route string, err error) {
		mu.Lock()
		defer mu.Unlock()
		found[route] = err
	})
	var problems []string
	for _, r := range tenants(cfg) {
		problems = append(problems, routeProblems(found[r.Name])...)
	}
	if g := cfg.AdminAccess.Socket.Group; g != "" && strings.HasPrefix(cfg.Admin, "unix:") {
		if _, err := lookupGroup(g); err != nil {
			problems = append(problems, "admin_socket.group: "+err.Error())
		}
	}
	if a, err := registry.ParseAdminAddr(cfg.Admin); err == nil {
		for _, w := range adminWarnings(cfg, a) {
			fmt.Fprintf(os.Stderr, "%s: warning: %s\n", *cfgPath, w)
		}
	}
	tlsProblems, tlsWarns := checkTLS(cfg) // the certificate files, as serve loads them (edgetls.go)
	problems = append(problems, tlsProblems...)
	for _, w := range tlsWarns {
		fmt.Fprintf(os.Stderr, "%s: warning: %s\n", *cfgPath, w)
	}
	for _, n := range tenantNotes(ctx, bk.provider, cfg) { // what a setting resolves to here
		fmt.Fprintf(os.Stderr, "%s: note: %s\n", *cfgPath, n)
	}
	if len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "%s: %d problem%s found on this host:\n", *cfgPath, len(problems), plural(len(problems)))
		for _, p := range problems {
			fmt.Fprintf(os.Stderr, "  %s\n", strings.ReplaceAll(p, "\n", "\n    "))
		}
		return 1
	}
	if n := len(cfg.Instances); n > 0 {
		fmt.Printf("%s: ok, %d route%s, %d instance%s\n", *cfgPath, len(cfg.Routes), plural(len(cfg.Routes)), n, plural(n))
	} else {
		fmt.Printf("%s: ok, %d route%s\n", *cfgPath, len(cfg.Routes), plural(len(cfg.Routes)))
	}
	return 0
}

// tenantNotes are the backings' notes on each route and instance (tenant.Noter), each prefixed with
// its name and bounded like a host check.
func tenantNotes(ctx context.Context, p *split.Provider, cfg *registry.Config) []string {
	var out []string
	for _, r := range tenants(cfg) {
		cctx, cancel := context.WithTimeout(ctx, checkBound)
		for _, n := range p.Notes(cctx, r) {
			out = append(out, fmt.Sprintf("%s %q: %s", kindOf(r), r.Name, n))
		}
		cancel()
	}
	return out
}

func kindOf(r *registry.Route) string {
	if r.Instance {
		return "instance"
	}
	return "route"
}

// adminClient is how the CLI reaches the admin API: the address (host:port or unix:/path) and the
// bearer token, if any.
type adminClient struct {
	addr  registry.AdminAddr
	token string
}

// adminFlags adds --admin, --token-file and --config to fs; the function it returns, called after
// fs.Parse, settles the client. The address is --admin, else $ACTIVATOR_ADMIN, else the config's admin,
// else the default. The token is read from --token-file, else taken from $ACTIVATOR_ADMIN_TOKEN, else
// read from the config's admin_token_file.
func adminFlags(fs *flag.FlagSet) func() (*adminClient, error) {
	admin := fs.String("admin", "", "admin API address, host:port or unix:/path (env ACTIVATOR_ADMIN; default the config's admin, or "+registry.DefaultAdmin+")")
	tokenFile := fs.String("token-file", "", "file holding the admin API's bearer token (env "+registry.AdminTokenEnv+"; default the config's admin_token_file)")
	cfgPath := fs.String("config", "", "the activator's config file: admin and admin_token_file are read from it")
	return func() (*adminClient, error) {
		var fc struct {
			Admin     string `yaml:"admin"`
			TokenFile string `yaml:"admin_token_file"`
		}
		if *cfgPath != "" {
			b, err := os.ReadFile(*cfgPath)
			if err != nil {
				return nil, err
			}
			if err := yaml.Unmarshal(b, &fc); err != nil {
				return nil, fmt.Errorf("%s: %w", *cfgPath, err)
			}
		}
		given := false
		fs.Visit(func(f *flag.Flag) { given = given || f.Name == "admin" })
		if given && *admin == "" {
			// Taken as unset, it fell through to another address without a word.
			return nil, fmt.Errorf("--admin is empty; leave it out for $ACTIVATOR_ADMIN, the config's admin or %s", registry.DefaultAdmin)
		}
		addr, from := *admin, "--admin"
		switch {
		case addr != "":
		case os.Getenv("ACTIVATOR_ADMIN") != "":
			addr, from = os.Getenv("ACTIVATOR_ADMIN"), "$ACTIVATOR_ADMIN"
		case fc.Admin != "":
			addr, from = fc.Admin, *cfgPath+": admin"
		default:
			addr, from = registry.DefaultAdmin, "the default admin address"
		}
		a, err := parseAdminAddr(from, addr)
		if err != nil {
			return nil, err
		}
		c := &adminClient{addr: a, token: os.Getenv(registry.AdminTokenEnv)}
		f := *tokenFile
		if f == "" && c.token == "" {
			f = fc.TokenFile
		}
		if f != "" {
			b, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("admin token: %w", err)
			}
			c.token = strings.TrimRight(string(b), "\r\n")
		}
		return c, nil
	}
}

// parseAdminAddr parses s, the admin API's address as the CLI got it from (--admin, $ACTIVATOR_ADMIN,
// FILE: admin), saying what is wrong in the CLI's terms: an address without a port (127.0.0.1,
// localhost, [::1], 127.0.0.1:), a bare IPv6 address, a URL, or what registry.ParseAdminAddr, which
// checks the config's admin with the same rules, refuses. Each message names from and quotes s.
func parseAdminAddr(from, s string) (registry.AdminAddr, error) {
	const forms = "want host:port, e.g. 127.0.0.1:9090, or unix:/path"
	if !strings.HasPrefix(s, "unix:") {
		_, port, err := net.SplitHostPort(s)
		switch {
		case strings.Contains(s, "://"):
			return registry.AdminAddr{}, fmt.Errorf("%s %q: a URL; %s", from, s, forms)
		case err == nil && port == "", err != nil && splits(s+":9090"): // 127.0.0.1:, 127.0.0.1, [::1]
			return registry.AdminAddr{}, fmt.Errorf("%s %q: missing port (want host:port, e.g. 127.0.0.1:9090)", from, s)
		case err != nil && net.ParseIP(s) != nil: // an IPv6 address without brackets or port
			return registry.AdminAddr{}, fmt.Errorf("%s %q: missing port (want [host]:port, e.g. [%s]:9090)", from, s, s)
		case err != nil:
			return registry.AdminAddr{}, fmt.Errorf("%s %q is not an address (%s)", from, s, forms)
		}
	}
	a, err := registry.ParseAdminAddr(s)
	if err != nil {
		return registry.AdminAddr{}, fmt.Errorf("%s %w", from, err) // the registry's error begins with s, quoted
	}
	return a, nil
}

// splits reports whether s is host:port to net.SplitHostPort.
func splits(s string) bool {
	_, _, err := net.SplitHostPort(s)
	return err == nil
}

func cmdStatus(args []string) int {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	client := adminFlags(fs)
	asJSON := fs.Bool("json", false, "print the raw JSON")
	watch := fs.Bool("watch", false, "redraw the table every --interval until interrupted")
	interval := fs.Duration("interval", 2*time.Second, "with --watch: how often to redraw")
	count := fs.Int("count", 0, "with --watch: stop after this many tables (0: until interrupted)")
	names := fs.Bool("names", false, "print the route names, one a line (for shell completion)")
	state := fs.String("state", "", "only routes in these states, comma-separated: "+strings.Join(activator.StateNames(), ", "))
	wide := fs.Bool("wide", false, fmt.Sprintf("show each NOTE whole (else cut at %d characters)", statusNoteMax))
	// Route names may come before, between or after the flags.
	var routes []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			return 2
		}
		if fs.NArg() == 0 {
			break
		}
		routes, rest = append(routes, fs.Arg(0)), fs.Args()[1:]
	}
	// Found by an operator trial, each silently taken: --count -1 watched for ever, --interval 1ns
	// polled the admin API in a loop, --count and --interval without --watch did nothing, --json
	// with --names printed names, and --state '' listed every route.
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var usage string
	switch {
	case (set["count"] || set["interval"]) && !*watch:
		usage = "--count and --interval go with --watch"
	case *count < 0:
		usage = fmt.Sprintf("--count must be 0 (until interrupted) or more, got %d", *count)
	case *watch && *interval < minWatchInterval:
		usage = fmt.Sprintf("--interval must be at least %v, got %v", minWatchInterval, *interval)
	case *names && (*asJSON || *watch):
		usage = "--names prints names only: not with --json or --watch"
	case set["state"] && strings.TrimSpace(*state) == "":
		usage = "--state is empty; leave it out for every route"
	}
	for _, r := range routes {
		if err := registry.CheckName(r); err != nil && usage == "" {
			usage = err.Error() // a name no route has: ask nothing (a comma would even split it in two)
		}
	}
	if usage != "" {
		fmt.Fprintln(os.Stderr, "activator status:", usage)
		return 2
	}
	c, err := client()
	if err != nil {
		fmt.Fprintln(os.Stderr, "activator status:", err)
		return 2
	}
	list := listPath(routes, *state, false)
	switch {
	case *names:
		return printNames(c, listPath(routes, *state, true))
	case *watch:
		return watchStatus(c, list, *interval, *count, noteMax(*wide))
	}
	body, code, err := c.call(http.MethodGet, list, 10*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "activator status:", err)
		return 1
	}
	if code != http.StatusOK {
		fmt.Fprintln(os.Stderr, "activator status:", answerError(body, code))
		return 1
	}
	if *asJSON {
		os.Stdout.Write(body)
		return 0
	}
	var sts []activator.Status
	if err := decodeAnswer(body, &sts); err != nil {
		fmt.Fprintln(os.Stderr, "activator status: bad answer from the admin API:", err)
		return 1
	}
	printStatus(os.Stdout, sts, time.Now(), noteMax(*wide))
	return 0
}

// statusNoteMax is how many characters of a route's NOTE the status table shows without --wide: a
// wake's error quotes the tail of the tenant's stderr, and a whole one would wrap every row of the
// table. The cut is said under the table, so that nobody takes a cut note for the whole.
const statusNoteMax = 100

// noteMax is printStatus's bound on a NOTE: none with --wide.
func noteMax(wide bool) int {
	if wide {
		return 0
	}
	return statusNoteMax
}

// cutNote cuts s to at most max characters (runes, not bytes: a cut in the middle of one would print
// a broken character), ending it with "…", and reports whether it did. max 0 keeps s whole.
func cutNote(s string, max int) (string, bool) {
	if max <= 0 || utf8.RuneCountInString(s) <= max {
		return s, false
	}
	i := 0
	for range max - 1 {
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return s[:i] + "…", true
}

// listPath is the admin API's GET /routes for these routes (all when none) in these states (any when
// ""), their names alone when names is set: the admin API selects, so that a status of a few routes
// out of 100,000 does not fetch 28 MB.
func listPath(routes []string, states string, names bool) string {
	q := url.Values{}
	if len(routes) > 0 {
		q.Set("route", strings.Join(routes, ","))
	}
	if states != "" {
		q.Set("state", states)
	}
	if names {
		q.Set("names", "true")
	}
	if len(q) == 0 {
		return "/routes"
	}
	return "/routes?" + q.Encode()
}

// printStatus prints the status table, each NOTE cut to noteMax characters (0: whole).
func printStatus(w io.Writer, sts []activator.Status, now time.Time, noteMax int) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	cut := 0
	fmt.Fprintln(tw, "ROUTE\tBACKING\tSTATE\tFOR\tIN-FLIGHT\tHELD\tLAST WAKE\tPHASES\tNOTE")
	for _, s := range sts {
		last, phases := "-", "-"
		wr := s.LastWake
		if s.CurrentWake != nil {
			wr = s.CurrentWake
		}
		if wr != nil {
			last = fmt.Sprintf("%s %s (%s ago)", wr.Result, wr.Duration.Round(100*time.Microsecond), now.Sub(wr.Started).Round(time.Second))
			var ps []string
			for _, p := range wr.Phases {
				ps = append(ps, fmt.Sprintf("%s=%s", p.Name, p.Duration.Round(100*time.Microsecond)))
			}
			if wr.Released > 1 { // a herd: how long letting it go took
				ps = append(ps, fmt.Sprintf("released=%d/%s", wr.Released, wr.ReleaseSpread.Round(100*time.Microsecond)))
			}
			phases = strings.Join(ps, " ")
		}
		state := s.State
		if s.LastSleepError != "" && s.State == "awake" {
			state = "awake, sleep failed" // the reason is the note
		}
		if s.RunningOutside != "" {
			state += ", running outside" // started without the activator: the note says what and since when
		}
		var notes []string
		if s.CheckError != "" {
			s.CheckError = "host check failed: " + s.CheckError
		}
		for _, n := range []string{s.Warning, s.RunningOutside, s.CheckError, s.LastError, s.LastSleepError} {
			if n != "" {
				notes = append(notes, n)
			}
		}
		note := strings.Join(notes, "; ")
		if note == "" && wr != nil && len(wr.Notes) > 0 && !sleptSince(s, wr) {
			note = strings.Join(wr.Notes, "; ")
		}
		if len(s.RequiredBy) > 0 {
			note = strings.TrimPrefix(note+"; ", "; ") + "required by " + strings.Join(s.RequiredBy, ", ")
		}
		if len(s.Members) > 0 {
			ready := 0
			for _, m := range s.Members {
				if m.Ready {
					ready++
				}
			}
			note = strings.TrimPrefix(note+"; ", "; ") + fmt.Sprintf("fleet %d/%d ready (min_ready %d)", ready, len(s.Members), s.MinReady)
		}
		if e := s.NextEvent; e != nil { // the schedule's part stays short: errors come first
			note = strings.TrimPrefix(note+"; ", "; ") + "next " + e.What + " " + e.At.Format(time.RFC3339)
		}
		note = strings.ReplaceAll(note, "\n", " ")
		if c, was := cutNote(note, noteMax); was {
			note = c
			cut++
		}
		name := s.Route
		if s.Kind == "instance" {
			name += " (instance)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", name, s.Backing, state,
			now.Sub(s.Since).Round(time.Second), s.InFlight, s.Held, last, phases, note)
	}
	tw.Flush()
	if cut > 0 {
		fmt.Fprintf(w, "(%d note%s cut at %d characters: status --wide shows them whole, explain ROUTE each wake's)\n",
			cut, plural(cut), noteMax)
	}
}

// sleptSince reports whether route s has gone to sleep since wake wr, the last one, woke it: wr's notes
// then say what it found and did, not how the route is (a fleet's handover "handed the tenant over,
// running" on a route asleep since), and are left to `activator explain`. A wake that left the route
// asleep (an adopt or a handover that found nothing running) or failed is still the latest word.
func sleptSince(s activator.Status, wr *activator.WakeRecord) bool {
	return s.State == "asleep" && wr == s.LastWake && wr.Outcome == activator.OutcomeSucceeded && wr.Result != activator.ResultAdoptAsleep
}

// minWatchInterval bounds how often status --watch asks the admin API.
const minWatchInterval = 10 * time.Millisecond

func cmdAct(verb string, args []string) int {
	fs := flag.NewFlagSet(verb, flag.ContinueOnError)
	client := adminFlags(fs)
	route, code := routeArg(verb, fs, args) // the route before or after the flags
	if code != 0 {
		return code
	}
	c, err := client()
	if err != nil {
		fmt.Fprintf(os.Stderr, "activator %s: %v\n", verb, err)
		return 2
	}
	body, code, err := c.call(http.MethodPost, "/routes/"+url.PathEscape(route)+"/"+verb, 16*time.Minute)
	if err != nil {
		fmt.Fprintf(os.Stderr, "activator %s: %v\n", verb, err)
		return 1
	}
	if code != http.StatusOK {
		var e struct{ Error string }
		if decodeAnswer(body, &e) == nil && e.Error != "" {
			fmt.Fprintf(os.Stderr, "activator %s %s: %s\n", verb, route, e.Error)
		} else {
			fmt.Fprintf(os.Stderr, "activator %s %s: admin API answered %d\n", verb, route, code)
		}
		return 1
	}
	var st activator.Status
	_ = decodeAnswer(body, &st)
	printStatus(os.Stdout, []activator.Status{st}, time.Now(), 0)
	return 0
}

// call sends one request to the admin API with what its checks ask for: the token, if any, and on
// POST the X-Activator header.
func (c *adminClient) call(method, path string, timeout time.Duration) ([]byte, int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	base, client := "http://"+c.addr.Address, http.DefaultClient
	if c.addr.Network == "unix" {
		base = "http://localhost"
		client = &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", c.addr.Address)
			},
		}}
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, nil)
	if err != nil {
		return nil, 0, err
	}
	if method != http.MethodGet {
		req.Header.Set(activator.CSRFHeader, "1")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("cannot reach the admin API at %s (is `activator serve` running? set --admin): %w", c.addr.Address, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode == http.StatusUnauthorized {
		if c.token != "" { // a token went, and was refused: asking for one misleads
			err = fmt.Errorf("the admin API refused the bearer token given (--token-file, $%s or --config): %s", registry.AdminTokenEnv, strings.TrimSpace(string(b)))
		} else {
			err = fmt.Errorf("the admin API wants a bearer token (--token-file, $%s or --config): %s", registry.AdminTokenEnv, strings.TrimSpace(string(b)))
		}
	}
	return b, resp.StatusCode, err
}

// routeProblems is one route's finding as check lists it: a fleet's, which joins one finding per
// member (each naming its member's route), as one problem per member; nil for none. Listed as one, a
// fleet with two members failing counted as one problem, printed on lines the list did not indent.
func routeProblems(err error) []string {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []string
		for _, e := range j.Unwrap() {
			out = append(out, routeProblems(e)...)
		}
		return out
	}
	return []string{err.Error()}
}
