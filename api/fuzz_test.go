package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"kiln/api/agentapi"
	"kiln/appliance/lifecycle/rules"
)

// FuzzDecodeJSON feeds arbitrary request bodies (network bytes) through the
// strict JSON decoder used by every handler. Every failure is a classified
// 400/413, never a 500. An accepted body is exactly one JSON value (nothing
// after it but white space), and what it decoded to round-trips: its
// encoding is accepted and decodes to a patch with the same encoding.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{
		`{"resource_version":1,"name":"x"}`, `{"resource_version":1,"state":"available"}`, `{"intended":{"nics":[{"mac":"52:54:00:00:00:01"}]}}`,
		`{"rack_unit":"top"}`, `{`, ``, `null`, `[]`, `{"labels":{"a":"b"}}{}`, `{"resource_version":-1}`, "\xff\xfe",
		`{"intended":{"colour":1}}`, `{"resource_version":1e400}`, `{"name":"a"} xyz`, `{"name":"a"}]`, `{"name":"a"} `,
		`{"labels":null,"name":"\u00e9\ud800"}`,
	} {
		f.Add([]byte(s))
	}
	e := echo.New()
	s := &Server{}
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequest("PATCH", "/v1/machines/x", strings.NewReader(string(body)))
		rec := httptest.NewRecorder()
		c := e.NewContext(req, rec)
		var p MachinePatch
		err := decodeJSON(c, 1<<12, &p, false)
		if err == nil {
			if !json.Valid(body) {
				t.Fatalf("accepted %q, which is not exactly one JSON value", body)
			}
			enc, err := json.Marshal(p)
			if err != nil {
				t.Fatalf("accepted %q: re-encoding: %v", body, err)
			}
			c2 := e.NewContext(httptest.NewRequest("PATCH", "/v1/machines/x", bytes.NewReader(enc)), httptest.NewRecorder())
			var p2 MachinePatch
			if err := decodeJSON(c2, 1<<20, &p2, false); err != nil {
				t.Fatalf("accepted %q, but its own encoding %s is refused: %v", body, enc, err)
			}
			// Compared in the encoded form: an empty list and an absent one (omitempty)
			// are the same patch.
			enc2, _ := json.Marshal(p2)
			if !bytes.Equal(enc, enc2) {
				t.Fatalf("round trip of %q changed it:\n%s\n%s", body, enc, enc2)
			}
			if p.Intended != nil {
				var fe *rules.FieldError
				if err := rules.CheckHardware("intended", p.Intended); err != nil && (!errors.As(err, &fe) || fe.Field == "") {
					t.Fatalf("validate: unclassified %v", err)
				} else if err != nil {
					if code, d := s.classify(err); code != 400 || d.Field != fe.Field {
						t.Fatalf("validate: %v answered %d %+v", err, code, d)
					}
				}
			}
			return
		}
		code, d := s.classify(err)
		if code != 400 && code != 413 {
			t.Fatalf("body %q: status %d (%+v) from %v", body, code, d, err)
		}
		if d.Code == CodeUnknownField && d.Field == "" {
			t.Fatalf("unknown field without a name: %v", err)
		}
	})
}

// FuzzReport checks the agent report validator and message sanitiser on
// arbitrary field values: a report that passes has only closed-enum values
// and a message of at most MaxMessageLen bytes of valid UTF-8 without
// control characters.
func FuzzReport(f *testing.F) {
	f.Add("write", "running", "", "50% done", 0.5)
	f.Add("write", "failed", "write_failed", "EIO\x00\x1b[31m", 0.1)
	f.Add("check", "failed", "", "x", 0.0)
	f.Add("dance", "started", "", strings.Repeat("é", 400), 1.5)
	f.Fuzz(func(t *testing.T, step, state, reason, msg string, progress float64) {
		r := agentapi.Report{Step: step, State: agentapi.State(state), Reason: agentapi.Reason(reason), Message: msg, Progress: progress}
		if err := validateReport(&r); err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Field == "" {
				t.Fatalf("unnamed validation error %v", err)
			}
			return
		}
		if !knownSteps[r.Step] || r.Progress < 0 || r.Progress > 1 {
			t.Fatalf("accepted %+v", r)
		}
		if len(r.Message) > agentapi.MaxMessageLen || !utf8.ValidString(r.Message) {
			t.Fatalf("message %q", r.Message)
		}
		for _, c := range r.Message {
			if unicode.IsControl(c) {
				t.Fatalf("control char in %q", r.Message)
			}
		}
	})
}
