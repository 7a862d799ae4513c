package testkit

// HostileText are values that must never be stored as a name or free text
// (the rule is appliance/lifecycle/rules CheckText and CheckName): they drive
// terminals (ESC, NUL, newlines), reorder what is shown (U+202E and the other
// "Trojan Source" bidirectional controls) or are not text at all. The rules'
// own tests and the import's tests both use this one table.
var HostileText = map[string]string{
	"NUL":      "a\x00b",
	"ESC":      "esc\x1b[31mred",
	"newline":  "two\nlines",
	"CR":       "over\rwrite",
	"tab":      "a\tb",
	"DEL":      "a\x7fb",
	"C1 CSI":   "a\u009bb",
	"U+202E":   "rtl\u202eevil",
	"U+2066":   "iso\u2066late",
	"U+200F":   "rlm\u200fmark",
	"U+2028":   "line\u2028sep",
	"bad UTF8": "a\xffb",
}
