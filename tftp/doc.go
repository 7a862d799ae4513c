// Package tftp serves the first-stage boot files over TFTP (RFC 1350) with the
// blksize (RFC 2348) and tsize (RFC 2349) options of the option extension
// (RFC 2347). The transfers run on github.com/pin/tftp/v3 in its single-port
// mode; pin reads and writes through a Kiln-owned net.PacketConn, the gate
// (gate.go), which decides what pin sees and rewrites what pin sends. See
// DESIGN.md for why it is built that way and what single-port mode costs.
//
// It serves the iPXE binaries embedded from github.com/tinkerbell/ipxedust
// (undionly.kpxe for BIOS, ipxe.efi for x86-64 UEFI, snp.efi for arm64 UEFI)
// and, optionally, regular files under a read-only root directory. Writes (WRQ)
// are always refused. Names are root-relative ("/undionly.kpxe" is
// "undionly.kpxe"); they are validated before any file system access and files
// under the root are opened through an os.Root, so neither "..", NUL bytes,
// backslashes nor symlinks can leave the root.
//
// Requests are parsed strictly by the gate before pin sees them: the mode
// must be netascii or octet (any letter case; the obsolete mail is refused)
// and the options complete name/value pairs; anything else gets ERROR 4 and
// never data. Every ERROR carries the RFC 1350 code of its class and a fixed
// short text from one table (errors.go), including the ones pin builds (pin
// sends code 1 with its internal error text; the gate replaces them); the
// detail goes to the log only.
//
// The server answers from the address the request was sent to, clamps blksize
// to the link MTU minus 32 bytes (1468 on a 1500-byte link) unless large blocks
// are opted into, acknowledges only options the client asked for, and bounds
// the number of concurrent transfers. Every transfer is served from the
// listening port itself (no per-transfer server TID). windowsize (RFC 7440) is
// deliberately not negotiated; see DESIGN.md.
//
// Metrics (all on the registry passed to New):
//
//	kiln_tftp_transfers_total{class,result}   transfers finished; class ipxe|other, result ok|error
//	kiln_tftp_sent_bytes_total{class}         payload bytes sent in DATA packets (first sends)
//	kiln_tftp_errors_total{class,reason}      requests refused or failed; reason not_found|refused|
//	                                          write_refused|illegal|unknown_tid|busy|aborted|
//	                                          timeout|internal
//	kiln_tftp_active_transfers                transfers in progress (gauge)
package tftp
