package upstream

import "encoding/binary"

// closeWatch follows one direction of a WebSocket's frames (RFC 6455 section 5.2) far enough to see
// its first Close frame, so that a tunnel knows which side began the close handshake: the side whose
// TCP connection ends first says nothing of that, as the server (the tenant) closes first however the
// handshake began (RFC 6455 section 7.1.1). It reads each frame's header and skips its payload: a few
// comparisons a frame, one subtraction a read, nothing per payload byte. Frames are not checked
// beyond their lengths; a length no WebSocket can have (the top bit of a 64-bit one) stops the
// watch, and the tunnel then goes by its connections alone.
type closeWatch struct {
	skip uint64   // payload bytes left of the frame whose header was read
	hdr  [14]byte // the header being read: 2 bytes, then up to 8 of length and 4 of masking key
	have uint8    // bytes of hdr read
	off  bool     // watching stopped: a Close frame was seen, or the stream is no WebSocket's
}

// opClose is the opcode of a Close frame.
const opClose = 0x8

// sawClose reads p, the next bytes of the direction, and reports whether a Close frame begins in it:
// once, at the first; it watches no more after that.
func (w *closeWatch) sawClose(p []byte) bool {
	for len(p) > 0 && !w.off {
		if w.skip > 0 {
			n := min(w.skip, uint64(len(p)))
			p, w.skip = p[n:], w.skip-n
			continue
		}
		w.hdr[w.have] = p[0]
		w.have++
		p = p[1:]
		if w.have < 2 {
			continue
		}
		need := uint8(2)
		switch w.hdr[1] & 0x7f {
		case 126:
			need += 2
		case 127:
			need += 8
		}
		if w.hdr[1]&0x80 != 0 { // masked: the client's frames
			need += 4
		}
		if w.have < need {
			continue
		}
		if w.hdr[0]&0x0f == opClose {
			w.off = true
			return true
		}
		switch n := w.hdr[1] & 0x7f; n {
		case 126:
			w.skip = uint64(binary.BigEndian.Uint16(w.hdr[2:4]))
		case 127:
			w.skip = binary.BigEndian.Uint64(w.hdr[2:10])
			if w.skip>>63 != 0 {
				w.off = true
				return false
			}
		default:
			w.skip = uint64(n)
		}
		w.have = 0
	}
	return false
}
