// Package vbmc is Kiln's virtual Redfish BMC for the lab and the tests: a small HTTPS
// Redfish service (DSP0266; ServiceRoot, SessionService, one ComputerSystem with Boot
// override and ComputerSystem.Reset, EthernetInterfaces, a SEL LogService, one Manager,
// one Chassis per system, each with Status.Health set by [Server.SetHealth]) that
// drives a qemu VM through QMP (qemu's JSON machine protocol on a unix socket), the way
// sushy-tools drives libvirt.
//
// Power on starts qemu from a configured command line (plus -qmp, -serial and, for a
// pending boot override, -boot once=n|c); ForceOff sends QMP "quit" (kill on failure);
// ForceRestart/GracefulRestart send "system_reset", or restart the process when a boot
// override is pending so that it takes effect; PowerCycle restarts the process.
//
// With Config.Systems one server serves many ComputerSystems
// (/redfish/v1/Systems/{id}), each backed by a [Power] (a simulated machine: the fleet
// simulator, deploy/lab/fleetsim) instead of qemu. A system with an address
// (SystemConfig.Addr) is all a connection made to that address sees, so each system is a
// BMC of its own to a client that addresses BMCs by host:port, as Kiln does.
//
// Firmware and BIOS (firmware.go): UpdateService with FirmwareInventory (BIOS, BMC,
// NIC1, Disk1 SoftwareInventory), SimpleUpdate (the vbmc fetches ImageURI over HTTP)
// and a multipart push, each a TaskService task with a task monitor; the image's
// header ([FirmwareImage]) names the component and version, applied when the task
// completes (BIOS: staged, activated by the next start or reset, and given to qemu as
// SMBIOS type 0). Systems/{id}/Bios with @Redfish.Settings → Bios/Settings: staged
// attributes apply at the next start or reset.
//
// [Quirks] replay recorded vendor behaviours (override ignored, Mode rejected, half
// applied then 400, error on off-when-off, slow answers) so clients can be tested
// against them. It is test/lab code, not part of the appliance.
package vbmc
