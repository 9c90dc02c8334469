package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/activator/activator/internal/registry"
)

// FuzzLoad runs registry.Load, with the decoders of every backing this build has (from newBackings, as
// serve and check use them), over any bytes. Load must not panic; each problem it reports must be a
// *registry.Error that names a line of the input, except the one problem about the file as a whole
// ("no routes configured": route "", key "routes", line 0, as TestGoldenProblemsNameKeys allows); and a
// config it accepts has, in every route, a name, a host, an upstream and a backing of this build.
func FuzzLoad(f *testing.F) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the decoders need no lifetime, and nothing may dial on one
	decoders := newBackings(ctx, slog.New(slog.DiscardHandler), false).decoders
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 2048 {
			t.Skip("longer than any input this needs, and slow to minimize")
		}
		if readsDevice(data) {
			t.Skip("names a device or /proc file, which a decoder may read without end (a password or CA file)")
		}
		cfg, err := registry.Load(data, decoders)
		if err != nil {
			if cfg != nil {
				t.Errorf("Load returned a config and an error: %v", err)
			}
			checkProblems(t, data, err)
			return
		}
		if cfg == nil {
			t.Fatal("Load returned neither a config nor an error")
		}
		for i, r := range cfg.Routes {
			switch {
			case r == nil:
				t.Errorf("route %d is nil", i)
			case r.Name == "":
				t.Errorf("route %d has no name: %+v", i, r)
			case len(r.Hosts) == 0:
				t.Errorf("route %q has no host", r.Name)
			case r.Upstream.Network == "" || r.Upstream.Address == "":
				t.Errorf("route %q has no upstream: %+v", r.Name, r.Upstream)
			case decoders[r.Backing] == nil:
				t.Errorf("route %q has backing %q, which this build lacks", r.Name, r.Backing)
			}
		}
	})
}

// checkProblems checks each problem in err (from Load of data): an *Error with a line in data, or the
// file-level "routes" problem.
func checkProblems(t *testing.T, data []byte, err error) {
	t.Helper()
	list := registry.Errors(err)
	if len(list) == 0 {
		t.Fatalf("Load failed with no problem listed: %v", err)
	}
	lines := lineCount(data)
	for i, e := range list {
		var re *registry.Error
		switch {
		case !errors.As(e, &re):
			t.Errorf("problem %d is %T (%v), want *registry.Error", i, e, e)
		case re.Line == 0 && re.Route == "" && re.Key == "routes":
			// About the file as a whole: no line to point at.
		case re.Line <= 0:
			t.Errorf("problem %d names no line: route %q, key %q: %v", i, re.Route, re.Key, e)
		case re.Line > lines:
			t.Errorf("problem %d names line %d of an input of %d lines: %v", i, re.Line, lines, e)
		}
	}
}

// lineCount is the number of lines YAML sees in data, the last one even when empty: one more than the
// line breaks (LF, CR not before an LF, NEL, LS and PS).
func lineCount(data []byte) int {
	n := 1
	for i, c := range data {
		if c == '\n' || c == '\r' && (i+1 == len(data) || data[i+1] != '\n') {
			n++
		}
	}
	for _, sep := range []string{"\u0085", "\u2028", "\u2029"} {
		n += bytes.Count(data, []byte(sep))
	}
	return n
}

// readsDevice reports whether any string in the YAML document (after its escapes) names something
// under /dev or /proc: /dev/zero as a password file would be read without end, /dev/stdin would
// block. Bytes that do not parse reach no decoder.
func readsDevice(data []byte) bool {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil {
		return false
	}
	var walk func(n *yaml.Node) bool
	walk = func(n *yaml.Node) bool {
		if strings.Contains(n.Value, "/dev") || strings.Contains(n.Value, "/proc") {
			return true
		}
		for _, c := range n.Content {
			if walk(c) {
				return true
			}
		}
		return false
	}
	return walk(&doc)
}
