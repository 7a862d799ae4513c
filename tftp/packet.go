package tftp

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
)

// TFTP opcodes (RFC 1350 §5; OACK from RFC 2347).
const (
	opRRQ   uint16 = 1 // read request
	opWRQ   uint16 = 2 // write request
	opDATA  uint16 = 3
	opACK   uint16 = 4
	opERROR uint16 = 5
	opOACK  uint16 = 6 // option acknowledgment (RFC 2347)
)

// MaxRequestLen is the largest request packet accepted, in octets
// (RFC 2347, "Packet Formats": "The maximum size of a request packet is 512
// octets").
const MaxRequestLen = 512

// Transfer modes (RFC 1350 §1, §5). Compared case-insensitively.
const (
	ModeNetascii = "netascii"
	ModeOctet    = "octet"
	modeMail     = "mail" // obsolete (RFC 1350 §1); refused
)

// request is a parsed RRQ or WRQ. Every field keeps the bytes the client
// sent, so that encode(parseRequest(p)) == p for every accepted p.
type request struct {
	op       uint16
	filename string   // as sent; CleanName decides what it names
	mode     string   // as sent; netascii or octet in any letter case
	options  []option // RFC 2347 name/value pairs, in the order sent
}

type option struct{ name, value string }

// netascii reports whether the request asked for netascii mode.
func (r request) netascii() bool { return strings.EqualFold(r.mode, ModeNetascii) }

// parseRequest parses a read or write request (RFC 1350 §5) with its
// option list (RFC 2347):
//
//	| opc | filename | 0 | mode | 0 | opt1 | 0 | value1 | 0 | ... | optN | 0 | valueN | 0 |
//
// It accepts only that exact shape: every field NUL-terminated, the mode
// "netascii" or "octet" (case-insensitive; the obsolete "mail" and anything
// else are refused), options as complete pairs with a non-empty name, no
// option named twice (names compare case-insensitively), and at most
// MaxRequestLen octets. Any other packet wraps ErrIllegalOp. Option values
// are not interpreted here: RFC 2347 has a server ignore options it does not
// support, so the caller decides per option. The filename is not judged
// here either (CleanName does that).
func parseRequest(p []byte) (request, error) {
	var r request
	if len(p) < 2 {
		return r, fmt.Errorf("%w: %d-octet packet", ErrIllegalOp, len(p))
	}
	r.op = binary.BigEndian.Uint16(p)
	if r.op != opRRQ && r.op != opWRQ {
		return r, fmt.Errorf("%w: opcode %d is not a request", ErrIllegalOp, r.op)
	}
	if len(p) > MaxRequestLen {
		return r, fmt.Errorf("%w: request of %d octets > %d", ErrIllegalOp, len(p), MaxRequestLen)
	}
	body := p[2:]
	if len(body) == 0 || body[len(body)-1] != 0 {
		return r, fmt.Errorf("%w: last field not NUL-terminated", ErrIllegalOp)
	}
	fields := bytes.Split(body[:len(body)-1], []byte{0})
	if len(fields) < 2 {
		return r, fmt.Errorf("%w: no mode field", ErrIllegalOp)
	}
	r.filename, r.mode = string(fields[0]), string(fields[1])
	switch strings.ToLower(r.mode) {
	case ModeNetascii, ModeOctet:
	case modeMail:
		return r, fmt.Errorf("%w: obsolete mode %q", ErrIllegalOp, r.mode)
	default:
		return r, fmt.Errorf("%w: mode %q is not netascii or octet", ErrIllegalOp, sanitize(r.mode))
	}
	rest := fields[2:]
	if len(rest)%2 != 0 {
		return r, fmt.Errorf("%w: option %q has no value", ErrIllegalOp, sanitize(string(rest[len(rest)-1])))
	}
	for i := 0; i < len(rest); i += 2 {
		name := string(rest[i])
		if name == "" {
			return r, fmt.Errorf("%w: empty option name", ErrIllegalOp)
		}
		for _, o := range r.options {
			if strings.EqualFold(o.name, name) {
				return r, fmt.Errorf("%w: option %q given twice", ErrIllegalOp, sanitize(name))
			}
		}
		r.options = append(r.options, option{name: name, value: string(rest[i+1])})
	}
	return r, nil
}

// encode returns the request's wire form (the inverse of parseRequest).
func (r request) encode() []byte {
	b := binary.BigEndian.AppendUint16(nil, r.op)
	b = append(append(b, r.filename...), 0)
	b = append(append(b, r.mode...), 0)
	for _, o := range r.options {
		b = append(append(b, o.name...), 0)
		b = append(append(b, o.value...), 0)
	}
	return b
}

// errorPacket builds ERROR (RFC 1350 §5): opcode 5, code, message, NUL.
func errorPacket(code ErrorCode, msg string) []byte {
	b := binary.BigEndian.AppendUint16(nil, opERROR)
	b = binary.BigEndian.AppendUint16(b, uint16(code))
	return append(append(b, msg...), 0)
}
