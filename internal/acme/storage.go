package acme

import (
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/activator/activator/internal/privdir"
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

// Check reports, without contacting the CA or creating anything, what New would refuse in opts: an
// unreadable ca_root, an issuer it cannot build, a storage path that cannot be a directory or cannot
// be written; and, as warnings, a storage directory others may write or read (it holds the account's
// and the certificates' private keys). For `activator check`, which passed configs serve refused.
func Check(opts Options) (problems []error, warnings []string) {
	if opts.ACME == nil {
		return nil, nil
	}
	roots, err := loadRoots(opts.ACME.CARoot)
	if err != nil {
		problems = append(problems, err)
	} else if _, err := issuerTemplate(opts, roots); err != nil {
		problems = append(problems, err)
	}
	dir, err := storageDir(opts.ACME.Storage, os.Getenv)
	if err != nil {
		return append(problems, err), warnings
	}
	// The directory, or the nearest of its parents that exists, must be a directory this user may
	// write (New makes the rest), and nobody but this user and root may change it or the path to it.
	private := privdir.CheckIfExists(dir)
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if (errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENOTDIR)) && p != filepath.Dir(p) {
			continue
		}
		switch {
		case err != nil:
			problems = append(problems, fmt.Errorf("tls.acme.storage: %w", err))
		case !fi.IsDir():
			problems = append(problems, fmt.Errorf("tls.acme.storage: %s: %s is not a directory", dir, p))
		case unix.Access(p, unix.W_OK|unix.X_OK) != nil:
			problems = append(problems, fmt.Errorf("tls.acme.storage: %s: %s is not writable by this user", dir, p))
		case private != nil:
			problems = append(problems, fmt.Errorf("tls.acme.storage: %w (fix: a directory only this user and root can write, every step of the path to it too)", private))
		case p == dir && fi.Mode().Perm()&0o077 != 0:
			warnings = append(warnings, fmt.Sprintf("tls.acme.storage: %s is mode %04o: others may read the private keys in it (the activator makes it 0700)", dir, fi.Mode().Perm()))
		}
		return problems, warnings
	}
}
