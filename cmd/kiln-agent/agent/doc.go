// Package agent is kiln-agent's engine: the agentapi protocol against the appliance
// (register with inventory, poll for a Task, report every step) and the gated build
// (top-level DESIGN.md "The gated build") on a real block device:
//
//	check    disk by rule (serial, WWN, or the smallest non-removable disk of at least
//	         MinSizeBytes), size ≥ image + cidata, health ("failing" fails; virtio reports
//	         none → "not_reported"), O_DIRECT sequential read ≥ MinReadMBps, no partition
//	         table / file-system signature unless Task.Wipe (then the first and last MiB are
//	         zeroed before writing)
//	write    HTTP stream → raw/gzip/zstd decoder → block device, hashing while writing;
//	         a broken stream resumes with Range/If-Range up to Config.MaxResumes times
//	verify   O_DIRECT re-read of the image range, SHA-256 against the pinned digest;
//	         one rewrite on mismatch, then digest_mismatch (served bytes wrong) — a read-back
//	         mismatch with a correct stream is first reported as verify_mismatch
//	stage    a 16 MiB NoCloud "cidata" FAT16 partition appended after the image (parttable.go
//	         explains MBR and GPT handling), with meta-data, user-data (host key, CA,
//	         join data, labels) and network-config
//	finalize fsync, BLKRRPART, report Written (disk, bytes, sha256, changed sectors, ...)
//	reboot   reboot(2) (or power off when Task.Reboot is false)
//
// erase zeroes the first and last MiB, BLKDISCARDs the device (or overwrites it), and
// checks that the first and last MiB read back as zeros.
package agent
