package tftp

import "errors"

// Sentinel errors. The text of the ones returned while serving is sent to the
// client in the TFTP ERROR packet, so it stays short and reveals no paths.
var (
	// ErrBadPath: the requested name is empty, absolute, not clean, contains
	// "..", a NUL byte, a backslash or a control character, or is too long.
	ErrBadPath = errors.New("access violation")
	// ErrNotFound: no embedded binary and no regular file under the root has the name.
	ErrNotFound = errors.New("file not found")
	// ErrBusy: MaxTransfers transfers are already running.
	ErrBusy = errors.New("server busy")
	// ErrWriteRefused: a write request (WRQ); this server never accepts writes.
	ErrWriteRefused = errors.New("write requests are refused")
	// ErrConfig: the Config failed validation.
	ErrConfig = errors.New("tftp: invalid config")
)
