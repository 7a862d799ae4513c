package fleetsim

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// watcher follows Kiln's event feed (GET /v1/events?after=…&wait=…) and
// records each machine's transitions; a machine that becomes available is
// handed to the provisioner, which claims it (POST /v1/machines/{id}/provision).
type watcher struct {
	f       *fleet
	changed chan struct{}
	avail   chan *machine

	mu                          sync.Mutex
	provisioned, failed, availN int
	done                        map[string]bool
	// log, when set (day 2), receives every transition.
	log *transitionLog
}

func newWatcher(f *fleet) *watcher {
	return &watcher{f: f, changed: make(chan struct{}, 1), avail: make(chan *machine, len(f.machines)), done: map[string]bool{}}
}

func (w *watcher) finished() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.done) >= len(w.f.machines)
}

// availableN is how many machines have been available at least once.
func (w *watcher) availableN() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.availN
}

func (w *watcher) provisionedN() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.provisioned
}

func (w *watcher) counts() (provisioned, failed, available int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.provisioned, w.failed, w.availN
}

func (w *watcher) follow(ctx context.Context) {
	var after uint64
	for ctx.Err() == nil {
		var el struct {
			Events []struct {
				Index   uint64    `json:"index"`
				Time    time.Time `json:"time"`
				Subject string    `json:"subject"`
				Kind    string    `json:"kind"`
				To      string    `json:"to"`
				Reason  string    `json:"reason"`
				Message string    `json:"message"`
			} `json:"events"`
			Next uint64 `json:"next"`
		}
		q := url.Values{"after": {strconv.FormatUint(after, 10)}, "limit": {"1000"}, "wait": {"20s"}}
		if err := w.f.do(ctx, "GET", "/v1/events", q, nil, "", &el); err != nil {
			if ctx.Err() == nil {
				w.f.say("fleet: events: %v", err)
				sleepCtx(ctx, time.Second)
			}
			continue
		}
		for _, e := range el.Events {
			after = max(after, e.Index)
			if e.Kind != "transition" || !strings.HasPrefix(e.Subject, "machine/") {
				continue
			}
			m := w.f.byID[strings.TrimPrefix(e.Subject, "machine/")]
			if m == nil {
				continue
			}
			w.transition(m, e.To, e.Reason+": "+e.Message, e.Time)
		}
		if el.Next > after {
			after = el.Next
		}
	}
}

func (w *watcher) transition(m *machine, to, why string, at time.Time) {
	if w.log != nil {
		w.log.add(m, to, at)
	}
	if to == "quarantined" && w.f.att.isReferenceRefusal(m) {
		go w.f.approveReference(w.f.ctx, w, m) // expected: not a failure
		return
	}
	m.mu.Lock()
	if to == "available" && m.reclaim {
		m.reclaim = false
		m.mu.Unlock()
		w.avail <- m // the reference, inspected again after its state was approved
		return
	}
	var first bool
	switch to {
	case "available":
		first = m.t.available.IsZero()
		if first {
			m.t.available = at
		}
	case "provisioned":
		first = m.t.provisioned.IsZero()
		if first {
			m.t.provisioned = at
		}
	case "failed", "quarantined":
		first = m.t.failed.IsZero()
		if first {
			m.t.failed = at
			m.t.failReason = to + " " + why
		}
	}
	m.mu.Unlock()
	if !first {
		return
	}
	w.mu.Lock()
	switch to {
	case "available":
		w.availN++
	case "provisioned":
		if !w.done[m.id] {
			w.provisioned++
			w.done[m.id] = true
		}
	case "failed", "quarantined":
		if !w.done[m.id] {
			w.failed++
			w.done[m.id] = true
			w.f.say("fleet: %s %s %s", m.name, to, why)
		}
	}
	w.mu.Unlock()
	if to == "available" {
		w.avail <- m
	}
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// provisioner claims each available machine with the run's image, eight at a time.
func (w *watcher) provisioner(ctx context.Context) {
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case m := <-w.avail:
					if w.f.att.hold(m) {
						continue
					}
					body := map[string]any{"claim": map[string]any{"image": w.f.imageID, "hostname": m.name,
						"role": "worker", "labels": map[string]string{"fleet": "sim"}}, "reason": "fleet"}
					if err := w.f.do(ctx, "POST", "/v1/machines/"+m.id+"/provision", nil, body, "", nil); err != nil && ctx.Err() == nil &&
						!w.claimed(ctx, m, err) {
						m.setErr(err)
						w.f.say("fleet: provision %s: %v", m.name, err)
					}
				}
			}
		}()
	}
	wg.Wait()
}

// claimed reports whether a claim that ended in err (409) was committed
// after all: sent to a node that died before it answered, then sent again
// to another node, which found the machine no longer available; or the
// machine holds its claim still (the attestation reference, inspected
// again after its refusal: Kiln builds it again on the same claim).
func (w *watcher) claimed(ctx context.Context, m *machine, err error) bool {
	var ae *apiError
	if !errors.As(err, &ae) || ae.Status != 409 {
		return false
	}
	var mm struct {
		State string          `json:"state"`
		Claim json.RawMessage `json:"claim"`
	}
	if w.f.do(ctx, "GET", "/v1/machines/"+m.id, nil, nil, "", &mm) != nil {
		return false
	}
	return mm.State != "available" || len(mm.Claim) > 0 && string(mm.Claim) != "null"
}
