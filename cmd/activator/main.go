// Command activator is the composition root: the only place that wires the registry, the backings,
// the edge and the admin API together.
//
//	activator serve  --config FILE     run the edge and the admin API
//	activator check  --config FILE     validate a config; print every problem; exit 1 if any
//	activator status [ROUTE...]        a table of routes from the admin API (--state to select)
//	activator wake   ROUTE             wake a route, showing its phases as they happen
//	activator sleep  ROUTE             put a route to sleep
//	activator explain ROUTE            the route's recent wakes and sleeps as a timeline
//	activator completion bash|zsh      a shell completion script
//	activator demo                     the embedded demo: a sleeping app that wakes on request
package main

import (
	"fmt"
	"os"

	"github.com/activator/activator/internal/demoapp"
)

const usage = `activator: an HTTP edge that wakes sleeping tenants on demand.

Usage:
  activator serve  --config FILE [--log-format text|json] [--log-level info] [--pprof]
  activator check  --config FILE
  activator status [ROUTE...] [--state awake,waking] [--json | --names] [--watch [--interval 2s] [--count N]] [ADMIN]
  activator wake   ROUTE [ADMIN]
  activator sleep  ROUTE [ADMIN]
  activator explain ROUTE [--last 10] [--json] [ADMIN]
  activator completion bash|zsh
  activator demo   [--listen 127.0.0.1:8080] [--admin 127.0.0.1:9090]

ADMIN: how the CLI reaches the admin API: --admin host:port or unix:/path (env ACTIVATOR_ADMIN),
--token-file FILE (or the token itself in env ACTIVATOR_ADMIN_TOKEN), or --config FILE to read both from the
activator's config; the default is 127.0.0.1:9090.

See README.md and docs/ for the config reference.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	var code int
	switch cmd {
	case "serve":
		code = cmdServe(args)
	case "check":
		code = cmdCheck(args)
	case "status":
		code = cmdStatus(args)
	case "wake":
		code = cmdWake(args)
	case "sleep":
		code = cmdAct(cmd, args)
	case "explain":
		code = cmdExplain(args)
	case "completion":
		code = cmdCompletion(args)
	case "demo":
		code = cmdDemo(args)
	case "app": // hidden: the demo tenant
		code = demoapp.Main()
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "activator: unknown command %q\n\n%s", cmd, usage)
		code = 2
	}
	os.Exit(code)
}
