// Package fleetsim is Kiln's fleet simulator (issue 13): N simulated
// machines, each speaking the real protocols to a real `kiln serve` (the
// built bin/kiln, started with a scratch data directory and configuration),
// over network namespaces and veths it creates and removes (netns.go). It
// measures what a site of thousands of machines costs Kiln.
//
// One run ([Run]):
//
//  1. The namespaces PREFIX-srv (Kiln) and PREFIX-lan (the machines and
//     their BMCs); the simulation itself runs inside PREFIX-lan (Run
//     re-executes the binary there), so every socket it opens is there.
//  2. One virtual Redfish BMC (deploy/lab/vbmc) serving every machine's
//     ComputerSystem, each on its own address (10.97.8.x:8443); a power-on
//     starts that machine's boot ([vbmc.Power]).
//  3. kiln serve with DHCP (authoritative, a pool of MaxMachines), TFTP and
//     HTTP boot on PREFIX-srv, and its REST API on 10.98.0.1:7480.
//  4. Through the REST API (plain HTTP, the run's admin token): a raw image
//     upload (ImageMiB of random bytes), an N-row rack plan import (name,
//     serial, vendor, model, rack, u, MAC, CPUs, memory, boot mode), one BMC
//     enrolment per machine. Kiln's auto-inspection then powers the machines
//     on in the batches it chooses, through its real BMC path (boot override
//     PATCH and read-back, ComputerSystem.Reset).
//  5. Each powered-on machine: DHCP from its own MAC with PXE options
//     (option 60 PXEClient, 93 = BIOS, 97 UUID), TFTP of the boot file
//     (pin/tftp/v3 client, from the leased address), DHCP again as iPXE
//     (option 77 "iPXE"), the per-machine iPXE script (following its
//     wait-and-retry answers), a Range of EnvBytes of the kernel and of the
//     initramfs, then the agent API as cmd/kiln-agent/agent speaks it:
//     register with an inventory that matches the rack plan, poll for tasks,
//     and for a provision task the check, write, verify, stage, finalize and
//     reboot reports (started, a running heartbeat in write and verify,
//     succeeded), the image streamed with the per-boot token into SHA-256
//     and discarded, then a reboot: the network boot again, which Kiln
//     answers with the local disk, and the machine is provisioned.
//  6. A follower of GET /v1/events records each machine's transitions and
//     claims each machine that becomes available (POST
//     /v1/machines/{id}/provision).
//
// The DHCP side of all machines is one AF_PACKET socket (dhcpc.go); the
// packets are built by github.com/insomniacslk/dhcp/dhcpv4. Each machine's
// TCP and TFTP traffic leaves from its leased address (an "AnyIP" local
// route makes the whole pool local in PREFIX-lan).
//
// What a run reports ([Result], [Result.Lines]):
//
//	fleet: N provisioned, F failed in S s; kiln cpu X ms/machine; rss Y MB; store Z MB
//
// (S from the first power-on to the last provisioned; CPU is kiln serve's
// utime+stime from /proc/PID/stat over the run from the import on, RSS its
// VmHWM, store its data directory), then p50/p99 of each phase (power_on
// from the import, dhcp, first_stage, environment, inspection from
// registration to available, claim_to_write, write, verify, report: each
// agent report's round trip, reboot: the reboot report to provisioned,
// total), the raft log's and bbolt's file sizes and the events written (per
// machine and by kind).
//
// Attestation ([Options.Attest], attest.go; issue 16): the first K machines
// have a TPM 2.0 each (a swtpm, EK certificate included), measured at each
// boot as OVMF and the Linux EFI stub measure one, with the kernel command
// line the machine's script gave it; their attest step is the real agent's
// exchange (agent.AttestTPM). The model requires attestation and allows the
// others without a TPM. The first TPM machine is the reference (refused for
// want of an approved state, learned and approved, inspected and built
// again); the other TPM machines are claimed once its state is approved.
// The line after the metrics:
//
//	fleet: attest: K machines with a TPM …; P passed, R refused (…); kiln handler time per TPM attestation X ms (…); attest step p50/p99 s: …
//
// Day 2 ([Options.Day2], day2.go; issue 14): the storm's machines are not
// claimed one by one as they become available; once the whole fleet is
// inspected, all but Day2.Spares are claimed with POST /v1/machines/claim
// (role worker, selector fleet=sim; the spares carry the same labels and the
// default class) and built. Kiln runs with a `remediation:` section whose
// clocks are compressed (settle, health poll, brake window = Hour/4, no
// drain). Failures are injected through the vbmc's health knob
// (vbmc.Server.SetHealth: the system and its chassis Critical and an SEL
// entry, for good), so Kiln's ladder climbs power_cycle → reinspect →
// reprovision → erase → rma; the simulated machine answers each power
// action as a real one does (a power cycle re-netboots it: its disk, or the
// agent when Kiln set a PXE override; the agent's erase reports a per-disk
// certificate, agentapi.DiskErase; an rma machine's agent powers it off).
// BMC actions are counted on the vbmc side (vbmc.Config.OnRequest: each
// ComputerSystem.Reset POST and boot-override PATCH it served). Mode A:
// Day2.FailA claimed machines fail evenly over the compressed hour; each must
// end rma with a spare provisioned in its place (GET /v1/remediation's
// spare), the brake released. Mode B: Day2.FailB fail at once; the brake must
// engage, and through Day2.Observe after its engaged_at the vbmc serves no
// action and the failed machines make no transition:
//
//	fleet: 2000 claimed; 40 failed over 1h (compressed to N s); 40 rma, 40 spares provisioned; slowest replacement N s after failure
//	fleet: 400 of 2000 failed at once; brake engaged (scope site, K failures counted) after N s; BMC actions after brake 0; repaired behind brake 0
//
// (The storm's lines of a day-2 run count the spares as unfinished: they are
// inspected and stay available. Kiln runs with remediation.hold = 2 × the
// health poll, so a mass failure read over one sweep is counted before any
// run starts: appliance/lifecycle/DESIGN.md "The brake".)

// A storm with a fault (Options.Nodes 3, KillLeaderAt; cmd/fleetsim
// -nodes 3 -kill-leader-at D): three kiln serve nodes, each in its own
// namespace PREFIX-nK on one bridge with the machines (the HA lab's layout,
// deploy/lab/e2e/halab.go): node 1 bootstraps, nodes 2 and 3 join with
// one-time tokens (mutual TLS), every node serves DHCP (RFC 3074 balancing:
// the simulated clients' secs field grows on retransmission as firmware's
// does), TFTP and HTTP, and lists the others in boot.peer_http_addrs. The
// REST client and each machine's agent fail over as the real ones do (the
// agent across kiln.url and Task.Endpoints on a transport error or a
// 502/503/504; the image from the same path on another node). D after the
// import begins the raft leader gets SIGKILL; it is started again Down (5 s)
// later. At the end the run checks, on every node: each machine provisioned
// in its store, no machine with two transitions to provisioned in its event
// log, and no address bound to two MACs in its leases (GET /v1/leases), nor
// across the nodes, nor in the ACKs the machines received, and prints
//
//	fleet: N provisioned, F failed in S s on 3 nodes; leader killed at T s; provisioned twice P; duplicate addresses D
//
// (T from the import's start) with a line on the kill, the election and each
// node's counts. CPU is then the sum over the nodes' current processes (a
// restarted node's from its restart), RSS the largest, the store node 1's.
//
// Not simulated: the in-RAM environment is fetched in part and never run;
// disks are not written (the image's bytes are hashed and dropped); DHCP
// renewals; UEFI machines. The package imports nothing of Kiln's but the
// agent API's wire types (deploy/scripts/depcheck).
package fleetsim
