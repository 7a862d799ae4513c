package store

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"go.etcd.io/bbolt"
)

// Leases through the log: the address view and its invariant.
//
// bLeaseAddrs holds one record per IPv4 address (key: the address in dotted
// text), the last committed state of that address. CmdBindLeases (18) is the
// only command that decides who may take an address: it refuses a binding
// or a decline for an address that another client holds unexpired, judged
// at the command's leader-fixed time. The per-MAC bucket bLeases is the
// view of the older CmdPutLeases (10), kept so that old logs replay as they
// did; command 10 also records into the address view (legacySupersedes), and
// a snapshot written before the address view existed gets it rebuilt on
// Restore, so a binding made before an upgrade is still known after it.

// Lease states (Lease.State).
const (
	// LeaseBound: IP is bound to MAC until Expiry.
	LeaseBound = "bound"
	// LeaseReleased: the client gave IP back (RFC 2131 §4.4.6); it is free.
	LeaseReleased = "released"
	// LeaseDeclined: MAC reported IP in use by someone else (DHCPDECLINE,
	// RFC 2131 §4.3.3); nobody may take it until Expiry.
	LeaseDeclined = "declined"
)

var bLeaseAddrs = []byte("lease_addrs") // key: IPv4 address text → Lease

// AddressTakenError refuses one change of BindLeases: IP is held, unexpired
// at the command's time, by Holder (a binding of another client, or a
// decline of anyone). It unwraps to ErrAddressTaken.
type AddressTakenError struct {
	IP     string
	Holder Lease
}

func (e *AddressTakenError) Error() string {
	return fmt.Sprintf("store: address %s is %s by %s until %s; offer another address",
		e.IP, e.Holder.State, e.Holder.MAC, e.Holder.Expiry.UTC().Format(time.RFC3339))
}

// Unwrap makes errors.Is(err, ErrAddressTaken) true.
func (e *AddressTakenError) Unwrap() error { return ErrAddressTaken }

// leaseOutcome is the result of one change of a CmdBindLeases, one JSON
// value per change in the command's result (so it crosses the forward RPC
// unchanged): the record as stored, or why it was refused.
type leaseOutcome struct {
	Lease  Lease  `json:"lease"`
	Holder *Lease `json:"holder,omitempty"` // refused: the record holding the address
	Error  string `json:"error,omitempty"`  // refused: malformed change (ErrInvalid)
}

// live reports whether l keeps its address from everyone else at now.
func (l *Lease) live(now time.Time) bool {
	return (l.State == LeaseBound || l.State == LeaseDeclined) && l.Expiry.After(now)
}

// addrKey returns the canonical IPv4 text of ip, or ErrInvalid.
func addrKey(ip string) (string, error) {
	a, err := netip.ParseAddr(ip)
	if err != nil || !a.Is4() {
		return "", fmt.Errorf("%w: lease address %q is not an IPv4 address", ErrInvalid, ip)
	}
	return a.String(), nil
}

func getAddr(a *applyCtx, ip string) (*Lease, error) {
	raw := a.tx.Bucket(bLeaseAddrs).Get([]byte(ip))
	if raw == nil {
		return nil, nil
	}
	var cur Lease
	if err := json.Unmarshal(raw, &cur); err != nil {
		return nil, fmt.Errorf("%w: stored lease of %s: %v", ErrCorrupt, ip, err)
	}
	return &cur, nil
}

// putAddr stores l as the record of its address, tells the lease watchers
// (through the transaction's pending index) and appends a "lease" event
// when the address changed holder or state (renewals are not audited).
func putAddr(a *applyCtx, cur *Lease, l Lease) error {
	raw, err := json.Marshal(l)
	if err != nil {
		return err
	}
	if err := a.tx.Bucket(bLeaseAddrs).Put([]byte(l.IP), raw); err != nil {
		return err
	}
	a.ix.leases = append(a.ix.leases, l)
	if cur != nil && cur.MAC == l.MAC && cur.State == l.State {
		return nil
	}
	ev := Event{Subject: "lease/" + l.MAC, Kind: "lease", To: l.State, Message: l.IP}
	if cur != nil && cur.MAC == l.MAC {
		ev.From = cur.State
	}
	return a.event(ev)
}

// CmdBindLeasesV2 (29) is
// CmdBindLeases with one more rule, for releases: a release names the
// binding it ends by that binding's Expiry (the one the releasing node saw),
// and ends the address's record only when the record is that binding. Under
// 18 a release ends whatever binding of the same client the address holds
// when it commits: a client that released an address through one node and
// at once got it again through another (DISCOVER, OFFER of its previous
// address, REQUEST) lost its new binding when the first node's release
// committed late, and the address went to a second client while the first
// held its ACK (found by deploy/lab/leasecheck). The release and the new
// binding are two nodes' commits with nothing ordering them; the binding's
// Expiry, fixed by the node that ACKed it, tells them apart. Likewise a
// binding never shortens the same client's binding: a retransmitted REQUEST
// whose commit was held up (behind a leader that died) committed after a
// newer REQUEST's binding and cut its expiry short, and the address went to
// another client before the first's ACKed lease ended (also leasecheck).

// bindLeases is CmdBindLeases (v2: CmdBindLeasesV2): each change of ls is decided on its own, in
// order, at a.now (the leader's time), and a refusal does not affect the
// others (a group-commit batch holds unrelated clients). For the address
// l.IP and its record cur:
//
//   - bound: refused (*AddressTakenError) when cur is live at a.now and
//     belongs to another MAC, or is a live decline (of anyone); else stored
//     with l.Expiry as given (the DHCP server fixed it) — under v2, never
//     earlier than the same client's binding it replaces (a late commit of
//     an older REQUEST does not shorten a binding the client was ACKed).
//   - declined: refused when cur is a live binding of another MAC; else
//     stored (MAC = the decliner), keeping the address from everyone until
//     l.Expiry.
//   - released: stored with Expiry = a.now when cur is l.MAC's (v2: when
//     cur is l.MAC's binding with Expiry equal to l.Expiry; a release of a
//     binding since renewed or replaced, or of a record that is no binding,
//     changes nothing); refused when another client holds the address live;
//     else nothing to release (the outcome is the change as asked, nothing
//     stored).
//
// A malformed change (MAC, IPv4 address, state) is refused with ErrInvalid.
// The result has one leaseOutcome JSON value per change. A binding for a
// MAC does not end that MAC's binding of another address: that one runs to
// its expiry (a client may hold one address per subnet, and the FSM does
// not know subnets). recs holds the same outcomes as *leaseOutcome, for
// the leader's caller (no decoding of the JSON it just wrote).
func bindLeases(a *applyCtx, ls []Lease, v2 bool) (out []json.RawMessage, recs []any, err error) {
	if len(ls) == 0 {
		return nil, nil, fmt.Errorf("%w: bind_leases without leases", ErrBadCommand)
	}
	out = make([]json.RawMessage, 0, len(ls))
	recs = make([]any, 0, len(ls))
	for _, l := range ls {
		o, err := bindOne(a, l, v2)
		if err != nil {
			return nil, nil, err
		}
		raw, err := json.Marshal(o)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, raw)
		recs = append(recs, &o)
	}
	return out, recs, nil
}

func bindOne(a *applyCtx, l Lease, v2 bool) (leaseOutcome, error) {
	mac, err := NormalizeMAC(l.MAC)
	if err == nil {
		l.MAC = mac
		l.IP, err = addrKey(l.IP)
	}
	if err == nil && l.State != LeaseBound && l.State != LeaseDeclined && l.State != LeaseReleased {
		err = fmt.Errorf("%w: lease state %q (want bound, declined or released)", ErrInvalid, l.State)
	}
	if err != nil {
		return leaseOutcome{Lease: l, Error: err.Error()}, nil
	}
	l.Expiry = l.Expiry.UTC()
	cur, err := getAddr(a, l.IP)
	if err != nil {
		return leaseOutcome{}, err
	}
	taken := cur != nil && cur.live(a.now) && (cur.MAC != l.MAC || cur.State == LeaseDeclined)
	switch l.State {
	case LeaseDeclined:
		taken = cur != nil && cur.live(a.now) && cur.MAC != l.MAC && cur.State == LeaseBound
	case LeaseReleased:
		if cur == nil || cur.MAC != l.MAC {
			if taken {
				return leaseOutcome{Lease: l, Holder: cur}, nil
			}
			return leaseOutcome{Lease: l}, nil // nothing of l.MAC's to release
		}
		if v2 && (cur.State != LeaseBound || !cur.Expiry.Equal(l.Expiry)) {
			return leaseOutcome{Lease: l}, nil // not the binding it names: stale
		}
		taken = false
		l.Expiry = a.now
		if l.Hostname == "" {
			l.Hostname = cur.Hostname
		}
	}
	if taken {
		return leaseOutcome{Lease: l, Holder: cur}, nil
	}
	if v2 && l.State == LeaseBound && cur != nil && cur.MAC == l.MAC && cur.State == LeaseBound && cur.Expiry.After(l.Expiry) {
		// A binding of the same client that commits after a longer one
		// (a retransmitted REQUEST whose commit was held up behind a dead
		// leader) never shortens it: the client may hold the longer ACK.
		l.Expiry = cur.Expiry
	}
	return leaseOutcome{Lease: l}, putAddr(a, cur, l)
}

// legacySupersedes is how a record of CmdPutLeases (10), or of the per-MAC
// bucket when the address view is rebuilt, enters the address view: l
// replaces the record cur of its address when cur is absent or the same
// client's; a released record never replaces another client's; otherwise
// the record that runs later wins. So a stale record never replaces a live
// binding (issue 11), whatever order the records come in.
func legacySupersedes(l, cur *Lease) bool {
	switch {
	case cur == nil || cur.MAC == l.MAC:
		return true
	case l.State == LeaseReleased:
		return false
	case cur.State == LeaseReleased:
		return true
	}
	return l.Expiry.After(cur.Expiry)
}

// legacyAddr records a CmdPutLeases lease (already normalized) in the
// address view by legacySupersedes. A record whose IP is not IPv4 text is
// left to the per-MAC view only, as command 10 always accepted it.
func legacyAddr(a *applyCtx, l Lease) error {
	ip, err := addrKey(l.IP)
	if err != nil {
		return nil
	}
	l.IP = ip
	cur, err := getAddr(a, ip)
	if err != nil || !legacySupersedes(&l, cur) {
		return err
	}
	raw, err := json.Marshal(l)
	if err != nil {
		return err
	}
	a.ix.leases = append(a.ix.leases, l)
	return a.tx.Bucket(bLeaseAddrs).Put([]byte(ip), raw)
}

// rebuildLeaseAddrs fills an empty address view from the per-MAC bucket
// (a snapshot written before the address view existed). It does nothing
// when the address view holds records or the per-MAC bucket is empty.
func rebuildLeaseAddrs(tx *bbolt.Tx) error {
	addrs, macs := tx.Bucket(bLeaseAddrs), tx.Bucket(bLeases)
	if addrs == nil || macs == nil {
		return nil
	}
	if k, _ := addrs.Cursor().First(); k != nil {
		return nil
	}
	return macs.ForEach(func(k, raw []byte) error {
		var l Lease
		if err := json.Unmarshal(raw, &l); err != nil {
			return fmt.Errorf("%w: stored lease %s: %v", ErrCorrupt, k, err)
		}
		ip, err := addrKey(l.IP)
		if err != nil {
			return nil
		}
		l.IP = ip
		var cur *Lease
		if c := addrs.Get([]byte(ip)); c != nil {
			cur = new(Lease)
			if err := json.Unmarshal(c, cur); err != nil {
				return fmt.Errorf("%w: stored lease of %s: %v", ErrCorrupt, ip, err)
			}
		}
		if !legacySupersedes(&l, cur) {
			return nil
		}
		v, err := json.Marshal(l)
		if err != nil {
			return err
		}
		return addrs.Put([]byte(ip), v)
	})
}

// ---- writes and reads ----

// BindLeases commits ls in ONE raft command (CmdBindLeasesV2, or
// CmdBindLeases while a voter does not understand v2; batch the
// changes of a group commit into one call). Each change is decided by the
// FSM on its own (see bindLeases): errs[i] is nil when ls[i] was stored,
// *AddressTakenError (wraps ErrAddressTaken) when the address is held by
// another client, or wraps ErrInvalid for a malformed change (MAC, IPv4
// address, or a state other than LeaseBound, LeaseDeclined, LeaseReleased).
// Expiry is taken as given for bindings and declines (the caller fixes it
// before calling; compare it with the leader's clock, so keep the nodes'
// clocks in step); a release ends at the leader's time, and under v2 its
// Expiry names the binding it ends (that binding's Expiry). err is the error of
// the whole write (ErrNotLeader, ErrTimeout, ErrClosed, ...): nothing is
// known to be committed, and errs is nil.
func (s *Store) BindLeases(ctx context.Context, ls []Lease) (errs []error, err error) {
	if len(ls) == 0 {
		return nil, nil
	}
	t := CmdBindLeasesV2
	if s.checkVersions(t) != nil {
		t = CmdBindLeases // a voter predates v2: its release rule would differ
	}
	vals, recs, err := s.write(ctx, &command{Type: t, W: W{Actor: "dhcp"}, Leases: ls})
	if err != nil {
		return nil, err
	}
	return leaseErrors(vals, recs, len(ls))
}

// leaseErrors turns the results of a CmdBindLeases of n changes into one
// error per change: the applied outcomes (recs, on the leader) or else
// their JSON (vals, forwarded). A result that does not decode, or of
// another length, is ErrBadCommand for the whole write.
func leaseErrors(vals []json.RawMessage, recs []any, n int) ([]error, error) {
	if len(vals) != n {
		return nil, fmt.Errorf("%w: bind_leases: %d results for %d leases", ErrBadCommand, len(vals), n)
	}
	errs := make([]error, n)
	for i, v := range vals {
		var o leaseOutcome
		if len(recs) == n {
			if p, ok := recs[i].(*leaseOutcome); ok {
				o = *p
			} else {
				return nil, fmt.Errorf("%w: bind_leases result %d is a %T", ErrBadCommand, i, recs[i])
			}
		} else if err := json.Unmarshal(v, &o); err != nil {
			return nil, fmt.Errorf("%w: bind_leases result %d: %v", ErrBadCommand, i, err)
		}
		switch {
		case o.Holder != nil:
			errs[i] = &AddressTakenError{IP: o.Lease.IP, Holder: *o.Holder}
		case o.Error != "":
			errs[i] = &remoteError{msg: o.Error, err: ErrInvalid}
		}
	}
	return errs, nil
}

// AddressLease returns the record of IPv4 address ip (its last committed
// state, see BindLeases) or ErrNotFound.
func (s *Store) AddressLease(ip string) (Lease, error) {
	key, err := addrKey(ip)
	if err != nil {
		return Lease{}, err
	}
	return getRec[Lease](s.fsm, bLeaseAddrs, "lease of address", key)
}

// AddressLeases returns the address view: one record per address, ordered
// by the address text (bytewise), each the last committed state of its
// address. Expired and released records are included; a record is live
// while its State is LeaseBound or LeaseDeclined and Expiry is ahead.
func (s *Store) AddressLeases() ([]Lease, error) { return listRec[Lease](s.fsm, bLeaseAddrs) }

// ---- the lease feed ----

// leaseFeed tells the lease watchers about every change of the address
// view, in commit order. The FSM goroutine publishes after each commit;
// WatchLeases takes its snapshot and registers under the same mutex, so a
// watcher misses no change (it may be told of the last one twice).
type leaseFeed struct {
	mu       sync.Mutex
	next     int
	watchers map[int]leaseWatcher
}

type leaseWatcher struct {
	reset, applied func([]Lease)
}

// publish tells every watcher of ls (the records a committed transaction
// wrote, in order). Called on the FSM goroutine, never under the index lock.
func (lf *leaseFeed) publish(ls []Lease) {
	if len(ls) == 0 {
		return
	}
	lf.mu.Lock()
	defer lf.mu.Unlock()
	for _, w := range lf.watchers {
		w.applied(ls)
	}
}

// resetFrom gives every watcher the whole address view of db (after a
// Restore replaced fsm.db).
func (lf *leaseFeed) resetFrom(db *bbolt.DB) error {
	lf.mu.Lock()
	defer lf.mu.Unlock()
	if len(lf.watchers) == 0 {
		return nil
	}
	var all []Lease
	if err := db.View(func(tx *bbolt.Tx) (err error) { all, err = readAddrs(tx); return err }); err != nil {
		return err
	}
	for _, w := range lf.watchers {
		w.reset(all)
	}
	return nil
}

func readAddrs(tx *bbolt.Tx) ([]Lease, error) {
	var all []Lease
	err := tx.Bucket(bLeaseAddrs).ForEach(func(k, raw []byte) error {
		var l Lease
		if err := json.Unmarshal(raw, &l); err != nil {
			return fmt.Errorf("%w: stored lease of %s: %v", ErrCorrupt, k, err)
		}
		all = append(all, l)
		return nil
	})
	return all, err
}

// WatchLeases follows the address view: reset is called once, before
// WatchLeases returns, with every record (as AddressLeases), then applied
// with the records each later committed command wrote, in commit order
// (reset again, with everything, when a snapshot replaces the state). The
// last change before the call may be delivered to applied although reset
// already held it; applying a record twice must be harmless. Calls are
// serialised and made on the store's apply goroutine: they must be quick
// and must not call the store's write or watch methods (stop included).
// stop ends the watch. Errors: ErrClosed, ErrCorrupt.
func (s *Store) WatchLeases(reset, applied func([]Lease)) (stop func(), err error) {
	// Lock order as on the apply path: the fsm's read lock, then the feed's.
	f := s.fsm
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.db == nil {
		return nil, ErrClosed
	}
	lf := &f.leases
	lf.mu.Lock()
	defer lf.mu.Unlock()
	var all []Lease
	if err := f.db.View(func(tx *bbolt.Tx) (err error) { all, err = readAddrs(tx); return err }); err != nil {
		return nil, err
	}
	reset(all)
	if lf.watchers == nil {
		lf.watchers = map[int]leaseWatcher{}
	}
	id := lf.next
	lf.next++
	lf.watchers[id] = leaseWatcher{reset: reset, applied: applied}
	return func() {
		lf.mu.Lock()
		delete(lf.watchers, id)
		lf.mu.Unlock()
	}, nil
}

// CanCommit reports whether a write can commit now as far as this node
// knows: the store is Ready (a leader is known and this replica has caught
// up). On the minority side of a partition it turns false within the
// election timeout (a follower loses its leader; a leader steps down after
// LeaderLeaseTimeout without a quorum).
func (s *Store) CanCommit() bool { return s.Ready() }

// VoterIDs returns the raft server IDs of the voters in the latest raft
// configuration, sorted: the same list on every node that has applied the
// same configuration (the DHCP load balancing splits clients over it). A
// local store (OpenLocal) is its one voter, LocalNodeID.
func (s *Store) VoterIDs() ([]string, error) {
	if s.raft == nil {
		return []string{s.cfg.NodeID}, nil
	}
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("store: raft configuration: %w", err)
	}
	var ids []string
	for _, sv := range f.Configuration().Servers {
		if sv.Suffrage == raft.Voter {
			ids = append(ids, string(sv.ID))
		}
	}
	sort.Strings(ids)
	return ids, nil
}
