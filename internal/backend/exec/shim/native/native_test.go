package native

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/activator/activator/internal/testenv"
)

// TestEmbeddedMatchesSource: the embedded executable is what build.sh makes of csrc/shim.c, so the
// bytes committed are the source committed. It needs gcc (Debian package gcc).
func TestEmbeddedMatchesSource(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("the embedded shim is linux/amd64's")
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		testenv.Missing(t, "gcc not found (Debian package gcc): cannot rebuild the native shim to compare")
	}
	dir := t.TempDir()
	for _, f := range []string{"build.sh", "csrc/shim.c"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("sh", filepath.Join(dir, "build.sh"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build.sh: %v: %s", err, out)
	}
	built, err := os.ReadFile(filepath.Join(dir, "shim-linux-amd64"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(built, executable) {
		v, _ := exec.Command("gcc", "--version").Output()
		t.Fatalf("build.sh makes %d bytes that differ from the embedded %d: run `go generate ./internal/backend/exec/shim/native` and commit shim-linux-amd64 (or this gcc, %q, compiles differently from the one that made it)",
			len(built), len(executable), strings.SplitN(string(v), "\n", 2)[0])
	}
}

// TestOpen: the shim is held at a descriptor of at least minFD, sealed against writes, and Close
// releases it.
func TestOpen(t *testing.T) {
	s, err := Open()
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	fd, err := strconv.Atoi(strings.TrimPrefix(s.Path(), "/proc/self/fd/"))
	if err != nil || fd < minFD {
		t.Fatalf("path %q: want /proc/self/fd/N with N >= %d", s.Path(), minFD)
	}
	if f, err := os.OpenFile(s.Path(), os.O_WRONLY, 0); err == nil {
		_, werr := f.Write([]byte("x"))
		f.Close()
		if werr == nil {
			t.Error("wrote to the sealed shim")
		}
	}
	link, err := os.Readlink(s.Path())
	if err != nil || !strings.Contains(link, Name) {
		t.Errorf("descriptor %d is %q (%v), want the memfd %s", fd, link, err, Name)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Readlink(s.Path()); err == nil {
		t.Error("the memfd is still open after Close")
	}
	if err := s.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}
