package agent

import (
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"kiln/api/agentapi"
	"kiln/cmd/kiln-agent/inventory"
)

// Disk health. NVMe: the SMART / Health Information log page (Log Identifier 02h, NVM
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
