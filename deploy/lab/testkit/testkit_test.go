package testkit

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// skipRecorder is a testing.TB whose Skipf records the message and ends the
// goroutine, as the real one does.
type skipRecorder struct {
	testing.TB
	msg string
}

func (s *skipRecorder) Helper() {}
func (s *skipRecorder) Skipf(format string, args ...any) {
	s.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// skipped runs fn with a recorder and returns the skip message ("" when fn
// returned without skipping).
func skipped(t *testing.T, fn func(testing.TB)) string {
	r := &skipRecorder{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); fn(r) }()
	<-done
	return r.msg
}

// missing is a program that is on no PATH: a path into an empty directory.
func missing(t *testing.T) string { return filepath.Join(t.TempDir(), "kiln-no-such-program") }

func TestNeedBins(t *testing.T) {
	if msg := skipped(t, func(tb testing.TB) { NeedBins(tb, "sh") }); msg != "" {
		t.Fatalf("sh is on PATH, skipped: %s", msg)
	}
	absent := missing(t)
	msg := skipped(t, func(tb testing.TB) { NeedBins(tb, "sh", absent) })
	if !strings.Contains(msg, "needs "+absent+" on PATH") {
		t.Fatalf("skip message %q does not name the missing program", msg)
	}
}

func TestNeedRoot(t *testing.T) {
	absent := missing(t)
	msg := skipped(t, func(tb testing.TB) { NeedRoot(tb, "network namespaces", absent) })
	if os.Geteuid() != 0 {
		if want := fmt.Sprintf("needs root for network namespaces (running as uid %d)", os.Geteuid()); msg != want {
			t.Fatalf("skip message %q, want %q", msg, want)
		}
		return
	}
	if !strings.Contains(msg, "needs "+absent+" on PATH") {
		t.Fatalf("root, missing program: skip message %q", msg)
	}
	if msg := skipped(t, func(tb testing.TB) { NeedRoot(tb, "network namespaces", "sh") }); msg != "" {
		t.Fatalf("root with sh on PATH, skipped: %s", msg)
	}
}

func TestSample(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_ops_total"}, []string{"op", "result"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "t_active"})
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "t_seconds"}, []string{"step"})
	reg.MustRegister(c, g, h)
	c.WithLabelValues("get", "ok").Add(3)
	c.WithLabelValues("get", "error").Add(2)
	c.WithLabelValues("put", "ok").Add(5)
	g.Set(7)
	h.WithLabelValues("write").Observe(1)
	h.WithLabelValues("write").Observe(2)
	h.WithLabelValues("verify").Observe(1)
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
		series int
	}{
		{"t_ops_total", []string{"op", "get", "result", "ok"}, 3, 1},
		{"t_ops_total", []string{"op", "get"}, 5, 2},
		{"t_ops_total", nil, 10, 3},
		{"t_ops_total", []string{"op", "delete"}, 0, 0},
		{"t_ops_total", []string{"nolabel", ""}, 0, 0}, // a label the series lack matches nothing
		{"t_active", nil, 7, 1},
		{"t_seconds", []string{"step", "write"}, 2, 1},
		{"t_seconds", nil, 3, 2},
		{"t_missing", nil, 0, 0},
	} {
		if got := Sample(t, reg, tc.name, tc.labels...); got != tc.want {
			t.Errorf("Sample(%s, %q) = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
		if got := Series(t, reg, tc.name, tc.labels...); got != tc.series {
			t.Errorf("Series(%s, %q) = %d, want %d", tc.name, tc.labels, got, tc.series)
		}
	}
}

// TestLink creates a Link, checks both ends carry their addresses and reach
// each other, and that cleanup removes the namespace and the host end.
func TestLink(t *testing.T) {
	NeedRoot(t, "network namespaces", "ip", "curl", "timeout")
	var l Link
	t.Run("up", func(t *testing.T) {
		l = NewLink(t, "kbt-k", netip.MustParsePrefix("10.72.9.0/24"), 1400)
		if l.HostIP != "10.72.9.1" || l.NSIP != "10.72.9.2" {
			t.Fatalf("addresses %+v", l)
		}
		out, err := exec.Command("ip", "-o", "addr", "show", "dev", l.HostIf).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "10.72.9.1/24") {
			t.Fatalf("host end %s: %v %s", l.HostIf, err, out)
		}
		out, err = exec.Command("ip", "-n", l.NS, "link", "show", l.NSIf).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "mtu 1400") {
			t.Fatalf("namespace end %s: %v %s", l.NSIf, err, out)
		}
		// A server in the test process on the host end answers a real client in the namespace.
		ln, err := net.Listen("tcp", l.HostIP+":0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello %s", r.RemoteAddr)
		})}
		go srv.Serve(ln)
		defer srv.Close()
		got, err := l.Exec(10*time.Second, "", "curl", "-sS", "http://"+ln.Addr().String()+"/")
		if err != nil || !strings.HasPrefix(got, "hello "+l.NSIP+":") {
			t.Fatalf("curl from %s to %s: %v\n%s", l.NS, ln.Addr(), err, got)
		}
	})
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), l.NS) {
		t.Errorf("namespace %s left after cleanup", l.NS)
	}
	if err := exec.Command("ip", "link", "show", l.HostIf).Run(); err == nil {
		t.Errorf("host end %s left after cleanup", l.HostIf)
	}
}
