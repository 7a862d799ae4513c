package api_test

import (
	"context"
	"testing"
	"time"

	. "kiln/api"
	"kiln/store"
)

// leaseBackend adds the appliance's LeaseBackend over the harness's store.
type leaseBackend struct {
	Backend
	st *store.Store
}

func (b *leaseBackend) Leases() (string, []store.Lease, error) {
	ls, err := b.st.AddressLeases()
	return b.st.NodeID(), ls, err
}

// TestLeasesRoute: GET /v1/leases (viewer) lists the bindings committed
// through the store's bind_leases (the refused one absent), with ?consistent=true too;
// a backend without leases answers 400 invalid, and no token 401.
func TestLeasesRoute(t *testing.T) {
	if testing.Short() {
		t.Skip("short: starts a raft store")
	}
	lb := &leaseBackend{}
	h := newHarness(t, func(b Backend) Backend { lb.Backend = b; return lb })
	lb.st = h.st
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	errs, err := h.st.BindLeases(context.Background(), []store.Lease{
		{MAC: "52:54:00:aa:00:01", IP: "10.99.0.100", Expiry: exp, State: store.LeaseBound},
		{MAC: "52:54:00:aa:00:02", IP: "10.99.0.101", Expiry: exp, State: store.LeaseBound},
		{MAC: "52:54:00:aa:00:03", IP: "10.99.0.100", Expiry: exp, State: store.LeaseBound}, // taken: refused
	})
	if err != nil || errs[0] != nil || errs[1] != nil || errs[2] == nil {
		t.Fatalf("bind: %v %v", errs, err)
	}
	for _, q := range []string{"", "?consistent=true"} {
		var ll LeaseList
		h.do("GET", "/v1/leases"+q, viewerTok, nil).into(t, &ll)
		if ll.Node == "" || len(ll.Items) != 2 {
			t.Fatalf("GET /v1/leases%s: %+v", q, ll)
		}
		for i, want := range [][2]string{{"52:54:00:aa:00:01", "10.99.0.100"}, {"52:54:00:aa:00:02", "10.99.0.101"}} {
			if l := ll.Items[i]; l.MAC != want[0] || l.IP != want[1] || l.State != store.LeaseBound || !l.Expiry.Equal(exp) {
				t.Errorf("lease %d: %+v, want %s at %s bound until %s", i, l, want[0], want[1], exp)
			}
		}
	}
	h.want(h.do("GET", "/v1/leases?consistent=maybe", viewerTok, nil), 400, "invalid")
	h.want(h.do("GET", "/v1/leases", "", nil), 401, "")

	plain := newHarness(t)
	plain.want(plain.do("GET", "/v1/leases", viewerTok, nil), 400, "invalid")
}
