// Package lifecycletest builds the real domain for tests of its clients
// (the REST API, the kiln CLI): a lifecycle controller and its Service over
// a real store, a real image catalog and a real credential sealer in the
// test's temporary directory. No part of it is a fake.
package lifecycletest

import (
	"crypto/rand"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"kiln/api"
	"kiln/appliance"
	"kiln/appliance/lifecycle"
	"kiln/bmc"
	"kiln/httpboot"
	"kiln/store"
	"kiln/store/storetest"
)

// Domain is the real domain of one appliance node.
type Domain struct {
	Store      *store.Store
	Controller *lifecycle.Controller
	Service    *lifecycle.Service
	Catalog    *httpboot.Catalog
	Sealer     *bmc.Sealer
	Registry   *prometheus.Registry // the controller's metrics
}

// New opens a store (storetest.NewLocal: the real apply path over a bbolt
// file in t's temporary directory, no raft; always leader), an image
// catalog beside it, a sealer with a
// random site key, and a controller over them with ImageBaseURL
// http://127.0.0.1:8080, no BMC and the package defaults otherwise; mod
// edits the controller's Config first. The controller's loop is not
// started (tests drive it). Everything stops when t ends.
func New(t testing.TB, mod ...func(*lifecycle.Config)) *Domain {
	t.Helper()
	st := storetest.NewLocal(t)
	cat, err := httpboot.OpenCatalog(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	sealer, err := bmc.NewSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	cfg := lifecycle.Config{ImageBaseURL: "http://127.0.0.1:8080", Sealer: appliance.SealerFor(sealer),
		Catalog: appliance.CatalogFor(cat)}
	for _, m := range mod {
		m(&cfg)
	}
	reg := prometheus.NewRegistry()
	life, err := lifecycle.New(cfg, st, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	return &Domain{Store: st, Controller: life, Service: lifecycle.NewService(life, st), Catalog: cat, Sealer: sealer,
		Registry: reg}
}

// Backend is the REST API's backend over d as the appliance wires it
// (appliance.NewAPIBackend), reporting version "test".
func (d *Domain) Backend() api.Backend { return appliance.NewAPIBackend(d.Service, d.Store, "test") }

// ErrorClasses is the appliance's table of the domain's errors for the
// REST API (appliance.ErrorClasses), for tests that serve the API over
// the domain the way the appliance does.
func ErrorClasses() []api.ErrorClass { return appliance.ErrorClasses() }
