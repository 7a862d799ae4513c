package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"kiln/store"
)

// The lease route (viewer): the DHCPv4 leases of this node's replica of
// the store (its address view: one record per address, the last state the
// log committed for it). The backend serves it when it
// implements LeaseBackend (the appliance's does, appliance/adapters.go).
//
//	GET /v1/leases[?consistent=true]   → 200 LeaseList

// LeaseBackend reads the leases of this node's replica and names the node.
type LeaseBackend interface {
	// Leases returns this node's ID and the address view
	// (store.Store.AddressLeases: one record per address, its last
	// committed state, ordered by the address text; expired and released
	// records included).
	Leases() (node string, ls []store.Lease, err error)
}

// Lease is one DHCPv4 lease (RFC 2131) as committed through the log: MAC
// (lower-case, colon-separated), IPv4 address, the expiry fixed by the
// node that ACKed it (UTC), and its state: bound, declined (RFC 2131
// §3.1.5: the address is in use by something else) or released.
type Lease struct {
	MAC      string    `json:"mac"`
	IP       string    `json:"ip"`
	Hostname string    `json:"hostname,omitempty"`
	Expiry   time.Time `json:"expiry"`
	State    string    `json:"state"`
}

// LeaseList is GET /v1/leases: one item per address the log has seen, in
// address-text order; a lease is live while it is bound or declined and
// its expiry is ahead of Time. Node names the node whose replica
// answered; Time is that node's clock.
type LeaseList struct {
	Node  string    `json:"node"`
	Time  time.Time `json:"time"`
	Items []Lease   `json:"items"`
}

// errNoLeases: the backend keeps no leases.
var errNoLeases = fmt.Errorf("%w: this server's backend has no DHCP leases", ErrInvalid)

func (s *Server) leaseRoutes(view echo.MiddlewareFunc) {
	s.e.GET("/v1/leases", s.listLeases, view)
}

// leaseDocOps documents the lease route (appended to docOps).
func leaseDocOps() []docOp {
	return []docOp{{Method: "GET", Path: "/v1/leases",
		Summary: "This node's DHCPv4 leases, one per address, as committed through the log",
		Role:    RoleViewer, Query: []docParam{pConsistent}, Status: 200, Resp: LeaseList{}}}
}

func (s *Server) listLeases(c echo.Context) error {
	lb, ok := s.b.(LeaseBackend)
	if !ok {
		return errNoLeases
	}
	if err := s.maybeBarrier(c); err != nil {
		return err
	}
	node, ls, err := lb.Leases()
	if err != nil {
		return err
	}
	out := LeaseList{Node: node, Time: time.Now().UTC(), Items: leaseViews(ls)}
	return c.JSON(http.StatusOK, out)
}

func leaseViews(ls []store.Lease) []Lease {
	out := make([]Lease, 0, len(ls))
	for _, l := range ls {
		out = append(out, Lease{MAC: l.MAC, IP: l.IP, Hostname: l.Hostname, Expiry: l.Expiry.UTC(), State: l.State})
	}
	return out
}
