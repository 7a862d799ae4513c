package bmc

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
)

// Sentinel errors. Every error a Controller method returns wraps exactly one of them
// (test with errors.Is); [Reason] gives the stable job reason string for each.
var (
	// ErrTimeout: the BMC did not answer within Config.CallTimeout (reason "timeout").
	ErrTimeout = errors.New("bmc: timeout")
	// ErrAuth: the BMC refused the credentials (reason "auth").
	ErrAuth = errors.New("bmc: authentication failed")
	// ErrBootNotApplied: a boot-override write was accepted or half-applied but reading it
	// back shows a different target, enabled or mode (reason "boot_not_applied").
	ErrBootNotApplied = errors.New("bmc: boot override not applied")
	// ErrUnsupported: the driver or BMC cannot do the operation (reason "unsupported").
	ErrUnsupported = errors.New("bmc: operation not supported")
	// ErrBadAnswer: the BMC answered something that does not parse strictly as the
	// expected shape (garbled power state, unknown boot data) (reason "bad_answer").
	ErrBadAnswer = errors.New("bmc: unexpected answer")
	// ErrUnreachable: no connection to the BMC could be made (reason "unreachable").
	ErrUnreachable = errors.New("bmc: unreachable")
	// ErrTLS: the BMC's certificate did not verify against the target's CA or the system
	// roots (reason "tls").
	ErrTLS = errors.New("bmc: TLS verification failed")
	// ErrRejected: the BMC answered the request with an error status (reason "rejected").
	ErrRejected = errors.New("bmc: request rejected by BMC")
	// ErrInvalidTarget: the Target or argument is malformed (reason "invalid").
	ErrInvalidTarget = errors.New("bmc: invalid target or argument")
	// ErrCanceled: the caller's context ended (reason "canceled").
	ErrCanceled = errors.New("bmc: canceled")
	// ErrSealed: sealed credentials could not be opened (wrong key or corrupt data).
	ErrSealed = errors.New("bmc: cannot open sealed data")
	// ErrTaskFailed: a BMC task (a firmware update) ended in a state other than
	// Completed (reason "task_failed").
	ErrTaskFailed = errors.New("bmc: task failed")
	// ErrNotApplied: staged firmware or BIOS settings do not read back as asked
	// (before the reset: not staged; after it: not applied) (reason "not_applied").
	ErrNotApplied = errors.New("bmc: change not applied")
)

var reasons = map[error]string{
	ErrTimeout:        "timeout",
	ErrAuth:           "auth",
	ErrBootNotApplied: "boot_not_applied",
	ErrUnsupported:    "unsupported",
	ErrBadAnswer:      "bad_answer",
	ErrUnreachable:    "unreachable",
	ErrTLS:            "tls",
	ErrRejected:       "rejected",
	ErrInvalidTarget:  "invalid",
	ErrCanceled:       "canceled",
	ErrSealed:         "sealed",
	ErrTaskFailed:     "task_failed",
	ErrNotApplied:     "not_applied",
}

// Reason returns the stable machine-readable reason for err: "" for nil, one of
// "timeout", "auth", "boot_not_applied", "unsupported", "bad_answer", "unreachable",
// "tls", "rejected", "invalid", "canceled", "sealed", "task_failed", "not_applied", or
// "error" for anything else.
func Reason(err error) string {
	if err == nil {
		return ""
	}
	for s, r := range reasons {
		if errors.Is(err, s) {
			return r
		}
	}
	return "error"
}

// OpError describes a failed Controller operation. Msg has already been scrubbed of the
// target's password; the original driver error is deliberately not kept, because
// third-party error texts are not guaranteed free of credentials.
type OpError struct {
	Op      string // "power_state", "power", "boot", "inventory", "health", "firmware_inventory", "firmware_update", "firmware_task", "bios", "bios_set", "bios_apply"
	Driver  string // "redfish" or "ipmi"
	Address string // BMC address as given in Target.Address
	Err     error  // one of the package's sentinel errors
	Msg     string // detail, scrubbed, at most maxMsg bytes
}

const maxMsg = 400

func (e *OpError) Error() string {
	s := e.Op + " " + e.Address + " (" + e.Driver + "): " + e.Err.Error()
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	return s
}

// Unwrap returns the sentinel error.
func (e *OpError) Unwrap() error { return e.Err }

// scrub removes every occurrence of secret from s and truncates it.
func scrub(s, secret string) string {
	if secret != "" {
		s = strings.ReplaceAll(s, secret, "[REDACTED]")
		if esc := url.QueryEscape(secret); esc != secret {
			s = strings.ReplaceAll(s, esc, "[REDACTED]")
		}
	}
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > maxMsg {
		s = s[:maxMsg] + "…"
	}
	return s
}

// classify maps a driver error to a sentinel. Sentinels pass through; otherwise it looks
// at context state, net errors and the well-known texts of gofish, bmclib and ipmitool.
func classify(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	for s := range reasons {
		if errors.Is(err, s) {
			return s
		}
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ErrTimeout
	}
	if errors.Is(err, context.Canceled) || ctx.Err() != nil {
		return ErrCanceled
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ErrTimeout
	}
	msg := strings.ToLower(err.Error())
	switch {
	case strings.Contains(msg, "client.timeout exceeded"), strings.Contains(msg, "deadline exceeded"),
		strings.Contains(msg, "i/o timeout"), strings.Contains(msg, "timeout"):
		return ErrTimeout
	case strings.Contains(msg, "x509:"), strings.Contains(msg, "tls: failed to verify"),
		strings.Contains(msg, "certificate"):
		return ErrTLS
	case strings.HasPrefix(msg, "401"), strings.Contains(msg, " 401:"), strings.Contains(msg, "401: "),
		strings.Contains(msg, "unauthorized"), strings.Contains(msg, "not authenticated"),
		strings.Contains(msg, "rakp"), strings.Contains(msg, "invalid user name"),
		strings.Contains(msg, "authentication"), strings.Contains(msg, "403:"):
		return ErrAuth
	case strings.Contains(msg, "unable to establish ipmi v2"), strings.Contains(msg, "unable to establish lan"):
		// ipmitool prints only this when nothing answers; a refused login adds a RAKP line
		return ErrUnreachable
	case strings.Contains(msg, "connection refused"), strings.Contains(msg, "no route to host"),
		strings.Contains(msg, "network is unreachable"), strings.Contains(msg, "no such host"),
		strings.Contains(msg, "connection reset"), strings.Contains(msg, "eof"):
		return ErrUnreachable
	case strings.Contains(msg, "not implemented"), strings.Contains(msg, "not supported"),
		strings.Contains(msg, "405:"), strings.Contains(msg, "501:"):
		return ErrUnsupported
	case strings.Contains(msg, "400:"), strings.Contains(msg, "409:"), strings.Contains(msg, "412:"),
		strings.Contains(msg, "500:"), strings.Contains(msg, "503:"):
		return ErrRejected
	case strings.Contains(msg, "invalid character"), strings.Contains(msg, "cannot unmarshal"),
		strings.Contains(msg, "unexpected end of json"):
		return ErrBadAnswer
	}
	return ErrRejected
}

// retryable reports whether an operation that failed with sentinel s may be tried again.
// Only failures that cannot have reached a decision on the BMC are retried for
// non-idempotent actions; idempotent ones also retry timeouts and rejections.
func retryable(s error, idempotent bool) bool {
	switch s {
	case ErrUnreachable, ErrBadAnswer:
		return true
	case ErrTimeout, ErrRejected:
		return idempotent
	}
	return false
}
