package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"

	"github.com/activator/activator/internal/registry"
)

// The exec backing's secret list is every password_env a load or reload has named, and the admin
// token's variable.
func TestBackingsSecretNames(t *testing.T) {
	t.Setenv("CMD_TEST_BMC_A", "a")
	t.Setenv("CMD_TEST_BMC_B", "b")
	bk := newBackings(context.Background(), slog.New(slog.DiscardHandler), false)
	config := func(passwordEnv string) []byte {
		return fmt.Appendf(nil, `routes:
  - name: app
    hosts: [app.test]
    backing: exec
    upstream: 127.0.0.1:18080
    exec: {argv: [/bin/true]}
  - name: node
    hosts: [node.test]
    backing: redfish
    upstream: 10.0.0.5:80
    redfish: {endpoint: "https://10.0.0.17", username: admin, password_env: %s}
`, passwordEnv)
	}
	if _, err := registry.Load(config("CMD_TEST_BMC_A"), bk.decoders); err != nil {
		t.Fatal(err)
	}
	if got, want := bk.secrets.list(), []string{registry.AdminTokenEnv, "CMD_TEST_BMC_A"}; !slices.Equal(got, want) {
		t.Fatalf("after load: secrets %q, want %q", got, want)
	}
	if _, err := registry.Load(config("CMD_TEST_BMC_B"), bk.decoders); err != nil {
		t.Fatal(err)
	}
	if got, want := bk.secrets.list(), []string{registry.AdminTokenEnv, "CMD_TEST_BMC_A", "CMD_TEST_BMC_B"}; !slices.Equal(got, want) {
		t.Fatalf("after reload: secrets %q, want %q", got, want)
	}
}
