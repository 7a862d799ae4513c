package agent

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"kiln/api/agentapi"
)

// NVMe erase through the admin passthrough ioctl (linux/nvme_ioctl.h NVME_IOCTL_ADMIN_CMD
// on the namespace block device; struct nvmeAdminCmd in health.go). References: NVM
// Express Base Specification 2.0c — Identify Controller (CNS 01h, Figure 275: OACS bytes
// 257:256, FNA byte 524, SANICAP bytes 331:328), Identify Namespace (CNS 00h, NVM Command
// Set Specification 1.0 Figure 97: NSZE, NLBAF byte 25, FLBAS byte 26, DPS byte 29,
// LBAF0.. at byte 128), Format NVM (80h, §5.23), Sanitize (84h, §5.24), Sanitize Status
// log page (81h, §5.16.1.25).

const (
	nvmeOpGetLogPage = 0x02
	nvmeOpIdentify   = 0x06
	nvmeOpFormat     = 0x80
	nvmeOpSanitize   = 0x84

	nvmeLogSanitize = 0x81

	// _IO('N', 0x40): the namespace ID of a namespace block device.
	nvmeIoctlID = 0x4E40
)

// nvmeIDCtrl is what the erase needs of Identify Controller.
type nvmeIDCtrl struct {
	VID     uint16
	Serial  string // SN, bytes 23:04
	Model   string // MN, bytes 63:24
	FW      string // FR, bytes 71:64
	OACS    uint16 // bit 1: Format NVM supported
	FNA     uint8  // bit 0: format applies to all namespaces; bit 1: secure erase applies to all; bit 2: crypto erase supported
	SANICAP uint32 // bit 0 CES (crypto erase), bit 1 BES (block erase), bit 2 OWS (overwrite)
	NN      uint32 // number of namespaces, bytes 519:516
}

// parseNVMeIDCtrl decodes an Identify Controller data structure (4096 bytes; at least the
// first 528 are needed).
func parseNVMeIDCtrl(b []byte) (nvmeIDCtrl, error) {
	if len(b) < 528 {
		return nvmeIDCtrl{}, fmt.Errorf("identify controller: %d bytes, want 4096", len(b))
	}
	return nvmeIDCtrl{
		VID:     binary.LittleEndian.Uint16(b[0:]),
		Serial:  asciiField(b[4:24]),
		Model:   asciiField(b[24:64]),
		FW:      asciiField(b[64:72]),
		OACS:    binary.LittleEndian.Uint16(b[256:]),
		SANICAP: binary.LittleEndian.Uint32(b[328:]),
		NN:      binary.LittleEndian.Uint32(b[516:]),
		FNA:     b[524],
	}, nil
}

// asciiField trims an ASCII identify string (space padded) and replaces non-printable bytes.
func asciiField(b []byte) string {
	out := make([]byte, len(b))
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		out[i] = c
	}
	return strings.TrimRight(strings.TrimLeft(string(out), " "), " ?")
}

// nvmeIDNS is what the erase needs of Identify Namespace: the current LBA format, kept by
// the Format NVM command.
type nvmeIDNS struct {
	NSZE  uint64 // namespace size in logical blocks
	NLBAF uint8  // number of LBA formats, 0's based
	LBAF  int    // index of the current format (FLBAS bits 3:0, and 6:5 as bits 5:4)
	MSET  bool   // metadata at the end of the LBA (FLBAS bit 4)
	PI    uint8  // protection information type (DPS bits 2:0)
	PIL   bool   // PI in the first bytes of metadata (DPS bit 3)
	LBADS uint8  // log2 of the current LBA data size
}

// parseNVMeIDNS decodes an Identify Namespace data structure (4096 bytes; the first 384
// are needed).
func parseNVMeIDNS(b []byte) (nvmeIDNS, error) {
	if len(b) < 384 {
		return nvmeIDNS{}, fmt.Errorf("identify namespace: %d bytes, want 4096", len(b))
	}
	ns := nvmeIDNS{NSZE: binary.LittleEndian.Uint64(b[0:]), NLBAF: b[25]}
	flbas, dps := b[26], b[29]
	ns.LBAF = int(flbas & 0x0F)
	if ns.NLBAF >= 16 {
		ns.LBAF |= int(flbas>>5&0x3) << 4
	}
	if ns.LBAF > int(ns.NLBAF) || ns.LBAF >= 64 {
		return ns, fmt.Errorf("identify namespace: current LBA format %d beyond NLBAF %d", ns.LBAF, ns.NLBAF)
	}
	ns.MSET = flbas&0x10 != 0
	ns.PI, ns.PIL = dps&0x7, dps&0x8 != 0
	if off := 128 + 4*ns.LBAF; off+4 <= len(b) {
		ns.LBADS = b[off+2]
	}
	if ns.LBADS < 9 && ns.NSZE != 0 {
		return ns, fmt.Errorf("identify namespace: LBA data size 2^%d below 512", ns.LBADS)
	}
	return ns, nil
}

// sanitizeStatus is the Sanitize Status log page (81h).
type sanitizeStatus struct {
	SPROG        uint16 // progress, numerator of /65536 (FFFFh: not in progress)
	State        uint8  // SSTAT bits 2:0: 0 never, 1 completed, 2 in progress, 3 failed, 4 completed without deallocation
	GlobalErased bool   // SSTAT bit 8: no user data written since manufacture or the last sanitize
	SCDW10       uint32 // CDW10 of the sanitize that last started
	EstOverwrite uint32 // seconds, FFFFFFFFh: no estimate
	EstBlock     uint32
	EstCrypto    uint32
}

const (
	sanNever      = 0
	sanCompleted  = 1
	sanInProgress = 2
	sanFailed     = 3
	sanCompletedN = 4
)

// parseSanitizeStatus decodes the first 20 bytes of the Sanitize Status log page.
func parseSanitizeStatus(b []byte) (sanitizeStatus, error) {
	if len(b) < 20 {
		return sanitizeStatus{}, fmt.Errorf("sanitize status log: %d bytes, want 20", len(b))
	}
	sstat := binary.LittleEndian.Uint16(b[2:])
	s := sanitizeStatus{SPROG: binary.LittleEndian.Uint16(b[0:]), State: uint8(sstat & 7), GlobalErased: sstat&0x100 != 0,
		SCDW10: binary.LittleEndian.Uint32(b[4:]), EstOverwrite: binary.LittleEndian.Uint32(b[8:]),
		EstBlock: binary.LittleEndian.Uint32(b[12:]), EstCrypto: binary.LittleEndian.Uint32(b[16:])}
	if s.State > sanCompletedN {
		return s, fmt.Errorf("sanitize status log: state %d is reserved", s.State)
	}
	return s, nil
}

// nvmeMethod is one candidate NVMe method.
type nvmeMethod struct {
	name    string // agentapi.EraseNVMe*
	sanact  uint32 // Sanitize action (0: a Format NVM)
	ses     uint32 // Format NVM secure erase setting
	allNS   bool   // the erase covers every namespace of the controller
	because string
}

// nvmePlan lists the methods id offers, strongest first, and what was not offered.
func nvmePlan(id nvmeIDCtrl) (plan []nvmeMethod, lacks []string) {
	if id.SANICAP&1 != 0 {
		plan = append(plan, nvmeMethod{name: agentapi.EraseNVMeSanitizeCrypto, sanact: 4, allNS: true, because: "SANICAP.CES=1"})
	} else {
		lacks = append(lacks, "Sanitize crypto erase (SANICAP.CES=0)")
	}
	if id.SANICAP&2 != 0 {
		plan = append(plan, nvmeMethod{name: agentapi.EraseNVMeSanitizeBlock, sanact: 2, allNS: true, because: "SANICAP.BES=1"})
	} else {
		lacks = append(lacks, "Sanitize block erase (SANICAP.BES=0)")
	}
	if id.OACS&2 == 0 {
		lacks = append(lacks, "Format NVM (OACS bit 1 = 0)")
		return plan, lacks
	}
	all := id.FNA&0x3 != 0
	if id.FNA&4 != 0 {
		plan = append(plan, nvmeMethod{name: agentapi.EraseNVMeFormatCrypto, ses: 2, allNS: all, because: "OACS.Format=1, FNA.CES=1"})
	} else {
		lacks = append(lacks, "Format crypto erase (FNA bit 2 = 0)")
	}
	plan = append(plan, nvmeMethod{name: agentapi.EraseNVMeFormatUserData, ses: 1, allNS: all, because: "OACS.Format=1"})
	return plan, lacks
}

// nvmeStatusError is a command completed with a non-zero NVMe status (the ioctl's
// positive return value: SCT in bits 10:8, SC in bits 7:0, DNR bit 14).
type nvmeStatusError uint32

func (e nvmeStatusError) Error() string {
	sct, sc := uint32(e)>>8&7, uint32(e)&0xFF
	what := ""
	switch {
	case sct == 0 && sc == 0x01:
		what = " invalid command opcode"
	case sct == 0 && sc == 0x02:
		what = " invalid field in command"
	case sct == 0 && sc == 0x1C:
		what = " sanitize failed"
	case sct == 0 && sc == 0x1D:
		what = " sanitize in progress"
	case sct == 1 && sc == 0x0A:
		what = " invalid format"
	case sct == 1 && sc == 0x0B:
		what = " firmware activation requires reset"
	}
	return fmt.Sprintf("NVMe status SCT %d SC %#02x%s", sct, sc, what)
}

// nvmeAdmin sends one admin command on fd; data (may be nil) is the transfer buffer.
func nvmeAdmin(fd uintptr, opcode uint8, nsid, cdw10, cdw11 uint32, data []byte, timeout time.Duration) (uint32, error) {
	cmd := nvmeAdminCmd{opcode: opcode, nsid: nsid, cdw10: cdw10, cdw11: cdw11, timeoutMs: uint32(min(timeout.Milliseconds(), 1<<31))}
	if len(data) > 0 {
		cmd.addr = uint64(uintptr(unsafe.Pointer(&data[0])))
		cmd.dataLen = uint32(len(data))
	}
	r, _, e := unix.Syscall(unix.SYS_IOCTL, fd, nvmeIoctlAdminCmd, uintptr(unsafe.Pointer(&cmd)))
	if e != 0 {
		return 0, e
	}
	if int32(r) > 0 {
		return 0, nvmeStatusError(r)
	}
	return cmd.result, nil
}

func nvmeGetLog(fd uintptr, lid uint8, nsid uint32, n int) ([]byte, error) {
	b := make([]byte, n)
	_, err := nvmeAdmin(fd, nvmeOpGetLogPage, nsid, uint32(n/4-1)<<16|uint32(lid), 0, b, 10*time.Second)
	return b, err
}

// eraseNVMe tries the methods of nvmePlan on dev, each verified with canaries, and
// records every attempt in c. It returns true when one erased the disk (c complete); on
// false the caller overwrites (c.Outcome empty) or c holds a final outcome.
func (a *Agent) eraseNVMe(ctx context.Context, dev *Device, c *agentapi.DiskErase, pol agentapi.ErasePolicy) bool {
	fd := dev.f.Fd()
	idb := make([]byte, 4096)
	if _, err := nvmeAdmin(fd, nvmeOpIdentify, 0, 1, 0, idb, 10*time.Second); err != nil {
		attempt(c, "nvme-identify", agentapi.EraseFailed, "Identify Controller: %v", err)
		c.Reason = "NVMe Identify Controller failed; overwriting"
		return false
	}
	id, err := parseNVMeIDCtrl(idb)
	if err != nil {
		attempt(c, "nvme-identify", agentapi.EraseFailed, "%v", err)
		return false
	}
	if c.Serial == "" {
		c.Serial = id.Serial
	}
	if c.Model == "" {
		c.Model = id.Model
	}
	nsid, _, e := unix.Syscall(unix.SYS_IOCTL, fd, nvmeIoctlID, 0)
	if e != 0 || int32(nsid) <= 0 {
		attempt(c, "nvme-identify", agentapi.EraseFailed, "NVME_IOCTL_ID: %v", e)
		return false
	}
	nsb := make([]byte, 4096)
	if _, err := nvmeAdmin(fd, nvmeOpIdentify, uint32(nsid), 0, 0, nsb, 10*time.Second); err != nil {
		attempt(c, "nvme-identify", agentapi.EraseFailed, "Identify Namespace %d: %v", nsid, err)
		return false
	}
	ns, err := parseNVMeIDNS(nsb)
	if err != nil {
		attempt(c, "nvme-identify", agentapi.EraseFailed, "%v", err)
		return false
	}
	plan, lacks := nvmePlan(id)
	caps := fmt.Sprintf("controller %s fw %s: OACS=%#04x FNA=%#02x SANICAP=%#08x; namespace %d LBAF %d (2^%d-byte blocks)",
		id.Model, id.FW, id.OACS, id.FNA, id.SANICAP, nsid, ns.LBAF, ns.LBADS)
	for _, l := range lacks {
		attempt(c, methodOfLack(l), agentapi.EraseUnsupported, "%s", l)
	}
	for _, m := range plan {
		if ctx.Err() != nil {
			return false
		}
		var run func() error
		if m.sanact != 0 {
			run = func() error { return nvmeSanitize(ctx, fd, m.sanact) }
		} else {
			target := uint32(nsid)
			if m.allNS {
				target = 0xFFFFFFFF
			}
			cdw10 := uint32(ns.LBAF&0xF) | uint32(ns.LBAF>>4&3)<<12 | m.ses<<9 | uint32(ns.PI)<<5
			if ns.MSET {
				cdw10 |= 1 << 4
			}
			if ns.PIL {
				cdw10 |= 1 << 8
			}
			run = func() error {
				_, err := nvmeAdmin(fd, nvmeOpFormat, target, cdw10, 0, nil, 4*time.Hour)
				return err
			}
		}
		start := time.Now()
		ok, err := verifyFirmware(dev, c, pol.SampleBlocks, run)
		scope := "this namespace"
		if m.allNS {
			scope = "every namespace of the controller"
		}
		switch {
		case err != nil:
			attempt(c, m.name, agentapi.EraseFailed, "%s: %v", m.because, err)
			continue
		case !ok:
			attempt(c, m.name, agentapi.EraseVerifyFailed, "%s; %s", m.because, c.Verification)
			continue
		}
		attempt(c, m.name, agentapi.EraseErased, "%s; erases %s; %.1fs", m.because, scope, time.Since(start).Seconds())
		c.Method, c.Outcome, c.Verified = m.name, agentapi.EraseErased, true
		c.Reason = caps + "; " + m.because + "; erases " + scope
		return true
	}
	c.Reason = caps + "; no NVMe erase method completed: overwriting"
	c.Coverage, c.Verification, c.Mismatches, c.FirstMismatch, c.Verified = 0, "", 0, 0, false
	return false
}

func methodOfLack(l string) string {
	switch {
	case strings.HasPrefix(l, "Sanitize crypto"):
		return agentapi.EraseNVMeSanitizeCrypto
	case strings.HasPrefix(l, "Sanitize block"):
		return agentapi.EraseNVMeSanitizeBlock
	case strings.HasPrefix(l, "Format crypto"):
		return agentapi.EraseNVMeFormatCrypto
	}
	return agentapi.EraseNVMeFormatUserData
}

// nvmeSanitize starts a Sanitize with action sanact (AUSE=1: a failure can be exited
// without another sanitize) and polls the Sanitize Status log page every second until it
// reports completion (state 1 or 4 with our CDW10), failure, or ctx ends. The deadline is
// twice the controller's estimate plus 10 minutes, or 24 h without one.
func nvmeSanitize(ctx context.Context, fd uintptr, sanact uint32) error {
	cdw10 := sanact | 1<<3
	if _, err := nvmeAdmin(fd, nvmeOpSanitize, 0, cdw10, 0, nil, time.Minute); err != nil {
		return err
	}
	deadline := time.Now().Add(24 * time.Hour)
	sawProgress := false
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
		}
		b, err := nvmeGetLog(fd, nvmeLogSanitize, 0xFFFFFFFF, 512)
		if err != nil {
			var se nvmeStatusError
			if errors.As(err, &se) {
				return fmt.Errorf("sanitize status log: %w", err)
			}
			continue // transient (the controller is busy sanitizing)
		}
		st, err := parseSanitizeStatus(b)
		if err != nil {
			return err
		}
		if first {
			est := st.EstBlock
			if sanact == 4 {
				est = st.EstCrypto
			}
			if est != 0xFFFFFFFF && est != 0 {
				deadline = time.Now().Add(2*time.Duration(est)*time.Second + 10*time.Minute)
			}
		}
		done, err := sanitizeDone(st, sanact, &sawProgress)
		if done || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sanitize still in progress (SPROG %d/65536) at its deadline", st.SPROG)
		}
	}
}

// sanitizeDone reads one Sanitize Status log of a sanitize with action sanact that this
// agent started: done (completed, state 1 or 4, after it was seen in progress or with
// our action in SCDW10 — a log still describing an earlier sanitize is not taken for
// ours), an error (state 3, failed), or neither (keep polling). sawProgress records
// that state 2 (in progress) was seen.
func sanitizeDone(st sanitizeStatus, sanact uint32, sawProgress *bool) (bool, error) {
	switch st.State {
	case sanInProgress:
		*sawProgress = true
	case sanCompleted, sanCompletedN:
		if *sawProgress || st.SCDW10&7 == sanact {
			return true, nil
		}
	case sanFailed:
		return false, fmt.Errorf("sanitize failed (Sanitize Status log SSTAT=3)")
	}
	return false, nil
}
