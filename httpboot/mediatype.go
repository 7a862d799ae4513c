package httpboot

import (
	"path"
	"strings"
)

// Media types (Content-Type values) of everything httpboot serves: the one
// table. UEFI HTTP Boot firmware takes the image type from Content-Type
// first and only then from the URL's extension (UEFI Specification 2.6 and
// later, "HTTP Boot", "Concept of Message Exchange in HTTP Boot Scenario").
// EDK2's HttpBootDxe (HttpBootCheckImageType) compares the whole field
// value, case-insensitively, with exactly these strings, so the boot image
// types carry no parameters.
const (
	// MediaTypeEFI: a UEFI executable image (.efi), run by the firmware.
	MediaTypeEFI = "application/efi"
	// MediaTypeEFIISO: an ISO-9660 image (.iso) the firmware mounts as a
	// virtual CD. The UEFI spec and EDK2 spell it with a hyphen; IANA
	// registered "application/vnd.efi.iso", which EDK2 does not recognise.
	MediaTypeEFIISO = "application/vnd.efi-iso"
	// MediaTypeEFIImg: a disk image (.img) the firmware mounts as a virtual
	// disk (IANA: "application/vnd.efi.img"; same spelling note).
	MediaTypeEFIImg = "application/vnd.efi-img"
	// MediaTypeScript: the per-machine iPXE script (iPXE ignores the type and
	// reads the "#!ipxe" line; the script is ASCII by construction).
	MediaTypeScript = "text/plain; charset=utf-8"
	// MediaTypeOctets: everything else — BIOS undionly.kpxe, the agent's
	// kernel and initramfs, OS images for the agent to write.
	MediaTypeOctets = "application/octet-stream"
)

// mediaTypes maps a lower-case file extension to its boot media type.
var mediaTypes = map[string]string{
	".efi": MediaTypeEFI,
	".iso": MediaTypeEFIISO,
	".img": MediaTypeEFIImg,
}

// MediaType returns the Content-Type for a served file by the extension of
// its name (case-insensitive): MediaTypeEFI for .efi, MediaTypeEFIISO for
// .iso, MediaTypeEFIImg for .img, otherwise MediaTypeOctets. Never "".
func MediaType(name string) string {
	if t, ok := mediaTypes[strings.ToLower(path.Ext(name))]; ok {
		return t
	}
	return MediaTypeOctets
}
