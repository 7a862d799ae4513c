package agent

import (
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"kiln/api/agentapi"
	"kiln/cmd/kiln-agent/inventory"
)

// Disk health. SATA/SAS behind libata (sd*): SMART RETURN STATUS (ATA8-ACS B0h/DAh) sent
// as SCSI ATA PASS-THROUGH(16) (SAT-3 §12.2.2) with CK_COND so the registers come back in an
// ATA Status Return sense descriptor (09h); LBA mid/high 4Fh/C2h → "ok", F4h/2Ch → "failing".
// NVMe: the SMART / Health Information log page (Log Identifier 02h, NVM
// Express Base Specification 2.0 §5.16.1.3) read with the admin passthrough ioctl
// (linux/nvme_ioctl.h NVME_IOCTL_ADMIN_CMD); byte 0 "Critical Warning" non-zero → "failing",
// zero → "ok". Other disks (SATA/SAS SMART needs SG_IO ATA/SCSI passthrough, virtio offers
// nothing) → "not_reported", which never fails the check step.

// nvmeAdminCmd mirrors struct nvme_passthru_cmd (72 bytes).
type nvmeAdminCmd struct {
	opcode      uint8
	flags       uint8
	rsvd1       uint16
	nsid        uint32
	cdw2, cdw3  uint32
	metadata    uint64
	addr        uint64
	metadataLen uint32
	dataLen     uint32
	cdw10       uint32
	cdw11       uint32
	cdw12       uint32
	cdw13       uint32
	cdw14       uint32
	cdw15       uint32
	timeoutMs   uint32
	result      uint32
}

// _IOWR('N', 0x41, struct nvme_admin_cmd)
const nvmeIoctlAdminCmd = 0xC0484E41

// Health values of agentapi.Disk.Health.
const (
	HealthOK      = "ok"
	HealthFailing = "failing"
)

// DiskHealth returns "ok", "failing" or "not_reported" for the disk at path (/dev/NAME).
func DiskHealth(path string) string {
	name := strings.TrimPrefix(path, "/dev/")
	if strings.HasPrefix(name, "sd") {
		return ataSMARTStatus(path)
	}
	if !strings.HasPrefix(name, "nvme") {
		return inventory.HealthNotReported
	}
	f, err := os.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return inventory.HealthNotReported
	}
	defer f.Close()
	log := make([]byte, 512)
	cmd := nvmeAdminCmd{
		opcode:    0x02, // Get Log Page
		nsid:      0xFFFFFFFF,
		addr:      uint64(uintptr(unsafe.Pointer(&log[0]))),
		dataLen:   uint32(len(log)),
		cdw10:     uint32(len(log)/4-1)<<16 | 0x02, // NUMDL, LID 02h
		timeoutMs: 5000,
	}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), nvmeIoctlAdminCmd, uintptr(unsafe.Pointer(&cmd)))
	if e != 0 {
		return inventory.HealthNotReported
	}
	if log[0] != 0 {
		return HealthFailing
	}
	return HealthOK
}

// listDisksWithHealth is the default Config.ListDisks.
func listDisksWithHealth(root string) ([]agentapi.Disk, error) {
	disks, err := inventory.Disks(root)
	if err != nil {
		return nil, err
	}
	for i := range disks {
		disks[i].Health = DiskHealth(disks[i].Path)
	}
	return disks, nil
}

// sgIOHdr mirrors struct sg_io_hdr (scsi/sg.h) on 64-bit Linux.
type sgIOHdr struct {
	interfaceID    int32
	dxferDirection int32
	cmdLen         uint8
	mxSbLen        uint8
	iovecCount     uint16
	dxferLen       uint32
	dxferp         uintptr
	cmdp           uintptr
	sbp            uintptr
	timeout        uint32
	flags          uint32
	packID         int32
	usrPtr         uintptr
	status         uint8
	maskedStatus   uint8
	msgStatus      uint8
	sbLenWr        uint8
	hostStatus     uint16
	driverStatus   uint16
	resid          int32
	duration       uint32
	info           uint32
}

const (
	sgIO         = 0x2285
	sgDxferNone  = -1
	ataSenseDesc = 0x09
)

func ataSMARTStatus(path string) string {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return inventory.HealthNotReported
	}
	defer f.Close()
	cdb := [16]byte{0: 0x85, 1: 3 << 1, 2: 0x20, 4: 0xDA, 10: 0x4F, 12: 0xC2, 14: 0xB0}
	var sense [64]byte
	h := sgIOHdr{
		interfaceID: 'S', dxferDirection: sgDxferNone, cmdLen: uint8(len(cdb)), mxSbLen: uint8(len(sense)),
		cmdp: uintptr(unsafe.Pointer(&cdb[0])), sbp: uintptr(unsafe.Pointer(&sense[0])), timeout: 5000,
	}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), sgIO, uintptr(unsafe.Pointer(&h)))
	if e != 0 || h.sbLenWr < 8+14 {
		return inventory.HealthNotReported
	}
	return parseATAStatusSense(sense[:h.sbLenWr])
}

// parseATAStatusSense reads the ATA Status Return descriptor of descriptor-format sense data.
func parseATAStatusSense(sense []byte) string {
	if len(sense) < 8 || sense[0]&0x7F != 0x72 {
		return inventory.HealthNotReported
	}
	for d := sense[8:]; len(d) >= 2; {
		l := int(d[1]) + 2
		if l > len(d) {
			break
		}
		if d[0] == ataSenseDesc && l >= 14 {
			mid, high := d[9], d[11]
			switch {
			case mid == 0x4F && high == 0xC2:
				return HealthOK
			case mid == 0xF4 && high == 0x2C:
				return HealthFailing
			}
			return inventory.HealthNotReported
		}
		d = d[l:]
	}
	return inventory.HealthNotReported
}
