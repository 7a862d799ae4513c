package rules

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits of record fields, in bytes (UTF-8).
const (
	// MaxNameLen bounds a machine name: one DNS label (RFC 1123 section 2.1).
	MaxNameLen = 63
	// MaxTextLen bounds short free text: serial, vendor, model, site, rack,
	// row, image version, a role.
	MaxTextLen = 128
	// MaxDescriptionLen bounds long free text: descriptions, action
	// messages, an image's source.
	MaxDescriptionLen = 1024
	// MaxLabelKeyLen and MaxLabelValueLen bound one label.
	MaxLabelKeyLen   = 63
	MaxLabelValueLen = 255
	// MaxHostnameLen bounds a host name (RFC 1035 section 2.3.4: 255 octets
	// on the wire, 253 characters in text form).
	MaxHostnameLen = 253
)

var (
	nameRe     = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`)
	labelKeyRe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$`)
	// hostLabelRe is one label of a host name (RFC 1123 section 2.1: letters,
	// digits and '-', not at either end).
	hostLabelRe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$`)
)

// TextRune reports whether r may appear in free text that people will see
// in a terminal or a web page. Refused: control characters (Unicode Cc:
// NUL, ESC, TAB, newlines, DEL, the C1 set), the line and paragraph
// separators U+2028 and U+2029, and the bidirectional controls (Unicode
// Bidi_Control: U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069), which
// reorder what a terminal shows ("Trojan Source", CVE-2021-42574).
func TextRune(r rune) bool {
	return !unicode.IsControl(r) && r != '\u2028' && r != '\u2029' && !unicode.Is(unicode.Bidi_Control, r)
}

// Printable reports whether s is valid UTF-8 made only of TextRune runes.
func Printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !TextRune(r) {
			return false
		}
	}
	return true
}

// CheckText checks free text: at most max bytes, valid UTF-8, every rune a
// TextRune. The empty string passes (callers check "required").
func CheckText(s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("longer than %d bytes", max)
	}
	if !utf8.ValidString(s) {
		return errors.New("not valid UTF-8")
	}
	for i, r := range s {
		if !TextRune(r) {
			return fmt.Errorf("contains %U at byte %d: control, line-separator and bidirectional characters are not allowed", r, i)
		}
	}
	return nil
}

// CheckName checks a machine name: 1 to MaxNameLen bytes of letters,
// digits, '.', '-' and '_', starting and ending with a letter or digit.
func CheckName(s string) error {
	switch {
	case s == "":
		return errors.New("required")
	case len(s) > MaxNameLen:
		return fmt.Errorf("longer than %d bytes", MaxNameLen)
	case !nameRe.MatchString(s):
		return fmt.Errorf("%q: use letters, digits, '.', '-' and '_', starting and ending with a letter or digit", s)
	}
	return nil
}

// CheckLabel checks one label. The key is 1 to MaxLabelKeyLen bytes of
// letters, digits, '.', '_', '-' and '/', starting and ending with a letter
// or digit. The value is free text (CheckText) of at most MaxLabelValueLen
// bytes without ',' or '=' (label lists are written k=v,k=v).
func CheckLabel(key, value string) error {
	if key == "" || len(key) > MaxLabelKeyLen || !labelKeyRe.MatchString(key) {
		return fmt.Errorf("key %q: want 1 to %d letters, digits, '.', '_', '-' or '/', starting and ending with a letter or digit", key, MaxLabelKeyLen)
	}
	if err := CheckText(value, MaxLabelValueLen); err != nil {
		return fmt.Errorf("value of %q: %v", key, err)
	}
	if strings.ContainsAny(value, ",=") {
		return fmt.Errorf("value of %q: ',' and '=' are not allowed", key)
	}
	return nil
}

// CheckHostname checks a host name as a claim gives it to the installed
// system: lower-case labels of letters, digits and '-' (not at either end),
// 1 to 63 bytes each, joined by '.', at most MaxHostnameLen bytes in all
// (RFC 1123 section 2.1, RFC 1035 section 2.3.4).
func CheckHostname(s string) error {
	if s != strings.ToLower(s) {
		return fmt.Errorf("%q: want lower case", s)
	}
	return checkDNSName(s)
}

func checkDNSName(s string) error {
	if s == "" || len(s) > MaxHostnameLen {
		return fmt.Errorf("want a DNS name of 1 to %d bytes", MaxHostnameLen)
	}
	for _, l := range strings.Split(s, ".") {
		if len(l) > 63 || !hostLabelRe.MatchString(l) {
			return fmt.Errorf("%q is not a valid host name (RFC 1123: labels of letters, digits and '-', 1 to 63 bytes)", s)
		}
	}
	return nil
}

// CheckHostPort checks a BMC address: an IP address or a DNS name (any
// case), optionally with ":port" (1–65535); an IPv6 address with a port is
// written in brackets ("[fd00::1]:623").
func CheckHostPort(v string) error {
	host := v
	if h, p, err := net.SplitHostPort(v); err == nil {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%q: port must be 1 to 65535", v)
		}
		host = h
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if err := checkDNSName(host); err != nil {
		return fmt.Errorf("%q: want an IP address or DNS name, optionally with :port", v)
	}
	return nil
}

// SanitizeText makes text from a machine (agent or BMC messages) safe to
// store and show, where refusing it would lose a report: invalid UTF-8
// becomes U+FFFD, every rune that is not a TextRune a space, and the result
// is cut to at most max bytes on a rune boundary (max < 0: not cut).
func SanitizeText(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if !TextRune(r) {
			return ' '
		}
		return r
	}, s)
	if max < 0 || len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
