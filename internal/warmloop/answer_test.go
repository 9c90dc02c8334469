package warmloop

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/activator/activator/internal/upstream"
)

// fastPath is the edge's net/http path that Answer must match: an httptest server whose handler is
// an upstream.Client, for an upstream on a loopback listener that answers each request with the next
// script sent to it.
type fastPath struct {
	addr    string      // the edge's
	scripts chan script // the upstream's answers, one per request it reads
}

// script is what the upstream writes for one request: answer, then a close when cut is set.
type script struct {
	answer []byte
	cut    bool
}

// newFastPath starts a fastPath that lives until the test ends; its goroutines are gone by then.
func newFastPath(t testing.TB) *fastPath {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fp := &fastPath{scripts: make(chan script, 1)}
	done := make(chan struct{})
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex // guards open
		open []net.Conn
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Go(func() { fp.serveUpstream(c, done) })
		}
	})
	client := upstream.New(upstream.Options{Network: "tcp", Address: ln.Addr().String(), MaxConns: 4})
	srv := httptest.NewServer(http.HandlerFunc(client.Serve))
	fp.addr = srv.Listener.Addr().String()
	t.Cleanup(func() {
		srv.Close() // waits for the handlers
		client.CloseIdle()
		close(done)
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return fp
}

// serveUpstream answers each request head read from c with the next script.
func (fp *fastPath) serveUpstream(c net.Conn, done <-chan struct{}) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			if string(line) == "\r\n" {
				break
			}
		}
		var s script
		select {
		case s = <-fp.scripts:
		case <-done:
			return
		}
		if _, err := c.Write(s.answer); err != nil || s.cut {
			return
		}
	}
}

// get sends the edge a keep-alive GET, has the upstream answer it with s, and returns the bytes the
// client received: one answer (read with http.ReadResponse), or, with untilClose, everything until
// the edge closed the connection.
func (fp *fastPath) get(t testing.TB, s script, untilClose bool) []byte {
	t.Helper()
	var p upstream.PlainAnswer
	if !s.cut && (!p.Parse(s.answer) || int64(len(s.answer)) != int64(p.HeadLen())+p.ContentLength()) {
		t.Fatalf("not one whole plain answer (the client would wait for ever): %q", s.answer)
	}
	fp.scripts <- s
	c, err := net.Dial("tcp", fp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /x HTTP/1.1\r\nHost: app.test\r\nUser-Agent: t\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if untilClose {
		b, err := io.ReadAll(c)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// Nothing follows the answer on the connection, so the copy is exactly the answer.
	var raw bytes.Buffer
	resp, err := http.ReadResponse(bufio.NewReader(io.TeeReader(c, &raw)), nil)
	if err != nil {
		t.Fatalf("the edge's answer: %v (got %q)", err, raw.Bytes())
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("the edge's answer's body: %v", err)
	}
	return raw.Bytes()
}

// answerNow is the time Answer is given: the Date it adds.
var answerNow = time.Date(2026, 12, 6, 21, 30, 5, 123, time.UTC)

// withDate returns got, an answer net/http wrote, with the value of the Date field it added (the
// upstream's answer had none) set to answerNow, as Answer writes it.
func withDate(t testing.TB, got []byte) []byte {
	t.Helper()
	end := bytes.Index(got, []byte("\r\n\r\n"))
	i := bytes.Index(got[:max(end, 0)], []byte("\r\nDate: "))
	if i < 0 {
		t.Fatalf("no Date in %q", got)
	}
	i += len("\r\nDate: ")
	j := i + bytes.Index(got[i:], []byte("\r\n"))
	if _, err := time.Parse(http.TimeFormat, string(got[i:j])); err != nil {
		t.Fatalf("net/http's Date %q: %v", got[i:j], err)
	}
	return append(append(append([]byte(nil), got[:i]...), answerNow.Format(http.TimeFormat)...), got[j:]...)
}

// hasDate reports whether an upstream's answer head has a Date field, in any case.
func hasDate(answer []byte) bool {
	head, _, _ := bytes.Cut(answer, []byte("\r\n\r\n"))
	return bytes.Contains(bytes.ToLower(head), []byte("\r\ndate:"))
}

// fed is what Feed made of a sequence of pieces.
type fed struct {
	out     []byte
	states  []AnswerState
	extras  []int // Extra after each piece
	extra   int   // Extra after the last piece
	started []bool
}

// feedPieces resets a and feeds it the pieces in turn, each Feed's output appended to the last's.
func feedPieces(a *Answer, pieces ...[]byte) fed {
	a.Reset()
	var f fed
	for _, p := range pieces {
		var st AnswerState
		f.out, st = a.Feed(f.out, p, answerNow)
		f.states = append(f.states, st)
		f.extras = append(f.extras, a.Extra())
		f.started = append(f.started, a.Started())
	}
	f.extra = a.Extra()
	return f
}

// splits returns answer fed in one piece, in two at every byte boundary, and one byte at a time, each
// with a name.
func splits(answer []byte) (names []string, pieces [][][]byte) {
	names = append(names, "whole")
	pieces = append(pieces, [][]byte{answer})
	for k := 1; k < len(answer); k++ {
		names = append(names, fmt.Sprintf("split at %d", k))
		pieces = append(pieces, [][]byte{answer[:k], answer[k:]})
	}
	bytewise := make([][]byte, len(answer))
	for i := range answer {
		bytewise[i] = answer[i : i+1]
	}
	names = append(names, "a byte at a time")
	return names, append(pieces, bytewise)
}

// plainAnswers are upstream answers to a GET that upstream.PlainAnswer takes: the loop relays them.
var plainAnswers = []struct{ name, answer string }{
	{"200 with a type", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"},
	{"200 without a type: sniffed", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"},
	{"empty body: no type sniffed", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"},
	{"empty body with a type", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nContent-Type: text/html\r\n\r\n"},
	{"Date given", "HTTP/1.1 200 OK\r\nDate: Tue, 01 Dec 2026 14:00:00 GMT\r\nContent-Length: 2\r\n\r\nhi"},
	{"Date given in lower case, and not a date", "HTTP/1.1 200 OK\r\ndate: yesterday\r\nContent-Length: 2\r\n\r\nhi"},
	{"empty Date", "HTTP/1.1 200 OK\r\nDate:\r\nContent-Length: 2\r\n\r\nhi"},
	{"duplicate fields, interleaved", "HTTP/1.1 200 OK\r\nX-B: 1\r\nSet-Cookie: a=1\r\nx-b: 2\r\nContent-Length: 2\r\nSET-COOKIE: b=2\r\nX-A: z\r\nX-b:3\r\n\r\nhi"},
	{"lower-case names", "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 2\r\nx-request-id: abc\r\netag: \"1\"\r\nwww-authenticate: Basic\r\ncontent-security-policy: default-src 'self'\r\n\r\nhi"},
	{"names in odd cases", "HTTP/1.1 200 OK\r\nCONTENT-LENGTH: 2\r\nx-A-b-C: 1\r\nA: 2\r\na-: 3\r\n-a: 4\r\nX--Y: 5\r\nx_y: 6\r\n1a: 7\r\n\r\nhi"},
	{"hop-by-hop fields", "HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nUpgrade: h2c\r\nProxy-Authenticate: Basic\r\nProxy-Connection: keep-alive\r\nTe: trailers\r\nproxy-authorization: x\r\nContent-Length: 2\r\nX-Keep: 1\r\n\r\nhi"},
	{"unknown status 299", "HTTP/1.1 299 Whatever\r\nContent-Length: 2\r\n\r\nhi"},
	{"unknown status 599 without a reason", "HTTP/1.1 599\r\nContent-Length: 0\r\n\r\n"},
	{"404 with a reason of its own", "HTTP/1.1 404 Gone Fishing\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n\r\nnot found"},
	{"500 sniffed", "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops"},
	{"418", "HTTP/1.1 418 I'm a teapot\r\nContent-Length: 0\r\n\r\n"},
	{"HTML sniffed", "HTTP/1.1 200 OK\r\nContent-Length: 44\r\n\r\n  <!DOCTYPE html><html><body>hi</body></html"},
	{"PNG magic sniffed", "HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"},
	{"Content-Encoding without a type: not sniffed", "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\n\x1f\x8b\x08\x00"},
	{"empty Content-Encoding: sniffed", "HTTP/1.1 200 OK\r\nContent-Encoding:\r\nContent-Length: 5\r\n\r\nhello"},
	{"empty Content-Encoding, then gzip: sniffed", "HTTP/1.1 200 OK\r\nContent-Encoding: \r\ncontent-encoding: gzip\r\nContent-Length: 5\r\n\r\nhello"},
	{"empty Content-Type: kept, not sniffed", "HTTP/1.1 200 OK\r\nContent-Type:\r\nContent-Length: 5\r\n\r\nhello"},
	{"X-Content-Type-Options nosniff: sniffed all the same", "HTTP/1.1 200 OK\r\nX-Content-Type-Options: nosniff\r\nContent-Length: 5\r\n\r\nhello"},
	{"an event stream with a length", "HTTP/1.1 200 OK\r\nContent-Type: Text/Event-Stream; charset=utf-8\r\nContent-Length: 11\r\n\r\ndata: 1\n\nda"},
	{"values trimmed, obs-text and a tab kept", "HTTP/1.1 200 OK\r\nX-A:  1 \t\r\nX-T: caf\xc3\xa9\tau lait\r\nContent-Length: 1\r\n\r\nx"},
	{"leading zeros in the length", "HTTP/1.1 200 OK\r\nContent-Length: 0003\r\n\r\nabc"},
	{"a body that looks like a head", "HTTP/1.1 200 OK\r\nContent-Length: 19\r\n\r\nHTTP/1.1 200 OK\r\n\r\n"},
	{"32 fields", "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-F: v\r\n", 31) + "Content-Length: 1\r\n\r\nx"},
	// The sniff reads the body's first 512 bytes, however they came: text for 300 bytes, then a
	// binary byte, is not text.
	{"binary after 300 bytes of text", "HTTP/1.1 200 OK\r\nContent-Length: 600\r\n\r\n" + strings.Repeat("t", 300) + "\x00" + strings.Repeat("u", 299)},
	{"body of 2048 bytes", "HTTP/1.1 200 OK\r\nContent-Length: 2048\r\n\r\n" + strings.Repeat("<p>", 682) + "xx"},
	{"body of 2049 bytes", "HTTP/1.1 200 OK\r\nContent-Length: 2049\r\n\r\n" + strings.Repeat("{}", 1024) + "x"},
}

// TestAnswerMatchesNetHTTP: for each plain answer, the client is given by Answer what the edge's
// net/http fast path gives it, but for the Date's value (each takes its own time); in one piece,
// split in two at every byte boundary (the head's end included), and a byte at a time.
//
// The sniffed Content-Type does not depend on how the body came: net/http writes nothing, and so
// sniffs nothing, before more than 2048 body bytes are buffered or the body is whole, and then sniffs
// the first 512 of them, as Answer does (holdBack).
func TestAnswerMatchesNetHTTP(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	fp := newFastPath(t)
	for _, tc := range plainAnswers {
		t.Run(tc.name, func(t *testing.T) {
			answer := []byte(tc.answer)
			want := fp.get(t, script{answer: answer}, false)
			if !hasDate(answer) {
				want = withDate(t, want)
			}
			var p upstream.PlainAnswer
			if !p.Parse(answer) {
				t.Fatal("not a plain answer")
			}
			var a Answer
			names, pieces := splits(answer)
			for i, ps := range pieces {
				f := feedPieces(&a, ps...)
				last := len(f.states) - 1
				for j, st := range f.states[:last] {
					if st != AnswerMore {
						t.Fatalf("%s: piece %d: %v, want AnswerMore", names[i], j, st)
					}
				}
				if f.states[last] != AnswerDone || f.extra != 0 || a.Status() != p.Status() || !a.Started() {
					t.Fatalf("%s: %v, extra %d, status %d, started %v; want AnswerDone, 0, %d, true",
						names[i], f.states[last], f.extra, a.Status(), a.Started(), p.Status())
				}
				if !bytes.Equal(f.out, want) {
					t.Fatalf("%s:\n got %q\nwant %q", names[i], f.out, want)
				}
			}
		})
	}
}

// notPlainAnswers are answers (or bytes) upstream.PlainAnswer does not take: net/http must answer.
var notPlainAnswers = []struct{ name, answer string }{
	{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"},
	{"no length", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nx"},
	{"204", "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"},
	{"304", "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"},
	{"100 Continue first", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"},
	{"103 Early Hints first", "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"},
	{"Connection: keep-alive", "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nx"},
	{"Connection: close", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nconnection: close\r\n\r\nx"},
	{"Trailer", "HTTP/1.1 200 OK\r\nTrailer: X-Sum\r\nContent-Length: 1\r\n\r\nx"},
	{"Pragma", "HTTP/1.1 200 OK\r\nPragma: no-cache\r\nContent-Length: 1\r\n\r\nx"},
	{"two lengths", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx"},
	{"HTTP/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx"},
	{"folded line", "HTTP/1.1 200 OK\r\nX-A: 1\r\n 2\r\nContent-Length: 0\r\n\r\n"},
	{"bare LF", "HTTP/1.1 200 OK\nContent-Length: 0\n\n\r\n\r\n"},
	{"33 fields", "HTTP/1.1 200 OK\r\n" + strings.Repeat("X-F: v\r\n", 32) + "Content-Length: 1\r\n\r\nx"},
	{"not HTTP", "hello\r\n\r\n"},
	{"a head over the bound", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Big: " + strings.Repeat("b", MaxAnswerHead) + "\r\n\r\n"},
	{"no head end within the bound", "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("b", MaxAnswerHead)},
}

// TestAnswerNotPlain: an answer that is not plain is reported as AnswerNotPlain, at the latest once
// its head is whole, with nothing written to out (not even past its length) and in left as it was,
// however its bytes came.
func TestAnswerNotPlain(t *testing.T) {
	for _, tc := range notPlainAnswers {
		t.Run(tc.name, func(t *testing.T) {
			answer := []byte(tc.answer)
			var p upstream.PlainAnswer
			if p.Parse(answer) {
				t.Fatal("a plain answer")
			}
			pieces := [][][]byte{{answer}}
			if len(answer) < 1<<10 { // the long ones would take minutes a byte at a time
				_, pieces = splits(answer)
			} else {
				pieces = append(pieces, [][]byte{answer[:1000], answer[1000:]})
			}
			var a Answer
			for _, ps := range pieces {
				a.Reset()
				out := make([]byte, 3, 64)
				for i := len(out); i < cap(out); i++ {
					out[:cap(out)][i] = 0xAA
				}
				var st AnswerState
				for j, piece := range ps {
					kept := bytes.Clone(piece)
					out, st = a.Feed(out, piece, answerNow)
					if len(out) != 3 || bytes.Count(out[3:cap(out)], []byte{0xAA}) != cap(out)-3 || !bytes.Equal(piece, kept) {
						t.Fatalf("%d pieces, piece %d: %v wrote to out (%q) or to in", len(ps), j, st, out[:cap(out)])
					}
					if st == AnswerDone || a.Started() {
						t.Fatalf("%d pieces, piece %d: %v, started %v", len(ps), j, st, a.Started())
					}
				}
				if st != AnswerNotPlain || a.Status() != 0 {
					t.Fatalf("%d pieces: %v, status %d; want AnswerNotPlain, 0", len(ps), st, a.Status())
				}
				if out, st = a.Feed(out, []byte("HTTP/1.1 200 OK\r\n"), answerNow); st != AnswerNotPlain || len(out) != 3 {
					t.Fatalf("a Feed after AnswerNotPlain: %v, %d bytes out", st, len(out))
				}
			}
		})
	}
}

// TestAnswerNotPlainEarly: bytes that cannot begin a plain head are reported at once, before any head
// is whole; a prefix of one that can is waited on.
func TestAnswerNotPlainEarly(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want AnswerState
	}{
		{"H", AnswerMore},
		{"HTTP/1.1 ", AnswerMore},
		{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n", AnswerMore},
		{"HTTP/1.0", AnswerNotPlain},
		{"http/1.1 200 OK\r\n", AnswerNotPlain},
		{"\r\nHTTP/1.1", AnswerNotPlain},
	} {
		var a Answer
		if _, st := a.Feed(nil, []byte(tc.in), answerNow); st != tc.want {
			t.Errorf("%q: %v, want %v", tc.in, st, tc.want)
		}
	}
}

// TestAnswerBoundsMatchPlainAnswer: Answer's bounds are upstream.PlainAnswer's: a head of
// MaxAnswerHead bytes and one of maxAnswerFields fields are plain, and relayed in one piece or two; a
// byte or a field more and neither is.
func TestAnswerBoundsMatchPlainAnswer(t *testing.T) {
	pad := func(n int) string {
		const pre, post = "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nX-Pad: ", "\r\n\r\n"
		return pre + strings.Repeat("p", n-len(pre)-len(post)) + post + "x"
	}
	fields := func(n int) string {
		return "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n" + strings.Repeat("X-F: v\r\n", n-1) + "\r\nx"
	}
	for _, tc := range []struct {
		name, answer string
		plain        bool
	}{
		{"MaxAnswerHead", pad(MaxAnswerHead), true},
		{"MaxAnswerHead+1", pad(MaxAnswerHead + 1), false},
		{"maxAnswerFields", fields(maxAnswerFields), true},
		{"maxAnswerFields+1", fields(maxAnswerFields + 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			answer := []byte(tc.answer)
			var p upstream.PlainAnswer
			if p.Parse(answer) != tc.plain {
				t.Fatalf("PlainAnswer.Parse = %v, want %v", !tc.plain, tc.plain)
			}
			want := AnswerNotPlain
			if tc.plain {
				want = AnswerDone
			}
			var a Answer
			whole := feedPieces(&a, answer)
			for _, k := range []int{1, len(answer) / 2, len(answer) - 2, len(answer) - 1} {
				f := feedPieces(&a, answer[:k], answer[k:])
				if st := f.states[1]; st != want || !bytes.Equal(f.out, whole.out) {
					t.Errorf("split at %d: %v, want %v; out differs from the whole's: %v", k, st, want, !bytes.Equal(f.out, whole.out))
				}
			}
			if st := whole.states[0]; st != want {
				t.Errorf("whole: %v, want %v", st, want)
			}
		})
	}
}

// TestAnswerHoldsBack: the client is given nothing until more than 2048 body bytes have come or the
// body is whole, as net/http (holdBack); an event stream's head goes at once, and its body as it
// comes, as the fast path flushes them.
func TestAnswerHoldsBack(t *testing.T) {
	head := "HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n"
	body := strings.Repeat("abcdefghij", 500)
	var a Answer
	a.Reset()
	var out []byte
	var st AnswerState
	if out, st = a.Feed(out, []byte(head), answerNow); st != AnswerMore || len(out) != 0 || a.Status() != 200 {
		t.Fatalf("the head alone: %v, %d bytes out, status %d", st, len(out), a.Status())
	}
	for i := 0; i < len(body); i += 100 {
		out, st = a.Feed(out, []byte(body[i:i+100]), answerNow)
		if given := i + 100; (given > holdBack) != (len(out) > 0) || a.Started() != (len(out) > 0) {
			t.Fatalf("after %d body bytes: %d bytes out, started %v", given, len(out), a.Started())
		}
	}
	if st != AnswerDone || !strings.HasSuffix(string(out), "\r\n\r\n"+body) {
		t.Fatalf("%v, out %q", st, out)
	}

	stream := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 18\r\n\r\n"
	a.Reset()
	out, st = a.Feed(nil, []byte(stream), answerNow)
	if st != AnswerMore || !strings.HasSuffix(string(out), "\r\n\r\n") || !a.Started() {
		t.Fatalf("an event stream's head: %v, out %q", st, out)
	}
	for _, ev := range []string{"data: 1\n\n", "data: 2\n\n"} {
		if out, st = a.Feed(out[:0], []byte(ev), answerNow); string(out) != ev {
			t.Fatalf("an event: %v, out %q, want %q", st, out, ev)
		}
	}
	if st != AnswerDone {
		t.Fatalf("the stream's end: %v", st)
	}
}

// TestAnswerExtra: bytes past the answer's end are reported, not given to the client, whether they
// come with the answer's last bytes or after.
func TestAnswerExtra(t *testing.T) {
	answer := "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi"
	var a Answer
	whole := feedPieces(&a, []byte(answer))
	for _, tc := range []struct {
		name   string
		pieces []string
		extra  int
	}{
		{"with the answer", []string{answer + "HTTP/1.1 200 OK\r\n"}, 17},
		{"with the body", []string{answer[:len(answer)-2], "hi!!"}, 2},
		{"after the answer", []string{answer, "!!!"}, 3},
		{"a body too long in its head's piece", []string{answer[:len(answer)-2] + "hi and more"}, 9},
	} {
		var bs [][]byte
		for _, p := range tc.pieces {
			bs = append(bs, []byte(p))
		}
		f := feedPieces(&a, bs...)
		if st := f.states[len(f.states)-1]; st != AnswerDone || f.extra != tc.extra || !bytes.Equal(f.out, whole.out) {
			t.Errorf("%s: %v, extra %d, out %q; want AnswerDone, %d, %q", tc.name, st, f.extra, f.out, tc.extra, whole.out)
		}
	}
}

// TestAnswerCutMatchesNetHTTP: an answer the upstream cuts off reaches the client as the fast path
// lets it: nothing at all when the head had not come (the edge answers it, 502 here) or when at most
// 2048 body bytes had, else a prefix of the answer (of another length: each buffers differently), and
// an event stream's head and body at once.
func TestAnswerCutMatchesNetHTTP(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	fp := newFastPath(t)
	long := "HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + strings.Repeat("<html>", 834)[:5000]
	headLen := strings.Index(long, "\r\n\r\n") + 4
	var a Answer
	full := feedPieces(&a, []byte(long)).out
	for _, tc := range []struct {
		name    string
		sent    string
		started bool
	}{
		{"in the body, 1000 bytes", long[:headLen+1000], false},
		{"in the body, 2048 bytes", long[:headLen+2048], false},
		{"in the body, 2049 bytes", long[:headLen+2049], true},
		{"in the body, 4999 bytes", long[:headLen+4999], true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := fp.get(t, script{answer: []byte(tc.sent), cut: true}, true)
			f := feedPieces(&a, []byte(tc.sent[:headLen]), []byte(tc.sent[headLen:]))
			if a.Started() != tc.started || (len(got) > 0) != tc.started || (len(f.out) > 0) != tc.started {
				t.Fatalf("started %v, %d bytes out; net/http sent %d bytes; want started %v", a.Started(), len(f.out), len(got), tc.started)
			}
			if !tc.started {
				return
			}
			if got = withDate(t, got); !bytes.HasPrefix(full, got) || !bytes.HasPrefix(full, f.out) {
				t.Fatalf("not prefixes of the whole answer:\nnet/http %q\n  Answer %q", got, f.out)
			}
		})
	}

	// The fast path flushes an event stream's head at once, and each piece of its body: whether an
	// answer is one is read from its first Content-Type, with Unicode's case folding and spaces.
	for _, tc := range []struct {
		name, fields string
		started      bool
	}{
		{"an event stream", "Content-Type: text/event-stream\r\n", true},
		{"an event stream in odd case, with parameters", "content-type: Text/Event-Stream ; charset=utf-8\r\n", true},
		{"an event stream spelled with a long s", "Content-Type: text/event-\u017ftream\r\n", true},
		{"an event stream after a no-break space", "Content-Type: \u00a0text/event-stream\r\n", true},
		{"an event stream, then another type", "Content-Type: text/event-stream\r\nContent-Type: text/plain\r\n", true},
		{"another type, then an event stream", "Content-Type: text/plain\r\ncontent-type: text/event-stream\r\n", false},
		{"no event stream", "Content-Type: text/event-streams\r\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent := "HTTP/1.1 200 OK\r\n" + tc.fields + "Content-Length: 100\r\n\r\ndata: 1\n\n"
			got := fp.get(t, script{answer: []byte(sent), cut: true}, true)
			if len(got) > 0 {
				got = withDate(t, got)
			}
			f := feedPieces(&a, []byte(sent))
			if !bytes.Equal(f.out, got) || a.Started() != tc.started {
				t.Fatalf("started %v, want %v:\n  Answer %q\nnet/http %q", a.Started(), tc.started, f.out, got)
			}
		})
	}

	t.Run("in the head", func(t *testing.T) {
		sent := long[:headLen-3]
		got := fp.get(t, script{answer: []byte(sent), cut: true}, false)
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(got)), nil)
		if err != nil || resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("net/http's answer %q, %v; want a 502", got, err)
		}
		if f := feedPieces(&a, []byte(sent)); a.Status() != 0 || a.Started() || len(f.out) > 0 || f.states[0] != AnswerMore {
			t.Fatalf("status %d, started %v, out %q, %v", a.Status(), a.Started(), f.out, f.states[0])
		}
	})
}

// TestAnswerAfterDone: Feed after AnswerDone writes nothing and counts all its input as extra, until
// Reset; Reset after AnswerNotPlain readies the Answer for a plain answer.
func TestAnswerAfterDone(t *testing.T) {
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
	var a Answer
	want := feedPieces(&a, answer).out
	out, st := a.Feed(nil, []byte("more"), answerNow)
	if st != AnswerDone || len(out) != 0 || a.Extra() != 4 {
		t.Errorf("after AnswerDone: %v, out %q, extra %d", st, out, a.Extra())
	}
	if f := feedPieces(&a, []byte("HTTP/1.1 204 No Content\r\n\r\n")); f.states[0] != AnswerNotPlain {
		t.Fatalf("a 204: %v", f.states[0])
	}
	if f := feedPieces(&a, answer); f.states[0] != AnswerDone || !bytes.Equal(f.out, want) {
		t.Errorf("after Reset: %v, out %q, want %q", f.states[0], f.out, want)
	}
}

// TestAnswerDate: the Date added is now's second in UTC, made anew when the second changes.
func TestAnswerDate(t *testing.T) {
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
	var a Answer
	loc := time.FixedZone("east", 5*3600)
	for _, now := range []time.Time{
		time.Unix(0, 0), // the second a new Answer's cache holds none of
		time.Date(2026, 12, 6, 21, 30, 5, 0, time.UTC),
		time.Date(2026, 12, 6, 21, 30, 5, 999999999, time.UTC),
		time.Date(2026, 12, 6, 21, 30, 6, 0, time.UTC),
		time.Date(2026, 12, 7, 2, 30, 7, 0, loc),
	} {
		a.Reset()
		out, _ := a.Feed(nil, answer, now)
		want := "\r\nDate: " + now.UTC().Truncate(time.Second).Format(http.TimeFormat) + "\r\n"
		if !strings.Contains(string(out), want) {
			t.Errorf("at %v: %q, want it to hold %q", now, out, want)
		}
	}
}

// TestAnswerAllocatesNothing: once warm, an Answer allocates nothing per answer, however the answer
// comes: whole, or head and body in pieces, held back, sniffed, with a new Date each time.
func TestAnswerAllocatesNothing(t *testing.T) {
	body := strings.Repeat("<b>x</b>", 600)
	answer := []byte("HTTP/1.1 200 OK\r\ncontent-type: text/html\r\nX-B: 1\r\nx-a: 2\r\nX-B: 3\r\nContent-Length: 4800\r\n\r\n" + body)
	sniffed := []byte("HTTP/1.1 299 Odd\r\nKeep-Alive: timeout=5\r\nX-B: 1\r\nContent-Length: 4800\r\n\r\n" + body)
	for _, tc := range []struct {
		name   string
		pieces [][]byte
	}{
		{"whole", [][]byte{answer}},
		{"sniffed, whole", [][]byte{sniffed}},
		{"sniffed, in pieces", [][]byte{sniffed[:20], sniffed[20:90], sniffed[90:200], sniffed[200:1000], sniffed[1000:]}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a Answer
			out := make([]byte, 0, 16<<10)
			now := answerNow
			var st AnswerState
			run := func() {
				a.Reset()
				o := out[:0]
				for _, p := range tc.pieces {
					o, st = a.Feed(o, p, now)
				}
				now = now.Add(time.Second)
			}
			run()
			if st != AnswerDone {
				t.Fatalf("%v", st)
			}
			if n := testing.AllocsPerRun(100, run); n != 0 || st != AnswerDone {
				t.Errorf("%v allocations per answer (%v), want 0", n, st)
			}
		})
	}
}

// hopByHop are the fields the fast path drops from an answer (upstream's removeHopByHop, less those a
// plain answer cannot have).
var hopByHop = []string{"Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Upgrade"}

// FuzzAnswer: for any bytes from the upstream, fed in any pieces, Feed does not panic; it writes
// nothing for an answer that is not plain, and reports AnswerNotPlain for a whole head exactly when
// PlainAnswer does not parse it; it reports AnswerDone exactly at the end of a plain answer; and the client's bytes of a whole plain answer parse (http.ReadResponse) to its status,
// fields (less hop-by-hop ones, plus a Date and sniffed Content-Type when net/http adds them) and body,
// and are, but for the Date's value, what the edge's net/http fast path writes for it.
func FuzzAnswer(f *testing.F) {
	for _, tc := range plainAnswers {
		f.Add([]byte(tc.answer), []byte{7, 40, 1})
	}
	for _, tc := range notPlainAnswers[:len(notPlainAnswers)-2] { // not the 64 KiB ones
		f.Add([]byte(tc.answer), []byte{3})
	}
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi and more"), []byte{})
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\nshort"), []byte{0})
	fp := newFastPath(f)
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		var a Answer
		var pieces [][]byte
		for rest, i := data, 0; len(rest) > 0; i++ {
			n := len(rest)
			if len(cuts) > 0 {
				n = min(n, int(cuts[i%len(cuts)])+1)
			}
			pieces = append(pieces, rest[:n])
			rest = rest[n:]
		}
		fd := feedPieces(&a, pieces...)
		var p upstream.PlainAnswer
		plain := p.Parse(data)
		end := 0 // how much of data the answer takes, at AnswerDone
		for i, st := range fd.states {
			if st == AnswerNotPlain && (plain || len(fd.out) > 0 || a.Started()) {
				t.Fatalf("AnswerNotPlain at piece %d: PlainAnswer takes the head %v, %d bytes out", i, plain, len(fd.out))
			}
			if st == AnswerDone && end == 0 {
				for _, q := range pieces[:i+1] {
					end += len(q)
				}
				end -= fd.extras[i]
			}
		}
		if len(fd.states) == 0 {
			return
		}
		last := fd.states[len(fd.states)-1]
		if !plain {
			// Once the head is whole, or the bound passed, the answer is known not to be plain.
			i := bytes.Index(data, []byte("\r\n\r\n"))
			if known := i >= 0 && i+4 <= MaxAnswerHead || len(data) >= MaxAnswerHead; known && last != AnswerNotPlain {
				t.Fatalf("a head PlainAnswer does not take, whole: %v", last)
			}
			return
		}
		whole := int64(p.HeadLen()) + p.ContentLength()
		if int64(len(data)) < whole {
			if last != AnswerMore {
				t.Fatalf("an answer cut short: %v", last)
			}
			return
		}
		if int64(end) != whole {
			t.Fatalf("AnswerDone after %d bytes, want %d (states %v, extra %d)", end, whole, fd.states, fd.extra)
		}
		checkParses(t, data[:whole], fd.out, a.Status())
		want := fp.get(t, script{answer: data[:whole]}, false)
		if !hasDate(data) {
			want = withDate(t, want)
		}
		if !bytes.Equal(fd.out, want) {
			t.Fatalf("Answer:\n%q\nnet/http:\n%q", fd.out, want)
		}
	})
}

// checkParses checks that out, what Answer gave the client for answer (whole, plain), parses to its
// status, fields and body.
func checkParses(t *testing.T, answer, out []byte, status int) {
	t.Helper()
	up, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(answer)), nil)
	if err != nil {
		t.Fatalf("the upstream's answer: %v", err)
	}
	upBody, _ := io.ReadAll(up.Body)
	br := bufio.NewReader(bytes.NewReader(out))
	got, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the client's answer %q: %v", out, err)
	}
	body, err := io.ReadAll(got.Body)
	if err != nil || !bytes.Equal(body, upBody) || br.Buffered() != 0 {
		t.Fatalf("the client's body %q (%v, %d bytes after it), want %q", body, err, br.Buffered(), upBody)
	}
	if got.StatusCode != up.StatusCode || status != up.StatusCode || got.Proto != "HTTP/1.1" {
		t.Fatalf("status %d (Status %d), proto %s; want %d, HTTP/1.1", got.StatusCode, status, got.Proto, up.StatusCode)
	}
	want := up.Header.Clone()
	for _, k := range hopByHop {
		delete(want, k)
	}
	if _, ok := up.Header["Date"]; !ok {
		if _, err := http.ParseTime(got.Header.Get("Date")); err != nil || len(got.Header["Date"]) != 1 {
			t.Fatalf("the added Date %q: %v", got.Header["Date"], err)
		}
		want["Date"] = got.Header["Date"]
	}
	if _, ok := up.Header["Content-Type"]; !ok && up.Header.Get("Content-Encoding") == "" && len(upBody) > 0 {
		want["Content-Type"] = []string{http.DetectContentType(upBody)}
	}
	if !reflect.DeepEqual(got.Header, want) {
		t.Fatalf("fields\n got %v\nwant %v", got.Header, want)
	}
}

// TestCanonMatchesNetHTTP: the names Answer writes and the order it writes them in are
// http.CanonicalHeaderKey's and net/http's sort's (by canonical name), for names the differential
// tests do not reach.
func TestCanonMatchesNetHTTP(t *testing.T) {
	names := []string{"a", "A", "a-", "-a", "a-b", "A-B", "ab", "Ab", "aB", "x--y", "X-Y", "x_y", "1a", "a1", "WWW-authenticate", "etag", "ETag", "Te", "te-", "content-type", "Content-Type-X", "~", "z"}
	for _, x := range names {
		if got, want := string(appendCanon(nil, []byte(x))), http.CanonicalHeaderKey(x); got != want {
			t.Errorf("appendCanon(%q) = %q, want %q", x, got, want)
		}
		for _, y := range names {
			if got, want := canonLess([]byte(x), []byte(y)), http.CanonicalHeaderKey(x) < http.CanonicalHeaderKey(y); got != want {
				t.Errorf("canonLess(%q, %q) = %v, want %v", x, y, got, want)
			}
		}
	}
}

// TestAnswerResetLetsLargeBuffersGo: an answer whose head took a large buffer (a tenant sending a head
// near the limit) leaves it behind at Reset, so an idle keep-alive client does not hold it for its
// connection's life; a common head's buffer is kept (TestAnswerAllocatesNothing).
func TestAnswerResetLetsLargeBuffersGo(t *testing.T) {
	var a Answer
	head := "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("x", 40<<10) + "\r\nContent-Length: 2\r\n\r\nok"
	var out []byte
	for i := 0; i < len(head); i += 1000 { // in pieces: the head is held until whole
		out, _ = a.Feed(out[:0], []byte(head[i:min(i+1000, len(head))]), answerNow)
	}
	if cap(a.raw)+cap(a.hold) <= 8<<10 {
		t.Skipf("the head took no large buffer (raw %d, hold %d): nothing to let go", cap(a.raw), cap(a.hold))
	}
	a.Reset()
	if cap(a.raw) > 8<<10 || cap(a.hold) > 8<<10 {
		t.Fatalf("after Reset, raw %d and hold %d bytes kept, want at most 8 KiB each", cap(a.raw), cap(a.hold))
	}
}
