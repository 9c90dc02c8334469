package upstream

import (
	"bufio"
	"net/http"
)

// WriteHead writes r's head as the fast path writes it (writeHead) for a peer no proxy is trusted
// from: for package upstream_test, whose tests compare the edge's loop (internal/warmloop, which
// imports upstream) with it.
func WriteHead(bw *bufio.Writer, r *http.Request) {
	fw := newForwarding(r, nil)
	writeHead(bw, r, &fw, "")
}
