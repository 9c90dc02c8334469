package redfish

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"

	"github.com/activator/activator/internal/tenant"
)

// maxAmbiguous bounds the attempts of one read or one Reset when the BMC's answers are ambiguous
// (throttled attempts are bounded by the phase budget instead, and by maxAttempts overall).
const (
	maxAmbiguous = 5
	maxAttempts  = 20
)

// bmc is one route's connection to its BMC: a gofish client created lazily, logged in (with the
// credentials read afresh at each login) and reused; after a 401 or 403 on a reused client it logs in
// once more, unless that cannot help (see loginAgain). Every call first waits at gate, the BMC's
// throttle gate that it shares with the other routes on the same endpoint; the credentials the BMC
// rejects are noted in creds, shared likewise. Safe for concurrent use.
type bmc struct {
	s     *Settings
	log   *slog.Logger
	route string // the route's name, for errors
	httpc *http.Client
	live  *liveness
	gate  *throttleGate
	creds *rejections

	loginMu sync.Mutex // held while logging in

	mu      sync.Mutex // guards the fields below
	sess    *session   // the logged-in client; nil before the first login and after a rejection
	sysURI  string     // the ComputerSystem's @odata.id, once found
	node    string     // how messages name the node: the system's Id once known
	secrets []string
	// rejectedID is the fingerprint of this route's credentials that the BMC rejected, or that a login
	// was held back for, until a call succeeds (see warning); nil when none.
	rejectedID *credsID
	// loopWarned is the hold-back of a background loop last logged at WARN (see roundRead), until a
	// call succeeds (as rejectedID) or a loop's round gets through. It is kept here, not in the loop,
	// because a held-back sleep starts the watch anew at each idle window: one line for one condition.
	loopWarned *loopWarning
}

// loopWarning is one background loop's hold-back, as logged: the loop's name and the fingerprint of
// the rejected credentials.
type loopWarning struct {
	loop string
	id   credsID
}

// session is a logged-in client and what it logged in with.
type session struct {
	api   *gofish.APIClient
	creds credsID // the fingerprint of its user name and password
	basic bool    // basic auth: every request carries the password
}

func newBMC(s *Settings, log *slog.Logger, route, node string, ep *endpointState) (*bmc, error) {
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		MaxIdleConns:        4,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: s.Timeout.D(),
	}
	if strings.HasPrefix(s.Endpoint, "https:") {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if s.TLS.CAFile != "" {
			pool, err := loadCAs(s.TLS.CAFile)
			if err != nil {
				return nil, tenant.Terminal(fmt.Errorf("route %q: tls.ca_file: %w", route, err))
			}
			cfg.RootCAs = pool
		}
		if s.TLS.InsecureSkipVerify {
			cfg.InsecureSkipVerify = true
			log.Warn("TLS certificate verification of the BMC is OFF (tls.insecure_skip_verify): anyone on the path can impersonate it and capture its credentials", "endpoint", s.Endpoint)
		}
		tr.TLSClientConfig = cfg
	} else if s.Username != "" {
		log.Warn("BMC endpoint is plain http: credentials travel unencrypted", "endpoint", s.Endpoint)
	}
	origin, err := url.Parse(s.Endpoint)
	if err != nil {
		return nil, tenant.Terminal(fmt.Errorf("route %q: endpoint: %w", route, err))
	}
	live := &liveness{}
	throttle := &throttleTransport{next: tr, live: live, gate: ep.gate, floor: s.PollInterval.D(), origin: origin}
	return &bmc{
		s:     s,
		log:   log,
		route: route,
		live:  live,
		gate:  ep.gate,
		creds: ep.creds,
		// The client-wide timeout backs up the per-call contexts (gofish's Logout may drop its context).
		// No redirect is followed: Go would carry X-Auth-Token to any host, and the password (a
		// session's login body, basic auth) on a 307 or 308; a BMC has no reason to send one.
		httpc: &http.Client{Transport: throttle, Timeout: s.Timeout.D(), CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}},
		node: node,
	}, nil
}

// liveness records when the BMC last answered and since when it has left requests unanswered, so that
// a timeout can say the BMC went silent rather than only what state the node was last seen in.
type liveness struct {
	mu         sync.Mutex // guards the fields below
	lastAnswer time.Time  // when the last answer (of any status) arrived
	silentFrom time.Time  // when the oldest request unanswered since lastAnswer was sent; zero if none
}

func (l *liveness) record(sent time.Time, answered bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if answered {
		l.lastAnswer, l.silentFrom = time.Now(), time.Time{}
	} else if l.silentFrom.IsZero() || sent.Before(l.silentFrom) {
		l.silentFrom = sent
	}
}

// silence reports since when the BMC has answered nothing, if it has been silent for at least
// atLeast, and when it last answered.
func (l *liveness) silence(atLeast time.Duration) (since, last time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.silentFrom.IsZero() || time.Since(l.silentFrom) < atLeast {
		return time.Time{}, l.lastAnswer, false
	}
	return l.silentFrom, l.lastAnswer, true
}

// throttleTransport turns 429 and 503 answers into a *throttledError carrying Retry-After, which gofish
// would otherwise drop along with the headers, and holds gate for as long (for floor without
// Retry-After), which every call to the BMC waits out first. It also tells live whether each request
// was answered.
type throttleTransport struct {
	next  http.RoundTripper
	live  *liveness
	gate  *throttleGate
	floor time.Duration // the hold of a throttle without Retry-After: the first pause of the retry backoff
	// origin is the endpoint's URL: every request must go to its scheme and host (see RoundTrip).
	origin *url.URL
}

// maxAnswer bounds the body of every answer read from the BMC. Redfish documents are kilobytes; a
// BMC that sends more is not one to trust with the activator's memory (gofish reads whole bodies, and
// decodes a collection's members into structs of kilobytes each).
const maxAnswer = 1 << 20

// maxRetryAfter bounds the hold a BMC's Retry-After puts on every route of its endpoint: a BMC that
// asked for a year (or for a date in 9999, or for more seconds than a Duration holds) would have made
// every wake and sleep fail at once until a restart. An hour is honoured; one still throttling after
// it asks again.
const maxRetryAfter = time.Hour

// misbehaved is an answer, or a link in one, that no honest BMC gives: a request aimed off the
// endpoint, a redirect, an answer over maxAnswer, more systems than maxSystems. classify files it as
// ErrRejected: asking again would meet the same.
type misbehaved struct{ what string }

func (e *misbehaved) Error() string { return e.what }

// cappedBody fails a read past maxAnswer bytes of the answer.
type cappedBody struct {
	io.ReadCloser
	left int64
}

func (c *cappedBody) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, &misbehaved{fmt.Sprintf("the BMC's answer is over %d bytes", maxAnswer)}
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.ReadCloser.Read(p)
	c.left -= int64(n)
	if c.left <= 0 && err == nil {
		// Exactly maxAnswer bytes and no more is fine: look once past them.
		var one [1]byte
		if m, _ := c.ReadCloser.Read(one[:]); m > 0 {
			return n, &misbehaved{fmt.Sprintf("the BMC's answer is over %d bytes", maxAnswer)}
		}
		err = io.EOF
	}
	return n, err
}

type throttledError struct {
	status     int
	retryAfter time.Duration
}

func (e *throttledError) Error() string { return fmt.Sprintf("HTTP %d", e.status) }

// RoundTrip refuses a request that is not for the endpoint's own scheme and host: gofish builds each
// URL by joining the endpoint and a path the BMC gave (a system's @odata.id, an action's target, a
// session's Location), and a path such as "@other.host/x" or ":8443/x" would carry the session token
// or the password elsewhere.
func (t *throttleTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if u := req.URL; u.Scheme != t.origin.Scheme || u.Host != t.origin.Host || u.User != nil {
		return nil, &misbehaved{fmt.Sprintf("the BMC's answer pointed a request at %s://%s, not the endpoint %s: refused", u.Scheme, u.Host, t.origin.Redacted())}
	}
	sent := time.Now()
	resp, err := t.next.RoundTrip(req)
	t.live.record(sent, err == nil)
	if err != nil {
		return resp, err
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 && resp.StatusCode != http.StatusNotModified {
		resp.Body.Close()
		return nil, &misbehaved{fmt.Sprintf("the BMC answered %s with a redirect (HTTP %d): not followed", req.URL.Path, resp.StatusCode)}
	}
	if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
		resp.Body = &cappedBody{ReadCloser: resp.Body, left: maxAnswer}
		return resp, nil
	}
	te := &throttledError{status: resp.StatusCode}
	if v := resp.Header.Get("Retry-After"); v != "" {
		if secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil && secs >= 0 {
			te.retryAfter = time.Duration(min(secs, int64(maxRetryAfter/time.Second))) * time.Second
		} else if at, err := http.ParseTime(v); err == nil {
			te.retryAfter = min(max(time.Until(at), 0), maxRetryAfter)
		}
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	t.gate.hold(cmp.Or(te.retryAfter, t.floor), te.status)
	return nil, te
}

// nodeName is how messages name the node.
func (b *bmc) nodeName() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.node
}

// redact removes every secret known to b from msg.
func (b *bmc) redact(msg string) string {
	b.mu.Lock()
	secrets := b.secrets
	b.mu.Unlock()
	for _, s := range secrets {
		if len(s) >= 4 {
			msg = strings.ReplaceAll(msg, s, "[redacted]")
		}
	}
	return msg
}

// maxSecrets bounds what redact scrubs to the newest secrets: each login adds its password and its
// session token, so an activator running for months would otherwise keep every token it was ever
// given and scan them all for every message. The password is re-added at every login, so it is
// always among the newest two.
const maxSecrets = 8

// addSecret makes s the newest secret redact scrubs. It builds a new list rather than change the old
// one in place: redact reads its copy of the slice without the lock.
func (b *bmc) addSecret(s string) {
	if s == "" {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	next := make([]string, 0, maxSecrets)
	for _, old := range b.secrets {
		if old != s {
			next = append(next, old)
		}
	}
	next = append(next, s)
	b.secrets = next[max(0, len(next)-maxSecrets):]
}

// classify maps an error from one call to a *BMCError of one class, or to the caller's context error
// when ctx (the caller's, not the per-call timeout) is done. A deadline that has passed counts as done
// even before ctx says so: a call cut by it can fail ("i/o timeout") a moment before ctx's own timer
// fires, and would otherwise be blamed on the per-call timeout (health.ended says more).
func (b *bmc) classify(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if d, ok := ctx.Deadline(); ctx.Err() != nil || ok && !time.Now().Before(d) {
		return ended(op, cmp.Or(context.Cause(ctx), context.DeadlineExceeded))
	}
	var ce *schemas.CollectionError
	if errors.As(err, &ce) && len(ce.Failures) > 0 {
		// gofish gathers a collection's member failures in a map that does not unwrap: classify the
		// first (in link order) as the whole.
		links := slices.Sorted(maps.Keys(ce.Failures))
		err = ce.Failures[links[0]]
	}
	e := &BMCError{Op: op, Class: ErrAmbiguous}
	tlsErr := tlsProblem(err)
	var te *throttledError
	var re *schemas.Error
	var ns *errNoSystem
	var mb *misbehaved
	switch {
	case errors.As(err, &ns):
		e.Op, e.Class, e.Detail = "find system", ErrConfig, ns.msg
	case errors.As(err, &mb):
		e.Class, e.Detail = ErrRejected, mb.what
	case errors.As(err, &te):
		e.Class, e.Status, e.RetryAfter = ErrThrottled, te.status, te.retryAfter
	case errors.As(err, &re) && re.HTTPReturnedStatusCode != 0:
		e.Status = re.HTTPReturnedStatusCode
		e.Detail = redfishMessage(re)
		switch s := re.HTTPReturnedStatusCode; {
		case s == http.StatusUnauthorized || s == http.StatusForbidden:
			e.Class = ErrCredentials
		case s == http.StatusNotFound:
			e.Class = ErrConfig
		case s >= 500 || s == http.StatusRequestTimeout:
			e.Class = ErrAmbiguous
		default:
			e.Class = ErrRejected
		}
	case tlsErr != "":
		e.Class, e.Detail = ErrTLS, tlsErr
	case errors.Is(err, context.DeadlineExceeded):
		e.Detail = "no answer within the per-call timeout"
	default:
		e.Detail = err.Error()
	}
	if len(e.Detail) > 4096 { // redacted whole, then cut: a secret must not be cut in two first
		e.Detail = e.Detail[:4096]
	}
	e.Detail = b.redact(e.Detail)
	if len(e.Detail) > 200 {
		e.Detail = strings.ToValidUTF8(e.Detail[:200], "") + "..."
	}
	return e
}

// tlsProblem describes a TLS or certificate failure in err, with what to do about it; "" when err is
// not one. Such failures are terminal: no retry fixes a certificate.
func tlsProblem(err error) string {
	var uae x509.UnknownAuthorityError
	var he x509.HostnameError
	var cie x509.CertificateInvalidError
	var cve *tls.CertificateVerificationError
	var rhe tls.RecordHeaderError
	var ae tls.AlertError
	switch {
	case errors.As(err, &uae):
		subject := "?"
		if uae.Cert != nil {
			subject = cmp.Or(uae.Cert.Subject.String(), uae.Cert.Issuer.String(), subject)
		}
		if len(subject) > 60 {
			subject = subject[:60] + "..."
		}
		return fmt.Sprintf("the BMC's certificate (%s) is signed by an unknown authority: put it, or the CA that signed it, in tls.ca_file", subject)
	case errors.As(err, &he):
		return fmt.Sprintf("the BMC's certificate does not match the endpoint (%v): use a host name the certificate names, or reissue it", he)
	case errors.As(err, &cie):
		return fmt.Sprintf("the BMC's certificate is not valid (%v): renew it, or fix this host's clock", cie)
	case errors.As(err, &cve):
		return fmt.Sprintf("the BMC's certificate cannot be verified (%v): check tls.ca_file", cve.Err)
	case errors.As(err, &rhe), strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		// net/http turns a record header that looks like HTTP into a plain error of its own.
		return "the BMC did not answer in TLS: is the endpoint plain http?"
	case errors.As(err, &ae):
		return fmt.Sprintf("the BMC refused the TLS handshake (%v)", ae)
	case strings.Contains(err.Error(), "x509: ") || strings.Contains(err.Error(), "tls: "):
		return "TLS handshake failed: " + err.Error()
	}
	return ""
}

// redfishMessage is the human part of a Redfish error answer.
func redfishMessage(re *schemas.Error) string {
	msg := re.Message
	if msg == "" && len(re.ExtendedInfos) > 0 {
		msg = re.ExtendedInfos[0].Message
	}
	if msg == "" {
		msg = re.Code
	}
	return msg
}

// client returns the logged-in client, logging in first if needed. Logins are serialized, so one
// backend holds at most one session. A basic-auth client whose credentials the BMC has rejected since
// (with another route's request, say) is dropped rather than used: each of its requests would carry
// them, a failed login each; the login that replaces it goes through the gate (see login).
func (b *bmc) client(ctx context.Context) (*session, error) {
	b.loginMu.Lock()
	defer b.loginMu.Unlock()
	b.mu.Lock()
	sess := b.sess
	b.mu.Unlock()
	if sess != nil && sess.basic && b.creds.isRejected(sess.creds) {
		b.forget(sess)
		sess = nil
	}
	if sess != nil {
		return sess, nil
	}
	sess, err := b.login(ctx)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.sess = sess
	b.mu.Unlock()
	return sess, nil
}

// login reads the credentials, connects and authenticates once: no retry, so rejected credentials cost
// exactly one attempt, which creds notes. It ends with an authenticated call (creating the session, or
// with basic auth a read of the Systems collection), so wrong credentials fail here and are never kept.
// Credentials the BMC has rejected are not sent again (see admit) until they change, a call with them
// succeeds or the timed retry is due: the login fails at once with ErrCredentials, saying why, whoever
// asked (a wake, a sleep, a check). Without a username there is no account whose lockout a login could
// count towards, so nothing is held back.
func (b *bmc) login(ctx context.Context) (sess *session, err error) {
	pass, err := b.s.password()
	if err != nil {
		return nil, &BMCError{Op: fmt.Sprintf("log in to BMC %s (route %q)", b.s.Endpoint, b.route), Class: ErrConfig, Detail: err.Error()}
	}
	b.addSecret(pass)
	id := b.creds.fingerprint(b.s.Username, pass)
	if b.s.Username != "" {
		landed, err := b.admit(ctx, id)
		if err != nil {
			return nil, err
		}
		// Run after the outcome is noted (rejectedIf, accepted) and the results are set.
		defer func() { landed(sess != nil) }()
	}
	cctx, cancel := context.WithTimeout(ctx, b.s.Timeout.D())
	defer cancel()
	basic := b.s.Auth == AuthBasic
	if b.s.Username != "" && !basic {
		sessions, err := b.offersSessions(cctx)
		if err != nil {
			return nil, b.classify(ctx, fmt.Sprintf("read service root of BMC %s (route %q)", b.s.Endpoint, b.route), err)
		}
		switch {
		case !sessions && b.s.Auth == AuthSession:
			return nil, &BMCError{Op: "log in", Class: ErrConfig, Detail: "auth is session, but the BMC's service root offers no SessionService"}
		case !sessions:
			basic = true
		}
	}
	cfg := gofish.ClientConfig{
		Endpoint:          b.s.Endpoint,
		Username:          b.s.Username,
		Password:          pass,
		BasicAuth:         basic,
		HTTPClient:        b.httpc,
		NoModifyTransport: true,
		ReuseConnections:  true,
	}
	mode := "no"
	switch {
	case b.s.Username != "" && basic:
		mode = AuthBasic
	case b.s.Username != "":
		mode = AuthSession
	}
	op := fmt.Sprintf("log in to BMC %s as %q (%s auth, route %q)", b.s.Endpoint, b.s.Username, mode, b.route)
	if b.s.Username == "" {
		op = fmt.Sprintf("connect to BMC %s (no auth, route %q)", b.s.Endpoint, b.route)
	}
	api, err := gofish.ConnectContext(cctx, cfg)
	if err != nil {
		return nil, b.rejectedIf(id, b.classify(ctx, op, err))
	}
	tok, err := api.GetSession()
	if err == nil {
		b.addSecret(tok.Token)
	}
	if b.s.Username != "" && !basic && (err != nil || tok == nil || tok.Token == "") {
		// Every call would go out without authentication, get 401 and log in again, each leaving a
		// session behind on the BMC until its table is full.
		return nil, &BMCError{Op: op, Class: ErrRejected, Detail: "the BMC answered the session login without a session token (X-Auth-Token)"}
	}
	if b.s.Username != "" && basic {
		// Basic auth sends the password with each request, and the service root needs none: prove it
		// now, so that a wrong password fails at login instead of being kept.
		resp, err := api.WithContext(cctx).Get(systemsURI)
		if err != nil {
			return nil, b.rejectedIf(id, b.classify(ctx, op, err))
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
	}
	b.log.Debug("logged in to BMC", "auth", mode)
	if b.s.Username != "" {
		// The BMC took the credentials: whatever the call that follows meets, they are not rejected.
		b.accepted(id)
	}
	return &session{api: api, creds: id, basic: basic}, nil
}

// rejectedIf notes id as rejected when err says the BMC rejected the credentials, and returns err.
func (b *bmc) rejectedIf(id credsID, err error) error {
	if errors.Is(err, ErrCredentials) {
		b.creds.reject(id)
		b.setRejected(id)
	}
	return err
}

// accepted notes that a call with id succeeded: the BMC's rejection of id, if any, is forgotten, for
// every route on it.
func (b *bmc) accepted(id credsID) {
	b.creds.accept(id)
	b.clearRejected()
}

// systemsURI is the Systems collection, at the URI Redfish mandates for it.
const systemsURI = "/redfish/v1/Systems"

// offersSessions reads the service root (no authentication needed) and reports whether it links a
// SessionService.
func (b *bmc) offersSessions(ctx context.Context) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.s.Endpoint+"/redfish/v1/", nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := b.httpc.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return false, err
	}
	if resp.StatusCode != http.StatusOK {
		return false, schemas.ConstructError(resp.StatusCode, body)
	}
	var root struct {
		SessionService *struct {
			ID string `json:"@odata.id"`
		}
		Links struct {
			Sessions *struct {
				ID string `json:"@odata.id"`
			}
		}
	}
	if err := json.Unmarshal(body, &root); err != nil {
		return false, fmt.Errorf("service root: %w", err)
	}
	return root.Links.Sessions != nil && root.Links.Sessions.ID != "" && root.SessionService != nil, nil
}

// forget drops a client the BMC rejected, so the next call logs in again.
func (b *bmc) forget(sess *session) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sess == sess {
		b.sess = nil
	}
}

// call runs fn once with a logged-in client bound to a per-call timeout, and classifies its error. It
// first waits out the BMC's throttle, if any (see throttleGate.wait), logging in included. A client
// the BMC rejects (401 or 403) is dropped. When it was a reused one (the BMC forgot or expired the
// session, or the password was rotated), call reads the credentials afresh and, unless that cannot
// help (loginAgain), logs in once more and repeats fn; a rejected fresh login is final. Credentials
// rejected in the end are noted in creds, and credentials that worked are cleared there. A rejected
// request notes its credentials only when it carried them, that is with basic auth, and only for a 401:
// a 403 to credentials the BMC took (an account without the privilege to Reset, say) or a 401 to a
// session token says nothing against the password, and noting it would hold back logins that work.
func (b *bmc) call(ctx context.Context, op string, fn func(c *gofish.APIClient) error) error {
	for try := 0; ; try++ {
		if err := b.gate.wait(ctx, op); err != nil {
			return err
		}
		b.mu.Lock()
		reused := b.sess != nil
		b.mu.Unlock()
		sess, err := b.client(ctx)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, b.s.Timeout.D())
		err = b.classify(ctx, op, fn(sess.api.WithContext(cctx)))
		cancel()
		if err == nil {
			b.accepted(sess.creds)
			return nil
		}
		if errors.Is(err, ErrCredentials) {
			b.forget(sess)
			if reused && try == 0 {
				why := b.loginAgain(sess)
				if why == "" {
					b.log.Info("BMC rejected the credentials in use; reading them again and logging in once more", "op", op, "err", err)
					continue
				}
				b.log.Info("BMC rejected the credentials in use; not logging in again: "+why, "op", op, "err", err)
				// Held back as a login with them would be: the error says so and what to do, and the
				// route warns (heldErr). Before, it was the session's bare 401, without either.
				if id, ok := b.current(); ok {
					if h := b.creds.held(id); h != nil {
						return b.heldErr(id, h)
					}
				}
			}
		}
		var be *BMCError
		if sess.basic && errors.As(err, &be) && be.Status == http.StatusUnauthorized {
			return b.rejectedIf(sess.creds, err)
		}
		return err
	}
}

// retry runs attempt until it succeeds, fails with a class that is not worth retrying, or the retry
// budget (attempt count, ctx deadline) runs out. Throttled attempts wait as long as the BMC asks (at the
// gate, in the next call); ambiguous ones, and throttled ones without Retry-After, back off
// exponentially from poll_interval, with jitter.
func (b *bmc) retry(ctx context.Context, attempt func() error) error {
	bo := &backoff.ExponentialBackOff{
		InitialInterval:     b.s.PollInterval.D(),
		RandomizationFactor: 0.2,
		Multiplier:          2,
		MaxInterval:         8 * b.s.PollInterval.D(),
	}
	bo.Reset()
	ambiguous := 0
	var prev error // the previous attempt's failure
	for n := 1; ; n++ {
		err := attempt()
		if err != nil && prev != nil && ctx.Err() != nil {
			// The budget ran out during this try, whose error says only that: the tries before say
			// what the BMC did ("no answer within the per-call timeout" from a BMC that hangs).
			return fmt.Errorf("%w (the try before: %v)", err, prev)
		}
		if err == nil || !retryable(err) || ctx.Err() != nil || n >= maxAttempts {
			return err
		}
		prev = err
		wait := bo.NextBackOff()
		var be *BMCError
		if errors.As(err, &be) && be.RetryAfter > 0 {
			wait = be.RetryAfter
		}
		if errors.Is(err, ErrAmbiguous) {
			if ambiguous++; ambiguous >= maxAmbiguous {
				return err
			}
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return err // the BMC asks for more time than the phase has left
		}
		b.log.Debug("retrying BMC call", "err", err, "wait", wait)
		if be != nil && be.RetryAfter > 0 {
			continue // the gate holds the next call for as long, and for every route on this BMC
		}
		if perr := pause(ctx, wait); perr != nil {
			return fmt.Errorf("%w (gave up waiting to retry: %w)", err, perr)
		}
	}
}

// pause waits d or until ctx is done.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// systemState is what one read of the ComputerSystem tells.
type systemState struct {
	ID         string
	PowerState string
	// Resets are the allowed Reset types (ResetType@Redfish.AllowableValues or the ActionInfo); nil
	// when the BMC does not say.
	Resets []string
	sys    *schemas.ComputerSystem
}

// readOnce reads the ComputerSystem once, finding it first if needed.
func (b *bmc) readOnce(ctx context.Context) (*systemState, error) {
	var st *systemState
	err := b.call(ctx, "read power state", func(c *gofish.APIClient) error {
		b.mu.Lock()
		uri := b.sysURI
		b.mu.Unlock()
		var sys *schemas.ComputerSystem
		if uri == "" {
			found, err := b.find(c)
			if err != nil {
				return err
			}
			sys = found
			b.mu.Lock()
			b.sysURI, b.node = sys.ODataID, clip(sys.ID)
			if b.s.System != "" && b.s.System != sys.ID {
				b.node = fmt.Sprintf("%s (%s)", b.s.System, clip(sys.ID))
			}
			b.mu.Unlock()
		} else {
			got, err := schemas.GetObject[schemas.ComputerSystem](c, uri)
			if err != nil {
				return err
			}
			sys = got
		}
		resets, err := sys.GetSupportedResetTypes()
		if err != nil {
			return err
		}
		st = &systemState{ID: clip(sys.ID), PowerState: clip(string(sys.PowerState)), sys: sys}
		if len(resets) > maxResetTypes {
			return &misbehaved{fmt.Sprintf("the BMC lists %d Reset types; Redfish defines 11", len(resets))}
		}
		for _, r := range resets {
			st.Resets = append(st.Resets, clip(string(r)))
		}
		return nil
	})
	return st, err
}

// maxResetTypes bounds the Reset types a system may list: Redfish defines 11, and each is printed in
// the error that says none of reset_order is among them.
const maxResetTypes = 32

// clip bounds a string the BMC gave (a system's Id, a power state, a Reset type) before it goes into
// messages, logs and the wake record: 128 bytes, cut on a character.
func clip(s string) string {
	if len(s) <= 128 {
		return s
	}
	return strings.ToValidUTF8(s[:128], "") + "..."
}

// errNoSystem is a configuration error found while looking for the system.
type errNoSystem struct{ msg string }

func (e *errNoSystem) Error() string { return e.msg }

// maxSystems bounds the Systems collection find reads. gofish's own reader (Service.Systems) decodes
// every member into a ComputerSystem of about 2.7 KB and fetches each, three at a time: a reply of 3 MB
// of empty members took 2.9 GB of heap.
const maxSystems = 256

// find returns the configured system from the Systems collection.
func (b *bmc) find(c *gofish.APIClient) (*schemas.ComputerSystem, error) {
	systems, err := listSystems(c)
	if err != nil {
		return nil, err
	}
	for _, s := range systems {
		if b.s.System != "" && (s.ID == b.s.System || s.Name == b.s.System) {
			return s, nil
		}
	}
	switch {
	case b.s.System == "" && len(systems) == 1:
		return systems[0], nil
	case b.s.System == "":
		return nil, &errNoSystem{fmt.Sprintf("the BMC has %d systems: %s; set system", len(systems), systemList(systems))}
	default:
		return nil, &errNoSystem{fmt.Sprintf("no system with Id or Name %q (have: %s)", b.s.System, systemList(systems))}
	}
}

// listSystems reads the Systems collection's member links (following Members@odata.nextLink) and
// then each member, at most maxSystems in all.
func listSystems(c *gofish.APIClient) ([]*schemas.ComputerSystem, error) {
	var links []string
	for next, pages := systemsURI, 0; next != ""; pages++ {
		if pages == maxSystems {
			return nil, &misbehaved{fmt.Sprintf("the BMC's Systems collection goes on past %d pages", maxSystems)}
		}
		resp, err := c.Get(next)
		if err != nil {
			return nil, err
		}
		var page struct {
			Members []struct {
				ID string `json:"@odata.id"`
			}
			Next string `json:"Members@odata.nextLink"`
		}
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("the Systems collection: %w", err)
		}
		for _, m := range page.Members {
			if m.ID != "" {
				links = append(links, m.ID)
			}
		}
		if len(links) > maxSystems {
			return nil, &misbehaved{fmt.Sprintf("the BMC lists over %d systems", maxSystems)}
		}
		next = page.Next
	}
	systems := make([]*schemas.ComputerSystem, 0, len(links))
	for _, l := range links {
		s, err := schemas.GetObject[schemas.ComputerSystem](c, l)
		if err != nil {
			return nil, err
		}
		systems = append(systems, s)
	}
	return systems, nil
}

// systemList names systems for an error, sorted by Id: each as its Id, with its Name beside it when
// that differs ("1 (WebFrontEnd483), 2 (Blade2)"), as system accepts either.
func systemList(systems []*schemas.ComputerSystem) string {
	names := make([]string, 0, len(systems))
	for _, s := range slices.SortedFunc(slices.Values(systems), func(a, b *schemas.ComputerSystem) int { return strings.Compare(a.ID, b.ID) }) {
		if s.Name != "" && s.Name != s.ID {
			names = append(names, fmt.Sprintf("%s (%s)", clip(s.ID), clip(s.Name)))
		} else {
			names = append(names, clip(s.ID))
		}
	}
	return strings.Join(names, ", ")
}

// read reads the ComputerSystem, retrying ambiguous and throttled failures within ctx.
func (b *bmc) read(ctx context.Context) (*systemState, error) {
	var st *systemState
	err := b.retry(ctx, func() error {
		var err error
		st, err = b.readOnce(ctx)
		return err
	})
	return st, err
}

// reset POSTs one Reset action, once: the caller decides whether a failed one may be re-issued. A
// system that offers no Reset action (no #ComputerSystem.Reset target) is a configuration error: gofish
// would POST to the endpoint itself, and the answer, whatever it is, says nothing of the node.
func (b *bmc) reset(ctx context.Context, st *systemState, rt string) error {
	if !hasResetTarget(st.sys.RawData) {
		return &BMCError{Op: "reset " + rt, Class: ErrConfig, Detail: fmt.Sprintf("system %s offers no Reset action (no #ComputerSystem.Reset target)", st.ID)}
	}
	return b.call(ctx, "reset "+rt, func(c *gofish.APIClient) error {
		st.sys.SetClient(c)
		_, err := st.sys.Reset(schemas.ResetType(rt))
		return err
	})
}

// hasResetTarget reports whether a ComputerSystem's JSON names a Reset action's target.
func hasResetTarget(raw []byte) bool {
	var sys struct {
		Actions struct {
			Reset struct {
				Target string `json:"target"`
			} `json:"#ComputerSystem.Reset"`
		}
	}
	return json.Unmarshal(raw, &sys) == nil && sys.Actions.Reset.Target != ""
}

// logout ends the session, if any, bounded by ctx: after the BMC's throttle, if ctx leaves time for it.
func (b *bmc) logout(ctx context.Context) {
	b.mu.Lock()
	sess := b.sess
	b.sess = nil
	b.mu.Unlock()
	if sess == nil {
		return
	}
	defer b.httpc.CloseIdleConnections()
	if err := b.gate.wait(ctx, "log out"); err != nil {
		b.log.Info("not logging out of a throttling BMC: the session is left to expire", "err", err)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, b.s.Timeout.D())
	defer cancel()
	sess.api.WithContext(cctx).Logout()
}
