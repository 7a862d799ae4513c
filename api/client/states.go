package client

import (
	"slices"

	"kiln/store"
)

// MachineState is the type of api.Machine.State: the store's
// (store.MachineState), named here so that a program using the client
// compares states without importing the store. The values and their order
// have one home, kiln/store.
type MachineState = store.MachineState

// The machine states (store.State*; the lifecycle's transitions are
// store.CanTransition's).
const (
	StateDiscovered   = store.StateDiscovered
	StateRegistered   = store.StateRegistered
	StateInspecting   = store.StateInspecting
	StateAvailable    = store.StateAvailable
	StateProvisioning = store.StateProvisioning
	StateProvisioned  = store.StateProvisioned
	StateFailed       = store.StateFailed
	StateQuarantined  = store.StateQuarantined
	StateErasing      = store.StateErasing
	StateRetired      = store.StateRetired
)

// States returns every machine state in lifecycle order (a copy of
// store.AllStates).
func States() []MachineState { return slices.Clone(store.AllStates) }
