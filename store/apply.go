package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"go.etcd.io/bbolt"
)

// Bucket names of fsm.db. Record buckets hold JSON keyed by ID; idx* buckets
// are secondary indexes maintained in the same transaction as the record;
// the machine MAC and state indexes live in memory (machineIndex).
var (
	bSites    = []byte("sites")
	bRacks    = []byte("racks")
	bMachines = []byte("machines")
	bBMCs     = []byte("bmcs")
	bSecrets  = []byte("secrets")
	bImages   = []byte("images")
	bJobs     = []byte("jobs")
	bLeases   = []byte("leases")  // key: lower-case MAC
	bEvents   = []byte("events")  // key: 8-byte BE index + 4-byte BE seq
	bNodes    = []byte("nodes")   // raft server ID → forward address
	bIdxJob   = []byte("idx_job") // machine ID \x00 job ID → empty
	bMeta     = []byte("meta")    // "applied" → 8-byte BE raft index
	// Cluster trust (cluster.go).
	bJoinTokens = []byte("join_tokens") // hex SHA-256 of a token secret → JoinToken
	bMembers    = []byte("members")     // node ID → Member
	// Mixed versions (versions.go).
	bNodeVersions = []byte("node_versions") // node ID → NodeVersion
	// Remediation (issue 14): "brake" → RepairBrake.
	bRemediation = []byte("remediation")
	// Image tombstones (CmdDeleteImageV3): image ID → ImageTombstone.
	bImageTombstones = []byte("image_tombstones")

	allBuckets = [][]byte{bSites, bRacks, bMachines, bBMCs, bSecrets, bImages, bJobs,
		bLeases, bEvents, bNodes, bIdxJob, bMeta, bJoinTokens, bMembers, bLeaseAddrs, bNodeVersions, bRemediation, bImageTombstones}
	// Buckets of older fsm.db files (and snapshots) now kept in memory
	// (machineIndex); dropped when such a file is restored.
	legacyBuckets = [][]byte{[]byte("idx_mac"), []byte("idx_state")}
	keyApplied    = []byte("applied")
	// keyEventsFloor ("events_floor" in bucket meta, 8-byte BE): the
	// Before of the last CmdTrimEvents; every event with a lower Index has
	// been deleted, so a cursor below Before-1 is expired (Events).
	keyEventsFloor = []byte("events_floor")
)

// meta gives generic code access to the embedded Meta of every record.
func (m *Meta) meta() *Meta { return m }

type record[T any] interface {
	*T
	meta() *Meta
}

// applyCtx carries what one command's apply may use: the write transaction,
// the raft index, the leader-fixed time, and the event sequence counter.
type applyCtx struct {
	tx    *bbolt.Tx
	ix    *idxTx
	index uint64
	now   time.Time
	w     W
	seq   int
}

func eventKey(index uint64, seq int) []byte {
	k := make([]byte, 12)
	binary.BigEndian.PutUint64(k, index)
	binary.BigEndian.PutUint32(k[8:], uint32(seq))
	return k
}

// event appends one event with this command's index, next seq and time.
func (a *applyCtx) event(ev Event) error {
	ev.Index, ev.Seq, ev.Time = a.index, a.seq, a.now
	if ev.Actor == "" {
		ev.Actor = a.w.Actor
	}
	if ev.Reason == "" {
		ev.Reason = a.w.Reason
	}
	if ev.Message == "" {
		ev.Message = a.w.Message
	}
	a.seq++
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return a.tx.Bucket(bEvents).Put(eventKey(ev.Index, ev.Seq), b)
}

// apply executes one decoded command inside tx at raft index, recording
// machine index changes in ix (merged into the in-memory index only when tx
// commits). It is the whole deterministic state machine: it reads only tx,
// the index (itself derived from tx's records), index and the command (c.Time is the leader's clock), never the wall clock or
// randomness. It returns the JSON of the records written (for Put
// commands), the written records themselves (recs[i] is the *Site,
// *Machine, ... that vals[i] encodes; they point into c, which the caller
// must not reuse), and the number of events appended. On error the caller
// must roll tx back: a command is all-or-nothing.
func apply(tx *bbolt.Tx, ix *idxTx, index uint64, c *command) (vals []json.RawMessage, recs []any, events int, err error) {
	a := &applyCtx{tx: tx, ix: ix, index: index, now: c.Time.UTC(), w: c.W}
	var out []json.RawMessage
	one := func(rec any) func(raw []byte, e error) {
		return func(raw []byte, e error) {
			if raw != nil {
				out = append(out, raw)
				recs = append(recs, rec)
			}
			err = e
		}
	}
	switch c.Type {
	case CmdPutSite, CmdPutSiteV2:
		if c.Site == nil {
			return nil, nil, 0, fmt.Errorf("%w: %s without site", ErrBadCommand, c.Type)
		}
		if c.Type == CmdPutSiteV2 {
			err = refuseTaken(a, bSites, "site", c.Site.Meta)
		}
		if err == nil {
			one(c.Site)(putSimple(a, bSites, "site", c.Site))
		}
	case CmdPutRack, CmdPutRackV2:
		if c.Rack == nil {
			return nil, nil, 0, fmt.Errorf("%w: %s without rack", ErrBadCommand, c.Type)
		}
		if c.Type == CmdPutRackV2 {
			err = refuseTaken(a, bRacks, "rack", c.Rack.Meta)
		}
		if err == nil {
			one(c.Rack)(putSimple(a, bRacks, "rack", c.Rack))
		}
	case CmdPutMachines, CmdPutMachinesV2, CmdPutMachinesV3, CmdPutMachinesV4:
		rule := ruleV2
		switch c.Type {
		case CmdPutMachines:
			rule = ruleV1
		case CmdPutMachinesV3:
			rule = ruleV3
		case CmdPutMachinesV4:
			rule = ruleV4
		}
		out = make([]json.RawMessage, 0, len(c.Machines))
		recs = make([]any, 0, len(c.Machines))
		for i := range c.Machines {
			raw, e := putMachine(a, &c.Machines[i], rule)
			if e != nil {
				if len(c.Machines) > 1 {
					e = fmt.Errorf("machine %d (%s): %w", i, c.Machines[i].ID, e)
				}
				return nil, nil, 0, e
			}
			out = append(out, raw)
			recs = append(recs, &c.Machines[i])
		}
	case CmdDeleteMachine:
		err = deleteMachine(a, c.ID)
	case CmdPutBMC:
		if c.BMC == nil {
			return nil, nil, 0, fmt.Errorf("%w: put_bmc without bmc", ErrBadCommand)
		}
		one(c.BMC)(putSimple(a, bBMCs, "bmc", c.BMC))
	case CmdPutSecret:
		err = putSecret(a, c.Key, c.Sealed)
	case CmdPutImage, CmdPutImageV2:
		if c.Image == nil {
			return nil, nil, 0, fmt.Errorf("%w: %s without image", ErrBadCommand, c.Type)
		}
		if c.Type == CmdPutImage {
			err = keepManifest(a, c.Image)
		}
		if err == nil {
			one(c.Image)(putSimple(a, bImages, "image", c.Image))
		}
	case CmdDeleteImage:
		err = deleteSimple(a, bImages, "image", c.ID)
	case CmdDeleteImageV2:
		err = deleteImage(a, c.ID)
	case CmdDeleteImageV3:
		err = deleteImageTombstone(a, c.ID)
	case CmdImportMachines:
		if out, recs, err = importMachines(a, c.Machines); err != nil {
			return nil, nil, 0, err
		}
	case CmdAgentReport, CmdAgentReportV2:
		if out, recs, err = agentReport(a, c); err != nil {
			return nil, nil, 0, err
		}
	case CmdPutJob:
		if c.Job == nil {
			return nil, nil, 0, fmt.Errorf("%w: put_job without job", ErrBadCommand)
		}
		one(c.Job)(putJob(a, c.Job))
	case CmdPutLeases:
		err = putLeases(a, c.Leases)
	case CmdBindLeases, CmdBindLeasesV2:
		if out, recs, err = bindLeases(a, c.Leases, c.Type == CmdBindLeasesV2); err != nil {
			return nil, nil, 0, err
		}
	case CmdAppendEvents:
		for _, ev := range c.Events {
			if ev.Kind == "" || ev.Subject == "" {
				return nil, nil, 0, fmt.Errorf("%w: event needs subject and kind", ErrInvalid)
			}
			if err = a.event(ev); err != nil {
				break
			}
		}
	case CmdRegisterNode:
		if c.Node == nil || c.Node.ID == "" {
			return nil, nil, 0, fmt.Errorf("%w: register_node without node id", ErrInvalid)
		}
		if err = tx.Bucket(bNodes).Put([]byte(c.Node.ID), []byte(c.Node.ForwardAddr)); err == nil {
			err = applyNodeVersion(a, c.Node)
		}
		if err == nil {
			err = a.event(Event{Subject: "node/" + c.Node.ID, Kind: "node_registered", To: c.Node.ForwardAddr,
				Message: nodeVersionMsg(c.Node)})
		}
	case CmdRemoveNode:
		if err = tx.Bucket(bNodes).Delete([]byte(c.ID)); err == nil {
			err = tx.Bucket(bNodeVersions).Delete([]byte(c.ID))
		}
		if err == nil {
			err = a.event(Event{Subject: "node/" + c.ID, Kind: "node_removed"})
		}
	case CmdPutJoinToken:
		err = applyPutJoinToken(a, c.JoinToken)
	case CmdUseJoinToken:
		err = applyUseJoinToken(a, c.JoinToken, c.Member)
	case CmdRemoveMember:
		err = applyRemoveMember(a, c.ID)
	case CmdTrimEvents:
		err = trimEvents(a, c.Before)
	case CmdPutRemediation:
		if c.Brake == nil {
			return nil, nil, 0, fmt.Errorf("%w: put_remediation without brake", ErrBadCommand)
		}
		c.Brake.ID = BrakeID
		one(c.Brake)(putBrake(a, c.Brake))
	case CmdRenewMember:
		err = applyRenewMember(a, c.Member)
	default:
		return nil, nil, 0, fmt.Errorf("%w: %d", ErrUnknownCommand, uint8(c.Type))
	}
	if err != nil {
		return nil, nil, 0, err
	}
	return out, recs, a.seq, nil
}

// refuseTaken is the create rule of CmdPutSiteV2 and CmdPutRackV2: a
// create (ResourceVersion 0) of an ID the bucket holds is ErrConflict.
func refuseTaken(a *applyCtx, bucket []byte, kind string, m Meta) error {
	if m.ResourceVersion == 0 && m.ID != "" && a.tx.Bucket(bucket).Get([]byte(m.ID)) != nil {
		return fmt.Errorf("%w: %s %s exists: a create (resource_version 0) never replaces a record; "+
			"update it with its current resource_version", ErrConflict, kind, m.ID)
	}
	return nil
}

// putSimple is compare-and-set create/update for records without indexes.
// ID must be set (the leader assigns missing IDs before logging).
func putSimple[T any, P record[T]](a *applyCtx, bucket []byte, kind string, v P) ([]byte, error) {
	old, err := casPrepare[T, P](a, bucket, kind, v)
	if err != nil {
		return nil, err
	}
	raw, err := writeRec(a, bucket, v)
	if err != nil {
		return nil, err
	}
	k := "updated"
	if old == nil {
		k = "created"
	}
	return raw, a.event(Event{Subject: kind + "/" + v.meta().ID, Kind: k})
}

// casPrepare checks v against the stored record: absent + RV≠0 → ErrNotFound;
// present + RV≠0 + RV≠current → ErrConflict. It fixes CreatedAt, UpdatedAt
// and ResourceVersion on v and returns the old record (nil on create).
func casPrepare[T any, P record[T]](a *applyCtx, bucket []byte, kind string, v P) (P, error) {
	m := v.meta()
	if m.ID == "" {
		return nil, fmt.Errorf("%w: %s without id", ErrInvalid, kind)
	}
	cur := a.tx.Bucket(bucket).Get([]byte(m.ID))
	var old P
	if cur == nil {
		if m.ResourceVersion != 0 {
			return nil, fmt.Errorf("%w: %s %s", ErrNotFound, kind, m.ID)
		}
		m.CreatedAt = a.now
	} else {
		old = P(new(T))
		if err := json.Unmarshal(cur, old); err != nil {
			return nil, fmt.Errorf("%w: stored %s %s: %v", ErrCorrupt, kind, m.ID, err)
		}
		om := old.meta()
		if m.ResourceVersion != 0 && m.ResourceVersion != om.ResourceVersion {
			return nil, fmt.Errorf("%w: %s %s is at version %d, update names %d",
				ErrConflict, kind, m.ID, om.ResourceVersion, m.ResourceVersion)
		}
		m.CreatedAt = om.CreatedAt
	}
	m.UpdatedAt = a.now
	m.ResourceVersion = a.index
	return old, nil
}

func writeRec[T any, P record[T]](a *applyCtx, bucket []byte, v P) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return raw, a.tx.Bucket(bucket).Put([]byte(v.meta().ID), raw)
}

func deleteSimple(a *applyCtx, bucket []byte, kind, id string) error {
	b := a.tx.Bucket(bucket)
	if b.Get([]byte(id)) == nil {
		return fmt.Errorf("%w: %s %s", ErrNotFound, kind, id)
	}
	if err := b.Delete([]byte(id)); err != nil {
		return err
	}
	return a.event(Event{Subject: kind + "/" + id, Kind: "deleted"})
}

// NormalizeMAC returns mac in lower-case colon form ("aa:bb:cc:dd:ee:ff"),
// or ErrInvalid if it is not a 6-, 8- or 20-byte hardware address
// (net.ParseMAC forms: colons, dashes or dotted).
func NormalizeMAC(mac string) (string, error) {
	if isNormalMAC(mac) {
		return mac, nil // what ParseMAC + String would return, without the allocations
	}
	hw, err := net.ParseMAC(strings.TrimSpace(mac))
	if err != nil {
		return "", fmt.Errorf("%w: MAC %q", ErrInvalid, mac)
	}
	return hw.String(), nil
}

// isNormalMAC reports whether mac is already an EUI-48 in lower-case colon
// form.
func isNormalMAC(mac string) bool {
	if len(mac) != 17 {
		return false
	}
	for i := 0; i < 17; i++ {
		c := mac[i]
		if i%3 == 2 {
			if c != ':' {
				return false
			}
		} else if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// MACError is the refusal of ParseMachineMAC: Value as given and why it
// is not a NIC's address. It unwraps to ErrInvalid.
type MACError struct {
	Value  string
	Reason string
}

func (e *MACError) Error() string { return fmt.Sprintf("%q: %s", e.Value, e.Reason) }

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *MACError) Unwrap() error { return ErrInvalid }

// ParseMachineMAC is the one rule for a MAC address given for a machine —
// a NIC's or its BMC's, by an import or through the API: an EUI-48 in any
// form net.ParseMAC reads (colons, dashes or dots, any case), returned in
// lower-case colon form ("aa:bb:cc:dd:ee:ff"). Refused with *MACError
// (wraps ErrInvalid): anything but 6 octets (EUI-64, InfiniBand); a group
// address, i.e. the I/G bit (least significant bit of the first octet) set,
// which covers every multicast address and the broadcast address
// ff:ff:ff:ff:ff:ff (IEEE 802-2014 §8.2.2); and 00:00:00:00:00:00. No NIC
// sends from those, so the boot path ignores them (the dhcp and httpboot
// packages keep the same test at the protocol layer) and a machine recorded
// with one could never be found by its MAC.
func ParseMachineMAC(s string) (string, error) {
	hw, err := net.ParseMAC(strings.TrimSpace(s))
	switch {
	case err != nil || len(hw) != 6:
		return "", &MACError{Value: s, Reason: "not an EUI-48 MAC address"}
	case hw[0]&1 != 0:
		return "", &MACError{Value: s, Reason: "a group (multicast or broadcast) address, which no NIC has"}
	case bytes.Equal(hw, make(net.HardwareAddr, 6)):
		return "", &MACError{Value: s, Reason: "the all-zero address, which no NIC has"}
	}
	return hw.String(), nil
}

func machineMACs(m *Machine) ([]string, error) {
	var macs []string
	seen := map[string]bool{}
	norm := func(nics []NIC) error {
		for i := range nics {
			mac, err := NormalizeMAC(nics[i].MAC)
			if err != nil {
				return err
			}
			nics[i].MAC = mac
			if !seen[mac] {
				seen[mac] = true
				macs = append(macs, mac)
			}
		}
		return nil
	}
	if err := norm(m.Intended.NICs); err != nil {
		return nil, err
	}
	if m.Discovered != nil {
		if err := norm(m.Discovered.NICs); err != nil {
			return nil, err
		}
	}
	return macs, nil
}

// machineRule is the rule set a machine command applies: ruleV1
// (put_machines, 3), ruleV2 (put_machines_v2 14, import 16, agent_report
// 17: a claim must name a stored image), ruleV3 (put_machines_v3 25: the
// issue-14 transition table, and the issue-14 fields as written) or ruleV4
// (put_machines_v4 30, agent_report_v2 31: transitionsV4, and the round-3
// fields as written).
type machineRule int

const (
	ruleV1 machineRule = iota
	ruleV2
	ruleV3
	ruleV4
)

// putMachine creates or updates m (see PutMachine). From ruleV2 on (the
// CmdPutMachinesV2 rules) a claim the write adds, or whose image it
// changes, must name a stored image (ErrInvalid otherwise); a claim left as
// it was is not re-checked, so a record written before the rule can still
// move on. Below ruleV3 the transition table is transitionsV2 and the
// issue-14 fields are kept as stored (keepV3Fields), exactly what a node
// that predates command 25 stores for the same entry.
func putMachine(a *applyCtx, m *Machine, rule machineRule) ([]byte, error) {
	checked := rule >= ruleV2
	tab := transitionsV2
	switch rule {
	case ruleV3:
		tab = transitionsV3
	case ruleV4:
		tab = transitionsV4
	}
	macs, err := machineMACs(m)
	if err != nil {
		return nil, fmt.Errorf("machine %s: %w", m.ID, err)
	}
	old, err := casPrepare[Machine](a, bMachines, "machine", m)
	if err != nil {
		return nil, err
	}
	if rule < ruleV3 {
		keepV3Fields(m, old)
	}
	if rule < ruleV4 {
		keepV4Fields(m, old)
	}
	ix := a.ix
	if old == nil {
		if m.State == "" {
			m.State = StateRegistered
		}
		if m.State != StateRegistered && m.State != StateDiscovered {
			return nil, &IllegalTransitionError{From: "", To: m.State}
		}
	} else {
		if m.State == "" {
			m.State = old.State
		}
		// A state the table does not know is refused unless it is the stored
		// one (a record of state rma, say, written by command 25, may still
		// take an agent report that moves nothing).
		if _, ok := tab[m.State]; !ok && (m.State != old.State || !m.State.Valid()) {
			return nil, fmt.Errorf("%w: machine %s state %q", ErrInvalid, m.ID, m.State)
		}
		if m.State != old.State && !canTransition(tab, old.State, m.State) {
			return nil, &IllegalTransitionError{From: old.State, To: m.State}
		}
		oldMACs, _ := machineMACs(old)
		for _, mac := range oldMACs {
			if ix.owner(mac) == m.ID {
				ix.setOwner(mac, "")
			}
		}
	}
	for _, mac := range macs {
		if owner := ix.owner(mac); owner != "" && owner != m.ID {
			return nil, fmt.Errorf("%w: %s is on machine %s, not %s", ErrDuplicateMAC, mac, owner, m.ID)
		}
		ix.setOwner(mac, m.ID)
	}
	if checked && m.Claim != nil && (old == nil || old.Claim == nil || old.Claim.Image != m.Claim.Image) {
		if m.Claim.Image == "" || a.tx.Bucket(bImages).Get([]byte(m.Claim.Image)) == nil {
			return nil, fmt.Errorf("%w: machine %s: claim.image: no image %q", ErrInvalid, m.ID, m.Claim.Image)
		}
	}
	var from MachineState
	if old != nil {
		from = old.State
	}
	ix.move(m.ID, from, m.State, m.ResourceVersion)
	ix.setRefs(m.ID, machineRefs(old), machineRefs(m))
	raw, err := writeRec(a, bMachines, m)
	if err != nil {
		return nil, err
	}
	subj := "machine/" + m.ID
	switch {
	case old == nil:
		err = a.event(Event{Subject: subj, Kind: "created", To: string(m.State), Reason: orStr(a.w.Reason, m.Reason)})
	case old.State != m.State:
		err = a.event(Event{Subject: subj, Kind: "transition", From: string(old.State), To: string(m.State),
			Reason: orStr(a.w.Reason, m.Reason), Message: orStr(a.w.Message, m.Message)})
	default:
		err = a.event(Event{Subject: subj, Kind: "updated"})
	}
	return raw, err
}

// agentReport is CmdAgentReport: the report's events (each needs Subject
// and Kind), then a compare-and-set write of its one machine with
// PutMachinesV2's rules (agent_report_v2: put_machines_v4's), all at this command's index and in its one
// transaction, so a refused write leaves no event behind. The machine must
// exist and be named by ID and current ResourceVersion: a report never
// creates one.
func agentReport(a *applyCtx, c *command) ([]json.RawMessage, []any, error) {
	if len(c.Machines) != 1 {
		return nil, nil, fmt.Errorf("%w: agent_report carries %d machines, want 1", ErrBadCommand, len(c.Machines))
	}
	m := &c.Machines[0]
	if m.ID == "" || m.ResourceVersion == 0 {
		return nil, nil, fmt.Errorf("%w: agent report on machine %q at resource_version %d: a report needs the "+
			"machine's ID and its current resource_version (it never creates a machine)", ErrInvalid, m.ID, m.ResourceVersion)
	}
	for i, ev := range c.Events {
		if ev.Kind == "" || ev.Subject == "" {
			return nil, nil, fmt.Errorf("%w: agent report on machine %s: event %d needs subject and kind", ErrInvalid, m.ID, i)
		}
		if err := a.event(ev); err != nil {
			return nil, nil, err
		}
	}
	rule := ruleV2
	if c.Type == CmdAgentReportV2 {
		rule = ruleV4
	}
	raw, err := putMachine(a, m, rule)
	if err != nil {
		return nil, nil, err
	}
	return []json.RawMessage{raw}, []any{m}, nil
}

func orStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func deleteMachine(a *applyCtx, id string) error {
	cur := a.tx.Bucket(bMachines).Get([]byte(id))
	if cur == nil {
		return fmt.Errorf("%w: machine %s", ErrNotFound, id)
	}
	var old Machine
	if err := json.Unmarshal(cur, &old); err != nil {
		return fmt.Errorf("%w: stored machine %s: %v", ErrCorrupt, id, err)
	}
	macs, _ := machineMACs(&old)
	for _, mac := range macs {
		if a.ix.owner(mac) == id {
			a.ix.setOwner(mac, "")
		}
	}
	a.ix.move(id, old.State, "", 0)
	a.ix.setRefs(id, machineRefs(&old), refList{})
	if err := a.tx.Bucket(bMachines).Delete([]byte(id)); err != nil {
		return err
	}
	return a.event(Event{Subject: "machine/" + id, Kind: "deleted", From: string(old.State)})
}

// deleteImage deletes image id unless a machine's claim names it
// (ErrImageInUse, naming the first such machine by ID), whatever the
// machine's state: a claim stays on a machine through provisioning,
// provisioned and failed until Release drops it, and any of those may
// still write or rewrite the image.
func deleteImage(a *applyCtx, id string) error {
	if a.tx.Bucket(bImages).Get([]byte(id)) == nil {
		return fmt.Errorf("%w: image %s", ErrNotFound, id)
	}
	if hs := a.ix.holders(refKey{refClaimImage, id}); len(hs) > 0 {
		more := ""
		if len(hs) > 1 {
			more = fmt.Sprintf(" and %d more", len(hs)-1)
		}
		return fmt.Errorf("%w: image %s is claimed by machine %s%s; release the machine first",
			ErrImageInUse, id, describeMachine(a, hs[0]), more)
	}
	return deleteSimple(a, bImages, "image", id)
}

// deleteImageTombstone is CmdDeleteImageV3: deleteImage, and the deleted
// record is kept as a tombstone (with the leader's time) so every node can
// tell the file it holds under that name is the deleted content and remove
// it (appliance/imagesync.go), also a node that was down at the time.
func deleteImageTombstone(a *applyCtx, id string) error {
	raw := a.tx.Bucket(bImages).Get([]byte(id))
	if raw == nil {
		return fmt.Errorf("%w: image %s", ErrNotFound, id)
	}
	var ts ImageTombstone
	if err := json.Unmarshal(raw, &ts.Image); err != nil {
		return fmt.Errorf("%w: image record %s: %v", ErrCorrupt, id, err)
	}
	if err := deleteImage(a, id); err != nil {
		return err
	}
	ts.DeletedAt = a.now
	out, err := json.Marshal(ts)
	if err != nil {
		return err
	}
	return a.tx.Bucket(bImageTombstones).Put([]byte(id), out)
}

// describeMachine is "ID (name, state)" of stored machine id, for errors.
func describeMachine(a *applyCtx, id string) string {
	var m struct {
		Name  string       `json:"name"`
		State MachineState `json:"state"`
	}
	if raw := a.tx.Bucket(bMachines).Get([]byte(id)); raw != nil {
		_ = json.Unmarshal(raw, &m)
	}
	if m.Name == "" {
		return fmt.Sprintf("%s (%s)", id, m.State)
	}
	return fmt.Sprintf("%s (%s, %s)", id, m.Name, m.State)
}

// importMachines is CmdImportMachines: it creates every machine of ms (each
// new: ResourceVersion 0 and an ID not stored, else ErrConflict) with the
// CmdPutMachinesV2 rules, after checking that no machine takes a name,
// serial (case-insensitive) or MAC held by a stored machine or by an
// earlier machine of ms. NIC and BMC MACs share one space: a BMC MAC may be
// no machine's NIC MAC and the other way round. Every conflict is reported
// at once (*ImportConflictError, in order); a value repeated within one
// machine is left to the caller's row checks. All or nothing.
func importMachines(a *applyCtx, ms []Machine) ([]json.RawMessage, []any, error) {
	machines := a.tx.Bucket(bMachines)
	var conflicts []Conflict
	seen := map[refKey]int{} // value → first machine of ms holding it; MACs of both kinds under refBMCMAC
	check := func(i int, field, value string, key refKey, stored []string) {
		if j, ok := seen[key]; ok {
			if j != i {
				conflicts = append(conflicts, Conflict{Index: i, Field: field, Value: value, HolderIndex: j})
			}
			return
		}
		seen[key] = i
		if len(stored) > 0 {
			c := Conflict{Index: i, Field: field, Value: value, Holder: stored[0], HolderIndex: -1}
			var h struct {
				Name string `json:"name"`
			}
			if raw := machines.Get([]byte(stored[0])); raw != nil {
				_ = json.Unmarshal(raw, &h)
			}
			c.HolderName = h.Name
			conflicts = append(conflicts, c)
		}
	}
	macHolders := func(mac string) []string {
		hs := a.ix.holders(refKey{refBMCMAC, mac})
		if id := a.ix.owner(mac); id != "" {
			hs = append([]string{id}, hs...)
		}
		return hs
	}
	for i := range ms {
		m := &ms[i]
		if m.ID == "" {
			return nil, nil, fmt.Errorf("%w: imported machine %d without id", ErrInvalid, i)
		}
		if m.ResourceVersion != 0 || machines.Get([]byte(m.ID)) != nil {
			return nil, nil, fmt.Errorf("%w: machine %d: %s exists; an import only creates machines", ErrConflict, i, m.ID)
		}
		macs, err := machineMACs(m)
		if err != nil {
			return nil, nil, fmt.Errorf("machine %d (%s): %w", i, m.ID, err)
		}
		if m.Name != "" {
			k := refKey{refName, m.Name}
			check(i, "name", m.Name, k, a.ix.holders(k))
		}
		if m.Intended.Serial != "" {
			k := refKey{refSerial, serialKey(m.Intended.Serial)}
			check(i, "serial", m.Intended.Serial, k, a.ix.holders(k))
		}
		if m.Intended.BMCMAC != "" {
			mac := macKey(m.Intended.BMCMAC)
			check(i, "bmc_mac", mac, refKey{refBMCMAC, mac}, macHolders(mac))
		}
		for _, mac := range macs {
			check(i, "macs", mac, refKey{refBMCMAC, mac}, macHolders(mac))
		}
	}
	if len(conflicts) > 0 {
		return nil, nil, &ImportConflictError{Conflicts: conflicts}
	}
	out := make([]json.RawMessage, 0, len(ms))
	recs := make([]any, 0, len(ms))
	for i := range ms {
		raw, err := putMachine(a, &ms[i], ruleV2)
		if err != nil {
			return nil, nil, fmt.Errorf("machine %d (%s): %w", i, ms[i].ID, err)
		}
		out = append(out, raw)
		recs = append(recs, &ms[i])
	}
	return out, recs, nil
}

// BrakeID is the ID of the one RepairBrake record.
const BrakeID = "brake"

// putBrake is CmdPutRemediation: compare-and-set of the brake record, and
// an event "brake_engaged" or "brake_released" when Engaged changes
// ("updated" otherwise).
func putBrake(a *applyCtx, b *RepairBrake) ([]byte, error) {
	old, err := casPrepare[RepairBrake](a, bRemediation, "remediation", b)
	if err != nil {
		return nil, err
	}
	raw, err := writeRec(a, bRemediation, b)
	if err != nil {
		return nil, err
	}
	ev := Event{Subject: "remediation/brake", Kind: "updated"}
	was := old != nil && old.Engaged
	switch {
	case b.Engaged && !was:
		ev = Event{Subject: "remediation/brake", Kind: "brake_engaged", From: "released", To: "engaged",
			Reason: orStr(a.w.Reason, b.Reason), Message: orStr(a.w.Message, b.Message)}
	case !b.Engaged && was:
		ev = Event{Subject: "remediation/brake", Kind: "brake_released", From: "engaged", To: "released"}
	}
	return raw, a.event(ev)
}

func putSecret(a *applyCtx, key string, sealed []byte) error {
	if key == "" {
		return fmt.Errorf("%w: secret without key", ErrInvalid)
	}
	if err := a.tx.Bucket(bSecrets).Put([]byte(key), sealed); err != nil {
		return err
	}
	// The event names the key only; the sealed value never enters the feed.
	return a.event(Event{Subject: "secret/" + key, Kind: "secret_updated"})
}

func jobKey(machine, id string) []byte { return []byte(machine + "\x00" + id) }

func putJob(a *applyCtx, j *Job) ([]byte, error) {
	old, err := casPrepare[Job](a, bJobs, "job", j)
	if err != nil {
		return nil, err
	}
	idx := a.tx.Bucket(bIdxJob)
	if old != nil && old.Machine != j.Machine {
		if err := idx.Delete(jobKey(old.Machine, j.ID)); err != nil {
			return nil, err
		}
	}
	if err := idx.Put(jobKey(j.Machine, j.ID), nil); err != nil {
		return nil, err
	}
	raw, err := writeRec(a, bJobs, j)
	if err != nil {
		return nil, err
	}
	ev := Event{Subject: "job/" + j.ID, Kind: "job", To: j.State, Reason: orStr(a.w.Reason, j.Reason),
		Message: orStr(a.w.Message, j.Message)}
	if old != nil {
		ev.From = old.State
	}
	return raw, a.event(ev)
}

// putLeases stores leases keyed by MAC. An event is appended only when a
// lease is new or its IP or State changed (renewals are not audited).
func putLeases(a *applyCtx, ls []Lease) error {
	b := a.tx.Bucket(bLeases)
	for _, l := range ls {
		mac, err := NormalizeMAC(l.MAC)
		if err != nil {
			return err
		}
		if l.IP == "" {
			return fmt.Errorf("%w: lease %s without ip", ErrInvalid, mac)
		}
		l.MAC = mac
		var old Lease
		cur := b.Get([]byte(mac))
		if cur != nil {
			if err := json.Unmarshal(cur, &old); err != nil {
				return fmt.Errorf("%w: stored lease %s: %v", ErrCorrupt, mac, err)
			}
		}
		raw, err := json.Marshal(l)
		if err != nil {
			return err
		}
		if err := b.Put([]byte(mac), raw); err != nil {
			return err
		}
		if err := legacyAddr(a, l); err != nil {
			return err
		}
		if cur == nil || old.IP != l.IP || old.State != l.State {
			ev := Event{Subject: "lease/" + mac, Kind: "lease", To: l.State, Message: l.IP}
			if cur != nil {
				ev.From = old.State
			}
			if err := a.event(ev); err != nil {
				return err
			}
		}
	}
	return nil
}

// initBuckets creates every bucket of fsm.db.
func initBuckets(tx *bbolt.Tx) error {
	for _, b := range allBuckets {
		if _, err := tx.CreateBucketIfNotExists(b); err != nil {
			return err
		}
	}
	return nil
}

// trimEvents is CmdTrimEvents: delete every event with Index < before and
// raise the events floor to before. before is clamped to this command's own
// index (a trim never reaches past the log it is part of); a before at or
// below the stored floor changes nothing, so a repeated or reordered trim
// is harmless. It writes no event (a trim must not grow the log it bounds).
func trimEvents(a *applyCtx, before uint64) error {
	if before > a.index {
		before = a.index
	}
	if before <= eventsFloor(a.tx) {
		return nil
	}
	b := a.tx.Bucket(bEvents)
	var seek [8]byte
	binary.BigEndian.PutUint64(seek[:], before)
	var dead [][]byte
	c := b.Cursor()
	for k, _ := c.First(); k != nil && bytes.Compare(k, seek[:]) < 0; k, _ = c.Next() {
		dead = append(dead, append([]byte(nil), k...))
	}
	for _, k := range dead {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	var fb [8]byte
	binary.BigEndian.PutUint64(fb[:], before)
	return a.tx.Bucket(bMeta).Put(keyEventsFloor, fb[:])
}

// eventsFloor returns the stored events floor (0: never trimmed).
func eventsFloor(tx *bbolt.Tx) uint64 {
	if v := tx.Bucket(bMeta).Get(keyEventsFloor); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// lastEventIndex returns the raft index of the newest event in tx, or 0.
func lastEventIndex(tx *bbolt.Tx) uint64 {
	b := tx.Bucket(bEvents)
	if b == nil {
		return 0
	}
	k, _ := b.Cursor().Last()
	if len(k) < 8 {
		return 0
	}
	return binary.BigEndian.Uint64(k)
}

// errIsLogical reports whether err is an expected refusal of a command
// (conflict, not found, invalid, illegal transition) rather than a fault.
func errIsLogical(err error) bool {
	var ite *IllegalTransitionError
	return errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalid) || errors.Is(err, ErrJoinToken) ||
		errors.Is(err, ErrDuplicateMAC) || errors.Is(err, ErrImageInUse) || errors.As(err, &ite)
}
