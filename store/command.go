package store

import (
	"encoding/json"
	"fmt"
	"time"
)

// CommandType numbers the raft commands. The number is the first byte of
// every log entry the store writes. New values go only at the end; a value
// is never reused or renumbered (a log written by this binary must replay
// on every later binary).
type CommandType uint8

// Command types. Zero is never valid.
const (
	CmdInvalid        CommandType = iota // 0: never written
	CmdPutSite                           // 1: Site
	CmdPutRack                           // 2: Rack
	CmdPutMachines                       // 3: Machines (1..n, all-or-nothing)
	CmdDeleteMachine                     // 4: ID
	CmdPutBMC                            // 5: BMC
	CmdPutSecret                         // 6: Key, Sealed
	CmdPutImage                          // 7: Image
	CmdDeleteImage                       // 8: ID
	CmdPutJob                            // 9: Job
	CmdPutLeases                         // 10: Leases
	CmdAppendEvents                      // 11: Events
	CmdRegisterNode                      // 12: Node (raft ID → forward address; version and newest command type, versions.go)
	CmdRemoveNode                        // 13: ID
	CmdPutMachinesV2                     // 14: Machines; as 3, and a claim a write adds or changes must name a stored image
	CmdDeleteImageV2                     // 15: ID; as 8, refused (ErrImageInUse) while a machine's claim names the image
	CmdImportMachines                    // 16: Machines, create only; name, serial, BMC and NIC MACs unique (*ImportConflictError)
	CmdAgentReport                       // 17: Events + Machines (exactly 1, CAS): the report's events and machine write, both or neither
	CmdBindLeases                        // 18: Leases; bind/decline/release by address, refused while another client holds it (*AddressTakenError)
	CmdPutJoinToken                      // 19: JoinToken (hash and TTL; the leader fixes Created/Expires)
	CmdUseJoinToken                      // 20: JoinToken.Hash, Member (ID, CertSerial): consume a token, admit a node
	CmdRemoveMember                      // 21: ID: the node's certificate is refused from then on
	CmdPutSiteV2                         // 22: Site; as 1, and a create (ResourceVersion 0) of a stored ID is ErrConflict
	CmdPutRackV2                         // 23: Rack; as 2, and a create (ResourceVersion 0) of a stored ID is ErrConflict
	CmdTrimEvents                        // 24: Before: delete every event with Index < Before; Before becomes the events floor (never lowered)
	CmdPutMachinesV3                     // 25: Machines; as 14, under the issue-14 transition table (remediating, rma) and keeping the issue-14 fields
	CmdPutRemediation                    // 26: Brake: the remediation brake record (compare-and-set)
	CmdRenewMember                       // 27: Member (ID, CertSerial, CertNotAfter, CAHash): a node's renewed certificate (cluster.go)
	CmdDeleteImageV3                     // 28: ID; as 15, and leaves an image tombstone (name, SHA-256) so every node removes the file
	CmdBindLeasesV2                      // 29: Leases; as 18, and a release ends only the binding whose Expiry it names, and a binding never shortens the same client's binding
	CmdPutMachinesV4                     // 30: Machines; as 25, under transitionsV4 and keeping the round-3 fields (build, attestation, burn-in, firmware) as written
	CmdAgentReportV2                     // 31: Events + Machines (exactly 1, CAS); as 17, under put_machines_v4's rules
	CmdPutImageV2                        // 32: Image; as 7, keeping the release manifest (Layers, KubeadmVersion) as written (issue 15)
	cmdEnd                               // sentinel: first unknown value
)

// CmdPutMachines (3), CmdDeleteImage (8), CmdPutSite (1) and CmdPutRack
// (2) are no longer written: their V2 successors add referential checks
// (22 and 23: a create never replaces a stored site or rack). They still replay with their
// original meaning, so a log written before the checks existed rebuilds
// the very state it had (an old entry is never refused by a newer rule).

var cmdNames = [...]string{"invalid", "put_site", "put_rack", "put_machines", "delete_machine",
	"put_bmc", "put_secret", "put_image", "delete_image", "put_job", "put_leases",
	"append_events", "register_node", "remove_node", "put_machines_v2", "delete_image_v2",
	"import_machines", "agent_report", "bind_leases", "put_join_token", "use_join_token", "remove_member",
	"put_site_v2", "put_rack_v2", "trim_events", "put_machines_v3", "put_remediation", "renew_member", "delete_image_v3", "bind_leases_v2",
	"put_machines_v4", "agent_report_v2", "put_image_v2"}

func (t CommandType) String() string {
	if t < cmdEnd {
		return cmdNames[t]
	}
	return fmt.Sprintf("unknown(%d)", uint8(t))
}

// W is who/why for the audit trail: Actor (e.g. "api:alice",
// "controller:lifecycle", "agent:m-1f"), Reason (closed enum), Message
// (free text). It is copied into every event the write produces.
type W struct {
	Actor   string `json:"actor,omitempty"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// nodeInfo maps a raft server ID to its forward-RPC address.
// Version and MaxCommand (the node's binary version and the newest command
// type it understands, versions.go) were added later: a binary that
// predates them ignores them (JSON), so it still applies the command as
// before; one that knows them keeps them in the node_versions bucket.
type nodeInfo struct {
	ID          string      `json:"id"`
	ForwardAddr string      `json:"forward_addr"`
	Version     string      `json:"version,omitempty"`
	MaxCommand  CommandType `json:"max_command,omitempty"`
	// Env (later still, ignored the same way by older binaries): the node's
	// in-RAM environment digests, kept in its version record.
	Env map[string]string `json:"env,omitempty"`
}

// command is the body of one log entry. Which payload field is used depends
// on Type; Time is fixed by the leader before logging and is the only clock
// reading Apply ever sees.
type command struct {
	Type CommandType `json:"-"`
	Time time.Time   `json:"time"`
	W    W           `json:"w"`

	Site     *Site     `json:"site,omitempty"`
	Rack     *Rack     `json:"rack,omitempty"`
	Machines []Machine `json:"machines,omitempty"`
	ID       string    `json:"id,omitempty"`
	BMC      *BMC      `json:"bmc,omitempty"`
	Key      string    `json:"key,omitempty"`
	Sealed   []byte    `json:"sealed,omitempty"`
	Image    *Image    `json:"image,omitempty"`
	Job      *Job      `json:"job,omitempty"`
	Leases   []Lease   `json:"leases,omitempty"`
	Events   []Event   `json:"events,omitempty"`
	Node     *nodeInfo `json:"node,omitempty"`

	// Before is CmdTrimEvents' bound: events with Index < Before go.
	Before uint64 `json:"before_index,omitempty"`

	JoinToken *JoinToken `json:"join_token,omitempty"`
	Member    *Member    `json:"member,omitempty"`

	// Brake is CmdPutRemediation's record.
	Brake *RepairBrake `json:"brake,omitempty"`
}

// encodeCommand returns the log-entry bytes: 1 byte CommandType, then the
// JSON encoding of the command body.
func encodeCommand(c *command) ([]byte, error) {
	body, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("%w: encode %s: %v", ErrBadCommand, c.Type, err)
	}
	out := make([]byte, 1+len(body))
	out[0] = byte(c.Type)
	copy(out[1:], body)
	return out, nil
}

// decodeCommand parses bytes produced by encodeCommand. An empty input or
// malformed JSON gives ErrBadCommand; a type byte this binary does not know
// gives ErrUnknownCommand (the caller must refuse the entry, not skip it).
func decodeCommand(b []byte) (*command, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty entry", ErrBadCommand)
	}
	t := CommandType(b[0])
	if t == CmdInvalid || t >= cmdEnd {
		return nil, fmt.Errorf("%w: type byte %d", ErrUnknownCommand, b[0])
	}
	c := &command{}
	if err := json.Unmarshal(b[1:], c); err != nil {
		return nil, fmt.Errorf("%w: %s body: %v", ErrBadCommand, t, err)
	}
	c.Type = t
	return c, nil
}
