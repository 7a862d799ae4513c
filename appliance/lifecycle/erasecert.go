package lifecycle

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"kiln/api/agentapi"
	"kiln/store"
)

// Erase certificates: the agent's erase report (succeeded or failed) carries one
// agentapi.DiskErase per disk of the machine (cmd/kiln-agent/DESIGN.md "Erase"). Each
// becomes one event of kind "erase_certificate" on the machine, in the same store command
// as the report's step event: To is the disk's outcome (erased, verify_failed, failed,
// frozen, skipped), Reason the method, Message a key=value record an auditor can read
// and a tool can parse (EraseCertMessage).

// EventEraseCertificate is the Kind of an erase certificate event.
const EventEraseCertificate = "erase_certificate"

const (
	maxEraseCerts      = 256  // disks per report recorded; more is a broken agent
	maxEraseCertMsgLen = 4096 // bytes of one certificate event's message
)

// eraseCertEvents returns the certificate events of rep (none unless it is an erase
// step's succeeded or failed report).
func eraseCertEvents(machineID string, rep agentapi.Report) []store.Event {
	if rep.Step != agentapi.StepErase || (rep.State != agentapi.StateSucceeded && rep.State != agentapi.StateFailed) || len(rep.Erase) == 0 {
		return nil
	}
	certs := rep.Erase
	if len(certs) > maxEraseCerts {
		certs = certs[:maxEraseCerts]
	}
	out := make([]store.Event, 0, len(certs))
	for _, c := range certs {
		out = append(out, store.Event{Subject: "machine/" + machineID, Kind: EventEraseCertificate, Actor: ActorAgent,
			To: field(c.Outcome, 32), Reason: field(c.Method, 64), Message: EraseCertMessage(c)})
	}
	return out
}

// field is one short certificate value: sanitised, truncated to n bytes.
func field(s string, n int) string { return truncate(sanitize(s), n) }

// EraseCertMessage renders c as space-separated key=value pairs (values with spaces or
// quotes are Go-quoted), in this order: disk, path, serial, model, wwn, size_bytes,
// transport, method, outcome, verified, coverage (percent of the disk's bytes read back,
// 4 decimals), mismatches, first_mismatch, verification, reason, next_step, started,
// ended (RFC 3339, UTC), attempts (method:outcome, comma-separated). Empty values are
// left out; the whole is at most 4096 bytes.
func EraseCertMessage(c agentapi.DiskErase) string {
	var b strings.Builder
	kv := func(k, v string) {
		if v == "" {
			return
		}
		v = sanitize(v)
		if strings.ContainsAny(v, " \"=\\") {
			v = strconv.Quote(v)
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k + "=" + v)
	}
	kv("disk", field(c.Name, 64))
	kv("path", field(c.Path, 128))
	kv("serial", field(c.Serial, 64))
	kv("model", field(c.Model, 128))
	kv("wwn", field(c.WWN, 64))
	kv("size_bytes", strconv.FormatUint(c.SizeBytes, 10))
	kv("transport", field(c.Transport, 16))
	kv("method", field(c.Method, 64))
	kv("outcome", field(c.Outcome, 32))
	kv("verified", strconv.FormatBool(c.Verified))
	cov := c.Coverage
	if cov != cov || cov < 0 {
		cov = 0
	} else if cov > 1 {
		cov = 1
	}
	kv("coverage", strconv.FormatFloat(100*cov, 'f', 4, 64)+"%")
	if c.Mismatches > 0 {
		kv("mismatches", strconv.FormatInt(c.Mismatches, 10))
		kv("first_mismatch", strconv.FormatInt(c.FirstMismatch, 10))
	}
	kv("verification", field(c.Verification, 512))
	kv("reason", field(c.Reason, 512))
	kv("next_step", field(c.NextStep, 256))
	kv("started", rfc3339(c.Started))
	kv("ended", rfc3339(c.Ended))
	var at []string
	for i, a := range c.Attempts {
		if i == 16 {
			at = append(at, fmt.Sprintf("+%d more", len(c.Attempts)-16))
			break
		}
		at = append(at, field(a.Method, 64)+":"+field(a.Outcome, 32))
	}
	kv("attempts", strings.Join(at, ","))
	return truncate(b.String(), maxEraseCertMsgLen)
}

func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}
