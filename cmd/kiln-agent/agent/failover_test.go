package agent

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"kiln/api/agentapi"
)

// deadURL is an http URL on which nothing listens (connection refused).
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// TestReportFailsOverAndOutlastsOutage (issue 12 item 6): the agent's node
// stops answering; a step report goes to another node of the cluster (the
// endpoints a task listed), and, with no other node, is retried through an
// outage longer than the fixed retries until the node answers again. A 4xx
// is final.
func TestReportFailsOverAndOutlastsOutage(t *testing.T) {
	var mu sync.Mutex
	var got []agentapi.Report
	down := atomic.Bool{}
	status := atomic.Int32{}
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "store catching up", http.StatusServiceUnavailable)
			return
		}
		if c := status.Load(); c != 0 {
			http.Error(w, "no", int(c))
			return
		}
		var rep agentapi.Report
		_ = json.NewDecoder(r.Body).Decode(&rep)
		mu.Lock()
		got = append(got, rep)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer other.Close()

	a, err := New(Config{URL: deadURL(t), MachineID: "m-1", Token: "t", Retries: 2,
		RetryBase: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, ReportFor: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a.addEndpoints([]string{other.URL + "/"})
	a.attempt.Store(2)
	ctx := context.Background()
	if err := a.report(ctx, agentapi.Report{Step: agentapi.StepWrite, State: agentapi.StateFailed, Reason: agentapi.ReasonImageFetchFailed}); err != nil {
		t.Fatalf("report with its node gone: %v", err)
	}
	if a.endpoint() != other.URL {
		t.Fatalf("endpoint in use %s, want %s", a.endpoint(), other.URL)
	}

	// The other node answers 503 for 1.5 s (more than Retries×RetryMax): the report waits it out.
	down.Store(true)
	go func() { time.Sleep(1500 * time.Millisecond); down.Store(false) }()
	start := time.Now()
	if err := a.report(ctx, agentapi.Report{Step: agentapi.StepWrite, State: agentapi.StateStarted}); err != nil {
		t.Fatalf("report through a 1.5 s outage: %v", err)
	}
	if took := time.Since(start); took < time.Second {
		t.Fatalf("report acknowledged after %s, during the outage", took)
	}
	mu.Lock()
	if len(got) != 2 || got[0].Attempt != 2 || got[0].MachineID != "m-1" || got[1].State != agentapi.StateStarted {
		t.Fatalf("reports received %+v", got)
	}
	mu.Unlock()

	// A refusal is final: no retry for ReportFor.
	status.Store(http.StatusForbidden)
	start = time.Now()
	if err := a.report(ctx, agentapi.Report{Step: agentapi.StepWrite, State: agentapi.StateRunning}); err == nil || time.Since(start) > time.Second {
		t.Fatalf("403: err %v after %s", err, time.Since(start))
	}
}

func TestImageURLsOnEveryEndpoint(t *testing.T) {
	a, err := New(Config{URL: "http://10.0.0.1:8080/", MachineID: "m", Endpoints: []string{"http://10.0.0.2:8080", "ftp://x", "http://10.0.0.1:8080"}})
	if err != nil {
		t.Fatal(err)
	}
	got := a.imageURLs("http://10.0.0.1:8080/images/a.raw")
	if len(got) != 2 || got[0] != "http://10.0.0.1:8080/images/a.raw" || got[1] != "http://10.0.0.2:8080/images/a.raw" {
		t.Fatalf("image urls %v", got)
	}
	if got := a.imageURLs("http://elsewhere/images/a.raw"); len(got) != 1 {
		t.Fatalf("foreign image url: %v", got)
	}
	if got := a.imageURLs("http://10.0.0.1:80800/images/a.raw"); len(got) != 1 {
		t.Fatalf("prefix without a path boundary: %v", got)
	}
}
