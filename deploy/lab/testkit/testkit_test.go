package testkit

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/deploy/lab/testreq"
)

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
	testreq.Root(t, "network namespaces", "ip", "curl", "timeout")
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

func TestFreePortsBelowEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	seen := map[int]bool{}
	for _, p := range append(FreePorts(t, 20), FreePorts(t, 20)...) {
		if p < portFloor || p >= low {
			t.Fatalf("port %d outside %d..%d", p, portFloor, low-1)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}
