package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"kiln/deploy/lab/vbmc/vbmc"
	"kiln/store"
)

type onOff struct {
	mu sync.Mutex
	on bool
}

func (p *onOff) PowerOn(string, string) error { p.mu.Lock(); p.on = true; p.mu.Unlock(); return nil }
func (p *onOff) PowerOff() error              { p.mu.Lock(); p.on = false; p.mu.Unlock(); return nil }
func (p *onOff) PoweredOn() bool              { p.mu.Lock(); defer p.mu.Unlock(); return p.on }

// The appliance wires the BMC health poll: a machine whose enrolled
// (virtual Redfish) BMC starts reporting Critical gets the condition
// bmc_system Critical, source bmc, with the SEL entry's message, read by
// bmc.Controller.Health with the sealed credential; GET /v1/remediation
// answers on the node.
func TestApplianceHealthPoll(t *testing.T) {
	n := startNode(t, "kiln-health", nil, func(c *Config) {
		c.Remediation.Health = HealthPollConfig{Interval: 200 * time.Millisecond, Backoff: 200 * time.Millisecond, MaxBackoff: time.Second}
	})
	n.waitReady(t)
	v, err := vbmc.New(vbmc.Config{Listen: "127.0.0.1:0", Username: "admin", Password: "Health-Secret-7",
		Systems: []vbmc.SystemConfig{{ID: "1", Serial: "SN-H-1", MACs: []string{"52:54:00:48:00:01"}, Power: &onOff{}}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = v.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	t.Cleanup(func() { cancel(); <-done })

	m, err := n.app.Store.PutMachine(context.Background(), store.Machine{Name: "h-1",
		Intended: store.Hardware{Serial: "SN-H-1", NICs: []store.NIC{{MAC: "52:54:00:48:00:01"}}}}, store.W{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"address": v.Addr(), "driver": "redfish", "username": "admin",
		"password": "Health-Secret-7", "ca_cert_pem": string(v.CACertPEM())})
	req, _ := http.NewRequest("POST", "http://"+n.cfg.API.Addr+"/v1/machines/"+m.ID+"/bmc", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+n.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("enroll: %d", resp.StatusCode)
	}
	if err := v.SetHealth("1", vbmc.HealthUpdate{System: "Critical", Event: "Power Supply 2 failure detected"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, err := n.app.Store.GetMachine(m.ID)
		if err != nil {
			t.Fatal(err)
		}
		var hit *store.HealthCondition
		for i, h := range got.Health {
			if h.Type == "bmc_system" {
				hit = &got.Health[i]
			}
		}
		if hit != nil && hit.Status == store.HealthCritical && hit.Source == store.HealthSourceBMC && hit.Message == "Power Supply 2 failure detected" {
			t.Logf("machine %s (state %s): %s %s %q", got.ID, got.State, hit.Type, hit.Status, hit.Message)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no bmc_system Critical condition after 15 s: state %s health %+v", got.State, got.Health)
		}
		time.Sleep(50 * time.Millisecond)
	}
	req, _ = http.NewRequest("GET", "http://"+n.cfg.API.Addr+"/v1/remediation", nil)
	req.Header.Set("Authorization", "Bearer "+n.token)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if resp.StatusCode != 200 || st["mode"] != "auto" {
		t.Fatalf("GET /v1/remediation: %d %v", resp.StatusCode, st)
	}
}
