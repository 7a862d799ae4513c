package agent

import "golang.org/x/sys/unix"

func sysReboot(reboot bool) error {
	unix.Sync()
	cmd := unix.LINUX_REBOOT_CMD_POWER_OFF
	if reboot {
		cmd = unix.LINUX_REBOOT_CMD_RESTART
	}
	return unix.Reboot(cmd)
}
