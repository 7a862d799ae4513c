package dhcp

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics of the dhcp component. Labels are bounded: type is a DHCP message
// type name or "none", arch one of archLabel's values, reason a fixed word.
//
//	kiln_dhcp_requests_total{type,arch}   requests handled
//	kiln_dhcp_replies_total{type,arch}    replies sent
//	kiln_dhcp_drops_total{reason}         requests not answered, by reason
//	                                      (malformed, rate_limited, queue_full, other_server,
//	                                      no_subnet, pool_exhausted, not_pxe, no_boot,
//	                                      proxy_ignored, unsupported_type, field_too_long,
//	                                      persist_error, commit_backlog, send_error, error,
//	                                      not_owner, no_quorum, address_taken: the committer
//	                                      refused the binding and a NAK went instead of the
//	                                      ACK, lease_refused: any other refused change)
//	kiln_dhcp_reply_seconds{type}         receive → reply sent, seconds (includes group commit)
//	kiln_dhcp_lease_commit_seconds        one CommitLeases batch, seconds
//	kiln_dhcp_lease_commit_leases_total   lease changes committed
type metrics struct {
	requests, replies *prometheus.CounterVec
	drops             *prometheus.CounterVec
	latency           *prometheus.HistogramVec
	commit            prometheus.Histogram
	committed         prometheus.Counter
}

func newMetrics(reg *prometheus.Registry) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiln_dhcp_requests_total", Help: "DHCP requests handled, by message type and client arch."}, []string{"type", "arch"}),
		replies:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiln_dhcp_replies_total", Help: "DHCP replies sent, by message type and client arch."}, []string{"type", "arch"}),
		drops:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kiln_dhcp_drops_total", Help: "DHCP requests not answered, by reason."}, []string{"reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kiln_dhcp_reply_seconds", Help: "Time from receiving a request to sending its reply, including the lease group commit, by reply type.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 12)}, []string{"type"}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kiln_dhcp_lease_commit_seconds", Help: "Duration of one CommitLeases batch.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 12)}),
		committed: prometheus.NewCounter(prometheus.CounterOpts{Name: "kiln_dhcp_lease_commit_leases_total", Help: "Lease changes committed."}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.replies, m.drops, m.latency, m.commit, m.committed} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
