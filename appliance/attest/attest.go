// Package attest is Kiln's side of TPM attestation (issue 16;
// appliance/lifecycle/DESIGN.md "Attestation"): the credential-activation
// challenge for an attestation key, the quote's verification (signature by
// the activated AK, the nonce, the PCR digest), the event log's replay to
// the quoted PCRs, and the comparison of the measured boot with the
// approved states of a hardware model, naming each measurement that
// differs. It keeps no state: the challenge lives in the machine's record
// (store.AttestationRecord.Challenge), which the lifecycle writes.
//
// The TPM side is github.com/google/go-attestation (activation, AK
// parameters, quote verification, event-log parsing and replay).
package attest

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"

	gattest "github.com/google/go-attestation/attest"

	"kiln/api/agentapi"
	"kiln/store"
)

// DefaultPCRs are the boot PCRs quoted and compared: firmware, option
// ROMs, boot loader and its configuration, platform, Secure Boot policy
// (0–7) and the Linux loader's PCR 9 (kernel, initrd, command line).
var DefaultPCRs = []int{0, 1, 2, 3, 4, 5, 6, 7, 9}

// NonceBytes is the quote nonce's length (some TPMs refuse more than 32).
const NonceBytes = 32

// Error is a refused attestation: Reason is a store.AttestReason*.
type Error struct {
	Reason string
	Msg    string
}

func (e *Error) Error() string { return e.Reason + ": " + e.Msg }

func refuse(reason, format string, args ...any) error {
	return &Error{Reason: reason, Msg: fmt.Sprintf(format, args...)}
}

// ReasonOf returns err's attestation reason ("" when it is no *Error).
func ReasonOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ""
}

// Trust says which EKs are accepted: Roots, when set, is the pool an EK
// certificate must chain to (manufacturer CAs); RequireCert refuses a TPM
// without an EK certificate. With neither, the EK is pinned on first use
// (the lifecycle compares EKSHA256 with the machine's record).
type Trust struct {
	Roots       *x509.CertPool
	RequireCert bool
}

// Challenge is what NewChallenge makes: the agent's answer and the record
// of it the verifier keeps.
type Challenge struct {
	Wire     agentapi.AttestChallenge
	Pending  store.AttestChallenge
	EKSHA256 string
	EKIssuer string
}

// NewChallenge checks the EK (certificate against trust, key against the
// certificate) and the AK's creation parameters (a restricted signing key
// created in a TPM, its creation attestation signed by itself), and makes
// a credential-activation challenge for the AK's name under the EK and a
// fresh nonce, valid for ttl from now.
func NewChallenge(st agentapi.AttestStart, pcrs []int, trust Trust, now time.Time, ttl time.Duration) (Challenge, error) {
	if len(st.EKPublic) == 0 {
		return Challenge{}, refuse(store.AttestReasonEKUntrusted, "no EK public key")
	}
	ekPub, err := x509.ParsePKIXPublicKey(st.EKPublic)
	if err != nil {
		return Challenge{}, refuse(store.AttestReasonEKUntrusted, "EK public key: %v", err)
	}
	ekSum := sha256.Sum256(st.EKPublic)
	ch := Challenge{EKSHA256: hex.EncodeToString(ekSum[:])}
	switch {
	case len(st.EKCertificate) > 0:
		cert, err := gattest.ParseEKCertificate(st.EKCertificate)
		if err != nil {
			return Challenge{}, refuse(store.AttestReasonEKUntrusted, "EK certificate: %v", err)
		}
		der, err := x509.MarshalPKIXPublicKey(cert.PublicKey)
		if err != nil || !bytes.Equal(der, st.EKPublic) {
			return Challenge{}, refuse(store.AttestReasonEKUntrusted, "EK certificate is for another key")
		}
		ch.EKIssuer = cert.Issuer.String()
		if trust.Roots != nil {
			// EK certificates carry TCG-specific extensions and key usages:
			// only the chain is checked.
			if _, err := cert.Verify(x509.VerifyOptions{Roots: trust.Roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				return Challenge{}, refuse(store.AttestReasonEKUntrusted, "EK certificate from %s: %v", ch.EKIssuer, err)
			}
		}
	case trust.RequireCert || trust.Roots != nil:
		return Challenge{}, refuse(store.AttestReasonEKUntrusted, "the TPM has no EK certificate")
	}
	ap := gattest.ActivationParameters{EK: ekPub, AK: gattest.AttestationParameters{
		Public: st.AK.Public, CreateData: st.AK.CreateData,
		CreateAttestation: st.AK.CreateAttestation, CreateSignature: st.AK.CreateSignature}}
	secret, ec, err := ap.Generate()
	if err != nil {
		return Challenge{}, refuse(store.AttestReasonAKNotCertified, "attestation key: %v", err)
	}
	nonce := make([]byte, NonceBytes)
	id := make([]byte, 8)
	if _, err := rand.Read(nonce); err != nil {
		return Challenge{}, err
	}
	if _, err := rand.Read(id); err != nil {
		return Challenge{}, err
	}
	sum := sha256.Sum256(secret)
	pcrs = append([]int(nil), pcrs...)
	sort.Ints(pcrs)
	ch.Pending = store.AttestChallenge{NonceID: "n-" + hex.EncodeToString(id), Nonce: nonce, Expires: now.Add(ttl),
		SecretSHA256: hex.EncodeToString(sum[:]), AKPublic: st.AK.Public, PCRs: pcrs}
	ch.Wire = agentapi.AttestChallenge{NonceID: ch.Pending.NonceID, Nonce: nonce, Credential: ec.Credential,
		Secret: ec.Secret, PCRs: pcrs}
	return ch, nil
}

// Evidence is a verified quote: the quoted PCR values and the replayed
// events of those PCRs.
type Evidence struct {
	PCRs   []store.AttestPCR
	Digest string
	Events []store.AttestEvent
}

// Verify checks q against the outstanding challenge p at now: the
// activation secret (the AK is the TPM's), the challenge's age, the
// quote's signature by the AK, its nonce and PCR digest over the sent
// values, that it covers p.PCRs, and that the event log replays to them
// (and holds no event the quote does not account for: a quoted PCR with
// no event must be unextended). It returns the verified evidence.
func Verify(p store.AttestChallenge, q agentapi.AttestQuote, now time.Time) (Evidence, error) {
	if q.NonceID != p.NonceID {
		return Evidence{}, refuse(store.AttestReasonNonce, "challenge %s is not the outstanding one", q.NonceID)
	}
	if now.After(p.Expires) {
		return Evidence{}, refuse(store.AttestReasonNonce, "challenge %s expired at %s", p.NonceID, p.Expires.UTC().Format(time.RFC3339))
	}
	sum := sha256.Sum256(q.Activated)
	if hex.EncodeToString(sum[:]) != p.SecretSHA256 {
		return Evidence{}, refuse(store.AttestReasonAKNotCertified, "the activation secret is wrong: the attestation key is not the TPM's")
	}
	ak, err := gattest.ParseAKPublic(p.AKPublic)
	if err != nil {
		return Evidence{}, refuse(store.AttestReasonAKNotCertified, "attestation key: %v", err)
	}
	pcrs := make([]gattest.PCR, 0, len(q.PCRs))
	seen := map[int]bool{}
	for _, v := range q.PCRs {
		if seen[v.Index] || v.Index < 0 || v.Index > 23 || len(v.SHA256) != sha256.Size {
			return Evidence{}, refuse(store.AttestReasonQuoteInvalid, "PCR %d: bad or repeated value", v.Index)
		}
		seen[v.Index] = true
		pcrs = append(pcrs, gattest.PCR{Index: v.Index, Digest: v.SHA256, DigestAlg: sha256Hash})
	}
	for _, i := range p.PCRs {
		if !seen[i] {
			return Evidence{}, refuse(store.AttestReasonQuoteInvalid, "PCR %d is not quoted", i)
		}
	}
	if err := ak.Verify(gattest.Quote{Quote: q.Quote, Signature: q.Signature}, pcrs, p.Nonce); err != nil {
		if strings.Contains(err.Error(), "nonce") {
			return Evidence{}, refuse(store.AttestReasonNonce, "the quote is not over challenge %s's nonce (a replayed quote)", p.NonceID)
		}
		return Evidence{}, refuse(store.AttestReasonQuoteInvalid, "quote: %v", err)
	}
	el, err := gattest.ParseEventLog(q.EventLog)
	if err != nil {
		return Evidence{}, refuse(store.AttestReasonEventLog, "parse: %v", err)
	}
	events, err := el.Verify(pcrs)
	if err != nil {
		var re gattest.ReplayError
		if errors.As(err, &re) {
			return Evidence{}, refuse(store.AttestReasonEventLog, "does not replay to PCR %s", joinInts(re.InvalidPCRs))
		}
		return Evidence{}, refuse(store.AttestReasonEventLog, "%v", err)
	}
	per := map[int]int{}
	ev := Evidence{}
	for _, e := range events {
		ev.Events = append(ev.Events, store.AttestEvent{PCR: e.Index, Seq: per[e.Index], Type: e.Type.String(),
			Digest: hex.EncodeToString(e.Digest), Data: excerpt(e.Data)})
		per[e.Index]++
	}
	if q.Cmdline != "" {
		for i := range ev.Events {
			e := &ev.Events[i]
			if e.PCR == 9 && strings.Contains(e.Data, "LoadOptions") && cmdlineMeasured(q.Cmdline, e.Digest) {
				e.Text = MaskCmdline(q.Cmdline)
			}
		}
	}
	sort.Slice(pcrs, func(i, j int) bool { return pcrs[i].Index < pcrs[j].Index })
	h := sha256.New()
	zero := make([]byte, sha256.Size)
	for _, v := range pcrs {
		if per[v.Index] == 0 && !bytes.Equal(v.Digest, zero) {
			return Evidence{}, refuse(store.AttestReasonEventLog, "PCR %d is extended but the log has no event for it", v.Index)
		}
		h.Write(v.Digest)
		ev.PCRs = append(ev.PCRs, store.AttestPCR{Index: v.Index, SHA256: hex.EncodeToString(v.Digest)})
	}
	ev.Digest = hex.EncodeToString(h.Sum(nil))
	return ev, nil
}

// Match is Compare's verdict: the matched state, or the mismatches against
// the closest approved state (fewest differing PCRs).
type Match struct {
	State      *store.AttestState
	Closest    *store.AttestState
	Mismatches []store.AttestMismatch
}

// Compare matches ev against the approved states of its model: a state
// matches when every PCR it records has the same value in ev. Otherwise
// the mismatches name, per differing PCR of the closest state, what that
// PCR measures and the first event that differs.
func Compare(ev Evidence, states []store.AttestState) Match {
	got := map[int]string{}
	for _, p := range ev.PCRs {
		got[p.Index] = p.SHA256
	}
	var best Match
	bestN := -1
	for i := range states {
		s := &states[i]
		if s.Status != store.AttestStateApproved {
			continue
		}
		var mm []store.AttestMismatch
		for _, p := range s.PCRs {
			if got[p.Index] != p.SHA256 && !sameEvents(eventsOf(s.Events, p.Index), eventsOf(ev.Events, p.Index)) {
				mm = append(mm, mismatch(p, got[p.Index], s.Events, ev.Events))
			}
		}
		if len(mm) == 0 {
			return Match{State: s}
		}
		if bestN < 0 || len(mm) < bestN {
			best, bestN = Match{Closest: s, Mismatches: mm}, len(mm)
		}
	}
	return best
}

func mismatch(want store.AttestPCR, got string, wantEv, gotEv []store.AttestEvent) store.AttestMismatch {
	m := store.AttestMismatch{PCR: want.Index, Measurement: PCRName(want.Index), Want: want.SHA256, Got: got}
	w, g := eventsOf(wantEv, want.Index), eventsOf(gotEv, want.Index)
	for i := 0; i < len(w) || i < len(g); i++ {
		switch {
		case i >= len(w):
			m.Event = fmt.Sprintf("event %d %s is extra: %s", i, g[i].Type, describe(g[i]))
		case i >= len(g):
			m.Event = fmt.Sprintf("event %d %s is missing: %s", i, w[i].Type, describe(w[i]))
		case !sameEvent(w[i], g[i]):
			m.Event = fmt.Sprintf("event %d %s differs: %s", i, g[i].Type, describe(g[i]))
			if w[i].Text != "" && g[i].Text != "" {
				m.Event += "; " + argDiff(w[i].Text, g[i].Text)
			}
			if w[i].Type != g[i].Type {
				m.Event = fmt.Sprintf("event %d is %s, the approved state has %s: %s", i, g[i].Type, w[i].Type, describe(g[i]))
			}
		default:
			continue
		}
		break
	}
	return m
}

// describe names what an event measured: its data excerpt, with the
// Linux EFI stub's tagged events spelled out.
func describe(e store.AttestEvent) string {
	switch {
	case strings.Contains(e.Data, "LoadOptions") && e.Text != "":
		return "kernel command line (" + e.Data + ") \"" + e.Text + "\""
	case strings.Contains(e.Data, "LoadOptions"):
		return "kernel command line (" + e.Data + ")"
	case strings.Contains(e.Data, "Linux initrd"):
		return "initrd (" + e.Data + ")"
	case e.Data != "":
		return e.Data
	}
	return "digest " + short(e.Digest)
}

// Summary is one line naming the mismatches (the machine's message).
func Summary(mm []store.AttestMismatch) string {
	parts := make([]string, 0, len(mm))
	for _, m := range mm {
		s := fmt.Sprintf("PCR %d (%s)", m.PCR, m.Measurement)
		if m.Event != "" {
			s += ": " + m.Event
		} else {
			s += fmt.Sprintf(": %s, approved %s", short(m.Got), short(m.Want))
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// PCRName says what a boot PCR measures (TCG PC Client Platform Firmware
// Profile; PCR 8–9 as the Linux loaders use them).
func PCRName(i int) string {
	switch i {
	case 0:
		return "firmware code"
	case 1:
		return "firmware configuration"
	case 2:
		return "option ROM code"
	case 3:
		return "option ROM configuration"
	case 4:
		return "boot loader"
	case 5:
		return "boot loader configuration, GPT"
	case 6:
		return "platform manufacturer"
	case 7:
		return "Secure Boot policy"
	case 8:
		return "boot loader commands"
	case 9:
		return "kernel, initrd, command line"
	}
	return "PCR " + fmt.Sprint(i)
}

func eventsOf(evs []store.AttestEvent, pcr int) []store.AttestEvent {
	var out []store.AttestEvent
	for _, e := range evs {
		if e.PCR == pcr {
			out = append(out, e)
		}
	}
	return out
}

// excerpt is a short printable rendering of event data: the longest
// printable run of its ASCII or UTF-16LE reading, at most 64 characters.
func excerpt(b []byte) string {
	best := printableRun(string(b))
	if len(b) >= 4 {
		u := make([]uint16, len(b)/2)
		for i := range u {
			u[i] = uint16(b[2*i]) | uint16(b[2*i+1])<<8
		}
		if s := printableRun(string(utf16.Decode(u))); len(s) > len(best) {
			best = s
		}
	}
	if len(best) < 4 {
		return ""
	}
	if len(best) > 64 {
		best = best[:64]
	}
	return best
}

func printableRun(s string) string {
	var best, cur strings.Builder
	flush := func() {
		if cur.Len() > best.Len() {
			best.Reset()
			best.WriteString(cur.String())
		}
		cur.Reset()
	}
	for _, r := range s {
		if r < 0x80 && (unicode.IsPrint(r)) {
			cur.WriteRune(r)
			continue
		}
		flush()
	}
	flush()
	return strings.TrimSpace(best.String())
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12] + "…"
	}
	return h
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ", ")
}

const sha256Hash = crypto.SHA256

// sameEvents reports whether two PCRs' event lists are the same
// measurements: same length, each event the same (sameEvent). A PCR whose
// value differs only by masked per-boot arguments matches this way.
func sameEvents(a, b []store.AttestEvent) bool {
	if len(a) == 0 || len(a) != len(b) {
		return false
	}
	for i := range a {
		if !sameEvent(a[i], b[i]) {
			return false
		}
	}
	return true
}

// sameEvent compares two events by their proven, masked text when both
// have one (the kernel command line), else by digest.
func sameEvent(a, b store.AttestEvent) bool {
	if a.Text != "" && b.Text != "" {
		return a.Type == b.Type && a.Text == b.Text
	}
	return a.Type == b.Type && a.Digest == b.Digest
}

// cmdlineMeasured reports whether the kernel command line text is what
// the LoadOptions event with digest (hex) measured: the firmware passes it
// as UCS-2 with its terminator (OVMF, iPXE), some loaders as bytes.
func cmdlineMeasured(text, digest string) bool {
	for _, c := range []string{text, text + "\x00", strings.TrimSpace(text), strings.TrimSpace(text) + "\x00"} {
		u := utf16.Encode([]rune(c))
		b := make([]byte, 2*len(u))
		for i, r := range u {
			b[2*i], b[2*i+1] = byte(r), byte(r>>8)
		}
		for _, m := range [][]byte{b, []byte(c)} {
			s := sha256.Sum256(m)
			if hex.EncodeToString(s[:]) == digest {
				return true
			}
		}
	}
	return false
}

// PerBootArgs are the kernel arguments Kiln itself puts on every boot's
// command line with values that differ per boot, machine or node: masked
// before the command line is compared.
var PerBootArgs = []string{agentapi.ArgToken, agentapi.ArgMachine, agentapi.ArgURL, "BOOTIF"}

// MaskCmdline replaces the values of PerBootArgs with "*".
func MaskCmdline(s string) string {
	f := strings.Fields(s)
	for i, w := range f {
		k, _, ok := strings.Cut(w, "=")
		if !ok {
			continue
		}
		for _, p := range PerBootArgs {
			if k == p {
				f[i] = k + "=*"
			}
		}
	}
	return strings.Join(f, " ")
}

// argDiff names the arguments got has that want lacks (+) and the reverse (-).
func argDiff(want, got string) string {
	count := func(s string) map[string]int {
		m := map[string]int{}
		for _, w := range strings.Fields(s) {
			m[w]++
		}
		return m
	}
	w, g := count(want), count(got)
	var add, del []string
	for _, a := range strings.Fields(got) {
		if w[a] > 0 {
			w[a]--
			continue
		}
		add = append(add, "+"+a)
	}
	for _, a := range strings.Fields(want) {
		if g[a] > 0 {
			g[a]--
			continue
		}
		del = append(del, "-"+a)
	}
	return "arguments " + strings.Join(append(add, del...), " ")
}
