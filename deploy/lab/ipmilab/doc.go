// Package ipmilab starts one lab IPMI BMC: OpenIPMI's ipmi_sim inside a
// network namespace, configured from deploy/lab/ipmi (lan.conf.in, bmc.emu),
// whose chassis program (deploy/lab/ipmi/chassis.sh) starts and stops a qemu
// VM from a command line file. Start returns once the BMC answers an RMCP+
// (lanplus, cipher suite 3) "chassis power status" from ipmitool (IPMI v2.0
// section 13). Used by the bmc package's tests and the lab's end-to-end flow
// (deploy/lab/e2e); needs root, ip, ipmi_sim and ipmitool.
package ipmilab
