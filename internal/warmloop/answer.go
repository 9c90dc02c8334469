package warmloop

// The answer side of the loop: the upstream's bytes of one answer to a GET turned into the bytes the
// client is sent, as net/http writes them on the edge's fast path (upstream.Client.Serve).

import (
	"bytes"
	"net/http"
	"strconv"
	"time"

	"github.com/activator/activator/internal/upstream"
)

// MaxAnswerHead is the largest answer head, its final CRLF included, that upstream.PlainAnswer
// parses (its field offsets are 16 bits wide): the bound Answer waits up to for a head's end. A head
// not ended within it is not plain.
const MaxAnswerHead = 1<<16 - 1

// maxAnswerFields is the most fields upstream.PlainAnswer parses in one head (upstream's
// maxHeadFields); TestAnswerBoundsMatchPlainAnswer holds the two alike.
const maxAnswerFields = 32

// holdBack is net/http's bufferBeforeChunkingSize: the body bytes its ResponseWriter buffers before
// it writes the head. An answer cut off before more than this came reaches the client as nothing at
// all, which an HTTP client may retry; after, as a truncated answer, which it may not. Answer holds
// back as much, so that a cut-off answer reads the same from the loop.
const holdBack = 2048

// sniffLen is how much of the body http.DetectContentType looks at.
const sniffLen = 512

// AnswerState is what Feed made of the bytes given so far.
type AnswerState int

const (
	// AnswerMore: the answer is not complete; feed the upstream's next bytes.
	AnswerMore AnswerState = iota
	// AnswerDone: the whole answer has been given to the client. Extra says how many bytes of the
	// last Feed's input came after its end.
	AnswerDone
	// AnswerNotPlain: the answer is not one the loop relays (a head upstream.PlainAnswer does not take,
	// or none ended within MaxAnswerHead), and nothing has been given to the client: net/http must
	// take the exchange over, with every byte fed so far.
	AnswerNotPlain
)

func (s AnswerState) String() string {
	switch s {
	case AnswerMore:
		return "AnswerMore"
	case AnswerDone:
		return "AnswerDone"
	case AnswerNotPlain:
		return "AnswerNotPlain"
	}
	return "AnswerState(" + strconv.Itoa(int(s)) + ")"
}

// Answer turns the upstream's bytes of one answer to a GET into the bytes the client is sent, the
// same bytes net/http writes for it on the fast path (upstream.Client.Serve) to an HTTP/1.1 client
// that keeps its connection alive, on a server that keeps it too:
//
//   - the status line "HTTP/1.1 <code> <http.StatusText(code)>" (the upstream's reason phrase is not
//     passed on), or "HTTP/1.1 <code> status code <code>" for a code StatusText does not know;
//   - the answer's fields but the hop-by-hop ones, names canonical, sorted by name, each name's values
//     in the order they came (http.Header.Write's order);
//   - a Date (now, to the second) when the answer has none;
//   - a Content-Type sniffed (http.DetectContentType) from the first 512 bytes of the body, when the
//     answer has no Content-Type, its first Content-Encoding is empty or missing, and its body is not
//     empty (X-Content-Type-Options does not enter into it: net/http sniffs regardless);
//   - the body, Content-Length bytes of it.
//
// Its Content-Length is the answer's own (PlainAnswer takes exactly one, valid), so net/http neither
// adds nor drops one, nor adds Connection or Transfer-Encoding. What the edge's own ResponseWriters
// add on top (a held request's Server-Timing and wake id, "Connection: close" for a request whose
// framing is suspect) Answer does not: the loop must not serve such requests.
//
// It gives the client nothing until more than 2048 body bytes have come or the body is complete
// (holdBack), as net/http does; then everything so far, and each later byte as it comes. An event
// stream (a first Content-Type of text/event-stream, as upstream's flushEach reads it) is the
// exception, as on the fast path, which flushes its head at once and each piece of its body as it
// comes: its head goes out as soon as it is parsed. Past that point only the timing differs: net/http
// keeps up to 2047 bytes more back, and up to 4 KiB in its connection's buffer, so that the client of
// an answer cut off there gets a prefix of another length.
//
// When the upstream's bytes end (a close, an error) before AnswerDone, the exchange has failed. With
// Status still 0 the head never came: net/http would have answered with the edge's error handler.
// Otherwise net/http would have aborted the client's connection after what Started reports was sent
// (with nothing sent, the client sees a close, which it may retry on a new connection).
//
// An Answer is not safe for concurrent use. It keeps no reference to the slices given to Feed. The
// zero Answer is ready for the first answer; Reset readies it for the next. It allocates only while
// its buffers grow to the largest answer head it has seen (at most about 2*MaxAnswerHead+holdBack
// bytes), and keeps them across Reset.
type Answer struct {
	phase answerPhase
	p     upstream.PlainAnswer

	// raw is the answer's head as far as it has come, while it came in more than one Feed.
	raw []byte
	// hold is the client's head, from the status line to the last field (the added fields and the
	// empty line follow at emit), then the body bytes held back; head is its length.
	hold []byte
	head int

	status    int
	left      int64 // body bytes still to come from the upstream
	needDate  bool  // the answer has no Date: emit adds one
	sniff     bool  // no Content-Type, and no first Content-Encoding but an empty one: emit sniffs one
	flushEach bool  // an event stream: nothing is held back
	started   bool  // emit has run: the client has been given the head
	extra     int

	// The Date field's value, made once per second.
	dateSec int64
	date    []byte
}

type answerPhase uint8

const (
	phaseHead answerPhase = iota
	phaseBody
	phaseDone
	phaseNotPlain
)

// Reset readies a for the next answer, keeping its buffers.
//
// Buffers a large head grew (up to the head limit, set by the tenant) are let go rather than kept
// for the connection's life: idle keep-alive clients would otherwise each hold what their largest
// answer's head took.
func (a *Answer) Reset() {
	a.phase = phaseHead
	a.raw, a.hold, a.head = keepSmall(a.raw), keepSmall(a.hold), 0
	a.status, a.left, a.extra = 0, 0, 0
	a.needDate, a.sniff, a.flushEach, a.started = false, false, false, false
}

// keepSmall returns b emptied, or nil when it grew past what a common head needs (8 KiB).
func keepSmall(b []byte) []byte {
	if cap(b) > 8<<10 {
		return nil
	}
	return b[:0]
}

// Status is the answer's status code once Feed has parsed its head (a plain one), and 0 before, and
// for an answer that is not plain.
func (a *Answer) Status() int { return a.status }

// Started reports whether some bytes of the answer have been given to the client (appended to a
// Feed's out).
func (a *Answer) Started() bool { return a.started }

// Extra is, once Feed has returned AnswerDone, how many bytes at the end of its in came after the
// answer's end: bytes no request asked for (a body longer than its Content-Length, or an answer
// written unasked). The caller closes that upstream connection rather than read them as the answer
// to the next request, as the fast path does (upstream.Options.OnUnasked).
func (a *Answer) Extra() int { return a.extra }

// Feed takes in, the next bytes read from the upstream, and appends to out what the client is to be
// sent now, which may be nothing. It returns out and the answer's state:
//
//   - AnswerMore: all of in was taken; feed the next bytes.
//   - AnswerDone: the answer is complete and out ends with its last byte; Extra bytes at the end of in
//     were not part of it.
//   - AnswerNotPlain: out is returned as given, nothing appended and nothing written past its length
//     (nor has any earlier Feed appended anything): net/http takes over, with every byte fed so far
//     (Answer does not keep them for the caller, nor change them). It is reported as soon as the bytes
//     cannot start a plain head (not "HTTP/1.1 "), and at the latest once the head is whole, or
//     MaxAnswerHead bytes have come without its end.
//
// now is the time of the Date field the client is given with the head, when the answer has none: the
// time of the Feed that emits the head, as net/http takes the time it writes the head. After
// AnswerDone or AnswerNotPlain, Feed only reports the same again (all of in Extra, after AnswerDone)
// until Reset. out must not overlap in.
func (a *Answer) Feed(out, in []byte, now time.Time) ([]byte, AnswerState) {
	switch a.phase {
	case phaseDone:
		a.extra = len(in)
		return out, AnswerDone
	case phaseNotPlain:
		return out, AnswerNotPlain
	case phaseBody:
		return a.body(out, in, now)
	}
	var head []byte // the whole head, once it has come
	var from int    // where in the body starts, once the head has come
	if len(a.raw) == 0 {
		if !plainStart(in) {
			return a.notPlain(out)
		}
		n := headEnd(in, 0)
		if n < 0 {
			if len(in) >= MaxAnswerHead {
				return a.notPlain(out)
			}
			a.raw = append(a.raw, in...)
			return out, AnswerMore
		}
		head, from = in[:n], n
	} else {
		prev := len(a.raw)
		// Bytes past the bound cannot be part of a plain head, so they are not kept; a body after a
		// head that ends within it is read from in below.
		a.raw = append(a.raw, in[:min(len(in), MaxAnswerHead-prev)]...)
		if !plainStart(a.raw) {
			return a.notPlain(out)
		}
		n := headEnd(a.raw, max(0, prev-3))
		if n < 0 {
			if len(a.raw) >= MaxAnswerHead {
				return a.notPlain(out)
			}
			return out, AnswerMore
		}
		head, from = a.raw[:n], n-prev
	}
	if !a.p.Parse(head) || !a.render(head) {
		return a.notPlain(out)
	}
	a.phase = phaseBody
	a.status, a.left = a.p.Status(), a.p.ContentLength()
	return a.body(out, in[from:], now)
}

func (a *Answer) notPlain(out []byte) ([]byte, AnswerState) {
	a.phase = phaseNotPlain
	return out, AnswerNotPlain
}

// plainStart reports whether b, the first bytes of an answer, can begin a plain head.
func plainStart(b []byte) bool {
	const start = "HTTP/1.1 "
	n := min(len(b), len(start))
	return string(b[:n]) == start[:n]
}

// headEnd is the length of the head in b, its final CRLF included, looking for the end from off on;
// -1 when b holds no end within MaxAnswerHead.
func headEnd(b []byte, off int) int {
	b = b[:min(len(b), MaxAnswerHead)]
	i := bytes.Index(b[off:], []byte("\r\n\r\n"))
	if i < 0 {
		return -1
	}
	return off + i + 4
}

// answerField is a field of the answer's head, as PlainAnswer.Fields gives it.
type answerField struct{ name, value []byte }

// render puts the client's head for the parsed head into a.hold (up to its last field: emit adds the
// rest) and notes what emit must add. It reports false for a head with more fields than it has room
// for, which PlainAnswer does not parse.
func (a *Answer) render(head []byte) bool {
	var fields [maxAnswerFields]answerField
	n, over := 0, false
	a.p.Fields(head, func(name, value []byte) {
		if n == len(fields) {
			over = true
			return
		}
		fields[n] = answerField{name, value}
		n++
	})
	if over {
		return false
	}
	a.needDate = true
	var haveType bool
	var ctype, cenc []byte // the first Content-Type and Content-Encoding, as Header.Get reads them
	var haveEnc bool
	for _, f := range fields[:n] {
		switch {
		case asciiEqualFold(f.name, "Date"):
			a.needDate = false
		case asciiEqualFold(f.name, "Content-Type"):
			if !haveType {
				haveType, ctype = true, f.value
			}
		case asciiEqualFold(f.name, "Content-Encoding"):
			if !haveEnc {
				haveEnc, cenc = true, f.value
			}
		}
	}
	a.sniff = !haveType && len(cenc) == 0
	a.flushEach = eventStream(ctype)

	// http.Header.Write's order: by canonical name, and a name's values as they came. The sort is
	// stable, so each name's values stay in their order.
	fs := fields[:n]
	for i := 1; i < len(fs); i++ {
		for j := i; j > 0 && canonLess(fs[j].name, fs[j-1].name); j-- {
			fs[j], fs[j-1] = fs[j-1], fs[j]
		}
	}
	code := a.p.Status()
	b := append(a.hold[:0], "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(code), 10)
	if text := http.StatusText(code); text != "" {
		b = append(b, ' ')
		b = append(b, text...)
	} else {
		// net/http's "%03d status code %d"; a plain status has three digits.
		b = append(b, " status code "...)
		b = strconv.AppendInt(b, int64(code), 10)
	}
	b = append(b, "\r\n"...)
	for _, f := range fs {
		b = appendCanon(b, f.name)
		b = append(b, ": "...)
		b = append(b, f.value...)
		b = append(b, "\r\n"...)
	}
	a.hold, a.head = b, len(b)
	return true
}

// body takes in, the answer's body bytes and what may follow them, and emits the head once net/http
// would have (see Answer).
func (a *Answer) body(out, in []byte, now time.Time) ([]byte, AnswerState) {
	n := len(in)
	if int64(n) > a.left {
		n = int(a.left)
	}
	body := in[:n]
	a.extra = len(in) - n
	a.left -= int64(n)
	if !a.started {
		held := len(a.hold) - a.head
		if !a.flushEach && a.left > 0 && held+n <= holdBack {
			a.hold = append(a.hold, body...)
			return out, AnswerMore
		}
		if a.sniff && held > 0 && held < sniffLen {
			// The sniff reads the body's first bytes in one piece.
			k := min(sniffLen-held, len(body))
			a.hold = append(a.hold, body[:k]...)
			body = body[k:]
		}
		out = a.emit(out, now, body)
	}
	out = append(out, body...)
	if a.left > 0 {
		return out, AnswerMore
	}
	a.phase = phaseDone
	return out, AnswerDone
}

// emit appends the head and the body held back; more is the body that follows, which is sniffed when
// nothing is held.
func (a *Answer) emit(out []byte, now time.Time, more []byte) []byte {
	a.started = true
	out = append(out, a.hold[:a.head]...)
	// net/http's extraHeader, in its order, after the sorted fields.
	if a.needDate {
		out = append(out, "Date: "...)
		out = append(out, a.dateValue(now)...)
		out = append(out, "\r\n"...)
	}
	sniffed := a.hold[a.head:]
	if len(sniffed) == 0 {
		sniffed = more
	}
	if a.sniff && len(sniffed) > 0 {
		out = append(out, "Content-Type: "...)
		out = append(out, http.DetectContentType(sniffed)...)
		out = append(out, "\r\n"...)
	}
	out = append(out, "\r\n"...)
	return append(out, a.hold[a.head:]...)
}

// dateValue is now in http.TimeFormat, made again only when the second has changed.
func (a *Answer) dateValue(now time.Time) []byte {
	if sec := now.Unix(); sec != a.dateSec || len(a.date) == 0 {
		a.dateSec = sec
		a.date = now.UTC().AppendFormat(a.date[:0], http.TimeFormat)
	}
	return a.date
}

// eventStream reports whether ct, the answer's first Content-Type, makes the fast path flush its head
// and each piece of its body at once: upstream's flushEach, whose TrimSpace and EqualFold are
// Unicode's, as bytes' are.
func eventStream(ct []byte) bool {
	const es = "text/event-stream"
	if len(ct) < len(es) { // a shortcut: what folds to it is no shorter
		return false
	}
	base, _, _ := bytes.Cut(ct, []byte(";"))
	return bytes.EqualFold(bytes.TrimSpace(base), []byte(es))
}

// canonByte is name[i] as http.CanonicalHeaderKey writes it: upper case at the start and after a
// hyphen, lower case elsewhere (for the token names PlainAnswer passes, it changes only letters).
func canonByte(name []byte, i int) byte {
	c := name[i]
	if i == 0 || name[i-1] == '-' {
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
	} else if 'A' <= c && c <= 'Z' {
		c += 'a' - 'A'
	}
	return c
}

// canonLess orders names as their canonical forms compare.
func canonLess(x, y []byte) bool {
	for i := 0; i < len(x) && i < len(y); i++ {
		if cx, cy := canonByte(x, i), canonByte(y, i); cx != cy {
			return cx < cy
		}
	}
	return len(x) < len(y)
}

func appendCanon(b, name []byte) []byte {
	for i := range name {
		b = append(b, canonByte(name, i))
	}
	return b
}

// asciiEqualFold reports whether name equals s in any ASCII case.
func asciiEqualFold(name []byte, s string) bool {
	if len(name) != len(s) {
		return false
	}
	for i := range name {
		c, d := name[i], s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if 'A' <= d && d <= 'Z' {
			d += 'a' - 'A'
		}
		if c != d {
			return false
		}
	}
	return true
}
