package testkit

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Sample gathers g and returns the value of metric name summed over every
// series whose labels include each pair of labels, given as name, value,
// name, value… (none: every series). A series counts as its counter's,
// gauge's or untyped value, or its histogram's or summary's sample count.
// It returns 0 when no series matches, and fails t on a gather error or an
// odd number of label arguments.
func Sample(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	var sum float64
	for _, m := range series(t, g, name, labels) {
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		case m.Summary != nil:
			sum += float64(m.GetSummary().GetSampleCount())
		}
	}
	return sum
}

// Series gathers g and returns how many series metric name has whose labels
// include each pair of labels (as for Sample).
func Series(t testing.TB, g prometheus.Gatherer, name string, labels ...string) int {
	t.Helper()
	return len(series(t, g, name, labels))
}

func series(t testing.TB, g prometheus.Gatherer, name string, labels []string) []*dto.Metric {
	t.Helper()
	if len(labels)%2 != 0 {
		t.Fatalf("testkit: labels of %s: want name, value pairs, got %q", name, labels)
	}
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("testkit: gather: %v", err)
	}
	var out []*dto.Metric
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := make(map[string]string, len(m.GetLabel()))
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i < len(labels); i += 2 {
				if v, ok := have[labels[i]]; !ok || v != labels[i+1] {
					continue next
				}
			}
			out = append(out, m)
		}
	}
	return out
}
