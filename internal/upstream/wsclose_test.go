package upstream

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// wsFrame is a WebSocket frame (RFC 6455 section 5.2) with FIN set: its header, a masking key when
// masked (the client's frames), and n bytes of payload that are all 0x88, a Close frame's first
// byte, so that a watch reading payload as headers would see one.
func wsFrame(opcode byte, masked bool, n int) []byte {
	b := []byte{0x80 | opcode, 0}
	switch {
	case n < 126:
		b[1] = byte(n)
	case n <= 0xffff:
		b[1] = 126
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b[1] = 127
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	if masked {
		b[1] |= 0x80
		b = append(b, 0x88, 0x88, 0x88, 0x88)
	}
	return append(b, bytes.Repeat([]byte{0x88}, n)...)
}

// unfinished is frame f without FIN: a fragment that more frames of its message follow.
func unfinished(f []byte) []byte {
	f = bytes.Clone(f)
	f[0] &^= 0x80
	return f
}

// TestCloseWatch: the watch sees the first Close frame of a stream of frames, whatever their lengths
// (7, 16 and 64 bits) and masking, and however the stream is cut into reads; once, at the read that
// completes the Close frame's header, and never in a payload. A stream whose length no WebSocket can
// have stops the watch.
func TestCloseWatch(t *testing.T) {
	cat := func(frames ...[]byte) (stream []byte, closeAt int) {
		closeAt = -1
		for _, f := range frames {
			if closeAt < 0 && f[0]&0x0f == opClose {
				hdr := 2
				switch f[1] & 0x7f {
				case 126:
					hdr += 2
				case 127:
					hdr += 8
				}
				if f[1]&0x80 != 0 {
					hdr += 4
				}
				closeAt = len(stream) + hdr - 1
			}
			stream = append(stream, f...)
		}
		return stream, closeAt
	}
	const text, binaryOp, cont, ping, pong = 0x1, 0x2, 0x0, 0x9, 0xa
	for _, masked := range []bool{false, true} {
		cases := []struct {
			name   string
			frames [][]byte
		}{
			{"text then close", [][]byte{wsFrame(text, masked, 5), wsFrame(opClose, masked, 2)}},
			{"close at once", [][]byte{wsFrame(opClose, masked, 0), wsFrame(text, masked, 3)}},
			{"16-bit length", [][]byte{wsFrame(binaryOp, masked, 300), wsFrame(ping, masked, 0), wsFrame(opClose, masked, 2)}},
			{"64-bit length", [][]byte{wsFrame(binaryOp, masked, 70000), wsFrame(opClose, masked, 20)}},
			{"between fragments", [][]byte{unfinished(wsFrame(text, masked, 3)), wsFrame(opClose, masked, 2), wsFrame(cont, masked, 1)}},
			{"two closes", [][]byte{wsFrame(opClose, masked, 2), wsFrame(opClose, masked, 2)}},
			{"no close", [][]byte{wsFrame(text, masked, 125), wsFrame(ping, masked, 4), wsFrame(pong, masked, 4), wsFrame(binaryOp, masked, 126)}},
		}
		for _, tc := range cases {
			stream, closeAt := cat(tc.frames...)
			name := tc.name
			if masked {
				name += ", masked"
			}
			t.Run(name, func(t *testing.T) {
				// Every cut of the stream into two reads, and one read a byte.
				for cut := 0; cut <= len(stream); cut += max(1, len(stream)/500) {
					var w closeWatch
					seen := []int{}
					if w.sawClose(stream[:cut]) {
						seen = append(seen, cut-1)
					}
					if w.sawClose(stream[cut:]) {
						seen = append(seen, len(stream)-1)
					}
					if closeAt < 0 && len(seen) > 0 || closeAt >= 0 && (len(seen) != 1 || (closeAt < cut) != (seen[0] < cut)) {
						t.Fatalf("cut at %d of %d: a close seen in reads ending at %v, want once, in the read holding byte %d", cut, len(stream), seen, closeAt)
					}
				}
				var w closeWatch
				seen := -1
				for i := range stream {
					if w.sawClose(stream[i : i+1]) {
						if seen >= 0 {
							t.Fatalf("a byte at a time: a close seen at %d and %d, want once", seen, i)
						}
						seen = i
					}
				}
				if seen != closeAt {
					t.Errorf("a byte at a time: a close seen at byte %d, want %d", seen, closeAt)
				}
			})
		}
	}

	t.Run("no WebSocket", func(t *testing.T) {
		// A 64-bit length with its top bit set, then what would be a Close frame.
		stream := append([]byte{0x82, 127, 0x80, 0, 0, 0, 0, 0, 0, 0}, wsFrame(opClose, false, 0)...)
		var w closeWatch
		if w.sawClose(stream) {
			t.Error("a close seen after a length no WebSocket can have")
		}
		if !w.off {
			t.Error("the watch goes on after a length no WebSocket can have")
		}
	})
}
