package httpboot

import "errors"

// Sentinel errors; callers match them with errors.Is.
var (
	// ErrUnknownMachine: the Backend has no machine with this MAC. The
	// Config.UnknownPolicy then decides between discovery and exit.
	ErrUnknownMachine = errors.New("httpboot: unknown machine")
	// ErrUnsafeValue: a value to be placed in an iPXE script or on the kernel
	// command line contains a character outside its whitelist.
	ErrUnsafeValue = errors.New("httpboot: unsafe value for iPXE script")
	// ErrRetryLater: the Backend holds this boot for now (e.g. the machine's
	// in-RAM agent is still running and must not lose its token). The machine
	// gets a script that waits and fetches its script again; logged at Info,
	// not counted as an error.
	ErrRetryLater = errors.New("httpboot: boot held; retry later")
	// ErrBadAction: Boot.Action is not one of agent, local, discover.
	ErrBadAction = errors.New("httpboot: unknown boot action")
	// ErrBadName: an image name fails validation (see ValidImageName).
	ErrBadName = errors.New("httpboot: invalid image name")
	// ErrNotFound: no such image or environment file.
	ErrNotFound = errors.New("httpboot: not found")
	// ErrDigestMismatch: an upload's SHA-256 differs from the declared one.
	ErrDigestMismatch = errors.New("httpboot: sha256 mismatch")
	// ErrSizeMismatch: an upload's length differs from the declared size.
	ErrSizeMismatch = errors.New("httpboot: size mismatch")
	// ErrBadDigest: the declared SHA-256 is not 64 lower- or upper-case hex digits.
	ErrBadDigest = errors.New("httpboot: declared sha256 is not 64 hex digits")
	// ErrConfig: the Config failed validation.
	ErrConfig = errors.New("httpboot: invalid config")
)
