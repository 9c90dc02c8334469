package exec

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/activator/activator/internal/demoapp"
	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// parentEnv makes the test binary run as a "parent": an activator stand-in that wakes one child
// through the backend, prints the child's pid and waits to be killed (the no-orphans test). Its value
// is the listen mode; parentPortEnv is the TCP port.
const (
	parentEnv     = "EXEC_TEST_PARENT"
	parentPortEnv = "EXEC_TEST_PARENT_PORT"
	// parentRootEnv, when set, is the parent's cgroup_root; its tenant is then a wrapper,
	// sh -c '"$0" & wait' around a demoapp child, tagged with parentTagEnv's value.
	parentRootEnv = "EXEC_TEST_PARENT_ROOT"
	parentTagEnv  = "EXEC_TEST_PARENT_TAG"
)

// floodEnv makes a demoapp child print that many lines, "flood 0" to "flood N-1", on stdout as fast as
// it can before it starts (the output-flood test).
const floodEnv = "EXEC_TEST_FLOOD"

func TestMain(m *testing.M) {
	if n, err := strconv.Atoi(os.Getenv(floodEnv)); err == nil && os.Getenv(demoapp.ChildEnv) == "1" {
		flood(n)
	}
	if path := os.Getenv(envDumpEnv); path != "" && os.Getenv(demoapp.ChildEnv) == "1" {
		dumpEnv(path)
	}
	demoapp.RunIfChild()
	if mode := os.Getenv(parentEnv); mode != "" {
		os.Exit(runParent(ListenMode(mode), os.Getenv(parentPortEnv)))
	}
	os.Exit(m.Run())
}

// runParent wakes a demoapp child on 127.0.0.1:port, prints "pid N" and blocks until stdin closes or
// the process is killed.
func runParent(mode ListenMode, port string) int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	up := registry.Upstream{Network: "tcp", Address: "127.0.0.1:" + port}
	s := &Settings{
		Argv: []string{self}, Path: self,
		Env:       map[string]string{demoapp.ChildEnv: "1"},
		Listen:    mode,
		StopGrace: DefaultStopGrace,
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var cont *Containment
	if root := os.Getenv(parentRootEnv); root != "" {
		if cont, err = Contain(context.Background(), root, log); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		s.Argv = []string{"/bin/sh", "-c", `"$0" & wait`, self}
		s.Path = "/bin/sh"
		s.Env["EXEC_TEST_TAG"] = os.Getenv(parentTagEnv)
	}
	b, err := New(&registry.Route{Name: "parent", Upstream: up, Settings: s}, Options{Logger: log, Containment: cont})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := b.Wake(context.Background(), tenant.Discard); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("pid %d\n", b.PID())
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = b.Close(context.Background())
	return 0
}

// envDumpEnv makes a demoapp child write its environment, one NAME=value a line, to the file it names
// before it starts (the secret-scrubbing test).
const envDumpEnv = "EXEC_TEST_ENV_DUMP"

// dumpEnv writes os.Environ() to path, or exits with an error.
func dumpEnv(path string) {
	if err := os.WriteFile(path, []byte(strings.Join(os.Environ(), "\n")+"\n"), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "env dump:", err)
		os.Exit(1)
	}
}

// flood prints floodLines(n) to stdout in one write: a tenant that writes as fast as the pipe takes it.
func flood(n int) {
	if _, err := os.Stdout.Write(floodLines(n)); err != nil {
		fmt.Fprintln(os.Stderr, "flood:", err)
		os.Exit(1)
	}
}

// floodLines is "flood 0\nflood 1\n…flood n-1\n".
func floodLines(n int) []byte {
	var b []byte
	for i := range n {
		b = append(b, "flood "...)
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, '\n')
	}
	return b
}
