package main

// Exec tenants in cgroups, end to end: this test binary re-executed as `activator serve` (and
// `activator check`), with a cgroup_root of the test's own.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/activator/activator/internal/cgroup"
	"github.com/activator/activator/internal/demoapp"
	"github.com/activator/activator/internal/testenv"
)

var cgroupSeq atomic.Int64

// testCgroupRoot is a cgroup_root for this test alone, below this process's own cgroup (test
// activators running at once must never share one: each start kills what its root holds). It skips,
// or fails under ACTIVATOR_INTEGRATION=required, without a writable cgroup v2. Whatever is left in it
// when the test ends is killed and removed, and reported.
func testCgroupRoot(t *testing.T) (root, dir string) {
	t.Helper()
	mnt, err := cgroup.Mount()
	if err != nil {
		testenv.Missing(t, "no cgroup v2: %v", err)
	}
	self, err := cgroup.Self()
	if err != nil {
		testenv.Missing(t, "no cgroup v2: %v", err)
	}
	root = filepath.Join(self, fmt.Sprintf("cmd-test-%d-%d", os.Getpid(), cgroupSeq.Add(1)))
	dir = filepath.Join(mnt, root)
	if err := os.Mkdir(dir, 0o755); err != nil {
		testenv.Missing(t, "cgroup v2 not writable: %v", err)
	}
	t.Cleanup(func() {
		g := cgroup.At(dir)
		kids, _ := g.Children()
		ctx, cancel := context.WithTimeout(context.Background(), patience)
		defer cancel()
		for _, k := range kids {
			t.Errorf("tenant cgroup %s outlived its activator", k.Dir())
			_ = k.Kill(ctx)
			_ = k.Remove()
		}
		_ = g.Remove()
	})
	return root, dir
}

// wrapperRoute is an exec route whose tenant is a wrapper script around the demo app,
// sh -c '"$0" & wait': the shape that outlived a SIGKILLed activator before tenants had cgroups. Its
// processes carry CMD_TEST_TAG=tag.
func wrapperRoute(t *testing.T, tag, upstream string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf(`routes:
  - name: app
    hosts: [app.test]
    backing: exec
    upstream: %q
    health: {path: /healthz, interval: 50ms}
    exec:
      argv: [/bin/sh, -c, '"$0" & wait', %q]
      stop_grace: 5s
      env: {%s: "1", CMD_TEST_TAG: %q, GORACE: "atexit_sleep_ms=0"}
`, upstream, self, demoapp.ChildEnv, tag)
}

// taggedPids lists the live processes whose environment holds CMD_TEST_TAG=tag.
func taggedPids(tag string) []int { return testenv.PidsWithEnv("CMD_TEST_TAG", tag) }

// waitPids polls /proc (external process state) until the tagged processes number n.
func waitPids(t *testing.T, tag string, n int, what string) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for len(taggedPids(tag)) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s: processes %v, want %d, after %v", what, taggedPids(tag), n, patience)
		}
		pause := time.NewTimer(10 * time.Millisecond)
		<-pause.C
	}
}

// getApp sends GET / for app.test to the edge and returns the status.
func getApp(t *testing.T, edge string) int {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+edge+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "app.test"
	resp, err := (&http.Client{Timeout: patience}).Do(req)
	if err != nil {
		t.Fatalf("GET app.test: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A SIGKILLed activator whose tenant is a wrapper script leaves the wrapper's server running (the
// wrapper itself dies of its parent-death signal); the next activator, before it serves, kills that
// orphan, and its own wake gets the port.
func TestRestartKillsOrphanedTenant(t *testing.T) {
	root, dir := testCgroupRoot(t)
	tag := fmt.Sprintf("%d-%d", os.Getpid(), cgroupSeq.Add(1))
	t.Cleanup(func() {
		for _, pid := range taggedPids(tag) {
			t.Errorf("tenant process %d outlived the test", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	config := fmt.Sprintf("cgroup_root: %s\n", root) + wrapperRoute(t, tag, freeLoopbackAddr(t))

	first := startServed(t, config)
	if len(first.logs.matching("exec tenants are contained in cgroups")) != 1 {
		t.Errorf("no start-up line saying exec tenants are contained in cgroups")
	}
	if code := getApp(t, first.edge); code != 200 {
		t.Fatalf("first activator: GET = %d, want 200", code)
	}
	waitPids(t, tag, 2, "wrapper and server")
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-first.exited
	waitPids(t, tag, 1, "the wrapper to die with the SIGKILLed activator, its server to stay")

	second := startServed(t, config) // returns once it listens: the clean-up came before
	if pids := taggedPids(tag); len(pids) > 0 {
		t.Fatalf("the restarted activator listens, and the orphaned tenant %v still runs", pids)
	}
	if len(second.logs.matching("killed an exec tenant left running by an earlier activator")) != 1 {
		t.Errorf("the restart did not log the orphan it killed")
	}
	if code := getApp(t, second.edge); code != 200 {
		t.Fatalf("restarted activator: GET = %d, want 200 (from a tenant of its own)", code)
	}
	resp, err := http.Get("http://" + second.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(metrics, []byte(`activator_tenant_cpu_seconds_total{route="app"}`)) {
		t.Errorf("/metrics has no activator_tenant_cpu_seconds_total for the awake tenant")
	}
	second.sigterm()
	second.wait()
	if pids := taggedPids(tag); len(pids) > 0 {
		t.Errorf("after a clean shutdown, tenant processes %v still run", pids)
	}
	if _, err := os.Stat(filepath.Join(dir, "app")); !os.IsNotExist(err) {
		t.Errorf("the tenant's cgroup is still there after a clean shutdown: %v", err)
	}
}

// `activator check` says when a route's cgroup limit cannot be applied here, naming the key, instead
// of ignoring it.
func TestCheckUnavailableLimits(t *testing.T) {
	testCgroupRoot(t) // skips (or fails when required) without a writable cgroup v2
	mnt, _ := cgroup.Mount()
	self, _ := cgroup.Self()
	have, err := cgroup.At(filepath.Join(mnt, self)).Controllers()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "activator.yaml")
	config := strings.Replace(wrapperRoute(t, "check", freeLoopbackAddr(t)), "      stop_grace: 5s\n",
		"      stop_grace: 5s\n      memory_max: 64MiB\n      pids_max: 32\n", 1)
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out := runMain(t, "check", "--config", path)
	for _, l := range []struct{ key, ctrl string }{{"memory_max", "memory"}, {"pids_max", "pids"}} {
		want := l.key + " is unavailable: the " + l.ctrl + " controller is not enabled"
		available := strings.Contains(" "+strings.Join(have, " ")+" ", " "+l.ctrl+" ")
		if got := strings.Contains(out, want); got == available {
			t.Errorf("%s (controller %s available: %v): check said:\n%s", l.key, l.ctrl, available, out)
		}
	}
	if !strings.Contains(strings.Join(have, " "), "memory") && code == 0 {
		t.Errorf("check passed with an unavailable limit:\n%s", out)
	}
}

// `activator check` judges the cgroup_root the config names, not the automatic one: with
// cgroup_root: off, sleep: freeze cannot work, and check says so.
func TestCheckHonoursCgroupRoot(t *testing.T) {
	testCgroupRoot(t) // with a writable cgroup v2, the automatic root would pass
	path := filepath.Join(t.TempDir(), "activator.yaml")
	config := "cgroup_root: \"off\"\n" + strings.Replace(wrapperRoute(t, "checkroot", freeLoopbackAddr(t)), "      stop_grace: 5s\n",
		"      stop_grace: 5s\n      sleep: freeze\n", 1)
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out := runMain(t, "check", "--config", path)
	if want := "sleep: freeze is unavailable"; code == 0 || !strings.Contains(out, want) {
		t.Errorf("check with cgroup_root: off and sleep: freeze: exit %d, output lacks %q:\n%s", code, want, out)
	}
}
