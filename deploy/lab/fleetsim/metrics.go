package fleetsim

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
)

// watchedMetrics are the series of Kiln's /metrics a run reports: the raft
// log's index and the store's commands and commit latency (sum and count),
// and every counter of work refused or repeated (drops, errors, holds,
// retries). A series is kept when its name is one of these.
var watchedMetrics = []string{
	"kiln_store_last_index", "kiln_store_commands_total", "kiln_store_apply_errors_total",
	"kiln_store_commit_seconds_sum", "kiln_store_commit_seconds_count",
	"kiln_dhcp_drops_total", "kiln_tftp_errors_total", "kiln_httpboot_errors_total",
	"kiln_lifecycle_boots_held_total", "kiln_bmc_retries_total", "kiln_bmc_ops_total",
}

// attestSeries: the latency sum and count of the agent's two attestation
// calls (kiln_api_request_seconds by route), the run's Kiln-side cost of
// an attestation (attest.go).
func attestSeries(name, series string) bool {
	return (name == "kiln_api_request_seconds_sum" || name == "kiln_api_request_seconds_count") &&
		strings.Contains(series, `route="/v1/agent/attest/`)
}

// metrics reads GET /metrics (Prometheus text exposition format 0.0.4:
// "name{labels} value" per line, '#' comments) and returns the watched
// series, keyed by "name{labels}".
func (k *kiln) metrics(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+k.api()+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+k.token)
	resp, err := k.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("kiln /metrics: HTTP %d", resp.StatusCode)
	}
	return parseMetrics(resp.Body)
}

func parseMetrics(r io.Reader) (map[string]float64, error) {
	want := map[string]bool{}
	for _, n := range watchedMetrics {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		series, val := line[:i], line[i+1:]
		name := series
		if j := strings.IndexByte(series, '{'); j >= 0 {
			name = series[:j]
		}
		if !want[name] && !attestSeries(name, series) {
			continue
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			continue
		}
		out[series] += v
	}
	return out, sc.Err()
}

// metricsLine renders the watched series (zero counters left out).
func metricsLine(m map[string]float64, n int) string {
	var keys []string
	for k, v := range m {
		if v != 0 && !strings.HasPrefix(k, "kiln_store_commit_seconds") && !strings.HasPrefix(k, "kiln_api_request_seconds") && !(strings.HasPrefix(k, "kiln_bmc_ops_total") && strings.Contains(k, `result="ok"`)) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	idx := m["kiln_store_last_index"]
	fmt.Fprintf(&b, "fleet: kiln metrics: raft index %.0f (%.1f per machine)", idx, idx/float64(max(n, 1)))
	if c := m["kiln_store_commit_seconds_count"]; c > 0 {
		fmt.Fprintf(&b, ", store commit mean %.1f ms over %.0f writes", 1000*m["kiln_store_commit_seconds_sum"]/c, c)
	}
	for _, k := range keys {
		if k == "kiln_store_last_index" {
			continue
		}
		fmt.Fprintf(&b, " %s=%.0f", strings.TrimPrefix(k, "kiln_"), m[k])
	}
	return b.String()
}
