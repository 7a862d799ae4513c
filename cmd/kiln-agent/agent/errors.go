package agent

import (
	"errors"
	"fmt"

	"kiln/api/agentapi"
)

// Sentinel errors of the agent.
var (
	// ErrNoPartitionTable: the written image has no MBR/GPT to append the cidata partition to.
	ErrNoPartitionTable = errors.New("agent: image has no usable partition table")
	// ErrNoFreeSlot: the image's partition table has no free entry.
	ErrNoFreeSlot = errors.New("agent: no free partition table entry")
	// ErrNoRoom: the disk has no room after the image for the staged partition.
	ErrNoRoom = errors.New("agent: no room after the image")
	// ErrFATLayout: the cidata volume cannot be laid out (size, names).
	ErrFATLayout = errors.New("agent: FAT layout")
	// ErrFetch: the image could not be fetched (status, resume limit, range not honoured).
	ErrFetch = errors.New("agent: image fetch failed")
	// ErrAppliance: an appliance call failed after every retry.
	ErrAppliance = errors.New("agent: appliance unreachable")
	// ErrBadTask: the task misses required fields (image, digest, stage data).
	ErrBadTask = errors.New("agent: bad task")
)

// StepError is a failed build step: Step and Reason are agentapi enums, Err the cause.
type StepError struct {
	Step   string
	Reason agentapi.Reason
	Err    error
}

func (e *StepError) Error() string { return fmt.Sprintf("%s: %s: %v", e.Step, e.Reason, e.Err) }
func (e *StepError) Unwrap() error { return e.Err }

func fail(step string, reason agentapi.Reason, format string, a ...any) *StepError {
	return &StepError{Step: step, Reason: reason, Err: fmt.Errorf(format, a...)}
}
