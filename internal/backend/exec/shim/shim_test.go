package shim

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/activator/activator/internal/backend/exec/shim/native"
)

// executables are the shims that keep this package's protocol: the test binary, which links this
// package as the activator's binary does, and the native shim where it exists (linux/amd64). Each
// process-level test below runs against both, so the two cannot drift apart.
func executables(t *testing.T) map[string]string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	shims := map[string]string{"go": self}
	n, err := native.Open()
	switch {
	case errors.Is(err, native.ErrUnsupported):
		t.Logf("no native shim here: %v", err)
	case err != nil:
		t.Fatalf("native.Open: %v", err)
	default:
		t.Cleanup(func() { n.Close() })
		shims["native"] = n.Path()
	}
	return shims
}

// TestShimFails: started wrongly (no command) or on a program that does not exist, a shim exits with
// status 127 and says why on stderr, naming the program.
func TestShimFails(t *testing.T) {
	for name, path := range executables(t) {
		t.Run(name, func(t *testing.T) {
			for _, c := range []struct {
				args []string
				want []string
			}{
				{[]string{Arg0}, []string{Arg0 + ": usage"}},
				{[]string{Arg0, "/nonexistent/app", "app"}, []string{"exec /nonexistent/app", "no such file or directory"}},
			} {
				cmd := exec.Command(path)
				cmd.Args = c.args
				cmd.Env = append(os.Environ(), Env+"=1")
				out, err := cmd.CombinedOutput()
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 127 {
					t.Errorf("%q: %v, want exit status 127", c.args, err)
				}
				for _, w := range c.want {
					if !strings.Contains(string(out), w) {
						t.Errorf("%q: stderr %q lacks %q", c.args, out, w)
					}
				}
			}
		})
	}
}

// TestShimEnv: each shim execs sh(1), which must see LISTEN_PID equal
// to its own pid (the shim's: exec keeps it) and must not see the shim marker or a stale LISTEN_PID.
func TestShimEnv(t *testing.T) {
	for name, path := range executables(t) {
		t.Run(name, func(t *testing.T) { testShimEnv(t, path) })
	}
}

func testShimEnv(t *testing.T, self string) {
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

// TestShimGate: a standby shim waits at its gate (an inherited pipe): end of file makes it exit with
// Cancelled and exec nothing; a line makes it exec the tenant, which sees neither the gate's descriptor
// nor the shim's variables, and in ModeExec the environment's LISTEN_PID untouched.
func TestShimGate(t *testing.T) {
	for name, path := range executables(t) {
		t.Run(name, func(t *testing.T) { testShimGate(t, path) })
	}
}

func testShimGate(t *testing.T, self string) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to print what the tenant sees")
	}
	run := func(t *testing.T, open func(w *os.File)) (string, error) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(self)
		cmd.Args = []string{Arg0, sh, "sh", "-c", `test -e /dev/fd/3 && g=open || g=closed; echo "fd3=$g listen_pid=${LISTEN_PID:-unset} vars=${` + Env + `:-}${` + GateEnv + `:-}"`}
		cmd.Env = append(os.Environ(), Env+"="+ModeExec, GateEnv+"=3", "LISTEN_PID=1")
		cmd.ExtraFiles = []*os.File{r}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r.Close()
		open(w)
		err = cmd.Wait()
		return out.String(), err
	}
	out, err := run(t, func(w *os.File) { w.Close() })
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != Cancelled || out != "" {
		t.Errorf("gate closed without a line: %v, output %q; want exit status %d and nothing run", err, out, Cancelled)
	}
	out, err = run(t, func(w *os.File) { w.Write([]byte("\n")); w.Close() })
	if err != nil || strings.TrimSpace(out) != "fd3=closed listen_pid=1 vars=" {
		t.Errorf("gate opened: %v, tenant saw %q; want fd 3 closed, LISTEN_PID as it came (ModeExec sets none), no shim variables", err, out)
	}
}

// TestShimEmptyGate: an empty GateEnv is no gate: each shim execs the tenant at once.
func TestShimEmptyGate(t *testing.T) {
	for name, path := range executables(t) {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(path)
			cmd.Args = []string{Arg0, "/bin/sh", "sh", "-c", "echo ran"}
			cmd.Env = append(os.Environ(), Env+"="+ModeExec, GateEnv+"=")
			out, err := cmd.CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "ran" {
				t.Errorf("%v: %q; want the tenant run", err, out)
			}
		})
	}
}

// TestShimGateValues: a gate that is not decimal digits naming a descriptor from 3 to 2^31-1 exits 127
// in both shims, naming the value quoted. The Go shim took 4294967299 (Atoi), which the kernel read as
// descriptor 3, and the native one printed a value's control bytes raw into the tenant's log.
func TestShimGateValues(t *testing.T) {
	for name, path := range executables(t) {
		t.Run(name, func(t *testing.T) {
			for _, v := range []string{"4294967299", "+3", "3x", "2", "a\nb"} {
				cmd := exec.Command(path)
				cmd.Args = []string{Arg0, "/bin/true", "true"}
				cmd.Env = append(os.Environ(), Env+"="+ModeExec, GateEnv+"="+v)
				out, err := cmd.CombinedOutput()
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.ExitCode() != 127 {
					t.Errorf("gate %q: %v, want exit status 127", v, err)
				}
				if want := fmt.Sprintf("%s=%q is not an inherited descriptor", GateEnv, v); !strings.Contains(string(out), want) {
					t.Errorf("gate %q: stderr %q lacks %q", v, out, want)
				}
			}
		})
	}
}

// TestShimLowStackLimit: under a stack limit that the kernel's copy of a large environment nearly
// fills, a shim still execs a tenant that starts under that limit on its own. The native shim built
// its environment in an array on the stack and died of SIGSEGV where the tenant ran (7,000 variables
// under `ulimit -s 130`).
func TestShimLowStackLimit(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to lower the stack limit")
	}
	env := []string{Env + "=" + ModeListenFDs}
	for i := range 7000 {
		env = append(env, fmt.Sprintf("V%d=x", i))
	}
	run := func(argv ...string) error {
		cmd := exec.Command(sh, append([]string{"-c", `ulimit -s 130 && exec "$@"`, "sh"}, argv...)...)
		cmd.Env = env
		return cmd.Run()
	}
	if err := run("/bin/true"); err != nil {
		t.Skipf("the tenant itself does not start under this limit here: %v", err)
	}
	for name, path := range executables(t) {
		t.Run(name, func(t *testing.T) {
			if name == "native" {
				// Its memfd is close-on-exec, so sh cannot exec it by its /proc/self/fd path: a copy.
				b, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				path = filepath.Join(t.TempDir(), "shim")
				if err := os.WriteFile(path, b, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := run(path, "/bin/true", "true"); err != nil {
				t.Errorf("shim under a 130 KiB stack limit: %v, want the tenant run as it runs alone", err)
			}
		})
	}
}
