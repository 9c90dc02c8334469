package tlsedge

import (
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/activator/activator/internal/registry"
)

// Certs is the certificates from files (tls.certificates), indexed by the DNS names their leaves carry.
// It is immutable once loaded: a reload loads a new one and puts it in force with Edge.Reload, and a
// handshake keeps the certificate it was given.
type Certs struct {
	list     []*tls.Certificate          // in file order; list[0] is the default
	exact    map[string]*tls.Certificate // "app.example.com"
	wildcard map[string]*tls.Certificate // "example.com", for "*.example.com"
	files    []string                    // every cert_file and key_file, in file order
	served   []servedCert                // the pairs some hello can get, in file order (metrics)
}

// servedCert is a pair some hello can get: its cert_file, as configured, and its leaf's NotAfter.
type servedCert struct {
	file     string
	notAfter time.Time
}

// A CertError is one certificate pair that cannot be served.
type CertError struct {
	Key  string // the config key: tls.certificates[i].cert_file, .key_file, or the pair tls.certificates[i]
	File string // the file, or both ("cert.pem and key.pem") when the problem is the pair's
	Err  error
}

func (e *CertError) Error() string { return fmt.Sprintf("%s: %s: %v", e.Key, e.File, e.Err) }

func (e *CertError) Unwrap() error { return e.Err }

// LoadCerts reads each pair of PEM files: the certificate, with its chain after it, and its key. Every
// pair is tried, and each one that cannot be served is a *CertError (missing or unreadable, not PEM,
// the key not matching the certificate), all joined into err; the Certs returned hold the pairs that
// loaded. A certificate that is expired or not yet valid at now still loads, with a warning: a renewal
// may be on its way, and it is the operator's to replace.
func LoadCerts(files []registry.CertFile, now time.Time) (*Certs, []string, error) {
	c := &Certs{exact: map[string]*tls.Certificate{}, wildcard: map[string]*tls.Certificate{}}
	var warnings []string
	var errs []error
	seen := map[string]string{} // name -> the key of the pair that serves it
	for i, f := range files {
		c.files = append(c.files, f.CertFile, f.KeyFile)
		key := fmt.Sprintf("tls.certificates[%d]", i)
		cert, err := loadPair(key, f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		warnings = append(warnings, validity(key, f.CertFile, cert.Leaf, now)...)
		warnings = append(warnings, c.add(key, f.CertFile, cert, seen)...)
	}
	return c, warnings, errors.Join(errs...)
}

// add indexes cert under its leaf's DNS names; a name an earlier pair already serves stays with it.
func (c *Certs) add(key, file string, cert *tls.Certificate, seen map[string]string) []string {
	var warnings []string
	first := len(c.list) == 0
	c.list = append(c.list, cert)
	names, own := 0, 0 // the names it carries that clients take; those it is served for
	for _, n := range cert.Leaf.DNSNames {
		n = hostName(n)
		index, name := c.exact, n
		if rest, ok := strings.CutPrefix(n, "*."); ok {
			index, name = c.wildcard, rest
		}
		if name == "" || strings.Contains(name, "*") {
			continue // no client takes a wildcard other than one leading label
		}
		names++
		if by, ok := seen[n]; ok {
			warnings = append(warnings, fmt.Sprintf("%s.cert_file: %s: %s is also in %s, which is served for it", key, file, n, by))
			continue
		}
		seen[n] = key
		index[name] = cert
		own++
	}
	if own > 0 || first {
		c.served = append(c.served, servedCert{file: file, notAfter: cert.Leaf.NotAfter})
	}
	switch {
	case own > 0:
	case names == 0 && first:
		warnings = append(warnings, fmt.Sprintf("%s.cert_file: %s: carries no DNS name (subjectAltName) it can be chosen by; it is served only as the default", key, file))
	case first:
	case names == 0:
		warnings = append(warnings, fmt.Sprintf("%s.cert_file: %s: carries no DNS name (subjectAltName) it can be chosen by, and is not the first (the default): it is never served", key, file))
	default:
		warnings = append(warnings, fmt.Sprintf("%s.cert_file: %s: every name it carries is an earlier pair's, and it is not the first (the default): it is never served", key, file))
	}
	return warnings
}

// loadPair loads one pair, naming the file at fault.
func loadPair(key string, f registry.CertFile) (*tls.Certificate, error) {
	certPEM, certErr := readPEM(key+".cert_file", f.CertFile, false)
	keyPEM, keyErr := readPEM(key+".key_file", f.KeyFile, true)
	if err := errors.Join(certErr, keyErr); err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		if strings.Contains(err.Error(), "does not match") {
			err = errors.New("the key in key_file does not match the certificate in cert_file (the first certificate in it must be the leaf)")
		}
		return nil, &CertError{Key: key, File: f.CertFile + " and " + f.KeyFile, Err: err}
	}
	if cert.Leaf == nil { // X509KeyPair fills it in unless GODEBUG=x509keypairleaf=0
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, &CertError{Key: key + ".cert_file", File: f.CertFile, Err: err}
		}
	}
	// A key Go refuses to sign with (RSA under 1024 bits) loads, and fails every handshake it is
	// chosen for, with a "handshake failure" to the client and the cause at debug level only (found
	// with the real binary): sign once now.
	if signer, ok := cert.PrivateKey.(crypto.Signer); ok {
		digest := sha256.Sum256([]byte("activator: can this key sign?"))
		if _, err := signer.Sign(rand.Reader, digest[:], crypto.SHA256); err != nil {
			return nil, &CertError{Key: key + ".key_file", File: f.KeyFile, Err: fmt.Errorf("the key cannot sign a handshake: %w", err)}
		}
	}
	return &cert, nil
}

// maxCertFileBytes bounds a certificate or key file: a chain is a few kilobytes.
const maxCertFileBytes = 1 << 20

// readSmallFile reads a regular file of at most maxCertFileBytes. A FIFO named as cert_file hung
// check (and would hang every reload), and /dev/zero ran it out of memory (found with the real
// binary).
func readSmallFile(file string) ([]byte, error) {
	// Stat first: opening a FIFO blocks until a writer comes. O_NONBLOCK makes a FIFO swapped in
	// between open at once, to be refused by the second look.
	if fi, err := os.Stat(file); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%v)", fi.Mode().Type())
	}
	f, err := os.OpenFile(file, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%v)", fi.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxCertFileBytes+1))
	if err == nil && len(b) > maxCertFileBytes {
		err = fmt.Errorf("larger than %d KiB", maxCertFileBytes>>10)
	}
	return b, err
}

// readPEM reads a certificate file (wantKey false) or a key file, checking that it holds the PEM block
// it should: the usual mistakes (DER, the two files swapped, an encrypted key) get a hint.
func readPEM(key, file string, wantKey bool) ([]byte, error) {
	b, err := readSmallFile(file)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, &CertError{Key: key, File: file, Err: errors.New("no such file")}
	case errors.Is(err, fs.ErrPermission):
		return nil, &CertError{Key: key, File: file, Err: errors.New("permission denied: the activator's user cannot read it")}
	case err != nil:
		return nil, &CertError{Key: key, File: file, Err: err}
	}
	var certs, keys, encrypted int
	for rest := b; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			break
		}
		switch {
		case blk.Type == "CERTIFICATE":
			certs++
		case blk.Type == "ENCRYPTED PRIVATE KEY" || blk.Headers["Proc-Type"] == "4,ENCRYPTED":
			encrypted++
		case strings.HasSuffix(blk.Type, "PRIVATE KEY"):
			keys++
		}
	}
	var problem string
	switch {
	case !wantKey && certs > 0, wantKey && keys > 0:
		return b, nil
	case wantKey && encrypted > 0:
		problem = "the private key is encrypted: the activator needs it unencrypted (openssl pkey -in FILE -out FILE.plain), readable only by its user"
	case !wantKey && keys+encrypted > 0:
		problem = "holds a private key, not a certificate: are cert_file and key_file swapped?"
	case wantKey && certs > 0:
		problem = "holds a certificate, not a private key: are cert_file and key_file swapped?"
	case wantKey:
		problem = "not PEM: no -----BEGIN PRIVATE KEY----- block (a DER key converts with openssl pkey -inform der)"
	default:
		problem = "not PEM: no -----BEGIN CERTIFICATE----- block (a DER certificate converts with openssl x509 -inform der)"
	}
	return nil, &CertError{Key: key, File: file, Err: errors.New(problem)}
}

// validity warns of a leaf that is not valid at now.
func validity(key, file string, leaf *x509.Certificate, now time.Time) []string {
	switch {
	case now.After(leaf.NotAfter):
		return []string{fmt.Sprintf("%s.cert_file: %s: expired on %s: clients refuse it until it is renewed", key, file, leaf.NotAfter.UTC().Format(time.RFC3339))}
	case now.Before(leaf.NotBefore):
		return []string{fmt.Sprintf("%s.cert_file: %s: not valid before %s: clients refuse it until then (is the clock right?)", key, file, leaf.NotBefore.UTC().Format(time.RFC3339))}
	}
	return nil
}

// match returns the certificate for name (lower case, no trailing dot): the pair that carries it
// exactly, else the one whose wildcard covers it. A wildcard covers one label: *.example.com covers
// a.example.com, not example.com nor a.b.example.com. nil when none does.
func (c *Certs) match(name string) *tls.Certificate {
	if c == nil || name == "" {
		return nil
	}
	if cert := c.exact[name]; cert != nil {
		return cert
	}
	if i := strings.IndexByte(name, '.'); i > 0 {
		return c.wildcard[name[i+1:]]
	}
	return nil
}

// Covers reports whether a certificate carries host, exactly or under a wildcard. host is a Host
// header or a config host: any case, with an optional port and trailing dot; "*.example.com" is covered
// by a certificate for *.example.com.
func (c *Certs) Covers(host string) bool { return c.match(hostName(host)) != nil }

// Default is the certificate for a hello that names no host a certificate carries: the first; nil
// without any.
func (c *Certs) Default() *tls.Certificate {
	if c == nil || len(c.list) == 0 {
		return nil
	}
	return c.list[0]
}

// Files are every cert_file and key_file, loaded or not, in file order: what a watcher watches.
func (c *Certs) Files() []string {
	if c == nil {
		return nil
	}
	return c.files
}

// hostName is h as certificates name hosts: lower case (ASCII only, as the activator's routing
// folds hosts), without a port, brackets or a trailing dot.
func hostName(h string) string {
	if rest, ok := strings.CutPrefix(h, "["); ok {
		h, _, _ = strings.Cut(rest, "]")
	} else if i := strings.IndexByte(h, ':'); i >= 0 && strings.Count(h, ":") == 1 {
		h = h[:i]
	}
	h = strings.TrimSuffix(h, ".")
	for i := 0; i < len(h); i++ {
		if c := h[i]; c >= 'A' && c <= 'Z' {
			b := []byte(h)
			for j, c := range b {
				if c >= 'A' && c <= 'Z' {
					b[j] = c + 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return h
}
