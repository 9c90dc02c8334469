// Package redfishtest is a simulated BMC: an HTTP(S) server speaking enough of the Redfish protocol
// (DSP0266) that a Redfish client such as gofish cannot tell it from a real service. It serves the
// ServiceRoot, the Systems collection, ComputerSystem resources with their
// #ComputerSystem.Reset action, and the SessionService (X-Auth-Token sessions created by POST, deleted
// by DELETE); it also accepts HTTP basic authentication.
//
// Tests drive it through controls: a power transition delay, a log of Reset POSTs and of every request,
// faults injected into the next requests (any status such as 401, 500 or 429 with Retry-After, or a
// dropped connection), systems that never power on, stay stuck PoweringOn or ignore GracefulShutdown,
// Resets that are accepted at once but carried out later (HoldResets), a password changed on the BMC
// side (SetPassword), a count of accepted connections (TLS handshakes included) and of failed logins
// (FailedLogins: what a real BMC's lockout policy counts), a broadcast of every
// change (Changed), and an optional "node service": an HTTP listener on a fixed loopback address that
// is open exactly while the system's PowerState is On, so a health gate can be exercised for real.
//
// The Server owns every goroutine it starts (power transitions, node services); Close stops and joins
// them. All methods are safe for concurrent use.
package redfishtest

import (
	"crypto/subtle"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Power states, as Redfish spells them.
const (
	On          = "On"
	Off         = "Off"
	PoweringOn  = "PoweringOn"
	PoweringOff = "PoweringOff"
)

// DefaultResetTypes returns what a system allows when its ResetTypes is empty: the list a typical BMC
// advertises in ResetType@Redfish.AllowableValues.
func DefaultResetTypes() []string {
	return []string{"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn", "PushPowerButton"}
}

const (
	rootPath     = "/redfish/v1/"
	systemsPath  = "/redfish/v1/Systems"
	sessSvcPath  = "/redfish/v1/SessionService"
	sessionsPath = "/redfish/v1/SessionService/Sessions"
	resetSuffix  = "/Actions/ComputerSystem.Reset"
)

// Options configures a Server.
type Options struct {
	// Addr is the address to listen on (default "127.0.0.1:0", a free loopback port).
	Addr string
	// TLS serves HTTPS with a self-signed certificate for 127.0.0.1 (see CertificatePEM).
	TLS bool
	// Username and Password are the one account the service accepts. An empty Username disables
	// authentication altogether.
	Username string
	Password string
	// NoSessionService leaves the SessionService out of the ServiceRoot: only basic auth works.
	NoSessionService bool
	// NoBasicAuth rejects HTTP basic authentication: only sessions work.
	NoBasicAuth bool
	// Systems are the simulated computer systems (default: one, "node-1", Off).
	Systems []System
	// Logger receives the simulator's own log lines (default: discarded).
	Logger *slog.Logger
}

// System configures one simulated ComputerSystem.
type System struct {
	// ID is the resource Id (the last path element); Name defaults to the ID.
	ID   string
	Name string
	// PowerState at start: On or Off (default Off).
	PowerState string
	// ResetTypes is ResetType@Redfish.AllowableValues (default DefaultResetTypes).
	ResetTypes []string
	// TransitionDelay is how long the system stays PoweringOn/PoweringOff (0: it changes at once).
	TransitionDelay time.Duration
	// ServiceAddr, when set, is a loopback host:port ("127.0.0.1:0" picks a free port; see
	// Server.ServiceAddr) where ServiceHandler is served while PowerState is On: the node's own service,
	// as the activator's health gate sees it. While the system is not On, every connection to it is
	// closed at once and open ones are cut. (The port stays bound throughout, so that nothing else can
	// take it while the node is off.) Default handler: a 200 page saying "hello from <ID>".
	ServiceAddr    string
	ServiceHandler http.Handler
}

// Fault is a failure injected into the next matching requests.
type Fault struct {
	// Count is how many matching requests the fault applies to (default 1).
	Count int
	// Method and PathSuffix restrict the fault to matching requests ("" matches any).
	Method     string
	PathSuffix string
	// Status answers with this HTTP status and a Redfish error body (e.g. 401, 500, 503, 429).
	Status int
	// RetryAfter, when set, is sent as Retry-After (whole seconds, rounded up).
	RetryAfter time.Duration
	// Drop closes the connection after reading the request, without any answer.
	Drop bool
	// Delay holds the request this long first (until the client gives up or the Server closes); then
	// the fault's Status or Drop applies, or, with neither, the request is served normally: a slow BMC.
	Delay time.Duration
	// Handled, with Drop, first carries the request out and then drops the connection, so the client
	// cannot know whether it took effect (a Reset that landed but whose answer was lost).
	Handled bool
	// Answer, when set, writes the answer itself: a hostile or broken BMC (a redirect, a link off the
	// endpoint, an answer of megabytes). Status and Drop then play no part.
	Answer http.HandlerFunc
}

// Request is one request the Server received, as recorded for tests.
type Request struct {
	Method string
	Path   string
	Status int    // status answered (0 when the connection was dropped)
	Reset  string // the ResetType of a Reset POST that was carried out
}

// Server is a running simulated BMC.
type Server struct {
	// URL is the service's base URL, e.g. "https://127.0.0.1:38211".
	URL string

	srv  *httptest.Server
	opts Options
	log  *slog.Logger
	stop chan struct{} // closed by Close: transitions and services stop
	wg   sync.WaitGroup

	mu       sync.Mutex // guards the fields below
	closed   bool
	password string // the account's password: Options.Password until SetPassword
	systems  []*system
	sessions map[string]string // X-Auth-Token -> session id
	nextSess int
	faults   []Fault
	requests []Request
	conns    int           // connections accepted by the Redfish service
	failed   int           // logins refused for their credentials (FailedLogins)
	changed  chan struct{} // closed and replaced by every power change or Reset (see Changed)
}

// system is one ComputerSystem's live state, guarded by Server.mu.
type system struct {
	cfg            System
	state          string
	gen            int // bumped by every power change; a pending transition only lands if unchanged
	neverOn        bool
	stuckOn        bool     // power-on Resets leave the system PoweringOn
	held           bool     // Resets are accepted but not carried out until released
	pending        []string // the held Resets, in order
	ignoreGraceful bool
	resets         []string
	svc            *http.Server          // nil without a node service
	svcAddr        string                // the node service's bound address
	conns          map[net.Conn]struct{} // the node service's open connections
}

// New starts a Server. Close it when done.
func New(opts Options) (*Server, error) {
	if len(opts.Systems) == 0 {
		opts.Systems = []System{{ID: "node-1"}}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{opts: opts, log: log, stop: make(chan struct{}), sessions: map[string]string{},
		password: opts.Password, changed: make(chan struct{})}
	seen := map[string]bool{}
	for _, c := range opts.Systems {
		if c.ID == "" || strings.ContainsAny(c.ID, "/?#") {
			return nil, fmt.Errorf("redfishtest: system id %q is not a path element", c.ID)
		}
		if seen[c.ID] {
			return nil, fmt.Errorf("redfishtest: system id %q twice", c.ID)
		}
		seen[c.ID] = true
		if c.Name == "" {
			c.Name = c.ID
		}
		if len(c.ResetTypes) == 0 {
			c.ResetTypes = DefaultResetTypes()
		}
		if c.PowerState == "" {
			c.PowerState = Off
		}
		if c.PowerState != On && c.PowerState != Off {
			return nil, fmt.Errorf("redfishtest: system %q: initial PowerState must be On or Off, got %q", c.ID, c.PowerState)
		}
		if c.ServiceAddr != "" && c.ServiceHandler == nil {
			c.ServiceHandler = helloHandler(c.ID)
		}
		s.systems = append(s.systems, &system{cfg: c, state: Off})
	}
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var svcLns []net.Listener
	for _, sys := range s.systems {
		if sys.cfg.ServiceAddr == "" {
			svcLns = append(svcLns, nil)
			continue
		}
		ln, err := net.Listen("tcp", sys.cfg.ServiceAddr)
		if err != nil {
			for _, l := range svcLns {
				if l != nil {
					l.Close()
				}
			}
			return nil, fmt.Errorf("redfishtest: system %s: node service: %w", sys.cfg.ID, err)
		}
		svcLns = append(svcLns, ln)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		for _, l := range svcLns {
			if l != nil {
				l.Close()
			}
		}
		return nil, fmt.Errorf("redfishtest: listen: %w", err)
	}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(s.serveHTTP))
	s.srv.Listener.Close()
	s.srv.Listener = ln
	s.srv.Config.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	s.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) { // httptest chains its own hook after it
		if st == http.StateNew {
			s.mu.Lock()
			s.conns++
			s.mu.Unlock()
		}
	}
	if opts.TLS {
		s.srv.StartTLS()
	} else {
		s.srv.Start()
	}
	s.URL = s.srv.URL
	s.mu.Lock()
	for i, sys := range s.systems {
		sys.state = sys.cfg.PowerState
		if svcLns[i] != nil {
			s.startServiceLocked(sys, svcLns[i])
		}
	}
	s.mu.Unlock()
	return s, nil
}

func helloHandler(id string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "hello from %s\n", id)
	})
}

// Close stops the service, every node service and every pending transition, and joins their
// goroutines. It is idempotent.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.stop)
	var svcs []*http.Server
	for _, sys := range s.systems {
		if sys.svc != nil {
			svcs = append(svcs, sys.svc)
		}
	}
	s.mu.Unlock()
	for _, svc := range svcs {
		_ = svc.Close() // outside s.mu: it may run ConnState hooks
	}
	s.srv.Close()
	s.wg.Wait()
}

// CertificatePEM returns the PEM of the TLS certificate the Server presents (nil without TLS), for use
// as a client's CA file.
func (s *Server) CertificatePEM() []byte {
	c := s.srv.Certificate()
	if c == nil {
		return nil
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// Inject queues a fault for the next matching requests. Faults are consulted in the order injected.
func (s *Server) Inject(f Fault) {
	if f.Count <= 0 {
		f.Count = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, f)
}

// Requests returns a copy of every request received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// ServiceAddr returns the bound address of the system's node service ("" without one).
func (s *Server) ServiceAddr(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sys := s.systemLocked(id); sys != nil {
		return sys.svcAddr
	}
	return ""
}

// Connections reports how many connections the Redfish service has accepted. With TLS each is one
// handshake attempt, so a client that gives up on an untrusted certificate shows as exactly one.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns
}

// Changed returns a channel that is closed at the next change of any system's PowerState or Reset log.
// Wait for a condition by checking it, then waiting on Changed, in a loop (bounded by the caller).
func (s *Server) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// SetPassword changes the account's password on the BMC side, as an operator rotating it does. Open
// sessions are closed, as BMCs do when a user's password changes; basic auth with the old password is
// rejected from now on.
func (s *Server) SetPassword(p string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.password = p
	clear(s.sessions)
}

// FailedLogins reports how many logins the service refused for their credentials: session creations
// with a wrong user name or password, and requests whose basic auth carried wrong ones. These are what
// a BMC's account lockout policy counts. Requests with an unknown or expired X-Auth-Token, or none, and
// injected faults do not count.
func (s *Server) FailedLogins() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// loginRefused counts one failed login and logs it.
func (s *Server) loginRefused(user, auth string) {
	s.mu.Lock()
	s.failed++
	n := s.failed
	s.mu.Unlock()
	s.log.Info("login refused", "user", user, "auth", auth, "failed_logins", n)
}

// Sessions reports how many sessions are open.
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// ExpireSessions forgets every session, as a BMC does when sessions time out or it reboots.
func (s *Server) ExpireSessions() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.sessions)
}

// PowerState returns the system's current PowerState ("" for an unknown id).
func (s *Server) PowerState(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sys := s.systemLocked(id); sys != nil {
		return sys.state
	}
	return ""
}

// Resets returns the ResetTypes of the Reset POSTs the system accepted, in order (held ones included).
func (s *Server) Resets(id string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sys := s.systemLocked(id); sys != nil {
		return slices.Clone(sys.resets)
	}
	return nil
}

// SetPowerState forces the system's PowerState at once, as a person at the machine would (Off: pull
// the plug; On: press the button), canceling any pending transition. Off stops the node service.
func (s *Server) SetPowerState(id, state string) error {
	if state != On && state != Off {
		return fmt.Errorf("redfishtest: SetPowerState %q: want On or Off", state)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sys := s.systemLocked(id)
	if sys == nil {
		return fmt.Errorf("redfishtest: no system %q", id)
	}
	sys.gen++
	s.settleLocked(sys, state)
	return nil
}

// SetNeverPowersOn makes the system accept power-on resets without ever powering on.
func (s *Server) SetNeverPowersOn(id string, v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sys := s.systemLocked(id); sys != nil {
		sys.neverOn = v
	}
}

// SetStuckPoweringOn makes power-on Resets take the system to PoweringOn and leave it there (a node
// hanging in POST) until a power-off Reset or SetPowerState.
func (s *Server) SetStuckPoweringOn(id string, v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sys := s.systemLocked(id); sys != nil {
		sys.stuckOn = v
	}
}

// HoldResets makes the system accept Reset POSTs (204, logged in Resets) without acting on them, as a
// BMC that queues a Reset and carries it out long after answering does. The returned release carries
// the held Resets out in order, before it returns, and ends the hold; it is idempotent.
func (s *Server) HoldResets(id string) (release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sys := s.systemLocked(id)
	if sys == nil {
		return func() {}
	}
	sys.held = true
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		pending := sys.pending
		sys.held, sys.pending = false, nil
		for _, rt := range pending {
			s.log.Info("held reset carried out", "system", sys.cfg.ID, "reset_type", rt)
			s.applyLocked(sys, rt)
		}
	}
}

// SetIgnoreGraceful makes the system accept GracefulShutdown (and PushPowerButton while On) without
// ever powering off, as an OS that ignores ACPI power button events does.
func (s *Server) SetIgnoreGraceful(id string, v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sys := s.systemLocked(id); sys != nil {
		sys.ignoreGraceful = v
	}
}

func (s *Server) systemLocked(id string) *system {
	for _, sys := range s.systems {
		if sys.cfg.ID == id {
			return sys
		}
	}
	return nil
}

// --- power -------------------------------------------------------------------------------------

// transitionLocked moves sys towards state `to`, through PoweringOn/PoweringOff when the system has a
// transition delay. The pending change is owned by s and dropped if another change happens first.
func (s *Server) transitionLocked(sys *system, to string) {
	sys.gen++
	if sys.state == to {
		return
	}
	d := sys.cfg.TransitionDelay
	if d <= 0 && !(to == On && sys.stuckOn) {
		s.settleLocked(sys, to)
		return
	}
	if to == On {
		sys.state = PoweringOn
	} else {
		sys.state = PoweringOff
	}
	s.notifyLocked()
	if to == On && sys.stuckOn {
		return
	}
	gen := sys.gen
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.stop:
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if sys.gen == gen && !s.closed {
			s.settleLocked(sys, to)
		}
	}()
}

// settleLocked puts sys in a final state; Off cuts the node service's open connections.
func (s *Server) settleLocked(sys *system, state string) {
	sys.state = state
	s.notifyLocked()
	if state != On {
		for c := range sys.conns {
			_ = c.Close()
		}
		clear(sys.conns)
	}
}

// startServiceLocked serves sys's node service on ln for the Server's whole life, gated on PowerState.
func (s *Server) startServiceLocked(sys *system, ln net.Listener) {
	sys.svcAddr = ln.Addr().String()
	sys.conns = map[net.Conn]struct{}{}
	sys.svc = &http.Server{
		Handler:           sys.cfg.ServiceHandler,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		ConnState: func(c net.Conn, st http.ConnState) {
			s.mu.Lock()
			defer s.mu.Unlock()
			switch st {
			case http.StateNew:
				if sys.state != On {
					_ = c.Close()
					return
				}
				sys.conns[c] = struct{}{}
			case http.StateClosed, http.StateHijacked:
				delete(sys.conns, c)
			}
		},
	}
	srv := sys.svc
	gl := &gatedListener{Listener: ln, on: func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return sys.state == On
	}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := srv.Serve(gl); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("node service stopped", "system", sys.cfg.ID, "err", err)
		}
	}()
}

// gatedListener closes every connection accepted while on reports false: a powered-off node.
type gatedListener struct {
	net.Listener
	on func() bool
}

func (l *gatedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || l.on() {
			return c, err
		}
		_ = c.Close()
	}
}

// resetLocked accepts one Reset action, carrying it out unless the system's Resets are held, and
// reports whether the type is allowed.
func (s *Server) resetLocked(sys *system, rt string) bool {
	if !slices.Contains(sys.cfg.ResetTypes, rt) {
		return false
	}
	sys.resets = append(sys.resets, rt)
	s.notifyLocked()
	if sys.held {
		sys.pending = append(sys.pending, rt)
		return true
	}
	s.applyLocked(sys, rt)
	return true
}

// applyLocked carries out one accepted Reset.
func (s *Server) applyLocked(sys *system, rt string) {
	on := sys.state == On || sys.state == PoweringOn
	switch rt {
	case "On", "ForceOn":
		if !on && !sys.neverOn {
			s.transitionLocked(sys, On)
		}
	case "PushPowerButton":
		switch {
		case on && !sys.ignoreGraceful:
			s.transitionLocked(sys, Off)
		case !on && !sys.neverOn:
			s.transitionLocked(sys, On)
		}
	case "GracefulShutdown":
		if on && !sys.ignoreGraceful {
			s.transitionLocked(sys, Off)
		}
	case "ForceOff":
		sys.gen++
		s.settleLocked(sys, Off)
	case "ForceRestart", "GracefulRestart", "PowerCycle":
		if sys.state == On {
			sys.gen++
			s.settleLocked(sys, Off)
			s.transitionLocked(sys, On)
		}
	}
}

// --- HTTP --------------------------------------------------------------------------------------

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	idx := len(s.requests)
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path})
	f, faulted := s.takeFaultLocked(r)
	s.mu.Unlock()
	rec := &recorder{ResponseWriter: w}
	defer func() {
		s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "status", rec.status, "fault", faulted)
		s.mu.Lock()
		s.requests[idx].Status = rec.status
		s.requests[idx].Reset = rec.reset
		s.mu.Unlock()
	}()
	if faulted && f.Delay > 0 {
		t := time.NewTimer(f.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		case <-s.stop:
			t.Stop()
			return
		}
	}
	if faulted && f.Answer != nil {
		f.Answer(rec, r)
		return
	}
	if faulted && (f.Drop || f.Status != 0) {
		if f.Drop {
			if f.Handled {
				lost := &recorder{ResponseWriter: &discardWriter{h: http.Header{}}}
				s.route(lost, r)
				rec.reset = lost.reset
			}
			_, _ = io.Copy(io.Discard, r.Body)
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					_ = c.Close()
					return
				}
			}
			panic(http.ErrAbortHandler) // HTTP/2: abort the stream
		}
		if f.RetryAfter > 0 {
			secs := int((f.RetryAfter + time.Second - 1) / time.Second)
			w.Header().Set("Retry-After", strconv.Itoa(secs))
		}
		writeError(rec, f.Status, "Base.1.0.GeneralError", "injected fault")
		return
	}
	s.route(rec, r)
}

type recorder struct {
	http.ResponseWriter
	status int
	reset  string
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// discardWriter swallows a response whose connection is about to be dropped.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(int)             {}

func (s *Server) takeFaultLocked(r *http.Request) (Fault, bool) {
	for i := range s.faults {
		f := &s.faults[i]
		if f.Method != "" && f.Method != r.Method {
			continue
		}
		if f.PathSuffix != "" && !strings.HasSuffix(r.URL.Path, f.PathSuffix) {
			continue
		}
		got := *f
		f.Count--
		if f.Count <= 0 {
			s.faults = slices.Delete(s.faults, i, i+1)
		}
		return got, true
	}
	return Fault{}, false
}

func (s *Server) route(w *recorder, r *http.Request) {
	p := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case p == "/redfish" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{"v1": rootPath})
		return
	case p == "/redfish/v1" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, s.serviceRoot())
		return
	case p == sessionsPath && r.Method == http.MethodPost && !s.opts.NoSessionService:
		s.createSession(w, r)
		return
	}
	if !s.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Basic realm="redfishtest"`)
		writeError(w, http.StatusUnauthorized, "Base.1.0.NoValidSession", "authentication required")
		return
	}
	switch {
	case p == systemsPath && r.Method == http.MethodGet:
		s.mu.Lock()
		members := make([]any, 0, len(s.systems))
		for _, sys := range s.systems {
			members = append(members, map[string]any{"@odata.id": systemsPath + "/" + sys.cfg.ID})
		}
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, collection(systemsPath, "ComputerSystemCollection", "Computer System Collection", members))
	case strings.HasPrefix(p, systemsPath+"/") && strings.HasSuffix(p, resetSuffix):
		if r.Method != http.MethodPost {
			methodNotAllowed(w, http.MethodPost)
			return
		}
		s.reset(w, r, strings.TrimSuffix(strings.TrimPrefix(p, systemsPath+"/"), resetSuffix))
	case strings.HasPrefix(p, systemsPath+"/") && !strings.Contains(strings.TrimPrefix(p, systemsPath+"/"), "/"):
		if r.Method != http.MethodGet {
			methodNotAllowed(w, http.MethodGet)
			return
		}
		s.mu.Lock()
		sys := s.systemLocked(strings.TrimPrefix(p, systemsPath+"/"))
		var body map[string]any
		if sys != nil {
			body = computerSystem(sys)
		}
		s.mu.Unlock()
		if body == nil {
			writeError(w, http.StatusNotFound, "Base.1.0.ResourceMissingAtURI", "no such resource: "+p)
			return
		}
		writeJSON(w, http.StatusOK, body)
	case p == sessSvcPath && r.Method == http.MethodGet && !s.opts.NoSessionService:
		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.type":    "#SessionService.v1_1_8.SessionService",
			"@odata.id":      sessSvcPath,
			"@odata.context": "/redfish/v1/$metadata#SessionService.SessionService",
			"Id":             "SessionService", "Name": "Session Service",
			"ServiceEnabled": true, "SessionTimeout": 1800,
			"Status":   map[string]any{"State": "Enabled", "Health": "OK"},
			"Sessions": map[string]any{"@odata.id": sessionsPath},
		})
	case p == sessionsPath && r.Method == http.MethodGet && !s.opts.NoSessionService:
		s.mu.Lock()
		members := make([]any, 0, len(s.sessions))
		for _, id := range s.sessions {
			members = append(members, map[string]any{"@odata.id": sessionsPath + "/" + id})
		}
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, collection(sessionsPath, "SessionCollection", "Session Collection", members))
	case strings.HasPrefix(p, sessionsPath+"/") && !s.opts.NoSessionService:
		s.session(w, r, strings.TrimPrefix(p, sessionsPath+"/"))
	default:
		writeError(w, http.StatusNotFound, "Base.1.0.ResourceMissingAtURI", "no such resource: "+p)
	}
}

func (s *Server) serviceRoot() map[string]any {
	root := map[string]any{
		"@odata.type":    "#ServiceRoot.v1_11_0.ServiceRoot",
		"@odata.id":      rootPath,
		"@odata.context": "/redfish/v1/$metadata#ServiceRoot.ServiceRoot",
		"Id":             "RootService",
		"Name":           "Root Service",
		"RedfishVersion": "1.15.0",
		"UUID":           "7c6c4d36-0e5b-4e8a-9d0b-72656466697368",
		"Product":        "activator redfishtest",
		"Vendor":         "activator",
		"Systems":        map[string]any{"@odata.id": systemsPath},
	}
	if !s.opts.NoSessionService {
		root["SessionService"] = map[string]any{"@odata.id": sessSvcPath}
		root["Links"] = map[string]any{"Sessions": map[string]any{"@odata.id": sessionsPath}}
	}
	return root
}

func computerSystem(sys *system) map[string]any {
	id := systemsPath + "/" + sys.cfg.ID
	return map[string]any{
		"@odata.type":    "#ComputerSystem.v1_20_0.ComputerSystem",
		"@odata.id":      id,
		"@odata.context": "/redfish/v1/$metadata#ComputerSystem.ComputerSystem",
		"Id":             sys.cfg.ID,
		"Name":           sys.cfg.Name,
		"SystemType":     "Physical",
		"PowerState":     sys.state,
		"Status":         map[string]any{"State": "Enabled", "Health": "OK"},
		"Actions": map[string]any{
			"#ComputerSystem.Reset": map[string]any{
				"target":                            id + resetSuffix,
				"ResetType@Redfish.AllowableValues": sys.cfg.ResetTypes,
			},
		},
	}
}

func collection(id, typ, name string, members []any) map[string]any {
	return map[string]any{
		"@odata.type":         "#" + typ + "." + typ,
		"@odata.id":           id,
		"@odata.context":      "/redfish/v1/$metadata#" + typ + "." + typ,
		"Name":                name,
		"Members@odata.count": len(members),
		"Members":             members,
	}
}

func (s *Server) reset(w *recorder, r *http.Request, id string) {
	var body struct {
		ResetType string `json:"ResetType"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil || body.ResetType == "" {
		writeError(w, http.StatusBadRequest, "Base.1.0.ActionParameterMissing", "ResetType is required")
		return
	}
	s.mu.Lock()
	sys := s.systemLocked(id)
	ok := sys != nil && s.resetLocked(sys, body.ResetType)
	s.mu.Unlock()
	switch {
	case sys == nil:
		writeError(w, http.StatusNotFound, "Base.1.0.ResourceMissingAtURI", "no such system: "+id)
	case !ok:
		writeError(w, http.StatusBadRequest, "Base.1.0.ActionParameterValueNotInList",
			fmt.Sprintf("ResetType %q is not supported by this system", body.ResetType))
	default:
		w.reset = body.ResetType
		s.log.Info("reset", "system", id, "reset_type", body.ResetType)
		w.WriteHeader(http.StatusNoContent)
	}
}

func (s *Server) createSession(w *recorder, r *http.Request) {
	var body struct {
		UserName string `json:"UserName"`
		Password string `json:"Password"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.0.MalformedJSON", "malformed session request")
		return
	}
	if s.opts.Username != "" && !s.credentialsOK(body.UserName, body.Password) {
		s.loginRefused(body.UserName, "session")
		writeError(w, http.StatusUnauthorized, "Base.1.0.NoValidSession", "invalid user name or password")
		return
	}
	s.mu.Lock()
	s.nextSess++
	id := fmt.Sprintf("S%04d", s.nextSess)
	token := fmt.Sprintf("tok-%d-%d", time.Now().UnixNano(), s.nextSess)
	s.sessions[token] = id
	s.mu.Unlock()
	loc := sessionsPath + "/" + id
	w.Header().Set("X-Auth-Token", token)
	w.Header().Set("Location", loc)
	writeJSON(w, http.StatusCreated, sessionBody(id, body.UserName))
}

func sessionBody(id, user string) map[string]any {
	return map[string]any{
		"@odata.type":    "#Session.v1_3_0.Session",
		"@odata.id":      sessionsPath + "/" + id,
		"@odata.context": "/redfish/v1/$metadata#Session.Session",
		"Id":             id, "Name": "User Session", "UserName": user,
	}
}

func (s *Server) session(w *recorder, r *http.Request, id string) {
	s.mu.Lock()
	token := ""
	for t, sid := range s.sessions {
		if sid == id {
			token = t
		}
	}
	if token != "" && r.Method == http.MethodDelete {
		delete(s.sessions, token)
	}
	s.mu.Unlock()
	switch {
	case token == "":
		writeError(w, http.StatusNotFound, "Base.1.0.ResourceMissingAtURI", "no such session")
	case r.Method == http.MethodDelete:
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, sessionBody(id, s.opts.Username))
	default:
		methodNotAllowed(w, "GET, DELETE")
	}
}

func (s *Server) authorized(r *http.Request) bool {
	if s.opts.Username == "" {
		return true
	}
	if tok := r.Header.Get("X-Auth-Token"); tok != "" {
		s.mu.Lock()
		_, ok := s.sessions[tok]
		s.mu.Unlock()
		return ok
	}
	if u, p, ok := r.BasicAuth(); ok && !s.opts.NoBasicAuth {
		if !s.credentialsOK(u, p) {
			s.loginRefused(u, "basic")
			return false
		}
		return true
	}
	return false
}

func (s *Server) credentialsOK(user, pass string) bool {
	s.mu.Lock()
	want := s.password
	s.mu.Unlock()
	u := subtle.ConstantTimeCompare([]byte(user), []byte(s.opts.Username))
	p := subtle.ConstantTimeCompare([]byte(pass), []byte(want))
	return u&p == 1
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writeError(w, http.StatusMethodNotAllowed, "Base.1.0.OperationNotAllowed", "method not allowed")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("OData-Version", "4.0")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers with a Redfish error response (DSP0266 §9.5.2.2).
func writeError(w http.ResponseWriter, status int, code, msg string) {
	if status == 0 {
		status = http.StatusInternalServerError
	}
	writeJSON(w, status, map[string]any{"error": map[string]any{
		"code":    code,
		"message": msg,
		"@Message.ExtendedInfo": []any{map[string]any{
			"@odata.type": "#Message.v1_1_1.Message",
			"MessageId":   code,
			"Message":     msg,
			"Severity":    "Critical",
		}},
	}})
}
