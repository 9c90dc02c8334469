package redfish

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"
)

// credsID is the fingerprint of a user name and password (rejections.fingerprint).
type credsID [sha256.Size]byte

// maxRejections bounds the credentials one BMC's rejections remember; the oldest is forgotten first.
const maxRejections = 16

// rejections remembers the credentials one BMC rejected (401 or 403), for every route a Provider
// opened on it, so that the background loops (the watch of an awake node, the undo of a failed wake)
// stop logging in with them: each failed login counts towards the account's lockout, and a loop that
// tried again at each round locked the account within the hour. Credentials are remembered by
// fingerprint, an HMAC under a key drawn for this process, never in plain. A fingerprint is forgotten
// once a call with those credentials succeeds (the BMC's side was put right). Safe for concurrent use.
type rejections struct {
	key [32]byte // the fingerprints' HMAC key

	mu  sync.Mutex // guards the fields below
	m   map[credsID]rejection
	seq uint64 // counts the rejections, to forget the oldest
}

// rejection is when the BMC last rejected one fingerprint, and its rank among the rejections.
type rejection struct {
	at  time.Time
	seq uint64
}

func newRejections() *rejections {
	r := &rejections{m: map[credsID]rejection{}}
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

// reject records that the BMC rejected id now.
func (r *rejections) reject(id credsID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	r.m[id] = rejection{at: time.Now(), seq: r.seq}
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
// or nil when it may: it is held back when it would have to log in (no client is logged in) with the
// credentials configured now and the BMC has rejected those, for this route or another one on it,
// with no success since. The round sends nothing, so the account's lockout counter does not move; it
// goes ahead once the credentials change or a call with them succeeds.
func (b *bmc) heldBack() error {
	b.mu.Lock()
	loggedIn := b.sess != nil
	b.mu.Unlock()
	if loggedIn {
		return nil
	}
	id, ok := b.current()
	if !ok {
		return nil
	}
	at, rejected := b.creds.rejected(id)
	if !rejected {
		return nil
	}
	return &BMCError{Op: fmt.Sprintf("log in to BMC %s as %q (route %q)", b.s.Endpoint, b.s.Username, b.route), Class: ErrCredentials,
		Detail: fmt.Sprintf("not sent: the BMC rejected these credentials at %s, and they have not changed since", at.Format(time.TimeOnly))}
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

// retryWhen says what makes a loop held back by rejected credentials log in again.
func (b *bmc) retryWhen() string {
	if b.s.Username == "" {
		return "a call to the BMC succeeds (a wake or sleep of a route on it)"
	}
	key, src := b.s.passwordSource()
	if key == "password_env" {
		return fmt.Sprintf("a call with these credentials succeeds (a wake or sleep of a route on this BMC), or a restart with a new %s", key)
	}
	return fmt.Sprintf("the content of %s %s changes, or a call with these credentials succeeds (a wake or sleep of a route on this BMC)", key, src)
}
