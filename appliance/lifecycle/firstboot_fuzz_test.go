package lifecycle

import (
	"encoding/json"
	"errors"
	"testing"
	"unicode"
	"unicode/utf8"

	"kiln/api/agentapi"
)

// FuzzFirstBootReport feeds arbitrary POST /v1/agent/firstboot bodies
// through the report's JSON decoding and checkFirstBoot: a report that
// passes has only closed-enum phase, outcome and reason, and text of
// bounded length, valid UTF-8 without control characters; every refusal is
// ErrBadReport.
func FuzzFirstBootReport(f *testing.F) {
	for _, s := range []string{
		`{"machine_id":"m-1","phase":"node_layer","outcome":"succeeded","hostname":"n1","ssh_host_key_fingerprint":"SHA256:x"}`,
		`{"phase":"join","outcome":"failed","reason":"first_boot_join","message":"kubeadm: \u001b[31mtimeout"}`,
		`{"phase":"join","outcome":"failed","reason":"nope"}`, `{"phase":"boot"}`, `{}`, `[]`, `{"message":"\ud800"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var rep agentapi.FirstBootReport
		if json.Unmarshal(body, &rep) != nil {
			return
		}
		if err := checkFirstBoot(&rep); err != nil {
			if !errors.Is(err, ErrBadReport) {
				t.Fatalf("unclassified %v", err)
			}
			return
		}
		if (rep.Phase != agentapi.PhaseNodeLayer && rep.Phase != agentapi.PhaseJoin) ||
			(rep.Outcome != agentapi.OutcomeSucceeded && rep.Outcome != agentapi.OutcomeFailed) {
			t.Fatalf("accepted %+v", rep)
		}
		for _, s := range []string{rep.Message, rep.Hostname, rep.SSHHostKeyFingerprint, rep.NodeLayerSHA256, rep.BootID} {
			if !utf8.ValidString(s) {
				t.Fatalf("invalid UTF-8 kept: %q", s)
			}
			for _, c := range s {
				if unicode.IsControl(c) {
					t.Fatalf("control character kept in %q", s)
				}
			}
		}
		if len(rep.Message) > agentapi.MaxFirstBootMessageLen || len(rep.Hostname) > 253 || len(rep.BootID) > 64 {
			t.Fatalf("unbounded text: %+v", rep)
		}
	})
}
