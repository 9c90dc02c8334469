package main

// `activator status --watch` and `--names`.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/activator/activator/internal/activator"
)

// watchStatus redraws the status table every interval until SIGINT, or until count tables were drawn
// when count > 0. On a terminal it clears the screen before each; otherwise a separator line with the
// time parts them.
func watchStatus(c *adminClient, list string, interval time.Duration, count int) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	tty := isTerminal(os.Stdout)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for n := 0; count <= 0 || n < count; n++ {
		if n > 0 {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return 0
			}
		}
		sts, err := fetchStatuses(c, list)
		switch {
		case tty:
			fmt.Print("\x1b[H\x1b[2J") // home, clear the screen
		case n > 0:
			fmt.Printf("-- %s\n", time.Now().Format(time.TimeOnly))
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "activator status:", err) // the next refresh may reach it again
			continue
		}
		printStatus(os.Stdout, sts, time.Now())
	}
	return 0
}

// printNames prints the route names that list (a GET /routes?names=true) answers, one a line.
func printNames(c *adminClient, list string) int {
	body, code, err := c.call(http.MethodGet, list, 10*time.Second)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("%s", answerError(body, code))
	}
	var names []string
	if err == nil {
		if jerr := json.Unmarshal(body, &names); jerr != nil {
			err = fmt.Errorf("bad answer from the admin API: %w", jerr)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "activator status:", err)
		return 1
	}
	for _, n := range names {
		fmt.Println(n)
	}
	return 0
}

// fetchStatuses asks the admin API for list (a GET /routes, with its selection).
func fetchStatuses(c *adminClient, list string) ([]activator.Status, error) {
	body, code, err := c.call(http.MethodGet, list, 10*time.Second)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("%s", answerError(body, code))
	}
	var sts []activator.Status
	if err := json.Unmarshal(body, &sts); err != nil {
		return nil, fmt.Errorf("bad answer from the admin API: %w", err)
	}
	return sts, nil
}
