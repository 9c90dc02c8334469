package upstream

// One HTTP/1.1 connection to the upstream and the exchange on it, shared by the pool and the health
// probe.

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Conn is a connection to the upstream together with the buffers the pool writes and reads it with.
// The health probe makes its requests on one (Get), so the connection its passing probe hands to
// Client.Adopt is already the pool's: the answer was read by the pool's reader, and the pool can see
// that nothing is left in it.
type Conn struct {
	net.Conn
	br *bufio.Reader
	bw *bufio.Writer

	idleAt time.Time // when it was last returned to the pool
	reused bool      // carried a request before
}

// NewConn wraps c with 4 KiB buffers: they carry request and response heads; bodies larger than the
// buffer bypass it (bufio reads straight into the caller's 32 KiB copy buffer). 32 KiB each cost
// 64 KiB per connection, allocated and zeroed on every dial of a herd.
func NewConn(c net.Conn) *Conn {
	return &Conn{Conn: c, br: bufio.NewReaderSize(c, 4<<10), bw: bufio.NewWriterSize(c, 4<<10)}
}

// Get writes head, the complete head of a request without a body (request line, fields and the empty
// line), and reads the answer's head, passing over informational answers. The answer's body reads from
// c. Get sets no deadline: the caller bounds it (SetDeadline).
func (c *Conn) Get(head []byte) (*http.Response, error) {
	resp, _, err := c.exchange(nil, func(bw *bufio.Writer) { _, _ = bw.Write(head) }, nil)
	return resp, err
}

// Clean reports whether nothing the upstream sent is buffered unread: after an answer read to its end,
// the connection can carry another request.
func (c *Conn) Clean() bool { return c.br.Buffered() == 0 }

// maxInformational is how many informational answers may precede the answer to one request.
const maxInformational = 10

// exchange writes a request head (write) and reads the answer's head to req (nil reads it as the answer
// to a GET). Informational answers go to got1xx, or are passed over when it is nil; a 101 is an error
// (nothing forwarded here asked to switch protocols). beforeAnswer reports a failure before any byte
// of the answer arrived, which a request on a reused connection may retry elsewhere.
func (c *Conn) exchange(req *http.Request, write func(*bufio.Writer), got1xx func(int, http.Header) error) (resp *http.Response, beforeAnswer bool, err error) {
	write(c.bw)
	if err := c.bw.Flush(); err != nil {
		return nil, true, err
	}
	if _, err := c.br.Peek(1); err != nil {
		return nil, true, err
	}
	for informational := 0; ; informational++ {
		resp, err := http.ReadResponse(c.br, req)
		if err != nil {
			return nil, false, err
		}
		if resp.StatusCode < 100 || resp.StatusCode >= 200 {
			return resp, false, nil
		}
		if resp.StatusCode == http.StatusSwitchingProtocols || informational >= maxInformational {
			return nil, false, fmt.Errorf("unexpected %s from upstream", resp.Status)
		}
		if got1xx != nil {
			if err := got1xx(resp.StatusCode, resp.Header); err != nil {
				return nil, false, err
			}
		}
	}
}
