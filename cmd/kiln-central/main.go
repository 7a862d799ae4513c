// Command kiln-central is the central puller: it follows N Kiln sites'
// GET /v1/events with durable cursors (a bbolt file; a restart resumes
// with no gap and no duplicate), pulls GET /v1/site/status, backs off on
// errors, resyncs from status on 410 cursor_expired, and serves each
// site's lag at GET /v1/central/sites (appliance/central).
//
//	kiln-central -config central.json [-listen ADDR | -listen unix:PATH] [-report 5s]
//
// central.json is central.Config: {"state":"/var/lib/kiln-central/state.db",
// "sites":[{"name":"site-1","server":"https://10.0.1.2:7480","token_file":"/etc/kiln-central/site-1.token"}]}.
// With -report, one line per site is printed every interval:
// "central: site S cursor C events E lag L s reachable R errors N resyncs K".
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"kiln/appliance/central"
)

func main() {
	cfgPath := flag.String("config", "", "central.Config as JSON (required)")
	listen := flag.String("listen", "", "serve GET /v1/central/sites here: HOST:PORT or unix:PATH (none when empty)")
	report := flag.Duration("report", 0, "print each site's lag every interval (0: never)")
	flag.Parse()
	if err := run(*cfgPath, *listen, *report); err != nil {
		fmt.Fprintln(os.Stderr, "kiln-central:", err)
		os.Exit(1)
	}
}

func run(cfgPath, listen string, report time.Duration) error {
	if cfgPath == "" {
		return fmt.Errorf("-config is required")
	}
	b, err := os.ReadFile(cfgPath)
	if err != nil {
		return err
	}
	var cfg central.Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("%s: %w", cfgPath, err)
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := central.Open(cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if listen != "" {
		network, addr := "tcp", listen
		if strings.HasPrefix(listen, "unix:") {
			network, addr = "unix", strings.TrimPrefix(listen, "unix:")
			_ = os.Remove(addr)
		}
		ln, err := net.Listen(network, addr)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: p.Handler(), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
	}
	if report > 0 {
		go func() {
			t := time.NewTicker(report)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					for _, l := range p.Lag() {
						fmt.Printf("central: site %s cursor %d events %d lag %.1f s reachable %v errors %d resyncs %d\n",
							l.Site, l.Cursor, l.Events, l.LagSeconds, l.Reachable, l.Errors, l.Resyncs)
					}
				}
			}
		}()
	}
	return p.Run(ctx)
}
