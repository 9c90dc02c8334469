package redfish

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/activator/activator/internal/tenant"
)

// credsID is the fingerprint of a user name and password (rejections.fingerprint).
type credsID [sha256.Size]byte

// maxRejections bounds the credentials one BMC's rejections remember; the oldest is forgotten first.
const maxRejections = 16

// retryRejected is how long, after the BMC rejected credentials, no login with credentials it has
// rejected goes to it again unless they change; then one login may try (the timed retry), whichever
// route of the BMC asks first, and the next one retryRejected after that. It is what notices a password
// put right on the BMC's side while the password file stays as it was. An hour, because BMC lockout
// policies (Redfish's AccountLockoutThreshold and AccountLockoutCounterResetAfter, and vendors' own)
// lock an account after as few as 3 failed logins counted over up to an hour: with one retry an hour,
// no hour sees more than 2 from one rejected password (the rejection that began the hold-back and one
// retry), where a shorter interval would put a third into some hour. Not a setting, so that it cannot
// be set to one that does.
const retryRejected = time.Hour

// rejections remembers the credentials one BMC rejected (401 or 403 to a login), for every route a
// Provider opened on it, so that no login with them goes to the BMC again until they change, a call
// with them succeeds, or the timed retry (retryRejected) comes: each failed login counts towards the
// account's lockout, and wakes under steady requests (one each backoff.max) or background loops that
// logged in again each time locked the account within the hour. Credentials are remembered by
// fingerprint, an HMAC under a key drawn for this process, never in plain. A fingerprint is forgotten
// once a call with those credentials succeeds (the BMC's side was put right). Safe for concurrent use.
type rejections struct {
	key     [32]byte         // the fingerprints' HMAC key
	now     func() time.Time // the clock: time.Now, or a test's
	oneShot bool             // Options.OneShot: the process checks and exits (remedy)

	mu  sync.Mutex // guards the fields below
	m   map[credsID]rejection
	seq uint64 // counts the rejections, to forget the oldest
	// retryAt is when a login with rejected credentials may next go to the BMC (the timed retry):
	// retryRejected after the last rejection or the last retry, for all the credentials of this BMC, so
	// that however many routes and passwords it has, it sees one such login per retryRejected.
	retryAt time.Time
	// pilots are the logins in flight to the BMC, by fingerprint, that the logins with the same
	// credentials wait for (see admit).
	pilots map[credsID]*pilot
}

// pilot is a login in flight whose outcome the logins with the same credentials wait for.
type pilot struct {
	done chan struct{} // closed when it has landed; ok is set before
	ok   bool          // the BMC took the credentials
}

// rejection is when the BMC last rejected one fingerprint, and its rank among the rejections.
type rejection struct {
	at  time.Time
	seq uint64
}

// newRejections returns an empty record whose clock is now (nil: time.Now).
func newRejections(now func() time.Time, oneShot bool) *rejections {
	if now == nil {
		now = time.Now
	}
	r := &rejections{m: map[credsID]rejection{}, now: now, oneShot: oneShot, pilots: map[credsID]*pilot{}}
	_, _ = rand.Read(r.key[:]) // never fails (crypto/rand)
	return r
}

// fingerprint identifies user and pass without keeping the password.
func (r *rejections) fingerprint(user, pass string) credsID {
	h := hmac.New(sha256.New, r.key[:])
	h.Write([]byte(user))
	h.Write([]byte{0})
	h.Write([]byte(pass))
	var id credsID
	h.Sum(id[:0])
	return id
}

// reject records that the BMC rejected id now, and puts the timed retry retryRejected off.
func (r *rejections) reject(id credsID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	r.seq++
	r.m[id] = rejection{at: now, seq: r.seq}
	r.retryAt = now.Add(retryRejected)
	for len(r.m) > maxRejections {
		oldest, low := id, r.seq
		for k, rj := range r.m {
			if rj.seq < low {
				oldest, low = k, rj.seq
			}
		}
		delete(r.m, oldest)
	}
}

// accept forgets id: a call with it succeeded.
func (r *rejections) accept(id credsID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, id)
}

// rejected reports whether the BMC rejected id with no success since, and when it last did.
func (r *rejections) rejected(id credsID) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rj, ok := r.m[id]
	return rj.at, ok
}

// isRejected reports whether the BMC rejected id with no success since.
func (r *rejections) isRejected(id credsID) bool {
	_, ok := r.rejected(id)
	return ok
}

// hold is why a login with one fingerprint does not go to the BMC: when the BMC last rejected it, and
// when the timed retry comes.
type hold struct {
	at, retryAt time.Time
}

// heldLocked reports whether a login with id may go to the BMC: nil when the BMC has not rejected id
// (since its last success), or when it has but the timed retry is due; else when it rejected id and
// when the retry comes. With claim, a retry that is due is taken (retry is true): the next one is
// retryRejected from now, so that of the logins asking at once only this one goes (the caller logs in
// at once).
func (r *rejections) heldLocked(id credsID, claim bool) (h *hold, retry bool) {
	return r.heldLockedBy(id, claim, false)
}

// heldLockedBy is heldLocked, where operator (a wake or sleep an operator asked for by name:
// tenant.IsByOperator) takes the retry whether or not it is due, and claims it: the person who fixed the
// account on the BMC side, with the password file unchanged, need not wait up to retryRejected, and
// the retry they take is the hour's one.
func (r *rejections) heldLockedBy(id credsID, claim, operator bool) (h *hold, retry bool) {
	rj, ok := r.m[id]
	if !ok {
		return nil, false
	}
	now := r.now()
	if now.Before(r.retryAt) && !(operator && claim) {
		return &hold{at: rj.at, retryAt: r.retryAt}, false
	}
	if claim {
		r.retryAt = now.Add(retryRejected)
	}
	return nil, claim
}

// held is heldLocked without claiming the timed retry: whether a login with id would be held back now.
func (r *rejections) held(id credsID) *hold {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, _ := r.heldLocked(id, false)
	return h
}

// errNoPilot: the logins with the same credentials that a login waited for all ended without an answer.
var errNoPilot = fmt.Errorf("%d logins in a row with the same credentials ended without an answer from the BMC", maxAttempts)

// admission is what admit decided for a login that may go to the BMC.
type admission struct {
	// landed is called once the login has landed and its outcome is noted (reject, accept), with ok
	// when the BMC took the credentials.
	landed func(ok bool)
	retry  bool // the login is the timed retry of rejected credentials
}

// admit is the gate of a login with id. It returns the hold when the login must not go to the BMC
// (heldLocked, claiming a timed retry that is due), else the admission. While a login with id is in
// flight, the others with id wait for it (or for ctx), then go on when the BMC took the credentials,
// are held back when it rejected them, and otherwise ask again: so logins that start together, such as
// a fleet's members waking at once, cost one failed login between them, not one each. Logins with
// credentials the BMC takes are delayed by one login at most.
func (r *rejections) admit(ctx context.Context, id credsID) (*admission, *hold, error) {
	for range maxAttempts {
		r.mu.Lock()
		h, retry := r.heldLockedBy(id, true, tenant.IsByOperator(ctx))
		if h != nil {
			r.mu.Unlock()
			return nil, h, nil
		}
		p := r.pilots[id]
		if p == nil {
			p = &pilot{done: make(chan struct{})}
			r.pilots[id] = p
			r.mu.Unlock()
			return &admission{retry: retry, landed: func(ok bool) {
				r.mu.Lock()
				delete(r.pilots, id)
				p.ok = ok
				r.mu.Unlock()
				close(p.done)
			}}, nil, nil
		}
		r.mu.Unlock()
		select {
		case <-p.done:
		case <-ctx.Done():
			return nil, nil, context.Cause(ctx)
		}
		if p.ok {
			return &admission{landed: func(bool) {}}, nil, nil
		}
	}
	return nil, nil, errNoPilot
}

// nextRetry is when the timed retry comes (see admit).
func (r *rejections) nextRetry() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.retryAt
}

// current returns the fingerprint of the credentials configured now (read afresh, as a login does),
// or false when they cannot be read: the login will say why.
func (b *bmc) current() (credsID, bool) {
	pass, err := b.s.password()
	if err != nil {
		return credsID{}, false
	}
	return b.creds.fingerprint(b.s.Username, pass), true
}

// heldBack returns the error of a background round (the watch, the undo) that must not go to the BMC,
// or nil when it may: it is held back when it would have to log in (no client is logged in, or a
// basic-auth one whose credentials the BMC has rejected since, which client drops) with the
// credentials configured now, the BMC has rejected those, for this route or another one on it, with no
// success since, and the timed retry is not due. The round sends nothing, so the account's lockout
// counter does not move; it goes ahead once the credentials change, a call with them succeeds, or the
// retry is due (the round's login then takes it, unless another route's login took it first).
func (b *bmc) heldBack() error {
	b.mu.Lock()
	sess := b.sess
	b.mu.Unlock()
	if sess != nil && !(sess.basic && b.creds.isRejected(sess.creds)) {
		return nil // a client that need not log in (see client)
	}
	id, ok := b.current()
	if !ok {
		return nil
	}
	if h := b.creds.held(id); h != nil {
		return b.heldErr(id, h)
	}
	return nil
}

// admit is the gate of every login with credentials (id their fingerprint; see rejections.admit):
// it returns the func to call once the login has landed and its outcome is noted, or the error that
// says why the login does not go to the BMC. A login let through by the timed retry says so in the log.
func (b *bmc) admit(ctx context.Context, id credsID) (landed func(ok bool), err error) {
	a, h, err := b.creds.admit(ctx, id)
	op := fmt.Sprintf("log in to BMC %s as %q (route %q)", b.s.Endpoint, b.s.Username, b.route)
	switch {
	case h != nil:
		return nil, b.heldErr(id, h)
	case errors.Is(err, errNoPilot):
		return nil, &BMCError{Op: op, Class: ErrAmbiguous, Detail: err.Error()}
	case err != nil:
		return nil, ended(op+": waiting for another login with the same credentials", err)
	case a.retry && tenant.IsByOperator(ctx):
		b.log.Info("trying credentials the BMC rejected once more: an operator asked for this wake or sleep by name; it takes the place of the timed retry",
			"endpoint", b.s.Endpoint, "user", b.s.Username)
	case a.retry:
		b.log.Info("trying credentials the BMC rejected once more: the timed retry, one login per BMC each "+retryRejected.String(),
			"endpoint", b.s.Endpoint, "user", b.s.Username)
	}
	return a.landed, nil
}

// heldErr is the ErrCredentials error of a login that was not sent (h says why), naming the BMC, the
// user, where the password comes from, when the BMC rejected it and what to do. It notes id as this
// route's rejected credentials, for Warning.
func (b *bmc) heldErr(id credsID, h *hold) error {
	b.setRejected(id)
	op := fmt.Sprintf("log in to BMC %s as %q (route %q)", b.s.Endpoint, b.s.Username, b.route)
	if b.s.Username == "" {
		op = fmt.Sprintf("connect to BMC %s (no auth, route %q)", b.s.Endpoint, b.route)
	}
	return &BMCError{Op: op, Class: ErrCredentials,
		Detail: fmt.Sprintf("not sent: the BMC rejected these credentials at %s and they have not changed since; each login with them would count towards the account's lockout. %s",
			h.at.Format(time.TimeOnly), b.remedy(h.retryAt))}
}

// remedy says what to do about rejected credentials, and when the timed retry comes. In a process that
// checks and exits (Options.OneShot) it names only the fixes, not the server's commands and retry.
func (b *bmc) remedy(retryAt time.Time) string {
	if b.creds.oneShot {
		const once = " (this check sends rejected credentials once per run, for the first route that uses them)"
		if b.s.Username == "" {
			return "Set username and a password, or put the BMC right" + once
		}
		key, src := b.s.passwordSource()
		return fmt.Sprintf("Put the right password in %s %s, or put the account right on the BMC", key, src) + once
	}
	retry := fmt.Sprintf("no login is tried before the timed retry at %s", retryAt.Format(time.TimeOnly))
	if b.s.Username == "" {
		return "Set username and a password, or put the BMC right: " + retry
	}
	key, src := b.s.passwordSource()
	if key == "password_env" {
		return fmt.Sprintf("Put the right password in %s %s and restart, or put the account right on the BMC: %s", key, src, retry)
	}
	return fmt.Sprintf("Put the right password in %s %s (it is read again at each wake, sleep and watch round), or put the account right on the BMC and try at once with `activator wake %s` (or `activator sleep %s`, for a node to be off): %s",
		key, src, operatorRoute(b.route), operatorRoute(b.route), retry)
}

// operatorRoute is the route an operator names to wake or put to sleep the route named route: a fleet
// member's route ("pool.c", registry.Route.MemberRoute) is woken and put to sleep with its fleet's
// ("pool"); a route's name has no dot of its own.
func operatorRoute(route string) string {
	if fleet, _, ok := strings.Cut(route, "."); ok && fleet != "" {
		return fleet
	}
	return route
}

// setRejected notes id as the credentials of this route the BMC rejected (see warning).
func (b *bmc) setRejected(id credsID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rejectedID = &id
}

// rejectedCreds returns the fingerprint of this route's credentials the BMC rejected (see setRejected).
func (b *bmc) rejectedCreds() (credsID, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rejectedID == nil {
		return credsID{}, false
	}
	return *b.rejectedID, true
}

// clearRejected forgets the route's rejected credentials, and the hold-back its loops logged: a call
// with its credentials succeeded.
func (b *bmc) clearRejected() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rejectedID = nil
	b.loopWarned = nil
}

// warnLoop notes that loop is held back on the credentials id, and reports whether that is news to
// log: false when it is the hold-back logged last, with no call succeeding and no round of a loop
// getting through since.
func (b *bmc) warnLoop(loop string, id credsID) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := loopWarning{loop: loop, id: id}
	if b.loopWarned != nil && *b.loopWarned == w {
		return false
	}
	b.loopWarned = &w
	return true
}

// loopWarnedNow reports whether a loop's hold-back was logged, and not yet said to be over.
func (b *bmc) loopWarnedNow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.loopWarned != nil
}

// loopWarnedOff forgets the hold-back the loops logged: a loop's round got through, and says so.
func (b *bmc) loopWarnedOff() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.loopWarned = nil
}

// warning says, without I/O, that the BMC rejected the route's credentials and what sends nothing to
// it because of that (loop: the background loop held back, "" for none), or "" once those credentials
// are no longer held rejected (a call with them succeeded, here or on another route of the BMC). A
// password file that changed is noticed at the next wake, sleep or watch round, which read it.
func (b *bmc) warning(loop string) string {
	id, ok := b.rejectedCreds()
	if !ok {
		return ""
	}
	at, ok := b.creds.rejected(id)
	if !ok {
		return ""
	}
	what := "wakes and sleeps send"
	switch {
	case b.s.Username == "" && loop == "":
		return "" // with no account to lock, wakes and sleeps are not held back
	case b.s.Username == "":
		what = "the " + loop + " sends"
	case loop != "":
		what = "wakes, sleeps and the " + loop + " send"
	}
	return fmt.Sprintf("the BMC %s rejected the credentials at %s: %s nothing to it until %s",
		b.s.Endpoint, at.Format(time.TimeOnly), what, b.retryWhen())
}

// loginAgain says why logging in again after the BMC rejected sess cannot help, or "" when it may: the
// credentials configured now are ones the BMC has rejected already, or, with basic auth, the very ones
// sess sent with the request just rejected.
func (b *bmc) loginAgain(sess *session) string {
	id, ok := b.current()
	switch {
	case !ok:
		return "" // the login says why the credentials cannot be read
	case sess.basic && id == sess.creds:
		return "basic auth sent these credentials with the rejected request, and they have not changed"
	}
	if _, rejected := b.creds.rejected(id); rejected {
		return "the BMC has rejected these credentials before, and they have not changed"
	}
	return ""
}

// heldAttrs are the log attributes of a background loop that stopped logging in: the BMC, the user,
// where the password comes from, and what makes the loop log in again.
func (b *bmc) heldAttrs() []any {
	if b.s.Username == "" {
		return []any{"endpoint", b.s.Endpoint, "retry_when", b.retryWhen()}
	}
	key, src := b.s.passwordSource()
	return []any{"endpoint", b.s.Endpoint, "user", b.s.Username, key, src, "retry_when", b.retryWhen()}
}

// retryWhen says what makes a login with credentials the BMC rejected go to it again.
func (b *bmc) retryWhen() string {
	retry := fmt.Sprintf("the timed retry at %s (one login per BMC each %v)", b.creds.nextRetry().Format(time.TimeOnly), retryRejected)
	if b.s.Username == "" {
		return "a call to the BMC succeeds, or " + retry
	}
	const success = "a call with these credentials succeeds (by a route on this BMC still logged in)"
	key, src := b.s.passwordSource()
	if key == "password_env" {
		return fmt.Sprintf("%s, %s, or a restart with a new %s", success, retry, key)
	}
	return fmt.Sprintf("the content of %s %s changes, %s, or %s", key, src, success, retry)
}
