package shim

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestRunUsage(t *testing.T) {
	var stderr bytes.Buffer
	if code := Run([]string{Arg0}, nil, &stderr); code != 127 {
		t.Errorf("Run without a command = %d, want 127", code)
	}
	if !strings.Contains(stderr.String(), "usage") {
		t.Errorf("stderr %q does not say how to use it", stderr.String())
	}
}

func TestRunExecFails(t *testing.T) {
	var stderr bytes.Buffer
	if code := Run([]string{Arg0, "/nonexistent/app", "app"}, nil, &stderr); code != 127 {
		t.Errorf("Run of a missing program = %d, want 127", code)
	}
	if !strings.Contains(stderr.String(), "/nonexistent/app") {
		t.Errorf("stderr %q does not name the program", stderr.String())
	}
}

// TestShimEnv: the test binary, started as the shim, execs env(1), which must see LISTEN_PID equal
// to its own pid (the shim's: exec keeps it) and must not see the shim marker or a stale LISTEN_PID.
func TestShimEnv(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to print the tenant's pid")
	}
	cmd := exec.Command(self)
	cmd.Args = []string{Arg0, sh, "sh", "-c", `echo "pid=$$ listen_pid=$LISTEN_PID marker=${` + Env + `:-unset}"`}
	cmd.Env = append(os.Environ(), Env+"=1", "LISTEN_PID=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("shim: %v: %s", err, out)
	}
	var pid, lpid, marker string
	for _, f := range strings.Fields(string(out)) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "pid":
			pid = v
		case "listen_pid":
			lpid = v
		case "marker":
			marker = v
		}
	}
	if pid == "" || lpid != pid || marker != "unset" {
		t.Fatalf("tenant saw %q: want LISTEN_PID equal to its pid and no %s", out, Env)
	}
}
