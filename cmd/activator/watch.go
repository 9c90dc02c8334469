package main

// `activator status --watch` and `--names`.

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/activator/activator/internal/activator"
)

// watchStatus redraws the status table every interval until SIGINT, or until count tables were drawn
// when count > 0. On a terminal it clears the screen before each; otherwise a separator line with the
// time parts them.
func watchStatus(c *adminClient, list string, interval time.Duration, count, noteMax int) int {
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
		printStatus(os.Stdout, sts, time.Now(), noteMax)
	}
	return 0
}

// printNames prints the route names that list (a GET /routes?names=true) answers, one a line.
func printNames(c *adminClient, list string) int {
	var names []string
	if err := c.getJSON(list, &names); err != nil {
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
	var sts []activator.Status
	if err := c.getJSON(list, &sts); err != nil {
		return nil, err
	}
	return sts, nil
}
