package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics of the API. Every metric is listed in METRICS.md. Labels are
// bounded: route is the registered template (e.g. /v1/machines/:id), never
// the raw path; method is one of the registered methods or "other"; there is
// no host label.
type metrics struct {
	requests     *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	authFailures *prometheus.CounterVec
	uploadBytes  prometheus.Counter
}

func newMetrics(reg *prometheus.Registry) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_api_requests_total",
			Help: "API requests served, by method, route template and HTTP status code.",
		}, []string{"method", "route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kiln_api_request_seconds",
			Help:    "API request latency in seconds (long-polls and uploads included), by method and route template.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"method", "route"}),
		authFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kiln_api_auth_failures_total",
			Help: "Requests refused by authentication or authorisation, by reason (missing, unknown, role, agent_machine, agent_unverified, first_boot).",
		}, []string{"reason"}),
		uploadBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kiln_api_image_upload_bytes_total",
			Help: "Bytes of image uploads read from clients.",
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.authFailures, m.uploadBytes} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{"missing", "unknown", "role", "agent_machine", "agent_unverified", "first_boot"} {
		m.authFailures.WithLabelValues(r)
	}
	return m, nil
}

var knownMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
}

// middleware records request count and latency. It runs the error handler
// itself so the recorded status is the one sent.
func (m *metrics) middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		route := c.Path()
		if route == "" {
			route = "unmatched"
		}
		method := c.Request().Method
		if !knownMethods[method] {
			method = "other"
		}
		m.requests.WithLabelValues(method, route, strconv.Itoa(c.Response().Status)).Inc()
		m.duration.WithLabelValues(method, route).Observe(time.Since(start).Seconds())
		return nil
	}
}
