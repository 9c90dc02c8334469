package testenv

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
)

// PidsWithEnv lists the live (non-zombie) processes whose environment holds key=value: how tests find
// the tenants they started, whatever those forked.
func PidsWithEnv(key, value string) []int {
	want := []byte("\x00" + key + "=" + value + "\x00") // a whole entry, never the tail of another
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(append([]byte{0}, env...), want) {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] != 'Z' {
			pids = append(pids, pid)
		}
	}
	return pids
}

// ForkingThreads is the function of the exec backing's forking threads (internal/backend/exec,
// fork.go): goroutines locked to their threads that live as long as the process by design, since
// every child's parent-death signal is tied to one of them. Goroutine leak checks ignore it
// (goleak.IgnoreTopFunction).
const ForkingThreads = "github.com/activator/activator/internal/backend/exec.forkLoop"
