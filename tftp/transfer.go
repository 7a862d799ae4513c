package tftp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// sender is the lockstep sending side of one read transfer (RFC 1350 §2,
// §6): one packet out, then wait for the ACK naming it.
type sender struct {
	conn    *net.UDPConn // the transfer's own socket (its TID)
	peer    *net.UDPAddr // the client's address and TID
	timeout time.Duration
	retries int
	rbuf    []byte
}

// send runs the transfer: the OACK first when oack is not empty (the client
// answers it with ACK 0, RFC 2347), then DATA blocks of blk octets from r,
// numbered from 1 and wrapping from 65535 to 0 for files of more than 65535
// blocks; the block shorter than blk (possibly empty) ends it. It returns
// the payload octets sent. Errors: ErrPeer (the client sent ERROR),
// ErrTimeout, a read error from r, or a socket error.
func (t *sender) send(oack []option, blk int, r io.Reader) (int64, error) {
	if len(oack) > 0 {
		if err := t.exchange(oackPacket(oack), 0); err != nil {
			return 0, err
		}
	}
	pkt := make([]byte, 4+blk)
	binary.BigEndian.PutUint16(pkt, opDATA)
	var sent int64
	for block := uint16(1); ; block++ {
		n, err := io.ReadFull(r, pkt[4:])
		if err != nil && err != io.EOF && !errors.Is(err, io.ErrUnexpectedEOF) {
			return sent, fmt.Errorf("tftp: read file: %w", err)
		}
		binary.BigEndian.PutUint16(pkt[2:], block)
		if err := t.exchange(pkt[:4+n], block); err != nil {
			return sent, err
		}
		sent += int64(n)
		if n < blk {
			return sent, nil
		}
	}
}

// exchange sends pkt and waits for ACK block, resending pkt after each
// Timeout without it, Retries times. An ACK of another block (a duplicate
// or a late one) is ignored and never triggers a resend — resending on
// duplicate ACKs is the "Sorcerer's Apprentice" bug (RFC 1123 §4.2.3.1).
// A packet from any other address or port gets ERROR 5 and the transfer
// goes on (RFC 1350 §4). Errors: ErrPeer, ErrTimeout, a socket error.
func (t *sender) exchange(pkt []byte, block uint16) error {
	for try := 0; try <= t.retries; try++ {
		if _, err := t.conn.WriteToUDP(pkt, t.peer); err != nil {
			return fmt.Errorf("tftp: send: %w", err)
		}
		deadline := time.Now().Add(t.timeout)
		for {
			if err := t.conn.SetReadDeadline(deadline); err != nil {
				return fmt.Errorf("tftp: set deadline: %w", err)
			}
			n, from, err := t.conn.ReadFromUDP(t.rbuf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					break // resend
				}
				return fmt.Errorf("tftp: receive: %w", err)
			}
			p := t.rbuf[:n]
			if !from.IP.Equal(t.peer.IP) || from.Port != t.peer.Port {
				if n >= 2 && binary.BigEndian.Uint16(p) != opERROR {
					code, msg := reply(ErrUnknownTID)
					_, _ = t.conn.WriteToUDP(errorPacket(code, msg), from)
				}
				continue
			}
			if n < 4 {
				continue
			}
			switch binary.BigEndian.Uint16(p) {
			case opACK:
				if binary.BigEndian.Uint16(p[2:]) == block {
					return nil
				}
			case opERROR:
				msg := p[4:]
				if i := bytes.IndexByte(msg, 0); i >= 0 {
					msg = msg[:i]
				}
				return fmt.Errorf("%w: code %d %q", ErrPeer, binary.BigEndian.Uint16(p[2:]), sanitize(string(msg)))
			}
		}
	}
	return fmt.Errorf("%w: no ACK of block %d after %d sends %s apart", ErrTimeout, block, t.retries+1, t.timeout)
}
