package native

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"

	"golang.org/x/sys/unix"
)

//go:generate sh build.sh

// executable is csrc/shim.c, compiled by build.sh.
//
//go:embed shim-linux-amd64
var executable []byte

// minFD is the least descriptor number Open keeps the memfd at. os/exec's child dup2s its Files into
// 0..len(Files)-1 and moves descriptors that would collide to len(Files) and up; the exec backing
// passes at most five files, so 64 is clear of all of them.
const minFD = 64

// errSelfTest wraps what the trial run of the executable returned instead of the gate's status.
func errSelfTest(what string, err error) error {
	return fmt.Errorf("native shim: trial run %s: %w", what, err)
}

// Open writes the shim into a sealed memfd and runs it once as a standby whose gate is at end of file,
// which must exit with the gate's status 75 (package shim's Cancelled) and print nothing: so the kernel
// executes it from the memfd and it reads its environment. Close releases it.
func Open() (*Shim, error) {
	fd, err := unix.MemfdCreate(Name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) { // before Linux 6.3, which added MFD_EXEC; memfds were executable
		fd, err = unix.MemfdCreate(Name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, fmt.Errorf("native shim: memfd_create: %w", err)
	}
	s := &Shim{fd: fd}
	if err := s.fill(); err != nil {
		unix.Close(fd)
		return nil, err
	}
	high, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, minFD)
	unix.Close(fd)
	if err != nil {
		return nil, fmt.Errorf("native shim: move the memfd to descriptor %d or above: %w", minFD, err)
	}
	s.fd, s.path = high, "/proc/self/fd/"+strconv.Itoa(high)
	if err := s.trial(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// fill writes the executable and seals the memfd against any change.
func (s *Shim) fill() error {
	for b := executable; len(b) > 0; {
		n, err := unix.Write(s.fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("native shim: write the memfd: %w", err)
		}
		b = b[n:]
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(uintptr(s.fd), unix.F_ADD_SEALS, seals); err != nil {
		return fmt.Errorf("native shim: seal the memfd: %w", err)
	}
	return nil
}

// trial runs the shim once as a standby whose gate is /dev/null: it must exit with status 75, silent.
func (s *Shim) trial() error {
	null, err := os.Open(os.DevNull)
	if err != nil {
		return errSelfTest("open "+os.DevNull, err)
	}
	defer null.Close()
	cmd := exec.Command(s.path)
	cmd.Args = []string{Name, "/nonexistent", "nonexistent"}
	cmd.Env = []string{"ACTIVATOR_EXEC_SHIM=exec", "ACTIVATOR_EXEC_SHIM_GATE=3"}
	cmd.ExtraFiles = []*os.File{null}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ee.ExitCode() == 75 && len(out) == 0:
		return nil
	case err == nil:
		return errSelfTest("exited 0", errors.New("want status 75"))
	default:
		return errSelfTest(fmt.Sprintf("(output %q)", out), err)
	}
}

// Close releases the memfd; children already started are not affected.
func (s *Shim) Close() error {
	if s == nil || s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	return err
}
