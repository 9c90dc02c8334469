// Command redfish-sim runs the Redfish simulator of internal/backend/redfish/redfishtest standalone: a
// pretend BMC for demos and docs, whose systems power on and off through ComputerSystem.Reset and serve
// a small "hello from <id>" page on their own address while On.
//
//	go run ./cmd/redfish-sim -addr 127.0.0.1:8443 -tls -ca-out /tmp/bmc-ca.pem \
//	    -user activator -password-file /tmp/bmc-password \
//	    -systems node-1=127.0.0.1:9101,node-2=127.0.0.1:9102 -delay 3s
//
// It runs until SIGINT or SIGTERM. SIGHUP reads -password-file again and makes its content the account's
// password (open sessions are closed), as rotating a BMC's password does.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/activator/activator/internal/backend/redfish/redfishtest"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "redfish-sim:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("redfish-sim", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8443", "address of the Redfish service")
	useTLS := fs.Bool("tls", false, "serve HTTPS with a self-signed certificate for 127.0.0.1")
	caOut := fs.String("ca-out", "", "with -tls: write the certificate (PEM) here, for the route's tls.ca_file")
	user := fs.String("user", "", "the account the BMC accepts (empty: no authentication)")
	pwFile := fs.String("password-file", "", "file holding the account's password")
	pwEnv := fs.String("password-env", "", "environment variable holding the account's password")
	systems := fs.String("systems", "node-1=127.0.0.1:9101", "comma-separated systems, each ID[=service-address]")
	delay := fs.Duration("delay", 2*time.Second, "how long a system stays PoweringOn/PoweringOff")
	state := fs.String("state", "Off", "initial PowerState of every system: On or Off")
	noSessions := fs.Bool("no-sessions", false, "offer no SessionService (basic auth only)")
	verbose := fs.Bool("v", false, "log every request")
	if err := fs.Parse(args); err != nil {
		return err
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	o := redfishtest.Options{Addr: *addr, TLS: *useTLS, Username: *user, NoSessionService: *noSessions, Logger: log}
	switch {
	case *user == "" && (*pwFile != "" || *pwEnv != ""):
		return fmt.Errorf("a password without -user")
	case *user != "" && *pwFile != "":
		p, err := readPassword(*pwFile)
		if err != nil {
			return err
		}
		o.Password = p
	case *user != "" && *pwEnv != "":
		o.Password = os.Getenv(*pwEnv)
	case *user != "":
		return fmt.Errorf("-user needs -password-file or -password-env")
	}
	if *user != "" && o.Password == "" {
		return fmt.Errorf("the password is empty")
	}
	for _, spec := range strings.Split(*systems, ",") {
		id, svc, _ := strings.Cut(strings.TrimSpace(spec), "=")
		o.Systems = append(o.Systems, redfishtest.System{ID: id, ServiceAddr: svc, TransitionDelay: *delay, PowerState: *state})
	}

	sim, err := redfishtest.New(o)
	if err != nil {
		return err
	}
	defer sim.Close()
	if *caOut != "" {
		if !*useTLS {
			return fmt.Errorf("-ca-out needs -tls")
		}
		if err := os.WriteFile(*caOut, sim.CertificatePEM(), 0o644); err != nil {
			return err
		}
	}
	log.Info("Redfish simulator running", "url", sim.URL, "auth", authMode(o))
	for _, s := range o.Systems {
		log.Info("system", "id", s.ID, "power_state", sim.PowerState(s.ID), "service", sim.ServiceAddr(s.ID))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			log.Info("stopping")
			return nil
		case <-hup:
			if *pwFile == "" {
				log.Warn("SIGHUP: no -password-file to read again")
				continue
			}
			p, err := readPassword(*pwFile)
			if err != nil || p == "" {
				log.Error("SIGHUP: password not changed", "err", err, "empty", p == "")
				continue
			}
			sim.SetPassword(p)
			log.Info("SIGHUP: password changed; sessions closed")
		}
	}
}

// readPassword returns the file's content without its trailing newline.
func readPassword(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(b), "\r\n"), nil
}

func authMode(o redfishtest.Options) string {
	switch {
	case o.Username == "":
		return "none"
	case o.NoSessionService:
		return "basic"
	default:
		return "session or basic"
	}
}
