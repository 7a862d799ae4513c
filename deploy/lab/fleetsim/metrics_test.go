package fleetsim

import (
	"strings"
	"testing"
)

func TestParseMetrics(t *testing.T) {
	text := `# HELP kiln_store_last_index x
# TYPE kiln_store_last_index gauge
kiln_store_last_index 1234
kiln_store_commands_total{type="agent_report"} 40
kiln_store_commands_total{type="put_machine"} 2
kiln_dhcp_drops_total{reason="queue_full"} 3
kiln_bmc_ops_total{driver="redfish",op="power",result="ok"} 9
kiln_store_commit_seconds_sum 0.5
kiln_store_commit_seconds_count 100
kiln_api_requests_total{code="200"} 77
kiln_api_request_seconds_sum{method="POST",route="/v1/agent/attest/quote"} 0.25
kiln_api_request_seconds_count{method="POST",route="/v1/agent/attest/quote"} 50
kiln_api_request_seconds_count{method="POST",route="/v1/agent/report"} 900
`
	m, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if m["kiln_store_last_index"] != 1234 || m[`kiln_store_commands_total{type="agent_report"}`] != 40 || len(m) != 9 ||
		m[`kiln_api_request_seconds_count{method="POST",route="/v1/agent/attest/quote"}`] != 50 {
		t.Fatalf("parsed %v", m)
	}
	line := metricsLine(m, 10)
	for _, want := range []string{"raft index 1234 (123.4 per machine)", "store commit mean 5.0 ms over 100 writes",
		`dhcp_drops_total{reason="queue_full"}=3`, `store_commands_total{type="put_machine"}=2`} {
		if !strings.Contains(line, want) {
			t.Errorf("line %q lacks %q", line, want)
		}
	}
	if strings.Contains(line, "bmc_ops_total") || strings.Contains(line, "api_request") {
		t.Errorf("line %q holds a series it should leave out", line)
	}
}
