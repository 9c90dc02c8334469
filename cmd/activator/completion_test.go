package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/activator/activator/internal/testenv"
)

// TestCompletionScripts: each script is valid for its shell, and offers every subcommand and every flag
// each subcommand really has (read from its -h).
func TestCompletionScripts(t *testing.T) {
	flagRE := regexp.MustCompile(`(?m)^  -([a-z-]+)`)
	for _, c := range completionCommands {
		if len(c.flags) == 0 {
			continue
		}
		_, help := runMain(t, c.name, "-h")
		var have []string
		for _, m := range flagRE.FindAllStringSubmatch(help, -1) {
			have = append(have, "--"+m[1])
		}
		slices.Sort(have)
		want := slices.Sorted(slices.Values(c.flags))
		if !slices.Equal(have, want) {
			t.Errorf("%s: completion offers %v, -h lists %v", c.name, want, have)
		}
	}
	for _, shell := range []string{"bash", "zsh"} {
		t.Run(shell, func(t *testing.T) {
			code, out := runMain(t, "completion", shell)
			if code != 0 {
				t.Fatalf("completion %s: exit %d:\n%s", shell, code, out)
			}
			for _, c := range completionCommands {
				if !strings.Contains(out, c.name) {
					t.Errorf("completion %s: no %q", shell, c.name)
				}
			}
			if !strings.Contains(out, "status --names") {
				t.Errorf("completion %s: route names are not completed from `activator status --names`", shell)
			}
			sh, err := exec.LookPath(shell)
			if err != nil {
				testenv.Missing(t, "no %s on this host (apt-get install %s): the script's syntax is not checked", shell, shell)
				return
			}
			path := filepath.Join(t.TempDir(), "activator."+shell)
			if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			if b, err := exec.Command(sh, "-n", path).CombinedOutput(); err != nil {
				t.Errorf("%s -n: %v\n%s", shell, err, b)
			}
		})
	}
	if code, out := runMain(t, "completion", "fish"); code != 2 || !strings.Contains(out, "bash or zsh") {
		t.Errorf("completion fish: exit %d, output:\n%s", code, out)
	}
}

// TestBashCompletionRoutes runs the bash completion function: the route names come from the admin API.
func TestBashCompletionRoutes(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash on this host")
	}
	s := startServed(t, configYAML(t, appRoute{Name: "alpha"}, appRoute{Name: "beta"}))
	_, script := runMain(t, "completion", "bash")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The script calls `activator`: make that this test binary, run as main.
	dir := t.TempDir()
	wrapper := "#!/bin/sh\n" + serveChildEnv + "=1 exec " + self + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "activator"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	probe := script + `
COMP_WORDS=(activator wake --admin ` + s.admin + ` a); COMP_CWORD=4; _activator; echo "routes: ${COMPREPLY[*]}"
COMP_WORDS=(activator ex); COMP_CWORD=1; _activator; echo "commands: ${COMPREPLY[*]}"
COMP_WORDS=(activator explain --l); COMP_CWORD=2; _activator; echo "flags: ${COMPREPLY[*]}"
COMP_WORDS=(activator status --admin ` + s.admin + ` b); COMP_CWORD=4; _activator; echo "status routes: ${COMPREPLY[*]}"
COMP_WORDS=(activator status --state aw); COMP_CWORD=3; _activator; echo "states: ${COMPREPLY[*]}"
`
	cmd := exec.Command(bash, "-c", probe)
	cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, out)
	}
	for _, want := range []string{"routes: alpha\n", "commands: explain\n", "flags: --last\n", "status routes: beta\n", "states: awake\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("completion: want %q in:\n%s", want, out)
		}
	}
}
