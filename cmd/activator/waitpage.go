package main

import (
	"errors"
	"fmt"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/waitpage"
)

// checkWaitingPages checks every route's own waiting page template by loading it as the edge will
// (waitpage.New): the registry checks only that the file is there, since it knows config, not HTML.
// The error joins one problem per route, each naming the route and the file, for printConfigErrors
// and the reload's log alike.
func checkWaitingPages(cfg *registry.Config) error {
	var errs []error
	var ts waitpage.Templates // each file once, however many routes name it
	for _, r := range cfg.Routes {
		if r.WaitingPage.Off || r.WaitingPage.Template == "" {
			continue
		}
		if _, err := ts.Load(r.WaitingPage.Template); err != nil {
			errs = append(errs, fmt.Errorf("route %q: waiting_page.template: %w", r.Name, err))
		}
	}
	return errors.Join(errs...)
}
