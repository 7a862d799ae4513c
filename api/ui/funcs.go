package ui

import (
	"fmt"
	"html/template"
	"strings"
	"time"

	"kiln/store"
)

var funcs = template.FuncMap{
	"since": since,
	"utc": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"bytes": bytesText,
	"pct":   func(f float64) int { return int(f * 100) },
	"lower": strings.ToLower,
	"short": func(s string, n int) string {
		if len(s) <= n {
			return s
		}
		return s[:n] + "…"
	},
	"stateclass": func(s store.MachineState) string { return "st-" + string(s) },
	"join":       strings.Join,
	"kv": func(m map[string]string) string {
		var out []string
		for k, v := range m {
			out = append(out, k+"="+v)
		}
		return strings.Join(out, ", ")
	},
	"states": func() []store.MachineState { return store.AllStates },
	"num":    func(n int) string { return fmt.Sprint(n) },
}
