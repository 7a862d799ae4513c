package tftp

import "errors"

// Sentinel errors, matched with errors.Is. Their text (with the wrapped
// detail) goes to the log only; what a client is told comes from replies.
var (
	// ErrBadPath: the requested name is empty, not clean, contains a ".."
	// element, a NUL byte, a backslash or a control character, is too long,
	// or resolves outside the root (a symlink leaving it). Sent as ERROR 2.
	ErrBadPath = errors.New("tftp: name refused")
	// ErrNotFound: no embedded binary and no regular file under the root has
	// the name. Sent as ERROR 1.
	ErrNotFound = errors.New("tftp: file not found")
	// ErrIllegalOp: a malformed request (see parseRequest: not NUL-terminated,
	// a mode other than netascii/octet, an incomplete or repeated option, over
	// MaxRequestLen), or a packet on the server port that is not a request.
	// Sent as ERROR 4.
	ErrIllegalOp = errors.New("tftp: illegal operation")
	// ErrWriteRefused: a write request (WRQ); this server never accepts
	// writes. Sent as ERROR 2.
	ErrWriteRefused = errors.New("tftp: write request refused")
	// ErrBusy: MaxTransfers transfers are already running. Sent as ERROR 0.
	ErrBusy = errors.New("tftp: server busy")
	// ErrTimeout: the client did not acknowledge a packet after Retries
	// resends spaced by Timeout. Sent as ERROR 0 (the client is probably gone).
	ErrTimeout = errors.New("tftp: client stopped acknowledging")
	// ErrUnknownTID: a DATA or ACK packet from an address and port that has
	// no transfer (RFC 1350 §4). Every transfer is served from the server
	// port (pin/tftp single-port mode), so this is also what a stray packet
	// aimed at a running transfer gets. Sent as ERROR 5 to that source; any
	// running transfer goes on.
	ErrUnknownTID = errors.New("tftp: unknown transfer ID")
	// ErrPeer: the client ended the transfer with an ERROR packet (e.g. code 8
	// after reading tsize from the OACK). Nothing is sent back (RFC 1350 §7:
	// an ERROR is not acknowledged).
	ErrPeer = errors.New("tftp: client sent ERROR")
	// ErrInternal: pin/tftp started a transfer the gate did not admit (a
	// request that raced the end of the same client's previous transfer or
	// shutdown). Sent as ERROR 0 "server error".
	ErrInternal = errors.New("tftp: internal error")
	// ErrConfig: the Config failed validation.
	ErrConfig = errors.New("tftp: invalid config")
)

// ErrorCode is the code of a TFTP ERROR packet (RFC 1350 §5 "Error Codes";
// 8 from RFC 2347).
type ErrorCode uint16

// Error codes.
const (
	CodeNotDefined       ErrorCode = 0 // "Not defined, see error message (if any)"
	CodeFileNotFound     ErrorCode = 1
	CodeAccessViolation  ErrorCode = 2
	CodeDiskFull         ErrorCode = 3 // never sent: the server writes nothing
	CodeIllegalOperation ErrorCode = 4
	CodeUnknownTID       ErrorCode = 5
	CodeFileExists       ErrorCode = 6 // never sent
	CodeNoSuchUser       ErrorCode = 7 // never sent (mail mode is refused)
	CodeOptionRefused    ErrorCode = 8 // RFC 2347: a client ends a transfer over its options; never sent
)

// replies is the one table of what a client is told: for each error class
// the RFC 1350 code and a short fixed message. The detail (file system
// errors, socket errors, which field was malformed) is logged, never sent.
var replies = []struct {
	err  error
	code ErrorCode
	msg  string
}{
	{ErrNotFound, CodeFileNotFound, "file not found"},
	{ErrBadPath, CodeAccessViolation, "access violation"},
	{ErrWriteRefused, CodeAccessViolation, "access violation: read-only server"},
	{ErrIllegalOp, CodeIllegalOperation, "illegal TFTP operation"},
	{ErrUnknownTID, CodeUnknownTID, "unknown transfer ID"},
	{ErrBusy, CodeNotDefined, "server busy"},
	{ErrTimeout, CodeNotDefined, "timed out"},
}

// replyInternal is sent for any other failure (e.g. a read error on a file,
// ErrInternal, or any text pin/tftp produces itself other than its timeout).
const replyInternal = "server error"

// reply returns the code and fixed message a client is sent for err.
func reply(err error) (ErrorCode, string) {
	for _, r := range replies {
		if errors.Is(err, r.err) {
			return r.code, r.msg
		}
	}
	return CodeNotDefined, replyInternal
}
