package tftp

import (
	"fmt"
	"path"
	"strings"
)

// MaxNameLen bounds a requested file name in bytes.
const MaxNameLen = 255

// CleanName validates a file name from a read request (RFC 1350 §5: a
// netascii string) and returns the name to look up relative to the root.
//
// Names are root-relative: leading slashes are dropped, so "/undionly.kpxe"
// and "//undionly.kpxe" name the same file as "undionly.kpxe" (iPXE and
// several firmwares send the leading slash). What is left must already be
// clean. CleanName refuses, wrapping ErrBadPath: empty names (also "/"),
// names longer than MaxNameLen, backslashes, NUL and other control bytes,
// any ".." element ("../x", "/../x", "a/../b"), and names that path.Clean
// would change ("a//b", "./a", "a/", "/./a"). Nothing is decoded: "%2e%2e"
// is a literal name. Symlinks are checked at open time by os.Root.
func CleanName(name string) (string, error) {
	if name == "" || len(name) > MaxNameLen {
		return "", fmt.Errorf("%w: length %d", ErrBadPath, len(name))
	}
	for i := 0; i < len(name); i++ {
		b := name[i]
		if b < 0x20 || b == 0x7f || b == '\\' {
			return "", fmt.Errorf("%w: byte 0x%02x", ErrBadPath, b)
		}
	}
	rel := strings.TrimLeft(name, "/")
	if rel == "" {
		return "", fmt.Errorf("%w: no name after the leading slash", ErrBadPath)
	}
	for _, el := range strings.Split(rel, "/") {
		if el == ".." {
			return "", fmt.Errorf("%w: parent element", ErrBadPath)
		}
	}
	if path.Clean(rel) != rel {
		return "", fmt.Errorf("%w: not clean", ErrBadPath)
	}
	return rel, nil
}
