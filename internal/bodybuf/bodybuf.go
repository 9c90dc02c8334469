// Package bodybuf reads a request's whole body before the request goes on, as nginx does with
// proxy_request_buffering on: into memory up to a per-request limit, past it into an unlinked
// temporary file. It owns that read, its limits (size, idle time) and the replay of what was read;
// it knows nothing of routes, holds or upstreams.
//
// It exists because an unbuffered body is read while the request is proxied: a client uploading at
// one byte a second then keeps one of the tenant's upstream slots for as long as it likes, and a few
// such clients block a route. Read first, a slow upload costs the edge a goroutine and, past
// Options.Memory, a file descriptor; the upstream slot is taken once the whole body is here, and only
// for as long as the tenant takes to read it from memory or disk.
//
// Read is for server requests: it relies on what net/http guarantees of them (ContentLength 0 means
// no body; the server closes r.Body after the handler). The package starts no goroutines.
package bodybuf

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Sentinels callers branch on (the edge answers 413 and 408). Their messages, and the details Read
// adds to them, name no socket address or path and may be shown to the client.
var (
	// ErrTooLarge: the body is, or is declared to be, longer than Options.Max.
	ErrTooLarge = errors.New("request body too large")
	// ErrIdle: no byte of the body arrived for Options.Idle.
	ErrIdle = errors.New("request body timed out")
	// ErrSpillsFull: the body needs a spill file, and the Spills it shares are at their cap of
	// files or bytes.
	ErrSpillsFull = errors.New("no room to buffer the request body")
)

// Spills bounds the spill files of every Read that shares it, together: how many are open at once,
// and how many bytes they hold on disk. Without it the edge's uploads were bounded one by one
// (Options.Max) but not together: enough slow uploads took every file descriptor the process had
// left, or filled the disk. A file is counted from its creation to its Body's Close; its bytes as
// they are written (a declared length at once). The zero value bounds nothing; SetLimits changes
// the bounds for the files made after it. It is safe for concurrent use.
type Spills struct {
	maxFiles, maxBytes atomic.Int64 // 0: no bound
	files, bytes       atomic.Int64 // in use
}

// SetLimits sets the most files and bytes (0: no bound).
func (s *Spills) SetLimits(files, bytes int64) {
	s.maxFiles.Store(max(files, 0))
	s.maxBytes.Store(max(bytes, 0))
}

// InUse is the files and bytes the spill files hold now.
func (s *Spills) InUse() (files, bytes int64) { return s.files.Load(), s.bytes.Load() }

// take reserves a file (file) and n bytes, or nothing and ErrSpillsFull. A nil s takes anything.
func (s *Spills) take(file bool, n int64) error {
	if s == nil {
		return nil
	}
	if file {
		if f, m := s.files.Add(1), s.maxFiles.Load(); m > 0 && f > m {
			s.files.Add(-1)
			return fmt.Errorf("%w: %d spill files open, edge.max_spill_files", ErrSpillsFull, m)
		}
	}
	if b, m := s.bytes.Add(n), s.maxBytes.Load(); m > 0 && b > m {
		s.bytes.Add(-n)
		if file {
			s.files.Add(-1)
		}
		return fmt.Errorf("%w: %d bytes in spill files, edge.max_spill_bytes", ErrSpillsFull, m)
	}
	return nil
}

// give returns what take took.
func (s *Spills) give(file bool, n int64) {
	if s == nil {
		return
	}
	if file {
		s.files.Add(-1)
	}
	s.bytes.Add(-n)
}

// Options say how Read buffers one body. The zero value keeps nothing in memory, spills every body
// into os.TempDir(), accepts any length and waits without bound for each byte. Negative numbers
// count as 0.
type Options struct {
	// Memory is the longest body kept in memory. A longer body goes wholly into a file and, while it
	// waits, holds no memory (nginx's client_body_buffer_size). 0 sends every body to a file.
	Memory int64
	// Dir is the directory of spill files; "" is os.TempDir().
	Dir string
	// Max is the longest body accepted; 0 is no limit. A longer one is ErrTooLarge.
	Max int64
	// Idle is the longest wait for the next byte of the body; then ErrIdle. 0 is no bound.
	Idle time.Duration
	// Spills, when set, bounds this body's spill file together with every other Read's that shares
	// it; a body it has no room for is ErrSpillsFull.
	Spills *Spills
}

// Read reads r.Body to its end per o and returns a Body that replays it, of exactly the length read.
// It sets no field of r: the caller swaps in the Body and its length (see the example), and owns it:
// it must Close it. The Body holds no reference to r.
//
// A request without a body (r.Body nil or http.NoBody, or ContentLength 0) gives a nil *Body and a
// nil error, at once and without allocating; so does a body that turns out empty (a chunked body
// with no data). A nil *Body is a valid empty body.
//
// A body of at most o.Memory bytes is kept in one []byte, grown as it arrives (twofold at most, from 4
// KiB, to its declared length): a body holds memory for what its client has sent, not for what it
// declared. A longer one is written to a file made by os.CreateTemp in o.Dir at its first byte (mode
// 0600, named activator-body-*) and unlinked at once where the OS allows it (Unix), so nothing is left
// behind even if the process dies; elsewhere Close removes it.
//
// o.Idle is enforced with http.ResponseController.SetReadDeadline, set to now+Idle before each read
// of r.Body and cleared (zero) once the body is read; so a trickle that never pauses for Idle is
// accepted however long it takes. HTTP/1 and HTTP/2 (on the stream) support it. When w does not (an
// httptest.ResponseRecorder, a wrapper without Unwrap, a nil w), the body is read without an idle
// bound. Clearing also lifts any http.Server.ReadTimeout for the rest of the request.
//
// Errors:
//   - ErrTooLarge, wrapped, when r.ContentLength exceeds o.Max, before any byte is read (no 100
//     Continue is sent), or as soon as byte o.Max+1 of a chunked body arrives;
//   - ErrIdle, wrapped, when a read times out;
//   - otherwise the read error (a client that hung up, a malformed chunk) or the spill file's error,
//     wrapped. Their text may name socket addresses and paths: it is for the log, not the client.
//
// Read does not close r.Body; the server does after the handler. On success it is at its end
// already. On an error, closing it would make net/http read up to 256 KiB more of it first, from a
// client that may never send them. Instead, on HTTP/1, Read sets "Connection: close" on w's header,
// as http.MaxBytesReader does, so the server sends the answer without first reading the rest of the
// body, then closes the connection. With o.Idle set, it leaves a read deadline of at most o.Idle in
// place, so what the server still reads after the handler is bounded too.
func Read(w http.ResponseWriter, r *http.Request, o Options) (*Body, error) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, nil
	}
	rd := reader{src: r.Body, idle: o.Idle, max: -1}
	if o.Idle > 0 {
		rd.rc, rd.bounded = *http.NewResponseController(w), true // a copy: the pointer would escape
	}
	if o.Max > 0 {
		rd.max = o.Max
	}
	var b *Body
	var err error
	if rd.max >= 0 && r.ContentLength > rd.max {
		err = fmt.Errorf("%w: %d bytes declared, at most %d accepted", ErrTooLarge, r.ContentLength, rd.max)
		_ = rd.setDeadline() // bounds what the server reads of the body after the handler
	} else {
		b, err = rd.readAll(r.ContentLength, max(o.Memory, 0), o.Dir, o.Spills)
	}
	if err != nil {
		if r.ProtoMajor == 1 && w != nil {
			w.Header().Set("Connection", "close")
		}
		return nil, err
	}
	if rd.bounded {
		// An error here means the connection is gone, which the answer's write will report.
		_ = rd.rc.SetReadDeadline(time.Time{})
	}
	return b, nil
}

// reader reads the request body for Read, with its idle deadline and its length limit.
type reader struct {
	src     io.Reader
	rc      http.ResponseController
	bounded bool // whether rc bounds reads by idle (Idle set, and w can set read deadlines)
	idle    time.Duration
	max     int64 // most bytes accepted; < 0: any number
	n       int64 // bytes read so far
}

// firstRead is the most a body's first read is given. Each read that fills the buffer at most
// doubles it, so while a body arrives it holds at most max(firstRead, twice what its client has sent)
// of memory, whatever length it declares: about what net/http itself keeps for a request in flight.
// Before, a body that declared up to Options.Memory got a buffer of that length before its first byte,
// and one declared longer a pooled 32 KiB buffer: a client that sent 250 such heads on one HTTP/2
// connection, and no byte of any body, had the edge hold 250 times that for it
// (TestBufferFollowsArrival). At 4 KiB most bodies still take one allocation, at their declared
// length.
const firstRead = 4 << 10

// chunk is the most a spilling body gathers in memory before writing it to its file: the pool's
// buffers.
const chunk = 32 << 10

// readAll reads the body to its end: into memory while it fits in memory bytes, then into a spill
// file in dir, within spills. declared is r.ContentLength (-1: unknown).
func (rd *reader) readAll(declared, memory int64, dir string, spills *Spills) (*Body, error) {
	f := filling{declared: declared, memory: memory, dir: dir, spills: spills, spilling: declared > memory || memory == 0}
	defer f.done()
	for {
		if len(f.buf) == cap(f.buf) {
			end, err := f.room(rd)
			if err != nil {
				f.sp.discard()
				return nil, err
			}
			if end {
				break
			}
			continue
		}
		n, err := rd.read(f.buf[len(f.buf):cap(f.buf)])
		f.buf = f.buf[:len(f.buf)+n]
		if err != nil && err != io.EOF {
			f.sp.discard()
			return nil, err
		}
		if f.spilling && n > 0 { // into the file at once: the buffer holds nothing between reads
			if ferr := f.flush(); ferr != nil {
				return nil, ferr
			}
			if c := min(rd.n, chunk); n == cap(f.buf) && int64(n) < c { // it sends faster than the buffer takes
				f.grow(c)
			}
		}
		if err == io.EOF {
			break
		}
	}
	switch {
	case rd.n == 0:
		return nil, nil
	case f.spilling:
		return newBody(rd.n, 0, nil, f.sp), nil
	default:
		return newBody(rd.n, int64(cap(f.buf)), f.buf, nil), nil
	}
}

// filling is readAll's buffer and file while a body arrives.
type filling struct {
	declared int64 // r.ContentLength; -1: unknown
	memory   int64 // the longest body kept in memory
	dir      string
	spills   *Spills
	spilling bool    // the body goes to a file: it is declared, or has turned out, longer than memory
	buf      []byte  // the body while it is kept in memory; once it spills, each read's bytes until written
	pbuf     *[]byte // the pool's buffer buf is, once a spilling body has needed chunk bytes
	sp       *spill  // the file, from the first byte written to it
}

// done gives back the pooled buffer.
func (f *filling) done() {
	if f.pbuf != nil {
		buffers.put(f.pbuf)
	}
}

// room makes room in f.buf, which is full, for rd's next read: it grows the buffer of a body kept in
// memory, or gives a spilling body its first buffer. A body full at its declared length, or at
// memory, may have nothing left to send, so the next read goes to a byte of its own: at the end (end
// true) the body stays in memory; bytes past memory make it spill; bytes past its declared length are
// an error (net/http's body never gives them).
func (f *filling) room(rd *reader) (end bool, err error) {
	n := int64(len(f.buf))
	switch {
	case f.spilling: // no buffer yet (a spilling body's is emptied into the file at each read)
		f.grow(chunk)
		return false, nil
	case n < f.memory && (f.declared < 0 || n < f.declared):
		limit := f.memory
		if f.declared >= 0 {
			limit = min(limit, f.declared)
		}
		f.grow(limit)
		return false, nil
	}
	var probe [1]byte // enough to tell the end from more
	got, err := rd.read(probe[:])
	if err != nil && err != io.EOF {
		return false, err
	}
	switch {
	case got == 0:
	case f.declared >= 0:
		return false, fmt.Errorf("bodybuf: reading the request body: more than its declared %d bytes", f.declared)
	default:
		f.spilling = true
		if err := f.flush(); err != nil {
			return false, err
		}
		if err := f.write(probe[:got]); err != nil {
			return false, err
		}
	}
	return err == io.EOF, nil
}

// grow gives f.buf a capacity of twice its own (firstRead to start with), at most limit, keeping its
// bytes: limit is more than it holds. A spilling body's buffer (empty then) grows into the pool's when
// it reaches chunk.
func (f *filling) grow(limit int64) {
	c := min(max(2*int64(cap(f.buf)), firstRead), limit)
	if f.spilling && c >= chunk {
		if f.pbuf == nil {
			f.pbuf = buffers.get()
		}
		f.buf = (*f.pbuf)[:0]
		return
	}
	grown := make([]byte, len(f.buf), c)
	copy(grown, f.buf)
	f.buf = grown
}

// flush writes f.buf to the spill file, making it first, and empties f.buf.
func (f *filling) flush() error {
	if f.sp == nil {
		sp, err := newSpill(f.dir, f.spills, f.declared)
		if err != nil {
			return err
		}
		f.sp = sp
	}
	if err := f.write(f.buf); err != nil {
		return err
	}
	f.buf = f.buf[:0]
	return nil
}

// write appends p to the spill file. On an error the file is discarded (spill.write), and forgotten
// here, so that the caller's discard does not give back its budget a second time.
func (f *filling) write(p []byte) error {
	if err := f.sp.write(p); err != nil {
		f.sp = nil
		return err
	}
	return nil
}

// read reads once from the body into p, bounded by the idle deadline and by max+1 bytes in all. It
// returns io.EOF unwrapped, and every other error wrapped, after the sentinel that classifies it.
func (rd *reader) read(p []byte) (int, error) {
	if left := rd.max + 1 - rd.n; rd.max >= 0 && int64(len(p)) > left {
		p = p[:left]
	}
	if err := rd.setDeadline(); err != nil {
		return 0, fmt.Errorf("bodybuf: setting the body's read deadline: %w", err)
	}
	n, err := rd.src.Read(p)
	rd.n += int64(n)
	switch {
	case rd.max >= 0 && rd.n > rd.max:
		return 0, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, rd.max)
	case err == nil, err == io.EOF:
		return n, err
	case isTimeout(err):
		if rd.bounded {
			return 0, fmt.Errorf("%w: no byte for %v", ErrIdle, rd.idle)
		}
		return 0, fmt.Errorf("%w: read deadline exceeded", ErrIdle)
	default:
		return 0, fmt.Errorf("bodybuf: reading the request body: %w", err)
	}
}

// setDeadline sets the read deadline to now+idle when there is an idle bound. A w that cannot set
// read deadlines turns the bound off for the rest of the body.
func (rd *reader) setDeadline() error {
	if !rd.bounded {
		return nil
	}
	err := rd.rc.SetReadDeadline(time.Now().Add(rd.idle))
	if errors.Is(err, http.ErrNotSupported) {
		rd.bounded = false
		return nil
	}
	return err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// spill is a body's file while Read writes it.
type spill struct {
	f      *os.File
	name   string  // the path Close must remove; "" once unlinked
	spills *Spills // the budget it counts in (nil: none)
	taken  int64   // bytes reserved in spills: the declared length, or what was written
	grows  bool    // no length was declared: each write reserves its bytes
}

// newSpill makes a spill file in dir, counted in spills with declared bytes (grown as written when
// declared is unknown, -1).
func newSpill(dir string, spills *Spills, declared int64) (*spill, error) {
	reserve := max(declared, 0)
	if err := spills.take(true, reserve); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(dir, "activator-body-*")
	if err != nil {
		spills.give(true, reserve)
		return nil, fmt.Errorf("bodybuf: creating the spill file: %w", err)
	}
	sp := &spill{f: f, name: f.Name(), spills: spills, taken: reserve, grows: declared < 0}
	// Unix lets an open file be unlinked: its space is freed when the last descriptor closes, even
	// if the process dies. Where removal fails (Windows), Close removes it by name.
	if os.Remove(sp.name) == nil {
		sp.name = ""
	}
	return sp, nil
}

// write appends p to the file, discarding the file on error.
func (sp *spill) write(p []byte) error {
	if sp.grows {
		if err := sp.spills.take(false, int64(len(p))); err != nil {
			sp.discard()
			return err
		}
		sp.taken += int64(len(p))
	}
	if _, err := sp.f.Write(p); err != nil {
		sp.discard()
		return fmt.Errorf("bodybuf: writing the spill file: %w", err)
	}
	return nil
}

// discard closes and removes the file, and gives back what it took of its Spills; on a nil spill it
// does nothing.
func (sp *spill) discard() {
	if sp == nil {
		return
	}
	sp.f.Close()
	if sp.name != "" {
		os.Remove(sp.name)
	}
	sp.spills.give(true, sp.taken)
}

// Body replays a body that Read read completely: an io.ReadCloser of exactly Len bytes.
//
// Close may be called concurrently with Read (http.Transport does so) and more than once; Read after
// Close returns http.ErrBodyReadAfterClose. A nil *Body is an empty body: Len 0, Read io.EOF, Close
// nil. A Body replays once: there is no rewind. Replay gives another Body over the same bytes, for a
// request's GetBody.
type Body struct {
	n        int64  // length of the body
	inMemory int64  // bytes of memory held for it: cap(mem) as Read left it; 0 for a Replay
	st       *store // own, for the Body Read returned; that Body's own, for a Replay
	own      store  // in the Body, so that a buffered body costs one allocation, not two

	mu     sync.Mutex // guards the fields below
	off    int64      // bytes replayed so far
	closed bool
}

// store is a body's bytes, shared by the Body Read returned and every Replay of it, and released when
// the last of them closes.
type store struct {
	mem  []byte   // the body when kept in memory
	f    *os.File // the body when spilled, read with ReadAt
	name string   // path release must remove; "" when the file was unlinked at creation

	spills *Spills // the spill file's budget, given back its file and taken bytes at release
	taken  int64

	mu   sync.Mutex // guards refs
	refs int        // open Bodies over the store; 0 once released, for good
}

// Len is the body's exact length, for r.ContentLength. It does not change on Close.
func (b *Body) Len() int64 {
	if b == nil {
		return 0
	}
	return b.n
}

// InMemory is how many bytes of memory hold the body, for the caller's accounting of held memory:
// the capacity of its buffer (Len for a body of declared length, between Len and Options.Memory for a
// chunked one), or 0 for a spilled body. It does not change on Close, so the caller can add it when
// it starts holding the request and subtract the same value when it is done. A Replay shares the
// memory and reports 0, so that the bytes are counted once.
func (b *Body) InMemory() int64 {
	if b == nil {
		return 0
	}
	return b.inMemory
}

// Replay returns a new Body over the same bytes, read from the start, with its own Close: the
// request's GetBody, which http.Transport calls to send a body again on a new connection (a kept-alive
// one the tenant closed as the request arrived), after it has closed the Body it sent. The bytes (the
// memory, or the spill file and its place in Options.Spills) are kept until the last of the Body and
// its replays is closed. Replay after that returns http.ErrBodyReadAfterClose; on a nil *Body it returns
// http.NoBody.
func (b *Body) Replay() (io.ReadCloser, error) {
	if b == nil {
		return http.NoBody, nil
	}
	if !b.st.hold() {
		return nil, http.ErrBodyReadAfterClose
	}
	return &Body{n: b.n, st: b.st}, nil
}

// Read replays the body.
func (b *Body) Read(p []byte) (int, error) {
	if b == nil {
		return 0, io.EOF
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
		return 0, http.ErrBodyReadAfterClose
	case b.off >= b.n:
		return 0, io.EOF
	case b.st.f == nil:
		n := copy(p, b.st.mem[b.off:])
		b.off += int64(n)
		return n, nil
	}
	if rest := b.n - b.off; int64(len(p)) > rest {
		p = p[:rest]
	}
	n, err := b.st.f.ReadAt(p, b.off)
	b.off += int64(n)
	if err == io.EOF {
		// The file is shorter than what was written to it: nothing but a failing disk does that.
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return n, fmt.Errorf("bodybuf: reading the spill file: %w", err)
	}
	return n, nil
}

// Close releases the body; the last of a Body and its replays to close releases their bytes: the
// memory, or the spill file (closed, and removed if it had a name still). A second Close returns nil.
func (b *Body) Close() error {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	return b.st.drop()
}

// newBody returns the Body Read returns, of n bytes in mem or in sp's file, holding its own store once.
func newBody(n, inMemory int64, mem []byte, sp *spill) *Body {
	b := &Body{n: n, inMemory: inMemory}
	b.own = store{mem: mem, refs: 1}
	if sp != nil {
		b.own.f, b.own.name, b.own.spills, b.own.taken = sp.f, sp.name, sp.spills, sp.taken
	}
	b.st = &b.own
	return b
}

// hold takes one more reference to the store, unless it has been released.
func (st *store) hold() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.refs == 0 {
		return false
	}
	st.refs++
	return true
}

// drop gives back one reference; the last releases the bytes. Each Body drops once, under its own
// lock, so no Read of it is in progress; the other Bodies hold references, so none reads a released
// store.
func (st *store) drop() error {
	st.mu.Lock()
	st.refs--
	last := st.refs == 0
	st.mu.Unlock()
	if !last {
		return nil
	}
	st.mem = nil
	if st.f == nil {
		return nil
	}
	err := st.f.Close()
	if st.name != "" {
		err = errors.Join(err, os.Remove(st.name))
	}
	st.spills.give(true, st.taken)
	if err != nil {
		return fmt.Errorf("bodybuf: closing the spill file: %w", err)
	}
	return nil
}

// bufferPool lends Read its 32 KiB buffers for chunked bodies and spill files. It holds pointers, so
// that a put allocates nothing.
type bufferPool struct{ p sync.Pool }

func (bp *bufferPool) get() *[]byte {
	if v := bp.p.Get(); v != nil {
		return v.(*[]byte)
	}
	buf := make([]byte, 32<<10)
	return &buf
}

func (bp *bufferPool) put(buf *[]byte) { bp.p.Put(buf) }

// buffers is shared by every Read: a sync.Pool is safe for concurrent use, and the buffer one
// request returns serves the next.
var buffers = &bufferPool{}
