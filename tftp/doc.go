// Package tftp serves the first-stage boot files over TFTP (RFC 1350) with the
// blksize (RFC 2348) and tsize (RFC 2349) options of the option extension
// (RFC 2347), on top of github.com/pin/tftp/v3.
//
// It serves the iPXE binaries embedded from github.com/tinkerbell/ipxedust
// (undionly.kpxe for BIOS, ipxe.efi for x86-64 UEFI, snp.efi for arm64 UEFI)
// and, optionally, regular files under a read-only root directory. Writes (WRQ)
// are always refused. File names are validated before any file system access
// and files under the root are opened through an os.Root, so neither "..",
// absolute paths, NUL bytes, backslashes nor symlinks can leave the root.
//
// The server answers from the address the request was sent to, clamps blksize
// to the link MTU minus 32 bytes (1468 on a 1500-byte link) unless large blocks
// are opted into, acknowledges only options the client asked for, and bounds
// the number of concurrent transfers. windowsize (RFC 7440) is deliberately not
// negotiated; see DESIGN.md.
//
// Metrics (all on the registry passed to New):
//
//	kiln_tftp_transfers_total{class,result}   transfers finished; class ipxe|other, result ok|error
//	kiln_tftp_sent_bytes_total{class}         payload bytes sent in DATA packets
//	kiln_tftp_errors_total{class,reason}      requests refused or failed; reason not_found|refused|busy|write_refused|aborted
//	kiln_tftp_active_transfers                transfers in progress (gauge)
package tftp
