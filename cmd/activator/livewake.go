package main

// `activator wake`: the admin wake, with its phases shown as they happen.

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/activator/activator/internal/activator"
)

// wakePoll is how often `activator wake` reads the wake in progress (GET /routes/{name}).
const wakePoll = 100 * time.Millisecond

// cmdWake wakes a route through the admin API. While the wake's POST runs it polls the route's status
// and prints each phase of the wake in progress as it ends: on a terminal with a progress line for the
// phase under way, otherwise as plain lines. It exits 1 with the short cause when the wake fails.
func cmdWake(args []string) int {
	fs := flag.NewFlagSet("wake", flag.ContinueOnError)
	client := adminFlags(fs)
	route, code := routeArg("wake", fs, args)
	if code != 0 {
		return code
	}
	c, err := client()
	if err != nil {
		fmt.Fprintln(os.Stderr, "activator wake:", err)
		return 2
	}
	path := "/routes/" + url.PathEscape(route)
	before, err := c.routeStatus(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "activator wake %s: %v\n", route, err)
		return 1
	}
	type answer struct {
		body []byte
		code int
		err  error
	}
	done := make(chan answer, 1) // the one sender never blocks; the loop below always receives
	go func() {
		b, code, err := c.call(http.MethodPost, path+"/wake", 16*time.Minute)
		done <- answer{b, code, err}
	}()
	p := &wakeProgress{w: os.Stdout, tty: isTerminal(os.Stdout), route: route}
	if before.LastWake != nil {
		p.seen = before.LastWake.ID
	}
	tick := time.NewTicker(wakePoll)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			if st, err := c.routeStatus(path); err == nil && st.CurrentWake != nil {
				p.show(*st.CurrentWake)
			}
			continue
		case a := <-done:
			if a.err != nil {
				p.endLine()
				fmt.Fprintf(os.Stderr, "activator wake %s: %v\n", route, a.err)
				return 1
			}
			var ans struct {
				Error  string            `json:"error"`
				Status *activator.Status `json:"status"`
			}
			st := &activator.Status{}
			if a.code == http.StatusOK {
				_ = decodeAnswer(a.body, st)
			} else if decodeAnswer(a.body, &ans) == nil && ans.Status != nil {
				st = ans.Status
			}
			if st.LastWake != nil {
				p.show(*st.LastWake)
			}
			p.endLine()
			if a.code != http.StatusOK {
				fmt.Fprintf(os.Stderr, "activator wake %s: %s\n", route, shortCause(answerError(a.body, a.code), st.LastWake))
				if st.LastWake != nil {
					fmt.Fprintf(os.Stderr, "(`activator explain %s` shows the phases and the output)\n", route)
				}
				return 1
			}
			if p.shown == "" {
				fmt.Printf("%s: %s (no wake needed)\n", route, st.State)
			} else {
				fmt.Printf("%s: %s (wake %s in %s)\n", route, st.State, st.LastWake.Result, short(st.LastWake.Duration))
			}
			return 0
		}
	}
}

// routeStatus reads one route's status from the admin API.
func (c *adminClient) routeStatus(path string) (*activator.Status, error) {
	st := &activator.Status{}
	if err := c.getJSON(path, st); err != nil {
		return nil, err
	}
	return st, nil
}

// getJSON GETs path from the admin API and decodes its 200 answer into v; any other answer is an
// error carrying the admin API's reason (answerError).
func (c *adminClient) getJSON(path string, v any) error {
	body, code, err := c.call(http.MethodGet, path, 10*time.Second)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("%s", answerError(body, code))
	}
	if err := decodeAnswer(body, v); err != nil {
		return fmt.Errorf("bad answer from the admin API: %w", err)
	}
	return nil
}

// wakeProgress prints a wake's phases once each, as they end. On a terminal the phase under way is a
// progress line, redrawn in place with \r.
type wakeProgress struct {
	w     io.Writer
	tty   bool
	route string
	seen  string // the last wake before ours: not shown
	shown string // the wake being shown
	done  int    // its phases printed
	line  bool   // a progress line is on screen
}

func (p *wakeProgress) show(r activator.WakeRecord) {
	if r.ID == p.seen {
		return
	}
	if r.ID != p.shown {
		p.endLine()
		p.shown, p.done = r.ID, 0
		fmt.Fprintf(p.w, "%s: waking (trigger %s, wake_id %s)\n", p.route, r.Trigger, r.ID)
	}
	for p.done < len(r.Phases) && r.Phases[p.done].Duration > 0 {
		p.endLine()
		fmt.Fprintln(p.w, phaseLine(r.Phases[p.done]))
		p.done++
	}
	if p.tty && r.Result == activator.ResultRunning && p.done < len(r.Phases) {
		ph := r.Phases[p.done]
		fmt.Fprintf(p.w, "\r  %-9s %-13s %s …\x1b[K", "+"+short(ph.Start), ph.Name, (r.Duration - ph.Start).Round(100*time.Millisecond))
		p.line = true
	}
}

// endLine clears the progress line, if one is on screen.
func (p *wakeProgress) endLine() {
	if p.line {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.line = false
	}
}

// shortCause is a failed wake's error on one line: the output tail it quotes cut to its last line.
func shortCause(msg string, r *activator.WakeRecord) string {
	if r != nil && r.OutputTail != "" {
		lines := strings.Split(r.OutputTail, "\n")
		msg = strings.Replace(msg, r.OutputTail, lines[len(lines)-1], 1)
	}
	return strings.ReplaceAll(msg, "\n", " ")
}

// isTerminal reports whether f is a terminal (a character device).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
