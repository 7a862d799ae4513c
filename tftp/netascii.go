package tftp

import (
	"bufio"
	"io"
)

// netasciiReader converts a byte stream to netascii for a netascii-mode
// transfer (RFC 1350 §5 refers to RFC 764): LF becomes CR LF and a bare CR
// becomes CR NUL. A netascii client reverses both, so every byte of the
// file arrives unchanged.
type netasciiReader struct {
	r       *bufio.Reader
	pending int // second byte of the last expansion, or -1
}

func newNetasciiReader(r io.Reader) *netasciiReader {
	return &netasciiReader{r: bufio.NewReader(r), pending: -1}
}

func (n *netasciiReader) Read(p []byte) (int, error) {
	i := 0
	for i < len(p) {
		if n.pending >= 0 {
			p[i] = byte(n.pending)
			n.pending = -1
			i++
			continue
		}
		c, err := n.r.ReadByte()
		if err != nil {
			if i > 0 {
				return i, nil
			}
			return 0, err
		}
		switch c {
		case '\n':
			p[i], n.pending = '\r', '\n'
		case '\r':
			p[i], n.pending = '\r', 0
		default:
			p[i] = c
		}
		i++
	}
	return i, nil
}
