package foreign

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	osexec "os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/activator/activator/internal/tenant"
)

// The test binary doubles as the foreign process: with FOREIGN_LISTEN=network,address it listens
// there, prints the bound address, and holds it until its stdin closes.
func TestMain(m *testing.M) {
	if spec := os.Getenv("FOREIGN_LISTEN"); spec != "" {
		network, address, _ := strings.Cut(spec, ",")
		ln, err := net.Listen(network, address)
		if err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(2)
		}
		os.Stdout.WriteString(ln.Addr().String() + "\n")
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// holder starts a foreign process listening at network/address and returns it and the bound address.
func holder(t *testing.T, network, address string) (*osexec.Cmd, string) {
	t.Helper()
	cmd := osexec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FOREIGN_LISTEN="+network+","+address)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("holder did not report its address: %v", err)
	}
	return cmd, strings.TrimSpace(line)
}

func wantHeld(t *testing.T, err error, pid int, cmdPart string) {
	t.Helper()
	var h *HeldError
	if !errors.As(err, &h) {
		t.Fatalf("Check = %v, want a *HeldError", err)
	}
	if h.PID != pid || !strings.Contains(h.Command, cmdPart) {
		t.Fatalf("held by pid %d (%q), want pid %d with %q in its command", h.PID, h.Command, pid, cmdPart)
	}
	if !strings.Contains(err.Error(), "already answers") {
		t.Fatalf("message %q does not say the upstream already answers", err)
	}
	if got := tenant.ClassOf(err); got != tenant.ClassTerminal {
		t.Fatalf("ClassOf(%v) = %q, want %q: only an operator can stop the holder", err, got, tenant.ClassTerminal)
	}
}

func TestFreeAddressIsNotHeld(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if err := Check(context.Background(), "tcp", addr); err != nil {
		t.Fatalf("Check(%s) after the listener closed = %v, want nil", addr, err)
	}
	if err := Check(context.Background(), "unix", filepath.Join(t.TempDir(), "none.sock")); err != nil {
		t.Fatalf("Check on a missing unix socket = %v, want nil", err)
	}
}

// TestFreeLoopback: a loopback port nobody listens on is known free from the kernel's lookup, without
// a dial; a port with a listener, an address of another host and a name are left to the dial.
func TestFreeLoopback(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the lookup is Linux's sock_diag")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	open := ln.Addr().String()
	_, port, _ := net.SplitHostPort(open)
	for _, tc := range []struct {
		address string
		want    bool
	}{
		{open, false},
		{"192.0.2.1:" + port, false}, // another host's: nothing here can say it is free
		{"localhost:" + port, false}, // a name
		{"not an address", false},
	} {
		if got := freeLoopback(tc.address); got != tc.want {
			t.Errorf("freeLoopback(%q) = %v, want %v", tc.address, got, tc.want)
		}
	}
	ln.Close()
	if !freeLoopback(open) {
		t.Errorf("freeLoopback(%q) after its listener closed = false, want true", open)
	}
}

func TestHolderNamed(t *testing.T) {
	bin := filepath.Base(os.Args[0])
	cases := []struct {
		name, network, listen string
		check                 func(bound string) string
	}{
		{"tcp exact", "tcp", "127.0.0.1:0", func(b string) string { return b }},
		{"tcp wildcard", "tcp", "0.0.0.0:0", func(b string) string {
			_, port, _ := net.SplitHostPort(b)
			return "127.0.0.1:" + port
		}},
		{"unix", "unix", filepath.Join(t.TempDir(), "app.sock"), func(b string) string { return b }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd, bound := holder(t, c.network, c.listen)
			err := Check(context.Background(), c.network, c.check(bound))
			wantHeld(t, err, cmd.Process.Pid, bin)
		})
	}
}

func TestOwnListenerNamedAsSelf(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	wantHeld(t, Check(context.Background(), "tcp", ln.Addr().String()), os.Getpid(), "this activator")
}

// A holder the caller names as its own (a kvm standby QEMU holding its guest's port) is not foreign;
// any other holder still is, whatever the caller names.
func TestOursAreNotForeign(t *testing.T) {
	cmd, bound := holder(t, "tcp", "127.0.0.1:0")
	if err := Check(context.Background(), "tcp", bound, cmd.Process.Pid); err != nil {
		t.Fatalf("Check naming the holder as ours = %v, want nil", err)
	}
	other, _ := holder(t, "tcp", "127.0.0.1:0")
	wantHeld(t, Check(context.Background(), "tcp", bound, other.Process.Pid, os.Getpid()), cmd.Process.Pid, filepath.Base(os.Args[0]))
}
