package agent

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"kiln/api/agentapi"
)

// ATA Security erase through SG_IO with SCSI ATA PASS-THROUGH(16) (SAT-3 §12.2.2), which
// libata translates for a drive on an AHCI/SATA port. References: ATA8-ACS / ACS-3 —
// IDENTIFY DEVICE (ECh, §7.12: words 10-19 serial, 27-46 model, 23-26 firmware, 60-61 and
// 100-103 capacity, 82 bit 1 security feature set supported, 83 bit 10 48-bit address,
// 89/90 (enhanced) erase time, 128 security status, 255 integrity word), SECURITY SET
// PASSWORD (F1h), SECURITY ERASE PREPARE (F3h), SECURITY ERASE UNIT (F4h), SECURITY
// DISABLE PASSWORD (F6h) (§7.41-7.47).

const (
	ataIdentify        = 0xEC
	ataSecSetPassword  = 0xF1
	ataSecErasePrepare = 0xF3
	ataSecEraseUnit    = 0xF4
	ataSecDisablePass  = 0xF6

	sgDxferToDev   = -2
	sgDxferFromDev = -3

	sataProtoNonData = 3
	sataProtoPIOIn   = 4
	sataProtoPIOOut  = 5
)

// ataID is what the erase needs of IDENTIFY DEVICE.
type ataID struct {
	Serial, Model, Firmware string
	Sectors                 uint64 // user-addressable logical sectors
	Word82, Word128         uint16
	SecuritySupported       bool // word 82 bit 1 (and word 128 bit 0)
	Enabled                 bool // word 128 bit 1: a user password is set
	Locked                  bool // bit 2
	Frozen                  bool // bit 3
	CountExpired            bool // bit 4: too many wrong passwords; needs a power cycle
	EnhancedSupported       bool // bit 5
	MasterMax               bool // bit 8: security level maximum
	EraseMinutes            int  // word 89 (0: not reported)
	EnhancedEraseMinutes    int  // word 90
	ChecksumOK              bool // word 255 signature A5h and a zero byte sum (false when absent)
}

// ataString decodes an IDENTIFY string: each word holds two characters, high byte first.
func ataString(b []byte) string {
	s := make([]byte, len(b))
	for i := 0; i+1 < len(b); i += 2 {
		s[i], s[i+1] = b[i+1], b[i]
	}
	return asciiField(s)
}

// ataEraseMinutes decodes word 89/90: bit 15 set = extended format, bits 14:0 × 2 minutes;
// else bits 7:0 × 2 minutes (255: more than 508 minutes). 0 = not reported.
func ataEraseMinutes(w uint16) int {
	if w&0x8000 != 0 {
		return int(w&0x7FFF) * 2
	}
	return int(w&0xFF) * 2
}

// parseATAIdentify decodes 512 bytes of IDENTIFY DEVICE data. A present integrity word
// (low byte A5h) whose checksum does not hold is an error.
func parseATAIdentify(b []byte) (ataID, error) {
	if len(b) < 512 {
		return ataID{}, fmt.Errorf("identify device: %d bytes, want 512", len(b))
	}
	w := func(i int) uint16 { return binary.LittleEndian.Uint16(b[2*i:]) }
	id := ataID{Serial: ataString(b[20:40]), Firmware: ataString(b[46:54]), Model: ataString(b[54:94]),
		Word82: w(82), Word128: w(128)}
	if w(255)&0xFF == 0xA5 {
		var sum byte
		for _, x := range b[:512] {
			sum += x
		}
		if sum != 0 {
			return id, fmt.Errorf("identify device: integrity word %#04x: checksum does not hold", w(255))
		}
		id.ChecksumOK = true
	}
	id.Sectors = uint64(w(60)) | uint64(w(61))<<16
	if w(83)&(1<<10) != 0 && w(83)&0xC000 == 0x4000 {
		id.Sectors = uint64(w(100)) | uint64(w(101))<<16 | uint64(w(102))<<32 | uint64(w(103))<<48
	}
	// Words 82 and 128 are valid when not 0000h or FFFFh.
	valid82 := id.Word82 != 0 && id.Word82 != 0xFFFF
	valid128 := id.Word128 != 0xFFFF
	id.SecuritySupported = valid82 && id.Word82&2 != 0 && valid128 && id.Word128&1 != 0
	if id.SecuritySupported {
		s := id.Word128
		id.Enabled, id.Locked, id.Frozen = s&2 != 0, s&4 != 0, s&8 != 0
		id.CountExpired, id.EnhancedSupported, id.MasterMax = s&0x10 != 0, s&0x20 != 0, s&0x100 != 0
		id.EraseMinutes, id.EnhancedEraseMinutes = ataEraseMinutes(w(89)), ataEraseMinutes(w(90))
	}
	return id, nil
}

// ataDecision is what to do with a drive, from its IDENTIFY data alone.
type ataDecision struct {
	Method   string // agentapi.EraseATASecurity[Enhanced]; "" when blocked
	Outcome  string // for a blocked drive: unsupported, frozen or failed
	Why      string
	NextStep string
	// KnownPassword: security is enabled (not locked): try our own password, left by an
	// interrupted erase, without setting one.
	KnownPassword bool
	// Fallback: the overwrite may follow (false: the drive refuses writes: locked).
	Fallback bool
}

// ataPlan decides from id.
func ataPlan(id ataID) ataDecision {
	words := fmt.Sprintf("IDENTIFY word 82=%#04x word 128=%#04x", id.Word82, id.Word128)
	method := agentapi.EraseATASecurity
	if id.EnhancedSupported {
		method = agentapi.EraseATASecurityEnhanced
	}
	switch {
	case !id.SecuritySupported:
		return ataDecision{Outcome: agentapi.EraseUnsupported, Why: "security feature set not supported (" + words + ")", Fallback: true}
	case id.Frozen:
		return ataDecision{Method: method, Outcome: agentapi.EraseFrozen, Fallback: true,
			Why:      "security frozen (" + words + ", bit 3): the firmware (BIOS) froze it at boot; SECURITY ERASE UNIT is refused",
			NextStep: "thaw the drive: suspend to RAM and resume (echo mem > /sys/power/state) or hot-plug it (power/data cable), then erase again"}
	case id.Locked:
		return ataDecision{Method: method, Outcome: agentapi.EraseFailed, Fallback: false,
			Why:      "security locked (" + words + ", bit 2): a user password Kiln does not know is set; the drive refuses reads and writes",
			NextStep: "unlock or erase with the master password (hdparm --user-master m --security-erase PASSWORD), or replace the drive"}
	case id.CountExpired:
		return ataDecision{Method: method, Outcome: agentapi.EraseFailed, Fallback: true,
			Why:      "security count expired (" + words + ", bit 4): too many failed password attempts",
			NextStep: "power-cycle the drive, then erase again"}
	case id.Enabled:
		return ataDecision{Method: method, KnownPassword: true, Fallback: true,
			Why: "security enabled (" + words + ", bit 1): a user password is set; trying Kiln's erase password (an interrupted erase leaves it)"}
	}
	why := "security supported, not frozen (" + words + ")"
	if id.EnhancedSupported {
		why += "; enhanced erase supported"
	}
	return ataDecision{Method: method, Why: why, Fallback: true}
}

// sataCmd is one ATA command sent through ATA PASS-THROUGH(16).
type sataCmd struct {
	proto   int
	command uint8
	feature uint8
	count   uint8
	data    []byte // PIO data-in or data-out (512 bytes), nil for non-data
	timeout time.Duration
}

// sgATA sends c on fd; a SCSI or ATA error (CHECK CONDITION with sense, ATA status ERR)
// is an error naming the sense key and the ATA error register.
func sgATA(fd uintptr, c sataCmd) error {
	var cdb [16]byte
	cdb[0] = 0x85
	cdb[1] = byte(c.proto) << 1
	switch c.proto {
	case sataProtoPIOIn:
		cdb[2] = 0x0E // T_DIR from device, BYT_BLOK, T_LENGTH in the count field
	case sataProtoPIOOut:
		cdb[2] = 0x06
	}
	cdb[4], cdb[6], cdb[14] = c.feature, c.count, c.command
	var sense [64]byte
	h := sgIOHdr{interfaceID: 'S', dxferDirection: sgDxferNone, cmdLen: 16, mxSbLen: uint8(len(sense)),
		cmdp: uintptr(unsafe.Pointer(&cdb[0])), sbp: uintptr(unsafe.Pointer(&sense[0])),
		timeout: uint32(min(c.timeout.Milliseconds(), 1<<31))}
	if len(c.data) > 0 {
		h.dxferLen, h.dxferp = uint32(len(c.data)), uintptr(unsafe.Pointer(&c.data[0]))
		h.dxferDirection = sgDxferFromDev
		if c.proto == sataProtoPIOOut {
			h.dxferDirection = sgDxferToDev
		}
	}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, fd, sgIO, uintptr(unsafe.Pointer(&h)))
	if e != 0 {
		return fmt.Errorf("SG_IO: %v", e)
	}
	if h.status == 0 && h.hostStatus == 0 && h.driverStatus&^0x08 == 0 {
		return nil
	}
	return fmt.Errorf("ATA %02Xh: %s", c.command, describeSense(sense[:h.sbLenWr], h.status, h.hostStatus, h.driverStatus))
}

// describeSense renders SCSI status and sense data (fixed 70h/71h or descriptor 72h/73h
// format; the ATA Status Return descriptor 09h gives the ATA error and status registers).
func describeSense(sense []byte, status uint8, host, driver uint16) string {
	s := fmt.Sprintf("SCSI status %#02x host %#x driver %#x", status, host, driver)
	if len(sense) < 8 {
		return s
	}
	switch sense[0] & 0x7F {
	case 0x70, 0x71:
		if len(sense) >= 14 {
			s += fmt.Sprintf(", sense key %#x ASC/ASCQ %02x/%02x", sense[2]&0xF, sense[12], sense[13])
		}
	case 0x72, 0x73:
		s += fmt.Sprintf(", sense key %#x ASC/ASCQ %02x/%02x", sense[1]&0xF, sense[2], sense[3])
		for d := sense[8:]; len(d) >= 2; {
			l := int(d[1]) + 2
			if l > len(d) {
				break
			}
			if d[0] == ataSenseDesc && l >= 14 {
				s += fmt.Sprintf(", ATA error %#02x status %#02x", d[3], d[13])
			}
			d = d[l:]
		}
	}
	return s
}

// ataIdentifyDevice reads IDENTIFY DEVICE.
func ataIdentifyDevice(fd uintptr) (ataID, error) {
	b := make([]byte, 512)
	if err := sgATA(fd, sataCmd{proto: sataProtoPIOIn, command: ataIdentify, count: 1, data: b, timeout: 10 * time.Second}); err != nil {
		return ataID{}, err
	}
	return parseATAIdentify(b)
}

// ataPasswordBlock builds the 512-byte data of SET PASSWORD / ERASE UNIT / DISABLE
// PASSWORD: word 0 control bits, words 1-16 the password.
func ataPasswordBlock(control uint16) []byte {
	b := make([]byte, 512)
	binary.LittleEndian.PutUint16(b, control)
	copy(b[2:34], ataErasePassword)
	return b
}

// eraseATA runs SECURITY ERASE UNIT on dev when ataPlan allows it, verified with
// canaries; every attempt is recorded in c. It returns true when the drive is erased.
// On false, c.Outcome empty means "overwrite next"; set, it is final (frozen under
// OnFrozen=fail, locked).
func (a *Agent) eraseATA(_ context.Context, dev *Device, c *agentapi.DiskErase, pol agentapi.ErasePolicy) bool {
	fd := dev.f.Fd()
	id, err := ataIdentifyDevice(fd)
	if err != nil {
		attempt(c, "ata-identify", agentapi.EraseFailed, "IDENTIFY DEVICE: %v", err)
		c.Reason = "ATA IDENTIFY DEVICE failed; overwriting"
		return false
	}
	if c.Serial == "" {
		c.Serial = id.Serial
	}
	if c.Model == "" {
		c.Model = id.Model
	}
	d := ataPlan(id)
	c.Reason = d.Why
	if d.Outcome != "" {
		m := d.Method
		if m == "" {
			m = agentapi.EraseATASecurity
		}
		attempt(c, m, d.Outcome, "%s", d.Why)
		c.NextStep = d.NextStep
		if ataBlockedIsFinal(d, pol) {
			c.Method, c.Outcome = m, d.Outcome
			return false
		}
		c.Reason += "; overwriting instead"
		return false
	}
	minutes := id.EraseMinutes
	control := uint16(0) // user password
	if d.Method == agentapi.EraseATASecurityEnhanced {
		minutes, control = id.EnhancedEraseMinutes, 2
	}
	timeout := 12 * time.Hour
	if minutes > 0 && minutes < 508 {
		timeout = 2*time.Duration(minutes)*time.Minute + 10*time.Minute
	}
	start := time.Now()
	passwordSet := false
	run := func() error {
		if !d.KnownPassword {
			if err := sgATA(fd, sataCmd{proto: sataProtoPIOOut, command: ataSecSetPassword, count: 1, data: ataPasswordBlock(0), timeout: 30 * time.Second}); err != nil {
				return fmt.Errorf("SECURITY SET PASSWORD: %w", err)
			}
		}
		passwordSet = true
		if err := sgATA(fd, sataCmd{proto: sataProtoNonData, command: ataSecErasePrepare, timeout: 30 * time.Second}); err != nil {
			return fmt.Errorf("SECURITY ERASE PREPARE: %w", err)
		}
		if err := sgATA(fd, sataCmd{proto: sataProtoPIOOut, command: ataSecEraseUnit, count: 1, data: ataPasswordBlock(control), timeout: timeout}); err != nil {
			return fmt.Errorf("SECURITY ERASE UNIT (timeout %s): %w", timeout, err)
		}
		after, err := ataIdentifyDevice(fd)
		if err != nil {
			return fmt.Errorf("IDENTIFY after the erase: %w", err)
		}
		if after.Enabled {
			return fmt.Errorf("security still enabled after SECURITY ERASE UNIT (word 128=%#04x)", after.Word128)
		}
		passwordSet = false
		return nil
	}
	ok, err := verifyFirmware(dev, c, pol.SampleBlocks, run)
	if passwordSet {
		// Do not leave the drive with Kiln's password (it would lock at the next power-up).
		if derr := sgATA(fd, sataCmd{proto: sataProtoPIOOut, command: ataSecDisablePass, count: 1, data: ataPasswordBlock(0), timeout: 30 * time.Second}); derr != nil {
			err = fmt.Errorf("%v; SECURITY DISABLE PASSWORD: %v (the user password is %q)", err, derr, ataErasePassword)
		}
	}
	switch {
	case err != nil:
		attempt(c, d.Method, agentapi.EraseFailed, "%s: %v", d.Why, err)
	case !ok:
		attempt(c, d.Method, agentapi.EraseVerifyFailed, "%s", c.Verification)
	default:
		attempt(c, d.Method, agentapi.EraseErased, "%.1fs (drive estimate %d min)", time.Since(start).Seconds(), minutes)
		c.Method, c.Outcome, c.Verified = d.Method, agentapi.EraseErased, true
		return true
	}
	c.Reason = strings.TrimSuffix(d.Why, ".") + "; the security erase did not complete: overwriting"
	c.Coverage, c.Verification, c.Mismatches, c.FirstMismatch, c.Verified = 0, "", 0, 0, false
	return false
}

// ataBlockedIsFinal says whether a drive ataPlan blocked (d.Outcome set) ends there
// (its outcome is the disk's) rather than being overwritten: a locked drive refuses
// writes; a frozen one ends there under ErasePolicy.OnFrozen "fail".
func ataBlockedIsFinal(d ataDecision, pol agentapi.ErasePolicy) bool {
	return !d.Fallback || (d.Outcome == agentapi.EraseFrozen && pol.OnFrozen == agentapi.OnFrozenFail)
}
