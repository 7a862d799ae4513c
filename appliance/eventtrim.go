package appliance

import (
	"context"
	"log/slog"
	"time"

	"kiln/store"
)

// eventTrimmer applies the event log's retention (EventsConfig): every
// cfg.TrimEvery, on the leader only, it computes the bound from this
// replica's events (store.EventTrimPoint) and writes one trim_events
// command (store.TrimEvents), which every replica applies alike. A failed
// trim is logged and retried at the next tick (a trim is idempotent and
// the bound only grows).
type eventTrimmer struct {
	st  *store.Store
	cfg EventsConfig
	now func() time.Time
}

// trimOnce runs one retention pass; it returns the bound written (0: none).
func (t *eventTrimmer) trimOnce(ctx context.Context) (uint64, error) {
	if !t.st.IsLeader() {
		return 0, nil
	}
	before, err := t.st.EventTrimPoint(t.now(), max(t.cfg.MaxAge, 0), max(t.cfg.MaxCount, 0))
	if err != nil || before == 0 {
		return 0, err
	}
	return before, t.st.TrimEvents(ctx, before, store.W{Actor: "controller:retention", Reason: "events_retention"})
}

// Run trims every TrimEvery until ctx ends.
func (t *eventTrimmer) Run(ctx context.Context, log *slog.Logger) error {
	log = log.With("component", "retention")
	tick := time.NewTicker(t.cfg.TrimEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if before, err := t.trimOnce(ctx); err != nil {
			log.Warn("event retention: trim failed; retrying at the next tick", "err", err)
		} else if before > 0 {
			log.Info("event retention: trimmed events", "before_index", before)
		}
	}
}
