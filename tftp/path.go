package tftp

import (
	"fmt"
	"path"
	"strings"
)

// MaxNameLen bounds a requested file name in bytes.
const MaxNameLen = 255

// CleanName validates a file name from a read request (RFC 1350 §5: a
// netascii string) and returns it unchanged when it is safe to look up
// relative to the root. It refuses, wrapping ErrBadPath: empty names, names
// longer than MaxNameLen, absolute names ("/x"), backslashes, NUL and other
// control bytes, any ".." element, and names that path.Clean would change
// ("a//b", "./a", "a/"). Symlinks are checked at open time by os.Root.
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
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%w: absolute", ErrBadPath)
	}
	for _, el := range strings.Split(name, "/") {
		if el == ".." {
			return "", fmt.Errorf("%w: parent element", ErrBadPath)
		}
	}
	if path.Clean(name) != name {
		return "", fmt.Errorf("%w: not clean", ErrBadPath)
	}
	return name, nil
}
