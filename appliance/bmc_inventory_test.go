package appliance

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"kiln/deploy/lab/vbmc/vbmc"
	"kiln/store"
)

// Enrolling a Redfish BMC (the lab's virtual BMC, TLS verified with its CA)
// reads its inventory into the machine's discovered fields.
func TestEnrollBMCReadsInventory(t *testing.T) {
	n := startNode(t, "kiln-inv", nil)
	n.waitReady(t)
	v, err := vbmc.New(vbmc.Config{
		Listen: "127.0.0.1:0", Username: "admin", Password: "Inv-Secret-9",
		// A stand-in "VM": the controller's power-on after enrollment starts it.
		QEMUArgs: []string{"/bin/sh", "-c", "exec sleep 5", "fake-vm"},
		StateDir: t.TempDir(), Serial: "SN-INV-0042", Manufacturer: "Acme", Model: "R9000",
		UUID: "5e1f0000-0000-4000-8000-000000000042", MACs: []string{"52:54:00:42:00:01", "52:54:00:42:00:02"},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = v.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(5 * time.Second)
	for v.Addr() == "" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}

	m, err := n.app.Store.PutMachine(context.Background(), store.Machine{Name: "inv-1",
		Intended: store.Hardware{Serial: "SN-INV-0042", NICs: []store.NIC{{MAC: "52:54:00:42:00:01"}}}}, store.W{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"address": v.Addr(), "driver": "redfish", "username": "admin",
		"password": "Inv-Secret-9", "ca_cert_pem": string(v.CACertPEM())})
	req, _ := http.NewRequest("POST", "http://"+n.cfg.API.Addr+"/v1/machines/"+m.ID+"/bmc", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+n.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("enroll: %d %s", resp.StatusCode, rb)
	}
	if strings.Contains(string(rb), "Inv-Secret-9") {
		t.Fatal("the enroll answer returned the password")
	}
	got, err := n.app.Store.GetMachine(m.ID)
	if err != nil {
		t.Fatal(err)
	}
	d := got.Discovered
	if d == nil || d.Serial != "SN-INV-0042" || d.Vendor != "Acme" || d.Model != "R9000" || len(d.NICs) != 2 ||
		d.NICs[1].MAC != "52:54:00:42:00:02" {
		t.Fatalf("discovered after enrollment: %+v", d)
	}
}
