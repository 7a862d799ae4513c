package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"kiln/appliance/lifecycle/rules"
)

// Output formats of -o.
const (
	outTable = "table"
	outJSON  = "json"
	outYAML  = "yaml"
)

func checkOutput(o string) error {
	switch o {
	case outTable, outJSON, outYAML:
		return nil
	}
	return fmt.Errorf("-o %q: want table, json or yaml", o)
}

// render writes v as JSON or YAML, or calls table with a tabwriter for people.
func render(w io.Writer, format string, v any, table func(tw *tabwriter.Writer)) error {
	switch format {
	case outJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case outYAML:
		// Through JSON so the keys are the API's JSON names.
		js, err := json.Marshal(v)
		if err != nil {
			return err
		}
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.UseNumber() // keep 67108864 an integer, not 6.7108864e+07
		var generic any
		if err := dec.Decode(&generic); err != nil {
			return err
		}
		out, err := yaml.Marshal(yamlNumbers(generic))
		if err != nil {
			return err
		}
		_, err = w.Write(out)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// yamlNumbers replaces each json.Number in a decoded JSON tree with an int64
// when it is a whole number that fits, else a float64, so YAML prints
// integers as integers.
func yamlNumbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = yamlNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = yamlNumbers(e)
		}
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n
		}
		if f, err := x.Float64(); err == nil {
			return f
		}
		return x.String()
	}
	return v
}

// dash prints "-" for empty table cells.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// row writes one table row. Every cell goes through termSafe: a name or
// message from the server never reaches the terminal as a raw control
// character.
func row(tw io.Writer, cols ...any) {
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = termSafe(fmt.Sprint(c))
	}
	fmt.Fprintln(tw, strings.Join(parts, "\t"))
}

// termSafe returns s with every character that free text may not hold
// (rules.TextRune: control characters such as ESC, NUL, TAB and newline,
// U+2028/U+2029 and the bidirectional controls such as U+202E) written as a
// visible Go-style escape (\x1b, \n, \u202e), and every byte of invalid
// UTF-8 as \xNN. Text that passes rules.Printable is returned unchanged.
func termSafe(s string) string {
	if rules.Printable(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case rules.TextRune(r):
			b.WriteString(s[i : i+n])
		default:
			q := strconv.QuoteRune(r) // '\x1b', '\n', '\u202e'
			b.WriteString(q[1 : len(q)-1])
		}
		i += n
	}
	return b.String()
}
