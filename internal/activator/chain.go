package activator

// Requirements (requires:): what a route or instance needs awake before its own tenant starts, and the
// holds that keep it awake while the dependent is.
//
// A dependent's wake acquires each of its requirements the way a request does (acquireFor), so the
// requirement's own state machine is the single flight: a requirement shared by two routes that wake
// at the same moment is woken once, and the second route joins that wake. The hold the dependent gets
// back counts as one request in flight on the requirement for as long as the dependent is awake, so a
// requirement never idles out under an awake dependent, and its idle window starts when the last
// dependent has gone to sleep and let go. The graph has no cycles (the registry rejects them), so the
// locks are always taken dependent first.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/activator/activator/internal/tenant"
)

// phaseRequires is the phase of a wake that waits for its requirements.
const phaseRequires = "requires"

// triggerRequired: a dependent's wake needed the instance awake.
const triggerRequired trigger = "required"

// RequirementError is a wake that failed because one of its requirements did not wake.
type RequirementError struct {
	Instance string // the requirement
	Err      error  // its failure: a *WakeError, a *BackoffError, ErrClosed, …
}

func (e *RequirementError) Error() string {
	return fmt.Sprintf("requirement %q did not wake: %v", e.Instance, e.Err)
}

func (e *RequirementError) Unwrap() error { return e.Err }

// FaultClass is the requirement's class.
func (e *RequirementError) FaultClass() tenant.Class { return classOf(e.Err) }

// culprit is the requirement's own culprit when its failure named one, else the requirement itself.
func (e *RequirementError) culprit() *Culprit {
	var we *WakeError
	if errors.As(e.Err, &we) && we.Culprit != nil {
		return we.Culprit
	}
	return &Culprit{Instance: e.Instance, Class: string(classOf(e.Err))}
}

// RequiredError refuses to put an instance to sleep while awake dependents require it.
type RequiredError struct {
	Instance string
	By       []string // the dependents holding it, sorted
}

func (e *RequiredError) Error() string {
	return fmt.Sprintf("%q is required by %s, which are awake: put them to sleep first (an instance sleeps after its idle window once nothing requires it)",
		e.Instance, strings.Join(e.By, ", "))
}

// requirement is one requirement's part in a wake: the hold on it, or why there is none.
type requirement struct {
	release func()
	part    RequiredWake
	err     error
}

// wakeRequirements wakes in's requirements, all at once (each wakes its own first), and returns the
// holds that keep them awake. When one fails, the holds taken are given back at once (what was woken
// for this wake alone then sleeps after its idle window) and the error names it.
func (in *instance) wakeRequirements(ctx context.Context, rec *tracker) ([]func(), error) {
	names := in.route.Requires
	if len(names) == 0 {
		return nil, nil
	}
	rec.then(phaseRequires)
	got := make([]requirement, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() { got[i] = in.wakeRequirement(ctx, name) })
	}
	wg.Wait()
	var (
		holds []func()
		parts []RequiredWake
		err   error
	)
	for _, g := range got {
		parts = append(parts, g.part)
		if g.release != nil {
			holds = append(holds, g.release)
		}
		if err == nil {
			err = g.err
		}
	}
	rec.setRequires(parts)
	if err != nil {
		releaseAll(holds)
		return nil, err
	}
	return holds, nil
}

func (in *instance) wakeRequirement(ctx context.Context, name string) requirement {
	req := in.peer(name)
	if req == nil {
		err := &RequirementError{Instance: name, Err: fmt.Errorf("%w: %q", errNoRoute, name)}
		return requirement{part: RequiredWake{Instance: name, State: "failed"}, err: err}
	}
	var c holdCharge // no account: it only notes the wake it held on
	release, err := req.awaitWake(ctx, triggerRequired, &c)
	part := RequiredWake{Instance: name, State: "awake"}
	if c.wake != nil {
		w := c.wake.rec.snapshot()
		part.Wake, part.State = &w, "woken"
	}
	if err != nil && ctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		// This wake's own budget ended (or it was called off) while the requirement still woke: the
		// requirement did not fail, and its wake goes on. Blamed on it, the record named a culprit
		// that went on to wake fine (found with the real binary).
		part.State = "waking"
		return requirement{part: part, err: fmt.Errorf("requirement %q was still waking when this wake's budget ran out (its own wake goes on): %w", name, err)}
	}
	if err != nil {
		part.State = "failed"
		return requirement{part: part, err: &RequirementError{Instance: name, Err: err}}
	}
	return requirement{release: req.heldBy(in.route.Name, release), part: part}
}

func releaseAll(holds []func()) {
	for _, h := range holds {
		h()
	}
}

// heldBy counts dependent as holding the instance until the returned func runs, which also gives back
// release (acquire's).
func (in *instance) heldBy(dependent string, release func()) func() {
	in.mu.Lock()
	if in.dependents == nil {
		in.dependents = map[string]int{}
	}
	in.dependents[dependent]++
	in.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			in.mu.Lock()
			if in.dependents[dependent]--; in.dependents[dependent] <= 0 {
				delete(in.dependents, dependent)
			}
			in.mu.Unlock()
			release()
		})
	}
}

// requiredByLocked returns the dependents holding the instance, sorted.
func (in *instance) requiredByLocked() []string {
	return slices.Sorted(maps.Keys(in.dependents))
}

// letGoLocked gives back the holds on in's requirements: it is asleep, failed or closed, and needs
// them no more. Each requirement's idle window starts once its last dependent has let go.
func (in *instance) letGoLocked() {
	holds := in.holds
	in.holds = nil
	releaseAll(holds)
}

// statusRequired is RequiredError's HTTP status on the admin API.
const statusRequired = http.StatusConflict
