package store

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics of the store. All names are kiln_store_*; label sets are bounded
// (command type names, error codes, forward results).
//
//	kiln_store_raft_state                 gauge   0 follower, 1 candidate, 2 leader, 3 shutdown
//	kiln_store_last_index                 gauge   last raft log index on this node
//	kiln_store_commit_index               gauge   raft commit index known to this node
//	kiln_store_applied_index              gauge   last log index applied to fsm.db
//	kiln_store_last_event_index           gauge   raft index of the newest event
//	kiln_store_fsm_halted                 gauge   1 once the FSM stopped at a command type it does not know, else 0
//	kiln_store_commit_seconds             histogram  write latency, submit → applied (leader or forwarded)
//	kiln_store_commands_total{type}       counter  writes submitted on this node, by command type
//	kiln_store_apply_errors_total{code}   counter  commands the FSM refused, by error code
//	kiln_store_forwarded_total{result}    counter  writes forwarded to the leader (ok|error)
type metrics struct {
	commit      prometheus.Histogram
	commands    *prometheus.CounterVec
	applyErrors *prometheus.CounterVec
	forwarded   *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kiln_store_commit_seconds",
			Help:    "Latency of a store write from submit until applied, in seconds.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiln_store_commands_total",
			Help: "Writes submitted on this node, by command type."}, []string{"type"}),
		applyErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiln_store_apply_errors_total",
			Help: "Log entries the FSM refused, by error code."}, []string{"code"}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiln_store_forwarded_total",
			Help: "Writes forwarded to the leader, by result (ok|error)."}, []string{"result"}),
	}
	return m
}

// register adds every store metric to reg (nil = none). Called at the end
// of Open, once raft runs.
func (m *metrics) register(s *Store, reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	for _, c := range []prometheus.Collector{m.commit, m.commands, m.applyErrors, m.forwarded,
		gauge("kiln_store_raft_state", "Raft state: 0 follower, 1 candidate, 2 leader, 3 shutdown.",
			func() float64 { return float64(s.raft.State()) }),
		gauge("kiln_store_last_index", "Last raft log index on this node.",
			func() float64 { return float64(s.raft.LastIndex()) }),
		gauge("kiln_store_commit_index", "Raft commit index known to this node.",
			func() float64 { return float64(s.raft.CommitIndex()) }),
		gauge("kiln_store_applied_index", "Last raft log index applied to the FSM.",
			func() float64 { return float64(s.fsm.applied.Load()) }),
		gauge("kiln_store_last_event_index", "Raft index of the newest event.",
			func() float64 { return float64(s.fsm.lastEvent.Load()) }),
		gauge("kiln_store_fsm_halted", "1 once this node's FSM stopped at a log entry of a command type its binary does not know (it applies nothing further until upgraded and restarted), else 0.",
			func() float64 {
				if s.fsm.halt.Load() != nil {
					return 1
				}
				return 0
			}),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
