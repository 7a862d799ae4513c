// The errors of package lifecycle, in one block, and *StateError. Package
// api maps them to HTTP statuses (api/errors.go classify).

package lifecycle

import (
	"errors"
	"fmt"
	"strings"

	"kiln/store"
)

// Errors of package lifecycle. Store errors (store.ErrNotFound,
// store.ErrConflict, store.ErrNotLeader, *store.IllegalTransitionError) are
// passed through wrapped with %w.
var (
	// ErrWrongState: the operation does not apply to the machine's current
	// state (the concrete error is *StateError naming the state).
	ErrWrongState = errors.New("lifecycle: machine is in the wrong state for this operation")
	// ErrInvalid: an argument is malformed; the message names the field.
	ErrInvalid = errors.New("lifecycle: invalid argument")
	// ErrNotEnough: ClaimMachines found fewer matching available machines than asked.
	ErrNotEnough = errors.New("lifecycle: not enough available machines")
	// ErrMachineMismatch: an agent message names a machine other than the one its token is for.
	ErrMachineMismatch = errors.New("lifecycle: agent message names another machine")
	// errLateRegistration wraps store.ErrConflict (409): AgentRegister found
	// on a retry that the machine's build began after the registration was
	// first applied; nothing was written (the agent registers again).
	errLateRegistration = fmt.Errorf("lifecycle: late agent registration: %w", store.ErrConflict)
	// ErrBadReport: an agent report carries an unknown step, state or reason.
	ErrBadReport = errors.New("lifecycle: malformed agent report")
	// ErrCredentialsRefused: GET /v1/agent/credentials outside a release
	// build, or refused by the CredentialGate (issue 15).
	ErrCredentialsRefused = errors.New("lifecycle: credentials refused")
	// ErrNoSealer: EnrollBMC needs Config.Sealer.
	ErrNoSealer = errors.New("lifecycle: no credential sealer configured")
	// ErrNoCatalog: UploadImage needs Config.Catalog.
	ErrNoCatalog = errors.New("lifecycle: no image catalog configured")
	// ErrDigest: the uploaded image's SHA-256 differs from the declared one
	// (for gzip and zstd: the SHA-256 of the decompressed content).
	ErrDigest = errors.New("lifecycle: image digest mismatch")
	// ErrImageFormat: a gzip or zstd image's body does not decode in that
	// format (or holds data after the compressed stream).
	ErrImageFormat = errors.New("lifecycle: image body is not in its declared format")
	// ErrImageSize: a gzip or zstd image's decompressed content is not the
	// declared size.
	ErrImageSize = errors.New("lifecycle: image content is not the declared size")
	// ErrAgentActive: BootFor refused to issue a new per-boot token because
	// the machine's agent is (or may be) still running with the current one
	// (heard from within Controller.AgentLiveWindow). Not a failure: the
	// boot HTTP server answers with an iPXE script that sleeps and fetches
	// /ipxe/{mac} again; a machine that really rebooted gets its token once
	// the agent is stale.
	ErrAgentActive = errors.New("lifecycle: machine's agent is active; retry the boot later")
	// ErrConfig: Config.Validate failed; the message names the field.
	ErrConfig = errors.New("lifecycle: invalid config")
)

// StateError is returned (wrapping ErrWrongState) when an operation does
// not apply to the machine's current state: State is not one of Want, or
// (Claimed) State is wanted but the machine already carries a claim, whose
// image is ClaimedImage; the message then says that, instead of
// contrasting a state with itself.
type StateError struct {
	Op           string
	Machine      string
	State        store.MachineState
	Want         []store.MachineState
	Claimed      bool
	ClaimedImage string
}

func (e *StateError) Error() string {
	if e.Claimed {
		return fmt.Sprintf("lifecycle: %s machine %s: it is %s but already claimed (image %s); release it first",
			e.Op, e.Machine, e.State, e.ClaimedImage)
	}
	want := make([]string, len(e.Want))
	for i, s := range e.Want {
		want[i] = string(s)
	}
	return fmt.Sprintf("lifecycle: %s machine %s: state is %s, want %s", e.Op, e.Machine, e.State, strings.Join(want, " or "))
}

// Unwrap makes errors.Is(err, ErrWrongState) true.
func (e *StateError) Unwrap() error { return ErrWrongState }
