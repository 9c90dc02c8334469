package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// demoConfig is the embedded default: one exec route whose tenant is this binary in its hidden `app`
// mode. The placeholders are filled at run time (the binary's path, a free port for the tenant).
const demoConfig = `# The embedded demo config (activator demo). The same shape works with "activator serve --config".
routes:
  - name: hello
    hosts: [localhost, hello.localhost, 127.0.0.1]
    backing: exec
    upstream: 127.0.0.1:{{PORT}}
    idle: 15s
    wake_budget: 30s
    health:
      path: /healthz
    exec:
      argv: [{{SELF}}, app]
      listen: env
      env:
        DEMOAPP_BODY: "hello from a tenant that was asleep a moment ago"
      stop_grace: 5s
`

func cmdDemo(args []string) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8080", "edge address")
	admin := fs.String("admin", "127.0.0.1:9090", "admin API address")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	printConfig := fs.Bool("print-config", false, "print the embedded config and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	// Checked before anything is set up: a listen failure comes only after the cgroups and the
	// tenant's backing, and says nothing of a missing port.
	if _, err := parseAdminAddr("--admin", *admin); err != nil {
		fmt.Fprintln(os.Stderr, "activator demo:", err)
		return 2
	}
	if _, port, err := net.SplitHostPort(*listen); err != nil || port == "" {
		fmt.Fprintf(os.Stderr, "activator demo: --listen %q: want host:port, e.g. 127.0.0.1:8080\n", *listen)
		return 2
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "activator demo: cannot find my own binary:", err)
		return 1
	}
	port, err := freePort()
	if err != nil {
		fmt.Fprintln(os.Stderr, "activator demo:", err)
		return 1
	}
	cfg := strings.NewReplacer("{{SELF}}", strconv.Quote(self), "{{PORT}}", strconv.Itoa(port)).Replace(demoConfig)
	if *printConfig {
		fmt.Print(cfg)
		return 0
	}
	logger, err := newLogger(os.Stderr, *logFormat, "info")
	if err != nil {
		fmt.Fprintln(os.Stderr, "activator demo:", err)
		return 2
	}
	return serve(serveOptions{
		configData: []byte(cfg),
		listen:     *listen,
		admin:      *admin,
		logger:     logger,
		onReady: func(edge, adm net.Addr) {
			fmt.Printf(`
activator demo is running. The route "hello" is asleep: nothing runs until the first request.

  Wake it:        curl -s http://%[1]s/
  Watch it:       go run ./cmd/activator status --admin %[2]s     (or: curl -s http://%[2]s/routes)
  Wake latency:   curl -s http://%[2]s/metrics | grep activator_wake_duration
  Sleep it now:   go run ./cmd/activator sleep hello --admin %[2]s

After 15 s with no requests the app is stopped again; the next request wakes it.
Ctrl-C stops the demo (and the app).

`, edge, adm)
		},
	})
}

// freePort asks the kernel for a free loopback port for the demo tenant.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("no free port for the demo app: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
