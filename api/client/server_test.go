package client_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/api"
	"kiln/api/client"
	"kiln/appliance/lifecycle"
	"kiln/appliance/lifecycle/lifecycletest"
	"kiln/store"
)

// Tokens of the test server, one per role.
const (
	adminTok    = "client-test-admin"
	operatorTok = "client-test-operator"
	viewerTok   = "client-test-viewer"
)

// env is a real api.Server over the real domain (lifecycletest: the
// lifecycle controller and its service over the real store,
// storetest.NewLocal, a real image catalog and sealer), wired as the
// appliance wires them, on an httptest listener.
type env struct {
	t   *testing.T
	d   *lifecycletest.Domain
	st  *store.Store
	url string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	// Manual inspection: no machine is powered (there is no BMC here).
	d := lifecycletest.New(t, func(c *lifecycle.Config) { c.Inspection = lifecycle.InspectManual })
	srv, err := api.New(api.Config{
		Tokens: []api.TokenSpec{
			{Name: "admin", Role: api.RoleAdmin, SHA256: api.HashToken(adminTok)},
			{Name: "operator", Role: api.RoleOperator, SHA256: api.HashToken(operatorTok)},
			{Name: "viewer", Role: api.RoleViewer, SHA256: api.HashToken(viewerTok)},
		},
		ErrorClasses: lifecycletest.ErrorClasses(),
	}, d.Backend(), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &env{t: t, d: d, st: d.Store, url: hs.URL}
}

// client returns a Client of the server with token.
func (e *env) client(token string) *client.Client {
	e.t.Helper()
	c, err := client.New(client.Config{Server: e.url, Token: token})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// machineIn writes a machine straight to the store and walks it through
// the lifecycle's transitions to state (test set-up: the store checks each
// transition, store.CanTransition).
func (e *env) machineIn(name, mac string, labels map[string]string, state store.MachineState) store.Machine {
	e.t.Helper()
	ctx := context.Background()
	m, err := e.st.PutMachine(ctx, store.Machine{Name: name, State: store.StateRegistered, Labels: labels,
		Intended: store.Hardware{NICs: []store.NIC{{MAC: mac}}}}, store.W{Actor: "test"})
	if err != nil {
		e.t.Fatal(err)
	}
	path := map[store.MachineState][]store.MachineState{
		store.StateAvailable:   {store.StateInspecting, store.StateAvailable},
		store.StateProvisioned: {store.StateInspecting, store.StateAvailable, store.StateProvisioning, store.StateProvisioned},
	}[state]
	for _, s := range path {
		m.State = s
		if m, err = e.st.PutMachine(ctx, m, store.W{Actor: "test"}); err != nil {
			e.t.Fatalf("%s → %s: %v", name, s, err)
		}
	}
	return m
}
