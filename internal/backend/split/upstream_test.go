package split

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/activator/activator/internal/registry"
	"github.com/activator/activator/internal/tenant"
)

// TestCheckUnixUpstream: Check reports a unix upstream whose path is a directory, whatever the backing,
// beside the backing's own problem; a path that is absent (the tenant creates it) or a socket passes.
func TestCheckUnixUpstream(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "s")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ex := &opener{name: "exec"}
	un := &opener{name: "unit", checkErr: errors.New("cannot freeze")}
	p := New(map[string]tenant.Opener{"exec": ex, "unit": checkingOpener{un}})
	unix := func(path string) registry.Upstream { return registry.Upstream{Network: "unix", Address: path} }
	tests := []struct {
		name  string
		route registry.Route
		want  []string // substrings of the error, in order; none for a pass
	}{
		{name: "directory", route: registry.Route{Name: "a", Backing: "exec", Upstream: unix(dir)},
			want: []string{`route "a": upstream unix:` + dir + ` is a directory`}},
		{name: "directory and the backing's problem", route: registry.Route{Name: "b", Backing: "unit", Upstream: unix(dir)},
			want: []string{`route "b": upstream unix:` + dir + ` is a directory`, `route "b": unit: cannot freeze`}},
		{name: "absent", route: registry.Route{Name: "c", Backing: "exec", Upstream: unix(filepath.Join(dir, "absent"))}},
		{name: "socket", route: registry.Route{Name: "d", Backing: "exec", Upstream: unix(sock)}},
		{name: "tcp", route: registry.Route{Name: "e", Backing: "exec", Upstream: registry.Upstream{Network: "tcp", Address: "127.0.0.1:1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := p.Check(context.Background(), &tt.route)
			if len(tt.want) == 0 {
				if err != nil {
					t.Errorf("Check = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Check = nil, want %q", tt.want)
			}
			msg := err.Error()
			for _, w := range tt.want {
				i := strings.Index(msg, w)
				if i < 0 {
					t.Fatalf("Check = %q, want it to contain %q (in order: %q)", err, w, tt.want)
				}
				msg = msg[i+len(w):]
			}
		})
	}
}
