package acme

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// storageDir resolves tls.acme.storage: set as set; else $STATE_DIRECTORY/acme (the first directory
// when systemd lists several); else $XDG_DATA_HOME/activator/acme; else
// $HOME/.local/share/activator/acme.
func storageDir(set string, getenv func(string) string) (string, error) {
	switch {
	case set != "":
		return set, nil
	case getenv("STATE_DIRECTORY") != "":
		first, _, _ := strings.Cut(getenv("STATE_DIRECTORY"), ":")
		return filepath.Join(first, "acme"), nil
	case filepath.IsAbs(getenv("XDG_DATA_HOME")):
		return filepath.Join(getenv("XDG_DATA_HOME"), "activator", "acme"), nil
	case getenv("HOME") != "":
		return filepath.Join(getenv("HOME"), ".local", "share", "activator", "acme"), nil
	}
	return "", errors.New("tls.acme.storage: unset, and neither $STATE_DIRECTORY, $XDG_DATA_HOME nor $HOME names a directory for it")
}

// loadRoots reads tls.acme.ca_root, the roots to trust for the CA's own TLS; "" is the system's.
func loadRoots(path string) (*x509.CertPool, error) {
	if path == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tls.acme.ca_root: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls.acme.ca_root: %s holds no PEM certificate", path)
	}
	return pool, nil
}
