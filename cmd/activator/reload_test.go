package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/activator/activator/internal/registry"
)

// loopHarness runs a reloadLoop on channels the test drives: SIGHUPs, file events, the settle
// windows (each one opened is handed to the test, which ends it by sending on it) and the reloads
// (each one reports its trigger as it begins and returns when the test lets it). The loop is joined
// at cleanup, and a reload nobody expected fails the test.
type loopHarness struct {
	t       *testing.T
	hup     chan os.Signal      // buffered 1, as the reloader's
	events  chan fsnotify.Event // buffered: a send is an event pending for the loop
	windows chan chan time.Time // every settle window the loop opened, in order
	reloads chan string         // every reload's trigger, as it begins
	release chan struct{}       // a reload returns once it receives here
	cancel  context.CancelFunc
	done    chan struct{} // closed when run returned
	once    sync.Once
}

const configName = "activator.yaml"

func startLoop(t *testing.T) *loopHarness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &loopHarness{
		t:       t,
		hup:     make(chan os.Signal, 1),
		events:  make(chan fsnotify.Event, 16),
		windows: make(chan chan time.Time, 16),
		reloads: make(chan string, 16),
		release: make(chan struct{}),
		cancel:  cancel,
		done:    make(chan struct{}),
	}
	l := &reloadLoop{
		hup:    h.hup,
		events: h.events,
		file:   configName,
		settle: func() <-chan time.Time {
			w := make(chan time.Time, 1)
			h.windows <- w
			return w
		},
		reload: func(trigger string) {
			h.reloads <- trigger
			select {
			case <-h.release:
			case <-ctx.Done():
			}
		},
	}
	go func() {
		defer close(h.done)
		l.run(ctx)
	}()
	t.Cleanup(h.stop)
	return h
}

// stop ends the loop, joins it, and checks that no reload is left unexpected.
func (h *loopHarness) stop() {
	h.once.Do(func() {
		h.cancel()
		select {
		case <-h.done:
		case <-time.After(patience):
			h.t.Fatalf("the reload loop did not return within %v of its ctx ending", patience)
		}
		if n := len(h.reloads); n > 0 {
			h.t.Errorf("%d more reloads than expected (first trigger %q)", n, <-h.reloads)
		}
	})
}

// signal sends a SIGHUP the way signal.Notify does: dropped when one is already pending.
func (h *loopHarness) signal() {
	select {
	case h.hup <- syscall.SIGHUP:
	default:
	}
}

func (h *loopHarness) event(name string, op fsnotify.Op) {
	h.events <- fsnotify.Event{Name: "/etc/activator/" + name, Op: op}
}

// window returns the next settle window the loop opened.
func (h *loopHarness) window() chan<- time.Time {
	h.t.Helper()
	select {
	case w := <-h.windows:
		return w
	case <-time.After(patience):
		h.t.Fatalf("no settle window opened within %v", patience)
		return nil
	}
}

// reloaded waits for the next reload to begin and checks its trigger; the reload runs until finish.
func (h *loopHarness) reloaded(want string) {
	h.t.Helper()
	select {
	case got := <-h.reloads:
		if got != want {
			h.t.Errorf("reload triggered by %q, want %q", got, want)
		}
	case <-time.After(patience):
		h.t.Fatalf("no reload (%s) within %v", want, patience)
	}
}

func (h *loopHarness) finish() { h.release <- struct{}{} }

// TestReloadLoop: bursts of triggers coalesce into one reload (see reloadLoop).
func TestReloadLoop(t *testing.T) {
	t.Run("file events reload once, when the last one's window ends", func(t *testing.T) {
		h := startLoop(t)
		h.event(configName, fsnotify.Write)
		w1 := h.window()
		h.event(configName+".swp", fsnotify.Write) // another file
		h.event(configName, fsnotify.Chmod)        // not a change of its content
		h.event(configName, fsnotify.Rename)
		w2 := h.window()
		h.event(configName, fsnotify.Create)
		w3 := h.window()
		w1 <- time.Time{} // superseded windows end without a reload
		w2 <- time.Time{}
		w3 <- time.Time{}
		h.reloaded("file change")
		h.finish()
		h.stop()
		if n := len(h.windows); n > 0 {
			t.Errorf("events on another file or not changing it opened %d settle windows", n)
		}
	})

	t.Run("a SIGHUP reloads at once and closes the open window", func(t *testing.T) {
		h := startLoop(t)
		h.event(configName, fsnotify.Write)
		w := h.window()
		h.signal()
		h.reloaded("SIGHUP")
		h.finish()
		w <- time.Time{} // closed by the SIGHUP's reload, which read the file
		h.signal()
		h.reloaded("SIGHUP")
		h.finish()
	})

	t.Run("triggers pending when a reload begins are dropped", func(t *testing.T) {
		h := startLoop(t)
		h.signal()
		h.reloaded("SIGHUP")
		// While this reload runs, more triggers arrive (the second SIGHUP is dropped on arrival).
		h.signal()
		h.signal()
		h.event(configName, fsnotify.Write)
		h.event(configName, fsnotify.Rename)
		h.finish()
		// They came after the first reload read the file: one more reload, and it begins with none
		// of them pending.
		h.reloaded("SIGHUP")
		if len(h.hup) > 0 || len(h.events) > 0 {
			t.Errorf("the reload began with triggers pending: %d SIGHUP, %d file events", len(h.hup), len(h.events))
		}
		// Windows the loop opened for those events before it took the SIGHUP closed with it.
		for len(h.windows) > 0 {
			w := <-h.windows
			w <- time.Time{}
		}
		h.finish()
	})
}

// TestRejectedReloadIsAMetric: a reload of a bad config is visible to Prometheus, not only in the
// log: activator_config_last_reload_successful drops to 0 while the old config stays in force, and
// comes back to 1, with a later success timestamp, once a good config is loaded. Found by an operator
// trial: a bad file left in place showed nowhere but the log until the next restart failed on it.
func TestRejectedReloadIsAMetric(t *testing.T) {
	t.Parallel()
	app := appRoute{Name: "hello"}
	good := configYAML(t, app)
	s := startServed(t, good)
	const ok, at = "activator_config_last_reload_successful", "activator_config_last_reload_success_timestamp_seconds"
	start := scrape(t, s.admin, ok, at)
	if start[ok] != 1 || start[at] <= 0 {
		t.Fatalf("at start-up: %v, want successful and a load time", start)
	}
	bad := good + "  - name: broken\n    hosts: [broken.test]\n"
	tmp := s.path + ".new"
	if err := os.WriteFile(tmp, []byte(fmt.Sprintf("listen: %q\nadmin: %q\n", s.edge, s.admin)+bad), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, s.path); err != nil {
		t.Fatal(err)
	}
	s.waitLogged("config reload rejected; the old config stays in force", 1)
	if got := scrape(t, s.admin, ok, at); got[ok] != 0 || got[at] != start[at] {
		t.Errorf("after the rejected reload: %v, want 0 and the start-up's time %v", got, start[at])
	}
	s.rewrite(good, 1)
	if got := scrape(t, s.admin, ok, at); got[ok] != 1 || got[at] <= start[at] {
		t.Errorf("after a good reload: %v, want 1 and a time after %v", got, start[at])
	}
}

// certFilesApplier is an applier whose config serves certificate files (fileWatcher), and applies
// anything.
type certFilesApplier []string

func (certFilesApplier) Apply(*registry.Config) error { return nil }
func (certFilesApplier) SetCheckError(string, error)  {}
func (f certFilesApplier) watchedFiles() []string     { return f }

// TestCertDirsWatchedBeforeServing: the certificate files' directory is watched once reloader returns,
// before serve logs "activator listening" and tells systemd READY, not once its goroutine has begun:
// a renewal written just after the start went unseen until the next SIGHUP when it came first
// (TestTLSRenewalThroughSymlinks failed so on a loaded machine).
func TestCertDirsWatchedBeforeServing(t *testing.T) {
	certs := filepath.Join(t.TempDir(), "live")
	if err := os.Mkdir(certs, 0o700); err != nil {
		t.Fatal(err)
	}
	o := serveOptions{configPath: filepath.Join(t.TempDir(), "activator.yaml")}
	log := slog.New(slog.DiscardHandler)
	tr := watchReloads(log, o)
	if tr.w == nil {
		t.Fatal("the config's directory is not watched")
	}
	ctx, cancel := context.WithCancel(t.Context())
	run := reloader(ctx, log, o, nil, certFilesApplier{filepath.Join(certs, "tls.crt")}, &registry.Config{}, tr)
	if watched := tr.w.WatchList(); !slices.Contains(watched, certs) {
		t.Errorf("watched %q before the reload loop runs, want %s among them", watched, certs)
	}
	cancel()
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
