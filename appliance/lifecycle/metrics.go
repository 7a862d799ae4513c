// The controller's Prometheus metrics (listed in doc.go).

package lifecycle

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	machines    *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	steps       *prometheus.HistogramVec
	jobs        *prometheus.CounterVec
	discDropped *prometheus.CounterVec
	bootHolds   *prometheus.CounterVec
}

// newMetrics builds the controller's metrics and registers them on reg (nil: unregistered).
// Label sets are bounded: states, step names and job kinds are closed sets.
func newMetrics(reg *prometheus.Registry) (*metrics, error) {
	m := &metrics{
		machines: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kiln_lifecycle_machines",
			Help: "Machines by lifecycle state (refreshed by the leader's loop).",
		}, []string{"state"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_lifecycle_transitions_total",
			Help: "Machine state transitions written by this controller, by from and to state.",
		}, []string{"from", "to"}),
		steps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kiln_lifecycle_step_seconds",
			Help:    "Duration of agent steps from started to succeeded/failed, in seconds.",
			Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 2400, 3600, 7200, 14400},
		}, []string{"step", "result"}),
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_lifecycle_jobs_total",
			Help: "BMC jobs finished, by kind and result (succeeded|failed).",
		}, []string{"kind", "result"}),
		discDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_lifecycle_discoveries_dropped_total",
			Help: "Unknown MACs BootFor did not record as discovered, by reason (rate: discovery rate limit; cap: MaxDiscovered reached).",
		}, []string{"reason"}),
		bootHolds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_lifecycle_boots_held_total",
			Help: "Netboots answered with ErrAgentActive (retry later) instead of a new token, by reason (agent_active|unknown|raced).",
		}, []string{"reason"}),
	}
	for _, r := range []string{dropRate, dropCap} {
		m.discDropped.WithLabelValues(r)
	}
	for _, r := range []string{holdAgentActive, holdUnknown, holdRaced} {
		m.bootHolds.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.machines, m.transitions, m.steps, m.jobs, m.discDropped, m.bootHolds} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, errors.Join(ErrConfig, err)
			}
			return nil, err
		}
	}
	return m, nil
}
